"""The fixtures the built-in tools' tests share (test_builtin_tools, test_tool_jobs,
test_tool_safety): a test module takes them with `pytest_plugins = ["tool_fixtures"]`, and never
imports this module, which pytest loads itself as a plugin. The helpers they share are in
`tool_helpers`."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.tools import Workspace


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The directory the tools work in."""
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


@pytest.fixture
def workspace(root: Path, tmp_path: Path) -> Workspace:
    """A workspace at `root`, its long outputs kept outside it."""
    return Workspace(root=root, output_dir=tmp_path / "home" / "tool-output")
