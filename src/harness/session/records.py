"""Records kept at addresses beside the entries: lane configuration and state, operations,
pending entries, usage rows. Only their shapes live here; the harness gives them meaning.

A record refuses a field it does not know (`Record`, `extra="forbid"`), so a field added to one
the journal already holds has a default and is left out of the stored JSON while at it
(`exclude_if`, `_unset`): a record that does not use it is the very JSON an older reader reads.
One that uses it needs a version that knows it, and an older one refuses it as undecodable
(`StorageCorruption`): hosted mode upgrades its workers before the processes that accept runs
(docs/workers.md)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from harness.messages import CleanJson, CleanStr, Message, ModelIdentity, OutputSchema, Record, ThinkingLevel, Usage

OperationKind: TypeAlias = Literal["run", "compaction", "navigation"]


def _unset(value: object) -> bool:
    """Whether a field added to a stored record is at its default (None, 0): left out of the JSON."""
    return value is None or value == 0


class LaneConfig(Record):
    """What a lane runs with: the model identity (unresolved), thinking level, active tool names."""

    model: ModelIdentity
    thinking_level: ThinkingLevel = "off"
    active_tools: list[CleanStr] = Field(default_factory=list)


InboxKind: TypeAlias = Literal["steer", "follow_up", "next_run", "write"]
AbortCause: TypeAlias = Literal["user", "user_during_tool", "step_ceiling", "parent", "deleted", "probe", "budget"]


class InboxItem(Record):
    """One pending entry waiting on a lane: `steer` (next boundary of the run), `follow_up` (when
    the run would otherwise end), `next_run` (the next accepted run) or `write` (an append made while
    an operation was open, placed at the next safe point). Its payload is at `pending_entry(entry_id)`."""

    entry_id: str
    kind: InboxKind


class LaneState(Record):
    """A lane's current operation (None when idle) and its inbox, in arrival order."""

    current_operation_id: str | None = None
    inbox: list[InboxItem] = Field(default_factory=list)

    def ids_of(self, kind: InboxKind) -> list[str]:
        return [item.entry_id for item in self.inbox if item.kind == kind]


class QueueRequest(Record):
    """A message another process asks the lane's owner to queue: `steer` or `follow_up` for the
    run `operation_id` it saw open. Should that run have ended when the owner takes it, the
    message waits for the next run instead, so nothing a person sent is lost."""

    kind: Literal["steer", "follow_up"]
    lane: str
    operation_id: str
    message: Message
    requested_at: int


class StopRequest(Record):
    """A durable abort another process asks for, of operation `operation_id` only: one that has
    settled meanwhile needs no stopping."""

    kind: Literal["stop"] = "stop"
    lane: str
    operation_id: str
    cause: AbortCause
    requested_at: int


class AppendRequest(Record):
    """A message another process asks the lane's owner to append (a chat event, a garden's
    message): placed at once on an idle lane, else a pending write placed at the open
    operation's next safe point, never between a tool call and its result (CE-11). Its entry
    takes the request's id, so the poster knows it and a request posted twice appends once."""

    kind: Literal["append"] = "append"
    lane: str
    message: Message
    requested_at: int


class CommandRequest(Record):
    """A typed command another process asks the conversation's holder to run (`/model x`,
    `/rename NAME`, ...) for `user`: `typed` as a person typed it (its command row recorded), or
    a program's call (no command row). The holder deletes it, then runs it: a holder that stops
    in between loses it, and never runs it twice."""

    kind: Literal["command"] = "command"
    lane: str
    user: CleanStr
    line: CleanStr
    typed: bool = True
    requested_at: int


class SettingRequest(Record):
    """A setting change another process asks the conversation's holder to make for `user`, as its
    own door would, with the row that records it: the conversation's `name` (`value` None clears
    it), its work `mode` (`build` or `plan`), its `model` (`provider/id`) or its `project` (an
    execution ref). Taken like a `CommandRequest`: deleted, then made."""

    kind: Literal["setting"] = "setting"
    lane: str
    user: CleanStr
    setting: Literal["name", "mode", "model", "project"]
    value: CleanStr | None
    requested_at: int


class ApprovalAnswerRequest(Record):
    """An answer to a tool call waiting for approval in the holder's process, given by `user` in
    another process (issue 28): `allow` it (for the rest of the conversation when `for_session`)
    or refuse it, `reason` told to the model. Taken like a `CommandRequest`: deleted, then handed
    to the holder's approvals; one for a call that no longer waits is dropped. `answer_id` names
    the answer in the call's journal copy once taken, so the poster learns it came first."""

    kind: Literal["approval"] = "approval"
    lane: str
    user: CleanStr
    tool_call_id: CleanStr
    allow: bool
    for_session: bool = False
    reason: CleanStr | None = None
    answer_id: CleanStr | None = None
    requested_at: int


class ReleaseRequest(Record):
    """Another process would attach the conversation (a server admitting a turn): the holder lets
    go of it if it holds it only while in use and it is idle now (a server); one that keeps it (a
    chat) does not. Taken like a `CommandRequest` (issue 29)."""

    kind: Literal["release"] = "release"
    lane: str
    requested_at: int


