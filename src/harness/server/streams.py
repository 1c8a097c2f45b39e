"""The native event streams over SSE: a conversation's watch (`snapshot`, then every later event)
and the instance feed (activity, presence, alerts; no chat events).

Each stream reads its source in a task of its own into a bounded buffer, so a client that reads
slowly never holds up a run: when the buffer is full the stream ends with an `overflow` event and
the client reconnects (getting a fresh snapshot). A quiet stream sends a heartbeat comment every
`heartbeat_s` seconds."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from fastapi import APIRouter
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel

from harness.conversation import Forbidden, InstanceEvent
from harness.server.approvals import ApprovalChange
from harness.server.state import CurrentUser, RequestContext, State
from harness.session import SessionNotFound

router = APIRouter(prefix="/api", tags=["events"])

T = TypeVar("T")


class Overflow(BaseModel):
    """Why a stream ended: the client fell `limit` events behind. Reconnect for a fresh snapshot."""

    type: str = "overflow"
    limit: int


class _Buffer(Generic[T]):
    """Items pushed by a pump, taken by the stream; full at `limit`, after which it takes no more."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: deque[T] = deque()
        self.overflowed = False
        self.ended = False
        self.changed = asyncio.Event()

    def push(self, item: T) -> None:
        if self.overflowed or self.ended:
            return
        if len(self.items) >= self.limit:
            self.overflowed = True
            self.items.clear()
        else:
            self.items.append(item)
        self.changed.set()

    def end(self) -> None:
        self.ended = True
        self.changed.set()


async def _events(buffer: _Buffer[T], render: Callable[[T], ServerSentEvent], heartbeat_s: float,
                  ) -> AsyncIterator[ServerSentEvent]:
    """What `buffer` takes, rendered, with heartbeats while it is quiet; ends with `overflow`
    when the buffer overflowed, or when its source ended."""
    while True:
        while buffer.items:
            yield render(buffer.items.popleft())
        if buffer.overflowed:
            yield ServerSentEvent(event="overflow", data=Overflow(limit=buffer.limit))
            return
        if buffer.ended:
            return
        buffer.changed.clear()
        try:
            await asyncio.wait_for(buffer.changed.wait(), heartbeat_s)
        except TimeoutError:
            yield ServerSentEvent(comment="heartbeat")


async def _pump(source: AsyncIterator[T], buffer: _Buffer[T]) -> None:
    try:
        async for item in source:
            buffer.push(item)
            if buffer.overflowed:
                return
    finally:
        buffer.end()


def _model_event(event: BaseModel) -> ServerSentEvent:
    kind = getattr(event, "type", None)
    return ServerSentEvent(event=kind if isinstance(kind, str) else None, data=event)


@router.get("/conversations/{conversation_id}/events", response_class=EventSourceResponse)
async def conversation_events(conversation_id: str, user: CurrentUser, state: State,
                              context: RequestContext) -> AsyncIterator[ServerSentEvent]:
    """The conversation live: a `snapshot` event (the lane snapshot: transcript since the newest
    compaction, the current operation, queues, the streaming reply so far), then every later
    event, named by its `type` (`message_update`, `tool_start`, `chat_event`, `run_end`, ...),
    and `approval` when a tool call starts or stops waiting for an answer. A client that falls
    `client_buffer` events behind gets `overflow` and the stream ends: reconnect."""
    conversation = await state.service.open(user, conversation_id, context)
    watch = await conversation.watch(context)
    buffer: _Buffer[BaseModel | ApprovalChange] = _Buffer(state.options.client_buffer)

    def on_approval(change: ApprovalChange) -> None:
        if change.pending.conversation_id == conversation_id:
            buffer.push(change)

    def render(item: BaseModel | ApprovalChange) -> ServerSentEvent:
        if isinstance(item, ApprovalChange):
            answer = None if item.answer is None else {"allow": item.answer.allow, "reason": item.answer.reason}
            return ServerSentEvent(event="approval", data={"pending": item.pending, "answer": answer})
        return _model_event(item)

    stop_listening = state.approvals.listen(on_approval)
    pump = asyncio.create_task(_pump(aiter(watch), buffer))
    try:
        yield ServerSentEvent(event="snapshot", data=watch.snapshot)
        async for event in _events(buffer, render, state.options.heartbeat_s):
            yield event
    finally:
        stop_listening()
        watch.close()
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump


@router.get("/feed", response_class=EventSourceResponse)
async def instance_feed(user: CurrentUser, state: State, context: RequestContext) -> AsyncIterator[ServerSentEvent]:
    """What the current user's conversations are doing on this server: `activity` (a turn
    started or ended, with its outcome), `presence` (live here or not) and `alert` (a harness
    fault, with its code). No chat events: those are each conversation's own stream."""
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
        yield ServerSentEvent(comment="subscribed")  # from here on, nothing is missed
        async for event in _events(buffer, _model_event, state.options.heartbeat_s):
            yield event
    finally:
        feed.close()
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump
