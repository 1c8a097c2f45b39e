"""The event bus: recipients are bound when a batch is emitted, delivery happens off the session line.

`emit_batch` is called as the last step of a commit continuation (HA-12). It binds the listeners and
watchers present at that instant, makes every event read-only once (`read_only`), puts it in each
bound watcher's buffer, queues the batch for the listeners and returns a future that resolves once
every bound listener has handled it. Listeners run one at a time, in global FIFO order, on the
bus's own task; a listener that raises is reported as a `handler_error` event and delivery goes on
(HA-13).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import operator
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from pydantic import BaseModel

from harness.context import Context
from harness.errors import HarnessError
from harness.runtime.errors import EventReadOnly, HarnessFault, WatchOverflow
from harness.runtime.events import EventDelivery, HandlerError, HarnessEvent, event_lane

Listener = Callable[[HarnessEvent, Context], Awaitable[None] | None]
"""A passive observer: `listener(event, context)` with the emitting call's Context. It must not
call mutating harness APIs; what it raises becomes a `handler_error` event."""


def read_only(event: HarnessEvent) -> HarnessEvent:
    """`event` with every list and dict in it replaced by a read-only one, which all its recipients
    can share: a change in place raises `EventReadOnly`, so none reaches another recipient or the
    harness's state (HA-10), and an emission costs one such pass however many recipients it has
    (issue 29). The pass is O(models and containers in the event), not O(bytes): strings and
    models that hold nothing changeable are shared as they are, so an update of a long reply
    costs its blocks, not its text."""
    return cast("HarnessEvent", _read_only(event))


_ATOMIC: frozenset[type] = frozenset({str, int, float, bool, type(None)})


def _read_only(value: Any) -> Any:
    if type(value) in _ATOMIC:  # most fields: checked first, as this pass runs on the session line
        return value
    if isinstance(value, BaseModel):
        shared = {name: _read_only(item) for name, item in value.__dict__.items()}
        if all(map(operator.is_, shared.values(), value.__dict__.values())):
            return value
        copied = copy.copy(value)  # pydantic's shallow copy: the fields set and private state
        object.__setattr__(copied, "__dict__", shared)  # frozen models refuse setattr
        return copied
    if isinstance(value, _ReadOnlyList | _ReadOnlyDict):
        return value
    if isinstance(value, list):
        return _ReadOnlyList(_read_only(item) for item in value)
    if isinstance(value, dict):
        return _ReadOnlyDict({key: _read_only(item) for key, item in value.items()})
    if type(value) is tuple:
        items = tuple(_read_only(item) for item in value)
        return value if all(map(operator.is_, items, value)) else items
    return value


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise EventReadOnly("a delivered event is shared by all its recipients; copy it "
                        "(model_copy(deep=True)) to change it (HA-10)", container=type(self).__name__)


class _ReadOnlyList(list[Any]):
    """A list whose in-place changes raise `EventReadOnly`; it still reads, compares and serializes
    as a list (a subclass, so `isinstance(value, list)` and pydantic keep working). A copy of it
    (`copy`, `deepcopy`, `model_copy(deep=True)`, pickling) is a plain list."""

    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __reduce__(self) -> tuple[type[list[Any]], tuple[list[Any]]]:
        return list, (list(self),)


class _ReadOnlyDict(dict[str, Any]):
    """A dict whose in-place changes raise `EventReadOnly`; otherwise as `_ReadOnlyList`."""

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return dict, (dict(self),)


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
        taken = list(self._buffer)
        self._buffer.clear()
        return taken

    def discard(self) -> None:
        self._buffer.clear()
        self.end()

    async def deliveries(self) -> AsyncIterator[EventDelivery]:
        while True:
            while self._buffer:
                yield self._buffer.popleft()
            if self._ended:
                if self._fault is not None:
                    raise self._fault
                return
            self._wakeup.clear()
            await self._wakeup.wait()


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
        if not self.has_recipients or not events:
            delivered.set_result(None)
            return delivered
        # One read-only form per event, shared by every recipient, instead of a deep copy per
        # recipient (issue 29: 3.8 s of 27 s CPU in bench/serve_load.py, 50 conversations x 4).
        shared = tuple(read_only(event) for event in events)
        if self._watchers:
            deliveries = [EventDelivery(event, context) for event in shared]
            for watcher in list(self._watchers):
                for delivery in deliveries:
                    if watcher.wants(delivery.event) and not watcher.push(delivery):
                        self._watchers.remove(watcher)
                        break
        if not self._listeners:
            delivered.set_result(None)
            return delivered
        self._queue.append(_Batch(tuple(self._listeners), shared, context, delivered))
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
            outcome = listener(event, context)
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
