"""The LangGraph-compatible door: threads, runs and assistants as the LangGraph Agent Server serves
them, so `langgraph_sdk.get_client(url=...)` works against `harness serve` (issue 16 item 6).

A thread is a conversation (thread id = conversation id), a run one harness operation on its main
lane (run id = operation id), and the one assistant the server's agent. What a run streams is
rendered by `langgraph_wire` from the journal and the lane's events (`ServerState.watch`: the live
watch, or with external workers a follow of the lane a worker drives), so a stream resumed with
`Last-Event-ID` (after a dropped connection or a server restart) continues exactly where it was.
The door keeps a small record per run beside the conversation (`langgraph.run`): the assistant,
stream modes and strategy it was asked with, the branch tip it started from and where the lane's
event log stood before it. What the run did and how it ended are read from that log (its
`run_start`, `entry_added`, `message_end` and `run_end`: `langgraph_wire.RunItems`), so a run's
status and stream are right whichever door started the runs after it, and a stream rejoined after a
restart that cut a reply off drops the cut-off attempt and gets the reply asked again whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response, status
from fastapi.sse import EventSourceResponse
from pydantic import BaseModel, ConfigDict, JsonValue

from harness.context import Context
from harness.conversation import MAIN_LANE, Conversation
from harness.errors import HarnessError, InvalidInput
from harness.messages import AssistantMessage
from harness.runtime import (
    AcceptedRun,
    EntryAdded,
    FollowBehind,
    HarnessEvent,
    LaneBusy,
    LaneEventPage,
    MessageStart,
    MessageUpdate,
    NoActiveOperation,
    RunEnd,
    RunStart,
    WatchOverflow,
    read_lane_events,
)
from harness.server.guards import Metadata
from harness.server.langgraph_wire import (
    RUN_STATUS,
    START,
    Cursor,
    MultitaskStrategy,
    Part,
    RollbackUnsupported,
    RunItem,
    RunItems,
    RunSettled,
    RunStream,
    StreamMode,
    langchain_message,
    multitask_strategy,
    parse_event_id,
    stream_modes,
)
from harness.server.sse import json_event
from harness.server.state import (
    Authorization,
    CurrentAuthorization,
    CurrentUser,
    RequestContext,
    ServerState,
    State,
)
from harness.server.streams import REPLAY_PAGE
from harness.session import CompactionPayload, Entry, LaneLastResult, SessionReader, addresses
from harness.session.records import AssistantEffectPending, DeferredEffectPending

router = APIRouter(tags=["langgraph"])

ASSISTANT_NAME = "harness"
"""The graph id of the server's one agent; its assistant id is a UUID derived from it."""

ASSISTANT_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "harness:assistant:" + ASSISTANT_NAME))


class AssistantNotFound(HarnessError):
    """No assistant has this id (nor this graph name); nothing was started. Details: `assistant_id`."""

    code = "assistant_not_found"


class RunNotFound(HarnessError):
    """The thread has no run of this id made or seen by this door, or the run's events have left
    the lane's bounded event log (`event_log_limit` events are kept: an older run is forgotten, as
    a LangGraph server forgets runs past their time to live). Details: `run_id`."""

    code = "run_not_found"


class InputUnsupported(HarnessError):
    """A run's input is not one or more human text messages (or it carries a `command`, which
    answers a graph interrupt this door never raises); nothing was started."""

    code = "input_unsupported"


class ThreadIdUnsupported(HarnessError):
    """`POST /threads` named a thread id that does not exist: conversation ids are minted by the
    store; nothing was created."""

    code = "thread_id_unsupported"


class ThreadExists(HarnessError):
    """`POST /threads` named a thread that exists, without `if_exists: do_nothing`; nothing changed."""

    code = "thread_exists"


class RunRecord(BaseModel):
    """What this door keeps about one run, beside the conversation: what it was asked with, the
    branch tip before it (`source_tip_id`) and the seq of the lane's newest logged event before it
    was accepted (`log_after`; None: the run is found reading the log from its oldest kept event)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    assistant_id: str
    stream_mode: list[StreamMode]
    multitask_strategy: MultitaskStrategy
    metadata: dict[str, JsonValue]
    created_at: int
    source_tip_id: str | None
    log_after: int | None


def _run_address(run_id: str) -> addresses.ValueAddress[RunRecord]:
    return addresses.value_address("langgraph.run", run_id, RunRecord)


THREAD_RUNS = addresses.value_address("langgraph.thread", "runs", list[str])
"""The ids of the thread's runs made through this door, oldest first."""

THREAD_METADATA = addresses.value_address("langgraph.thread", "metadata", dict[str, JsonValue])


# -- request bodies ---------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ThreadCreate(_Body):
    thread_id: str | None = None
    metadata: Metadata | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None


class ThreadSearch(_Body):
    ids: list[str] | None = None
    metadata: Metadata | None = None
    status: str | None = None
    limit: int = 10
    offset: int = 0


class AssistantSearch(_Body):
    graph_id: str | None = None
    limit: int = 10
    offset: int = 0


class RunCreate(_Body):
    assistant_id: str
    input: dict[str, Any] | None = None
    command: dict[str, Any] | None = None
    stream_mode: str | list[str] | None = None
    stream_resumable: bool = False
    metadata: Metadata | None = None
    multitask_strategy: str | None = None
    if_not_exists: Literal["create", "reject"] | None = None


# -- wire objects ---------------------------------------------------------------------------------


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


def _assistant() -> dict[str, JsonValue]:
    return {"assistant_id": ASSISTANT_ID, "graph_id": ASSISTANT_NAME, "name": ASSISTANT_NAME,
            "description": "The agent of this harness server.", "config": {}, "context": {}, "metadata": {},
            "version": 1, "created_at": _iso(0), "updated_at": _iso(0)}


def _assistant_id(requested: str) -> str:
    if requested not in (ASSISTANT_ID, ASSISTANT_NAME):
        raise AssistantNotFound(f"no assistant {requested[:80]!r}; this server has {ASSISTANT_NAME!r} "
                                f"({ASSISTANT_ID})", assistant_id=requested[:80])
    return ASSISTANT_ID


def _run_json(thread_id: str, record: RunRecord, result: LaneLastResult | None) -> dict[str, JsonValue]:
    """The run as LangGraph shows it; `result` is its end (None: it is running)."""
    updated = result.ended_at if result is not None else record.created_at
    run_status = RUN_STATUS[result.outcome] if result is not None else "running"
    return {"run_id": record.run_id, "thread_id": thread_id, "assistant_id": record.assistant_id,
            "created_at": _iso(record.created_at), "updated_at": _iso(updated), "status": run_status,
            "metadata": record.metadata, "multitask_strategy": record.multitask_strategy,
            "kwargs": {"stream_mode": list(record.stream_mode)}}


async def _thread_json(state: ServerState, user: str, thread_id: str, context: Context) -> dict[str, JsonValue]:
    watch = await state.watch(user, thread_id, context)
    watch.close()
    snapshot = watch.snapshot
    last = snapshot.last_result
    thread_status = ("busy" if snapshot.operation is not None
                     else "error" if last is not None and last.outcome == "failed"
                     else "interrupted" if last is not None and last.outcome == "aborted" else "idle")
    metadata = await watch.reader.get(THREAD_METADATA, context) or {}
    info = watch.reader.info
    return {"thread_id": thread_id, "created_at": _iso(info.created_at), "updated_at": _iso(info.updated_at),
            "metadata": metadata, "status": thread_status, "values": {"messages": _messages(snapshot.transcript)},
            "interrupts": {}}


def _messages(entries: Sequence[Entry]) -> list[JsonValue]:
    return [message for entry in entries if (message := langchain_message(entry)) is not None]


