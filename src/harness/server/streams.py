"""The native event streams over SSE: a conversation's watch (`snapshot`, then every later event)
and the instance feed (activity, presence, alerts; no chat events).

Every event of the watch that describes a committed fact carries `id:`, its durable event id (the
`event_seq` of the lane's event log), and so does the snapshot (the event it is current to). A
durable event shown with rows of its own (a chat-event row, a reply's blocks, a delegation row)
comes after them, and the rows carry `{seq}.{k}` (the first `k` parts of event `seq` were sent),
so a cut between a row and its event resumes exactly. Live presentation (the streaming reply, tool
progress, approvals) carries no id. A client that reconnects with `Last-Event-ID` gets the log's
events after it and then the live ones, without a snapshot, while the log still holds that id;
otherwise a fresh snapshot marked `reset`.

The streaming reply goes out as deltas (issue 29). A client is sent the whole reply so far once:
in the snapshot (`operation.streaming_message`), as a `message_start` when a reply starts, or, when
it joins or resumes mid-reply, as a `message_update` (`{type, lane, message}`, the message whole).
After that each change is a `message_delta` carrying only what the reply gained since the last
one this client was sent:

    {"type": "message_delta", "lane": "main", "content": [
        {"index": 0, "append": " more text"},       # block 0's text (or thinking) grew by this
        {"index": 1, "block": {"type": "tool_call", ...}}]}   # block 1 is this now (new, or changed)

`append` extends a text block's `text` or a thinking block's `thinking`; `block` is a content
block as it is now: a new one, or one that changed otherwise than by growing (a tool call's
arguments, a thinking block's signature). The other fields of the partial message (usage, stop
reason) are not sent until `message_end`, which carries the reply whole. A reply that changed in
a way no delta states (a block fewer, or of another type) is sent whole as a `message_update`
again.

The watchers of one conversation in a server share one source and one in-memory fan-out
(`harness.server.fanout`), so the store is read once per change, not once per watcher. Each
watcher's stream holds at most `client_buffer_bytes` of events it has not sent (their JSON size;
the streaming reply, the shared source's, is held once, the newest only), so a client that reads
slowly never holds up a run nor the server's memory: past the bound the stream ends with an
`overflow` event (`{type, limit, unit: "bytes"}`) and the client reconnects with its last event
id. The instance feed holds `client_buffer` events per client the same way (`unit: "events"`). A
quiet stream sends a heartbeat comment every `heartbeat_s` seconds, and a stream whose token is
revoked ends within `token_check_s`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Generic, Literal, Protocol, TypeVar, cast

from fastapi import APIRouter, Depends, Header
from fastapi.responses import StreamingResponse
from fastapi.sse import ServerSentEvent, format_sse_event
from pydantic import BaseModel

from harness.context import Context
from harness.conversation import ApprovalChange, Forbidden, InstanceEvent, LaneEvents, conversation_events
from harness.messages import AssistantContent, AssistantMessage, TextContent, ThinkingContent
from harness.runtime import HarnessEvent, LaneSnapshot, MessageEnd, MessageStart, MessageUpdate, RunEnd, RunStart
from harness.server.fanout import Delivered, Subscription
from harness.server.langgraph_wire import InvalidEventId
from harness.server.state import Authorization, CurrentAuthorization, CurrentUser, RequestContext, ServerState, State
from harness.session import SessionNotFound

router = APIRouter(prefix="/api", tags=["events"])
logger = logging.getLogger(__name__)

T = TypeVar("T")

REPLAY_PAGE = 500
"""Durable events read from the log per page when a watch resumes from an event id."""


class Overflow(BaseModel):
    """Why a stream ended: the client fell `limit` events or bytes (`unit`) behind. Reconnect
    with the last event id."""

    type: str = "overflow"
    limit: int
    unit: Literal["events", "bytes"]


class Appended(BaseModel):
    """Content block `index` of the streaming reply grew by `append` (its text, or its thinking)."""

    index: int
    append: str


class Replaced(BaseModel):
    """Content block `index` of the streaming reply is `block` now: a new block, or one changed
    otherwise than by growing (a tool call's arguments, a thinking block's signature)."""

    index: int
    block: AssistantContent


class MessageDelta(BaseModel):
    """What the reply streaming on `lane` gained since the last `message_start`, `message_update`
    or `message_delta` sent to this client (see the module docstring)."""

    type: Literal["message_delta"] = "message_delta"
    lane: str
    content: list[Appended | Replaced]


def reply_delta(shown: AssistantMessage, now: AssistantMessage) -> list[Appended | Replaced] | None:
    """What `now` adds to `shown`, the streaming reply as a client has it; None when `now` is not
    `shown` grown (a block fewer, a block of another type, a shorter text: send it whole). A
    block's text only grows while the reply streams (the provider stream appends to it), so only
    the lengths are compared: O(the change), not O(the reply)."""
    if len(now.content) < len(shown.content):
        return None
    changes: list[Appended | Replaced] = []
    for index, block in enumerate(now.content):
        before = shown.content[index] if index < len(shown.content) else None
        if before is None:
            changes.append(Replaced(index=index, block=block))
        elif before.type != block.type:
            return None
        elif isinstance(block, ThinkingContent) and isinstance(before, ThinkingContent) and (
                block.signature, block.redacted) != (before.signature, before.redacted):
            changes.append(Replaced(index=index, block=block))
        elif (text := _streamed_text(block)) is not None:
            was = _streamed_text(before) or ""
            if len(text) < len(was):
                return None
            if len(text) > len(was):
                changes.append(Appended(index=index, append=text[len(was):]))
        elif block != before:
            changes.append(Replaced(index=index, block=block))
    return changes


def _streamed_text(block: AssistantContent) -> str | None:
    """The text a block of the reply streams: a text block's text, a thinking block's thinking."""
    if isinstance(block, TextContent):
        return block.text
    return block.thinking if isinstance(block, ThinkingContent) else None


_EVENT_ID = re.compile(r"(\d{1,18})(?:\.(\d{1,3}))?")


@dataclass(frozen=True)
class WatchPosition:
    """Where a client of the watch is: it has every part of durable event `seq` and before, or,
    when `parts` is given, only the first `parts` parts of event `seq`'s group (its rows)."""

    seq: int
    parts: int | None = None

    @classmethod
    def parse(cls, event_id: str) -> WatchPosition:
        """The position an `id:` of the watch names. Raises `InvalidEventId` for text the watch
        never sends."""
        found = _EVENT_ID.fullmatch(event_id.strip())
        if found is None:
            raise InvalidEventId(f"{event_id[:80]!r} is not an event id of this watch", event_id=event_id[:80])
        return cls(int(found[1]), None if found[2] is None else int(found[2]))