HolderRequest: TypeAlias = CommandRequest | SettingRequest | ApprovalAnswerRequest | ReleaseRequest
"""A request the conversation's holder carries out through its own door, not the lane's."""

LaneRequest = Annotated[QueueRequest | StopRequest | AppendRequest | CommandRequest | SettingRequest
                        | ApprovalAnswerRequest | ReleaseRequest, Field(discriminator="kind")]
"""What a process that does not own a session may ask of a lane's owner (`Session.post_request`);
the owner takes each once (`Lane.take_requests`)."""


class OperationErrorRecord(Record):
    """A machine-readable run-level failure (HA-26): stable `code`, English `message`, `details`."""

    code: CleanStr
    message: CleanStr
    details: CleanJson | None = None


class LaneLastResult(Record):
    """How the lane's latest operation ended."""

    operation_id: str
    kind: OperationKind
    outcome: Literal["completed", "failed", "aborted"]
    tip_id: str | None
    final_assistant_entry_id: str | None = None
    error: OperationErrorRecord | None = None
    abort_cause: AbortCause | None = None
    started_at: int
    ended_at: int


class RunIntent(Record):
    """A run: the entries its prompt placed and, when its final answer must be JSON of a shape,
    that shape and how many answers that do not fit are sent back for another (issue 32)."""

    kind: Literal["run"] = "run"
    prompt_entry_ids: list[str]
    output: OutputSchema | None = Field(default=None, exclude_if=_unset)
    output_retries: Annotated[int, Field(ge=0, exclude_if=_unset)] = 0


class CompactionIntent(Record):
    kind: Literal["compaction"] = "compaction"
    custom_instructions: CleanStr | None = None


class NavigationIntent(Record):
    kind: Literal["navigation"] = "navigation"
    target_id: str | None
    summarize: bool = False
    label: CleanStr | None = None
    custom_instructions: CleanStr | None = None


OperationIntent: TypeAlias = Annotated[
    RunIntent | CompactionIntent | NavigationIntent, Field(discriminator="kind")
]


class OperationMeta(Record):
    """An operation's intent, written once when it is accepted. `traceparent` is the W3C trace
    context of a run's acceptance span, when one was recorded: every pass that drives the run, in
    any process and after any crash, continues that trace."""

    operation_id: str
    lane: str
    source_tip_id: str | None
    started_at: int
    intent: OperationIntent
    traceparent: str | None = Field(default=None, exclude_if=_unset)


class Running(Record):
    """No abort has been requested."""

    status: Literal["running"] = "running"


class CancelRequested(Record):
    """A durable abort request (HA-5) with its cause (CE-7). The steer and follow-up entries it
    drained from the lane stay stored under these ids until the operation settles."""

    status: Literal["cancel_requested"] = "cancel_requested"
    cause: AbortCause
    requested_at: int
    drained_steer: list[str] = Field(default_factory=list)
    drained_follow_up: list[str] = Field(default_factory=list)


Control: TypeAlias = Annotated[Running | CancelRequested, Field(discriminator="status")]


class _Phase(Record):
    """Every phase carries the operation's control; a transition replaces the whole state."""

    control: Control = Running()


class GenerationContext(Record):
    """What a step captured when it was planned: the lane configuration (model and tools are
    resolved only when the step executes, HA-23), the retry policy, and `step`, this step's number
    in the run (1-based; the step ceiling counts it)."""

    step_id: str
    trigger_entry_id: str | None
    config: LaneConfig
    step: int = 1
    max_attempts: int = 1
    base_delay_ms: int = 0
    overflow_recovery_used: bool = False


class NeedAssistant(Record):
    kind: Literal["need_assistant"] = "need_assistant"
    overflow_recovery_used: bool = False


class MayFinish(Record):
    kind: Literal["may_finish"] = "may_finish"
    include_final_assistant: bool = False


Continuation: TypeAlias = Annotated[NeedAssistant | MayFinish, Field(discriminator="kind")]


class RunStarting(_Phase):
    """Accepted and nothing done yet; payload-free apart from control (HA-19)."""

    phase: Literal["starting"] = "starting"


class RunCheckpoint(_Phase):
    """Between steps: place queued input, then ask the model again or finish."""

    phase: Literal["checkpoint"] = "checkpoint"
    continuation: Continuation
    trigger_entry_id: str | None
    steps: int = 0
    compaction_failures: int = 0
    boundary_done: bool = False
    """The between-step hook already ran at this boundary: a checkpoint resumed after a compaction
    inside the run asks the model without placing the hook's messages again."""


class AssistantReady(_Phase):
    phase: Literal["assistant_ready"] = "assistant_ready"
    generation: GenerationContext
    next_attempt: int = 1


class AssistantEffectPending(_Phase):
    """A provider request is about to be or has been sent; the reply and its usage row will be
    written under these reserved ids, and its frames are kept under the response id."""

    phase: Literal["assistant_effect_pending"] = "assistant_effect_pending"
    generation: GenerationContext
    attempt: int
    response_entry_id: str
    usage_id: str