def _input_text(body: RunCreate) -> str:
    """The text of the human messages a run's input carries, joined by blank lines."""
    if body.command is not None:
        raise InputUnsupported("a run command answers a graph interrupt, which this server never raises")
    raw = (body.input or {}).get("messages")
    messages = raw if isinstance(raw, list) else [raw] if raw is not None else []
    texts = []
    for message in messages:
        if isinstance(message, str):
            texts.append(message)
            continue
        kind = message.get("type", message.get("role")) if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if kind not in ("human", "user"):
            raise InputUnsupported(f"a run takes human messages only, not {str(kind)[:40]!r}")
        if isinstance(content, list):
            content = "".join(str(block.get("text", "")) for block in content
                              if isinstance(block, dict) and block.get("type") == "text")
        if not isinstance(content, str):
            raise InputUnsupported("a human message's content is text or a list of text blocks")
        texts.append(content)
    if not any(text.strip() for text in texts):
        raise InputUnsupported("a run's input needs {'messages': [{'role': 'user', 'content': '...'}]}")
    return "\n\n".join(texts)


# -- runs -----------------------------------------------------------------------------------------


_thread_locks: weakref.WeakValueDictionary[tuple[int, str], asyncio.Lock] = weakref.WeakValueDictionary()
"""A lock per (server, thread), so two requests of one thread record their runs one after the
other; a lock lives only while a request holds it, so the map never outgrows the requests."""


def _thread_lock(state: ServerState, thread_id: str) -> asyncio.Lock:
    return _thread_locks.setdefault((id(state), thread_id), asyncio.Lock())


async def _known(session: SessionReader, run_id: str, context: Context) -> RunRecord:
    """The door's record of `run_id`; for a run another door started that is still open, one made
    now from its durable meta. Raises `RunNotFound`."""
    record = await session.get(_run_address(run_id), context)
    if record is not None:
        return record
    meta = await session.get(addresses.operation_meta(run_id), context)
    if meta is None or meta.lane != MAIN_LANE:
        raise RunNotFound(f"thread {session.id} has no run {run_id[:80]!r}", run_id=run_id[:80])
    return RunRecord(run_id=run_id, assistant_id=ASSISTANT_ID, stream_mode=["values"], multitask_strategy="reject",
                     metadata={}, created_at=meta.started_at, source_tip_id=meta.source_tip_id, log_after=None)


ReadEvents = Callable[[int | None, int, Context], Awaitable[LaneEventPage]]
"""Reads a page of the main lane's logged events: those after a seq (None: from the oldest kept),
at most a limit (`LaneEvents.read_events`)."""


def _log_of(session: SessionReader) -> ReadEvents:
    """The main lane's log, read from the store."""
    return functools.partial(read_lane_events, session, MAIN_LANE)


async def _log_events(read: ReadEvents, after: int | None, upto: int | None,
                      context: Context) -> AsyncGenerator[HarnessEvent, None]:
    """The main lane's logged events after seq `after` (None: from the oldest kept), page by page
    from `read`, until one at or past event `upto` (None: the newest; no page is read past it)."""
    while upto is None or after is None or after < upto:
        page = await read(after, REPLAY_PAGE, context)
        for event in page.events:
            yield event
        if not page.events:
            return
        after = page.events[-1].event_seq


async def _logged_items(read: ReadEvents, record: RunRecord, upto: int | None, context: Context,
                        picker: RunItems | None = None) -> AsyncGenerator[RunItem, None]:
    """The run's durable items from the lane's event log (`RunItems`), read through `read` as they
    are taken, as far as event `upto` (None: the newest); `picker` goes on with the events after
    `upto`. None at all when the log no longer holds the run's start."""
    picker = picker or RunItems(record.run_id, MAIN_LANE)
    async with aclosing(_log_events(read, record.log_after, upto, context)) as events:
        async for event in events:
            seq = event.event_seq
            assert seq is not None, "a logged event carries its seq"
            if upto is not None and seq > upto:
                return
            for item in picker.take(event):
                yield item
                if isinstance(item, RunSettled):
                    return


def _run_gone(session: SessionReader, record: RunRecord) -> RunNotFound:
    return RunNotFound(f"run {record.run_id} of thread {session.id} has left the lane's event log",
                       run_id=record.run_id)


async def _run_items(session: SessionReader, record: RunRecord, upto: int | None, context: Context,
                     picker: RunItems | None = None, *, read: ReadEvents | None = None) -> list[RunItem]:
    """The run's durable items (`_logged_items`) as far as event `upto` (None: the newest), read
    through `read` (None: from the store). Raises `RunNotFound` when the log no longer holds the
    run's start."""
    async with aclosing(_logged_items(read or _log_of(session), record, upto, context, picker)) as logged:
        items = [item async for item in logged]
    if not items:
        raise _run_gone(session, record)
    return items


