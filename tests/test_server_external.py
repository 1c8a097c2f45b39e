"""`harness serve --workers external` (issue 17 item 2): the API process accepts, posts and
follows; real `harness worker` processes (`worker_child.py`) drive.

The app runs in this process under uvicorn with external workers, the worker in its own process
with a 60 s poll, so only notifications wake either of them. Runs only with
HARNESS_TEST_POSTGRES_URL set, except the checks of what external mode refuses.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import APIStatusError
from langgraph_sdk.schema import StreamPart

from harness.context import Context
from harness.conversation import ConversationService
from harness.messages import ModelIdentity, now_ms
from harness.runtime import read_lane_events
from harness.server import LocalUser, ServerOptions, ServerState, create_app, parse_event_id
from harness.session import LaneConfig, LaneLastResult, ReleaseRequest, Store, WorkNeedsPostgres, addresses, connect
from server_helpers import SseEvent, asgi_client, reply_texts, serving, sse_until
from test_cli_sessions import harness
from test_server_ai_sdk import chat_body, node, parts_of, run_client
from test_server_langgraph import MODES, ask, durable, read_until, says, text_of
from worker_child import CONFIG, POLL_VARIABLE, holding

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


@pytest.fixture
def store(ledger_store: Store) -> Store:
    """This module's store: PostgreSQL with the worker tool's ledger (conftest's `ledger_store`)."""
    return ledger_store


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
    return lambda events: text in reply_texts(events)


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
    updates = [index for index, event in enumerate(first_events) if event.name in ("message_update", "message_delta")]
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
    assert (result.outcome, result.abort_cause) == ("aborted", "user_during_tool")  # stopped mid-tool (CE-7)


@pytest.mark.postgres
async def test_a_turn_is_admitted_while_a_release_request_waits_for_the_next_holder(store: Store, ctx: Context) -> None:
    """A turn posted right after a run ended can find the release request it posted while the
    worker held the conversation still waiting: the worker let go without taking it, so the next
    holder does, here the server attaching for this very turn. Having taken it, the server still
    admits the turn, the run left open for the workers, instead of closing the conversation under
    it (`harness_closed`, a 503)."""
    service = ConversationService(store)
    state = ServerState(service, LocalUser(USER), _lane, EXTERNAL)
    conversation_id = (await service.create(USER, CONFIG, ctx)).id
    await service.close(USER, conversation_id, ctx)
    session = await store.open_session(conversation_id, ctx)
    await session.post_request(ReleaseRequest(lane="main", requested_at=now_ms()), ctx)

    async with state.conversation(USER, conversation_id, ctx) as conversation:
        await conversation.take_requests(ctx)  # taken by now, here or by the conversation's own taker
        accepted = await conversation.admit("hi", ctx)

    assert await session.scan_records(addresses.lane_request(""), ctx) == []
    lane = await session.get(addresses.lane_state("main"), ctx)
    assert lane is not None
    assert lane.current_operation_id == accepted.operation_id


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
async def test_compact_answers_external_mode_unsupported(store: Store, ctx: Context) -> None:
    """`/compact` (its route and the typed command) would drive a summary in the API process: 501
    with a stable code, and no conversation is left attached."""
    service = ConversationService(store)
    app = create_app(service, LocalUser(USER), new_lane=_lane, options=EXTERNAL)
    async with asgi_client(app) as client:
        conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
        answers = [
            await client.post(f"/api/conversations/{conversation_id}/compact", json={}),
            await client.post(f"/api/conversations/{conversation_id}/command", json={"line": "/compact"}),
        ]
        renamed = await client.patch(f"/api/conversations/{conversation_id}", json={"name": "notes"})
        read = await client.get(f"/api/conversations/{conversation_id}")

    assert [(answer.status_code, answer.json()["code"]) for answer in answers] == [
        (501, "external_mode_unsupported")] * 2
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


# -- the LangGraph door and the AI SDK door, driven by the worker ---------------------------------


@pytest.mark.postgres
async def test_the_langgraph_client_streams_a_run_a_worker_drives_and_rejoins_it_after_a_cut(
        store: Store, postgres_schema_url: str, tmp_path: Path) -> None:
    """The real `langgraph_sdk` against an external-workers API: a thread is made, a run streamed
    (values and messages-tuple) while the worker drives it, its reply streaming from the frames;
    the client cuts the stream mid-reply and rejoins with its last event id: in all it gets the
    run's stream once, equal to a full replay, ending `success`, and the thread's state holds
    the worker's reply."""
    app = create_app(ConversationService(store), LocalUser(USER), new_lane=_lane, options=EXTERNAL)
    with worker(postgres_schema_url, tmp_path):
        async with serving(app) as base, holding(postgres_schema_url, tmp_path) as release:
            client = get_client(url=base, api_key=None)
            thread_id = (await client.threads.create(metadata={"purpose": "external"}))["thread_id"]
            got: list[StreamPart] = []
            await read_until(client.runs.stream(thread_id, "harness", input=ask("stream: hi"), stream_mode=MODES),
                             got, says("streaming hi, "))
            run_id = got[0].data["run_id"]
            await release()
            got += [part async for part in client.runs.join_stream(thread_id, run_id, last_event_id=got[-1].id)]
            replay = [part async for part in client.runs.join_stream(thread_id, run_id)]
            thread_state = await client.threads.get_state(thread_id)
            run = await client.runs.get(thread_id, run_id)
            await client.aclose()

    ids = [parse_event_id(str(part.id)) for part in got]
    assert all(earlier < later for earlier, later in itertools.pairwise(ids))
    assert text_of(got) == text_of(replay) == "streaming hi, then done"
    assert durable(got) == durable(replay)
    assert got[-1].data == {"run_id": run_id, "status": "success"}
    assert run["status"] == "success"
    assert [part.data for part in got if part.event == "values"][-1] == thread_state["values"]
    messages: Any = thread_state["values"]
    assert [(message["type"], message["content"]) for message in messages["messages"]] == [
        ("human", "stream: hi"), ("ai", "streaming hi, then done")]


@pytest.mark.postgres
async def test_the_langgraph_strategies_and_cancel_reach_the_worker_as_posted_requests(
        store: Store, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    """While the worker runs the ledger tool: `reject` is 409 `lane_busy`, `enqueue` answers the
    open run and posts its input as a follow-up (the worker queues it), `runs.cancel` posts a
    stop and the run settles `interrupted`; `interrupt` stops the next run the same way and
    starts its own once the worker let go, which the worker then drives to `success`."""
    app = create_app(ConversationService(store), LocalUser(USER), new_lane=_lane, options=EXTERNAL)
    with worker(postgres_schema_url, tmp_path):
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as rest, \
                holding(postgres_schema_url, tmp_path):
            client = get_client(url=base, api_key=None)
            thread_id = (await client.threads.create())["thread_id"]
            watcher = Watcher(rest, thread_id)
            await watcher.until(lambda events: bool(events))
            cancelled = await client.runs.create(thread_id, "harness", input=ask("go"))
            await watcher.until(lambda events: any(event.name == "tool_start" for event in events))
            with pytest.raises(APIStatusError) as rejected:
                await client.runs.create(thread_id, "harness", input=ask("again"), multitask_strategy="reject")
            enqueued = await client.runs.create(thread_id, "harness", input=ask("and then"),
                                                multitask_strategy="enqueue")
            await watcher.until(lambda events: any(event.name == "queue_update" for event in events))
            await client.runs.cancel(thread_id, cancelled["run_id"], wait=True)
            after_cancel = await client.runs.get(thread_id, cancelled["run_id"])
            cancelled_parts = [part async for part in client.runs.join_stream(thread_id, cancelled["run_id"])]

            second = Watcher(rest, thread_id)
            await second.until(lambda events: bool(events))
            interrupted = await client.runs.create(thread_id, "harness", input=ask("go"))
            await second.until(lambda events: any(event.name == "tool_start" for event in events))
            replacing = await client.runs.create(thread_id, "harness", input=ask("steer: instead"),
                                                 multitask_strategy="interrupt")
            await client.runs.join(thread_id, replacing["run_id"])
            statuses = [(await client.runs.get(thread_id, run["run_id"]))["status"]
                        for run in (interrupted, replacing)]
            thread_state = await client.threads.get_state(thread_id)
            await client.aclose()

    assert (rejected.value.status_code, rejected.value.code) == (409, "lane_busy")
    assert enqueued["run_id"] == cancelled["run_id"]
    assert after_cancel["status"] == "interrupted"
    assert cancelled_parts[-1].data == {"run_id": cancelled["run_id"], "status": "interrupted"}
    assert statuses == ["interrupted", "success"]
    messages: Any = thread_state["values"]
    assert messages["messages"][-1]["content"] == "heard steer: instead"
    result = await last_result(store, thread_id, ctx)
    assert result is not None
    assert (result.operation_id, result.outcome) == (replacing["run_id"], "completed")


async def ui_parts(client: httpx.AsyncClient, method: str, path: str, until: Callable[[list[Any]], bool], *,
                   json: Any = None, opened: asyncio.Event | None = None) -> list[Any]:
    """The UI message stream parts at `path` (`[DONE]` as the string) until `until` accepts
    them or the stream ends; then the connection is dropped. The first part sets `opened`."""
    parts: list[Any] = []
    async with client.stream(method, path, json=json) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                parts += parts_of(line)
                if opened is not None:
                    opened.set()
                if until(parts):
                    break
    return parts


def ui_text(parts: list[Any]) -> str:
    return "".join(part["delta"] for part in parts if isinstance(part, dict) and part["type"] == "text-delta")


@pytest.mark.postgres
async def test_the_ai_sdk_door_streams_resumes_and_stops_a_turn_a_worker_drives(
        store: Store, postgres_schema_url: str, tmp_path: Path) -> None:
    """`POST /api/chat` on an external-workers API admits the turn for the worker and streams it
    as UI message parts from the follow; the client drops it mid-reply and `GET
    /api/chat/{id}/stream` replays the same message (same id) from its start and goes on live to
    `finish`; a second turn's stream, stopped with `POST /api/chat/{id}/stop`, ends with
    `abort`, the stop posted for the worker."""
    app = create_app(ConversationService(store), LocalUser(USER), new_lane=_lane, options=EXTERNAL)
    with worker(postgres_schema_url, tmp_path):
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as client, \
                holding(postgres_schema_url, tmp_path) as release:
            conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
            cut = await ui_parts(client, "POST", "/api/chat", lambda parts: ui_text(parts) == "streaming hi, ",
                                 json=chat_body(conversation_id, "stream: hi"))
            replaying = asyncio.Event()
            resumed = asyncio.ensure_future(ui_parts(client, "GET", f"/api/chat/{conversation_id}/stream",
                                                     lambda parts: parts[-1] == "[DONE]", opened=replaying))
            await asyncio.wait_for(replaying.wait(), 15)
            await release()
            replayed = await asyncio.wait_for(resumed, 15)

            async with holding(postgres_schema_url, tmp_path):  # the second turn's tool waits again
                stopping = asyncio.ensure_future(ui_parts(client, "POST", "/api/chat",
                                                          lambda parts: parts[-1] == "[DONE]",
                                                          json=chat_body(conversation_id, "go")))
                watcher = Watcher(client, conversation_id)
                await watcher.until(lambda events: any(event.name == "tool_start" for event in events))
                stopped = await client.post(f"/api/chat/{conversation_id}/stop")
                aborted = await asyncio.wait_for(stopping, 15)

    assert cut[0]["type"] == "start"
    assert replayed[0] == cut[0]
    assert ui_text(replayed) == "streaming hi, then done"
    assert replayed[-2:] == [{"type": "finish", "finishReason": "stop"}, "[DONE]"]
    assert stopped.status_code == 202
    assert stopped.json()["requested"] is True
    assert aborted[0]["type"] == "start"
    assert aborted[0]["messageId"] == stopped.json()["operation_id"]
    assert [part["type"] for part in aborted if isinstance(part, dict)].count("tool-input-available") == 1
    assert aborted[-2:] == [{"type": "abort", "reason": "user_during_tool"}, "[DONE]"]


async def test_the_ai_sdk_client_sends_a_message_a_worker_drives_and_holds_one_reply(
        store: Store, postgres_schema_url: str, tmp_path: Path) -> None:
    """The real `ai` client (tests/js/send_chat.mjs, `DefaultChatTransport`) against an
    external-workers API: the turn it sends is driven by the worker, and the client builds one
    assistant message with the text before the call, the call with its result, and the reply."""
    node()
    app = create_app(ConversationService(store), LocalUser(USER), new_lane=_lane, options=EXTERNAL)
    with worker(postgres_schema_url, tmp_path):
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as client:
            conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
            chat = await run_client("send_chat.mjs", base, conversation_id)

    assert (chat["status"], chat["errors"]) == ("ready", [])
    assert chat["sent"][0] == "start"
    assert chat["sent"][-1] == "finish"
    user, assistant = chat["messages"]
    assert user["parts"] == [{"type": "text", "text": "look it up"}]
    texts = [part["text"] for part in assistant["parts"] if part["type"] == "text"]
    tools = [part for part in assistant["parts"] if part["type"].startswith("tool-")]
    assert texts == ["writing", "done"]
    assert [(tool["type"], tool["state"], tool["input"]) for tool in tools] == [
        ("tool-ledger", "output-available", {"key": "look it up"})]
