"""Harness events: the closed union every listener and watcher receives (HA-12 to HA-15).

Lane-scoped events carry `lane`; session-wide ones (`value_update`, `handler_error`, `fault`)
do not. Payloads are frozen models; the bus hands every recipient of an emission one form of each
event whose lists and dicts are read-only too (`bus.read_only`, HA-10).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from harness.context import Context
from harness.messages import AssistantMessage, Message, ModelIdentity, ThinkingLevel, ToolResultMessage, Usage
from harness.session import AbortCause, Entry, LaneConfig, LaneLastResult, OperationErrorRecord, OperationKind


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Published(_Event):
    event_seq: int | None = None
    """The event's number in its lane's event log when it describes a committed fact (a durable
    event), else None (live presentation, session-wide values, faults); see `harness.runtime.event_log`."""


class QueuedItem(_Event):
    """A queued message waiting on a lane, by its pre-minted entry id."""

    entry_id: str
    message: Message


class PendingWrite(_Event):
    """An append made while an operation was open, placed at the next safe point."""

    entry_id: str
    type: Literal["message", "custom"]
    message: Message | None = None
    custom_type: str | None = None
    data: JsonValue = None


class Queues(_Event):
    steer: tuple[QueuedItem, ...] = ()
    follow_up: tuple[QueuedItem, ...] = ()
    next_run: tuple[QueuedItem, ...] = ()


class RunStart(_Published):
    type: Literal["run_start"] = "run_start"
    lane: str
    operation_id: str
    kind: OperationKind
    started_at: int


class RunEnd(_Published):
    """The operation settled; `result` is the lane's new last result."""

    type: Literal["run_end"] = "run_end"
    lane: str
    operation_id: str
    result: LaneLastResult


class RunSuspend(_Published):
    type: Literal["run_suspend"] = "run_suspend"
    lane: str
    operation_id: str
    reason: Literal["deferred"] = "deferred"
    deferred: DeferredHandle
    poll: int


class RunResume(_Published):
    type: Literal["run_resume"] = "run_resume"
    lane: str
    operation_id: str


class OperationAbort(_Published):
    """A durable abort request was committed; `steer` and `follow_up` are the drained items."""

    type: Literal["operation_abort"] = "operation_abort"
    lane: str
    operation_id: str
    cause: AbortCause
    steer: tuple[QueuedItem, ...] = ()
    follow_up: tuple[QueuedItem, ...] = ()


class MessageStart(_Published):
    type: Literal["message_start"] = "message_start"
    lane: str
    message: Message


class MessageUpdate(_Published):
    """Live presentation of a streaming assistant reply (not yet durable)."""

    type: Literal["message_update"] = "message_update"
    lane: str
    message: AssistantMessage


class MessageEnd(_Published):
    type: Literal["message_end"] = "message_end"
    lane: str
    message: Message
    entry_id: str | None = None


class EntryAdded(_Published):
    """`entry` is committed and readable; it is the lane's new tip."""

    type: Literal["entry_added"] = "entry_added"
    lane: str
    entry: Entry


class TurnStart(_Published):
    type: Literal["turn_start"] = "turn_start"
    lane: str
    operation_id: str
    turn_id: str


class TurnEnd(_Published):
    type: Literal["turn_end"] = "turn_end"
    lane: str
    operation_id: str
    turn_id: str
    message: AssistantMessage
    tool_results: tuple[ToolResultMessage, ...] = ()


class ToolStart(_Published):
    type: Literal["tool_start"] = "tool_start"
    lane: str
    operation_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    args: JsonValue


class ToolUpdate(_Published):
    type: Literal["tool_update"] = "tool_update"
    lane: str
    operation_id: str
    turn_id: str
    tool_call_id: str
    partial_result: JsonValue


class ToolEnd(_Published):
    """The call's outcome is staged; it is no longer running (HA-28)."""

    type: Literal["tool_end"] = "tool_end"
    lane: str
    operation_id: str
    turn_id: str
    tool_call_id: str
    result: ToolResultMessage
    terminate: bool = False


class RetryScheduled(_Published):
    type: Literal["retry_scheduled"] = "retry_scheduled"
    lane: str
    operation_id: str
    attempt: int
    max_attempts: int
    not_before: int
    error_message: str


