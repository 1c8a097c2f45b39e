"""A watch of a lane from a process that does not hold its session (`follow_lane`): the snapshot,
then every durable event after it from the lane's event log, and the streaming reply rebuilt from
the frame pages its driver persists. The owner's `Lane.watch` gives the same story in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from harness.context import Context
from harness.runtime.errors import FollowBehind, SnapshotContended
from harness.runtime.event_log import LogRead, lane_events, newest_event_seq
from harness.runtime.events import HarnessEvent, MessageUpdate
from harness.runtime.projection import read_lane_projection
from harness.runtime.snapshot import FrameReader, LanePresentation, capture_snapshot
from harness.runtime.types import LaneSnapshot
from harness.session import ChangeSubscription, SessionReader, StorageCorruption, Store, addresses
from harness.session.records import AssistantEffectPending, DeferredEffectPending, OperationState

FOLLOW_POLL_S = 0.5
"""How often a follow reads the journal when no change notification comes (seconds): the whole
latency of another process's commit on SQLite and memory stores, a fallback otherwise (commits of
this process, and on PostgreSQL of any process, notify)."""

EVENT_PAGE = 500
"""Durable events a follow reads from the lane's log at once."""

SNAPSHOT_ATTEMPTS = 100
"""How many times a follow's snapshot is read again when events landed while it was read."""


class LaneFollow:
    """A follow of one lane (`follow_lane`): `snapshot`, then, through `async for`, every durable
    event committed after it, exactly once, in order, each with its `event_seq`, and
    `MessageUpdate`s of the streaming reply in between (no `event_seq`: presentation).

    Iteration ends at `close()`; it raises `FollowBehind` when the lane's log was trimmed past the
    follow's position (take a new follow: a fresh snapshot), `StorageCorruption` when a logged
    event or its entry no longer decodes, and the store's errors when it cannot be read."""

    def __init__(self, reader: SessionReader, snapshot: LaneSnapshot, frames: FrameReader | None,
                 operation: tuple[str | None, OperationState | None], changes: ChangeSubscription, poll_s: float,
                 context: Context) -> None:
        self.snapshot = snapshot
        self._reader = reader
        self._lane = snapshot.lane
        self._position = snapshot.event_seq
        self._frames = frames
        self._unshown: MessageUpdate | None = None
        self._operation = operation  # the lane's current operation and its state, as last read
        self._changes = changes
        self._poll_s = poll_s
        self._context = context
        self._closed = False

    @property
    def event_seq(self) -> int | None:
        """The durable event the follow has delivered up to (the snapshot's until the first)."""
        return self._position

    def __aiter__(self) -> AsyncIterator[HarnessEvent]:
        return self._follow()

    def close(self) -> None:
        """Stop following: iteration ends at its next step. Idempotent."""
        self._closed = True
        self._changes.close()
        self._changes.wake()  # a wait in progress returns now

    async def _follow(self) -> AsyncIterator[HarnessEvent]:
        try:
            while not self._closed:
                events, update, again = await self._look()
                for event in events:
                    if self._closed:
                        return
                    self._position = event.event_seq
                    yield event
                if update is not None:
                    yield update
                elif not again:
                    await self._changes.wait(self._poll_s)
        finally:
            self._changes.close()

    async def _look(self) -> tuple[tuple[HarnessEvent, ...], MessageUpdate | None, bool]:
        """One look at the lane: the durable events after the position (a page), the streaming
        reply's update to show after them if its frames grew and no durable event came after the
        page, and whether to look again at once (more events wait, or a new reply's frames are
        to be read). One batch of reads (`ReadBatch`: the log page, its bounds and floor, the
        lane's state, its operation's, the reply's new frame pages, the log's newest seq again),
        then the entries the events are made of; a new operation's state is one more read."""
        reader, lane, context = self._reader, self._lane, self._context
        batch = reader.batch()
        log = LogRead(batch, lane, self._position, EVENT_PAGE)
        state = batch.get(addresses.lane_state(lane))
        known_id = self._operation[0]
        known = batch.get(addresses.operation_state(known_id)) if known_id is not None else None
        frames = self._frames
        pages = frames.queue(batch) if frames is not None else None
        newest = batch.list_bounds(lane_events(lane))  # after the frames: an update waits for every event before it
        await batch.run(context)
        page = await log.page(reader, context)
        if self._position is not None and not page.holds:
            raise FollowBehind(f"the event log of lane {lane} no longer holds event {self._position}; "
                               "follow again from a fresh snapshot", lane=lane, event_seq=self._position)
        events = page.events
        position = events[-1].event_seq if events else self._position
        again = len(events) == EVENT_PAGE

        # Every commit that changes the lane's operation logs an event (HA-13): an update is shown
        # only when no event came after the page, so the state read beside it is the page's.
        operation_id = state.value.current_operation_id if state.value is not None else None
        operation: OperationState | None = None
        if operation_id == known_id:
            operation = known.value if known is not None else None
        elif operation_id is not None:
            operation = await reader.get(addresses.operation_state(operation_id), context)
        self._operation = (operation_id, operation)
        if not isinstance(operation, AssistantEffectPending | DeferredEffectPending) or frames is None or (
                frames.operation_id, frames.response_entry_id) != (operation_id, operation.response_entry_id):
            self._frames, self._unshown = FrameReader.of(operation_id, operation), None
            again = again or self._frames is not None  # its pages are read at the next look
        elif pages is not None:
            message = await frames.take(pages.value, reader, context)
            if message is not None:
                self._unshown = MessageUpdate(lane=lane, message=message)
        update = None
        if self._unshown is not None:
            bounds = newest.value
            if not again and (bounds[1] if bounds else None) == position:
                update, self._unshown = self._unshown, None
            else:
                again = True  # events came first: read them at once
        return events, update, again