async def _check_held(session: SessionReader, record: RunRecord, read: ReadEvents, context: Context) -> None:
    """Raises `RunNotFound` when the lane's log no longer holds the run's start; reads the log
    through `read` only as far as that start."""
    async with aclosing(_logged_items(read, record, None, context)) as logged:
        if await anext(logged, None) is None:
            raise _run_gone(session, record)


async def _run_result(session: SessionReader, record: RunRecord, context: Context) -> LaneLastResult | None:
    """How the run ended, read from the lane's event log; None while it runs."""
    last = (await _run_items(session, record, None, context))[-1]
    return last.result if isinstance(last, RunSettled) else None


async def _current_run(session: SessionReader, context: Context) -> str | None:
    """The main lane's open operation, read from the journal (whoever drives it)."""
    state = await session.get(addresses.lane_state(MAIN_LANE), context)
    return state.current_operation_id if state is not None else None


async def _create_run(state: ServerState, user: str, thread_id: str, body: RunCreate,
                      context: Context) -> tuple[RunRecord, bool]:
    """Take a run request on `user`'s thread: a new run, driven by the server or its workers, or,
    for `enqueue` while a run is open, its input as that run's follow-up (the open run's record is
    returned). The second value says whether a new run was made. Everything is checked before any
    write."""
    assistant_id = _assistant_id(body.assistant_id)
    modes = stream_modes(body.stream_mode)
    strategy = multitask_strategy(body.multitask_strategy)
    text = _input_text(body)
    async with _thread_lock(state, thread_id):
        session = await state.reader(user, thread_id, context)
        current = await _current_run(session, context)
        if current is not None:
            if strategy == "reject":
                raise LaneBusy(f"thread {thread_id} is running {current}; wait for it, or ask for multitask "
                               f"strategy 'enqueue' or 'interrupt'", lane=MAIN_LANE, operation_id=current)
            if strategy == "enqueue":
                record = await _known(session, current, context)
                await state.queue(user, thread_id, "follow_up", text, context)
                return record, False
            with contextlib.suppress(NoActiveOperation):  # it settled meanwhile
                await state.stop(user, thread_id, context, operation_id=current)
            await state.until_settled(user, thread_id, current, context)
        # Read before the run is accepted: its `run_start` is logged after this seq.
        log_after = (await read_lane_events(session, MAIN_LANE, None, 1, context)).newest_seq
        made: list[RunRecord] = []

        async def keep(conversation: Conversation, accepted: AcceptedRun) -> None:
            # Written before the run is driven (or let go for the workers): a stream always finds
            # where the run began.
            journal = conversation.journal
            meta = await journal.get(addresses.operation_meta(accepted.operation_id), context)
            record = RunRecord(run_id=accepted.operation_id, assistant_id=assistant_id, stream_mode=list(modes),
                               multitask_strategy=strategy, metadata=body.metadata or {},
                               created_at=accepted.started_at,
                               source_tip_id=meta.source_tip_id if meta is not None else None, log_after=log_after)
            await conversation.set_value(_run_address(record.run_id), record, context)
            runs = await journal.get(THREAD_RUNS, context) or []
            await conversation.set_value(THREAD_RUNS, [*runs, record.run_id], context)
            made.append(record)

        await state.start_turn(user, thread_id, text, context, before_drive=keep)
    return made[0], True


# -- streaming ------------------------------------------------------------------------------------


async def _branch_back(session: SessionReader, tip: str | None, stop: str | None, context: Context, *,
                       to_compaction: bool) -> list[Entry]:
    """The branch entries from `tip` back to (not including) `stop`, or, `to_compaction`, to the newest
    compaction entry (included), oldest first."""
    entries: list[Entry] = []
    before: str | None = tip
    while before is not None and before != stop:
        page = await session.read_branch(before, context, before=before)
        for entry in page.entries:
            if entry.id == stop:
                return entries[::-1]
            entries.append(entry)
            if to_compaction and isinstance(entry.payload, CompactionPayload):
                return entries[::-1]
        before = page.next_before
    return entries[::-1]


