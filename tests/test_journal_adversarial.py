"""Adversarial journal tests, from a review that tried to break the journal: regressions (each
docstring says what used to go wrong and why it matters) and properties that held but were untested.
White-box: they stop commits through the backends' `_commit_barrier` seam and read the SQLite schema."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from conftest import backend_url
from harness.context import Context
from harness.errors import HarnessError
from harness.messages import Usage
from harness.session import (
    CustomPayload,
    DataMigration,
    InvalidWrite,
    SessionMutator,
    SessionOwned,
    StorageCorruption,
    Store,
    addresses,
    connect,
    list_address,
    value_address,
)
from journal_helpers import CONFIG, append_chain, new_session_with_lane, user

TESTS = Path(__file__).resolve().parent


def nested_list(depth: int) -> list[Any]:
    root: list[Any] = []
    current = root
    for _ in range(depth):
        inner: list[Any] = []
        current.append(inner)
        current = inner
    return root


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'journal.db'}"


async def set_name(m: SessionMutator, value: str) -> None:
    m.set(addresses.session_name(), value)


# ============================================================================================
# Failures
# ============================================================================================


@pytest.mark.parametrize("where", ["entry", "value"])
@pytest.mark.parametrize("depth", [201, 250])
async def test_deeply_nested_json_is_refused_or_readable(
    store: Store, ctx: Context, depth: int, where: str
) -> None:
    """Regression: it used to be that JSON nested more than ~200 levels (up to ~350) is validated, encoded and
    committed, but the JSON parser used on read has a recursion limit of 200, so the row never decodes again:
    the entry raises StorageCorruption forever and every scan_branch/read_branch through it fails, i.e. one tool
    result or custom entry with deep `details` poisons the whole branch (same for values: the lane/app record
    becomes unreadable). The write must be refused (InvalidInput, nothing written) or stay readable."""
    session = await new_session_with_lane(store, ctx)
    address = value_address("test.deep")

    async def job(m: SessionMutator) -> str:
        if where == "value":
            m.set(address, nested_list(depth))
            return ""
        tip = m.insert_entry(CustomPayload(custom_type="deep", data=nested_list(depth)), parent_id=None)
        m.set(addresses.branch_tip("main"), tip)
        return tip

    try:
        entry_id = await session.mutate(job, ctx)
    except (HarnessError, ValidationError):  # refused at the write or at the payload's construction
        assert await session.get(addresses.branch_tip("main"), ctx) is None
        return
    if where == "value":
        assert await session.get(address, ctx) == nested_list(depth)
    else:
        assert await session.entry(entry_id, ctx) is not None
        await session.scan_branch(entry_id, lambda e: None, ctx)


async def test_deeper_json_fails_with_a_typed_error(store: Store, ctx: Context) -> None:
    """Regression: it used to be that a value nested ~400+ levels makes `encode` raise a bare RecursionError (not a
    HarnessError with a stable code) from the cleaning/context walk."""
    session = await new_session_with_lane(store, ctx)
    with pytest.raises(HarnessError):
        await session.mutate(lambda m: _set_value(m, nested_list(2000)), ctx)


async def _set_value(m: SessionMutator, value: Any) -> None:
    m.set(value_address("test.deep"), value)


async def test_unowned_writers_on_two_sqlite_stores_do_not_refuse_each_other(tmp_path: Path, ctx: Context) -> None:
    """Regression (SQLite): it used to be that nobody owns the session, yet a commit through a second Store (or a
    second process) gets SessionOwned while another unowned commit is in flight, because every unowned SQLite
    commit takes the session's *exclusive* flock as its "probe". With 6 processes appending 60 commits each, 4
    of them saw 52-60 SessionOwned errors (PostgreSQL uses a shared probe and has no such errors). An attach
    racing an unowned commit is refused the same way."""
    url = sqlite_url(tmp_path)
    first = await connect(url, ctx)
    second = await connect(url, ctx)
    try:
        session = await new_session_with_lane(first, ctx)
        other = await second.open_session(session.id, ctx)
        entered = threading.Event()

        def slow_commit() -> None:
            entered.set()
            time.sleep(0.3)

        first.backend.inline_commit_limit_s = 0  # type: ignore[attr-defined]  # on its thread, stopped there
        first.backend._commit_barrier = slow_commit  # type: ignore[attr-defined]
        in_flight = asyncio.create_task(session.mutate(lambda m: set_name(m, "first"), ctx))
        assert await asyncio.to_thread(entered.wait, 10)
        try:
            await other.mutate(lambda m: set_name(m, "second"), ctx)  # SessionOwned today
        finally:
            await in_flight
            first.backend._commit_barrier = None  # type: ignore[attr-defined]
        assert await session.get(addresses.session_name(), ctx) == "second"
    finally:
        await second.close()
        await first.close()


async def test_mutate_inside_a_job_is_reported_not_a_deadlock(store: Store, ctx: Context) -> None:
    """Regression: it used to be that calling `session.mutate` from inside a job on the same session waits forever
    on the non-reentrant session line (every backend). It should raise a clear typed error."""
    session = await new_session_with_lane(store, ctx)

    async def outer(m: SessionMutator) -> None:
        await session.mutate(lambda inner: set_name(inner, "inner"), ctx)

    try:
        await asyncio.wait_for(session.mutate(outer, ctx), timeout=2)
    except HarnessError:
        return
    except TimeoutError:
        pytest.fail("nested Session.mutate deadlocked on the session line")


async def test_a_job_whose_context_was_cancelled_while_queued_does_not_run(store: Store, ctx: Context) -> None:
    """Regression: it used to be that Context cancellation is only checked before joining the line. A job whose
    invocation was cancelled while it waited behind another job still runs and commits, and the caller gets a
    normal return, so "stop" does not stop a queued write."""
    session = await new_session_with_lane(store, ctx)
    gate = asyncio.Event()

    async def blocker(m: SessionMutator) -> None:
        await gate.wait()

    queued_ctx = Context()
    blocking = asyncio.create_task(session.mutate(blocker, ctx))
    await asyncio.sleep(0)
    queued = asyncio.create_task(session.mutate(lambda m: set_name(m, "queued ran"), queued_ctx))
    await asyncio.sleep(0)
    queued_ctx.cancel("user pressed stop")
    gate.set()
    await blocking
    with pytest.raises(HarnessError):
        await queued
    assert await session.get(addresses.session_name(), ctx) is None


async def test_cancelled_commit_is_either_undone_or_continued(tmp_path: Path, ctx: Context) -> None:
    """Regression (SQLite): it used to be that asyncio-cancelling `create_lane` while its commit runs on the
    database thread leaves the commit durable (the lane exists) but raises CancelledError to the caller and
    never runs `on_committed`, the commit continuation that publishes the projection (HA-15). The projection
    then silently disagrees with the journal."""
    store = await connect(sqlite_url(tmp_path), ctx)
    try:
        session = await store.create_session(ctx)
        entered = threading.Event()

        def slow_commit() -> None:
            entered.set()
            time.sleep(0.3)

        store.backend.inline_commit_limit_s = 0  # type: ignore[attr-defined]  # on its thread, stopped there
        store.backend._commit_barrier = slow_commit  # type: ignore[attr-defined]
        continued: list[object] = []
        task = asyncio.create_task(session.create_lane("main", CONFIG, ctx, on_committed=continued.append))
        assert await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        store.backend._commit_barrier = None  # type: ignore[attr-defined]
        await session.mutate(lambda m: set_name(m, "after"), ctx)  # wait for the line to drain
        lane_exists = await session.get_record(addresses.branch_tip("main"), ctx) is not None
        assert lane_exists == bool(continued), "the lane was committed but its continuation never ran"
    finally:
        await store.close()


async def test_a_session_used_after_its_store_closed_raises_store_closed(store: Store, ctx: Context) -> None:
    """Regression: it used to be that after `Store.close()`, a `Session` from it raises a bare RuntimeError
    ("cannot schedule new futures after shutdown") on SQLite, a psycopg_pool PoolClosed on PostgreSQL, and keeps
    working on memory. It should raise StoreClosed (a HarnessError) everywhere."""
    session = await new_session_with_lane(store, ctx)
    await store.close()
    with pytest.raises(HarnessError) as raised:
        await session.mutate(lambda m: set_name(m, "late"), ctx)
    assert raised.value.code == "store_closed"
    with pytest.raises(HarnessError):
        await session.get(addresses.session_name(), ctx)


async def test_a_job_queued_while_the_store_closes_gets_store_closed(tmp_path: Path, ctx: Context) -> None:
    """Regression (SQLite): it used to be that a job that joins the line after `Store.close()` started fails with
    sqlite3.ProgrammingError "Cannot operate on a closed database" instead of StoreClosed."""
    store = await connect(sqlite_url(tmp_path), ctx)
    session = await new_session_with_lane(store, ctx)
    gate = asyncio.Event()

    async def blocker(m: SessionMutator) -> None:
        await gate.wait()

    blocking = asyncio.create_task(session.mutate(blocker, ctx))
    await asyncio.sleep(0)
    closing = asyncio.create_task(store.close())
    await asyncio.sleep(0)
    late = asyncio.create_task(session.mutate(lambda m: set_name(m, "late"), ctx))
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.wait_for(asyncio.gather(blocking, closing, late, return_exceptions=True), 10)
    assert isinstance(results[2], HarnessError), results[2]
    assert results[2].code == "store_closed"


async def test_store_close_releases_a_claim_whose_session_was_dropped(tmp_path: Path, ctx: Context) -> None:
    """Regression (SQLite): it used to be that `Store` tracks sessions in a WeakValueDictionary and the SQLite
    claim is a bare fd with no finalizer. If the owner drops its SessionOwnership and Session without detaching,
    `Store.close()` cannot find it and the flock stays held for the rest of the process: the session can never
    be attached again from this process or any other."""
    import gc

    url = sqlite_url(tmp_path)
    store = await connect(url, ctx)
    session = await new_session_with_lane(store, ctx)
    session_id = session.id
    ownership = await session.attach("forgetful owner", ctx)
    del ownership, session
    gc.collect()
    await store.close()

    other = await connect(url, ctx)
    try:
        reclaimed = await (await other.open_session(session_id, ctx)).attach("next", ctx)
        await reclaimed.detach(ctx)
    finally:
        await other.close()


async def test_a_close_cancelled_while_it_waits_its_turn_still_closes(tmp_path: Path, ctx: Context) -> None:
    """Regression (SQLite): a `close()` cancelled while a commit held the database thread was
    skipped there but marked done here, so the connection and the claim's lock stayed held and
    another store could never attach the session."""
    url = sqlite_url(tmp_path)
    store = await connect(url, ctx)
    session = await new_session_with_lane(store, ctx)
    ownership = await session.attach("owner", ctx)
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(10)

    store.backend.inline_commit_limit_s = 0  # type: ignore[attr-defined]  # on its thread, stopped there
    store.backend._commit_barrier = hold  # type: ignore[attr-defined]
    committing = asyncio.create_task(ownership.mutate(lambda m: set_name(m, "landed"), ctx))
    await asyncio.to_thread(started.wait, 10)
    closing = asyncio.create_task(store.backend.close())
    await asyncio.sleep(0.01)
    closing.cancel()
    release.set()
    await asyncio.gather(committing, closing, return_exceptions=True)

    other = await connect(url, ctx)
    try:
        reopened = await other.open_session(session.id, ctx)
        assert await reopened.get(addresses.session_name(), ctx) == "landed"
        await (await reopened.attach("next", ctx)).detach(ctx)
    finally:
        await other.close()


EXIT_CHILD = """
import asyncio, sys, time
from harness.context import Context
from harness.session import SetValue, connect

