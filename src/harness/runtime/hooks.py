"""The hooks a harness calls while it drives a run: around each tool call, on each request's
messages, between steps, before each step (a budget), when a fallback model takes a step, on a
structured answer, and before a run ends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import JsonValue

from harness.context import Context
from harness.messages import Message, ModelIdentity, OutputSchema
from harness.runtime.agent_tool import AgentTool, ToolOutput
from harness.runtime.lane import Lane
from harness.session import AbortCause, EntryPayload, OperationErrorRecord, OperationKind


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call about to run, as `before_tool` and `after_tool` see it; `asks_first` is its
    tool's (`AgentTool.asks_first`)."""

    operation_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, JsonValue]
    asks_first: bool = False


@dataclass(frozen=True)
class Block:
    """`before_tool`'s refusal: the call gets an error result with `reason` and does not run."""

    reason: str
    terminate: bool = False


@dataclass(frozen=True)
class ApprovalRequest:
    """A tool call waiting for approval: what a person is shown. `summary` is one line, e.g.
    `shell: make test` or `write src/app.py (120 bytes)`; `rule` is the `ask` rule that asks, as
    `` `shell(git push*)` (project settings ...) ``, or None when the call asks because its tool
    changes things. An answer "always" cannot quiet an ask rule (ask beats allow)."""

    operation_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, JsonValue]
    summary: str
    rule: str | None = None


@dataclass(frozen=True)
class Approval:
    """An answer to an approval request: run the call (`allow`), and with `for_session` every
    later call of the same tool in the conversation too, without asking (an answer "always",
    kept in its journal); a refusal's `reason` is told to the model."""

    allow: bool
    for_session: bool = False
    reason: str | None = None


AskApproval = Callable[[ApprovalRequest, Context], Awaitable[Approval]]
"""Ask whoever can decide (the terminal chat asks the person); it may take as long as they do."""

BeforeTool = Callable[[ToolCallRequest, Context], Awaitable[Block | dict[str, JsonValue] | None]]
"""Return None to run the call, replacement args to run it with those, or a `Block`. Raising
blocks it too: approval fails closed. Its Context is cancelled when the run is aborted (or its
harness closes), so a hook waiting for a person stops waiting then."""

AfterTool = Callable[[ToolCallRequest, ToolOutput, Context], Awaitable[ToolOutput | None]]
"""Return a replacement output, or None to keep it. Called for every output a tool returns before
it is stored, also while the run is being aborted."""

TransformContext = Callable[[list[Message], Context], Awaitable[list[Message]]]
"""Rewrite the messages of one request (not stored); errored and aborted replies are still in them."""

BetweenSteps = Callable[[Lane, Context], Awaitable[Sequence[Message]]]
"""Awaited after a tool batch settles and before the next request: it may append entries (they are
placed at this boundary) and return messages that are placed and sent in that very request."""

OverBudget = Callable[[Lane, Context], Awaitable[bool]]
"""Awaited at each step boundary of a run, before its next provider request (the first one
included): True stops the run there, and it settles aborted with cause `budget` (issue 32).
Entries it appends meanwhile (a row saying which cap was reached) are placed at the settlement."""


@dataclass(frozen=True)
class ModelFallback:
    """A step's model gave up after its retries and the next fallback model takes the step over
    (`DriveSettings.fallback`): `error` is the last failure's message."""

    lane: str
    operation_id: str
    previous: ModelIdentity
    model: ModelIdentity
    error: str


FallbackMessages = Callable[[ModelFallback], Sequence[Message]]
"""Called inside the commit that switches the lane to the fallback model (with the failed reply),
on the session line, without awaiting: the messages it returns are placed on the branch in that
commit, so the step's new request reads them (the conversation layer's model-switch row). It must
be quick and must not raise."""

@dataclass(frozen=True)
class OutputAnswer:
    """A run's final answer that took its output schema's shape, as `check_output` sees it:
    `answer` is the JSON the model gave (unwrapped, `OutputSchema.answer`)."""

    lane: str
    operation_id: str
    schema: OutputSchema
    answer: JsonValue


CheckOutput = Callable[[OutputAnswer], str | None]
"""Called when a run's answer fits its output schema, before it is recorded, on the drive's task:
what is still wrong with it (the output type's own validators, say) or None to accept it. A refusal
is sent back to the model as a misfit is, counted against the same `output_retries` (issue 32).
It must be quick: it runs between the reply and the run's end."""

BeforeRunEnd = Callable[[Lane, Context], Awaitable[None]]
"""Awaited when a run would finish, before it settles: entries it appends are placed first."""


@dataclass(frozen=True)
class OperationEnding:
    """How an operation is about to settle, as `settlement_messages` sees it."""

    lane: str
    operation_id: str
    kind: OperationKind
    outcome: Literal["completed", "failed", "aborted"]
    error: OperationErrorRecord | None
    abort_cause: AbortCause | None
    prompt_parent: str | None = None
    """A run that did not reply: the entry its first user message was placed after (None: the
    empty branch). Only meaningful while `discardable`."""
    discardable: bool = False
    """A run that settles aborted without a reply and whose acceptance placed a user message:
    `discard_turn` may move the tip back to `prompt_parent`."""
    discarded: bool = False
    """`discard_turn` discarded the run: the tip goes back to `prompt_parent` in this commit."""
    kept: tuple[EntryPayload, ...] = ()
    """A discardable run's custom messages placed after its user message, oldest first: rows
    others recorded at its step boundaries (a rename's, a garden's). A discard places them again
    after `prompt_parent`, so they leave the branch with the turn only as copies stay on it."""


DiscardTurn = Callable[[OperationEnding], bool]
"""Called inside the terminal commit of a run that is `discardable`, on the session line, without
awaiting, before `settlement_messages`: True discards the turn. The tip then goes back to
`prompt_parent` in that very commit: the user message and everything after it leave the branch
(they stay in the journal), what the acceptance placed above it stays, the custom messages placed
after it (`kept`: rows others recorded at its boundaries) and pending writes are placed after it,
and `navigation_end` says the tip moved before `run_end` does. A crash leaves either the open run
or the settled discard (CE-7, CE-14). It must be quick and must not raise."""

SettlementMessages = Callable[[OperationEnding], Sequence[Message]]
"""Called inside an operation's terminal commit, on the session line, without awaiting: the
messages it returns are placed at the end of the branch in that very commit, so they are durable
and published before `run_end` (the conversation layer's interrupted and error rows, CE-7, CE-9).
It must be quick and must not raise; an exception fails the commit."""


@dataclass(frozen=True)
class RunHooks:
    before_tool: BeforeTool | None = None
    before_tool_applies: Callable[[AgentTool], bool] | None = None
    """Whether `before_tool` decides the calls of this tool; None: every call. A call
    of a tool it does not decide runs as if the hook had returned None, and may start with the
    reply that asked for it, its intent committed with that reply (one commit fewer)."""
    after_tool: AfterTool | None = None
    transform_context: TransformContext | None = None
    between_steps: BetweenSteps | None = None
    over_budget: OverBudget | None = None
    fallback_messages: FallbackMessages | None = None
    before_run_end: BeforeRunEnd | None = None
    check_output: CheckOutput | None = None
    discard_turn: DiscardTurn | None = None
    settlement_messages: SettlementMessages | None = None