class _Buffer(Generic[T]):
    """Items pushed by a pump, taken by the stream; full at `limit`, after which it is `cut` and
    takes no more."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: deque[T] = deque()
        self.cut = False
        self.ended = False
        self._changed = asyncio.Event()

    def push(self, item: T) -> None:
        if self.cut or self.ended:
            return
        if len(self.items) >= self.limit:
            self.cut = True
            self.items.clear()
        else:
            self.items.append(item)
        self._changed.set()

    def end(self) -> None:
        self.ended = True
        self._changed.set()

    def take(self) -> list[T]:
        """Every item held, oldest first, without waiting."""
        taken = list(self.items)
        self.items.clear()
        return taken

    async def wait(self) -> None:
        """Return once an item is held, or the buffer is cut or ended."""
        if self.items or self.cut or self.ended:
            return
        self._changed.clear()
        await self._changed.wait()


async def _pump(source: AsyncIterator[T], buffer: _Buffer[T]) -> None:
    try:
        async for item in source:
            buffer.push(item)
            if buffer.cut:
                return
    finally:
        buffer.end()


class _Source(Protocol):
    """What a stream sends from (a watch's `Subscription`, the feed's `_Buffer`): whether it was
    `cut` (its client fell behind) or `ended`, and `wait` for more."""

    @property
    def cut(self) -> bool: ...

    @property
    def ended(self) -> bool: ...

    async def wait(self) -> None: ...


_HEARTBEAT = b": heartbeat\n\n"


async def _sent(source: _Source, waiting: Callable[[], bytes], overflow: Overflow,
                heartbeat_s: float) -> AsyncGenerator[bytes, None]:
    """What `waiting` has for the client each time `source` has more (b"": nothing now), with
    heartbeats while it is quiet; ends with `overflow` when `source` was cut, or when it ended."""
    while True:
        if chunk := waiting():
            yield chunk
        elif source.cut:
            yield _encoded(ServerSentEvent(event="overflow", data=overflow))
            return
        elif source.ended:
            return
        else:
            try:
                async with asyncio.timeout(heartbeat_s):
                    await source.wait()
            except TimeoutError:
                yield _HEARTBEAT


def _model_event(event: BaseModel, event_id: str | None = None) -> ServerSentEvent:
    kind = getattr(event, "type", None)
    return ServerSentEvent(event=kind if isinstance(kind, str) else None, id=event_id, data=event)


class _ShownReply:
    """The streaming reply as one client of the watch has it (`reply`), so that what it gains goes
    out as a `message_delta` (see the module docstring)."""

    def __init__(self, reply: AssistantMessage | None) -> None:
        self.reply = reply

    def encoded(self, delivered: Delivered) -> bytes:
        """The event as this client is sent it: a `MessageUpdate` as a delta from the reply it has
        (`_update_wire`), any other as every client is (`_wire`); each encoded once for all the
        watchers of the lane that are sent the same bytes (`Delivered.encoded`)."""
        match delivered.event:
            case MessageUpdate() as event:
                shown, self.reply = self.reply, event.message
                return delivered.encoded(_update_wire, shown)
            case MessageStart(message=AssistantMessage() as message):
                self.reply = message
            case MessageEnd(message=AssistantMessage()) | RunStart() | RunEnd():
                self.reply = None
        return delivered.encoded(_wire, None)


def _update_wire(event: HarnessEvent, shown: AssistantMessage | None) -> bytes:
    """A `MessageUpdate` (`_ShownReply` encodes no other event with it) as a client that has
    `shown` of the streaming reply is sent it: the `message_delta` of what the reply gained (b""
    when nothing), or whole when nothing was shown or the reply is not `shown` grown."""
    event = cast(MessageUpdate, event)
    changes = None if shown is None else reply_delta(shown, event.message)
    if changes is None:
        return _encoded(_model_event(event))
    return _encoded(_model_event(MessageDelta(lane=event.lane, content=changes))) if changes else b""


_READER_FAILED = ServerSentEvent(event="error", data={"message": "the approvals waiting elsewhere could not be read"})


def _approval(change: ApprovalChange) -> ServerSentEvent:
    answer = None if change.answer is None else {"allow": change.answer.allow, "reason": change.answer.reason}
    return ServerSentEvent(event="approval", data={"pending": change.pending.model_dump(mode="json"), "answer": answer})


CHUNK_BYTES = 64 * 1024
"""What a watch writes at once, at most about: the events a client has waiting go out in one
write (one send on its socket) up to this, not one write each."""


def _waiting(watch: Subscription, approvals: deque[tuple[int, ApprovalChange]], shown: _ShownReply) -> bytes:
    """The events `watch` holds as the client is sent them, each approval change `(n, change)`
    right after the watch's event `n` (the newest delivered when it changed), in order, encoded,
    about `CHUNK_BYTES` at most (b"": nothing to send now): what is waiting goes out together."""
    parts: list[bytes] = []
    size = 0
    while size < CHUNK_BYTES:
        if approvals and approvals[0][0] < watch.next_number:
            part = _encoded(_approval(approvals.popleft()[1]))
        elif (delivered := watch.pop()) is not None:
            part = shown.encoded(delivered)
        else:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def _parts(event: HarnessEvent, skip: int = 0) -> list[ServerSentEvent]:
    """`event` as the watch shows it (its rows, then itself), from its `skip`th part on, each part
    of a durable event with its id (see the module docstring)."""
    shown = conversation_events(event)
    seq = event.event_seq
    ids = [None if seq is None else str(seq) if k == len(shown) else f"{seq}.{k}" for k in range(1, len(shown) + 1)]
    return [_model_event(item, event_id) for item, event_id in zip(shown[skip:], ids[skip:], strict=True)]


def _wire(event: HarnessEvent, _: object = None) -> bytes:
    """Every part of `event` (`_parts`) as the watch writes it: the same for every client."""
    return b"".join(_encoded(part) for part in _parts(event))


def _snapshot(snapshot: LaneSnapshot, *, reset: bool) -> ServerSentEvent:
    """The `snapshot` event: the lane snapshot and `reset` (True: it replaces what the client had,
    since the log no longer holds the event id it resumed from)."""
    event_id = None if snapshot.event_seq is None else str(snapshot.event_seq)
    return ServerSentEvent(event="snapshot", id=event_id, data={**snapshot.model_dump(mode="json"), "reset": reset})


async def _replay(watch: LaneEvents, after: WatchPosition, context: Context) -> list[ServerSentEvent] | None:
    """The parts after `after` up to the event `watch.snapshot` is current to, from the lane's
    log, to send instead of the snapshot; None when the log does not hold `after.seq` (trimmed
    past it, or an id of another lane or store)."""
    read_events = watch.read_events
    newest = watch.snapshot.event_seq
    if newest is None or after.seq > newest:
        return None
    # Read from event `after.seq` itself: finding it proves the log holds it, and its rows may be unsent.
    page = await read_events(after.seq - 1, REPLAY_PAGE, context)
    if not page.events or page.events[0].event_seq != after.seq:
        return None
    events = list(page.events)
    while (last := events[-1].event_seq) is not None and last < newest:
        page = await read_events(last, REPLAY_PAGE, context)
        if not page.holds or not page.events:
            return None
        events.extend(page.events)
    first, *rest = (event for event in events if event.event_seq is not None and event.event_seq <= newest)
    parts = _parts(first, len(conversation_events(first)) if after.parts is None else after.parts)
    for event in rest:
        parts += _parts(event)
    return parts


# Dependencies, not the stream's body: their errors are answered as errors (400, 404) before a
# stream starts, where an error inside the stream could only cut it.


async def _watch(conversation_id: str, user: CurrentUser, state: State,
                 context: RequestContext) -> AsyncIterator[Subscription]:
    """The conversation's watch (with its owner check), closed once the response is sent."""
    watch = await state.watch(user, conversation_id, context)
    try:
        yield watch
    finally:
        watch.close()


