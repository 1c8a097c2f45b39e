"""Import of pi coding-agent session files (JSONL) into a new conversation.

Formats. v1 (a `session` header without `version`, entries without ids, one linear branch in file
order) is what pi wrote until late 2025 and what the real fixtures hold. v2 (entries with
`id`/`parentId`: a tree) and v3 (v2 with the `hookMessage` role renamed `custom`) are read too; their
branch is the path from the file's last entry (pi's leaf) back to the root, and entries on other
paths are counted as skipped. Any other header or version raises `UnsupportedFormat`.

How records map, nothing invented. pi writes no record of its own for a stopped or failed turn: it
shows the person the assistant message's stop reason (and error text). So the row that says so is
added right after that message (a chat-event row, `chat_event_message`, CE-1, with its time), and
the message itself is kept as it was, for the next request to replay its text (CE-8):

| pi records | chat-event row after it |
|---|---|
| an assistant message with `stopReason: "aborted"` | `Interrupted(cause="user")` (pi aborts on the person's Esc) |
| an assistant message with `stopReason: "error"` | `ErrorDetails(text)`, `errorMessage` cleaned, no notice |

Error text is cleaned by `clean_public_text` (pi's own or the provider's text, so no notice). A
`compaction` gets no `Compacted` row: pi does not record whether it was asked for or automatic.
Everything else keeps the source's own shape:
- `message`: `user`, `assistant` and `toolResult` become conversation messages with the same
  content (`toolUse` becomes stop reason `tool_use`; a usage without `totalTokens` gets the sum of
  its counts; a tool call's `partialJson`, the unparsed text of `arguments` left over from
  streaming, is dropped). A role `custom` (v3) or `hookMessage` (v2) message becomes a
  `custom_message` entry of type `pi.<customType>`; a `bashExecution` message (a person's `!cmd`)
  becomes a `custom_message` `pi.bash_execution` holding the text pi gives the model for it, or a
  `custom` entry when pi keeps it out of the model's context.
- `model_change` and `thinking_level_change` become `custom` entries `import.model_change` and
  `import.thinking_level_change`; the lane config takes the last values (else the header's).
- `compaction` becomes a compaction entry whose `retained_tail` copies the messages (rows
  included) from the first kept entry up to the compaction; the branch itself still holds every message before it. v1
  `firstKeptEntryIndex` counts the file's records from its first line, the header being 0, as pi's
  own v1-to-v2 migration reads it (the real file's index lands on the user message that opens a
  turn); v2 and v3 name the entry (`firstKeptEntryId`).
- `branch_summary` becomes a branch summary entry; pi's `fromId` names an entry on the path left
  behind, which is not imported, so it is kept in `details` and `from_id` is None.
- `custom` and `custom_message` entries keep their data under type `pi.<customType>`.
- `label` entries label the imported entry they target; the last `session_info` name names the
  session (else the first user text, else the file name).
- A root `custom` entry `import.source` keeps the header. An entry of a type this module does not
  know becomes a `custom` entry `import.pi.unknown` holding the record, with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from harness.context import Context
from harness.conversation import ChatEventDetails, ErrorDetails, Interrupted
from harness.conversation.turn_rows import clean_public_text
from harness.imports.plan import (
    ImportPlan,
    ImportReport,
    Raw,
    chat_event_row,
    clip_name,
    first_user_name,
    iso_ms,
    read_jsonl,
    write_plan,
)
from harness.messages import (
    MESSAGE_ADAPTER,
    THINKING_LEVELS,
    AssistantMessage,
    CustomMessage,
    Message,
    ModelIdentity,
)
from harness.session import (
    BranchSummaryPayload,
    CompactionPayload,
    CustomMessagePayload,
    CustomPayload,
    EntryPayload,
    MessagePayload,
    Store,
)

SUPPORTED_VERSIONS = (1, 2, 3)

_STOP_REASONS = {"stop": "stop", "length": "length", "toolUse": "tool_use", "error": "error",
                 "aborted": "aborted"}
# Settings and bookkeeping: they change records beside the branch, never become entries.
_SETTING_TYPES = frozenset({"label", "session_info"})


async def import_pi_session(store: Store, path: str | Path, user: str, context: Context) -> ImportReport:
    """Read the pi session file at `path` into a new conversation of `user` in `store` whose lane
    `main` holds its branch, and return what was written.

    The whole file is read and checked before anything is written. Raises `UnsupportedFormat`
    (nothing written) when the first line is not a pi `session` header, its version is not 1, 2
    or 3, or a record lacks what its type needs; `InvalidInput` when the file cannot be read."""
    context.raise_if_cancelled()
    plan = ImportPlan("pi", Path(path))
    records = await read_jsonl(plan.path, plan)
    _PiPlanner(plan).run(records)
    return await write_plan(store, plan, user, context)


@dataclass(frozen=True)
class _Item:
    """One record of the file: its index among the records (header 0), line number and JSON."""

    index: int
    line: int
    raw: Raw

    @property
    def id(self) -> str | None:
        value = self.raw.get("id")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class _Placed:
    """A branch record already planned: the message it contributes to a compaction's tail."""

    item: _Item
    message: Message | None


