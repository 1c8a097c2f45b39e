"""`harness worker` processes on one PostgreSQL store (issue 17): a run accepted elsewhere is
claimed at its notification, a SIGTERMed worker lets go, a SIGKILLed worker's session is finished
by another within seconds, a worker stopped until another took over commits nothing, a steer or
stop from another process reaches the run, and two workers with one killed mid-run settle every
run once without running a never-replay tool twice.

Real processes (`worker_child.py`), the faux model and a tool whose effect is a row in the store;
this test process plays the API process: it accepts, lets go, posts requests and reads the journal.
Runs only with HARNESS_TEST_POSTGRES_URL set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from harness.context import Context
from harness.conversation import ConversationService
from harness.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage, now_ms
from harness.runtime.outcomes import INTERRUPTED_REPLY
from harness.session import LaneLastResult, MessagePayload, QueueRequest, StopRequest, Store, addresses
from harness.session.records import AssistantEffectPending
from harness.session.work import WorkBoard, work_board
from worker_child import CONFIG, POLL_VARIABLE, RETRY_VARIABLE, holding

pytestmark = pytest.mark.postgres

CHILD = Path(__file__).parent / "worker_child.py"
USER = "ada"


@pytest.fixture
def store(ledger_store: Store) -> Store:
    """This module's store: PostgreSQL with the worker tool's ledger (conftest's `ledger_store`)."""
    return ledger_store


class Workers:
    """The worker processes of one test, each killed at the end if still running."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url, self.workdir = url, workdir
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *, concurrency: int = 4, poll_s: float | None = None,
              retry_ms: int | None = None) -> subprocess.Popen[str]:
        env = {**os.environ, **({POLL_VARIABLE: str(poll_s)} if poll_s is not None else {}),
               **({RETRY_VARIABLE: str(retry_ms)} if retry_ms is not None else {})}
        process = subprocess.Popen([sys.executable, str(CHILD), self.url, str(self.workdir), str(concurrency)],
                                   stdout=subprocess.PIPE, text=True, env=env)
        self.started.append(process)
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        return process

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture
def workers(postgres_schema_url: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(postgres_schema_url, tmp_path)
    try:
        yield started
    finally:
        started.close()


class Notes:
    """Wake-ups from the store's channel (every release and request notifies it), so a test waits
    on them rather than on a timer; a look every half second covers a notification sent before
    the listening connection was up."""

    def __init__(self, board: WorkBoard) -> None:
        self.board = board
        self.event = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async for _ in self.board.listen():
            self.event.set()

    async def until(self, check: Callable[[], Awaitable[bool]], within_s: float = 20.0) -> None:
        async with asyncio.timeout(within_s):
            while not await check():
                self.event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.event.wait(), 0.5)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@pytest.fixture
async def notes(store: Store) -> AsyncIterator[Notes]:
    listening = Notes(work_board(store))
    try:
        yield listening
    finally:
        await listening.close()


async def accept(service: ConversationService, text: str, ctx: Context) -> tuple[str, str]:
    """Create a conversation, admit `text` and let go of it, as an API process that never drives
    does; returns (conversation id, operation id)."""
    conversation = await service.create(USER, CONFIG, ctx)
    _, accepted = await service.admit(USER, conversation.id, text, ctx)
    await service.close(USER, conversation.id, ctx)
    return conversation.id, accepted.operation_id


async def last_result(store: Store, session_id: str, ctx: Context) -> LaneLastResult | None:
    session = await store.open_session(session_id, ctx)
    return await session.get(addresses.lane_last_result("main"), ctx)


def settled(store: Store, runs: list[tuple[str, str]], ctx: Context) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        for session_id, operation_id in runs:
            result = await last_result(store, session_id, ctx)
            if result is None or result.operation_id != operation_id:
                return False
        return True

    return check


async def ledger(url: str) -> Counter[str]:
    """How many times each call id ran the ledger's effect, in every process."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        rows = await (await conn.execute("SELECT call_id FROM ledger")).fetchall()
    return Counter(row[0] for row in rows)


def ledger_rows(url: str, at_least: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return sum((await ledger(url)).values()) >= at_least

    return check


async def branch(store: Store, session_id: str, ctx: Context) -> list[object]:
    session = await store.open_session(session_id, ctx)
    tip = await session.get(addresses.branch_tip("main"), ctx)
    assert tip is not None
    page = await session.read_branch(tip, ctx)
    return [entry.payload.message for entry in reversed(page.entries) if isinstance(entry.payload, MessagePayload)]


def text(message: object) -> str:
    content = getattr(message, "content", "")
    return content if isinstance(content, str) else "".join(b.text for b in content if isinstance(b, TextContent))


async def test_a_worker_claims_a_run_at_its_notification_and_lets_go_on_sigterm(
        store: Store, workers: Workers, notes: Notes, postgres_schema_url: str, ctx: Context) -> None:
    """With a 60 s poll, only the release's NOTIFY can wake the worker: the run still settles in
    seconds, far inside the poll (bounded loosely: CI's two cores are busy). SIGTERM then ends
    the worker cleanly, holding nothing."""
    worker = workers.start(poll_s=60)
    service = ConversationService(store)
    started = time.monotonic()

    run = await accept(service, "go", ctx)
    await notes.until(settled(store, [run], ctx), within_s=10)

    assert time.monotonic() - started < 10.0
    assert (result := await last_result(store, run[0], ctx)) is not None
    assert result.outcome == "completed"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "released"
    assert [item for item in await work_board(store).open_work(ctx) if item.held] == []


async def test_a_sigtermed_worker_ends_the_step_in_hand_and_leaves_the_rest_to_the_next(
        store: Store, workers: Workers, notes: Notes, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """SIGTERM mid-tool: the tool returns its real result, the worker lets go at the next step
    boundary and exits 0 with the run still open; the next worker asks the model and completes it,
    the tool having run once."""
    service = ConversationService(store)
    async with holding(postgres_schema_url, tmp_path) as release:
        stopping = workers.start(concurrency=1)
        run = await accept(service, "go", ctx)
        await notes.until(ledger_rows(postgres_schema_url, 1))
        stopping.send_signal(signal.SIGTERM)
        await release()
        assert stopping.wait(timeout=15) == 0

    assert (await last_result(store, run[0], ctx)) is None
    assert [type(m).__name__ for m in await branch(store, run[0], ctx)] == [
        "UserMessage", "AssistantMessage", "ToolResultMessage"]
    workers.start(concurrency=1)
    await notes.until(settled(store, [run], ctx))

    assert set((await ledger(postgres_schema_url)).values()) == {1}
    messages = await branch(store, run[0], ctx)
    results = [m for m in messages if isinstance(m, ToolResultMessage)]
    assert [(len(results), results[0].is_error)] == [(1, False)]
    assert text(messages[-1]) == "done"


async def test_a_worker_makes_a_due_retry_and_settles_the_run(
        store: Store, workers: Workers, notes: Notes, ctx: Context) -> None:
    """The model's first answer is a transient failure: the worker lets the session go at the
    retry wait, claims it again once the retry is due and makes it, and the run completes."""
    workers.start(concurrency=1)
    service = ConversationService(store)

    run = await accept(service, "flaky: go", ctx)
    await notes.until(settled(store, [run], ctx), within_s=10)

    assert (result := await last_result(store, run[0], ctx)) is not None
    assert result.outcome == "completed"
    assert [text(m) for m in await branch(store, run[0], ctx)] == ["flaky: go", "recovered go"]


async def test_a_killed_workers_session_is_finished_by_another_and_its_tool_never_runs_twice(
        store: Store, workers: Workers, notes: Notes, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """SIGKILL mid-tool: the lock dies with the connection, the other worker claims the session
    within seconds and answers the never-replay call with an interruption instead of running it."""
    service = ConversationService(store)
    async with holding(postgres_schema_url, tmp_path):
        first = workers.start(concurrency=1)
        run = await accept(service, "go", ctx)
        await notes.until(ledger_rows(postgres_schema_url, 1))
        workers.start(concurrency=1)
        first.kill()
        killed = time.monotonic()
        await notes.until(settled(store, [run], ctx), within_s=15)
        assert time.monotonic() - killed < 5.0

    assert set((await ledger(postgres_schema_url)).values()) == {1}
    messages = await branch(store, run[0], ctx)
    results = [m for m in messages if isinstance(m, ToolResultMessage)]
    assert len(results) == 1
    assert results[0].is_error
    assert text(messages[-1]) == "done"


async def test_a_reply_a_killed_worker_left_streaming_is_asked_again_at_once_by_the_next(
        store: Store, workers: Workers, notes: Notes, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """SIGKILL mid-stream, with retries a minute apart: the next worker rebuilds the cut reply from
    its frames, keeps it off the branch and asks the model again at once, not after a retry's
    backoff (the model's server did not fail), so the turn ends within seconds of the kill."""
    service = ConversationService(store)
    async with holding(postgres_schema_url, tmp_path):
        first = workers.start(concurrency=1, retry_ms=60_000)
        run = await accept(service, "stream: hi", ctx)
        await notes.until(lambda: _frames_written(store, run, ctx))
        first.kill()
    killed = time.monotonic()
    workers.start(concurrency=1, retry_ms=60_000)
    await notes.until(settled(store, [run], ctx), within_s=30)

    assert time.monotonic() - killed < 15.0  # loosely: CI's two cores are busy; a backoff is 60 s
    assert [text(m) for m in await branch(store, run[0], ctx)] == ["stream: hi", "streaming hi, then done"]
    session = await store.open_session(run[0], ctx)
    cut = [entry.payload.message for entry in await session.read_entries(ctx)
           if isinstance(entry.payload, MessagePayload) and isinstance(entry.payload.message, AssistantMessage)
           and entry.payload.message.error_message == INTERRUPTED_REPLY]
    assert [text(m) for m in cut] == ["streaming hi, "]


async def _frames_written(store: Store, run: tuple[str, str], ctx: Context) -> bool:
    """Whether the reply the run streams now has a frame page stored."""
    session = await store.open_session(run[0], ctx)
    state = await session.get(addresses.operation_state(run[1]), ctx)
    return isinstance(state, AssistantEffectPending) and bool(
        await session.read_list(addresses.assistant_frames(run[1], state.response_entry_id), ctx))


async def test_a_worker_stopped_until_another_took_over_commits_nothing(
        store: Store, workers: Workers, notes: Notes, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """SIGSTOP mid-tool: its lease goes quiet, the other worker ends its claim connection after
    the lease and finishes the run; on SIGCONT its tool returns and it tries to commit the
    result, which is refused: the journal is exactly as the other worker left it."""
    service = ConversationService(store)
    async with holding(postgres_schema_url, tmp_path) as release:
        stopped = workers.start(concurrency=1)
        run = await accept(service, "go", ctx)
        await notes.until(ledger_rows(postgres_schema_url, 1))
        stopped.send_signal(signal.SIGSTOP)
        workers.start(concurrency=1)
        await notes.until(settled(store, [run], ctx), within_s=20)
        session = await store.open_session(run[0], ctx)
        before = [(e.id, e.seq) for e in await session.read_entries(ctx)]
        values_before = await session.scan_values(addresses.lane_state(""), ctx)

        stopped.send_signal(signal.SIGCONT)
        await release()  # its tool returns now, and its drive tries to commit the result
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=20) == 0

    assert [(e.id, e.seq) for e in await session.read_entries(ctx)] == before
    assert await session.scan_values(addresses.lane_state(""), ctx) == values_before
    assert set((await ledger(postgres_schema_url)).values()) == {1}
    assert (result := await last_result(store, run[0], ctx)) is not None
    assert result.outcome == "completed"


async def test_a_steer_from_another_process_reaches_the_run_at_its_next_boundary(
        store: Store, workers: Workers, notes: Notes, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """Posted while the worker's tool runs, the steer is taken at its notification and placed
    after the tool result, before the next request, which answers it."""
    service = ConversationService(store)
    async with holding(postgres_schema_url, tmp_path) as release:
        workers.start()
        session_id, operation_id = await accept(service, "go", ctx)
        await notes.until(ledger_rows(postgres_schema_url, 1))
        session = await store.open_session(session_id, ctx)
        await session.post_request(QueueRequest(kind="steer", lane="main", operation_id=operation_id,
                                                message=UserMessage(content="steer: left", timestamp=0),
                                                requested_at=now_ms()), ctx)
        await notes.until(lambda: _no_requests(store, session_id, ctx))
        await release()
        await notes.until(settled(store, [(session_id, operation_id)], ctx))

    messages = await branch(store, session_id, ctx)
    assert [type(m).__name__ for m in messages] == [
        "UserMessage", "AssistantMessage", "ToolResultMessage", "UserMessage", "AssistantMessage"]
    assert text(messages[3]) == "steer: left"
    assert text(messages[4]) == "heard steer: left"


async def test_a_stop_from_another_process_aborts_the_run_the_worker_drives(
        store: Store, workers: Workers, notes: Notes, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """The stop reaches the worker mid-tool; the run settles aborted with the cause the sender gave,
    as a stop during a tool call (CE-7), and its tool call is answered."""
    service = ConversationService(store)
    async with holding(postgres_schema_url, tmp_path):
        workers.start()
        session_id, operation_id = await accept(service, "go", ctx)
        await notes.until(ledger_rows(postgres_schema_url, 1))
        session = await store.open_session(session_id, ctx)
        await session.post_request(StopRequest(lane="main", operation_id=operation_id, cause="user",
                                               requested_at=now_ms()), ctx)
        await notes.until(settled(store, [(session_id, operation_id)], ctx))

    result = await last_result(store, session_id, ctx)
    assert result is not None
    assert (result.outcome, result.abort_cause) == ("aborted", "user_during_tool")
    assert [type(m).__name__ for m in await branch(store, session_id, ctx)][-1] == "ToolResultMessage"


async def test_two_workers_one_killed_mid_run_settle_every_run_once(
        store: Store, workers: Workers, notes: Notes, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """Eight conversations, two workers, one SIGKILLed while it holds runs mid-tool, a third started:
    every run settles completed, each call is answered once, and no ledger effect ran twice."""
    service = ConversationService(store)
    async with holding(postgres_schema_url, tmp_path):
        doomed = workers.start(concurrency=4)
        workers.start(concurrency=4)
        runs = [await accept(service, f"go {n}", ctx) for n in range(8)]
        await notes.until(ledger_rows(postgres_schema_url, 6))
        doomed.kill()
        workers.start(concurrency=4)
    await notes.until(settled(store, runs, ctx), within_s=30)

    assert set((await ledger(postgres_schema_url)).values()) == {1}
    for session_id, _ in runs:
        messages = await branch(store, session_id, ctx)
        calls = [block.id for m in messages if isinstance(m, AssistantMessage) for block in m.content
                 if isinstance(block, ToolCall)]
        answered = [m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)]
        assert answered == calls
        assert len(calls) == 1
        assert [text(m) for m in messages if isinstance(m, AssistantMessage)][-1] == "done"
        result = await last_result(store, session_id, ctx)
        assert result is not None
        assert result.outcome == "completed"


async def _no_requests(store: Store, session_id: str, ctx: Context) -> bool:
    session = await store.open_session(session_id, ctx)
    return await session.scan_values(addresses.lane_request(""), ctx) == []