async def main(url):
    ctx = Context()
    store = await connect(url, ctx)
    session = await store.create_session(ctx)
    print(session.id, flush=True)
    store.backend.inline_commit_limit_s = 0  # handed to the database thread
    store.backend._commit_barrier = lambda: time.sleep(0.3)
    store.backend.post(session.id, [SetValue("test.exit", "", '"kept"')], ctx)  # handed over, never awaited

asyncio.run(main(sys.argv[1]))
"""


async def test_a_commit_handed_to_the_database_thread_lands_when_the_process_exits(
    tmp_path: Path, ctx: Context
) -> None:
    """Regression (SQLite): the database thread, a daemon, was stopped at interpreter exit with a
    commit it had been handed still running, which the executor before it finished."""
    url = sqlite_url(tmp_path)
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", EXIT_CHILD, url, cwd=TESTS,
                                                 stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0
    store = await connect(url, ctx)
    try:
        session = await store.open_session(out.decode().strip(), ctx)
        assert await session.get(value_address("test.exit"), ctx) == "kept"
    finally:
        await store.close()


async def test_a_store_dropped_unclosed_leaves_no_database_thread(tmp_path: Path, ctx: Context) -> None:
    """Regression (SQLite): a store dropped without `close()` kept its database thread waiting for
    work forever, one per store."""
    import gc

    def database_threads() -> int:
        return sum(thread.name.startswith("harness-sqlite:") for thread in threading.enumerate())

    before = database_threads()
    for index in range(3):
        await connect(f"sqlite:///{tmp_path / f'dropped-{index}.db'}", ctx)
    gc.collect()
    assert database_threads() == before


async def test_a_connect_cancelled_while_the_file_opens_leaves_nothing_open(tmp_path: Path, ctx: Context) -> None:
    """Regression: it used to be that a connect cancelled while the database thread opened the
    file (here: waiting for another connection's write lock to create the schema) dropped what
    the thread went on to open: the connection and the commit mark's descriptor stayed open for
    good, and the file's lock descriptors with them."""
    path = (tmp_path / "journal.db").resolve()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("BEGIN IMMEDIATE")

    def open_files() -> list[str]:
        links = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
        return [link for link in links if link.startswith(str(path))]

    held = len(open_files())
    opening = asyncio.ensure_future(connect(f"sqlite:///{path}", ctx))
    # Nothing to wait on: watch for the thread's connection to open the file (it then waits for
    # the holder's lock), boundedly.
    for _ in range(2000):
        if len(open_files()) > held:
            break
        await asyncio.sleep(0.005)
    assert len(open_files()) > held, "the connect never opened the file"
    [thread] = [t for t in threading.enumerate() if t.name == "harness-sqlite:journal.db"]
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    holder.execute("COMMIT")
    holder.close()
    await asyncio.to_thread(thread.join, 30)

    assert not thread.is_alive()
    assert open_files() == []


FORK_CHILD = """
import asyncio, sys, time
from harness.context import Context
from harness.session import connect

async def main(url, session_id, entry_id):
    ctx = Context()
    store = await connect(url, ctx)
    def hang():
        print("in-commit", flush=True)
        time.sleep(60)
    store.backend._commit_barrier = hang
    await store.fork_session(session_id, entry_id, ctx)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_fork_killed_mid_way_leaves_no_session(tmp_path: Path, ctx: Context) -> None:
    """Regression (SQLite): it used to be that `fork_session` creates the session in one transaction and writes its
    branch and lane in another. A SIGKILL between them leaves a half fork: a session listed with
    `parent_session_id` set but no entries and no lane. A fork should be all-or-nothing."""
    url = sqlite_url(tmp_path)
    store = await connect(url, ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        ids = await append_chain(session, ["a", "b"], ctx)
        script = tmp_path / "fork_child.py"
        script.write_text(FORK_CHILD)
        process = subprocess.Popen([sys.executable, str(script), url, session.id, ids[1]],  # noqa: ASYNC220 (spawns only)
                                   stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 30)
            assert line.strip() == "in-commit"
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
            if process.stdout is not None:
                process.stdout.close()

        sessions = await store.list_sessions(ctx)
        half = [s for s in sessions if s.parent_session_id == session.id]
        assert half == [], "a killed fork left an empty session behind"
    finally:
        await store.close()


@pytest.mark.parametrize("lane", ["", "a\x00b"])
async def test_fork_refuses_a_lane_name_create_lane_refuses(store: Store, ctx: Context, lane: str) -> None:
    """Regression: it used to be that `create_lane` refuses an empty lane name or one holding NUL (InvalidInput),
    but `fork_session(..., lane=...)` bypasses the mutator's identifier checks: memory and SQLite write such a
    lane tip unchecked ("" on PostgreSQL too), and PostgreSQL answers a NUL lane with a bare psycopg.DataError
    instead of a HarnessError."""
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, ["a"], ctx)
    before = len(await store.list_sessions(ctx))
    with pytest.raises(HarnessError):
        await store.fork_session(session.id, ids[0], ctx, lane=lane)
    assert len(await store.list_sessions(ctx)) == before


@pytest.mark.parametrize("url", ["sqlite:", "sqlite:relative.db", "postgresql:/"])
async def test_malformed_urls_raise_unsupported_store_url(url: str, ctx: Context) -> None:
    """Regression: it used to be that `sqlite:` and `sqlite:relative.db` raise a bare IndexError, `postgresql:/` a
    psycopg ProgrammingError; `connect` promises UnsupportedStoreUrl for anything it does not support."""
    with pytest.raises(HarnessError) as raised:
        await asyncio.wait_for(connect(url, ctx), 10)
    assert raised.value.code == "unsupported_store_url"


async def test_bad_sqlite_options_and_paths_raise_typed_errors(tmp_path: Path, ctx: Context) -> None:
    """Regression: it used to be that `?synchronous=bogus` raises a bare ValueError, and a path that is a directory
    a raw sqlite3.OperationalError, instead of a HarnessError with a stable code."""
    with pytest.raises(HarnessError):
        await connect(f"sqlite:///{tmp_path / 'x.db'}?synchronous=bogus", ctx)
    (tmp_path / "adir").mkdir()
    with pytest.raises(HarnessError):
        await connect(f"sqlite:///{tmp_path / 'adir'}", ctx)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_data_migration_raising_stop_iteration_fails_the_connect(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest, ctx: Context) -> None:
    """Regression: a migration's function runs on the SQLite database thread, and a StopIteration
    it raised (a `next()` on an empty iterator) could not be handed to the waiting future, so
    `connect` waited forever. It fails on every backend as a coroutine's StopIteration does
    (PEP 479), and nothing changed."""
    url = backend_url(kind, tmp_path, request)
    store = await connect(url, ctx)
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, ["a"], ctx)
    await store.close()

    def migrate(payload: dict[str, Any]) -> dict[str, Any] | None:
        return next(iter([]))

    with pytest.raises(RuntimeError, match="StopIteration") as raised:
        await asyncio.wait_for(connect(url, ctx, data_migrations=[DataMigration("stops", migrate)]), 30)
    assert isinstance(raised.value.__cause__, StopIteration)
    reopened = await connect(url, ctx)
    try:
        entry = await (await reopened.open_session(session.id, ctx)).entry(ids[0], ctx)
        assert entry is not None
    finally:
        await reopened.close()


async def test_a_data_migration_over_a_corrupt_row_names_it(tmp_path: Path, ctx: Context) -> None:
    """Regression: it used to be that with any data migration registered, one undecodable entry row makes `connect`
    raise a bare json.JSONDecodeError that names nothing, so the whole store cannot be opened. The migration
    leaves the row as it is (every `harness` command applies the journal's migrations, so refusing would lock
    the store for good, `harness abort` included), and reading it is StorageCorruption naming the entry."""
    url = sqlite_url(tmp_path)
    store = await connect(url, ctx)
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, ["a", "b"], ctx)
    await store.close()
    with sqlite3.connect(tmp_path / "journal.db") as db:
        db.execute("UPDATE entries SET payload = '{\"type\": \"message\", \"oops\"' WHERE id = ?", (ids[0],))

    reopened = await connect(url, ctx, data_migrations=[DataMigration("noop", lambda payload: None)])
    try:
        with pytest.raises(StorageCorruption) as raised:
            await (await reopened.open_session(session.id, ctx)).entry(ids[0], ctx)
        assert raised.value.details.get("entry_id") == ids[0]
    finally:
        await reopened.close()


async def test_one_job_never_produces_two_transactions(store: Store, ctx: Context) -> None:
    """Regression (SQLite, PostgreSQL): it used to be that `commit()` marks the mutator committed only after the
    backend returns, so a job that stages while its commit is in flight (e.g. from a task it spawned) gets a
    second transaction: "a job's staged writes commit as one transaction, at most once" breaks. A second commit
    should raise InvalidWrite (as it does on memory)."""
    session = await new_session_with_lane(store, ctx)

    async def job(m: SessionMutator) -> None:
        m.set(value_address("test.a"), 1)
        first = asyncio.create_task(m.commit())
        await asyncio.sleep(0)
        try:
            m.set(value_address("test.b"), 2)
            await m.commit()
        finally:
            await first

    with pytest.raises(InvalidWrite):
        await session.mutate(job, ctx)
    assert await session.get(value_address("test.b"), ctx) is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
async def test_non_finite_floats_are_refused_not_silently_nulled(store: Store, ctx: Context, value: float) -> None:
    """Regression: it used to be that NaN and ±Infinity are accepted by JSON values and stored as `null`, so the
    value read back differs from the one written with no error. Bad input should get InvalidInput."""
    session = await new_session_with_lane(store, ctx)
    address = value_address("test.float")
    try:
        await session.mutate(lambda m: _set_at(m, address, {"x": value}), ctx)
    except HarnessError:
        assert await session.get(address, ctx) is None
        return
    stored = await session.get(address, ctx)
    assert stored is not None
    assert stored["x"] is not None


async def _set_at(m: SessionMutator, address: Any, value: Any) -> None:
    m.set(address, value)


async def test_reading_an_unknown_tip_is_not_storage_corruption(store: Store, ctx: Context) -> None:
    """Regression: it used to be that `read_branch`/`scan_branch` of a tip id that is simply not in the session
    raise StorageCorruption ("entry ... on the branch is missing"), telling the caller the database is damaged
    when the input was wrong. It should be UnknownEntry."""
    session = await new_session_with_lane(store, ctx)
    with pytest.raises(HarnessError) as raised:
        await session.read_branch("no-such-entry", ctx)
    assert raised.value.code == "unknown_entry"


async def test_reading_a_key_with_a_lone_surrogate_is_a_typed_error(store: Store, ctx: Context) -> None:
    """Regression (SQLite, PostgreSQL): it used to be that writes with a lone surrogate in a key are refused with
    InvalidWrite, but a read (`get`) with such a key raises a bare UnicodeEncodeError on SQLite and PostgreSQL
    while memory returns None. Reads should agree across backends (None or a typed error)."""
    session = await new_session_with_lane(store, ctx)
    with contextlib.suppress(HarnessError):
        assert await session.get(value_address("test.ns", "k\ud800"), ctx) is None


# ============================================================================================
# Properties that hold (untested before)
# ============================================================================================


async def test_cancelling_queued_tasks_keeps_fifo_and_the_line_usable(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    gate = asyncio.Event()
    ran: list[object] = []

    async def blocker(m: SessionMutator) -> None:
        await gate.wait()
        ran.append("blocker")

    def job_for(i: int) -> Any:
        async def job(m: SessionMutator) -> None:
            ran.append(i)
            m.set(value_address("test.order", str(i)), i)

        return job

    blocking = asyncio.create_task(session.mutate(blocker, ctx))
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(session.mutate(job_for(i), ctx)) for i in range(6)]
    await asyncio.sleep(0)
    tasks[2].cancel()
    tasks[4].cancel()
    gate.set()
    await asyncio.wait_for(asyncio.gather(blocking, *tasks, return_exceptions=True), 10)
    await asyncio.wait_for(session.mutate(job_for(99), ctx), 5)
    assert ran == ["blocker", 0, 1, 3, 5, 99]
    assert await session.get(value_address("test.order", "2"), ctx) is None


async def test_on_committed_raising_keeps_the_commit_and_frees_the_line(store: Store, ctx: Context) -> None:
    session = await store.create_session(ctx)

    def boom(_: object) -> None:
        raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError):
        await session.create_lane("main", CONFIG, ctx, on_committed=boom)
    assert await session.lanes(ctx) == ["main"]
    await asyncio.wait_for(append_chain(session, ["after"], ctx), 5)


async def test_context_cancelled_mid_commit_leaves_the_commit_whole(store: Store, ctx: Context) -> None:
    """A Context cancelled after the job staged its writes does not split the commit."""
    session = await new_session_with_lane(store, ctx)
    job_ctx = Context()

    async def job(m: SessionMutator) -> list[str]:
        tip = None
        ids = []
        for i in range(50):
            tip = m.insert_entry(user(f"m{i}"), parent_id=tip)
            ids.append(tip)
        m.set(addresses.branch_tip("main"), tip)
        job_ctx.cancel("mid-job")
        return ids

    ids = await session.mutate(job, job_ctx)
    page = await session.read_branch(ids[-1], ctx, limit=100)
    assert len(page.entries) == 50
    seqs = sorted(e.seq for e in page.entries)
    assert seqs == list(range(seqs[0], seqs[0] + 50))


@pytest.mark.parametrize("bad", ["dup", "self", "later", "usage-dup", "surrogate", "nul", "empty-key"])
async def test_bad_writes_inside_one_commit_are_refused_whole(store: Store, ctx: Context, bad: str) -> None:
    session = await new_session_with_lane(store, ctx)

    async def job(m: SessionMutator) -> None:
        m.set(addresses.session_name(), "should not land")
        m.insert_entry(user("ok"), parent_id=None, entry_id="e1")
        if bad == "dup":
            m.insert_entry(user("dup"), parent_id=None, entry_id="e1")
        elif bad == "self":
            m.insert_entry(user("loop"), parent_id="e2", entry_id="e2")
        elif bad == "later":
            m.insert_entry(user("child"), parent_id="e3", entry_id="e4")
            m.insert_entry(user("parent"), parent_id=None, entry_id="e3")
        elif bad == "usage-dup":
            m.insert_usage(Usage(input=1), usage_id="e1")
        elif bad == "surrogate":
            m.insert_entry(user("x"), parent_id=None, entry_id="id\ud800")
        elif bad == "nul":
            m.set(value_address("test.ns", "a"), 1)
            m.set(addresses.entry_label("a\x00b"), "label")
        elif bad == "empty-key":
            m.insert_entry(user("x"), parent_id="", entry_id="e5")

    with pytest.raises(HarnessError) as raised:
        await session.mutate(job, ctx)
    assert raised.value.code == "invalid_write"
    assert await session.get(addresses.session_name(), ctx) is None
    assert await session.entry("e1", ctx) is None


async def test_a_parent_in_another_session_is_refused(store: Store, ctx: Context) -> None:
    first = await new_session_with_lane(store, ctx)
    second = await new_session_with_lane(store, ctx)
    [foreign] = await append_chain(first, ["a"], ctx)

    async def job(m: SessionMutator) -> None:
        m.insert_entry(user("b"), parent_id=foreign)

    with pytest.raises(InvalidWrite):
        await second.mutate(job, ctx)


async def test_prefix_scan_is_literal_for_underscore_and_unicode(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    keys = ["a_b", "axb", "a_", "é:1", "é:2", "e:1", "😀:1", "😀x"]

    async def job(m: SessionMutator) -> None:
        for key in keys:
            m.set(value_address("test.keys", key), key)

    await session.mutate(job, ctx)
    assert [k for k, _ in await session.scan_values(value_address("test.keys", "a_"), ctx)] == ["a_", "a_b"]
    assert [k for k, _ in await session.scan_values(value_address("test.keys", "é:"), ctx)] == ["é:1", "é:2"]
    assert [k for k, _ in await session.scan_values(value_address("test.keys", "😀:"), ctx)] == ["😀:1"]


async def test_huge_integers_round_trip(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    values = [2**70, -(2**64), 12345678901234567890123, 1e308]
    await session.mutate(lambda m: _set_at(m, value_address("test.big"), values), ctx)
    assert await session.get(value_address("test.big"), ctx) == values


async def test_two_sqlite_stores_racing_attach_have_one_winner(tmp_path: Path, ctx: Context) -> None:
    url = sqlite_url(tmp_path)
    stores = [await connect(url, ctx) for _ in range(5)]
    try:
        session = await new_session_with_lane(stores[0], ctx)
        views = [await s.open_session(session.id, ctx) for s in stores]
        results = await asyncio.gather(*(v.attach(f"o{i}", ctx) for i, v in enumerate(views)),
                                       return_exceptions=True)
        winners = [r for r in results if not isinstance(r, BaseException)]
        assert len(winners) == 1
        assert all(isinstance(r, SessionOwned) for r in results if isinstance(r, BaseException))
        for view in views:
            if view is not winners[0].session:
                with pytest.raises(SessionOwned):
                    await append_chain(view, ["intruder"], ctx)
    finally:
        for s in stores:
            await s.close()


APPENDER = """
import asyncio, sys, time
from harness.context import Context
from harness.session import SessionOwned, connect, list_address

async def main(url, session_id, tag):
    ctx = Context()
    store = await connect(url, ctx)
    session = await store.open_session(session_id, ctx)
    log = list_address("test.log")
    deadline = time.monotonic() + 60
    for i in range(15):
        async def job(m, i=i):
            for k in range(3):
                m.append(log, f"{tag}:{i}:{k}")
        while True:
            try:
                await session.mutate(job, ctx)
                break
            except SessionOwned:  # the SQLite probe defect above; retried here
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.002)
    await store.close()

