"""Import of Claude Code session transcripts (the JSONL files under `~/.claude/projects`) into a
new conversation.

Which records form the branch. Claude Code links records by `uuid` and `parentUuid` (a compact
boundary, which starts a new root, by `logicalParentUuid`), and a rewind leaves the abandoned path
in the file. The branch is the chain from the last conversation record (user, assistant or system,
not a sidechain) back to its root, plus what that chain leaves out of its own messages: Claude Code
hangs each streamed part of an assistant message and each parallel tool result on the record
written just before it, so the other parts of an assistant message on the chain (same
`message.id`) and the results of its tool calls sit on side paths. The branch keeps file order;
other conversation records are counted as skipped. A parent link to a record that is not in the
file is reported in the warnings, never guessed.

How records map, nothing invented. What Claude Code showed the person as a stopped or failed
turn, a local command or a compaction becomes a chat-event row (`chat_event_message`, CE-1), stamped
with the record's time:

| Claude Code records | chat-event row |
|---|---|
| user text `[Request interrupted by user]` | `Interrupted(cause="user")` |
| user text `[Request interrupted by user for tool use]` | `Interrupted(cause="user_during_tool")` |
| an `isApiErrorMessage` assistant message (Claude Code's, not the model's) | `ErrorDetails(text)`, cleaned |
| a `<command-name>/NAME</command-name>` record (system or user) | `CommandRan(name, args)` |
| then, right after it, `<local-command-stdout>` / `-stderr>` | that row's `output` / `error` |
| a `compact_boundary` with `compactMetadata.trigger` `auto` / `manual` | `Compacted(reason, tokens_before)` |

Error text is cleaned by `clean_public_text` and has no notice (Claude Code wrote it, not this
runtime). Command output keeps its ANSI escapes: they are data. The `Compacted` row (reason
`threshold` for `auto`) goes after the compaction entry (CE-17). A bash-mode command
(`<bash-input>`) stays user text: Claude Code records no exit code for it, which a `ShellRan` row
needs. Everything else keeps the source's own shape:
- Assistant records are joined per `message.id` into one assistant message, placed where its first
  record is, content blocks in file order: text; thinking with its signature; redacted thinking
  (its opaque data as the signature); `tool_use` as a tool call. Provider `anthropic`, api
  `anthropic-messages`, the record's model, usage from its last record, `response_id` the
  message id. Claude Code writes no stop reason on streamed records; a missing one is `tool_use`
  when the message holds tool calls, else `stop`.
- User records: text becomes a user message as it was; `tool_result` blocks become tool results
  (`is_error` and text kept, so a rejected call stays an error result; the record's
  `toolUseResult` side object as details); text beside them becomes a user message (or a row, as
  above) after them.
- `isMeta` user records (caveats and expansions Claude Code sends the model but does not show a
  person) become `custom_message` entries `claude_code.meta` with `display` False: the model
  still reads them as Claude Code's model did, surfaces do not show them.
- A system `compact_boundary` and the `isCompactSummary` user message after it become one
  compaction entry: the summary text, `tokens_before` from `compactMetadata.preTokens`, an empty
  retained tail (Claude Code keeps nothing verbatim across a compaction).
- Other system records become `custom` entries `import.claude_code.system` with
  `{subtype, level, text}`: what a person saw, which the model never read.
- `progress`, `file-history-snapshot`, `queue-operation`, sidechain records and record types this
  module does not know become no entry and are counted in `skipped`; the last `summary` record
  names the session (else the first user text, else the file name).
- A root `custom` entry `import.source` keeps the transcript's session id, cwd, version and branch.

The lane's model is the last assistant model (not Claude Code's `<synthetic>` one); its thinking
level stays `off`, since Claude Code records a token budget, not a level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.context import Context
from harness.conversation import CommandRan, Compacted, ErrorDetails, Interrupted
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
    AssistantMessage,
    CustomMessage,
    ModelIdentity,
    ToolResultMessage,
    UserMessage,
)
from harness.session import (
    AbortCause,
    CompactionPayload,
    CustomMessagePayload,
    CustomPayload,
    EntryPayload,
    MessagePayload,
    Store,
)

PROVIDER = "anthropic"
API = "anthropic-messages"
SYNTHETIC_MODEL = "<synthetic>"

_CONVERSATION = frozenset({"user", "assistant", "system"})
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "refusal": "stop",
                 "tool_use": "tool_use", "max_tokens": "length"}
# The user text Claude Code writes when the person stops a turn (Esc), and what it says of when.
_INTERRUPTS: dict[str, AbortCause] = {"[Request interrupted by user]": "user",
                                      "[Request interrupted by user for tool use]": "user_during_tool"}
# What started a compaction, by the boundary's `compactMetadata.trigger`.
_COMPACTION_REASONS: dict[str, Literal["threshold", "manual"]] = {"auto": "threshold", "manual": "manual"}
_COMMAND_NAME = re.compile(r"<command-name>/?([^<]*)</command-name>")
_COMMAND_ARGS = re.compile(r"<command-args>(.*?)</command-args>", re.DOTALL)
_COMMAND_OUTPUT = re.compile(r"<local-command-(stdout|stderr)>(.*)</local-command-\1>", re.DOTALL)


async def import_claude_code_session(store: Store, path: str | Path, user: str, context: Context) -> ImportReport:
    """Read the Claude Code transcript at `path` into a new conversation of `user` in `store` whose
    lane `main` holds its branch, and return what was written (dangling parent links among the
    warnings).

    The whole file is read and checked before anything is written. Raises `UnsupportedFormat`
    (nothing written) when the file is not a Claude Code transcript (a pi session, or no user or
    assistant record with a `uuid`) or a record lacks what its type needs; `InvalidInput` when
    the file cannot be read."""
    context.raise_if_cancelled()
    plan = ImportPlan("claude-code", Path(path))
    records = await read_jsonl(plan.path, plan)
    _ClaudeCodePlanner(plan).run([_Record(line, raw) for line, raw in records])
    return await write_plan(store, plan, user, context)


@dataclass(frozen=True, eq=False)
class _Record:
    line: int
    raw: Raw

    @property
    def kind(self) -> str:
        kind: str = self.raw["type"]
        return kind

    @property
    def uuid(self) -> str | None:
        return _str_or_none(self.raw.get("uuid"))

    @property
    def parent(self) -> str | None:
        """The record this one follows; a compact boundary's root names its logical parent."""
        return _str_or_none(self.raw.get("parentUuid")) or _str_or_none(self.raw.get("logicalParentUuid"))

    @property
    def blocks(self) -> list[Raw]:
        message = self.raw.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []

    @property
    def message_id(self) -> str:
        """The id of the assistant message this record is a part of (its own uuid if it names none)."""
        message = self.raw.get("message")
        found = message.get("id") if isinstance(message, dict) else None
        return found if isinstance(found, str) else f"record {self.uuid or self.line}"

    @property
    def in_conversation(self) -> bool:
        return self.kind in _CONVERSATION and self.uuid is not None and not self.raw.get("isSidechain")


