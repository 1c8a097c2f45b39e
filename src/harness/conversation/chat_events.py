"""Chat events: one journal record for something a person saw happen that is neither their message
nor the model's reply (CE-1 to CE-6).

A chat event is a `custom_message` entry of custom type `harness.chat-event`. Its `details` hold a
closed, versioned fact (`ChatEventDetails`); its `content` holds the English text the model reads,
rendered once at write time by `render_chat_event_for_model` and stored verbatim, never shown to a
person: every surface words a row from its typed details. Nothing else keeps a copy (CE-6).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from harness.messages import CleanStr, CustomMessage, Message, ModelIdentity, ThinkingLevel
from harness.session import AbortCause

CHAT_EVENT_TYPE = "harness.chat-event"
"""The custom type of every chat-event entry."""

logger = logging.getLogger("harness.conversation")


class _Fact(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- error notices: the typed reason a surface words an error from, when the runtime wrote it -----

class ModelSwitchFailed(_Fact):
    """A queued model switch acknowledged to the person failed later (CE-12)."""

    code: Literal["model-switch-failed"] = "model-switch-failed"
    requested: ModelIdentity


class CompactionStopped(_Fact):
    """The compaction circuit breaker stopped a run's compactions after `failures` in a row."""

    code: Literal["compaction-stopped"] = "compaction-stopped"
    failures: int
    last_error: str


class ContextOverflow(_Fact):
    """The conversation no longer fits the model's context window, and compacting did not help."""

    code: Literal["context-overflow"] = "context-overflow"


ChatErrorNotice: TypeAlias = Annotated[
    ModelSwitchFailed | CompactionStopped | ContextOverflow,
    Field(discriminator="code"),
]
"""Version 2 of the notice vocabulary. Version 1 also had `image-refused` and `provider-timeout`;
the `retire-chat-error-notices` journal migration removed them from stored rows, and a row that
still carries one no longer parses, nor can one be written (CE-25)."""

RETIRED_NOTICE_CODES = frozenset({"image-refused", "provider-timeout"})
"""The notice codes of vocabulary version 1 that version 2 dropped and the journal migration
removes from stored rows (CE-25)."""


# -- command outcomes: what a typed command did, in codes and values (CE-5, CE-16) ------------------

class CompactOutcome(_Fact):
    """What `/compact` did: `compacted`, or why nothing was (`nothing_old_enough`, `failed` with the
    public text of why, `aborted` when it was stopped)."""

    command: Literal["compact"] = "compact"
    result: Literal["compacted", "nothing_old_enough", "failed", "aborted"]
    tokens_before: int | None = None
    error: CleanStr | None = None


class FastOutcome(_Fact):
    """`/fast` on (the fast model and a lower reasoning level for the next turns) or off."""

    command: Literal["fast"] = "fast"
    on: bool
    model: ModelIdentity
    thinking_level: ThinkingLevel


class ModelOutcome(_Fact):
    """`/model`: the model of the next turns; `queued` when it waits for the running turn to end
    (the switch's own `model` row says when it landed, CE-12). `tools`: the tools the switch gave,
    when they follow the model and changed (empty: none any more)."""

    command: Literal["model"] = "model"
    model: ModelIdentity
    queued: bool = False
    tools: list[CleanStr] | None = None


class RenameOutcome(_Fact):
    command: Literal["rename"] = "rename"
    name: str | None


class ModeOutcome(_Fact):
    command: Literal["mode"] = "mode"
    mode: Literal["build", "plan"]


class ToolsOutcome(_Fact):
    """`/tools`: the conversation's `tools` after it (in plan mode the lane offers the read-only
    ones among them); `chosen` when the person chose them and a model switch keeps them, else
    they follow the model; `available`, every tool the conversation can be given."""

    command: Literal["tools"] = "tools"
    tools: list[CleanStr]
    chosen: bool
    available: list[CleanStr] = Field(default_factory=list)


class RestartOutcome(_Fact):
    command: Literal["restart"] = "restart"


class GoalOutcome(_Fact):
    """`/goal TEXT`: the durable goal it gave garden `garden`, whose origin is this conversation."""

    command: Literal["goal"] = "goal"
    garden: CleanStr
    goal_id: CleanStr
    title: CleanStr


