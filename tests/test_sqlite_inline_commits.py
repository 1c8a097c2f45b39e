"""Where a SQLite commit runs: on the event loop's thread while commits are quick, which spares
the hop to the database thread and back (on a fast disk it took longer than the commit itself,
issue 12), else on the database thread, which the loop does not wait for: after slow commits,
for a large commit, behind a call the thread has in hand, and when another connection holds the
write lock. White-box: it stops commits through the backend's `_commit_barrier` seam and sets
its `inline_commit_limit_s`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness.context import Context
from harness.session import Session, SessionMutator, Store, addresses, connect
from harness.session.sqlite import INLINE_COMMIT_WRITES, SqliteBackend


@pytest.fixture
async def sqlite_store(tmp_path: Path, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(f"sqlite:///{tmp_path / 'journal.db'}", ctx)
    yield opened
    await opened.close()


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


async def test_a_quick_commit_runs_on_the_event_loops_thread(sqlite_store: Store, ctx: Context) -> None:
    session = await sqlite_store.create_session(ctx)
    threads = backend_of(sqlite_store)._commit_barrier = Threads()

    await name(session, "first", ctx)
    await name(session, "second", ctx)

    assert threads.on_the_loop() == [True, True]
    assert await session.get(addresses.session_name(), ctx) == "second"


async def test_after_slow_commits_they_run_on_the_database_thread_until_they_are_quick_again(
        sqlite_store: Store, ctx: Context) -> None:
    backend = backend_of(sqlite_store)
    session = await sqlite_store.create_session(ctx)
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


async def test_a_commit_of_many_writes_runs_on_the_database_thread(sqlite_store: Store, ctx: Context) -> None:
    session = await sqlite_store.create_session(ctx)
    threads = backend_of(sqlite_store)._commit_barrier = Threads()

    async def job(m: SessionMutator) -> None:
        for n in range(INLINE_COMMIT_WRITES + 1):
            m.set(addresses.session_name(), f"name {n}")

    await session.mutate(job, ctx)

    assert threads.on_the_loop() == [False]
    assert await session.get(addresses.session_name(), ctx) == f"name {INLINE_COMMIT_WRITES}"


async def test_a_commit_queues_behind_a_call_the_database_thread_has_in_hand(sqlite_store: Store, ctx: Context) -> None:
    backend = backend_of(sqlite_store)
    session = await sqlite_store.create_session(ctx)
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
        tmp_path: Path, sqlite_store: Store, ctx: Context) -> None:
    # Another connection to the same file holds the write lock inside a commit of its own. A
    # commit on the loop's thread would hold the whole loop until that lock is let go; it goes
    # to the database thread instead and lands once the other commit has.
    session = await sqlite_store.create_session(ctx)
    other = await connect(f"sqlite:///{tmp_path / 'journal.db'}", ctx)
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

        threads = backend_of(sqlite_store)._commit_barrier = Threads()
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