@dataclass
class _AssistantDraft:
    """One assistant message being joined from its records."""

    first: _Record
    last: _Record
    blocks: list[Raw] = field(default_factory=list)

    def build(self) -> EntryPayload:
        """The assistant message; or, for the message Claude Code writes in place of a reply when
        the API failed, the error row (that message is no reply of the model's, so it is not
        replayed to it)."""
        ms = iso_ms(self.first.raw.get("timestamp"))
        if self.first.raw.get("isApiErrorMessage") or self.last.raw.get("isApiErrorMessage"):
            text = "\n".join(b["text"] for b in self.blocks if b["type"] == "text")
            return chat_event_row(ErrorDetails(text=clean_public_text(text)), ms)
        message = self.last.raw["message"]
        usage = message.get("usage") or {}
        counts = {ours: int(usage.get(theirs) or 0) for ours, theirs in
                  (("input", "input_tokens"), ("output", "output_tokens"),
                   ("cache_read", "cache_read_input_tokens"), ("cache_write", "cache_creation_input_tokens"))}
        has_calls = any(block["type"] == "tool_call" for block in self.blocks)
        data: Raw = {
            "content": self.blocks, "api": API, "provider": PROVIDER, "model": message["model"],
            "usage": {**counts, "total_tokens": sum(counts.values())},
            "stop_reason": _STOP_REASONS.get(message.get("stop_reason") or "", "tool_use" if has_calls else "stop"),
            "response_id": message.get("id"),
        }
        if ms is not None:
            data["timestamp"] = ms
        return MessagePayload(message=AssistantMessage.model_validate(data, strict=False))


