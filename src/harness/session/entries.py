"""Journal entries: immutable nodes of the session tree, and the payload of each entry type."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from harness.messages import (
    AssistantMessage,
    CleanJson,
    CleanStr,
    CustomMessage,
    Message,
    Record,
    ToolResultMessage,
    UserMessage,
)

ConversationMessage: TypeAlias = Annotated[
    UserMessage | AssistantMessage | ToolResultMessage, Field(discriminator="role")
]


class MessagePayload(Record):
    """A user message, an assistant reply or a tool result on the branch."""

    type: Literal["message"] = "message"
    message: ConversationMessage


class CustomMessagePayload(Record):
    """A message the model reads as user-role text, written by the application (e.g. a chat event)."""

    type: Literal["custom_message"] = "custom_message"
    message: CustomMessage


class CustomPayload(Record):
    """Application state on the branch that the model never reads."""

    type: Literal["custom"] = "custom"
    custom_type: CleanStr
    data: CleanJson | None = None


class CompactionPayload(Record):
    """A summary of the branch before this entry plus the retained tail of messages kept verbatim.

    Context reads stop here (HA-29): everything a request needs from older history is in
    `summary` and `retained_tail`. `tokens_before` is the context size that was compacted."""

    type: Literal["compaction"] = "compaction"
    summary: CleanStr
    retained_tail: list[Message] = Field(default_factory=list)
    tokens_before: int = 0
    details: CleanJson | None = None


class BranchSummaryPayload(Record):
    """A summary of a branch the lane navigated away from (`from_id`, its old tip)."""

    type: Literal["branch_summary"] = "branch_summary"
    from_id: CleanStr | None
    summary: CleanStr
    details: CleanJson | None = None


EntryPayload: TypeAlias = Annotated[
    MessagePayload | CustomMessagePayload | CustomPayload | CompactionPayload | BranchSummaryPayload,
    Field(discriminator="type"),
]
def custom_type_of(payload: EntryPayload) -> str | None:
    """The custom type a `custom` or `custom_message` payload carries (stored as a column for queries)."""
    if isinstance(payload, CustomPayload):
        return payload.custom_type
    if isinstance(payload, CustomMessagePayload):
        return payload.message.custom_type
    return None


EntryType: TypeAlias = Literal["message", "custom_message", "custom", "compaction", "branch_summary"]

ENTRY_PAYLOAD_ADAPTER: TypeAdapter[EntryPayload] = TypeAdapter(EntryPayload)


class Entry(BaseModel):
    """An immutable journal entry: `id`, `parent_id` (None at the root), the storage-assigned `seq`
    (strictly increasing within a session) and `timestamp` (Unix ms of its commit), and its payload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    parent_id: str | None
    seq: int
    timestamp: int
    payload: EntryPayload

    @property
    def type(self) -> EntryType:
        return self.payload.type


class BranchPage(BaseModel):
    """One page of a whole-branch read, newest first; `next_before` continues towards the root
    (None when the root was reached)."""

    model_config = ConfigDict(frozen=True)

    entries: list[Entry]
    next_before: str | None