async def _resumed_after(last_event_id: Annotated[str | None, Header()] = None) -> WatchPosition | None:
    return WatchPosition.parse(last_event_id) if last_event_id else None


class _EventStream(StreamingResponse):
    """Server-sent events encoded here (`_encoded`) and written as they come, `events` closed
    however the response ends (a client gone cancels it), so what they hold goes with them.
    FastAPI's `EventSourceResponse` route runs each stream in two more tasks and passes each
    event through two memory streams and a timer: for the watch, with a few hundred streams on
    one event loop, about a fifth of the server's CPU (issue 29); the streams send their own
    heartbeats (`_sent`)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        super().__init__(_closed_at_end(events), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _closed_at_end(events: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(events):
        async for chunk in events:
            yield chunk


def _encoded(event: ServerSentEvent) -> bytes:
    """`event` as `EventSourceResponse` writes it: a model's data as its JSON, other data through
    `json.dumps`."""
    data = event.data
    text = None if data is None else data.model_dump_json() if isinstance(data, BaseModel) else json.dumps(data)
    return format_sse_event(data_str=text, event=event.event, id=event.id, retry=event.retry, comment=event.comment)


# status_code: FastAPI reads a route's status from its response class's `__init__`, and
# `_EventStream`'s takes none; without it, describing the API (`/openapi.json`) failed.
@router.get("/conversations/{conversation_id}/events", response_class=_EventStream, status_code=200)
async def conversation_events_stream(conversation_id: str, watch: Annotated[Subscription, Depends(_watch)],
                                     after: Annotated[WatchPosition | None, Depends(_resumed_after)], state: State,
                                     authorization: CurrentAuthorization, context: RequestContext) -> _EventStream:
    """The conversation live: a `snapshot` event (the lane snapshot: transcript since the newest
    compaction, the current operation, queues, the streaming reply so far; `reset` False), then
    every later event, named by its `type` (`message_delta`, `tool_start`, `chat_event`,
    `run_end`, ...), and `approval` when a tool call starts or stops waiting for an answer.

    Each event describing a committed fact has an `id:` (see the module docstring). With
    `Last-Event-ID` the stream continues after that event without a snapshot, then sends the
    streaming reply so far as a `message_update`, if one streams; when the lane's log no longer
    holds it, it starts with a snapshot whose `reset` is True. `invalid_event_id` (400) for an id
    the watch never sends. Once the whole streaming reply was sent, its progress comes as
    `message_delta`s (see the module docstring). A client that falls `client_buffer_bytes`
    behind gets `overflow` and the stream ends: reconnect with the last event id.

    With external workers the stream follows the journal the worker writes (`follow_lane`): the
    same snapshot, ids and resume, the streaming reply from its persisted frames (one
    `frame_interval_s` behind). A call waiting in another process (a worker, a chat) is its
    `approval` as soon as that process keeps it in the journal (read at each change of the
    conversation; `Approvals.follow_elsewhere`), after the events delivered by then, and so is its
    answer; should that reading fail, the stream ends with an `error` event (`{message}`):
    reconnect with the last event id."""

    return _EventStream(_watch_events(conversation_id, watch, after, state, authorization, context))


async def _watch_events(conversation_id: str, watch: Subscription, after: WatchPosition | None, state: State,
                        authorization: Authorization, context: Context) -> AsyncGenerator[bytes, None]:
    """The events of `conversation_events_stream`'s response, encoded."""
    approvals: deque[tuple[int, ApprovalChange]] = deque()

    def on_approval(change: ApprovalChange) -> None:
        # Told synchronously by a run here (every event delivered before the change is shown before
        # it), or read from the journal (after the events delivered by then).
        if change.pending.conversation_id == conversation_id:
            approvals.append((watch.delivered(), change))
            watch.wake()

    stop_listening = state.approvals.listen(on_approval)
    elsewhere = asyncio.ensure_future(state.approvals.follow_elsewhere(
        watch.reader, state.service.store.changes, state.options.follow_poll_s, on_approval))
    elsewhere.add_done_callback(lambda _: watch.wake())

    failed = False

    def waiting() -> bytes:
        # The reader runs until the stream ends: done, it failed, and the stream ends with that.
        nonlocal failed
        if elsewhere.done():
            failed = True
            return _encoded(_READER_FAILED)
        return _waiting(watch, approvals, shown)

    try:
        replay = None if after is None else await _replay(watch, after, context)
        operation = watch.snapshot.operation
        shown = _ShownReply(None if operation is None else operation.streaming_message)
        if replay is None:
            yield _encoded(_snapshot(watch.snapshot, reset=after is not None))
        else:
            if replay:
                yield b"".join(_encoded(event) for event in replay)
            if shown.reply is not None:
                yield _encoded(_model_event(MessageUpdate(lane=watch.snapshot.lane, message=shown.reply)))
        events = _sent(watch, waiting, Overflow(limit=watch.limit_bytes, unit="bytes"), state.options.heartbeat_s)
        async for chunk in authorization.until_revoked(events):
            yield chunk
            if failed:
                logger.error("the approvals of conversation %s waiting elsewhere could not be read", conversation_id,
                             exc_info=elsewhere.exception())
                return
    finally:
        stop_listening()
        elsewhere.cancel()


