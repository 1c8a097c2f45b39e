"""The README is the user's path and hands the rest to the guides in docs/ (issue 32, item 6): every
file and heading it links to is there, so a guide moved, renamed or retitled cannot leave the README
pointing at nothing. Links between the guides are checked by `make docs` (mkdocs --strict)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, made as mkdocs makes them (Python-Markdown's toc):
    lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-")
            for heading in HEADING.findall(page.read_text())}


def test_every_file_and_heading_the_readme_links_to_exists() -> None:
    links = [link for link in LINK.findall((REPO / "README.md").read_text())
             if "://" not in link and not link.startswith("#")]
    targets = [(REPO / link.split("#", 1)[0], link.partition("#")[2]) for link in links]

    assert any(path.parent.name == "docs" for path, _ in targets)  # it does point to the guides
    assert [str(path) for path, _ in targets if not path.exists()] == []
    assert [f"{path.name}#{anchor}" for path, anchor in targets if anchor and anchor not in anchors(path)] == []
