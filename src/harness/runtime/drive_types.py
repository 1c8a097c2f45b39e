"""What driving a run takes and gives: settings, hooks and the operation-tagged outcomes (HA-27)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, JsonValue

from harness.context import Context
from harness.messages import Message, now_ms
from harness.runtime.events import DeferredHandle, QueuedItem
from harness.runtime.tools import ToolOutput
from harness.session import LaneLastResult

if TYPE_CHECKING:
    from harness.runtime.lane import Lane

INTERRUPTED_REPLY = "the reply was interrupted: the process stopped while it streamed"
"""The error message of the reply a crash cut off (HA-24), rebuilt from its frames and retried;
a client may recognize it to show a resumed turn as a continuation, not a failure."""


@dataclass(frozen=True)
class RetryPolicy:
    """Transient provider failures are retried `max_retries` times, waiting
    `base_delay_ms * 2**(attempt-1)` (or the server's retry-after, if longer), at most `max_delay_ms`."""

    max_retries: int = 3
    base_delay_ms: int = 1_000
    max_delay_ms: int = 60_000

    def delay_ms(self, attempt: int, retry_after_ms: int | None) -> int:
        backoff: int = self.base_delay_ms * 2 ** max(attempt - 1, 0)
        return min(max(backoff, retry_after_ms or 0), self.max_delay_ms)


@dataclass(frozen=True)
class CompactionSettings:
    """Compact a run's context when its estimated size passes the model's context window minus
    `reserve_tokens`; keep about `keep_recent_tokens` of the newest messages verbatim. After
    `max_failures` consecutive failed compactions a run stops trying."""

    enabled: bool = True
    reserve_tokens: int = 16_384
    keep_recent_tokens: int = 20_000
    max_failures: int = 3

    def for_window(self, context_window: int) -> CompactionSettings:
        """These settings for a model with `context_window` tokens: the reserve and the kept
        tail are each at most a quarter of the window (at least 256 tokens), so a small model
        is not over its threshold on every step."""
        quarter = max(256, context_window // 4)
        return replace(self, reserve_tokens=min(self.reserve_tokens, quarter),
                       keep_recent_tokens=min(self.keep_recent_tokens, quarter))


@dataclass(frozen=True)
class DriveSettings:
    """How runs are driven. `step_ceiling` ends a run that keeps calling tools (abort cause
    `step_ceiling`); `abort_grace_s` is how long an abort waits for a tool that ignores
    cancellation; `frame_interval_s` bounds how often a streaming reply is persisted and
    `presentation_interval_s` how often it is published live (`message_update`). `clock`
    (Unix ms) and `sleep` (seconds) are injectable for tests."""

    retry: RetryPolicy = RetryPolicy()
    compaction: CompactionSettings = CompactionSettings()
    step_ceiling: int = 50
    abort_grace_s: float = 5.0
    frame_interval_s: float = 0.1
    presentation_interval_s: float = 0.05
    tool_execution: Literal["parallel", "sequential"] = "parallel"
    clock: Callable[[], int] = now_ms
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call about to run, as `before_tool` and `after_tool` see it."""

    operation_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, JsonValue]


@dataclass(frozen=True)
class Block:
    """`before_tool`'s refusal: the call gets an error result with `reason` and does not run."""

    reason: str
    terminate: bool = False


BeforeTool = Callable[[ToolCallRequest, Context], Awaitable[Block | dict[str, JsonValue] | None]]
"""Return None to run the call, replacement args to run it with those, or a `Block`. Raising
blocks it too: approval fails closed."""

AfterTool = Callable[[ToolCallRequest, ToolOutput, Context], Awaitable[ToolOutput | None]]
"""Return a replacement output, or None to keep it."""

TransformContext = Callable[[list[Message], Context], Awaitable[list[Message]]]
"""Rewrite the messages of one request (not stored); errored and aborted replies are still in them."""

BetweenSteps = Callable[["Lane", Context], Awaitable[Sequence[Message]]]
"""Awaited after a tool batch settles and before the next request: it may append entries (they are
placed at this boundary) and return messages that are placed and sent in that very request."""

BeforeRunEnd = Callable[["Lane", Context], Awaitable[None]]
"""Awaited when a run would finish, before it settles: entries it appends are placed first."""


@dataclass(frozen=True)
class RunHooks:
    before_tool: BeforeTool | None = None
    after_tool: AfterTool | None = None
    transform_context: TransformContext | None = None
    between_steps: BetweenSteps | None = None
    before_run_end: BeforeRunEnd | None = None


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


ResumeOutcome: TypeAlias = Settled | Suspended | WaitingRetry
