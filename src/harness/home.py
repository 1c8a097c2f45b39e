"""Where Harness keeps its files on this machine, and whose they are."""

from __future__ import annotations

import getpass
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


STORE_VARIABLE = "HARNESS_STORE"
"""The environment variable naming the store every command and `harness.Agent` use by default."""


def default_store_url(environ: Mapping[str, str] | None = None) -> str:
    """The user's journal as a store URL: the SQLite file `harness.db` in `harness_home()`."""
    return f"sqlite:///{(harness_home(environ) / 'harness.db').resolve()}"


def local_user() -> str:
    """The user the conversations of this machine's account belong to (the terminal's, `harness
    run`'s, `harness.Agent`'s): the login name (the uid as text where the account has none, as in
    some containers)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no LOGNAME/USER and no passwd entry for the uid
        return str(os.getuid())
