"""`harness serve --workers external` (issue 17 item 2): the API process accepts, posts and
follows; real `harness worker` processes (`worker_child.py`) drive.

The app runs in this process under uvicorn with external workers, the worker in its own process
with a 60 s poll, so only notifications wake either of them. Runs only with
HARNESS_TEST_POSTGRES_URL set, except the checks of what external mode refuses.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest

from harness.context import Context
from harness.conversation import ConversationService
from harness.messages import ModelIdentity
from harness.runtime import read_lane_events
from harness.server import LocalUser, ServerOptions, create_app
from harness.session import LaneConfig, LaneLastResult, Store, WorkNeedsPostgres, addresses, connect
from server_helpers import SseEvent, asgi_client, serving, sse_until
from test_cli_sessions import harness
from worker_child import CONFIG, LEDGER_TABLE, POLL_VARIABLE, hold_key

CHILD = Path(__file__).parent / "worker_child.py"
USER = "ada"
EXTERNAL = ServerOptions(workers="external", follow_poll_s=60.0, heartbeat_s=60.0)


def _lane(model: ModelIdentity | None) -> LaneConfig:
    return CONFIG


@contextmanager
def worker(url: str, workdir: Path) -> Iterator[subprocess.Popen[str]]:
    """One worker process with a 60 s poll, ready when yielded, SIGTERMed and reaped on leaving."""
    process = subprocess.Popen([sys.executable, str(CHILD), url, str(workdir), "2"], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, POLL_VARIABLE: "60"})
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


@asynccontextmanager
async def holding(url: str, workdir: Path) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Hold the worker's lock (its ledger tool and its `stream:` replies wait on it) until the
    returned release is awaited, or the block ends."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (hold_key(workdir),))
        held = True

        async def release() -> None:
            nonlocal held
            if held:
                held = False
                await conn.execute("SELECT pg_advisory_unlock(%s)", (hold_key(workdir),))

        try:
            yield release
        finally:
            await release()


@pytest.fixture
async def store(postgres_schema_url: str, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(postgres_schema_url, ctx)
    async with await psycopg.AsyncConnection.connect(postgres_schema_url, autocommit=True) as conn:
        await conn.execute(LEDGER_TABLE)
    try:
        yield opened
    finally:
        await opened.close()


class Watcher:
    """A client of a conversation's event stream in a task of its own, until `run_end`."""

    def __init__(self, client: httpx.AsyncClient, conversation_id: str, last_event_id: str | None = None) -> None:
        self.events: list[SseEvent] = []
        self.changed = asyncio.Event()
        self.task = asyncio.ensure_future(sse_until(client, f"/api/conversations/{conversation_id}/events",
                                                    self._seen, last_event_id=last_event_id))

    def _seen(self, event: SseEvent) -> bool:
        self.events.append(event)
        self.changed.set()
        return event.name == "run_end"

    async def until(self, check: Callable[[list[SseEvent]], bool], timeout_s: float = 15.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not check(self.events):
                self.changed.clear()
                await self.changed.wait()

    async def ended(self) -> list[SseEvent]:
        async with asyncio.timeout(15.0):
            await self.task
        return self.events

    @property
    def durable(self) -> list[SseEvent]:
        """The events with an id of their own (not a row's `{seq}.{k}` part): the log's events."""
        return [event for event in self.events if event.id is not None and "." not in event.id
                and event.name != "snapshot"]


def streamed(text: str) -> Callable[[list[SseEvent]], bool]:
    return lambda events: any(event.name == "message_update" and _text(event.data["message"]) == text
                              for event in events)


async def logged(store: Store, conversation_id: str, after_seq: int | None, ctx: Context) -> list[tuple[str, str]]:
    session = await store.open_session(conversation_id, ctx)
    page = await read_lane_events(session, "main", after_seq, 10_000, ctx)
    return [(str(event.event_seq), event.type) for event in page.events]


async def last_result(store: Store, conversation_id: str, ctx: Context) -> LaneLastResult | None:
    session = await store.open_session(conversation_id, ctx)
    return await session.get(addresses.lane_last_result("main"), ctx)


@pytest.mark.postgres
async def test_a_prompt_through_the_api_is_driven_by_a_worker_and_watched_live_with_resume(
        store: Store, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """The worker (60 s poll) starts the run at the release's notification; the API's watch
    (60 s poll) shows the snapshot, the worker's durable events with their ids and the reply
    streaming from its frames, and ends equal to the durable log; a client that reconnects
    with `Last-Event-ID` mid-run gets the log after it and then the live events: no gap, no
    duplicate."""
    app = create_app(ConversationService(store), LocalUser(USER), new_lane=_lane, options=EXTERNAL)
    with worker(postgres_schema_url, tmp_path):
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as client, \
                holding(postgres_schema_url, tmp_path) as release:
            created = await client.post("/api/conversations", json={})
            conversation_id = created.json()["id"]
            first = Watcher(client, conversation_id)
            await first.until(lambda events: bool(events))
            started = time.monotonic()

            sent = await client.post(f"/api/conversations/{conversation_id}/messages", json={"text": "stream: hi"})
            assert sent.status_code == 202, sent.text
            await first.until(streamed("streaming hi, "))
            assert time.monotonic() - started < 5.0  # not the 60 s polls: the notifications woke both
            resume_from = first.durable[0].id
            assert resume_from is not None
            second = Watcher(client, conversation_id, last_event_id=resume_from)
            await second.until(streamed("streaming hi, "))
            await release()
            first_events, second_events = await first.ended(), await second.ended()

    snapshot = first_events[0]
    assert snapshot.name == "snapshot"
    assert snapshot.data["reset"] is False
    log = await logged(store, conversation_id, int(snapshot.id) if snapshot.id is not None else None, ctx)
    assert [(event.id, event.name) for event in first.durable] == log
    assert "snapshot" not in [event.name for event in second_events]
    assert [(event.id, event.name) for event in second.durable] == [
        item for item in log if int(item[0]) > int(resume_from)]
    reply_end = max(index for index, event in enumerate(first_events)
                    if event.name == "message_end" and event.data["message"]["role"] == "assistant")
    updates = [index for index, event in enumerate(first_events) if event.name == "message_update"]
    assert updates
    assert max(updates) < reply_end
    assert _text(first_events[reply_end].data["message"]) == "streaming hi, then done"
    result = await last_result(store, conversation_id, ctx)
    assert result is not None
    assert result.outcome == "completed"


@pytest.mark.postgres
async def test_stop_and_steer_through_the_api_reach_the_worker_and_a_turn_while_it_holds_is_refused(
        store: Store, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """While the worker runs the ledger tool: a second turn is `conversation_held` (409) and
    nothing is written; a steer is posted for the worker (its request id answered) and taken;
    a stop reaches the worker, and the run settles aborted with the cause `user`."""
    app = create_app(ConversationService(store), LocalUser(USER), new_lane=_lane, options=EXTERNAL)
    with worker(postgres_schema_url, tmp_path):
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as client, \
                holding(postgres_schema_url, tmp_path):
            conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
            watcher = Watcher(client, conversation_id)
            await watcher.until(lambda events: bool(events))
            await client.post(f"/api/conversations/{conversation_id}/messages", json={"text": "go"})
            await watcher.until(lambda events: any(event.name == "tool_start" for event in events))
            before = await logged(store, conversation_id, None, ctx)

            refused = await client.post(f"/api/conversations/{conversation_id}/messages", json={"text": "again"})
            steered = await client.post(f"/api/conversations/{conversation_id}/steer", json={"text": "steer: left"})
            await watcher.until(lambda events: any(event.name == "queue_update" for event in events))
            stopped = await client.post(f"/api/conversations/{conversation_id}/stop")
            events = await watcher.ended()

    assert refused.status_code == 409
    assert refused.json()["code"] == "conversation_held"
    assert (await logged(store, conversation_id, None, ctx))[:len(before)] == before
    assert steered.status_code == 202
    assert steered.json()["entry_id"] is None
    assert steered.json()["request_id"]
    assert stopped.status_code == 202
    assert stopped.json()["newly_requested"] is True
    assert events[-1].data["result"]["outcome"] == "aborted"
    result = await last_result(store, conversation_id, ctx)
    assert result is not None
    assert (result.outcome, result.abort_cause) == ("aborted", "user")


async def test_external_workers_need_postgresql(tmp_path: Path, ctx: Context) -> None:
    """On SQLite `create_app` refuses external workers with `work_needs_postgres`."""
    store = await connect(f"sqlite:///{tmp_path / 'journal.db'}", ctx)
    try:
        with pytest.raises(WorkNeedsPostgres):
            create_app(ConversationService(store), LocalUser(USER), new_lane=_lane, options=EXTERNAL)
    finally:
        await store.close()


def test_harness_serve_with_external_workers_on_sqlite_is_a_usage_error(tmp_path: Path) -> None:
    """`harness serve --workers external` on SQLite exits 2 with `work_needs_postgres`, serving nothing."""
    done = harness(tmp_path, "serve", "--no-auth", "--workers", "external", "--store",
                   f"sqlite:///{tmp_path / 'harness.db'}")

    assert done.returncode == 2
    assert "error [work_needs_postgres]" in done.stderr


@pytest.mark.postgres
async def test_the_doors_that_would_drive_answer_external_mode_unsupported(store: Store, ctx: Context) -> None:
    """The AI SDK and LangGraph doors and `/compact` would drive in the API process: 501 with a
    stable code, and no conversation is left attached."""
    service = ConversationService(store)
    app = create_app(service, LocalUser(USER), new_lane=_lane, options=EXTERNAL)
    async with asgi_client(app) as client:
        conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
        answers = [
            await client.post("/api/chat", json={"id": conversation_id, "messages": []}),
            await client.post(f"/threads/{conversation_id}/runs", json={"input": {}}),
            await client.post(f"/api/conversations/{conversation_id}/compact", json={}),
            await client.post(f"/api/conversations/{conversation_id}/command", json={"line": "/compact"}),
        ]
        renamed = await client.patch(f"/api/conversations/{conversation_id}", json={"name": "notes"})
        read = await client.get(f"/api/conversations/{conversation_id}")

    assert [(answer.status_code, answer.json()["code"]) for answer in answers] == [
        (501, "external_mode_unsupported")] * 4
    assert renamed.status_code == 200
    assert (read.status_code, read.json()["name"]) == (200, "notes")
    # Nothing attached: another process could take the conversation at once.
    session = await store.open_session(conversation_id, ctx)
    ownership = await session.attach("test", ctx)
    await ownership.detach(ctx)


def _text(message: dict[str, object]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    assert isinstance(content, list)
    return "".join(str(block.get("text", "")) for block in content if isinstance(block, dict)
                   and block.get("type") == "text")