asyncio.run(main(*sys.argv[1:]))
"""


async def test_concurrent_processes_keep_each_commit_contiguous(tmp_path: Path, ctx: Context) -> None:
    """Four processes appending 3-item commits to one SQLite session: no 'database is locked',
    every commit's seqs are contiguous and all seqs strictly increase."""
    url = sqlite_url(tmp_path)
    store = await connect(url, ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        script = tmp_path / "appender.py"
        script.write_text(APPENDER)
        env = {**os.environ, "PYTHONPATH": str(TESTS)}
        processes = [subprocess.Popen([sys.executable, str(script), url, session.id, f"p{i}"],  # noqa: ASYNC220
                                      stderr=subprocess.PIPE, text=True, env=env) for i in range(4)]
        try:
            errors = [p.communicate(timeout=90)[1] for p in processes]
        finally:
            for p in processes:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
        assert [p.returncode for p in processes] == [0, 0, 0, 0], errors
        items = await session.read_list(list_address("test.log"), ctx, limit=10_000)
        assert len(items) == 4 * 15 * 3
        seqs = [i.seq for i in items]
        assert all(a < b for a, b in itertools.pairwise(seqs))
        by_commit: dict[str, list[int]] = {}
        for item in items:
            tag, i, _ = item.item.split(":")
            by_commit.setdefault(f"{tag}:{i}", []).append(item.seq)
        assert all(s == list(range(s[0], s[0] + 3)) for s in by_commit.values())
    finally:
        await store.close()


# ============================================================================================
# Bytes that are not UTF-8 (SQLite only: PostgreSQL refuses invalid UTF-8 in a text column, so
# this damage cannot exist there; the memory store holds Python strings)
# ============================================================================================

NOT_UTF8 = "CAST(X'80ff' AS TEXT)"


async def test_payload_bytes_that_are_not_utf8_are_storage_corruption_naming_the_row(
    tmp_path: Path, ctx: Context
) -> None:
    """Regression (issue 10): a payload whose bytes are not UTF-8 made every SQLite reader raise a
    bare sqlite3.OperationalError. Each reader now raises StorageCorruption naming the entry, the
    record address or the usage row, and the rows around it stay readable."""
    url = sqlite_url(tmp_path)
    store = await connect(url, ctx)
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, ["a", "b", "c"], ctx)
    frames = list_address("test.frames", "op")

    async def job(m: SessionMutator) -> None:
        m.set(addresses.session_name(), "damaged")
        m.append(frames, {"page": 1})
        m.insert_usage(Usage(input=1), usage_id="usage-1")

    await session.mutate(job, ctx)
    name = addresses.session_name()
    with sqlite3.connect(tmp_path / "journal.db") as db:
        db.execute(f"UPDATE entries SET payload = {NOT_UTF8} WHERE id = ?", (ids[1],))
        db.execute(f"UPDATE record_values SET value = {NOT_UTF8} WHERE namespace = ? AND key = ?",
                   (name.namespace, name.key))
        db.execute(f"UPDATE list_items SET value = {NOT_UTF8} WHERE namespace = 'test.frames'")
        db.execute(f"UPDATE usage_ledger SET usage = {NOT_UTF8} WHERE id = 'usage-1'")

    entry_readers: dict[str, Callable[[], Awaitable[object]]] = {
        "entry": lambda: session.entry(ids[1], ctx),
        "entries": lambda: session.entries(ids, ctx),
        "read_entries": lambda: session.read_entries(ctx),
        "scan_branch": lambda: session.scan_branch(ids[2], lambda entry: None, ctx),
        "read_branch": lambda: session.read_branch(ids[2], ctx),
    }
    for reader, read in entry_readers.items():
        with pytest.raises(StorageCorruption) as raised:
            await read()
        assert raised.value.details == {"entry_id": ids[1]}, reader
    record_readers: list[Callable[[], Awaitable[object]]] = [
        lambda: session.get(name, ctx), lambda: session.scan_values(name, ctx)]
    for read in record_readers:
        with pytest.raises(StorageCorruption) as raised:
            await read()
        assert raised.value.details == {"address": f"{name.namespace}/{name.key}"}
    with pytest.raises(StorageCorruption) as raised:
        await session.read_list(frames, ctx)
    assert raised.value.details == {"address": "test.frames/op"}
    with pytest.raises(StorageCorruption) as raised:
        await session.usage_ledger(ctx)
    assert raised.value.details == {"usage_id": "usage-1"}
    assert (await session.entry(ids[2], ctx)) is not None
    await store.close()

    reopened = await connect(url, ctx, data_migrations=[DataMigration("noop-utf8", lambda payload: None)])
    await reopened.close()  # a migration leaves the damaged row as it is and opens the store


