"""The instance-level feed: what a service's conversations are doing (activity), which are live
here (presence) and what went wrong with them (alerts). It carries no chat events: those belong to
each conversation's own stream (CE-26)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict


class _FeedEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    conversation_id: str


class TurnActivity(_FeedEvent):
    """A turn started (`running`) or ended, with its outcome and, for a failed one, the public
    error text its error row holds (CE-9)."""

    type: Literal["activity"] = "activity"
    running: bool
    outcome: Literal["completed", "failed", "aborted"] | None = None
    error_text: str | None = None


class Presence(_FeedEvent):
    """A conversation became live in this process, or was disposed."""

    type: Literal["presence"] = "presence"
    live: bool


class Alert(_FeedEvent):
    """Something a person should know that is no turn's outcome: the harness of a conversation
    faulted (its session was taken over, its store refused a write), with its stable code."""

    type: Literal["alert"] = "alert"
    code: str
    message: str


InstanceEvent: TypeAlias = TurnActivity | Presence | Alert


class FeedWatch:
    """One subscriber's view of the feed from its subscription on; `close()` ends it."""

    def __init__(self, feed: InstanceFeed) -> None:
        self._feed = feed
        self._events: deque[InstanceEvent] = deque()
        self._changed = asyncio.Event()
        self._closed = False

    def push(self, event: InstanceEvent) -> None:
        self._events.append(event)
        self._changed.set()

    async def __aiter__(self) -> AsyncIterator[InstanceEvent]:
        while not self._closed:
            while self._events:
                yield self._events.popleft()
            self._changed.clear()
            await self._changed.wait()

    def close(self) -> None:
        self._closed = True
        self._changed.set()
        self._feed.unsubscribe(self)


class InstanceFeed:
    """Fans instance events out to every subscriber, without waiting for any (publishing is
    called from event listeners, which must not block)."""

    def __init__(self) -> None:
        self._watches: set[FeedWatch] = set()

    def watch(self) -> FeedWatch:
        subscriber = FeedWatch(self)
        self._watches.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: FeedWatch) -> None:
        self._watches.discard(subscriber)

    def publish(self, event: InstanceEvent) -> None:
        for subscriber in list(self._watches):
            subscriber.push(event)