@dataclass
class _CompactionDraft:
    """A compact boundary waiting for the summary message that follows it."""

    line: int
    tokens_before: int = 0
    summary: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    compacted: Compacted | None = None
    """The row saying so, when the boundary says what started the compaction."""
    timestamp: int | None = None

    def build(self, plan: ImportPlan) -> list[EntryPayload]:
        if self.summary is None:
            plan.warn(self.line, "compact boundary without a summary message; its summary is empty")
        compaction = CompactionPayload(summary=self.summary or "", tokens_before=self.tokens_before,
                                       details=self.details or None)
        # After the compaction entry, so the model reads that the conversation was compacted (CE-17).
        return [compaction] if self.compacted is None else [compaction, chat_event_row(self.compacted, self.timestamp)]


@dataclass
class _CommandDraft:
    """A local command (`<command-name>` record) waiting for the output record that follows it."""

    name: str
    args: str | None
    timestamp: int | None
    output: str | None = None
    error: str | None = None

    def build(self) -> EntryPayload:
        return chat_event_row(CommandRan(name=self.name, args=self.args, output=self.output, error=self.error),
                              self.timestamp)


_Slot = EntryPayload | _AssistantDraft | _CompactionDraft | _CommandDraft


class _ClaudeCodePlanner:
    def __init__(self, plan: ImportPlan) -> None:
        self.plan = plan
        self.slots: list[_Slot] = []
        self.assistants: dict[str, _AssistantDraft] = {}
        self.open_compaction: _CompactionDraft | None = None
        self.open_command: _CommandDraft | None = None
        self.tool_names: dict[str, str] = {}

    def run(self, records: list[_Record]) -> None:
        plan = self.plan
        if records[0].kind == "session":
            raise plan.unsupported(records[0].line, "this is a pi session file, not a Claude Code "
                                                    "transcript; import it as pi")
        conversation = [r for r in records if r.in_conversation]
        if not any(r.kind in ("user", "assistant") and isinstance(r.raw.get("message"), dict)
                   for r in conversation):
            raise plan.unsupported(None, "not a Claude Code transcript: no user or assistant record "
                                         "with a `uuid` and a `message`")
        by_uuid = {r.uuid: r for r in records if r.uuid is not None}
        self._report_dangling(records, by_uuid)
        branch = self._branch(records, by_uuid, conversation[-1])
        self.tool_names = {str(b.get("id")): str(b.get("name")) for r in branch if r.kind == "assistant"
                           for b in r.blocks if b.get("type") == "tool_use"}
        self._source(records)
        for record in records:
            if record in branch:
                with plan.reading(record.line):
                    self._place(record)
            else:
                self._skip(record)
        for slot in self.slots:
            if isinstance(slot, _AssistantDraft):
                with plan.reading(slot.first.line):
                    plan.add(slot.build())
            elif isinstance(slot, _CompactionDraft):
                for payload in slot.build(plan):
                    plan.add(payload)
            elif isinstance(slot, _CommandDraft):
                plan.add(slot.build())
            else:
                plan.add(slot)
        models = [d.last.raw["message"]["model"] for d in self.assistants.values()]
        if real := [m for m in models if m != SYNTHETIC_MODEL]:
            plan.model = ModelIdentity(provider=PROVIDER, model_id=real[-1])
        plan.name = plan.name or first_user_name(plan.entries) or plan.path.stem

    def _report_dangling(self, records: list[_Record], by_uuid: dict[str, _Record]) -> None:
        for record in records:
            for key in ("parentUuid", "logicalParentUuid"):
                target = _str_or_none(record.raw.get(key))
                if target is not None and target not in by_uuid:
                    self.plan.warn(record.line, f"{record.kind} record {record.uuid} names {key} {target}, "
                                                "which is not in the file")

    def _branch(self, records: list[_Record], by_uuid: dict[str, _Record], leaf: _Record) -> set[_Record]:
        chain: list[_Record] = []
        branch_so_far: set[_Record] = set()
        current: _Record | None = leaf
        while current is not None:
            chain.append(current)
            branch_so_far.add(current)
            parent = by_uuid.get(current.parent or "")
            if parent is not None and parent in branch_so_far:
                self.plan.warn(current.line, f"record {current.uuid} names its own descendant as parent; "
                                             "the branch starts here")
                break
            current = parent
        branch = branch_so_far
        message_ids = {r.message_id for r in chain if r.kind == "assistant"}
        branch.update(r for r in records
                      if r.in_conversation and r.kind == "assistant" and r.message_id in message_ids)
        call_ids = {b.get("id") for r in branch if r.kind == "assistant" for b in r.blocks
                    if b.get("type") == "tool_use"}
        branch.update(r for r in records if r.in_conversation and r.kind == "user"
                      and any(b.get("type") == "tool_result" and b.get("tool_use_id") in call_ids
                              for b in r.blocks))
        # Progress records sit on the chain too; they link records but hold no message.
        return {r for r in branch if r.in_conversation}

    def _source(self, records: list[_Record]) -> None:
        first = next((r.raw for r in records if "sessionId" in r.raw), {})
        data = {"format": "claude-code", "file": self.plan.path.name}
        data.update({ours: first[theirs] for ours, theirs in
                     (("session_id", "sessionId"), ("cwd", "cwd"), ("version", "version"),
                      ("git_branch", "gitBranch")) if isinstance(first.get(theirs), str)})
        self.slots.append(CustomPayload(custom_type="import.source", data=dict(data)))

    def _skip(self, record: _Record) -> None:
        if record.kind == "summary" and isinstance(record.raw.get("summary"), str):
            self.plan.name = clip_name(record.raw["summary"]) or self.plan.name
        elif record.raw.get("isSidechain"):
            self.plan.skipped["sidechain record"] += 1
        elif record.in_conversation:
            self.plan.skipped[f"{record.kind} record off the branch"] += 1
        else:
            self.plan.skipped[record.kind] += 1

    def _place(self, record: _Record) -> None:
        raw = record.raw
        # A compaction takes the summary, and a command the output, only from the very next record.
        compaction, self.open_compaction = self.open_compaction, None
        command, self.open_command = self.open_command, None
        if record.kind == "assistant":
            self._assistant(record)
        elif record.kind == "system" and raw.get("subtype") == "compact_boundary":
            metadata = raw.get("compactMetadata") or {}
            reason = _COMPACTION_REASONS.get(str(metadata.get("trigger")))
            self.open_compaction = _CompactionDraft(
                record.line, tokens_before=int(metadata.get("preTokens") or 0),
                details={"compact_metadata": metadata, "boundary_text": raw.get("content")},
                compacted=Compacted(reason=reason, tokens_before=metadata.get("preTokens")) if reason else None,
                timestamp=iso_ms(raw.get("timestamp")),
            )
            self.slots.append(self.open_compaction)
        elif record.kind == "system":
            text = raw.get("content")
            if not (isinstance(text, str) and self._local_command(text, command, iso_ms(raw.get("timestamp")))):
                self.slots.append(CustomPayload(custom_type="import.claude_code.system", data={
                    "subtype": raw.get("subtype"), "level": raw.get("level"), "text": text}))
        elif raw.get("isCompactSummary"):
            self._compact_summary(record, compaction)
        else:
            self._user(record, command)

    def _local_command(self, text: str, command: _CommandDraft | None, timestamp: int | None) -> bool:
        """Place `text` as part of a local command's `CommandRan` row, if it is one: a
        `<command-name>` record opens the row, a `<local-command-stdout>` (or `-stderr`) record
        right after it gives the row its output (or error). Returns whether it was placed."""
        if (name := _COMMAND_NAME.search(text)) is not None:
            args = _COMMAND_ARGS.search(text)
            self.open_command = _CommandDraft(name=name.group(1).strip(), timestamp=timestamp,
                                              args=(args.group(1).strip() or None) if args else None)
            self.slots.append(self.open_command)
            return True
        output = _COMMAND_OUTPUT.fullmatch(text.strip())
        if output is None or command is None:
            return False
        if output.group(1) == "stderr":
            command.error = output.group(2)
        else:
            command.output = output.group(2)
        return True

    def _assistant(self, record: _Record) -> None:
        draft = self.assistants.get(record.message_id)
        if draft is None:
            draft = self.assistants[record.message_id] = _AssistantDraft(record, record)
            self.slots.append(draft)
        draft.last = record
        draft.blocks.extend(_assistant_block(block) for block in record.raw["message"]["content"])

    def _compact_summary(self, record: _Record, compaction: _CompactionDraft | None) -> None:
        summary = _text(record.raw["message"]["content"])
        if compaction is None:
            self.slots.append(_CompactionDraft(record.line, summary=summary))
        else:
            compaction.summary = summary

    def _user(self, record: _Record, command: _CommandDraft | None) -> None:
        raw = record.raw
        content = raw["message"]["content"]
        ms = iso_ms(raw.get("timestamp"))
        timestamp = {"timestamp": ms} if ms is not None else {}
        if raw.get("isMeta"):
            meta = CustomMessage.model_validate(
                {"custom_type": "claude_code.meta", "content": _user_content(content), "display": False,
                 **timestamp}, strict=False)
            self.slots.append(CustomMessagePayload(message=meta))
            return
        if isinstance(content, str):
            self._user_text(content, content, command, ms)
            return
        results = [block for block in content if block["type"] == "tool_result"]
        details = raw.get("toolUseResult")
        if details is not None and len(results) > 1:
            self.plan.warn(record.line, "toolUseResult of a record with several tool results is not kept")
            details = None
        for block in results:
            call_id = block["tool_use_id"]
            if call_id not in self.tool_names:
                self.plan.warn(record.line, f"tool result for {call_id}, a call that is not on the branch")
            self.slots.append(MessagePayload(message=ToolResultMessage.model_validate({
                "tool_call_id": call_id, "tool_name": self.tool_names.get(call_id, ""),
                "content": _result_content(block.get("content")), "details": details,
                "is_error": bool(block.get("is_error", False)), **timestamp}, strict=False)))
        rest = [block for block in content if block["type"] != "tool_result"]
        if rest or not results:
            self._user_text(_only_text(rest), _user_blocks(rest), command, ms)

    def _user_text(self, text: str | None, content: str | list[Raw], command: _CommandDraft | None,
                   timestamp: int | None) -> None:
        """A person's text: the interrupted row or a local command's row when it is Claude Code's
        marker of one (`text`, when the content is text only), else a user message of `content`."""
        if text is not None and (cause := _INTERRUPTS.get(text.strip())) is not None:
            self.slots.append(chat_event_row(Interrupted(cause=cause), timestamp))
        elif text is None or not self._local_command(text, command, timestamp):
            stamp = {"timestamp": timestamp} if timestamp is not None else {}
            self.slots.append(MessagePayload(message=UserMessage.model_validate(
                {"content": content, **stamp}, strict=False)))