class _PiPlanner:
    def __init__(self, plan: ImportPlan) -> None:
        self.plan = plan
        self.placed: list[_Placed] = []
        self.position_of: dict[str, int] = {}  # pi entry id -> branch position, for labels

    def run(self, records: list[tuple[int, Raw]]) -> None:
        plan = self.plan
        items = [_Item(index, line, raw) for index, (line, raw) in enumerate(records)]
        header = items[0]
        if header.raw["type"] != "session":
            raise plan.unsupported(header.line, "not a pi session file: the first line is not a "
                                                "`session` header")
        version = header.raw.get("version", 1)
        if type(version) is not int or version not in SUPPORTED_VERSIONS:
            raise plan.unsupported(header.line, f"pi session format version {version!r} is not "
                                                f"supported (supported: 1, 2, 3)")
        self._read_header(header, version)
        entries = items[1:]
        branch = entries if version == 1 else self._leaf_path(entries)
        for item in branch:
            with plan.reading(item.line):
                self._place(item)
        # Labels and the session name come from every entry of the file in order, as pi reads them.
        for item in entries:
            with plan.reading(item.line):
                self._apply_setting(item)
        if plan.name is None:
            plan.name = first_user_name(plan.entries) or plan.path.stem

    def _read_header(self, header: _Item, version: int) -> None:
        raw = header.raw
        provider, model_id = raw.get("provider"), raw.get("modelId")
        if isinstance(provider, str) and isinstance(model_id, str):
            self.plan.model = ModelIdentity(provider=provider, model_id=model_id)
        self._set_thinking_level(header.line, raw.get("thinkingLevel"))
        self.plan.add(CustomPayload(custom_type="import.source",
                                    data={"format": "pi", "version": version, "file": self.plan.path.name,
                                          "header": raw}))

    def _leaf_path(self, entries: list[_Item]) -> list[_Item]:
        """The entries from the root to the last entry of the file, following `parentId`."""
        by_id: dict[str, _Item] = {}
        for item in entries:
            if item.id is None:
                raise self.plan.unsupported(item.line, "a v2/v3 entry must have a string `id`")
            by_id[item.id] = item
        path: list[_Item] = []
        seen: set[str] = set()
        current: _Item | None = entries[-1] if entries else None
        while current is not None:
            assert current.id is not None
            seen.add(current.id)
            path.append(current)
            parent = current.raw.get("parentId")
            if parent is None:
                break
            current = by_id.get(parent)
            if current is None:
                self.plan.warn(path[-1].line, f"entry {path[-1].id} names parent {parent}, which is "
                                              "not in the file; the branch starts at this entry")
            elif current.id in seen:
                self.plan.warn(path[-1].line, f"entry {path[-1].id} names parent {parent}, which is "
                                              "its own descendant; the branch starts at this entry")
                break
        for item in entries:
            if item.id not in seen and item.raw["type"] not in _SETTING_TYPES:
                self.plan.skipped["entry on another branch"] += 1
        return path[::-1]

    def _place(self, item: _Item) -> None:
        raw = item.raw
        kind = raw["type"]
        payload: EntryPayload | None
        message: Message | None = None
        if kind == "message":
            payload, message = self._message(item)
        elif kind == "model_change":
            provider, model_id = str(raw["provider"]), str(raw["modelId"])
            self.plan.model = ModelIdentity(provider=provider, model_id=model_id)
            payload = CustomPayload(custom_type="import.model_change",
                                    data={"provider": provider, "model_id": model_id})
        elif kind == "thinking_level_change":
            level = raw["thinkingLevel"]
            self._set_thinking_level(item.line, level)
            payload = CustomPayload(custom_type="import.thinking_level_change", data={"thinking_level": level})
        elif kind == "compaction":
            payload = self._compaction(item)
        elif kind == "branch_summary":
            payload = BranchSummaryPayload(
                from_id=None, summary=raw["summary"],
                details={"pi_from_id": raw.get("fromId"), "details": raw.get("details")},
            )
        elif kind == "custom":
            payload = CustomPayload(custom_type=f"pi.{raw['customType']}", data=raw.get("data"))
        elif kind == "custom_message":
            message = _custom_message(raw, raw.get("timestamp"))
            payload = CustomMessagePayload(message=message)
        elif kind in _SETTING_TYPES:
            payload = None
        else:
            self.plan.warn(item.line, f"unknown pi entry type {kind!r}, kept as custom entry "
                                      "import.pi.unknown")
            payload = CustomPayload(custom_type="import.pi.unknown", data=raw)
        if payload is None:
            return
        position = self.plan.add(payload)
        if item.id is not None:
            self.position_of[item.id] = position
        self.placed.append(_Placed(item, message))
        if isinstance(message, AssistantMessage) and (details := _turn_end(message)) is not None:
            row = chat_event_row(details, message.timestamp)
            self.plan.add(row)
            self.placed.append(_Placed(item, row.message))

    def _message(self, item: _Item) -> tuple[EntryPayload, Message | None]:
        message = item.raw["message"]
        role = message["role"]
        timestamp = message.get("timestamp", item.raw.get("timestamp"))
        if role in ("custom", "hookMessage"):
            custom = _custom_message(message, timestamp)
            return CustomMessagePayload(message=custom), custom
        if role == "bashExecution":
            return _bash_execution(message, timestamp)
        if role not in ("user", "assistant", "toolResult"):
            self.plan.warn(item.line, f"unknown pi message role {role!r}, kept as custom entry "
                                      "import.pi.unknown")
            return CustomPayload(custom_type="import.pi.unknown", data=item.raw), None
        converted = MESSAGE_ADAPTER.validate_python(_conversation_message(message, timestamp), strict=False)
        return MessagePayload.model_validate({"message": converted}), converted

    def _compaction(self, item: _Item) -> CompactionPayload:
        raw = item.raw
        kept_index, kept_id = raw.get("firstKeptEntryIndex"), raw.get("firstKeptEntryId")
        start = next(
            (
                position
                for position, placed in enumerate(self.placed)
                if (kept_id is not None and placed.item.id == kept_id)
                or (kept_id is None and placed.item.index == kept_index)
            ),
            None,
        )
        if start is None:
            self.plan.warn(item.line, f"compaction keeps from entry {kept_id or kept_index!r}, which is not "
                                      "an earlier entry of the branch; its retained tail is empty")
        tail = [p.message for p in self.placed[start or len(self.placed):] if p.message is not None]
        kept_keys = ("firstKeptEntryIndex", "firstKeptEntryId", "details", "fromHook")
        details: dict[str, JsonValue] = {key: raw[key] for key in kept_keys if key in raw}
        return CompactionPayload(summary=raw["summary"], retained_tail=tail,
                                 tokens_before=int(raw.get("tokensBefore") or 0), details=details)

    def _apply_setting(self, item: _Item) -> None:
        kind = item.raw["type"]
        if kind == "label":
            target = self.position_of.get(str(item.raw["targetId"]))
            label = item.raw.get("label")
            if target is None:
                self.plan.skipped["label of an entry not imported"] += 1
            elif isinstance(label, str) and label:
                self.plan.labels[target] = label
            else:  # pi clears a label with an empty one
                self.plan.labels.pop(target, None)
        elif kind == "session_info" and isinstance(item.raw.get("name"), str):
            self.plan.name = clip_name(item.raw["name"]) or self.plan.name

    def _set_thinking_level(self, line: int, level: Any) -> None:
        if level is None:
            return
        if level in THINKING_LEVELS:
            self.plan.thinking_level = level
        else:
            self.plan.warn(line, f"unknown thinking level {level!r}; the lane keeps "
                                 f"{self.plan.thinking_level!r}")


