"""The page's built assets (src/harness/server/static, committed so that a user installs no Node)
are what its sources in web/ build (issue 31): Vite builds them again into a temporary directory,
from the locked dependencies, and every file must match byte for byte. Skipped, with the reason,
when Node or npm is not installed."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT / "web"
STATIC = ROOT / "src" / "harness" / "server" / "static"
NPM = shutil.which("npm")


def files(directory: Path) -> list[str]:
    """The paths of the files under `directory`, relative to it, sorted."""
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file())


@pytest.mark.skipif(NPM is None or shutil.which("node") is None,
                    reason="checking the page's build needs Node and npm (the committed assets are used as they are)")
def test_the_committed_page_is_what_its_sources_build(tmp_path: Path) -> None:
    """`npm run build` of web/ into a temporary directory gives exactly the committed files."""
    assert NPM is not None
    if not (WEB / "node_modules").is_dir():
        subprocess.run([NPM, "ci", "--no-audit", "--no-fund"], cwd=WEB, check=True, capture_output=True, timeout=600)
    out = tmp_path / "static"
    built = subprocess.run([NPM, "run", "build"], cwd=WEB, env={**os.environ, "HARNESS_PAGE_OUT": str(out)},
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr

    assert files(STATIC) == files(out), "run `npm run build` in web/ and commit src/harness/server/static"
    changed = [name for name in files(out) if not filecmp.cmp(out / name, STATIC / name, shallow=False)]
    assert changed == [], f"run `npm run build` in web/ and commit src/harness/server/static: {changed} differ"