class GoalActionOutcome(_Fact):
    """`/goal pause|resume|drop GOAL_ID`: goal `goal_id` of garden `garden` is now `status`
    (`paused`, `active` again, `dropped`). This row is the change's one record in this
    conversation: no goal row repeats it here (CE-6)."""

    command: Literal["goal_action"] = "goal_action"
    garden: CleanStr
    goal_id: CleanStr
    title: CleanStr
    status: Literal["active", "paused", "dropped"]


class ContextFile(_Fact):
    """One project instruction file (`AGENTS.md`, or `CLAUDE.md` where a directory has none): its
    absolute `path`, the sha256 of its whole content (hex), its `size` in bytes and how many of
    them the model reads (`included`; fewer when the project context limit cut it)."""

    path: CleanStr
    sha256: str
    size: int
    included: int


class ContextOutcome(_Fact):
    """`/context`: the project instruction files the next turn reads, root first, at most
    `limit_bytes` of them in all; `current` when the model reads exactly these already (False:
    they changed since the last turn, and the next one records and reads the new ones)."""

    command: Literal["context"] = "context"
    files: tuple[ContextFile, ...] = ()
    limit_bytes: int
    current: bool


CommandOutcome: TypeAlias = Annotated[
    CompactOutcome | FastOutcome | ModelOutcome | RenameOutcome | ModeOutcome | ToolsOutcome | RestartOutcome
    | GoalOutcome | GoalActionOutcome | ContextOutcome,
    Field(discriminator="command"),
]


# -- the details ------------------------------------------------------------------------------------

class Interrupted(_Fact):
    """A stopped turn and why (CE-7)."""

    kind: Literal["interrupted"] = "interrupted"
    v: Literal[1] = 1
    cause: AbortCause


class ErrorDetails(_Fact):
    """A failed turn: its public `text`, plus a typed `notice` only when the runtime wrote that text
    itself; a provider's or an exception's own text has none and is shown verbatim (CE-5, CE-9)."""

    kind: Literal["error"] = "error"
    v: Literal[1] = 1
    text: CleanStr
    notice: ChatErrorNotice | None = None


class ModelSwitched(_Fact):
    """A model switch; `tools` the tools it gave the conversation, when they follow the model and
    changed (empty: none any more). `by` `fallback`: the previous model kept failing with a
    retryable error (`reason`, its last) and this one, next among the fallback models, took the
    step over (issue 32)."""

    kind: Literal["model"] = "model"
    v: Literal[1] = 1
    previous: ModelIdentity | None
    model: ModelIdentity
    tools: list[CleanStr] | None = None
    by: Literal["person", "fallback"] = "person"
    reason: CleanStr | None = None


class BudgetReached(_Fact):
    """A run stopped at a step boundary because a spending cap was reached (issue 32): the `scope`
    the cap is for, its `limit` and what was `spent` there, in `unit` (tokens, or US dollars)."""

    kind: Literal["budget"] = "budget"
    v: Literal[1] = 1
    scope: Literal["run", "conversation"]
    unit: Literal["tokens", "usd"]
    limit: float
    spent: float

    def amount(self, value: float) -> str:
        """`value` in this row's unit, for people and the model."""
        return f"{value:,.0f} tokens" if self.unit == "tokens" else f"${value:,.4f}"


class Renamed(_Fact):
    kind: Literal["rename"] = "rename"
    v: Literal[1] = 1
    name: CleanStr | None


class DirectoryMoved(_Fact):
    """The working directory or project moved; `by` the person or the agent."""

    kind: Literal["cwd"] = "cwd"
    v: Literal[1] = 1
    path: CleanStr
    by: Literal["user", "agent"] = "user"
    project: CleanStr | None = None


class ModeSelected(_Fact):
    """A work mode: `build` (the conversation's tools) or `plan` (the read-only ones among them)."""

    kind: Literal["mode"] = "mode"
    v: Literal[1] = 1
    mode: Literal["build", "plan"]


class ReasoningChanged(_Fact):
    kind: Literal["reasoning"] = "reasoning"
    v: Literal[1] = 1
    previous: ThinkingLevel
    level: ThinkingLevel


class CommandRan(_Fact):
    """A typed command with its outcome, or the exact error text its caller was answered with;
    `output` is the text it printed when no typed outcome says what it did (another tool's
    command, read from its transcript), shown verbatim."""

    kind: Literal["command"] = "command"
    v: Literal[1] = 1
    name: CleanStr
    args: CleanStr | None = None
    outcome: CommandOutcome | None = None
    error: CleanStr | None = None
    output: CleanStr | None = None


