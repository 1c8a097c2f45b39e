"""Storage under hostile conditions: aliased database files, damaged and failing storage.

Each test names the defect it guards against: what an attacker or an unlucky operator did, and
what used to go wrong."""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import psycopg
import pytest

from conftest import POSTGRES_URL, backend_url
from drive_helpers import start_rig, within
from harness.context import Context
from harness.messages import Usage
from harness.providers.faux import reply
from harness.runtime import Settled
from harness.session import (
    SessionMutator,
    SessionNotFound,
    StorageCorruption,
    StorageRolledBack,
    StoreConnectionLost,
    StoreFull,
    StoreUnavailable,
    connect,
)
from journal_helpers import (
    append_chain,
    assert_owned_only_by,
    child,
    new_session_with_lane,
    read_word,
    text_of,
    user,
)


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
        await assert_owned_only_by(await session.attach("first", ctx), second, ctx)
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
    a second owner in; nothing is kept beside the database but SQLite's own files and the commit
    mark (which holds no lock)."""
    store = await connect(f"sqlite:///{tmp_path / 'journal.db'}", ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        ownership = await session.attach("owner", ctx)
        assert _names(tmp_path) == ["journal.db", "journal.db-shm", "journal.db-wal", "journal.db.commit-mark"]
        await ownership.detach(ctx)
    finally:
        await store.close()


# -- failing and damaged storage ---------------------------------------------------------------


@contextmanager
def small_tmpfs(tmp_path: Path, size: str = "2m") -> Iterator[Path]:
    """A tmpfs of `size` mounted in `tmp_path`; skips the test where mounting is not allowed."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip() or 'mount failed'})")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def test_a_full_disk_is_store_full_and_keeps_every_earlier_commit(tmp_path: Path, ctx: Context) -> None:
    """Disk full surfaced as a raw `sqlite3.OperationalError: database or disk is full`."""
    with small_tmpfs(tmp_path) as disk:
        store = await connect(f"sqlite:///{disk / 'journal.db'}", ctx)
        try:
            session = await new_session_with_lane(store, ctx)
            committed = 0

            async def append_until_full() -> None:
                nonlocal committed
                for _ in range(1000):
                    await append_chain(session, ["x" * 50_000], ctx)
                    committed += 1

            with pytest.raises(StoreFull):
                await append_until_full()
            assert committed > 0
            entries = await session.read_entries(ctx, limit=10_000)
            assert len(entries) == committed
        finally:
            await store.close()


async def test_a_read_only_disk_is_store_unavailable_and_changes_nothing(tmp_path: Path, ctx: Context) -> None:
    """An immutable or read-only database gave a raw `disk I/O error` / `readonly database`.
    SQLite in WAL mode cannot even open it read-only (its shared-memory file must be written), so
    the open is refused, typed and naming the file; once writable again, everything is there."""
    with small_tmpfs(tmp_path) as disk:
        url = f"sqlite:///{disk / 'journal.db'}"
        store = await connect(url, ctx)
        session = await new_session_with_lane(store, ctx)
        await append_chain(session, ["kept"], ctx)
        await store.close()
        await asyncio.to_thread(subprocess.run, ["mount", "-o", "remount,ro", str(disk)], check=True)

        with pytest.raises(StoreUnavailable) as refused:
            await connect(url, ctx)

        assert str(disk / "journal.db") in refused.value.message
        await asyncio.to_thread(subprocess.run, ["mount", "-o", "remount,rw", str(disk)], check=True)
        store = await connect(url, ctx)
        try:
            entries = await (await store.open_session(session.id, ctx)).read_entries(ctx)
            assert [text_of(e.payload) for e in entries] == ["kept"]
        finally:
            await store.close()