@router.get("/feed", response_class=_EventStream, status_code=200)
async def instance_feed(user: CurrentUser, state: State, authorization: CurrentAuthorization,
                        context: RequestContext) -> _EventStream:
    """What the current user's conversations are doing on this server: `activity` (a turn
    started or ended, with its outcome), `presence` (live here or not) and `alert` (a harness
    fault, with its code). No chat events: those are each conversation's own stream."""
    return _EventStream(_feed_events(user, state, authorization, context))


async def _feed_events(user: str, state: ServerState, authorization: Authorization,
                       context: Context) -> AsyncGenerator[bytes, None]:
    """The events of `instance_feed`'s response, encoded."""
    owned: dict[str, bool] = {}

    async def mine(feed: AsyncIterator[InstanceEvent]) -> AsyncIterator[InstanceEvent]:
        async for event in feed:
            if event.conversation_id not in owned:
                try:
                    await state.service.is_open(user, event.conversation_id, context)
                    owned[event.conversation_id] = True
                except (Forbidden, SessionNotFound):  # another user's, or gone: not this user's to see
                    owned[event.conversation_id] = False
            if owned[event.conversation_id]:
                yield event

    feed = state.service.feed.watch()
    buffer: _Buffer[InstanceEvent] = _Buffer(state.options.client_buffer)
    pump = asyncio.create_task(_pump(mine(aiter(feed)), buffer))
    try:
        yield _encoded(ServerSentEvent(comment="subscribed"))  # from here on, nothing is missed
        events = _sent(buffer, lambda: b"".join(_encoded(_model_event(item)) for item in buffer.take()),
                       Overflow(limit=buffer.limit, unit="events"), state.options.heartbeat_s)
        async for chunk in authorization.until_revoked(events):
            yield chunk
    finally:
        feed.close()
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump
