"""Committing on the session line: jobs, their decisions, entries placed as a chain, and the
phase transitions of an operation, each check written once.

Every lane and harness method is one job on the session line (DESIGN.md: session line). A job's
plan reads the projection, stages writes and announces its events; the line appends the durable
ones to their lanes' event logs in the same commit (`harness.runtime.event_log`), and after the
commit the job's continuation publishes the projection, without yielding, and the line emits the
events as one batch (HA-12).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from harness.context import Context
from harness.messages import CustomMessage, Message
from harness.runtime.bus import EventBus
from harness.runtime.errors import HarnessClosed, HarnessFault, ListenerReentry
from harness.runtime.event_log import Announcement, EntryEvent, EventLog, entry_events, published
from harness.runtime.events import Fault, HarnessEvent
from harness.runtime.projection import LaneProjection
from harness.session import (
    CommitResult,
    CustomMessagePayload,
    CustomPayload,
    Entry,
    EntryPayload,
    MessagePayload,
    OwnershipLost,
    SessionMutator,
    SessionOwnership,
    addresses,
)
from harness.session.records import CancelRequested, OperationState, PendingEntry, PendingMessage

R = TypeVar("R")

Publish = Callable[[CommitResult | None], None]
"""Runs in the commit continuation, without yielding: publish the projection."""


@dataclass
class Decision(Generic[R]):
    """What a job decided: the call's return value, the events it announces (emitted after the
    commit; the lane events of a committing job are durable and logged by it) and the commit
    continuation that publishes the projection."""

    value: R
    events: Sequence[Announcement] = ()
    publish: Publish | None = None


class SessionLine:
    """The harness's session line: runs jobs one at a time on its owned session, commits what
    they staged and emits their events; remembers the first refused commit and faults the harness
    when its ownership is lost."""

    def __init__(self, bus: EventBus, event_log_limit: int) -> None:
        self.ownership: SessionOwnership | None = None  # set by the attachment
        self.bus = bus
        self.event_log = EventLog(event_log_limit)
        self.closed = False
        self.faulted = False
        self.persistence_failure: Exception | None = None

    def owner(self) -> SessionOwnership:
        assert self.ownership is not None, "use AgentHarness.create"
        return self.ownership

    def check_usable(self) -> None:
        if self.bus.delivering:
            raise ListenerReentry("a listener must not call harness operations; it would wait on itself")
        if self.faulted:
            raise HarnessFault("the harness faulted; close it and attach again")
        if self.closed:
            raise HarnessClosed("the harness is closed")

    async def run(self, plan: Callable[[SessionMutator], Awaitable[Decision[R]]], context: Context) -> R:
        """Run `plan` as one job: commit what it staged with the log items of its durable events,
        then, without yielding, its continuation publishes the projection and `emit_batch` binds
        recipients (HA-12). A job that stages nothing commits nothing and logs nothing. The job
        returns without awaiting delivery; this call awaits it after the line is released."""
        self.check_usable()
        delivered: list[asyncio.Future[None]] = []

        async def job(m: SessionMutator) -> R:
            self.check_usable()
            decision = await plan(m)
            staged = await self.event_log.stage(m, decision.events, context) if m.staged else None
            try:
                result = await m.commit() if m.staged else None
            except Exception as error:
                self.persistence_failure = self.persistence_failure or error
                self.event_log.forget()
                raise
            if staged is not None:
                self.event_log.landed(staged)
            if decision.publish is not None:
                decision.publish(result)
            # Recipients are bound at emission (HA-12): with none bound now, nobody could ever
            # receive these events, so they are not built (a headless drive, a worker).
            if decision.events and self.bus.has_recipients:
                delivered.append(self.bus.emit_batch(published(decision.events, result, staged), context))
            return decision.value

        try:
            value = await self.owner().mutate(job, context)
        except OwnershipLost as error:
            self.fault(error.code, error.message, context)
            raise HarnessFault(f"the harness lost its session: {error.message}") from error
        for future in delivered:
            await asyncio.shield(future)
        return value

    def fault(self, code: str, message: str, context: Context) -> None:
        """Stop the harness for good: emit `fault` and end every watch with `HarnessFault`."""
        if self.faulted:
            return
        self.faulted = True
        events: list[HarnessEvent] = [Fault(code=code, message=message)]
        self.bus.emit_batch(events, context)
        self.bus.end_watches(HarnessFault(f"the harness faulted: {message}", code=code))


# -- entries placed on a branch ----------------------------------------------------------------


def payload_of(message: Message) -> EntryPayload:
    if isinstance(message, CustomMessage):
        return CustomMessagePayload(message=message)
    return MessagePayload(message=message)


def pending_payload(pending: PendingEntry) -> EntryPayload:
    """The entry a queued message or custom write becomes when it is placed."""
    if isinstance(pending, PendingMessage):
        return payload_of(pending.message)
    return CustomPayload(custom_type=pending.custom_type, data=pending.data)


@dataclass
class Placement:
    """Entries staged in one commit as a chain from `parent`, each with its index among the
    commit's writes, so its `entry_added` carries its own seq."""

    parent: str | None
    staged: list[tuple[str, EntryPayload, int]] = field(default_factory=list)

    @property
    def tip(self) -> str | None:
        return self.staged[-1][0] if self.staged else self.parent

    def stage(self, m: SessionMutator, entry_id: str, payload: EntryPayload) -> None:
        position = m.staged
        m.insert_entry(payload, parent_id=self.tip, entry_id=entry_id)
        self.staged.append((entry_id, payload, position))

    def entries(self, result: CommitResult | None) -> list[Entry]:
        """The staged entries as committed by `result`, oldest first."""
        entries: list[Entry] = []
        parent = self.parent
        for entry_id, payload, position in self.staged:
            assert result is not None
            entries.append(Entry(id=entry_id, parent_id=parent, seq=result.seqs[position], timestamp=result.timestamp,
                                 payload=payload))
            parent = entry_id
        return entries

    def events(self, lane: str) -> list[EntryEvent]:
        """`message_start`, `message_end` (for messages) and `entry_added` per placed entry."""
        events: list[EntryEvent] = []
        parent = self.parent
        for entry_id, payload, position in self.staged:
            events += entry_events(lane, entry_id, parent, payload, position)
            parent = entry_id
        return events

    def publish(self, projection: LaneProjection, result: CommitResult | None) -> None:
        """In a commit continuation: the tip moves to the end of the placement and the cached
        branch grows by its entries."""
        projection.move_tip(self.tip, self.entries(result))


