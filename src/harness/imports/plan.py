"""What both importers share: reading a JSONL file, the in-memory plan of the session it becomes,
and writing that plan into a new conversation of the importing user."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.context import Context
from harness.conversation import ChatEventDetails
from harness.conversation.chat_events import chat_event_message
from harness.conversation.service import OWNER
from harness.errors import InvalidInput, UnsupportedFormat
from harness.messages import (
    AssistantMessage,
    ModelIdentity,
    ThinkingLevel,
    ToolResultMessage,
    UserMessage,
    parse_json_text,
    text_of,
)
from harness.session import (
    CompactionPayload,
    CustomMessagePayload,
    EntryPayload,
    LaneConfig,
    LaneState,
    MessagePayload,
    SessionMutator,
    Store,
    addresses,
)

LANE = "main"
NAME_LIMIT = 80
# A lane must name a model; a file that names none gets this, with a warning, rather than a guess.
UNKNOWN_MODEL = ModelIdentity(provider="unknown", model_id="unknown")

Raw = dict[str, Any]


class ImportReport(BaseModel):
    """What an import wrote and what it noticed.

    `messages` counts the user, assistant and tool-result messages on lane `main`'s branch;
    `tool_calls` the calls in its assistant messages and `unanswered_tool_calls` those the file
    never answered (left unanswered; a later layer answers them when it builds a request);
    `compactions` the compaction entries; `entries` every entry written. `skipped` counts source
    records, by kind, that became no entry; `warnings` name what the file got wrong or what could
    not be placed (such as parent links to records that are not in the file), in file order."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    source_format: str
    messages: int
    tool_calls: int
    unanswered_tool_calls: int
    compactions: int
    entries: int
    skipped: dict[str, int]
    warnings: list[str]


@dataclass
class ImportPlan:
    """A whole file turned into entries in memory, before anything is written: the branch in order,
    labels by branch position, the session name and the lane's final settings."""

    source_format: str
    path: Path
    entries: list[EntryPayload] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)
    name: str | None = None
    model: ModelIdentity | None = None
    thinking_level: ThinkingLevel = "off"
    skipped: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)

    def add(self, payload: EntryPayload) -> int:
        """Append `payload` to the branch; returns its position."""
        self.entries.append(payload)
        return len(self.entries) - 1

    def warn(self, line: int | None, text: str) -> None:
        self.warnings.append(f"line {line}: {text}" if line is not None else text)

    def unsupported(self, line: int | None, text: str) -> UnsupportedFormat:
        where = f"{self.path.name} line {line}" if line is not None else self.path.name
        return UnsupportedFormat(f"{where}: {text}", path=str(self.path), line=line)

    @contextmanager
    def reading(self, line: int) -> Iterator[None]:
        """Turn a record that does not have the shape its type promises into `UnsupportedFormat`
        naming the line, so one bad record refuses the whole file before anything is written."""
        try:
            yield
        except UnsupportedFormat:
            raise
        except (KeyError, TypeError, AttributeError, ValidationError, ValueError) as error:
            detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
            raise self.unsupported(line, f"record does not have the expected shape: {detail}") from error


