"""What driving an operation gives back: settled, suspended on a deferred reply, or waiting for a
retry, each tagged with its operation (HA-27)."""

from __future__ import annotations

from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict

from harness.messages import now_ms
from harness.runtime.events import DeferredHandle, QueuedItem
from harness.session import LaneLastResult

INTERRUPTED_REPLY = "the reply was interrupted: the process stopped while it streamed"
"""The error message of the reply a crash cut off (HA-24), rebuilt from its frames and retried;
a client may recognize it to show a resumed turn as a continuation, not a failure."""


class _Outcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Settled(_Outcome):
    """The operation settled; `result` is the lane's last result. `steer` and `follow_up` are the
    queued items it drained without placing (an abort or failure), returned to the caller."""

    kind: Literal["settled"] = "settled"
    operation_id: str
    result: LaneLastResult
    steer: tuple[QueuedItem, ...] = ()
    follow_up: tuple[QueuedItem, ...] = ()


class Suspended(_Outcome):
    """The provider answers later; resume to poll it (HA-27)."""

    kind: Literal["suspended"] = "suspended"
    operation_id: str
    reason: Literal["deferred"] = "deferred"
    deferred: DeferredHandle


class WaitingRetry(_Outcome):
    """A retry is due at `not_before` (Unix ms); returned only when the caller asked not to wait.
    `attempt` is the attempt it will make (2 for the first retry) and `error_message` why: the
    transient provider failure of the attempt before, as its retry wait keeps it."""

    kind: Literal["waiting_retry"] = "waiting_retry"
    operation_id: str
    not_before: int
    attempt: int
    error_message: str


class Paused(_Outcome):
    """The drive stopped at a step boundary because `Lane.pause_drive` asked it to (a worker
    shutting down): no effect was in flight, and the operation stays open in its durable phase for
    the next drive, in this process or another."""

    kind: Literal["paused"] = "paused"
    operation_id: str


DriveOutcome: TypeAlias = Settled | Suspended | WaitingRetry | Paused
"""How one drive of an operation ends: `Lane.drive`, `resume`, `prompt`, `compact` and `navigate`
return it."""


def ended_as(outcome: DriveOutcome) -> tuple[str, str | None]:
    """A drive's outcome for a log line: (`completed`, `failed` or `aborted` for a settled turn,
    else the outcome's kind: `paused`, `suspended`, `waiting_retry`; and why: a failure's error
    code, an abort's cause, for a retry wait the attempt it will make, how long until it is due
    and the failure it retries (`attempt 2 in 1.0 s after: overloaded`), else None)."""
    if isinstance(outcome, WaitingRetry):
        due_s = max(outcome.not_before - now_ms(), 0) / 1000
        return outcome.kind, f"attempt {outcome.attempt} in {due_s:.1f} s after: {outcome.error_message}"
    if not isinstance(outcome, Settled):
        return outcome.kind, None
    result = outcome.result
    return result.outcome, result.error.code if result.error is not None else result.abort_cause
