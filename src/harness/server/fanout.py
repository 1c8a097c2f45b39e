"""One source per watched lane per server, fanned out in memory to every watcher of it (issue 29).

The watchers of one conversation's lane in one server share a `LaneFanout`: one source (the live
lane's watch, or a follow of the lane whoever drives it, `follow_lane`), read by one task, which
hands every event to each watcher's `Subscription`. So a server with 200 watchers of a lane holds
one watch of it, or reads the store once per wake-up of one follow, not 200 times. The fan-out
keeps the source's snapshot folded with every event it has handed out (`reduce_lane_snapshot`):
a watcher that joins later starts from that snapshot, current to the shared position, and then
gets every later event, exactly once, in order. A navigation cannot be folded (the branch changed
under the transcript): that fan-out then takes no new watcher, and the next one opens a source of
its own.

A client that reconnects with its last event id is served from memory when it can be: the
fan-out keeps its newest durable events (at most `RECENT_EVENTS`, and `RECENT_BYTES` of their
JSON), and a subscription's `read_events` answers from them when they hold every event after the
one asked for; otherwise it reads the lane's log, as a watch does. A door that reads the log
without a subscription of its own (the LangGraph door's check that a run is still logged) reads
through `Fanouts.read_events`, from the same memory. A source whose last watcher
left stays open `grace_s` more, so the watchers of a reconnect storm find it, their resume read
from memory; it is closed once the grace ends with nobody back, or at once when it ended (the
server let go of the conversation: a live watch ends then, and the next watcher opens a follow).

A subscription holds what its reader has not read yet, bounded in bytes, not events: each waiting
event counts its JSON size, and one that would take the subscription past its `limit_bytes` cuts
it: its events are dropped and reading it raises `WatchOverflow` (a client resumes from its last
event id). A subscription that holds nothing takes one event of any size, so a reader that keeps
up is never cut by one large event (a long reply's end). The streaming reply is the exception:
each `MessageUpdate` carries the whole reply so far, so a subscription holds at most one, the
newest (a newer one takes its place, and the reply's end, a new reply or the run's end drops it):
the same reply the fan-out's snapshot holds, the shared source's, counted once for the server
and not per watcher.

Every watcher of a lane is handed the same `Delivered` for an event: a door that sends the same
bytes to each of its clients for it (the native watch's SSE) encodes it once, for the first
watcher that sends it, and the others send those bytes (`Delivered.encoded`). What depends on what
a client was sent before (the native watch's `message_delta`: what the streaming reply gained
since the one it has) is encoded once per such reply: the watchers of a lane that were sent the
same updates hold the same reply object, so they share one encoding too."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from harness.context import Context
from harness.conversation import LaneEvents
from harness.runtime import (
    HarnessEvent,
    LaneEventPage,
    LaneSnapshot,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RebaseRequired,
    RunEnd,
    WatchOverflow,
    read_lane_events,
    reduce_lane_snapshot,
)
from harness.session import SessionReader

CLIENT_BUFFER_BYTES = 4 * 1024 * 1024
"""Bytes of events a watcher may fall behind by (their JSON size) before it is cut."""

RECENT_EVENTS = 512
"""Durable events a fan-out keeps, the newest, to serve resumes from memory."""

RECENT_BYTES = 256 * 1024
"""Bytes of durable events (their JSON size) a fan-out keeps at most for resumes."""

SOURCE_GRACE_S = 5.0
"""How long a lane's source stays open after its last watcher left (seconds)."""

S = TypeVar("S")

_REPLY_ENDS = (MessageStart, MessageEnd, RunEnd)
"""Events after which the streaming reply a subscription may hold unread is no longer the newest."""


@dataclass(slots=True, eq=False)
class Delivered:
    """An event as the fan-out hands it to every subscription of its lane, with its JSON `size`
    (0 for a `MessageUpdate`: the streaming reply is the fan-out's, not a subscription's)."""

    event: HarnessEvent
    size: int
    # (encode, id(shown)) -> (shown, its encoding): `shown` kept, so its id names it while it is here
    _encodings: dict[tuple[Callable[..., bytes], int], tuple[object, bytes]] = field(default_factory=dict)

    def encoded(self, encode: Callable[[HarnessEvent, S], bytes], shown: S) -> bytes:
        """`encode(event, shown)`, computed once for every subscription that asks with the same
        `encode` and the same `shown` object (what its client was sent before, or None: `encode`
        is a function of the two alone, the event read-only and the same for all of them)."""
        key = (encode, id(shown))
        found = self._encodings.get(key)
        if found is None or found[0] is not shown:
            found = self._encodings[key] = (shown, encode(self.event, shown))
        return found[1]