def _assistant_block(block: Raw) -> Raw:
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": block["text"]}
    if kind == "thinking":
        return {"type": "thinking", "thinking": block["thinking"], "signature": block.get("signature")}
    if kind == "redacted_thinking":
        return {"type": "thinking", "thinking": "", "signature": block["data"], "redacted": True}
    if kind == "tool_use":
        return {"type": "tool_call", "id": block["id"], "name": block["name"], "arguments": block["input"]}
    raise ValueError(f"unknown assistant content block type {kind!r}")


def _user_content(content: Any) -> str | list[Raw]:
    return content if isinstance(content, str) else _user_blocks(content)


def _user_blocks(content: list[Raw]) -> list[Raw]:
    blocks: list[Raw] = []
    for block in content:
        if block["type"] == "text":
            blocks.append({"type": "text", "text": block["text"]})
        elif block["type"] == "image" and block["source"]["type"] == "base64":
            blocks.append({"type": "image", "data": block["source"]["data"],
                           "mime_type": block["source"]["media_type"]})
        else:
            raise ValueError(f"unsupported user content block {block['type']!r}")
    return blocks


def _result_content(content: Any) -> list[Raw]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return _user_blocks(content)


def _only_text(blocks: list[Raw]) -> str | None:
    """The text of `blocks` when they are text blocks only (and some), else None."""
    if not blocks or any(block["type"] != "text" for block in blocks):
        return None
    return "\n".join(block["text"] for block in blocks)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(block["text"] for block in content if block.get("type") == "text")


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
