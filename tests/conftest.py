"""Shared fixtures: a Context, store URLs for every backend, and the shared fixture folder."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from harness.context import Context
from harness.session import Store, connect

REPO = Path(__file__).resolve().parents[1]
# The shared folder lies beside the checkout, in development and in CI alike.
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
POSTGRES_URL = os.environ.get("HARNESS_TEST_POSTGRES_URL")

BACKENDS = ["memory", "sqlite", "postgres"]


def pytest_report_header() -> str:
    if POSTGRES_URL:
        return f"PostgreSQL tests: on ({POSTGRES_URL})"
    return "PostgreSQL tests: SKIPPED (set HARNESS_TEST_POSTGRES_URL=postgresql://... to run them)"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not POSTGRES_URL:
        terminalreporter.write_line(
            "PostgreSQL tests were skipped: set HARNESS_TEST_POSTGRES_URL to run them.", yellow=True
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