async def _sse(parts: AsyncGenerator[Part, None], heartbeat_s: float) -> AsyncIterator[bytes]:
    """`parts` in the SSE wire format, with a heartbeat comment after `heartbeat_s` of silence."""
    iterator = parts.__aiter__()
    pending: asyncio.Task[Part] | None = None
    try:
        while True:
            pending = pending or asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=heartbeat_s)
            if not done:
                yield b": heartbeat\n\n"
                continue
            try:
                part = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield json_event(part.data, event=part.event, event_id=part.id)
    finally:
        # The generator cannot be closed while a step of it runs: end that step first.
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
        await parts.aclose()


async def _run_parts(state: ServerState, user: str, thread_id: str, record: RunRecord,
                     modes: tuple[StreamMode, ...], cursor: Cursor, context: Context) -> AsyncGenerator[Part, None]:
    """The parts of run `record` after `cursor`: those of its items the lane's log holds, then,
    while it runs, the live ones, until it settles (or the server stops or the client falls too
    far behind, when the stream just ends and the client reconnects with its last id). Raises
    `RunNotFound` when the log no longer holds the run."""
    watch = await state.watch(user, thread_id, context)  # the harness's events: rows are not this door's
    session = watch.reader
    picker = RunItems(record.run_id, MAIN_LANE)
    try:
        # The log up to the snapshot, then the watch: every event once, in order. Read through the
        # watch: from its fan-out's recent events when they hold the run from its start (a resume
        # of a run the server's watchers saw begin), else from the store.
        items = await _run_items(session, record, watch.snapshot.event_seq or 0, context, picker,
                                 read=watch.read_events)
        before = await _branch_back(session, record.source_tip_id, None, context, to_compaction=True)
        stream = RunStream(run_id=record.run_id, thread_id=thread_id, modes=modes, before=before, cursor=cursor)
        for item in items:
            for part in stream.item(item):
                yield part
        if stream.ended:
            return
        reply_id: str | None = None
        operation = watch.snapshot.operation
        if operation is not None and operation.streaming_message is not None:
            reply_id = await _reply_id(session, record.run_id, context)
            for part in stream.live(reply_id, operation.streaming_message) if reply_id is not None else []:
                yield part
        try:
            async for event in watch:
                parts: list[Part] = []
                if isinstance(event, MessageStart | MessageUpdate) and event.event_seq is None \
                        and event.lane == MAIN_LANE and isinstance(event.message, AssistantMessage):
                    # A new attempt of the reply is written under a new reserved id.
                    if reply_id is None or isinstance(event, MessageStart):
                        reply_id = await _reply_id(session, record.run_id, context)
                    parts = stream.live(reply_id, event.message) if reply_id is not None else []
                else:
                    for item in picker.take(event):
                        parts, reply_id = parts + stream.item(item), None
                for part in parts:
                    yield part
                if stream.ended:
                    return
        except (WatchOverflow, FollowBehind):
            return  # the client reconnects with its last event id
    finally:
        watch.close()


async def _reply_id(session: SessionReader, run_id: str, context: Context) -> str | None:
    """The entry id reserved for the reply run `run_id` is streaming (HA-24); None when no reply is
    pending any more (it committed, and its entry follows in the watch with all of its text)."""
    state = await session.get(addresses.operation_state(run_id), context)
    return state.response_entry_id if isinstance(state, AssistantEffectPending | DeferredEffectPending) else None


async def _event_stream(authorization: Authorization, session: SessionReader, record: RunRecord,
                        modes: tuple[StreamMode, ...], cursor: Cursor, context: Context, *,
                        headers: dict[str, str] | None = None) -> EventSourceResponse:
    """The run's stream after `cursor`, until it ends or the request's token is revoked; raises
    `RunNotFound` (404, before any of it is sent) when the lane's log no longer holds the run."""
    state = authorization.state
    await _check_held(session, record, functools.partial(state.fanouts.read_events, session, MAIN_LANE), context)
    parts = authorization.until_revoked(_run_parts(state, authorization.user, session.id, record, modes, cursor,
                                                   context))
    return EventSourceResponse(_sse(parts, state.options.heartbeat_s), headers={"Cache-Control": "no-store",
                                                                                  **(headers or {})})


