"""Records kept at addresses beside the entries: lane configuration and state, operations,
pending entries, usage rows. Only their shapes live here; the harness gives them meaning."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from harness.messages import CleanJson, CleanStr, Message, ModelIdentity, Usage

ThinkingLevel: TypeAlias = Literal["off", "minimal", "low", "medium", "high", "xhigh"]
OperationKind: TypeAlias = Literal["run", "compaction", "navigation"]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class LaneConfig(_Record):
    """What a lane runs with: the model identity (unresolved), thinking level, active tool names."""

    model: ModelIdentity
    thinking_level: ThinkingLevel = "off"
    active_tools: list[CleanStr] = []


class LaneState(_Record):
    """A lane's current operation (None when idle) and the ids of its pending next-run entries."""

    current_operation_id: str | None = None
    pending_next_run: list[str] = []


class OperationErrorRecord(_Record):
    """A machine-readable run-level failure (HA-26): stable `code`, English `message`, `details`."""

    code: CleanStr
    message: CleanStr
    details: CleanJson | None = None


class LaneLastResult(_Record):
    """How the lane's latest operation ended."""

    operation_id: str
    kind: OperationKind
    outcome: Literal["completed", "failed", "aborted"]
    tip_id: str | None
    final_assistant_entry_id: str | None = None
    error: OperationErrorRecord | None = None
    started_at: int
    ended_at: int


class RunIntent(_Record):
    kind: Literal["run"] = "run"
    prompt_entry_ids: list[str]


class CompactionIntent(_Record):
    kind: Literal["compaction"] = "compaction"
    custom_instructions: CleanStr | None = None


class NavigationIntent(_Record):
    kind: Literal["navigation"] = "navigation"
    target_id: str | None
    summarize: bool = False
    label: CleanStr | None = None
    custom_instructions: CleanStr | None = None


OperationIntent: TypeAlias = Annotated[
    RunIntent | CompactionIntent | NavigationIntent, Field(discriminator="kind")
]


class OperationMeta(_Record):
    """An operation's intent, written once when it is accepted."""

    operation_id: str
    lane: str
    source_tip_id: str | None
    started_at: int
    intent: OperationIntent


class RunStarting(_Record):
    """Accepted and nothing done yet; payload-free (HA-19)."""

    kind: Literal["run"] = "run"
    phase: Literal["starting"] = "starting"


# The drive issue adds the later phases of a run and the compaction and navigation states.
OperationState: TypeAlias = Annotated[RunStarting, Field(discriminator="phase")]


class PendingMessage(_Record):
    """A queued message waiting to be placed on the branch."""

    type: Literal["message"] = "message"
    message: Message


class PendingCustom(_Record):
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
