"""docs/contract.md describes every requirement ID the code and the tests cite, and where each
one lives: a clone explains itself without the design notes it was built from."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

ID = r"(?:HA|CE|OM)-\d+[a-z]?"  # a letter after the number: a requirement that refines another
CITED = re.compile(rf"\b{ID}\b")
ROW = re.compile(rf"^\| {ID} \|.*\|$", re.MULTILINE)
TEST_FILE = re.compile(r"\btest_\w+\.py\b")
MODULE = re.compile(r"\b[\w/]+\.py\b")
NOT_BUILT = "not built yet"
CONTRACT = REPO / "docs" / "contract.md"
SRC = REPO / "src" / "harness"
TESTS = REPO / "tests"


def rows() -> list[tuple[str, str, str, str]]:
    """The table rows of docs/contract.md as `(id, requirement, modules, tests)`."""
    cells = [tuple(cell.strip() for cell in row.strip("|").split("|")) for row in ROW.findall(CONTRACT.read_text())]
    assert all(len(row) == 4 for row in cells), [row[0] for row in cells if len(row) != 4]
    return [(row[0], row[1], row[2], row[3]) for row in cells]


def cited_in(path: Path) -> set[str]:
    return set(CITED.findall(path.read_text()))


def test_every_id_cited_in_src_or_tests_has_exactly_one_row() -> None:
    ids = [row[0] for row in rows()]
    cited = set().union(*(cited_in(path) for root in (SRC, TESTS) for path in root.rglob("*.py")))

    assert sorted(cited - set(ids)) == []
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_every_test_file_a_row_names_exists_and_cites_that_id() -> None:
    wrong = [(id_, name) for id_, _, _, tests in rows() for name in TEST_FILE.findall(tests)
             if not (TESTS / name).is_file() or id_ not in cited_in(TESTS / name)]
    unplaced = [id_ for id_, _, _, tests in rows() if tests != NOT_BUILT and not TEST_FILE.search(tests)]

    assert wrong == []
    assert unplaced == []


def test_every_module_a_row_names_exists() -> None:
    missing = [(id_, name) for id_, _, modules, _ in rows() for name in MODULE.findall(modules)
               if not (SRC / name).is_file()]

    assert missing == []


def test_no_test_cites_an_id_whose_row_says_not_built_yet() -> None:
    """A row goes stale when its requirement gets a test: it must then name where it lives."""
    not_built = {id_ for id_, _, _, tests in rows() if tests == NOT_BUILT}
    cited = {(id_, path.name) for path in TESTS.rglob("*.py") for id_ in cited_in(path) & not_built}

    assert sorted(cited) == []
