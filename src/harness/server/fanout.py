"""One source per watched lane per server, fanned out in memory to every watcher of it (issue 29).

The watchers of one conversation's lane in one server share a `LaneFanout`: one source (the live
lane's watch, or a follow of the lane whoever drives it, `follow_lane`), read by one task, which
hands every event to each watcher's `Subscription`. So a server with 200 watchers of a lane holds
one watch of it, or reads the store once per wake-up of one follow, not 200 times. The fan-out
keeps the source's snapshot folded with every event it has handed out (`reduce_lane_snapshot`):
a watcher that joins later starts from that snapshot, current to the shared position, and then
gets every later event, exactly once, in order. A navigation cannot be folded (the branch changed
under the transcript): that fan-out then takes no new watcher, and the next one opens a source of
its own. A source is closed when its last watcher leaves.

A subscription holds what its reader has not read yet, bounded in bytes, not events: each waiting
event counts its JSON size, and one that would take the subscription past its `limit_bytes` cuts
it: its events are dropped and reading it raises `WatchOverflow` (a client resumes from its last
event id). A subscription that holds nothing takes one event of any size, so a reader that keeps
up is never cut by one large event (a long reply's end). The streaming reply is the exception:
each `MessageUpdate` carries the whole reply so far, so a subscription holds at most one, the
newest (a newer one takes its place, and the reply's end, a new reply or the run's end drops it):
the same reply the fan-out's snapshot holds, the shared source's, counted once for the server
and not per watcher."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from harness.conversation import LaneEvents
from harness.runtime import (
    HarnessEvent,
    LaneSnapshot,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RebaseRequired,
    RunEnd,
    WatchOverflow,
    reduce_lane_snapshot,
)

CLIENT_BUFFER_BYTES = 4 * 1024 * 1024
"""Bytes of events a watcher may fall behind by (their JSON size) before it is cut."""

_REPLY_ENDS = (MessageStart, MessageEnd, RunEnd)
"""Events after which the streaming reply a subscription may hold unread is no longer the newest."""


@dataclass(slots=True)
class _Waiting:
    """An event a subscription holds for its reader: its `number` in the order delivered, and its
    JSON size (0 for the streaming reply, the fan-out's); `event` None once it was dropped."""

    number: int
    event: HarnessEvent | None
    size: int


class Subscription(LaneEvents):
    """One watcher's share of a `LaneFanout`: a `LaneEvents` (the snapshot, then every later event
    through `async for`, `buffered`, `close`) whose events wait in a queue bounded in bytes (see
    the module docstring). `held_bytes` is what it holds now; once it was `cut`, iteration raises
    `WatchOverflow` (details `lane`, `limit_bytes`). Iteration also raises what the source raised,
    after the events delivered before it, and ends when the source ended."""

    def __init__(self, fanout: LaneFanout, limit_bytes: int) -> None:
        super().__init__(fanout.snapshot, fanout.source.reader, self._iterate(), self._take_all, self._leave)
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self.cut = False
        self.ended = False
        self._fanout = fanout
        self._queue: deque[_Waiting] = deque()
        self._update: _Waiting | None = None  # the streaming reply not yet read
        self._delivered = 0
        self._fault: BaseException | None = None
        self._wakeup = asyncio.Event()

    def push(self, event: HarnessEvent, size: int) -> None:
        """Hold `event` (of JSON size `size`) for the reader; cut the subscription instead when it
        would hold more than `limit_bytes`."""
        if self.cut or self.ended:
            return
        if isinstance(event, MessageUpdate) and self._update is not None:
            self._update.event = event
            self._wakeup.set()
            return
        if isinstance(event, _REPLY_ENDS) and self._update is not None:
            self._update.event, self._update = None, None
        if self._queue and self.held_bytes + size > self.limit_bytes:
            self.cut, self.held_bytes = True, 0
            self._queue.clear()
            self._update = None
            self._fanout.leave(self)  # nothing more reaches it: a reconnect resumes from the log
        else:
            self._delivered += 1
            waiting = _Waiting(self._delivered, event, 0 if isinstance(event, MessageUpdate) else size)
            self._queue.append(waiting)
            self.held_bytes += waiting.size
            if isinstance(event, MessageUpdate):
                self._update = waiting
        self._wakeup.set()

    def end(self, fault: BaseException | None) -> None:
        """The source ended (with `fault`: it raised that): iteration ends after what is held."""
        self.ended, self._fault = True, fault
        self._wakeup.set()

    def pop(self) -> HarnessEvent | None:
        """The next event, without waiting; None when none is held."""
        while self._queue:
            waiting = self._queue.popleft()
            self.held_bytes -= waiting.size
            if waiting is self._update:
                self._update = None
            if waiting.event is not None:
                return waiting.event
        return None

    def delivered(self) -> int:
        """The number of the newest event delivered to this subscription (events count from 1),
        once every event the source has delivered is handed out: what a source told synchronously
        by the run (the server's approvals) is shown after the events numbered up to this."""
        self._fanout.hand_out()
        return self._delivered

    @property
    def next_number(self) -> int:
        """The number of the next event `pop` would return (or the next one delivered)."""
        return self._queue[0].number if self._queue else self._delivered + 1

    async def wait(self) -> None:
        """Return once an event is held, the subscription is cut or ended, or `wake` was called."""
        if self._queue or self.cut or self.ended:
            return
        self._wakeup.clear()
        await self._wakeup.wait()

    def wake(self) -> None:
        """End a `wait` in progress (something else for the reader to send)."""
        self._wakeup.set()

    def overflow(self) -> WatchOverflow:
        """What reading a cut subscription raises."""
        return WatchOverflow(f"a watcher of lane {self.snapshot.lane} fell {self.limit_bytes} bytes behind; "
                             "watch again (resume from the last event id)",
                             lane=self.snapshot.lane, limit_bytes=self.limit_bytes)

    async def _iterate(self) -> AsyncIterator[HarnessEvent]:
        while True:
            event = self.pop()
            if event is not None:
                yield event
            elif self.cut:
                raise self.overflow()
            elif self.ended:
                if self._fault is not None:
                    raise self._fault
                return
            else:
                await self.wait()

    def _take_all(self) -> list[HarnessEvent]:
        self._fanout.hand_out()
        taken = [waiting.event for waiting in self._queue if waiting.event is not None]
        self._queue.clear()
        self._update, self.held_bytes = None, 0
        return taken

    def _leave(self) -> None:
        self._queue.clear()
        self._update, self.held_bytes = None, 0
        self._fanout.leave(self)


class LaneFanout:
    """One lane's shared source and its subscriptions (see the module docstring). `snapshot` is
    the source's, folded with every event handed out. `stop_joining(fanout)` is told once it
    takes no new subscription, `closed(fanout)` once its source is closed."""

    def __init__(self, source: LaneEvents, stop_joining: Callable[[LaneFanout], None],
                 closed: Callable[[LaneFanout], None]) -> None:
        self.source = source
        self.snapshot: LaneSnapshot = source.snapshot
        self.subscriptions: list[Subscription] = []
        self._stop_joining, self._closed = stop_joining, closed
        self._joinable = True
        self._reading = asyncio.get_running_loop().create_task(self._read())

    def join(self, limit_bytes: int) -> Subscription:
        """A new subscription, from the current snapshot on."""
        subscription = Subscription(self, limit_bytes)
        self.subscriptions.append(subscription)
        return subscription

    def hand_out(self) -> None:
        """Hand out at once what the source has delivered and the reading task not yet read."""
        for event in self.source.buffered():
            self._deliver(event)

    def leave(self, subscription: Subscription) -> None:
        """`subscription` takes nothing more; the source is closed once no subscription is left."""
        if subscription not in self.subscriptions:
            return
        self.subscriptions.remove(subscription)
        if not self.subscriptions:
            self._no_joining()
            self.source.close()
            self._reading.cancel()
            self._closed(self)

    async def _read(self) -> None:
        try:
            async for event in self.source:
                self._deliver(event)
        except Exception as error:  # every subscription raises it after what it holds
            self._end(error)
        else:
            self._end(None)

    def _deliver(self, event: HarnessEvent) -> None:
        if self._joinable:
            try:
                self.snapshot = reduce_lane_snapshot(self.snapshot, event)
            except RebaseRequired:
                self._no_joining()
        size = 0 if isinstance(event, MessageUpdate) else len(event.model_dump_json())
        for subscription in list(self.subscriptions):  # a subscription cut leaves the list
            subscription.push(event, size)

    def _end(self, fault: BaseException | None) -> None:
        self._no_joining()
        for subscription in self.subscriptions:
            subscription.end(fault)

    def _no_joining(self) -> None:
        if self._joinable:
            self._joinable = False
            self._stop_joining(self)


class Fanouts:
    """The lanes watched in one server: each lane's fan-out that takes new watchers, by (session
    id, lane), and every fan-out whose source is open."""

    def __init__(self) -> None:
        self._joinable: dict[tuple[str, str], LaneFanout] = {}
        self._open: set[LaneFanout] = set()
        self._opening: dict[tuple[str, str], asyncio.Future[None]] = {}

    @property
    def sources(self) -> int:
        """How many lane sources (watches or follows) are open for the server's watchers now."""
        return len(self._open)

    @property
    def watchers(self) -> int:
        """How many subscriptions take events now."""
        return sum(len(fanout.subscriptions) for fanout in self._open)

    @property
    def held_bytes(self) -> int:
        """The bytes of events the subscriptions hold for their readers now (the streaming replies,
        the sources', not counted)."""
        return sum(subscription.held_bytes for fanout in self._open for subscription in fanout.subscriptions)

    async def subscribe(self, session_id: str, lane: str, open_source: Callable[[], Awaitable[LaneEvents]],
                        limit_bytes: int) -> Subscription:
        """A subscription to the lane, bounded to `limit_bytes`: one joining the lane's fan-out,
        or, when none takes watchers, one of a new fan-out of the source `open_source()` opens
        (one at a time per lane: a concurrent subscriber waits for it and joins). Raises what
        `open_source` raises."""
        key = (session_id, lane)
        while (opening := self._opening.get(key)) is not None:
            await asyncio.wait({opening})  # a waiter cancelled here leaves the opening alone
        joined = self._joinable.get(key)
        if joined is not None:
            return joined.join(limit_bytes)
        opened = self._opening[key] = asyncio.get_running_loop().create_future()
        try:
            source = await open_source()
            fanout = LaneFanout(source, lambda done: self._stop_joining(key, done), self._open.discard)
            self._joinable[key] = fanout
            self._open.add(fanout)
            return fanout.join(limit_bytes)
        finally:
            del self._opening[key]
            opened.set_result(None)

    def _stop_joining(self, key: tuple[str, str], fanout: LaneFanout) -> None:
        if self._joinable.get(key) is fanout:
            del self._joinable[key]