class RetryStart(_Published):
    type: Literal["retry_start"] = "retry_start"
    lane: str
    operation_id: str
    attempt: int


class RetryEnd(_Published):
    type: Literal["retry_end"] = "retry_end"
    lane: str
    operation_id: str
    attempt: int
    success: bool
    final_error: str | None = None


class CompactionStart(_Published):
    type: Literal["compaction_start"] = "compaction_start"
    lane: str
    operation_id: str
    reason: Literal["manual", "threshold", "overflow"]


class CompactionEnd(_Published):
    type: Literal["compaction_end"] = "compaction_end"
    lane: str
    operation_id: str
    reason: Literal["manual", "threshold", "overflow"]
    status: Literal["completed", "declined", "aborted", "failed"]
    entry_id: str | None = None
    error: OperationErrorRecord | None = None


class NavigationStart(_Published):
    type: Literal["navigation_start"] = "navigation_start"
    lane: str
    operation_id: str
    target_id: str | None


class NavigationEnd(_Published):
    """The tip moved to another branch: a watcher must take a new snapshot (`RebaseRequired`)."""

    type: Literal["navigation_end"] = "navigation_end"
    lane: str
    operation_id: str
    status: Literal["completed", "declined", "aborted", "failed"]
    from_tip_id: str | None
    tip_id: str | None


class QueueUpdate(_Published):
    """The lane's complete, authoritative queues and pending writes after a commit."""

    type: Literal["queue_update"] = "queue_update"
    lane: str
    queues: Queues
    pending_writes: tuple[PendingWrite, ...] = ()


class ConfigUpdate(_Published):
    type: Literal["config_update"] = "config_update"
    lane: str
    field: Literal["model", "thinking_level", "active_tools"]
    previous: ModelIdentity | ThinkingLevel | tuple[str, ...]
    value: ModelIdentity | ThinkingLevel | tuple[str, ...]


class ValueUpdate(_Published):
    """The session name (`entry_id` None) or an entry's label changed; `value` None clears it."""

    type: Literal["value_update"] = "value_update"
    key: Literal["session_name", "entry_label"]
    entry_id: str | None = None
    value: str | None


class LaneCreated(_Published):
    type: Literal["lane_created"] = "lane_created"
    lane: str
    config: LaneConfig
    at: str | None


class UsageRecorded(_Published):
    type: Literal["usage"] = "usage"
    lane: str
    usage_id: str
    usage: Usage
    entry_id: str | None = None


class HandlerError(_Published):
    """A listener raised while handling `event_type`; the commit it observed stands."""

    type: Literal["handler_error"] = "handler_error"
    event_type: str
    error: str


class Fault(_Published):
    """The harness stopped: it found state it cannot trust. Watches end with `HarnessFault`."""

    type: Literal["fault"] = "fault"
    code: str
    message: str


class DeferredHandle(_Event):
    """Where a deferred reply can be fetched: the provider's id and who must be asked."""

    id: str
    provider: str
    model_id: str
    api: str


HarnessEvent: TypeAlias = Annotated[
    RunStart
    | RunEnd
    | RunSuspend
    | RunResume
    | OperationAbort
    | MessageStart
    | MessageUpdate
    | MessageEnd
    | EntryAdded
    | TurnStart
    | TurnEnd
    | ToolStart
    | ToolUpdate
    | ToolEnd
    | RetryScheduled
    | RetryStart
    | RetryEnd
    | CompactionStart
    | CompactionEnd
    | NavigationStart
    | NavigationEnd
    | QueueUpdate
    | ConfigUpdate
    | ValueUpdate
    | LaneCreated
    | UsageRecorded
    | HandlerError
    | Fault,
    Field(discriminator="type"),
]

RunSuspend.model_rebuild()


@dataclass(frozen=True, slots=True)
class EventDelivery:
    """One event as a watcher receives it, with the exact Context of the call that emitted it (HA-22)."""

    event: HarnessEvent
    context: Context


def event_lane(event: HarnessEvent) -> str | None:
    """The lane an event belongs to; None for session-wide events."""
    lane = getattr(event, "lane", None)
    return lane if isinstance(lane, str) else None