def _damage(path: Path, offset: int, length: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        file.write(bytes((i * 37 + 11) % 256 for i in range(length)))


async def test_a_damaged_sqlite_file_is_storage_corruption_never_a_driver_error(tmp_path: Path, ctx: Context) -> None:
    """31 of 110 damaged copies raised `sqlite3.DatabaseError` or `OperationalError` with a traceback."""
    database = tmp_path / "journal.db"
    store = await connect(f"sqlite:///{database}", ctx)
    session = await new_session_with_lane(store, ctx)
    for i in range(40):
        await append_chain(session, [f"entry {i} " + "y" * 3000], ctx)
    await store.close()
    refused = []
    for offset in (0, 4096 * 3, 4096 * 10):  # the header, then two pages in the middle
        copy = tmp_path / f"damaged-{offset}.db"
        copy.write_bytes(database.read_bytes())
        _damage(copy, offset, 2048)
        try:
            damaged = await connect(f"sqlite:///{copy}", ctx)
        except StorageCorruption:
            refused.append(offset)
            continue
        try:
            opened = await damaged.open_session(session.id, ctx)
            await opened.read_entries(ctx, limit=10_000)
        except (StorageCorruption, SessionNotFound):
            refused.append(offset)  # an intact page may also read: what fails must fail typed
        finally:
            await damaged.close()
    assert 0 in refused  # a damaged header is never taken for a database
    assert len(refused) >= 2


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("kind", ["entry", "usage"])
async def test_a_seq_a_stored_row_holds_is_not_blamed_on_the_new_rows_id(
    tmp_path: Path, request: pytest.FixtureRequest, ctx: Context, kind: str, backend: str
) -> None:
    """Someone moved a session's next seq back, so a commit's entry or usage row gets the seq of
    one stored: `StorageCorruption` naming the session and the seq on every backend, not an
    `InvalidWrite` saying the new row's id is taken (an insert's checks and its constraints are
    one statement) nor the driver's raw error, and nothing of the commit lands."""
    url = backend_url(backend, tmp_path, request, durable=True)
    store = await connect(url, ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        [tip] = await append_chain(session, ["stored"], ctx)

        async def job(m: SessionMutator) -> None:
            m.insert_usage(Usage(input=1), entry_id=tip)

        await session.mutate(job, ctx)
        moved_back = ("UPDATE sessions SET next_seq = 1", f"UPDATE entries SET seq = 1 WHERE id = '{tip}'",
                      "UPDATE usage_ledger SET seq = 1")
        if backend == "sqlite":
            with closing(sqlite3.connect(tmp_path / "journal.db")) as db, db:
                for statement in moved_back:
                    db.execute(statement)
        else:
            with psycopg.connect(url, autocommit=True) as pg:
                for statement in moved_back:
                    pg.execute(statement.encode())  # bytes: the statement is not a literal

        async def collides(m: SessionMutator) -> None:
            if kind == "entry":
                m.insert_entry(user("collides"), parent_id=tip)
            else:
                m.insert_usage(Usage(input=2), entry_id=tip)

        with pytest.raises(StorageCorruption, match="seq 1 is already held") as raised:
            await session.mutate(collides, ctx)
        assert raised.value.details == {"session_id": session.id, "seq": 1}
        assert [text_of(e.payload) for e in await session.read_entries(ctx)] == ["stored"]
    finally:
        await store.close()


async def test_a_terminated_postgres_connection_is_typed_and_the_next_call_works(ctx: Context) -> None:
    """Connections terminated by the server raised `AdminShutdown` or `cannot exit pipeline mode
    while busy`, and the pool kept handing out dead connections: the fourth call worked."""
    if not POSTGRES_URL:
        pytest.skip("HARNESS_TEST_POSTGRES_URL is not set")
    name = f"harness_kill_{secrets.token_hex(4)}"
    separator = "&" if "?" in POSTGRES_URL else "?"
    store = await connect(f"{POSTGRES_URL}{separator}application_name={name}", ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        await append_chain(session, ["before"], ctx)
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                   "WHERE application_name = %s", (name,)).fetchone()
        assert killed is not None
        assert killed[0] >= 1
        failures = 0
        for attempt in range(3):
            try:
                await append_chain(session, [f"after {attempt}"], ctx)
            except StoreConnectionLost:
                failures += 1
        assert failures <= 1
        texts = [text_of(e.payload) for e in await session.read_entries(ctx)]
        assert texts[0] == "before"
        assert texts[-1] == "after 2"
    finally:
        await store.close()


# -- journals that went backwards ----------------------------------------------------------------


async def _store_with_commits(folder: Path, ctx: Context, count: int) -> Path:
    database = folder / "journal.db"
    store = await connect(f"sqlite:///{database}", ctx)
    session = await new_session_with_lane(store, ctx)
    for i in range(count):
        await append_chain(session, [f"turn {i}"], ctx)
    await store.close()
    return database


async def test_a_journal_whose_write_ahead_log_was_lost_is_reported_on_open(tmp_path: Path, ctx: Context) -> None:
    """Deleting the WAL after a crash rolled whole runs back silently (18 of 30 trials), with
    no trace of the effects they had performed. Here the database file is copied without its
    WAL while a store still has commits in it, as a crash and a deleted WAL leave it."""
    database = tmp_path / "journal.db"
    store = await connect(f"sqlite:///{database}", ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        await append_chain(session, ["checkpointed"], ctx)
        with sqlite3.connect(database) as raw:  # as SQLite does by itself every 1,000 pages
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for i in range(5):
            await append_chain(session, [f"turn {i}"], ctx)
        (tmp_path / "copy").mkdir()
        for name in ("journal.db", "journal.db.commit-mark"):
            (tmp_path / "copy" / name).write_bytes((tmp_path / name).read_bytes())
    finally:
        await store.close()

    with pytest.raises(StorageRolledBack) as refused:
        await connect(f"sqlite:///{tmp_path / 'copy' / 'journal.db'}", ctx)
    assert "went back from" in refused.value.message
    assert refused.value.details["progress"] < refused.value.details["marked_progress"]  # type: ignore[operator]


async def test_a_database_replaced_by_an_empty_file_is_reported_and_deleting_the_mark_accepts_it(
    tmp_path: Path, ctx: Context
) -> None:
    """A 0-byte file opened as an empty store with exit 0, every session gone without a word."""
    database = await _store_with_commits(tmp_path, ctx, 3)
    database.write_bytes(b"")

    with pytest.raises(StorageRolledBack) as refused:
        await connect(f"sqlite:///{database}", ctx)
    assert "replaced" in refused.value.message
    assert (tmp_path / "journal.db.commit-mark").name in refused.value.message

    (tmp_path / "journal.db.commit-mark").unlink()
    accepted = await connect(f"sqlite:///{database}", ctx)
    try:
        assert await accepted.list_sessions(ctx) == []
    finally:
        await accepted.close()


async def test_a_journal_reopened_as_it_was_left_opens(tmp_path: Path, ctx: Context) -> None:
    database = await _store_with_commits(tmp_path, ctx, 3)
    for _ in range(2):
        store = await connect(f"sqlite:///{database}", ctx)
        try:
            [info] = await store.list_sessions(ctx)
            await append_chain(await store.open_session(info.id, ctx), ["again"], ctx)
        finally:
            await store.close()


async def test_deleting_a_session_is_not_taken_for_a_journal_that_went_back(tmp_path: Path, ctx: Context) -> None:
    """The mark counts the seqs sessions handed out; a deleted session's stay counted, so the
    store reopens, and losing the delete with a write after it is noticed (the session deleted
    is back, yet less was written than the mark says)."""
    database = tmp_path / "journal.db"
    store = await connect(f"sqlite:///{database}", ctx)
    try:
        gone, kept = await new_session_with_lane(store, ctx), await new_session_with_lane(store, ctx)
        await append_chain(gone, ["one", "two", "three"], ctx)
        with sqlite3.connect(database) as raw:  # as SQLite does by itself every 1,000 pages
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        await store.delete_session(gone.id, ctx)
        await append_chain(kept, ["after the delete"], ctx)
        (tmp_path / "copy").mkdir()
        for name in ("journal.db", "journal.db.commit-mark"):
            (tmp_path / "copy" / name).write_bytes((tmp_path / name).read_bytes())
    finally:
        await store.close()

    reopened = await connect(f"sqlite:///{database}", ctx)
    await reopened.close()
    with pytest.raises(StorageRolledBack):
        await connect(f"sqlite:///{tmp_path / 'copy' / 'journal.db'}", ctx)


async def test_the_mark_counts_what_another_connection_wrote_between_two_commits(tmp_path: Path, ctx: Context) -> None:
    """A store whose last commit follows another connection's writes marks them too: losing
    those is noticed, though this store never wrote them."""
    database = tmp_path / "journal.db"
    mine, other = await connect(f"sqlite:///{database}", ctx), await connect(f"sqlite:///{database}", ctx)
    try:
        session = await new_session_with_lane(mine, ctx)
        await append_chain(session, ["mine"], ctx)
        with sqlite3.connect(database) as raw:
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        await append_chain(await new_session_with_lane(other, ctx), ["other", "other", "other"], ctx)
        await append_chain(session, ["mine again"], ctx)  # the last write to the mark
        (tmp_path / "copy").mkdir()
        (tmp_path / "copy" / "journal.db.commit-mark").write_bytes((tmp_path / "journal.db.commit-mark").read_bytes())
    finally:
        await other.close()
        await mine.close()
    # The database as the checkpoint left it: the other connection's session and both later writes lost.
    with sqlite3.connect(database) as raw, sqlite3.connect(tmp_path / "copy" / "journal.db") as copy:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        raw.backup(copy)
        newest = copy.execute("SELECT max(seq) FROM entries").fetchone()[0]
        copy.execute("DELETE FROM sessions WHERE id NOT IN (SELECT session_id FROM entries WHERE seq < ?)", (newest,))
        copy.execute("UPDATE sessions SET next_seq = next_seq - 1")

    with pytest.raises(StorageRolledBack):
        await connect(f"sqlite:///{tmp_path / 'copy' / 'journal.db'}", ctx)


async def test_a_mark_of_the_older_format_is_replaced_unchecked(tmp_path: Path, ctx: Context) -> None:
    """A mark that counted commits (`{store_id} {commits}`) says nothing about progress: the
    store opens and writes the mark anew."""
    database = await _store_with_commits(tmp_path, ctx, 2)
    mark = tmp_path / "journal.db.commit-mark"
    store_id = mark.read_text().split()[1]
    mark.write_text(f"{store_id} 999999".ljust(64) + "\n")

    store = await connect(f"sqlite:///{database}", ctx)
    await store.close()

    assert mark.read_text().split()[:2] == ["v2", store_id]


async def test_a_run_stopped_by_a_full_disk_resumes_in_the_same_harness_once_there_is_room(
    tmp_path: Path, ctx: Context
) -> None:
    """The prompt raises `StoreFull` with its operation left open, nothing lost; freeing space
    and resuming in the same harness finishes it, and the next prompt works."""
    with small_tmpfs(tmp_path, "3m") as disk:
        store = await connect(f"sqlite:///{disk / 'journal.db'}", ctx)
        rig = await start_rig(store, ctx, [reply("x" * 400_000), reply("resumed"), reply("short")])
        try:
            room = os.statvfs(disk)
            filler = disk / "filler"
            filler.write_bytes(b"\0" * (room.f_bavail * room.f_frsize - 300_000))
            with pytest.raises(StoreFull):
                await rig.lane.prompt("a long answer, please", None, ctx)
            assert (await rig.lane.inspect_execution(ctx)).current is not None
            filler.unlink()

            resumed = await within(rig.lane.resume(ctx))
            after = await within(rig.lane.prompt("and a short one", None, ctx))

            assert isinstance(resumed, Settled)
            assert resumed.result.outcome == "completed"
            assert isinstance(after, Settled)
            assert after.result.outcome == "completed"
            assert rig.harness.persistence_failure is not None  # said once, and kept for whoever asks
        finally:
            await rig.harness.close(ctx)
            await store.close()
