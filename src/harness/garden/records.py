"""What a garden keeps about itself and its goals, as JSON files in its runtime root."""

from __future__ import annotations

from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.garden.root import NameKind, name_problem
from harness.messages import CleanStr, ModelIdentity

GoalType: TypeAlias = Literal["converse", "tend", "durable"]
"""`tend`: recurs on a schedule; `durable`: pursued run after run until the gardener concludes it;
`converse`: answered once, in its origin conversation."""

GoalState: TypeAlias = Literal["active", "paused", "done", "dropped"]
"""A goal's status, in the words of the conversation's `GoalStatus` row."""

GARDENER = "gardener"
"""The caller identity of the gardener's runs: the only caller operator messages accept (OM-8)."""


def _named(kind: NameKind, value: str) -> str:
    if (problem := name_problem(kind, value)) is not None:
        raise ValueError(problem)
    return value


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ConversationOrigin(_Record):
    """A goal that came from a conversation: which one, and the message that started it."""

    kind: Literal["conversation"] = "conversation"
    conversation_id: CleanStr = Field(min_length=1)
    message_id: CleanStr = Field(min_length=1)


class Gardener(_Record):
    """The gardener agent: its model, its instructions (the system prompt of its runs) and the
    built-in tools it may use besides its own, which run in the runtime root's `work/` folder."""

    model: ModelIdentity
    instructions: CleanStr = ""
    builtin_tools: tuple[CleanStr, ...] = ()


class GardenRecord(_Record):
    """`garden.json`: the garden's name, the user whose conversations it speaks in, its gardener,
    and the journal session its runs live in."""

    v: Literal[1] = 1
    name: str
    owner: CleanStr
    gardener: Gardener
    session_id: CleanStr
    created_at: int

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _named("garden name", value)


class Goal(_Record):
    """`goals/<id>.json`. `every_s` is a tend goal's schedule; `current_run_id` names the run
    pursuing it now (set before the run starts, cleared once it settled), `last_run_id` and
    `last_run_at` (Unix ms) the latest that settled."""

    v: Literal[1] = 1
    id: str
    type: GoalType
    text: CleanStr = Field(min_length=1)
    status: GoalState = "active"
    origin: ConversationOrigin | None = None
    every_s: float | None = Field(default=None, gt=0)
    created_at: int
    current_run_id: str | None = None
    last_run_id: str | None = None
    last_run_at: int | None = None

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        return _named("goal id", value)

    @field_validator("current_run_id", "last_run_id")
    @classmethod
    def _valid_run_id(cls, value: str | None) -> str | None:
        return None if value is None else _named("run id", value)

    @property
    def title(self) -> str:
        """The goal's first line, at most 80 characters: how a conversation's row names it."""
        first = self.text.strip().splitlines()[0] if self.text.strip() else self.text
        return first if len(first) <= 80 else first[:79] + "…"

    def due(self, now_ms: int) -> bool:
        """Whether a tending pass at `now_ms` pursues this goal: an active durable or converse goal
        always; an active tend goal when it never ran or its `every_s` has passed since."""
        if self.status != "active":
            return False
        due_at = self.scheduled_at()
        return due_at is None or now_ms >= due_at

    def scheduled_at(self) -> float | None:
        """When (Unix ms) a tend goal's schedule makes it due: `every_s` after its last run, or 0
        when it never ran; None for a goal without a schedule."""
        if self.type != "tend" or self.every_s is None:
            return None
        return 0 if self.last_run_at is None else self.last_run_at + self.every_s * 1000