@dataclass(slots=True)
class _Waiting:
    """An event a subscription holds for its reader: its `number` in the order delivered, and its
    size (the `Delivered`'s, 0 for the streaming reply); `delivered` None once it was dropped."""

    number: int
    delivered: Delivered | None
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

    def push(self, delivered: Delivered) -> None:
        """Hold `delivered` for the reader; cut the subscription instead when it would hold more
        than `limit_bytes`."""
        if self.cut or self.ended:
            return
        event = delivered.event
        if isinstance(event, MessageUpdate) and self._update is not None:
            self._update.delivered = delivered
            self._wakeup.set()
            return
        if isinstance(event, _REPLY_ENDS) and self._update is not None:
            self._update.delivered, self._update = None, None
        if self._queue and self.held_bytes + delivered.size > self.limit_bytes:
            self.cut, self.held_bytes = True, 0
            self._queue.clear()
            self._update = None
            self._fanout.leave(self)  # nothing more reaches it: a reconnect resumes from the log
        else:
            self._delivered += 1
            waiting = _Waiting(self._delivered, delivered, delivered.size)
            self._queue.append(waiting)
            self.held_bytes += waiting.size
            if isinstance(event, MessageUpdate):
                self._update = waiting
        self._wakeup.set()

    def end(self, fault: BaseException | None) -> None:
        """The source ended (with `fault`: it raised that): iteration ends after what is held."""
        self.ended, self._fault = True, fault
        self._wakeup.set()

    def pop(self) -> Delivered | None:
        """The next event (as every subscription of the lane is handed it), without waiting;
        None when none is held."""
        while self._queue:
            waiting = self._queue.popleft()
            self.held_bytes -= waiting.size
            if waiting is self._update:
                self._update = None
            if waiting.delivered is not None:
                return waiting.delivered
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
            delivered = self.pop()
            if delivered is not None:
                yield delivered.event
            elif self.cut:
                raise self.overflow()
            elif self.ended:
                if self._fault is not None:
                    raise self._fault
                return
            else:
                await self.wait()

    async def read_events(self, after_seq: int | None, limit: int, context: Context) -> LaneEventPage:
        """The lane's logged events after `after_seq`, at most `limit`: from the fan-out's recent
        events, with no store read, when they hold the one right after it; else from the log
        (`LaneEvents.read_events`)."""
        page = self._fanout.recent_after(after_seq, limit)
        return page if page is not None else await super().read_events(after_seq, limit, context)

    def _take_all(self) -> list[HarnessEvent]:
        self._fanout.hand_out()
        taken = [waiting.delivered.event for waiting in self._queue if waiting.delivered is not None]
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
    takes no new subscription, `closed(fanout)` once its source is closed: `grace_s` seconds
    after its last subscription left with none joining meanwhile, or as soon as nobody is
    subscribed and it takes no new subscription (its source ended, a navigation, `close`)."""

    def __init__(self, source: LaneEvents, stop_joining: Callable[[LaneFanout], None],
                 closed: Callable[[LaneFanout], None], *, grace_s: float = 0.0) -> None:
        self.source = source
        self.snapshot: LaneSnapshot = source.snapshot
        self.subscriptions: list[Subscription] = []
        self._stop_joining, self._closed = stop_joining, closed
        self._grace_s = grace_s
        self._joinable = True
        self._idle: asyncio.TimerHandle | None = None  # closes the source when the grace ends
        self._recent: deque[tuple[int, HarnessEvent, int]] = deque()  # (event seq, event, JSON size), oldest first
        self._recent_bytes = 0
        # Every logged event after this seq is kept (None: after the oldest kept): the source
        # delivers each once, in order, from its snapshot on.
        self._recent_after = source.snapshot.event_seq
        self._reading = asyncio.get_running_loop().create_task(self._read())

    def join(self, limit_bytes: int) -> Subscription:
        """A new subscription, from the current snapshot on."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        subscription = Subscription(self, limit_bytes)
        self.subscriptions.append(subscription)
        return subscription

    def recent_after(self, after_seq: int | None, limit: int) -> LaneEventPage | None:
        """The logged events after `after_seq`, at most `limit`, from those kept; None unless they
        hold every one after it (a lane's event seqs grow, with gaps: the seqs between two
        commits' events belong to other records) and one at least."""
        recent = self._recent
        if after_seq is None or not recent:
            return None
        kept_after = recent[0][0] if self._recent_after is None else self._recent_after
        if not kept_after <= after_seq < recent[-1][0]:
            return None
        events = itertools.islice((event for seq, event, _ in recent if seq > after_seq), limit)
        return LaneEventPage(events=tuple(events), holds=True, newest_seq=recent[-1][0])

    def hand_out(self) -> None:
        """Hand out at once what the source has delivered and the reading task not yet read."""
        for event in self.source.buffered():
            self._deliver(event)

    def leave(self, subscription: Subscription) -> None:
        """`subscription` takes nothing more; the source is closed once no subscription is left."""
        if subscription not in self.subscriptions:
            return
        self.subscriptions.remove(subscription)
        if self.subscriptions:
            return
        if self._joinable and self._grace_s > 0:
            self._idle = asyncio.get_running_loop().call_later(self._grace_s, self.close)
        else:
            self.close()

    def close(self) -> None:
        """Close the source: the subscriptions left end after what they hold. Idempotent."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
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
        delivered = Delivered(event, 0 if isinstance(event, MessageUpdate) else len(event.model_dump_json()))
        if event.event_seq is not None:
            self._keep(event.event_seq, event, delivered.size)
        for subscription in list(self.subscriptions):  # a subscription cut leaves the list
            subscription.push(delivered)

    def _keep(self, seq: int, event: HarnessEvent, size: int) -> None:
        """Keep durable event `seq` among the recent ones, within `RECENT_EVENTS` and `RECENT_BYTES`."""
        recent = self._recent
        recent.append((seq, event, size))
        self._recent_bytes += size
        while len(recent) > RECENT_EVENTS or (self._recent_bytes > RECENT_BYTES and len(recent) > 1):
            self._recent_after, _, dropped = recent.popleft()
            self._recent_bytes -= dropped

    def _end(self, fault: BaseException | None) -> None:
        self._no_joining()
        for subscription in self.subscriptions:
            subscription.end(fault)
        if not self.subscriptions:  # in its grace: nobody to tell, and nobody may join
            self.close()

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
                        limit_bytes: int, *, grace_s: float = 0.0) -> Subscription:
        """A subscription to the lane, bounded to `limit_bytes`: one joining the lane's fan-out
        (one in its grace too), or, when none takes watchers, one of a new fan-out of the source
        `open_source()` opens (one at a time per lane: a concurrent subscriber waits for it and
        joins), kept open `grace_s` seconds after its last watcher left. Raises what
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
            fanout = LaneFanout(source, lambda done: self._stop_joining(key, done), self._open.discard,
                                grace_s=grace_s)
            self._joinable[key] = fanout
            self._open.add(fanout)
            return fanout.join(limit_bytes)
        finally:
            del self._opening[key]
            opened.set_result(None)

    async def read_events(self, reader: SessionReader, lane: str, after_seq: int | None, limit: int,
                          context: Context) -> LaneEventPage:
        """Lane `lane`'s logged events after `after_seq`, at most `limit`, of `reader`'s session:
        from the memory of the lane's fan-out, with no store read, when it holds the one right
        after it (`LaneFanout.recent_after`); else from the log (`read_lane_events`)."""
        fanout = self._joinable.get((reader.id, lane))
        page = fanout.recent_after(after_seq, limit) if fanout is not None else None
        return page if page is not None else await read_lane_events(reader, lane, after_seq, limit, context)

    def close(self) -> None:
        """Close every source (the server stops): their watchers end after what they hold."""
        for fanout in list(self._open):
            fanout.close()

    def _stop_joining(self, key: tuple[str, str], fanout: LaneFanout) -> None:
        if self._joinable.get(key) is fanout:
            del self._joinable[key]
