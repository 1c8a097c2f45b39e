"""A fresh schema of a PostgreSQL server for one bench run, dropped at its end."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def fresh_schema(server_url: str, **parameters: str) -> Iterator[str]:
    """Create a schema `harness_bench_<hex>` on the server at `server_url` and yield a URL of it:
    `server_url` with its `search_path` and the given libpq `parameters` (e.g. `application_name`)
    added. The schema is dropped with everything in it when the block ends."""
    import psycopg  # imported here: a SQLite-only run does without

    schema = f"harness_bench_{secrets.token_hex(6)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in server_url else "?"
    added = "".join(f"&{name}={value}" for name, value in parameters.items())
    try:
        yield f"{server_url}{separator}options=-csearch_path%3D{schema}{added}"
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