def _turn_end(reply: AssistantMessage) -> ChatEventDetails | None:
    """The row pi's stopped or failed `reply` shows the person (see the module docstring)."""
    if reply.stop_reason == "aborted":
        return Interrupted(cause="user")
    if reply.stop_reason == "error":
        return ErrorDetails(text=clean_public_text(reply.error_message or ""))
    return None


def _conversation_message(message: Raw, timestamp: object) -> Raw:
    """A pi user, assistant or tool-result message in this package's field names."""
    role = message["role"]
    out: Raw = {}
    if (ms := _ms(timestamp)) is not None:
        out["timestamp"] = ms
    if role == "user":
        return {**out, "role": "user", "content": _user_content(message["content"])}
    if role == "toolResult":
        return {**out, "role": "tool_result", "tool_call_id": message["toolCallId"],
                "tool_name": message["toolName"], "content": _user_content(message["content"]),
                "details": message.get("details"), "is_error": bool(message.get("isError", False))}
    stop_reason = message["stopReason"]
    if stop_reason not in _STOP_REASONS:
        raise ValueError(f"unknown stop reason {stop_reason!r}")
    return {
        **out,
        "role": "assistant",
        "content": [_assistant_block(block) for block in message["content"]],
        "api": message["api"],
        "provider": message["provider"],
        "model": message["model"],
        "usage": _usage(message.get("usage") or {}),
        "stop_reason": _STOP_REASONS[stop_reason],
        "error_message": message.get("errorMessage"),
        "response_id": message.get("responseId"),
    }