async def read_jsonl(path: Path, plan: ImportPlan) -> list[tuple[int, Raw]]:
    """The file's non-blank lines as `(line number, JSON object)`, numbered from 1.

    Raises `InvalidInput` if the file cannot be read and `UnsupportedFormat` if a line is not a
    JSON object."""
    try:
        data = await asyncio.to_thread(path.read_bytes)
    except OSError as error:
        raise InvalidInput(f"cannot read {path}: {error.strerror or error}", path=str(path)) from error
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise plan.unsupported(None, f"the file is not UTF-8 text ({error})") from error
    records: list[tuple[int, Raw]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = parse_json_text(line)
        except ValueError as error:
            raise plan.unsupported(number, f"not a JSON line ({error})") from error
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise plan.unsupported(number, "not a JSON object with a string `type`")
        records.append((number, value))
    if not records:
        raise plan.unsupported(None, "the file holds no records")
    return records


def iso_ms(value: object) -> int | None:
    """Unix milliseconds of an ISO 8601 timestamp string; None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def chat_event_row(details: ChatEventDetails, timestamp: int | None) -> CustomMessagePayload:
    """The chat-event entry of `details` (CE-1), stamped with the source's own time when it has one
    (Unix ms), so an imported row sits at the moment the person saw it happen."""
    message = chat_event_message(details)
    if timestamp is not None:
        message = message.model_copy(update={"timestamp": timestamp})
    return CustomMessagePayload(message=message)


def clip_name(text: str) -> str | None:
    """A session name from free text: its first non-blank line, clipped to `NAME_LIMIT` characters."""
    for line in text.splitlines():
        if line.strip():
            line = " ".join(line.split())
            return line if len(line) <= NAME_LIMIT else line[: NAME_LIMIT - 1] + "…"
    return None


def first_user_name(entries: list[EntryPayload]) -> str | None:
    """A session name from the first user message on the branch that has text."""
    for payload in entries:
        if isinstance(payload, MessagePayload) and isinstance(payload.message, UserMessage):
            name = clip_name(text_of(payload.message.content, "\n"))
            if name:
                return name
    return None


@dataclass(frozen=True)
class BranchCounts:
    """What an `ImportReport` counts on a branch (see its fields)."""

    messages: int
    tool_calls: int
    unanswered: int
    compactions: int


def count_branch(entries: list[EntryPayload]) -> BranchCounts:
    """The messages, tool calls (and how many of them no result answers) and compactions of a
    branch of payloads, oldest first."""
    messages = [p.message for p in entries if isinstance(p, MessagePayload)]
    calls = [call.id for m in messages if isinstance(m, AssistantMessage) for call in m.tool_calls]
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)}
    return BranchCounts(
        messages=len(messages),
        tool_calls=len(calls),
        unanswered=sum(1 for call in calls if call not in answered),
        compactions=sum(1 for p in entries if isinstance(p, CompactionPayload)),
    )


async def write_plan(store: Store, plan: ImportPlan, user: str, context: Context) -> ImportReport:
    """Create a new session holding `plan`: every entry, labels, name, lane `main` at the last
    entry and `user` as its owner, in one transaction, so no reader ever sees a partial branch and
    `ConversationService.open(user, session_id)` opens it as a conversation."""
    if plan.model is None:
        plan.warn(None, f"the file names no model; lane {LANE} is configured with {UNKNOWN_MODEL.spec}")
    config = LaneConfig.model_validate(
        {"model": plan.model or UNKNOWN_MODEL, "thinking_level": plan.thinking_level}
    )
    context.raise_if_cancelled()
    session = await store.create_session(context)

    async def write(m: SessionMutator) -> str | None:
        tip: str | None = None
        ids: list[str] = []
        for payload in plan.entries:
            tip = m.insert_entry(payload, parent_id=tip)
            ids.append(tip)
        for position, label in plan.labels.items():
            m.set(addresses.entry_label(ids[position]), label)
        if plan.name:
            m.set(addresses.session_name(), plan.name)
        m.set(OWNER, user)
        m.set(addresses.branch_tip(LANE), tip)
        m.set(addresses.lane_config(LANE), config)
        m.set(addresses.lane_state(LANE), LaneState())
        return tip

    await session.mutate(write, context)
    counts = count_branch(plan.entries)
    return ImportReport(
        session_id=session.id,
        source_format=plan.source_format,
        messages=counts.messages,
        tool_calls=counts.tool_calls,
        unanswered_tool_calls=counts.unanswered,
        compactions=counts.compactions,
        entries=len(plan.entries),
        skipped=dict(sorted(plan.skipped.items())),
        warnings=list(plan.warnings),
    )