class ShellRan(_Fact):
    """A local `!cmd`: its exit code (None when it could not start or was killed) and the end of its
    output, `truncated` when more came before it."""

    kind: Literal["shell"] = "shell"
    v: Literal[1] = 1
    command: CleanStr
    exit_code: int | None
    output: CleanStr
    truncated: bool = False


class Compacted(_Fact):
    kind: Literal["compacted"] = "compacted"
    v: Literal[1] = 1
    reason: Literal["manual", "threshold", "overflow"]
    tokens_before: int | None = None


class GoalStatus(_Fact):
    kind: Literal["goal"] = "goal"
    v: Literal[1] = 1
    goal_id: CleanStr
    status: Literal["active", "paused", "done", "dropped"]
    title: CleanStr


class AlwaysAllowed(_Fact):
    """The person answered "always": calls the permission rule `rule` names (a tool's name, e.g.
    `shell`) run without asking for the rest of the conversation (issue 30)."""

    kind: Literal["allowed"] = "allowed"
    v: Literal[1] = 1
    rule: CleanStr


ChatEventDetails: TypeAlias = Annotated[
    Interrupted | ErrorDetails | ModelSwitched | Renamed | DirectoryMoved | ModeSelected | ReasoningChanged
    | CommandRan | ShellRan | Compacted | GoalStatus | AlwaysAllowed | BudgetReached,
    Field(discriminator="kind"),
]

_DETAILS: TypeAdapter[ChatEventDetails] = TypeAdapter(ChatEventDetails)


class ChatEventView(BaseModel):
    """What every surface renders a chat-event row from: its entry id and typed details (CE-2)."""

    model_config = ConfigDict(frozen=True)

    id: str
    details: ChatEventDetails


def parse_chat_event_details(raw: object) -> ChatEventDetails | None:
    """The typed details of a stored row, or None (with an error logged) for a shape this version
    does not know: a reader renders nothing for it (CE-5)."""
    try:
        return _DETAILS.validate_python(raw)
    except ValidationError as error:
        logger.error("a chat event with details this version does not know: %s", error.errors()[0]["msg"])
        return None


def chat_event_message(details: ChatEventDetails) -> CustomMessage:
    """The journal message of one chat event: its details and the model's English text (CE-1)."""
    return CustomMessage(custom_type=CHAT_EVENT_TYPE, content=render_chat_event_for_model(details),
                         details=details.model_dump(mode="json"))


def chat_event_of(message: Message) -> ChatEventDetails | None:
    """The details of `message` if it is a chat event this version can read."""
    if not isinstance(message, CustomMessage) or message.custom_type != CHAT_EVENT_TYPE:
        return None
    return parse_chat_event_details(message.details)


def last_turn_error_text(messages: Sequence[Message]) -> str | None:
    """The public text of the error row of the latest turn (after the newest user message), if
    that turn failed: what run listings and activity show (CE-9)."""
    for message in reversed(messages):
        if message.role == "user":
            return None
        details = chat_event_of(message)
        if isinstance(details, ErrorDetails):
            return details.text
    return None


_CAUSES = {
    "user": "[The person interrupted the request.]",
    "user_during_tool": "[The person interrupted the request while a tool was running.]",
    "step_ceiling": "[The request was stopped: it reached the limit of steps for one turn.]",
    "parent": "[The request was stopped by the agent that delegated it.]",
    "deleted": "[The request was stopped because the conversation was deleted.]",
    "probe": "[The request was stopped by an internal probe.]",
    "budget": "[The request was stopped: it reached its budget.]",
}


