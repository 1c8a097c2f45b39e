"""Storage under hostile conditions: aliased database files, damaged and failing storage.

Each test names the defect it guards against: what an attacker or an unlucky operator did, and
what used to go wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.context import Context
from harness.session import SessionOwned, connect
from journal_helpers import append_chain, child, new_session_with_lane, read_word


async def test_a_symlinked_sqlite_database_shares_its_session_locks(tmp_path: Path, ctx: Context) -> None:
    """Opening the database through a symlink used to give a second lock folder, so two live
    harnesses both owned one session (the newcomer evicted the owner). The lock is now on the
    database file itself."""
    database = tmp_path / "real" / "journal.db"
    database.parent.mkdir()
    symlink = tmp_path / "via-symlink.db"
    symlink.symlink_to(database)
    first = await connect(f"sqlite:///{database}", ctx)
    second = await connect(f"sqlite:///{symlink}", ctx)
    try:
        session = await new_session_with_lane(first, ctx)
        ownership = await session.attach("first", ctx)
        seen = await second.open_session(session.id, ctx)
        with pytest.raises(SessionOwned):
            await seen.attach("second", ctx)
        with pytest.raises(SessionOwned):
            await append_chain(seen, ["intruder"], ctx)
        await ownership.detach(ctx)
        claimed = await seen.attach("second", ctx)
        await claimed.detach(ctx)
    finally:
        await second.close()
        await first.close()


async def test_a_hard_linked_sqlite_database_shares_its_session_locks(tmp_path: Path, ctx: Context) -> None:
    """The same through a hard link in another folder, from a second process (in one process
    SQLite itself refuses a second name of an open database)."""
    database = tmp_path / "real" / "journal.db"
    database.parent.mkdir()
    store = await connect(f"sqlite:///{database}", ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        await store.close()
        (tmp_path / "links").mkdir()
        os.link(database, tmp_path / "links" / "journal.db")
        store = await connect(f"sqlite:///{database}", ctx)
        ownership = await (await store.open_session(session.id, ctx)).attach("first", ctx)
        with child(f"sqlite:///{tmp_path / 'links' / 'journal.db'}", session.id, "try-attach") as process:
            assert read_word(process) == "owned"
        await ownership.detach(ctx)
    finally:
        await store.close()


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_sqlite_keeps_no_lock_files_beside_the_database(tmp_path: Path, ctx: Context) -> None:
    """A lock folder beside the database could be deleted while an owner held its lock, letting
    a second owner in; nothing is kept beside the database but SQLite's own files."""
    store = await connect(f"sqlite:///{tmp_path / 'journal.db'}", ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        ownership = await session.attach("owner", ctx)
        assert _names(tmp_path) == ["journal.db", "journal.db-shm", "journal.db-wal"]
        await ownership.detach(ctx)
    finally:
        await store.close()
