"""The display read: a conversation's branch as the rows a person's surface draws, page by page
(CE-24).

It is the only read that shows `harness.message-blocks` entries: the context a request sends, the
watch snapshot a restart recovers from and the terminal's tail leave them out, so a finished turn
still reads as finished after a restart. A page is shaped on its own: a blocks entry goes on its
reply's row when the reply is on the same page, and is a row of its own (`BlocksRow`, naming the
reply) when a page boundary separates them; a tool call whose result is on a newer page is a
`ToolRow` on each page, with the same id, for the surface to fold into one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from harness.conversation.blocks import MessageBlock, message_blocks_of
from harness.conversation.chat_events import ChatEventDetails, chat_event_of
from harness.conversation.delegation import DelegationFinish, subagent_result_of
from harness.messages import (
    AssistantMessage,
    ImageContent,
    StopReason,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
    text_of,
)
from harness.session import CustomMessagePayload, Entry, MessagePayload

DISPLAY_PAGE = 100
"""Entries one display page reads by default."""
MAX_DISPLAY_PAGE = 1_000


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BlocksRow(_Row):
    """A reply's blocks: `id` is the blocks entry's, the same as the live `MessageBlocksPublished`
    row's, and `assistant_id` names the reply they belong to."""

    kind: Literal["blocks"] = "blocks"
    id: str
    assistant_id: str | None
    blocks: list[MessageBlock]


class UserRow(_Row):
    """What the person sent: its text and how many images came with it; `timestamp` in Unix ms."""

    kind: Literal["user"] = "user"
    id: str
    text: str
    image_count: int = 0
    timestamp: int


class AssistantRow(_Row):
    """A reply: its text, its reasoning (empty when redacted or none), how it stopped, which
    model wrote it (`provider/model`), its error text when it failed, and its blocks."""

    kind: Literal["assistant"] = "assistant"
    id: str
    text: str
    thinking: str = ""
    stop_reason: StopReason
    model: str
    error_message: str | None = None
    blocks: BlocksRow | None = None
    timestamp: int


class ToolResultView(_Row):
    """A tool call's result: the result entry's `id`, its text and whether it failed."""

    id: str
    text: str
    is_error: bool


class ToolRow(_Row):
    """A tool call with its result. `id` is the tool call's id; `assistant_id` and `arguments`
    are None on a row that holds only a result (its call is on an older page)."""

    kind: Literal["tool"] = "tool"
    id: str
    tool_name: str
    assistant_id: str | None
    arguments: dict[str, JsonValue] | None
    result: ToolResultView | None = None


class EventRow(_Row):
    """A chat event (CE-2): its entry's id and its typed details, which a surface words."""

    kind: Literal["event"] = "event"
    id: str
    details: ChatEventDetails


class DelegationRow(_Row):
    """Where a delegated job's result reached the conversation (CE-18): the hidden result
    message's entry id and its finish marker, which a surface words."""

    kind: Literal["delegation"] = "delegation"
    id: str
    finish: DelegationFinish


class SenderRow(_Row):
    """A message from someone other than the person or the model (e.g. a garden's operator): a
    displayed custom message whose `details.sender` names who sent it."""

    kind: Literal["message"] = "message"
    id: str
    sender: str
    custom_type: str
    text: str
    timestamp: int


DisplayRow: TypeAlias = Annotated[
    UserRow | AssistantRow | ToolRow | EventRow | DelegationRow | SenderRow | BlocksRow, Field(discriminator="kind")
]


class DisplayPage(_Row):
    """One page of rows, oldest first; pass `next_before` as `before` for the older page (None
    when the page reached the start of the conversation)."""

    rows: list[DisplayRow]
    next_before: str | None


def blocks_row(entry: Entry) -> BlocksRow | None:
    """The row of a `harness.message-blocks` entry, on the reply it follows; None for any other
    entry. The display read and the live stream (`MessageBlocksPublished`) draw the same row."""
    data = message_blocks_of(entry)
    return BlocksRow(id=entry.id, assistant_id=entry.parent_id, blocks=data.blocks) if data is not None else None