def render_chat_event_for_model(details: ChatEventDetails) -> str:
    """The English text the model reads for `details`, stored once at write time (CE-1, CE-5)."""
    match details:
        case Interrupted():
            return _CAUSES[details.cause]
        case ErrorDetails():
            return f"[The request failed: {details.text}]"
        case ModelSwitched(by="fallback", previous=ModelIdentity() as previous):
            return f"[{previous.spec} kept failing ({details.reason or 'a retryable error'}); " \
                   f"{details.model.spec} took the request over.]"
        case ModelSwitched():
            return f"[The person switched the model to {details.model.spec}.{_tools_text(details.tools)}]"
        case Renamed():
            return f"[The conversation was renamed to {details.name!r}.]" if details.name else \
                "[The conversation's name was cleared.]"
        case DirectoryMoved():
            where = f"project {details.project} ({details.path})" if details.project else details.path
            if details.by == "agent":
                return f"[Your switch to {where} is now active; tools now run there.]"
            return f"[The person moved the working directory to {where}; tools now run there.]"
        case ModeSelected():
            return ("[Plan mode: only read-only tools are available; propose changes, do not make them.]"
                    if details.mode == "plan" else "[Build mode: every tool of this conversation is available again.]")
        case ReasoningChanged():
            return f"[The reasoning level changed from {details.previous} to {details.level}.]"
        case CommandRan():
            invocation = f"/{details.name}" + (f" {details.args}" if details.args else "")
            if details.error is not None:
                return f"[The person ran {invocation}; it failed: {details.error}]"
            printed = f" Output:\n{details.output}" if details.output else ""
            return f"[The person ran {invocation}.{_outcome_text(details.outcome)}{printed}]"
        case ShellRan():
            status = "could not finish" if details.exit_code is None else f"exited with {details.exit_code}"
            cut = " (the output's end)" if details.truncated else ""
            return f"[The person ran the shell command `{details.command}`; it {status}. Output{cut}:\n" \
                   f"{details.output}]"
        case Compacted():
            return "[Conversation compacted.]"
        case GoalStatus():
            return f"[Goal {details.title!r} is now {details.status}.]"
        case BudgetReached():
            return f"[The request was stopped: the {details.scope}'s budget of {details.amount(details.limit)} " \
                   f"is spent ({details.amount(details.spent)} used).]"
        case AlwaysAllowed():
            return f"[The person allowed `{details.rule}` calls to run without asking for the rest of this " \
                   "conversation.]"


def _outcome_text(outcome: CommandOutcome | None) -> str:
    match outcome:
        case CompactOutcome(result="compacted"):
            return " The conversation was compacted."
        case CompactOutcome(result="nothing_old_enough"):
            return " Nothing was old enough to compact."
        case CompactOutcome(result="aborted"):
            return " The compaction was stopped."
        case CompactOutcome():
            return f" The compaction failed: {outcome.error}." if outcome.error else " The compaction failed."
        case FastOutcome(on=True):
            return f" Fast mode is on: {outcome.model.spec} at reasoning level {outcome.thinking_level}."
        case FastOutcome():
            return f" Fast mode is off: {outcome.model.spec} at reasoning level {outcome.thinking_level}."
        case ModelOutcome(queued=True):
            return f" The model switches to {outcome.model.spec} once the running turn ends."
        case ModelOutcome():
            return f" The model is now {outcome.model.spec}.{_tools_text(outcome.tools)}"
        case RenameOutcome():
            return f" The conversation is now named {outcome.name!r}." if outcome.name else " The name was cleared."
        case ModeOutcome():
            return f" The mode is now {outcome.mode}."
        case ToolsOutcome():
            follows = "chosen by the person" if outcome.chosen else "those of the model"
            return (f" The tools ({follows}) are {', '.join(outcome.tools)}." if outcome.tools
                    else f" There are no tools ({follows}).")
        case RestartOutcome():
            return " The conversation was restarted from its journal."
        case GoalOutcome():
            return f" The garden {outcome.garden} now pursues the goal {outcome.title!r} and will report here."
        case GoalActionOutcome(status="paused"):
            return f" The goal {outcome.title!r} of the garden {outcome.garden} is paused until it is resumed."
        case GoalActionOutcome(status="active"):
            return f" The garden {outcome.garden} pursues the goal {outcome.title!r} again."
        case GoalActionOutcome():
            return f" The goal {outcome.title!r} of the garden {outcome.garden} is dropped: it is not pursued again."
        case ContextOutcome():
            return f" {context_files_text(outcome.files)}"
        case None:
            return ""


def context_files_text(files: Sequence[ContextFile]) -> str:
    """`files` in a sentence: which project instruction files the model reads, and which were cut."""
    if not files:
        return "No project instruction files apply."
    listed = ", ".join(file.path + ("" if file.included == file.size else
                                    f" (the first {file.included:,} of {file.size:,} bytes)") for file in files)
    return f"The project instruction files are {listed}."


def _tools_text(tools: Sequence[str] | None) -> str:
    """What a switch did to the tools that follow the model, for the model to read."""
    if tools is None:
        return ""
    return f" The tools now offered: {', '.join(tools)}." if tools else " No tools are offered any more."
