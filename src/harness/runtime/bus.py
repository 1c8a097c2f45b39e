"""The event bus: recipients are bound when a batch is emitted, delivery happens off the session line.

`emit_batch` is called as the last step of a commit continuation (HA-12). It binds the listeners and
watchers present at that instant, puts a copy of every event in each bound watcher's buffer, queues
the batch for the listeners and returns a future that resolves once every bound listener has
handled it. Listeners run one at a time, in global FIFO order, on the bus's own task; a listener
that raises is reported as a `handler_error` event and delivery goes on (HA-13).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from harness.context import Context
from harness.errors import HarnessError
from harness.runtime.errors import HarnessFault, WatchOverflow
from harness.runtime.events import EventDelivery, HandlerError, HarnessEvent, event_lane

Listener = Callable[[HarnessEvent, Context], Awaitable[None] | None]
"""A passive observer: `listener(event, context)` with the emitting call's Context. It must not
call mutating harness APIs; what it raises becomes a `handler_error` event."""


def isolated(event: HarnessEvent) -> HarnessEvent:
    """A deep copy, so one recipient's mutation reaches no one else (HA-10)."""
    return event.model_copy(deep=True)


class Watcher:
    """A buffer of the deliveries bound to one lane watch, read by `LaneWatch` iteration."""

    def __init__(self, lane: str, limit: int) -> None:
        self.lane = lane
        self.limit = limit
        self._buffer: deque[EventDelivery] = deque()
        self._wakeup = asyncio.Event()
        self._ended = False
        self._fault: HarnessError | None = None

    def wants(self, event: HarnessEvent) -> bool:
        lane = event_lane(event)
        return lane is None or lane == self.lane

    def push(self, delivery: EventDelivery) -> bool:
        """Buffer `delivery`; False when the reader has fallen `limit` events behind: the watch
        then ends with `WatchOverflow` (its buffer is dropped: a new snapshot replaces it)."""
        if self._ended:
            return True
        if len(self._buffer) >= self.limit:
            self._buffer.clear()
            self.end(WatchOverflow(f"the watch of lane {self.lane} fell {self.limit} events behind; watch again",
                                   lane=self.lane, limit=self.limit))
            return False
        self._buffer.append(delivery)
        self._wakeup.set()
        return True

    def end(self, fault: HarnessError | None = None) -> None:
        """Stop after the buffered deliveries; with `fault`, iteration then raises it."""
        if not self._ended:
            self._ended, self._fault = True, fault
            self._wakeup.set()

    def take_buffered(self) -> list[EventDelivery]:
        taken = [_private(delivery) for delivery in self._buffer]
        self._buffer.clear()
        return taken

    def discard(self) -> None:
        self._buffer.clear()
        self.end()

    async def deliveries(self) -> AsyncIterator[EventDelivery]:
        while True:
            while self._buffer:
                yield _private(self._buffer.popleft())
            if self._ended:
                if self._fault is not None:
                    raise self._fault
                return
            self._wakeup.clear()
            await self._wakeup.wait()


def _private(delivery: EventDelivery) -> EventDelivery:
    return EventDelivery(isolated(delivery.event), delivery.context)


@dataclass(slots=True)
class _Batch:
    listeners: tuple[Listener, ...]
    events: tuple[HarnessEvent, ...]
    context: Context
    delivered: asyncio.Future[None]


class EventBus:
    """Listeners and watchers of one harness."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._watchers: list[Watcher] = []
        self._queue: deque[_Batch] = deque()
        self._drainer: asyncio.Task[None] | None = None

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Register `listener` for batches emitted from now on; returns its unsubscribe."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def add_watcher(self, lane: str, limit: int) -> Watcher:
        watcher = Watcher(lane, limit)
        self._watchers.append(watcher)
        return watcher

    def remove_watcher(self, watcher: Watcher) -> None:
        if watcher in self._watchers:
            self._watchers.remove(watcher)
        watcher.discard()

    @property
    def has_recipients(self) -> bool:
        """Whether an event emitted now would reach anyone: a listener or a watcher."""
        return bool(self._listeners or self._watchers)

    def emit_batch(self, events: Sequence[HarnessEvent], context: Context) -> asyncio.Future[None]:
        """Bind recipients now, without yielding, and queue the batch (HA-12, HA-13).

        Returns a future resolved when every listener bound here has handled every event."""
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._watchers:
            # One copy here cuts the batch loose from the projection; each watcher copies again
            # when it reads, off the session line.
            shared = [EventDelivery(isolated(event), context) for event in events]
            for watcher in list(self._watchers):
                for delivery in shared:
                    if watcher.wants(delivery.event) and not watcher.push(delivery):
                        self._watchers.remove(watcher)
                        break
        if not self._listeners or not events:
            delivered.set_result(None)
            return delivered
        self._queue.append(_Batch(tuple(self._listeners), tuple(events), context, delivered))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        return delivered

    @property
    def delivering(self) -> bool:
        """True inside a listener: the bus's own task is running it."""
        return self._drainer is not None and asyncio.current_task() is self._drainer

    async def _drain(self) -> None:
        while self._queue:
            batch = self._queue.popleft()
            try:
                for event in batch.events:
                    for listener in batch.listeners:
                        await self._deliver(listener, event, batch.context)
            finally:
                if not batch.delivered.done():
                    batch.delivered.set_result(None)

    async def _deliver(self, listener: Listener, event: HarnessEvent, context: Context) -> None:
        try:
            outcome = listener(isolated(event), context)
            if inspect.isawaitable(outcome):
                await outcome
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # a listener's failure must not reach the committing caller
            task = asyncio.current_task()
            if isinstance(error, asyncio.CancelledError) and task is not None and task.cancelling():
                raise  # the bus itself is being cancelled
            if event.type != "handler_error":
                self.emit_batch([HandlerError(event_type=event.type, error=f"{type(error).__name__}: {error}")],
                                context)

    def end_watches(self, fault: HarnessFault | None = None) -> None:
        """End every watch (after its buffered events), with `fault` when the harness faulted."""
        watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            watcher.end(fault)

    async def drained(self) -> None:
        """Wait until every queued batch has been delivered."""
        while self._drainer is not None and not self._drainer.done():
            await asyncio.shield(self._drainer)