def _locations(thread_id: str, run_id: str) -> dict[str, str]:
    # The client follows `Location` to rejoin a cut stream; `Content-Location` names the run made.
    run = f"/threads/{thread_id}/runs/{run_id}"
    return {"Location": f"{run}/stream", "Content-Location": run}


def _cursor(last_event_id: str | None) -> Cursor:
    return parse_event_id(last_event_id) if last_event_id else START


# -- routes ---------------------------------------------------------------------------------------


@router.get("/assistants/{assistant_id}")
async def get_assistant(assistant_id: str, user: CurrentUser) -> dict[str, JsonValue]:
    """The server's one assistant, by its id or graph name; 404 `assistant_not_found` otherwise."""
    _assistant_id(assistant_id)
    return _assistant()


@router.post("/assistants/search")
async def search_assistants(body: AssistantSearch, user: CurrentUser) -> list[dict[str, JsonValue]]:
    found = [_assistant()] if body.graph_id in (None, ASSISTANT_NAME) else []
    return found[body.offset:body.offset + body.limit]


@router.post("/threads")
async def create_thread(body: ThreadCreate, user: CurrentUser, state: State,
                        context: RequestContext) -> dict[str, JsonValue]:
    """A new thread: a new conversation of `user` on the server's default lane. A `thread_id` that
    exists is answered by `if_exists` (`do_nothing`: that thread; else 409 `thread_exists`); one
    that does not is refused (`thread_id_unsupported`): the store mints conversation ids."""
    if body.thread_id is not None:
        try:
            existing = await _thread_json(state, user, body.thread_id, context)
        except HarnessError as error:
            if error.code not in ("session_not_found", "forbidden"):
                raise
            raise ThreadIdUnsupported("thread ids are minted by the server; create the thread without one",
                                      thread_id=body.thread_id[:80]) from None
        if body.if_exists == "do_nothing":
            return existing
        raise ThreadExists(f"thread {body.thread_id} exists", thread_id=body.thread_id[:80])
    async with state.new_conversation(user, None, context) as conversation:
        if body.metadata:
            await conversation.set_value(THREAD_METADATA, body.metadata, context)
    return await _thread_json(state, user, conversation.id, context)


@router.get("/threads/{conversation_id}")
async def get_thread(conversation_id: str, user: CurrentUser, state: State,
                     context: RequestContext) -> dict[str, JsonValue]:
    return await _thread_json(state, user, conversation_id, context)


@router.get("/threads/{conversation_id}/state")
async def get_thread_state(conversation_id: str, user: CurrentUser, state: State,
                           context: RequestContext) -> dict[str, JsonValue]:
    """The thread's messages (`values`) as a LangGraph thread state; there is no checkpoint history."""
    thread = await _thread_json(state, user, conversation_id, context)
    return {"values": thread["values"], "next": [], "tasks": [], "interrupts": [], "metadata": thread["metadata"],
            "created_at": thread["updated_at"], "checkpoint": {"thread_id": conversation_id, "checkpoint_ns": "",
                                                               "checkpoint_id": None},
            "parent_checkpoint": None}


@router.post("/threads/search")
async def search_threads(body: ThreadSearch, user: CurrentUser, state: State,
                         context: RequestContext) -> list[dict[str, JsonValue]]:
    """`user`'s threads, most recently updated first, filtered by `ids`, `status` and `metadata`."""
    found = []
    for info in await state.service.list(user, context):
        if body.ids is not None and info.id not in body.ids:
            continue
        thread = await _thread_json(state, user, info.id, context)
        metadata = thread["metadata"] if isinstance(thread["metadata"], dict) else {}
        if body.status is not None and thread["status"] != body.status:
            continue
        if body.metadata and any(metadata.get(key) != value for key, value in body.metadata.items()):
            continue
        found.append(thread)
    return found[body.offset:body.offset + body.limit]


