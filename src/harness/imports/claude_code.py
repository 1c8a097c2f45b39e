"""Import of Claude Code session transcripts (the JSONL files under `~/.claude/projects`) into a
new session.

Which records form the branch. Claude Code links records by `uuid` and `parentUuid` (a compact
boundary, which starts a new root, by `logicalParentUuid`), and a rewind leaves the abandoned path
in the file. The branch is the chain from the last conversation record (user, assistant or system,
not a sidechain) back to its root, plus what that chain leaves out of its own messages: Claude Code
hangs each streamed part of an assistant message and each parallel tool result on the record
written just before it, so the other parts of an assistant message on the chain (same
`message.id`) and the results of its tool calls sit on side paths. The branch keeps file order;
other conversation records are counted as skipped. A parent link to a record that is not in the
file is reported in the warnings, never guessed.

How records map, nothing invented:
- Assistant records are joined per `message.id` into one assistant message, placed where its first
  record is, content blocks in file order: text; thinking with its signature; redacted thinking
  (its opaque data as the signature); `tool_use` as a tool call. Provider `anthropic`, api
  `anthropic-messages`, the record's model, usage from its last record, `response_id` the
  message id. Claude Code writes no stop reason on streamed records; a missing one is `tool_use`
  when the message holds tool calls, else `stop`. An API error message (`isApiErrorMessage`) gets
  stop reason `error` with its text as `error_message`.
- User records: text becomes a user message as it was (`[Request interrupted by user]` too);
  `tool_result` blocks become tool results (`is_error` and text kept; the record's `toolUseResult`
  side object as details); text beside them becomes a user message after them.
- `isMeta` user records (caveats and expansions Claude Code sends the model but does not show a
  person) become `custom_message` entries `claude_code.meta` with `display` False: the model
  still reads them as Claude Code's model did, surfaces do not show them.
- A system `compact_boundary` and the `isCompactSummary` user message after it become one
  compaction entry: the summary text, `tokens_before` from `compactMetadata.preTokens`, an empty
  retained tail (Claude Code keeps nothing verbatim across a compaction).
- Other system records (local command output and the like) become `custom` entries
  `import.claude_code.system` with `{subtype, level, text}`: what a person saw, which the model
  never read. ANSI escapes are data and are kept.
- `progress`, `file-history-snapshot`, `queue-operation`, sidechain records and record types this
  module does not know become no entry and are counted in `skipped`; the last `summary` record
  names the session (else the first user text, else the file name).
- A root `custom` entry `import.source` keeps the transcript's session id, cwd, version and branch.

The lane's model is the last assistant model (not Claude Code's `<synthetic>` one); its thinking
level stays `off`, since Claude Code records a token budget, not a level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.context import Context
from harness.imports.plan import (
    ImportPlan,
    ImportReport,
    Raw,
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

    def build(self) -> AssistantMessage:
        message = self.last.raw["message"]
        usage = message.get("usage") or {}
        counts = {ours: int(usage.get(theirs) or 0) for ours, theirs in
                  (("input", "input_tokens"), ("output", "output_tokens"),
                   ("cache_read", "cache_read_input_tokens"), ("cache_write", "cache_creation_input_tokens"))}
        has_calls = any(block["type"] == "tool_call" for block in self.blocks)
        stop_reason = _STOP_REASONS.get(message.get("stop_reason") or "", "tool_use" if has_calls else "stop")
        error_message = None
        if self.first.raw.get("isApiErrorMessage") or self.last.raw.get("isApiErrorMessage"):
            stop_reason = "error"
            error_message = "\n".join(b["text"] for b in self.blocks if b["type"] == "text")
        data: Raw = {
            "content": self.blocks, "api": API, "provider": PROVIDER, "model": message["model"],
            "usage": {**counts, "total_tokens": sum(counts.values())}, "stop_reason": stop_reason,
            "error_message": error_message, "response_id": message.get("id"),
        }
        if (ms := iso_ms(self.first.raw.get("timestamp"))) is not None:
            data["timestamp"] = ms
        return AssistantMessage.model_validate(data, strict=False)


@dataclass
class _CompactionDraft:
    """A compact boundary waiting for the summary message that follows it."""

    line: int
    tokens_before: int = 0
    summary: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def build(self, plan: ImportPlan) -> CompactionPayload:
        if self.summary is None:
            plan.warn(self.line, "compact boundary without a summary message; its summary is empty")
        return CompactionPayload(summary=self.summary or "", tokens_before=self.tokens_before,
                                 details=self.details or None)


_Slot = EntryPayload | _AssistantDraft | _CompactionDraft


class _ClaudeCodePlanner:
    def __init__(self, plan: ImportPlan) -> None:
        self.plan = plan
        self.slots: list[_Slot] = []
        self.assistants: dict[str, _AssistantDraft] = {}
        self.open_compaction: _CompactionDraft | None = None
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
                    plan.add(MessagePayload(message=slot.build()))
            elif isinstance(slot, _CompactionDraft):
                plan.add(slot.build(plan))
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
        if record.kind == "assistant":
            self.open_compaction = None
            self._assistant(record)
        elif record.kind == "system" and raw.get("subtype") == "compact_boundary":
            metadata = raw.get("compactMetadata") or {}
            self.open_compaction = _CompactionDraft(
                record.line, tokens_before=int(metadata.get("preTokens") or 0),
                details={"compact_metadata": metadata, "boundary_text": raw.get("content")},
            )
            self.slots.append(self.open_compaction)
        elif record.kind == "system":
            self.open_compaction = None
            self.slots.append(CustomPayload(custom_type="import.claude_code.system", data={
                "subtype": raw.get("subtype"), "level": raw.get("level"), "text": raw.get("content")}))
        elif raw.get("isCompactSummary"):
            self._compact_summary(record)
        else:
            self.open_compaction = None
            self._user(record)

    def _assistant(self, record: _Record) -> None:
        draft = self.assistants.get(record.message_id)
        if draft is None:
            draft = self.assistants[record.message_id] = _AssistantDraft(record, record)
            self.slots.append(draft)
        draft.last = record
        draft.blocks.extend(_assistant_block(block) for block in record.raw["message"]["content"])

    def _compact_summary(self, record: _Record) -> None:
        summary = _text(record.raw["message"]["content"])
        if self.open_compaction is None:
            self.slots.append(_CompactionDraft(record.line, summary=summary))
        else:
            self.open_compaction.summary = summary
        self.open_compaction = None

    def _user(self, record: _Record) -> None:
        raw = record.raw
        content = raw["message"]["content"]
        timestamp = {"timestamp": ms} if (ms := iso_ms(raw.get("timestamp"))) is not None else {}
        if raw.get("isMeta"):
            meta = CustomMessage.model_validate(
                {"custom_type": "claude_code.meta", "content": _user_content(content), "display": False,
                 **timestamp}, strict=False)
            self.slots.append(CustomMessagePayload(message=meta))
            return
        if isinstance(content, str):
            self.slots.append(MessagePayload(message=UserMessage.model_validate(
                {"content": content, **timestamp}, strict=False)))
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
            self.slots.append(MessagePayload(message=UserMessage.model_validate(
                {"content": _user_blocks(rest), **timestamp}, strict=False)))


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


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(block["text"] for block in content if block.get("type") == "text")


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
