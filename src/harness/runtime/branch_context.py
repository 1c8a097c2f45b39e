"""The messages a step sends: the branch read back to its newest compaction, as provider messages,
and the lane's cached copy of it that each step extends instead of reading the journal again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.context import Context
from harness.messages import ImageContent, Message, UserMessage
from harness.session import (
    BranchSummaryPayload,
    CompactionPayload,
    CustomMessagePayload,
    Entry,
    MessagePayload,
    SessionReader,
    StorageCorruption,
    UnknownEntry,
)

SUMMARY_PREFIX = "The conversation so far was summarized to save space. Summary:\n\n"
BRANCH_SUMMARY_PREFIX = "Before this point the conversation explored another branch. Summary of it:\n\n"


async def branch_entries(reader: SessionReader, tip: str | None, context: Context) -> list[Entry]:
    """The entries from the newest compaction (included) to `tip`, oldest first (HA-29). A lane
    tip naming no entry is `StorageCorruption`."""
    entries: list[Entry] = []
    if tip is not None:
        try:
            await reader.scan_branch(tip, entries.append, context)
        except UnknownEntry as error:
            raise StorageCorruption(f"the lane's tip names entry {tip}, which is missing", entry_id=tip) from error
    entries.reverse()
    return entries


IMAGE_TOKENS = 1_600
"""What one image is counted as: providers bill an image by its pixels, not its base64 length
(about 1,600 tokens for a megapixel), so its bytes are not counted as text."""


def estimate_tokens(messages: Sequence[Message], system_prompt: str = "") -> int:
    """A rough token count of what `messages` (and `system_prompt`) send: four characters of
    their JSON per token, plus `IMAGE_TOKENS` per image."""
    chars, images = len(system_prompt), 0
    for message in messages:
        chars += len(message.__pydantic_serializer__.to_json(message).decode())
        for block in message.content if isinstance(message.content, list) else ():
            if isinstance(block, ImageContent):
                chars -= len(block.data)  # base64: its JSON form is as long as the data
                images += 1
    return chars // 4 + images * IMAGE_TOKENS


@dataclass
class BranchContext:
    """The decoded entries of a lane's branch from its newest compaction (included) to `tip`,
    oldest first, with the messages they project to and those messages' estimated tokens.

    A lane builds it on the first step that needs it (never at attachment, HA-3) and extends it in
    its own commit continuations, so a step decodes no entry twice and its cost does not grow with
    history; compaction bounds its size. An entry placed after a compaction restarts it from that
    compaction, as a read would (HA-29)."""

    tip: str | None
    entries: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    tokens: int = 0

    @classmethod
    def of(cls, entries: Sequence[Entry]) -> BranchContext:
        """The context of `entries`, oldest first, whose newest is the tip."""
        branch = cls(tip=None)
        branch.extend(entries)
        return branch

    def extend(self, entries: Sequence[Entry]) -> None:
        """Add `entries`, a chain whose first entry's parent is `tip`."""
        for entry in entries:
            if isinstance(entry.payload, CompactionPayload):
                self.entries, self.messages, self.tokens = [], [], 0
            self.entries.append(entry)
            messages = context_messages([entry])
            self.messages.extend(messages)
            self.tokens += estimate_tokens(messages)
            self.tip = entry.id

    def entry(self, entry_id: str) -> Entry | None:
        """The entry `entry_id` if it is on this part of the branch (newest looked at first)."""
        return next((entry for entry in reversed(self.entries) if entry.id == entry_id), None)


def context_messages(entries: Sequence[Entry]) -> list[Message]:
    """Project branch entries into the message list a step starts from.

    A compaction becomes its summary (as a user message) followed by its retained tail; a branch
    summary becomes a user message; custom entries the model never reads are left out. Errored and
    aborted replies stay: the `transform_context` hook sees them (CE-8), the adapter drops the rest.
    """
    messages: list[Message] = []
    for entry in entries:
        payload = entry.payload
        if isinstance(payload, CompactionPayload):
            messages.append(UserMessage(content=SUMMARY_PREFIX + payload.summary, timestamp=entry.timestamp))
            messages.extend(payload.retained_tail)
        elif isinstance(payload, BranchSummaryPayload):
            messages.append(UserMessage(content=BRANCH_SUMMARY_PREFIX + payload.summary, timestamp=entry.timestamp))
        elif isinstance(payload, MessagePayload | CustomMessagePayload):
            messages.append(payload.message)
    return messages
