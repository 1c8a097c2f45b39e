"""The messages a step sends: the branch read back to its newest compaction, as provider messages."""

from __future__ import annotations

from collections.abc import Sequence

from harness.context import Context
from harness.messages import Message, UserMessage
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
