"""Where Harness keeps its files on this machine."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs


def harness_home(environ: Mapping[str, str] | None = None) -> Path:
    """`$HARNESS_HOME`, or the user's data directory for harness (`~/.local/share/harness` on
    Linux): the SQLite journal, `models.toml`, chat history and kept tool output live there."""
    env = os.environ if environ is None else environ
    configured = env.get("HARNESS_HOME")
    return Path(configured) if configured else Path(platformdirs.user_data_dir("harness"))
