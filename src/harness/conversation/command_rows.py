"""The rows a typed command and a local shell command leave, built here once so that every door of a
command (a typed line, a dedicated route, a room's control command) records the same row (CE-16,
CE-17)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from harness.conversation.chat_events import CommandOutcome, CommandRan, CompactOutcome, FastOutcome, ShellRan
from harness.conversation.turn_rows import clean_public_text
from harness.errors import HarnessError
from harness.messages import CleanStr
from harness.runtime import NothingToCompact
from harness.session import CompactionPayload, LaneConfig, LaneLastResult

SHELL_OUTPUT_CHARS = 4000
"""How much of a local shell command's output its row keeps: the end, where the result usually is."""


class CommandInvocation(BaseModel):
    """What a person typed: `/name args` as `{name, args}` (args None when nothing followed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: CleanStr
    args: CleanStr | None = None


def command_ran(invocation: CommandInvocation, outcome: CommandOutcome | None) -> CommandRan:
    """The row of a command that ran: its invocation and typed outcome (None: it has none)."""
    return CommandRan(name=invocation.name, args=invocation.args, outcome=outcome)


def command_failed(invocation: CommandInvocation, error: HarnessError) -> CommandRan:
    """The row of a command that failed: the exact text its caller is answered with (CE-16)."""
    return CommandRan(name=invocation.name, args=invocation.args, error=error.message)


def compact_outcome(result: LaneLastResult | NothingToCompact, compaction: CompactionPayload | None) -> CompactOutcome:
    """What `/compact` did, from how its operation settled and the compaction entry it wrote (None
    when it wrote none), or from the lane's refusal at acceptance: `nothing_old_enough` both when
    the lane refused and when the run found nothing to summarize for the model's window."""
    if isinstance(result, NothingToCompact):
        return CompactOutcome(result="nothing_old_enough")
    if result.outcome == "failed":
        text = clean_public_text(result.error.message) if result.error is not None else None
        return CompactOutcome(result="failed", error=text)
    if result.outcome == "aborted":
        return CompactOutcome(result="aborted")
    if compaction is None:
        return CompactOutcome(result="nothing_old_enough")
    return CompactOutcome(result="compacted", tokens_before=compaction.tokens_before)


def fast_outcome(on: bool, config: LaneConfig) -> FastOutcome:
    """What `/fast` did: switched fast mode `on` or off, leaving the lane on `config`."""
    return FastOutcome(on=on, model=config.model, thinking_level=config.thinking_level)


def shell_ran(command: str, exit_code: int | None, output: str) -> ShellRan:
    """The row of a local `!cmd`: its output cut to its last `SHELL_OUTPUT_CHARS` characters,
    `truncated` when more came before them (CE-17)."""
    truncated = len(output) > SHELL_OUTPUT_CHARS
    return ShellRan(command=command, exit_code=exit_code, output=output[-SHELL_OUTPUT_CHARS:] if truncated else output,
                    truncated=truncated)
