"""A user's clone has no `../shared` beside it: the suite still collects, the tests of the recorded
corpus are skipped with a notice before and after the run, and the project's own streams run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

TIMEOUT_S = 300


def fresh_clone(tmp_path: Path) -> Path:
    """The test suite and its configuration in a folder with nothing beside it (the package itself
    is the installed one)."""
    clone = tmp_path / "harness"
    shutil.copytree(REPO / "tests", clone / "tests", ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    shutil.copy(REPO / "pyproject.toml", clone)
    return clone


def pytest_in(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # `--assert=plain`: a clone has no cached rewritten modules, and rewriting the asserts of every
    # test module was half of its collection time; what is tested here is that each one collects.
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "--assert=plain", *args],
                          cwd=clone, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def test_without_the_shared_folder_everything_collects_and_its_tests_skip_with_a_notice_first_and_last(
    tmp_path: Path,
) -> None:
    """Issue 10: collection used to stop at the first module that read `../shared` at import. Now
    every module collects (here: all of them, running a few), and the skips are said up front and
    at the end."""
    clone = fresh_clone(tmp_path)
    shared = tmp_path / "shared" / "fixtures"

    run = pytest_in(clone, "-q", "-k", "test_provider_fixtures or test_transcripts_continued or "
                    "test_every_project_stream_has_an_expectation")

    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    first = lines[:next(i for i, line in enumerate(lines) if line.startswith(("s", ".")))]
    assert f"Shared recorded fixtures: SKIPPED (no {shared}; tests/streams still covers every adapter)" in first
    last = lines[next(i for i, line in enumerate(lines) if " short test summary info " in line) - 1]
    assert last == f"Tests of the shared recorded fixtures were skipped: {shared} is not beside this checkout."
    reason = f"the recorded corpus {shared} is not beside this checkout"
    assert [line.split(": ", 1)[1] for line in lines if line.startswith("SKIPPED")] == [reason, reason, reason]
    assert lines[-1].startswith("7 passed, 11 skipped, "), lines[-1]