async def follow_lane(store: Store, session_id: str, lane: str, context: Context, *,
                      poll_s: float = FOLLOW_POLL_S) -> LaneFollow:
    """Follow lane `lane` of session `session_id` from any process, whoever drives it (a worker,
    another server, nobody): the contract of `Lane.watch` (HA-7, HA-13) without holding the
    session. `context` is used for every read the follow makes until it is closed.

    The snapshot (its status `open` or `aborting`: no drive of this process runs it) is current
    to its `event_seq`, read with a seqlock: the lane's newest event seq is read before the
    snapshot and again at its end (`LaneSnapshot.event_seq`), and the read is repeated until the
    two agree. Every commit that changes what a snapshot shows logs a lane event (a snapshot
    folded with its events equals a fresh one, HA-13), so no commit landed in between; frames
    and checkpoints are presentation, unordered by events. This works on every backend and
    holds no transaction or pooled connection open while a client reads slowly. After
    `SNAPSHOT_ATTEMPTS` readings that each saw new events, `SnapshotContended`.

    Then the follow reads the log after the snapshot (`read_lane_events`) at every wake-up: a
    change notification (`Store.changes`: a commit through the same store object wakes it at
    once; on PostgreSQL every commit of any process notifies inside its transaction, one
    listening connection per store shared by every follow) or, without one, every `poll_s`
    seconds. The streaming reply comes from the frame pages the driver persists
    every `frame_interval_s` (`MessageUpdate`, no `event_seq`), not from a NOTIFY payload:
    pages are durable, so a follower that wakes late or starts mid-reply reads the same text,
    they have no 8,000-byte payload limit, and the journal stays the one source of truth; the
    cost is latency, one `frame_interval_s`. Tool progress is not followed.

    Raises `SessionNotFound`, `UnknownLane`, `StorageCorruption` (a required payload is missing)
    and `SnapshotContended`."""
    reader = await store.open_session(session_id, context)
    # Subscribe first: a commit after the snapshot read must wake the follow.
    changes = store.changes.subscribe(session_id)
    try:
        captured = await _capture(reader, lane, context)
    except BaseException:
        changes.close()
        raise
    snapshot, frames, operation = captured
    return LaneFollow(reader, snapshot, frames, operation, changes, poll_s, context)


async def _capture(reader: SessionReader, lane: str, context: Context
                   ) -> tuple[LaneSnapshot, FrameReader | None, tuple[str | None, OperationState | None]]:
    for _ in range(SNAPSHOT_ATTEMPTS):
        before = await newest_event_seq(reader, lane, context)
        try:
            projection = await read_lane_projection(reader, lane, context)
            frames = FrameReader.of(projection.state.current_operation_id, projection.operation_state)
            live = LanePresentation(streaming_message=None if frames is None else await frames.read(reader, context))
            snapshot = await capture_snapshot(reader, projection.view(running=False), live, context)
        except StorageCorruption:
            # Records read on either side of a commit can contradict each other: read again,
            # unless nothing committed meanwhile, when the journal itself is damaged.
            if await newest_event_seq(reader, lane, context) != before:
                await asyncio.sleep(0)
                continue
            raise
        if snapshot.event_seq == before:
            return snapshot, frames, (projection.state.current_operation_id, projection.operation_state)
    raise SnapshotContended(f"lane {lane} kept changing while its snapshot was read", lane=lane,
                            attempts=SNAPSHOT_ATTEMPTS)