@router.post("/threads/{conversation_id}/runs")
async def create_run(conversation_id: str, body: RunCreate, response: Response, user: CurrentUser, state: State,
                     context: RequestContext) -> dict[str, JsonValue]:
    """A background run (see `stream_run` for the strategies); answers the run, `pending` or `running`."""
    record, _ = await _create_run(state, user, conversation_id, body, context)
    response.headers.update({"Content-Location": _locations(conversation_id, record.run_id)["Content-Location"]})
    return _run_json(conversation_id, record, None)


@router.post("/threads/{conversation_id}/runs/stream")
async def stream_run(conversation_id: str, body: RunCreate, user: CurrentUser, state: State,
                     authorization: CurrentAuthorization, context: RequestContext) -> EventSourceResponse:
    """Start a run and stream it (`Location` names its rejoinable stream). While the thread runs:
    `reject` answers 409 `lane_busy`, `enqueue` makes the input a follow-up of the open run and
    streams that run, `interrupt` aborts it durably and starts this one once it settled;
    `rollback` is refused (`rollback_unsupported`). Every event has an `id:`."""
    record, _ = await _create_run(state, user, conversation_id, body, context)
    session = await state.reader(user, conversation_id, context)
    return await _event_stream(authorization, session, record, stream_modes(body.stream_mode), START, context,
                               headers=_locations(conversation_id, record.run_id))


@router.get("/threads/{conversation_id}/runs")
async def list_runs(conversation_id: str, user: CurrentUser, state: State, context: RequestContext,
                    limit: int = 10, offset: int = 0) -> list[dict[str, JsonValue]]:
    """The thread's runs made through this door, newest first."""
    session = await state.reader(user, conversation_id, context)
    # Each run's status is read from the lane's log: read no further back than the page reaches.
    wanted = offset + limit if offset >= 0 and limit >= 0 else None
    runs: list[dict[str, JsonValue]] = []
    for run_id in reversed(await session.get(THREAD_RUNS, context) or []):
        if wanted is not None and len(runs) >= wanted:
            break
        record = await _known(session, run_id, context)
        try:
            runs.append(_run_json(conversation_id, record, await _run_result(session, record, context)))
        except RunNotFound:
            continue  # forgotten: it left the lane's event log
    return runs[offset:offset + limit]


@router.get("/threads/{conversation_id}/runs/{run_id}")
async def get_run(conversation_id: str, run_id: str, user: CurrentUser, state: State,
                  context: RequestContext) -> dict[str, JsonValue]:
    session = await state.reader(user, conversation_id, context)
    record = await _known(session, run_id, context)
    return _run_json(conversation_id, record, await _run_result(session, record, context))


@router.get("/threads/{conversation_id}/runs/{run_id}/stream")
async def join_run_stream(conversation_id: str, run_id: str, user: CurrentUser, state: State,
                          authorization: CurrentAuthorization, context: RequestContext,
                          stream_mode: Annotated[list[str] | None, Query()] = None,
                          last_event_id: Annotated[str | None, Header()] = None) -> EventSourceResponse:
    """The run's stream after `Last-Event-ID` (all of it without one), in the modes it was made
    with unless `stream_mode` asks for others; ends with `end` once the run settled."""
    cursor = _cursor(last_event_id)
    session = await state.reader(user, conversation_id, context)
    record = await _known(session, run_id, context)
    asked = [mode for mode in stream_mode or [] if mode]  # the client sends `stream_mode=` for none
    modes = stream_modes(asked) if asked else tuple(record.stream_mode)
    return await _event_stream(authorization, session, record, modes, cursor, context)


@router.get("/threads/{conversation_id}/runs/{run_id}/join")
async def join_run(conversation_id: str, run_id: str, user: CurrentUser, state: State,
                   context: RequestContext) -> JsonValue:
    """Wait for the run to settle; answers the thread's values then."""
    await _known(await state.reader(user, conversation_id, context), run_id, context)
    await state.until_settled(user, conversation_id, run_id, context)
    thread = await _thread_json(state, user, conversation_id, context)
    return thread["values"]


