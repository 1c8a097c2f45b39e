"""What driving an operation gives back: settled, suspended on a deferred reply, or waiting for a
retry, each tagged with its operation (HA-27)."""

from __future__ import annotations

from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict

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
    """A retry is due at `not_before` (Unix ms); returned only when the caller asked not to wait."""

    kind: Literal["waiting_retry"] = "waiting_retry"
    operation_id: str
    not_before: int


class Paused(_Outcome):
    """The drive stopped at a step boundary because `Lane.pause_drive` asked it to (a worker
    shutting down): no effect was in flight, and the operation stays open in its durable phase for
    the next drive, in this process or another."""

    kind: Literal["paused"] = "paused"
    operation_id: str


DriveOutcome: TypeAlias = Settled | Suspended | WaitingRetry | Paused
"""How one drive of an operation ends: `Lane.drive`, `resume`, `prompt`, `compact` and `navigate`
return it."""
