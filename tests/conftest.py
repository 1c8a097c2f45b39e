"""Shared fixtures: a Context, store URLs for every backend, and the shared fixture folder (with the
mark that skips a test when a clone has no `../shared` beside it)."""

from __future__ import annotations

import compileall
import os
import re
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from harness.context import Context
from harness.session import Store, connect

REPO = Path(__file__).resolve().parents[1]
# The shared folder of recordings lies beside the checkout in development and in CI; a user's
# clone has none, and the tests that read it are skipped (the project's own streams still run).
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
HAS_SHARED_FIXTURES = SHARED_FIXTURES.is_dir()
needs_shared_fixtures = pytest.mark.skipif(
    not HAS_SHARED_FIXTURES, reason=f"the recorded corpus {SHARED_FIXTURES} is not beside this checkout"
)
# The project's own provider streams, written for it: every adapter path, in every clone.
PROJECT_STREAMS = REPO / "tests" / "streams"
POSTGRES_URL = os.environ.get("HARNESS_TEST_POSTGRES_URL")
TEST_MODULE = re.compile(r"[/\\]test_[^/\\]*\.py$")

BACKENDS = ["memory", "sqlite", "postgres"]


def pytest_report_header() -> list[str]:
    if POSTGRES_URL:
        postgres = f"PostgreSQL tests: on ({POSTGRES_URL})"
    else:
        postgres = "PostgreSQL tests: SKIPPED (set HARNESS_TEST_POSTGRES_URL=postgresql://... to run them)"
    if HAS_SHARED_FIXTURES:
        shared = f"Shared recorded fixtures: on ({SHARED_FIXTURES})"
    else:
        shared = f"Shared recorded fixtures: SKIPPED (no {SHARED_FIXTURES}; tests/streams still covers every adapter)"
    return [postgres, shared]


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist hands each worker the controller's terminal size as COLUMNS and LINES; the
    # processes the tests start in pseudo-terminals would take those over the terminal's own size.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    if sys.dont_write_bytecode:
        # With bytecode writing off (PYTHONDONTWRITEBYTECODE), no module of this checkout is ever
        # cached, and each of the hundreds of Python processes the suite starts (CLI commands,
        # chats, workers, crash children) compiles every one it imports again: a quarter of a
        # second of CPU each. Compiled once here, in under a second, for this run and the next.
        # Test modules are left out: pytest rewrites and compiles those itself.
        for folder in (REPO / "src", REPO / "bench", REPO / "tests"):
            if folder.is_dir():
                compileall.compile_dir(folder, quiet=1, rx=TEST_MODULE)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # `-q` leaves out the report header, but what a run skips must still be said before it starts.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and session.config.get_verbosity() < 0:
        for line in pytest_report_header():
            if "SKIPPED" in line:
                reporter.write_line(line, yellow=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not POSTGRES_URL:
        terminalreporter.write_line(
            "PostgreSQL tests were skipped: set HARNESS_TEST_POSTGRES_URL to run them.", yellow=True
        )
    if not HAS_SHARED_FIXTURES:
        terminalreporter.write_line(
            f"Tests of the shared recorded fixtures were skipped: {SHARED_FIXTURES} is not beside this checkout.",
            yellow=True,
        )


@pytest.fixture
def ctx() -> Context:
    return Context({"test": True})


@pytest.fixture
def postgres_schema_url() -> Iterator[str]:
    """A URL whose search_path is a private, freshly created schema, dropped afterwards."""
    if not POSTGRES_URL:
        pytest.skip("HARNESS_TEST_POSTGRES_URL is not set")
    import psycopg

    schema = f"harness_test_{secrets.token_hex(6)}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield f"{POSTGRES_URL}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
async def ledger_store(postgres_schema_url: str, ctx: Context) -> AsyncIterator[Store]:
    """A PostgreSQL store in a fresh schema with the `ledger` table the worker tests' tool writes
    (`worker_child.py`)."""
    import psycopg

    from worker_child import LEDGER_TABLE

    opened = await connect(postgres_schema_url, ctx)
    async with await psycopg.AsyncConnection.connect(postgres_schema_url, autocommit=True) as conn:
        await conn.execute(LEDGER_TABLE)
    try:
        yield opened
    finally:
        await opened.close()


def backend_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest, *, durable: bool = False) -> str:
    """A fresh store URL of `kind`. SQLite runs at synchronous=NORMAL unless `durable`."""
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        suffix = "" if durable else "?synchronous=NORMAL"
        return f"sqlite:///{tmp_path / 'journal.db'}{suffix}"
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request)


@pytest.fixture
async def store(store_url: str, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(store_url, ctx)
    try:
        yield opened
    finally:
        await opened.close()
