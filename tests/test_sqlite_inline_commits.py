"""Where a SQLite commit runs: on the event loop's thread while commits are quick, which spares
the hop to the database thread and back (on a fast disk it took longer than the commit itself,
issue 12), else on the database thread, which the loop does not wait for: after slow commits,
for a large commit, behind a call the thread has in hand, and when another connection holds the
write lock. White-box: it stops commits through the backend's `_commit_barrier` seam and sets
its `inline_commit_limit_s`."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import backend_url
from harness.context import Context
from harness.session import AppendList, Session, SessionMutator, SetValue, Store, addresses, connect
from harness.session.sqlite import INLINE_COMMIT_WRITES, SqliteBackend


@pytest.fixture
def store_url(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """SQLite alone, for conftest's `store` (at synchronous=NORMAL: commits far under the limit)."""
    return backend_url("sqlite", tmp_path, request)


def backend_of(store: Store) -> SqliteBackend:
    assert isinstance(store.backend, SqliteBackend)
    return store.backend


class Threads:
    """A commit barrier that records the thread each commit runs on, sleeping `sleep_s` there."""

    def __init__(self, sleep_s: float = 0.0) -> None:
        self.seen: list[threading.Thread] = []
        self.sleep_s = sleep_s

    def __call__(self) -> None:
        self.seen.append(threading.current_thread())
        time.sleep(self.sleep_s)

    def on_the_loop(self) -> list[bool]:
        return [thread is threading.current_thread() for thread in self.seen]


async def name(session: Session, value: str, ctx: Context) -> None:
    async def job(m: SessionMutator) -> None:
        m.set(addresses.session_name(), value)

    await session.mutate(job, ctx)


async def test_a_quick_commit_runs_on_the_event_loops_thread(store: Store, ctx: Context) -> None:
    session = await store.create_session(ctx)
    threads = backend_of(store)._commit_barrier = Threads()

    await name(session, "first", ctx)
    await name(session, "second", ctx)

    assert threads.on_the_loop() == [True, True]
    assert await session.get(addresses.session_name(), ctx) == "second"


async def test_after_slow_commits_they_run_on_the_database_thread_until_they_are_quick_again(
        store: Store, ctx: Context) -> None:
    backend = backend_of(store)
    session = await store.create_session(ctx)
    threads = backend._commit_barrier = Threads(sleep_s=0.005)  # a slow disk: 5 ms a commit

    for n in range(3):
        await name(session, f"slow {n}", ctx)
    # The first is on the loop (nothing was known yet); its 5 ms move the average past the limit.
    assert threads.on_the_loop() == [True, False, False]

    threads.sleep_s = 0.0
    backend.inline_commit_limit_s = 10.0  # any average is below this limit: quick again
    await name(session, "quick", ctx)
    assert threads.on_the_loop()[-1] is True
    assert await session.get(addresses.session_name(), ctx) == "quick"


async def test_a_commit_of_many_writes_runs_on_the_database_thread(store: Store, ctx: Context) -> None:
    session = await store.create_session(ctx)
    threads = backend_of(store)._commit_barrier = Threads()

    async def job(m: SessionMutator) -> None:
        for n in range(INLINE_COMMIT_WRITES + 1):
            m.set(addresses.session_name(), f"name {n}")

    await session.mutate(job, ctx)

    assert threads.on_the_loop() == [False]
    assert await session.get(addresses.session_name(), ctx) == f"name {INLINE_COMMIT_WRITES}"


async def test_a_commit_queues_behind_a_call_the_database_thread_has_in_hand(store: Store, ctx: Context) -> None:
    backend = backend_of(store)
    session = await store.create_session(ctx)
    threads = backend._commit_barrier = Threads()
    release = threading.Event()
    holding = backend._submit(lambda db: release.wait(10))  # the thread is using the connection

    committing = asyncio.create_task(name(session, "after", ctx))
    await asyncio.sleep(0.05)
    assert not committing.done()  # it waits its turn, off the loop
    assert threads.seen == []
    release.set()
    await asyncio.wait_for(committing, 10)

    assert await holding is True
    assert threads.on_the_loop() == [False]


async def test_a_commit_that_finds_the_write_lock_held_waits_on_the_database_thread_not_the_loop(
        store_url: str, store: Store, ctx: Context) -> None:
    # Another connection to the same file holds the write lock inside a commit of its own. A
    # commit on the loop's thread would hold the whole loop until that lock is let go; it goes
    # to the database thread instead and lands once the other commit has.
    session = await store.create_session(ctx)
    other = await connect(store_url, ctx)
    try:
        other_backend = backend_of(other)
        other_backend.inline_commit_limit_s = 0  # held on its own thread, which the test releases
        entered, release = threading.Event(), threading.Event()

        def hold() -> None:
            entered.set()
            release.wait(10)

        other_session = await other.create_session(ctx)
        other_backend._commit_barrier = hold
        holding = asyncio.create_task(name(other_session, "holding", ctx))
        assert await asyncio.to_thread(entered.wait, 10)

        threads = backend_of(store)._commit_barrier = Threads()
        committing = asyncio.create_task(name(session, "waited", ctx))
        ticks = 0
        while ticks < 20:  # the loop keeps running while the commit waits for the lock
            await asyncio.sleep(0.005)
            ticks += 1
        assert not committing.done()
        release.set()
        await asyncio.wait_for(asyncio.gather(holding, committing), 10)

        assert threads.on_the_loop() == [False]
        assert await session.get(addresses.session_name(), ctx) == "waited"
    finally:
        await other.close()