async def test_an_id_column_that_is_not_utf8_is_storage_corruption(tmp_path: Path, ctx: Context) -> None:
    """The same damage outside a payload (here a parent id) is a typed error too, not a bare
    sqlite3.OperationalError."""
    store = await connect(sqlite_url(tmp_path), ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        ids = await append_chain(session, ["a", "b"], ctx)
        with sqlite3.connect(tmp_path / "journal.db") as db:
            db.execute(f"UPDATE entries SET parent_id = {NOT_UTF8} WHERE id = ?", (ids[1],))

        with pytest.raises(StorageCorruption):
            await session.entry(ids[1], ctx)
    finally:
        await store.close()


async def test_a_version_4_sqlite_store_keeps_its_records_and_list_items_when_they_lose_their_rowid(
    tmp_path: Path, ctx: Context
) -> None:
    """Schema step 5 rebuilds `record_values` and `list_items` as WITHOUT ROWID tables; a store
    written before it reads back every record and list item, and keeps writing after it."""
    from harness.session.sqlite import SCHEMA

    note, log = value_address("app.note", "n", str), list_address("app.log", "l", int)
    with sqlite3.connect(tmp_path / "journal.db") as db:
        db.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER)")
        for version, statements in SCHEMA[:4]:
            for statement in statements:
                db.execute(statement)
            db.execute("INSERT INTO schema_version VALUES (?, 0)", (version,))
        db.execute("INSERT INTO sessions (id, created_at, next_seq) VALUES ('s', 1000, 4)")
        db.execute("INSERT INTO record_values VALUES ('s', 'app.note', 'n', 1, '\"kept\"')")
        db.executemany("INSERT INTO list_items VALUES ('s', 'app.log', 'l', ?, ?)", [(2, "20"), (3, "30")])

    store = await connect(sqlite_url(tmp_path), ctx)
    try:
        session = await store.open_session("s", ctx)
        assert await session.get(note, ctx) == "kept"

        async def job(m: SessionMutator) -> None:
            m.append(log, 40)

        await session.mutate(job, ctx)
        assert [item.item for item in await session.read_list(log, ctx)] == [20, 30, 40]
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / "journal.db") as db:
        tables = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE name IN ('record_values', 'list_items')"))
    assert len(tables) == 2
    assert all("WITHOUT ROWID" in sql for sql in tables.values())


async def test_a_version_1_sqlite_store_gains_updated_at_from_its_newest_entry(tmp_path: Path, ctx: Context) -> None:
    """Schema step 2 adds `sessions.updated_at`; a store written before it gets each session's
    newest entry time (or its creation time when it has none)."""
    from harness.session.sqlite import SCHEMA

    with sqlite3.connect(tmp_path / "journal.db") as db:
        db.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER)")
        for statement in dict(SCHEMA)[1]:
            db.execute(statement)
        db.execute("INSERT INTO schema_version VALUES (1, 0)")
        db.execute("INSERT INTO sessions (id, created_at) VALUES ('with-entries', 1000), ('empty', 2000)")
        db.execute("INSERT INTO entries VALUES ('with-entries', 'e1', NULL, 1, 5000, 'message', NULL, '{}')")

    store = await connect(sqlite_url(tmp_path), ctx)
    try:
        listed = {info.id: (info.created_at, info.updated_at) for info in await store.list_sessions(ctx)}
    finally:
        await store.close()

    assert listed == {"with-entries": (1000, 5000), "empty": (2000, 2000)}