def _user_content(content: Any) -> str | list[Raw]:
    if isinstance(content, str):
        return content
    blocks: list[Raw] = []
    for block in content:
        if block["type"] == "text":
            blocks.append({"type": "text", "text": block["text"]})
        elif block["type"] == "image":
            blocks.append({"type": "image", "data": block["data"], "mime_type": block["mimeType"]})
        else:
            raise ValueError(f"unknown content block type {block['type']!r}")
    return blocks


def _assistant_block(block: Raw) -> Raw:
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": block["text"]}
    if kind == "thinking":
        return {"type": "thinking", "thinking": block["thinking"], "signature": block.get("thinkingSignature"),
                "redacted": bool(block.get("redacted", False))}
    if kind == "toolCall":
        return {"type": "tool_call", "id": block["id"], "name": block["name"], "arguments": block["arguments"]}
    raise ValueError(f"unknown assistant content block type {kind!r}")


def _usage(usage: Raw) -> Raw:
    counts = {ours: int(usage.get(theirs) or 0) for ours, theirs in
              (("input", "input"), ("output", "output"), ("cache_read", "cacheRead"), ("cache_write", "cacheWrite"))}
    cost = usage.get("cost") or {}
    total = usage.get("totalTokens")
    return {
        **counts,
        # Older pi files leave `totalTokens` out; pi's later versions write exactly this sum.
        "total_tokens": int(total) if total is not None else sum(counts.values()),
        "cost": {ours: float(cost.get(theirs) or 0.0) for ours, theirs in
                 (("input", "input"), ("output", "output"), ("cache_read", "cacheRead"),
                  ("cache_write", "cacheWrite"), ("total", "total"))},
    }


def _custom_message(raw: Raw, timestamp: object) -> CustomMessage:
    data: Raw = {"custom_type": f"pi.{raw['customType']}", "content": _user_content(raw["content"]),
                 "display": bool(raw.get("display", True)), "details": raw.get("details")}
    if (ms := _ms(timestamp)) is not None:
        data["timestamp"] = ms
    return CustomMessage.model_validate(data, strict=False)


def _bash_execution(message: Raw, timestamp: object) -> tuple[EntryPayload, Message | None]:
    """A person's `!cmd` run: what pi shows the model for it, or a `custom` entry when pi keeps it
    out of the model's context (`excludeFromContext`, the `!!` prefix)."""
    record = {key: value for key, value in message.items() if key != "role"}
    if message.get("excludeFromContext"):
        return CustomPayload(custom_type="pi.bash_execution", data=record), None
    output = message.get("output") or ""
    text = f"Ran `{message['command']}`\n" + (f"```\n{output}\n```" if output else "(no output)")
    if message.get("cancelled"):
        text += "\n\n(command cancelled)"
    elif message.get("exitCode") not in (None, 0):
        text += f"\n\nCommand exited with code {message['exitCode']}"
    data: Raw = {"custom_type": "pi.bash_execution", "content": text, "details": record}
    if (ms := _ms(timestamp)) is not None:
        data["timestamp"] = ms
    custom = CustomMessage.model_validate(data, strict=False)
    return CustomMessagePayload(message=custom), custom


def _ms(timestamp: object) -> int | None:
    """pi messages carry Unix ms; entries carry ISO strings."""
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool):
        return int(timestamp)
    return iso_ms(timestamp)

