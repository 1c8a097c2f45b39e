"""Failure drain and settlement: the terminal commit of an operation, and the way into
`failure_drain` with a machine-readable error (HA-23, HA-26)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import Enum
from typing import Literal

from pydantic import JsonValue

from harness.messages import now_ms
from harness.runtime.commit import Decision, Placement, Publish, Transition, payload_of, pending_payload
from harness.runtime.drive.operation import DrivenOperation
from harness.runtime.event_log import Announcement
from harness.runtime.events import NavigationEnd, RunEnd
from harness.runtime.fault_points import FaultPoint, reached
from harness.runtime.hooks import OperationEnding
from harness.runtime.outcomes import Settled
from harness.runtime.snapshot import queued_item
from harness.session import (
    AbortCause,
    CommitResult,
    CustomMessagePayload,
    Entry,
    EntryPayload,
    LaneLastResult,
    MessagePayload,
    OperationErrorRecord,
    SessionMutator,
    StorageCorruption,
    addresses,
)
from harness.session.ids import new_id
from harness.session.records import (
    CancelRequested,
    FailureDrain,
    FailureProvenance,
    MayFinish,
    OperationState,
    RunCheckpoint,
    RunIntent,
)

DOES_NOT_FIT = ("the conversation no longer fits the model's context window: go back to an entry before the "
                "largest one, or to the start of the session (in the chat: /tree, where 0 is the start), or "
                "fork the session from an earlier entry (/fork)")
"""The way out a run names when its context cannot be made to fit: moving the tip back
(navigation) to before the entry that is too big; compacting again cannot remove the latest turn."""


class KeepTip(Enum):
    """The settlement leaves the tip where it is (a tip of None is the empty branch)."""

    KEEP = "keep"


def failure(code: str, message: str, details: dict[str, JsonValue] | None, provenance: str) -> Transition:
    """Into `failure_drain` with a machine-readable error and its provenance (HA-23, HA-26)."""
    return Transition(FailureDrain(error=OperationErrorRecord(code=code, message=message, details=details),
                                   provenance=FailureProvenance.model_validate({"kind": provenance})))


async def settle(
    op: DrivenOperation,
    state: OperationState,
    outcome: Literal["completed", "failed", "aborted"],
    *,
    error: OperationErrorRecord | None = None,
    abort_cause: AbortCause | None = None,
    stage: Callable[[SessionMutator], None] | None = None,
    entries: Sequence[EntryPayload] = (),
    tip: str | KeepTip | None = KeepTip.KEEP,
    events_before: Callable[[], Sequence[Announcement]] | None = None,
    publish_before: Publish | None = None,
    fault: FaultPoint = FaultPoint.BEFORE_TERMINAL_SETTLEMENT,
) -> Settled | None:
    """The terminal commit: `stage`'s final writes (moving the tip to `tip`, where None is the
    empty branch before the session's first entry), clean up the operation, drain steer and
    follow-up items that were not placed, place `entries` (a run's recorded answer) at the end of
    the branch, write the lane's last result, go idle; emits
    `events_before` (made after `stage` ran; `publish_before` publishes what it placed), then
    `run_end`.

    Decided on the line from the current projection: an abort requested meanwhile makes a
    completion `aborted`; steer or follow-up input that arrived since the last boundary makes
    it not settle at all (None, nothing written: the run goes on to place it). A run aborted
    before it replied may be discarded by the `discard_turn` hook: the tip goes back to before
    its first user message in this commit, and `navigation_end` is emitted before `run_end`."""
    reached(fault)
    projection, lane_name = op.projection, op.lane.name
    meta = projection.meta
    assert meta is not None
    final_assistant = _final_assistant(state)

    async def plan(m: SessionMutator) -> Decision[Settled | None]:
        nonlocal outcome, abort_cause
        current = projection.operation_state
        control = current.control if current is not None else state.control
        if isinstance(control, CancelRequested) and outcome == "completed":
            outcome, abort_cause = "aborted", control.cause
        lane_state = projection.state
        queued_steer, queued_follow = lane_state.ids_of("steer"), lane_state.ids_of("follow_up")
        if outcome == "completed" and meta.intent.kind == "run" and (queued_steer or queued_follow):
            return Decision(None)
        drained_steer = list(control.drained_steer) if isinstance(control, CancelRequested) else []
        drained_follow = list(control.drained_follow_up) if isinstance(control, CancelRequested) else []
        drained_steer += queued_steer  # never left behind for a run that did not ask for them
        drained_follow += queued_follow
        await projection.load_inbox(m, op.context, [*drained_steer, *drained_follow])
        if stage is not None:
            stage(m)
        # Pending writes are never stranded: whatever arrived after the last boundary is placed
        # by the terminal commit.
        writes = [item.entry_id for item in lane_state.inbox if item.kind == "write"]
        from_tip = projection.tip_id if tip is KeepTip.KEEP else tip
        ending = await _ending(op, m, outcome, error, abort_cause, from_tip, replied=final_assistant is not None)
        if ending.discardable and op.hooks.discard_turn is not None and op.hooks.discard_turn(ending):
            ending = replace(ending, discarded=True)
        placement = Placement(ending.prompt_parent if ending.discarded else from_tip)
        for payload in ending.kept if ending.discarded else ():
            placement.stage(m, new_id(), payload)
        for payload in entries:
            placement.stage(m, new_id(), payload)
        for entry_id in writes:
            placement.stage(m, entry_id, pending_payload(projection.pending[entry_id]))
            m.delete(addresses.pending_entry(entry_id))
        if op.hooks.settlement_messages is not None:
            for message in op.hooks.settlement_messages(ending):
                placement.stage(m, new_id(), payload_of(message))
        new_tip = placement.tip
        if placement.staged or ending.discarded:
            m.set(addresses.branch_tip(lane_name), new_tip)
        result = LaneLastResult.model_validate({
            "operation_id": op.operation_id, "kind": meta.intent.kind, "outcome": outcome,
            "tip_id": new_tip, "final_assistant_entry_id": final_assistant,
            "error": error.model_dump() if error else None, "abort_cause": abort_cause,
            "started_at": meta.started_at, "ended_at": now_ms(),
        })
        drained = set(drained_steer) | set(drained_follow)
        removed = drained | set(writes)
        idle = lane_state.model_copy(update={
            "current_operation_id": None,
            "inbox": [i for i in lane_state.inbox if i.entry_id not in removed],
        })
        m.delete(addresses.operation_meta(op.operation_id))
        m.delete(addresses.operation_state(op.operation_id))
        for entry_id in drained:
            m.delete(addresses.pending_entry(entry_id))
        m.set(addresses.lane_last_result(lane_name), result)
        m.set(addresses.lane_state(lane_name), idle)
        steer = tuple(queued_item(i, projection.pending[i]) for i in drained_steer)
        follow_up = tuple(queued_item(i, projection.pending[i]) for i in drained_follow)
        settled = Settled(operation_id=op.operation_id, result=result, steer=steer, follow_up=follow_up)

        events: list[Announcement] = [*(events_before() if events_before else ())]
        if ending.discarded:  # the branch changed under every transcript: watchers take a new snapshot
            events.append(NavigationEnd(lane=lane_name, operation_id=op.operation_id, status="completed",
                                        from_tip_id=from_tip, tip_id=ending.prompt_parent))
        events += placement.events(lane_name)
        if any(i in projection.pending for i in removed):
            events.append(projection.queue_update(idle))
        events.append(RunEnd(lane=lane_name, operation_id=op.operation_id, result=result))

        def publish(commit: CommitResult | None) -> None:
            assert commit is not None
            projection.meta = projection.operation_state = None
            projection.state, projection.last_result = idle, result
            # `publish_before` first: it may publish what `stage` placed (a compaction entry), and
            # the writes placed here continue that, so the tip ends at the last of them.
            if publish_before is not None:
                publish_before(commit)
            placement.publish(projection, commit)
            for entry_id in removed:
                projection.pending.pop(entry_id, None)

        return Decision(settled, events, publish)

    return await op.run(plan)


async def settle_with_reply(op: DrivenOperation, reply: Transition) -> Settled | Transition | None:
    """A reply's settlement `reply` and, when it ends the run, the run's terminal commit, as one
    commit: a crash before it leaves the reply's intent (the reply is asked again, HA-24), after
    it the settled run, and no phase between them has anything a restart needs. Only when nothing
    may run between the two: the run may finish with the reply (no tool calls), no
    `before_run_end` hook, no answer shape to check (`RunIntent.output`), no abort requested,
    and, decided on the line, no steer or follow-up queued; otherwise `reply` itself, for the
    checkpoint after it to place what came."""
    state, meta = reply.state, op.projection.meta
    if not (isinstance(state, RunCheckpoint) and isinstance(state.continuation, MayFinish)
            and op.hooks.before_run_end is None and not op.aborting
            and meta is not None and isinstance(meta.intent, RunIntent) and meta.intent.output is None):
        return reply
    # The tip ends at the reply (its trigger), or where it was when an empty abort wrote none.
    settled = await settle(op, state, "completed", stage=reply.stage, tip=state.trigger_entry_id,
                           events_before=reply.events, publish_before=reply.publish,
                           fault=FaultPoint.BEFORE_FINAL_REPLY_SETTLEMENT)
    return reply if settled is None else settled


async def _ending(op: DrivenOperation, m: SessionMutator, outcome: Literal["completed", "failed", "aborted"],
                  error: OperationErrorRecord | None, abort_cause: AbortCause | None, tip: str | None, *,
                  replied: bool) -> OperationEnding:
    """How the operation is about to settle, its branch ending at `tip`. An aborted run not known
    to have `replied` (placed an assistant message with text, thinking or a tool call; a reply cut
    before any of them is not placed) is `discardable` when its branch from `tip` back to the tip
    it was accepted on holds no reply and one of its user messages: the walk costs O(entries since
    its newest reply) (before any output: the entries its acceptance placed), read from the cached
    branch when it holds them; the custom messages placed after its first user message are `kept`
    for a discard to place again. Any other ending reads nothing."""
    meta = op.projection.meta
    assert meta is not None
    ending = OperationEnding(lane=op.lane.name, operation_id=op.operation_id, kind=meta.intent.kind,
                             outcome=outcome, error=error, abort_cause=abort_cause)
    if meta.intent.kind != "run" or outcome != "aborted" or replied:
        return ending
    first_user: Entry | None = None
    custom: list[Entry] = []  # newest first, as walked
    kept: list[Entry] = []  # those placed after `first_user`
    entry_id = tip
    while entry_id is not None and entry_id != meta.source_tip_id:
        entry = op.projection.cached_entry(entry_id) or await m.entry(entry_id, op.context)
        if entry is None:
            raise StorageCorruption(f"entry {entry_id} on the branch of run {op.operation_id} is missing",
                                    entry_id=entry_id)
        if isinstance(entry.payload, MessagePayload):
            if entry.payload.message.role == "assistant":
                return ending
            if entry.payload.message.role == "user":
                first_user, kept = entry, list(custom)
        elif isinstance(entry.payload, CustomMessagePayload):
            custom.append(entry)
        entry_id = entry.parent_id
    if first_user is None:
        return ending
    return replace(ending, prompt_parent=first_user.parent_id, discardable=True,
                   kept=tuple(entry.payload for entry in reversed(kept)))


def _final_assistant(state: OperationState) -> str | None:
    if (isinstance(state, RunCheckpoint) and isinstance(state.continuation, MayFinish)
            and state.continuation.include_final_assistant):
        return state.trigger_entry_id
    return None