# -- operation phases ----------------------------------------------------------------------------

S = TypeVar("S")


def current_phase(projection: LaneProjection, operation_id: str, *, intent: bool = False) -> OperationState | None:
    """The current phase of operation `operation_id` while it is still the lane's current one; with
    `intent`, None once an abort was requested too: an intent is not committed under an abort,
    while an outcome always is, since admitted work must settle."""
    state, meta = projection.operation_state, projection.meta
    if state is None or meta is None or meta.operation_id != operation_id:
        return None
    if intent and isinstance(state.control, CancelRequested):
        return None
    return state


def live_phase(projection: LaneProjection, operation_id: str, phase: type[S], *, intent: bool = False) -> S | None:
    """`current_phase`, when it is of type `phase`."""
    state = current_phase(projection, operation_id, intent=intent)
    return state if isinstance(state, phase) else None


def abort_requested(projection: LaneProjection) -> bool:
    """True when the lane's current operation carries a durable abort request."""
    state = projection.operation_state
    return state is not None and isinstance(state.control, CancelRequested)


@dataclass(frozen=True)
class Transition:
    """An operation's next phase as a value: `state` (or a function of the current one) replaces
    the whole phase, keeping its control field, committed with `stage`'s writes; `events` are
    emitted after, once `publish` has published what `stage` changed besides the phase. An
    `intent` (the commit before an effect) is refused under an abort."""

    state: OperationState | Callable[[OperationState], OperationState]
    stage: Callable[[SessionMutator], None] | None = None
    events: Callable[[], Sequence[Announcement]] | None = None
    publish: Publish | None = None
    intent: bool = False


async def commit_transition(line: SessionLine, projection: LaneProjection, operation_id: str,
                            transition: Transition, context: Context) -> bool:
    """Commit `transition` for operation `operation_id`; False (nothing written) when the
    operation is no longer current, or for an intent, once an abort was requested."""

    async def plan(m: SessionMutator) -> Decision[bool]:
        current = current_phase(projection, operation_id, intent=transition.intent)
        if current is None:
            return Decision(False)
        make = transition.state
        new_state = make(current) if callable(make) else make
        if new_state.control != current.control:
            new_state = new_state.model_copy(update={"control": current.control})
        if transition.stage is not None:
            transition.stage(m)  # first, so an entry it inserts is write 0 of the commit
        m.set(addresses.operation_state(operation_id), new_state)

        def publish(result: CommitResult | None) -> None:
            projection.operation_state = new_state
            if transition.publish is not None:
                transition.publish(result)

        return Decision(True, transition.events() if transition.events is not None else (), publish)

    return await line.run(plan, context)