@router.post("/threads/{conversation_id}/runs/{run_id}/cancel")
async def cancel_run(conversation_id: str, run_id: str, user: CurrentUser, state: State, context: RequestContext,
                     wait: bool = False, action: str = "interrupt") -> Response:
    """Stop the run with a durable abort (cause `user`): wherever it is driven it stops at its next
    safe point and answers every open tool call. 202, or 204 after it settled with `wait`; a run
    that already settled is left as it is. `action=rollback` is refused (`rollback_unsupported`)."""
    if action == "rollback":
        raise RollbackUnsupported("cancel action 'rollback' would delete the run; the harness keeps every run it "
                                  "journaled: cancel with action 'interrupt'")
    if action != "interrupt":
        raise InvalidInput(f"unknown cancel action {action[:40]!r}; use 'interrupt'", action=action[:40])
    await _known(await state.reader(user, conversation_id, context), run_id, context)
    with contextlib.suppress(NoActiveOperation):  # it settled already
        await state.stop(user, conversation_id, context, operation_id=run_id)
        if wait:
            await state.until_settled(user, conversation_id, run_id, context)
    return Response(status_code=status.HTTP_204_NO_CONTENT if wait else status.HTTP_202_ACCEPTED)


@router.get("/threads/{conversation_id}/stream")
async def join_thread_stream(conversation_id: str, user: CurrentUser, state: State,
                             authorization: CurrentAuthorization, context: RequestContext,
                             last_event_id: Annotated[str | None, Header()] = None) -> EventSourceResponse:
    """The thread's runs (made through this door) one after the other, each as its own stream
    would carry it, with ids `{run_id}:{id}`: after `Last-Event-ID`, the rest of that run and every
    later one; without it, from the open run (or the next one) on. Runs until the client leaves."""
    session = await state.reader(user, conversation_id, context)
    start_run, cursor = None, START
    if last_event_id:
        start_run, _, rest = last_event_id.partition(":")
        cursor = parse_event_id(rest)
        if start_run not in (await session.get(THREAD_RUNS, context) or []):  # refused before the stream starts
            raise RunNotFound(f"thread {session.id} has no run {start_run[:80]!r}", run_id=start_run[:80])
    parts = authorization.until_revoked(_thread_parts(state, user, session, start_run, cursor, context))
    return EventSourceResponse(_sse(parts, state.options.heartbeat_s), headers={"Cache-Control": "no-store"})


async def _thread_parts(state: ServerState, user: str, session: SessionReader, start_run: str | None,
                        cursor: Cursor, context: Context) -> AsyncGenerator[Part, None]:
    done: set[str] = set()
    runs = await session.get(THREAD_RUNS, context) or []
    if start_run is not None:  # one of `runs`, as the route checked
        done.update(runs[:runs.index(start_run)])
    else:
        current = await _current_run(session, context)
        done.update(run for run in runs if run != current)
    seen: set[str] = set()  # operations already waited past: this door's runs and other doors'
    while True:
        runs = await session.get(THREAD_RUNS, context) or []
        todo = [run for run in runs if run not in done]
        if not todo:
            seen.update(runs)
            await _next_run(state, user, session.id, seen, context)
            continue
        run_id = todo[0]
        done.add(run_id)
        record = await _known(session, run_id, context)
        async for part in _run_parts(state, user, session.id, record, tuple(record.stream_mode),
                                     cursor if run_id == start_run else START, context):
            yield Part(f"{run_id}:{part.id}", part.event, part.data)


async def _next_run(state: ServerState, user: str, thread_id: str, seen: set[str], context: Context) -> None:
    """Return once the thread's main lane may have a run to follow: it holds an operation not in
    `seen` (added to it, so an operation of another door, which the thread stream does not follow,
    is returned for once and then waited past), or a run starts, ends or adds an entry."""
    watch = await state.watch(user, thread_id, context)
    try:
        operation = watch.snapshot.operation
        if operation is not None and operation.id not in seen:
            seen.add(operation.id)
            return
        async for event in watch:
            if isinstance(event, RunStart | RunEnd | EntryAdded) and event.lane == MAIN_LANE:
                return
    finally:
        watch.close()