def _images(content: str | Sequence[UserContent]) -> int:
    return 0 if isinstance(content, str) else sum(isinstance(block, ImageContent) for block in content)


def display_rows(entries: Sequence[Entry]) -> list[DisplayRow]:
    """`entries` (one page of a branch, oldest first) as display rows, oldest first (CE-24):
    user messages, replies with their blocks, tool calls with their results, chat events, the
    finish markers of delegated jobs and messages from other senders; every other entry shows
    nothing."""
    results = {entry.payload.message.tool_call_id: entry for entry in entries
               if isinstance(entry.payload, MessagePayload) and isinstance(entry.payload.message, ToolResultMessage)}
    replies = {entry.id for entry in entries
               if isinstance(entry.payload, MessagePayload) and isinstance(entry.payload.message, AssistantMessage)}
    blocks: dict[str, BlocksRow] = {}
    for entry in entries:
        if (row := blocks_row(entry)) is not None:
            blocks.setdefault(entry.id, row)
    on_reply = {row.assistant_id: row for row in blocks.values() if row.assistant_id in replies}
    called: set[str] = set()
    rows: list[DisplayRow] = []
    for entry in entries:
        payload = entry.payload
        if isinstance(payload, CustomMessagePayload):
            custom = payload.message
            if (details := chat_event_of(custom)) is not None:
                rows.append(EventRow(id=entry.id, details=details))
            elif (result := subagent_result_of(custom)) is not None:
                if result.finish is not None:
                    rows.append(DelegationRow(id=entry.id, finish=result.finish))
            elif custom.display and isinstance(custom.details, dict) and isinstance(
                    sender := custom.details.get("sender"), str):
                rows.append(SenderRow(id=entry.id, sender=sender, custom_type=custom.custom_type,
                                      text=text_of(custom.content, "\n"), timestamp=custom.timestamp))
        elif entry.id in blocks and blocks[entry.id].assistant_id not in replies:
            rows.append(blocks[entry.id])
        elif not isinstance(payload, MessagePayload):
            continue
        elif isinstance(message := payload.message, UserMessage):
            rows.append(UserRow(id=entry.id, text=text_of(message.content, "\n"), image_count=_images(message.content),
                                timestamp=message.timestamp))
        elif isinstance(message, AssistantMessage):
            rows.append(_reply(entry.id, message, on_reply.get(entry.id)))
            for call in message.tool_calls:
                called.add(call.id)
                rows.append(_tool_row(call.id, call.name, entry.id, call, results.get(call.id)))
        elif message.tool_call_id not in called:
            rows.append(_tool_row(message.tool_call_id, message.tool_name, None, None, entry))
    return rows


def _reply(entry_id: str, message: AssistantMessage, blocks: BlocksRow | None) -> AssistantRow:
    thinking = [block.thinking for block in message.content if isinstance(block, ThinkingContent)
                and not block.redacted]
    return AssistantRow(id=entry_id, text=text_of(message.content, "\n"),
                        thinking="\n".join(thinking), stop_reason=message.stop_reason,
                        model=f"{message.provider}/{message.model}", error_message=message.error_message,
                        blocks=blocks, timestamp=message.timestamp)


def _tool_row(call_id: str, name: str, assistant_id: str | None, call: ToolCall | None,
              result: Entry | None) -> ToolRow:
    view = None
    if result is not None and isinstance(result.payload, MessagePayload) and isinstance(
            message := result.payload.message, ToolResultMessage):
        view = ToolResultView(id=result.id, text=text_of(message.content, "\n"), is_error=message.is_error)
    return ToolRow(id=call_id, tool_name=name, assistant_id=assistant_id,
                   arguments=dict(call.arguments) if call is not None else None, result=view)