class Interrupting:
    """The connection, but the first `statement` raises `error` as it returns (`before=False`, as a
    signal's handler raises once the call is back on the loop's thread) or instead of running."""

    def __init__(self, db: sqlite3.Connection, statement: str, error: BaseException, *, before: bool) -> None:
        self.db, self.statement, self.error, self.before = db, statement, error, before
        self.armed = True

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if self.armed and sql == self.statement and self.before:
            self.armed = False
            raise self.error
        cursor = self.db.execute(sql, *args)
        if self.armed and sql == self.statement:
            self.armed = False
            raise self.error
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def locked() -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = sqlite3.SQLITE_BUSY
    return error


async def test_an_interrupt_as_begin_returns_leaves_no_transaction_open(store: Store, ctx: Context) -> None:
    # On the loop's thread a signal's handler runs between statements (a second Ctrl-C, a SIGTERM
    # handler calling sys.exit): the transaction is rolled back, the store stays usable.
    backend = backend_of(store)
    session = await store.create_session(ctx)
    db = backend._db
    backend._db = Interrupting(db, "BEGIN IMMEDIATE", KeyboardInterrupt(), before=False)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        await backend.commit(session.id, [SetValue("test", "k", '"lost"')], None, ctx)
    backend._db = db

    assert not db.in_transaction
    await backend.commit(session.id, [SetValue("test", "k", '"kept"')], None, ctx)
    assert (await backend.get_value(session.id, "test", "k", ctx)).value == '"kept"'  # type: ignore[union-attr]


async def test_a_commit_refused_as_busy_is_rolled_back_and_made_once_on_the_database_thread(
        store: Store, ctx: Context) -> None:
    backend = backend_of(store)
    session = await store.create_session(ctx)
    threads = backend._commit_barrier = Threads()
    db = backend._db
    backend._db = Interrupting(db, "COMMIT", locked(), before=True)  # type: ignore[assignment]

    result = await backend.commit(session.id, [AppendList("test", "l", '"once"')], None, ctx)

    backend._db = db
    assert not db.in_transaction
    assert threads.on_the_loop() == [True, False]  # tried here, rolled back, made on the thread
    rows = await backend.read_list(session.id, "test", "l", None, 10, ctx)
    assert [(row.seq, row.value) for row in rows] == [(result.seqs[0], '"once"')]


def test_a_store_used_from_two_event_loops_at_once_never_shares_its_connection(store_url: str) -> None:
    # The database thread answers each call on the loop that made it; a commit runs on a loop's
    # own thread only while it has the connection to itself.
    ctx = Context()
    home = asyncio.new_event_loop()
    store = home.run_until_complete(connect(store_url, ctx))
    sessions = [home.run_until_complete(store.create_session(ctx)).id for _ in range(2)]
    backend = backend_of(store)
    start, failures = threading.Barrier(2), []

    def writer(session_id: str, reads: bool) -> None:
        async def write() -> None:
            start.wait()
            for n in range(300):
                try:
                    if reads and n % 2:
                        await backend.read_list(session_id, "test", "l", None, 5, ctx)
                    else:
                        await backend.commit(session_id, [AppendList("test", "l", f'"{n}"')], None, ctx)
                except Exception as error:
                    failures.append(error)

        asyncio.run(write())

    threads = [threading.Thread(target=writer, args=(sessions[0], False)),
               threading.Thread(target=writer, args=(sessions[1], True))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    async def count(session_id: str) -> int:
        return len(await backend.read_list(session_id, "test", "l", None, 1000, ctx))

    try:
        assert failures == []
        assert [home.run_until_complete(count(s)) for s in sessions] == [300, 150]
        assert not backend._db.in_transaction
    finally:
        home.run_until_complete(store.close())
        home.close()


def test_a_call_whose_loop_closed_before_its_answer_does_not_keep_the_thread_busy(store_url: str) -> None:
    # Nobody can be answered on a closed loop; the call still counts as answered, so the store's
    # next loop commits on its own thread again.
    ctx = Context()
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    store = first.run_until_complete(connect(store_url, ctx))
    session = first.run_until_complete(store.create_session(ctx))
    backend = backend_of(store)
    started, release = threading.Event(), threading.Event()

    def held(db: sqlite3.Connection) -> None:
        started.set()
        release.wait(10)

    async def leave_a_call_running() -> None:
        backend._submit(held)
        await asyncio.to_thread(started.wait, 10)

    first.run_until_complete(leave_a_call_running())
    first.close()
    release.set()
    threads = backend._commit_barrier = Threads()

    async def commit_once() -> None:
        await backend._submit(lambda db: None)  # behind the call the thread had in hand
        assert backend._thread.idle
        await backend.commit(session.id, [SetValue("test", "k", '"next"')], None, ctx)

    try:
        second.run_until_complete(asyncio.wait_for(commit_once(), 10))
        assert [thread is threading.current_thread() for thread in threads.seen] == [True]
    finally:
        second.run_until_complete(store.close())
        second.close()
