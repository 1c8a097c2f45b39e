"""Public value types of the harness: inventory, inspection and snapshots (HA-1, HA-6, HA-9, HA-30)."""

from __future__ import annotations

from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, JsonValue

from harness.messages import AssistantMessage, ModelIdentity
from harness.runtime.events import DeferredHandle, PendingWrite, QueuedItem, Queues
from harness.session import Entry, LaneLastResult, OperationErrorRecord, OperationKind

OperationStatus: TypeAlias = Literal["running", "open", "aborting"]
"""`running`: a drive in this process owns the operation; `open`: durable, no local owner;
`aborting`: a durable abort request is recorded (HA-6)."""

OperationError = OperationErrorRecord
"""A machine-readable run-level failure: stable `code` (e.g. `model_unavailable`,
`configured_tools_unavailable`, HA-23), English `message`, `details` (HA-26)."""


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OpenOperation(_Value):
    """One durable current operation found at attachment (HA-1). Inventory, not advice: `aborting`
    is True only when a durable abort request exists (HA-5)."""

    lane: str
    operation_id: str
    kind: OperationKind
    started_at: int
    aborting: bool = False


class CurrentOperationInfo(_Value):
    """`captured_model` is the identity the current phase captured, if it holds one; it may differ
    from the lane's configured model and may not resolve (HA-6)."""

    id: str
    kind: OperationKind
    started_at: int
    status: OperationStatus
    captured_model: ModelIdentity | None = None


class LaneExecutionInfo(_Value):
    """What `Lane.inspect_execution` observes (HA-6); identities are unresolved strings."""

    lane: str
    tip_id: str | None
    configured_model: ModelIdentity
    current: CurrentOperationInfo | None
    last_result: LaneLastResult | None = None


class LaneInfo(_Value):
    name: str
    tip_id: str | None
    operation: CurrentOperationInfo | None


class RetryInfo(_Value):
    """A retry wait: the next attempt (1-based) of `max_attempts`, not before `next_attempt_at` (Unix ms)."""

    attempt: int
    max_attempts: int
    next_attempt_at: int


class DeferredInfo(_Value):
    handle: DeferredHandle
    poll: int


class DrainedQueues(_Value):
    """Steer and follow-up items an abort took off the lane; kept until the operation settles."""

    steer: tuple[QueuedItem, ...] = ()
    follow_up: tuple[QueuedItem, ...] = ()


class RunningTool(_Value):
    """A tool call whose effect may be under way (never one whose outcome is ready, HA-28).
    `partial_result` is the latest progress, absent when none was recorded."""

    tool_call_id: str
    tool_name: str
    args: JsonValue
    partial_result: JsonValue = None


class SnapshotOperation(_Value):
    id: str
    kind: OperationKind
    started_at: int
    status: OperationStatus
    retry: RetryInfo | None = None
    deferred: DeferredInfo | None = None
    drained: DrainedQueues | None = None
    streaming_message: AssistantMessage | None = None
    running_tools: tuple[RunningTool, ...] = ()


class LaneSnapshot(_Value):
    """A lane as a watcher first sees it (HA-9): the compaction-bounded transcript (oldest first,
    starting at the newest compaction entry), the tip, the latest result, the current operation,
    queues and pending writes. Configuration is not here: `inspect_execution` and the lane's
    getters give it."""

    lane: str
    transcript: tuple[Entry, ...]
    tip_id: str | None
    last_result: LaneLastResult | None = None
    operation: SnapshotOperation | None = None
    queues: Queues = Queues()
    pending_writes: tuple[PendingWrite, ...] = ()
    faulted: bool = False
    event_seq: int | None = None
