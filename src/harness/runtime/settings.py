"""How operations are driven: retries, compaction, the step ceiling, pacing, and the injectable
clock and sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

from harness.messages import ModelIdentity, now_ms

SystemPrompt: TypeAlias = str | Callable[[str], str | None] | None
"""A harness's system prompt: one text for every lane, or a function of the lane's name asked at
each request (a delegated child's lane runs with its agent's instructions), or none."""


def lane_system_prompt(prompt: SystemPrompt, lane: str) -> str | None:
    """The system prompt lane `lane` runs with."""
    return prompt(lane) if callable(prompt) else prompt


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
    (Unix ms) and `sleep` (seconds) are injectable for tests. `fallback` are the models that take
    a step over, in order, when its model still fails with a retryable error after its retries
    (issue 32): the lane switches to the next one (after the failing model when it is among
    them, else the first), the switch committed with the failed reply and announced by
    `RunHooks.fallback_messages`, and the step starts again on it with its retries anew."""

    retry: RetryPolicy = RetryPolicy()
    compaction: CompactionSettings = CompactionSettings()
    step_ceiling: int = 50
    abort_grace_s: float = 5.0
    frame_interval_s: float = 0.1
    presentation_interval_s: float = 0.05
    tool_execution: Literal["parallel", "sequential"] = "parallel"
    fallback: tuple[ModelIdentity, ...] = ()
    clock: Callable[[], int] = now_ms
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