class AssistantRetryWait(_Phase):
    """A transient provider failure; `not_before` is epoch milliseconds."""

    phase: Literal["assistant_retry_wait"] = "assistant_retry_wait"
    generation: GenerationContext
    next_attempt: int
    not_before: int
    error_message: CleanStr


ToolCallStatus: TypeAlias = Literal["planned", "effect_pending", "outcome_ready", "completed"]


class ToolCallState(Record):
    """One call of a batch. `source_index` is its index in the assistant message's full content
    list (HA-11); its result is written under `result_entry_id` (staged at `pending_entry` when
    `outcome_ready`)."""

    source_index: int
    result_entry_id: str
    status: ToolCallStatus = "planned"
    replay: Literal["never", "safe"] | None = None
    terminate: bool = False


class ToolBatch(Record):
    """The calls of one assistant reply; args are at `tool_args(op, turn_id, source_index)`."""

    assistant_entry_id: str
    turn_id: str
    config: LaneConfig
    calls: list[ToolCallState]
    step: int = 1


class RunTools(_Phase):
    phase: Literal["tools"] = "tools"
    batch: ToolBatch


class DeferredSuspended(_Phase):
    """The provider will answer later; the handle is in the assistant entry `source_entry_id`."""

    phase: Literal["deferred_suspended"] = "deferred_suspended"
    generation: GenerationContext
    source_entry_id: str
    poll: int = 0


class DeferredEffectPending(_Phase):
    phase: Literal["deferred_effect_pending"] = "deferred_effect_pending"
    generation: GenerationContext
    source_entry_id: str
    poll: int
    response_entry_id: str
    usage_id: str


class SummaryTask(Record):
    """A compaction or branch summary to produce; `resume_after` is where a run continues (None:
    the operation ends with it)."""

    task_id: str
    reason: Literal["manual", "threshold", "overflow", "navigation"]
    custom_instructions: CleanStr | None = None
    resume_after: RunCheckpoint | None = None


class SummaryPending(_Phase):
    """A summary request is planned (`attempt` 0) or in flight under the reserved `usage_id`."""

    phase: Literal["summary_pending"] = "summary_pending"
    task: SummaryTask
    config: LaneConfig
    result_entry_id: str
    attempt: int = 0
    max_attempts: int = 1
    usage_id: str | None = None


class SummaryRetryWait(_Phase):
    phase: Literal["summary_retry_wait"] = "summary_retry_wait"
    task: SummaryTask
    config: LaneConfig
    result_entry_id: str
    next_attempt: int
    max_attempts: int
    not_before: int
    error_message: CleanStr


class NavigationReady(_Phase):
    """Move the tip to `target_id` (with the summary entry, if any, already written)."""

    phase: Literal["navigation_ready"] = "navigation_ready"
    target_id: str | None
    label: CleanStr | None = None


class FailureProvenance(Record):
    """Where a run-level failure came from (HA-26)."""

    kind: Literal["provider", "tool", "configuration", "storage"]


class FailureDrain(_Phase):
    """The operation failed; queues are drained before it settles as failed."""

    phase: Literal["failure_drain"] = "failure_drain"
    error: OperationErrorRecord
    provenance: FailureProvenance


OperationState: TypeAlias = Annotated[
    RunStarting
    | RunCheckpoint
    | AssistantReady
    | AssistantEffectPending
    | AssistantRetryWait
    | RunTools
    | DeferredSuspended
    | DeferredEffectPending
    | SummaryPending
    | SummaryRetryWait
    | NavigationReady
    | FailureDrain,
    Field(discriminator="phase"),
]

# Which phases each operation kind may be in (HA-2: intent and state kinds must agree).
PHASES_OF_KIND: dict[str, frozenset[str]] = {
    "run": frozenset({
        "starting", "checkpoint", "assistant_ready", "assistant_effect_pending", "assistant_retry_wait",
        "tools", "deferred_suspended", "deferred_effect_pending", "summary_pending", "summary_retry_wait",
        "failure_drain",
    }),
    "compaction": frozenset({"summary_pending", "summary_retry_wait", "failure_drain"}),
    "navigation": frozenset({"summary_pending", "summary_retry_wait", "navigation_ready", "failure_drain"}),
}


class PendingMessage(Record):
    """A queued message waiting to be placed on the branch."""

    type: Literal["message"] = "message"
    message: Message


class PendingCustom(Record):
    """A queued custom entry waiting to be placed on the branch."""

    type: Literal["custom"] = "custom"
    custom_type: CleanStr
    data: CleanJson | None = None


PendingEntry: TypeAlias = Annotated[PendingMessage | PendingCustom, Field(discriminator="type")]


class UsageRow(BaseModel):
    """One row of the append-only usage ledger; `adjustment` rows are not tied to a reply."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    seq: int
    usage: Usage
    entry_id: str | None = None
    adjustment: bool = False
    details: CleanJson | None = None
