"""Import of Claude Code transcripts: the real files from ../shared/fixtures, one synthetic tree."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import SHARED_FIXTURES, needs_shared_fixtures
from harness.cli import app
from harness.context import Context
from harness.conversation import CommandRan, Compacted, ErrorDetails, Interrupted, chat_event_of
from harness.conversation.service import chat_event_rows
from harness.errors import UnsupportedFormat
from harness.imports import import_claude_code_session
from harness.messages import (
    AssistantMessage,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
)
from harness.session import (
    CompactionPayload,
    CustomMessagePayload,
    CustomPayload,
    Entry,
    MessagePayload,
    Store,
    addresses,
)
from journal_helpers import lane_branch, read_jsonl

# The real files are read from `../shared` (here and in CI), never copied; a clone without it skips them.
TRANSCRIPTS = SHARED_FIXTURES / "transcripts"
REJECTED = TRANSCRIPTS / "claude-code-rejected-parallel-tools.jsonl"
INTERRUPTS = TRANSCRIPTS / "claude-code-interrupts-background-bash.jsonl"
EXCERPT = TRANSCRIPTS / "claude-code-after-compaction-excerpt.jsonl"
REAL_FILES = [REJECTED, INTERRUPTS, EXCERPT]


# `ctx` comes from conftest.py. These tests use one backend; the conformance suite covers the rest.
@pytest.fixture
def store_url() -> str:
    """These tests run on memory only (conftest's `store` otherwise runs on every backend)."""
    return "memory://"


def joined_text(content: str | list[UserContent]) -> str:
    return content if isinstance(content, str) else "\n".join(
        b.text for b in content if isinstance(b, TextContent))


# What Claude Code writes for what a person saw, as its transcripts show it.
INTERRUPT_CAUSES = {"[Request interrupted by user]": "user",
                    "[Request interrupted by user for tool use]": "user_during_tool"}
COMMAND = re.compile(r"<command-name>/([\w-]+)</command-name>")


def shown(text: str) -> tuple[str, ...]:
    """What a person's text or a system record is: an interruption, a local command, a command's
    output, or itself."""
    if text in INTERRUPT_CAUSES:
        return ("interrupted", INTERRUPT_CAUSES[text])
    if command := COMMAND.search(text):
        return ("command", command.group(1))
    if text.startswith("<local-command-stdout>"):
        return ("output",)
    return ("text", text)


def expected_story(records: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """What the file says happened, in file order, read straight from the JSON: an assistant
    message once per `message.id`, each tool result, user text, meta rows, system rows, one
    compaction per summary (its boundary record is folded into it) and its `compacted` row, an
    `interrupted` row per interruption, and a `command` row per local command (its output record
    folded into it)."""
    story: list[tuple[str, ...]] = []
    seen_replies: set[str] = set()

    def said(text: str, kind: str) -> None:
        what = shown(text)
        if what == ("output",) and story and story[-1][0] == "command":
            return
        story.append((kind, text) if what[0] in ("text", "output") else what)

    for record in records:
        kind, message = record["type"], record.get("message", {})
        if kind == "assistant" and message["id"] not in seen_replies:
            seen_replies.add(message["id"])
            story.append(("assistant", message["id"]))
        elif kind == "user" and record.get("isCompactSummary"):
            story.append(("compaction",))
            story.append(("compacted",))
        elif kind == "user" and record.get("isMeta"):
            story.append(("meta",))
        elif kind == "user" and isinstance(message["content"], str):
            said(message["content"], "user")
        elif kind == "user":
            blocks = message["content"]
            story.extend(("tool_result", b["tool_use_id"]) for b in blocks if b["type"] == "tool_result")
            if texts := [b["text"] for b in blocks if b["type"] == "text"]:
                said("\n".join(texts), "user")
        elif kind == "system" and record["subtype"] != "compact_boundary":
            said(record["content"], "system")
    return story


def imported_story(entries: list[Entry]) -> list[tuple[str, ...]]:
    story: list[tuple[str, ...]] = []
    for entry in entries[1:]:  # the first is the import.source entry
        payload = entry.payload
        if isinstance(payload, MessagePayload):
            message = payload.message
            if isinstance(message, AssistantMessage):
                story.append(("assistant", message.response_id or ""))
            elif isinstance(message, ToolResultMessage):
                story.append(("tool_result", message.tool_call_id))
            else:
                story.append(("user", joined_text(message.content)))
        elif isinstance(payload, CustomMessagePayload):
            match chat_event_of(payload.message):
                case Interrupted(cause=cause):
                    story.append(("interrupted", cause))
                case CommandRan(name=name):
                    story.append(("command", name))
                case Compacted():
                    story.append(("compacted",))
                case None:
                    story.append(("meta",))
        elif isinstance(payload, CustomPayload):
            assert isinstance(payload.data, dict)
            story.append(("system", str(payload.data["text"])))
        else:
            story.append((payload.type,))
    return story


@needs_shared_fixtures
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
async def test_every_conversation_record_is_imported_in_file_order(
    store: Store, ctx: Context, path: Path
) -> None:
    records = read_jsonl(path)

    report = await import_claude_code_session(store, path, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    assert imported_story(entries) == expected_story(records)
    assert entries[0].payload == CustomPayload(custom_type="import.source", data={
        "format": "claude-code", "file": path.name, "session_id": records[1]["sessionId"],
        "cwd": records[1]["cwd"], "version": records[1]["version"], "git_branch": records[1]["gitBranch"]})


@needs_shared_fixtures
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
async def test_tool_results_follow_their_calls_with_no_other_message_between(
    store: Store, ctx: Context, path: Path
) -> None:
    records = read_jsonl(path)
    calls = {b["id"]: b["name"] for r in records if r["type"] == "assistant"
             for b in r["message"]["content"] if b["type"] == "tool_use"}
    results = {b["tool_use_id"]: bool(b.get("is_error", False)) for r in records if r["type"] == "user"
               and isinstance(r["message"]["content"], list) for b in r["message"]["content"]
               if b["type"] == "tool_result"}

    report = await import_claude_code_session(store, path, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    imported = [e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]
    for at, message in enumerate(imported):
        if isinstance(message, AssistantMessage) and message.tool_calls:
            following = imported[at + 1: at + 1 + len(message.tool_calls)]
            assert all(isinstance(m, ToolResultMessage) for m in following)
            assert {m.tool_call_id for m in following if isinstance(m, ToolResultMessage)} == {
                c.id for c in message.tool_calls}
    answered = {m.tool_call_id: m for m in imported if isinstance(m, ToolResultMessage)}
    assert {i: (m.tool_name, m.is_error) for i, m in answered.items()} == {
        i: (calls[i], error) for i, error in results.items()}
    assert (report.tool_calls, report.unanswered_tool_calls) == (len(calls), len(set(calls) - set(results)))


@needs_shared_fixtures
async def test_one_reply_split_over_five_records_is_joined_with_its_five_parts(
    store: Store, ctx: Context
) -> None:
    records = [r for r in read_jsonl(REJECTED) if r["type"] == "assistant"]
    assert len({r["message"]["id"] for r in records}) == 1
    parts = [r["message"]["content"][0] for r in records]

    report = await import_claude_code_session(store, REJECTED, "user", ctx)

    [reply] = [m for m in (e.payload.message for e in await lane_branch(store, report.session_id, ctx)
                           if isinstance(e.payload, MessagePayload)) if isinstance(m, AssistantMessage)]
    assert reply.content == [
        TextContent(text=parts[0]["text"]),
        ThinkingContent(thinking=parts[1]["thinking"], signature=parts[1]["signature"]),
        TextContent(text=parts[2]["text"]),
        ToolCall(id=parts[3]["id"], name="Bash", arguments=parts[3]["input"]),
        ToolCall(id=parts[4]["id"], name="Glob", arguments=parts[4]["input"]),
    ]
    usage = records[-1]["message"]["usage"]
    assert (reply.provider, reply.api, reply.model) == ("anthropic", "anthropic-messages", "claude-opus-4-6")
    assert (reply.usage.input, reply.usage.output) == (usage["input_tokens"], usage["output_tokens"])
    assert (reply.usage.cache_read, reply.usage.cache_write) == (
        usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"])
    assert reply.stop_reason == "tool_use"
    assert reply.response_id == records[0]["message"]["id"]


@needs_shared_fixtures
async def test_rejected_calls_keep_their_error_results_and_the_interruption_is_an_interrupted_row(
    store: Store, ctx: Context
) -> None:
    """CE-7: the stop during the rejected tool calls is one `interrupted` row after their results."""
    report = await import_claude_code_session(store, REJECTED, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    imported = [e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]
    results = [m for m in imported if isinstance(m, ToolResultMessage)]
    assert [(m.tool_name, m.is_error, m.details) for m in results] == [
        ("Bash", True, "User rejected tool use"), ("Glob", True, "User rejected tool use")]
    assert joined_text(results[0].content).startswith("The user doesn't want to proceed")
    assert isinstance(imported[-1], ToolResultMessage)
    [row, _command] = chat_event_rows(entries)
    assert row.details == Interrupted(cause="user_during_tool")
    assert entries.index(next(e for e in entries if e.id == row.id)) == len(entries) - 2


@needs_shared_fixtures
async def test_a_local_command_and_its_output_are_one_command_row_with_its_ansi_escapes(
    store: Store, ctx: Context
) -> None:
    """CE-16: the `/model` record and the stdout record after it are one `CommandRan` row."""
    command, output = [r["content"] for r in read_jsonl(REJECTED) if r["type"] == "system"]
    assert "<command-name>/model</command-name>" in command
    assert "\x1b[1m" in output

    report = await import_claude_code_session(store, REJECTED, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    assert not [e for e in entries if isinstance(e.payload, CustomPayload)
                and e.payload.custom_type == "import.claude_code.system"]
    row = chat_event_rows(entries)[-1]
    assert row.id == entries[-1].id
    assert row.details == CommandRan(name="model", output=output.removeprefix("<local-command-stdout>")
                                     .removesuffix("</local-command-stdout>"))


@needs_shared_fixtures
async def test_interruptions_meta_rows_and_skipped_records(store: Store, ctx: Context) -> None:
    """CE-7, CE-16: two interruptions and two `/mcp` runs become rows; the caveat stays a meta row."""
    records = read_jsonl(INTERRUPTS)
    not_messages = Counter(r["type"] for r in records
                           if r["type"] in ("progress", "file-history-snapshot", "queue-operation"))
    [meta_record] = [r for r in records if r.get("isMeta") and r["type"] == "user"]

    report = await import_claude_code_session(store, INTERRUPTS, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    texts = [joined_text(e.payload.message.content) for e in entries
             if isinstance(e.payload, MessagePayload) and isinstance(e.payload.message, UserMessage)]
    assert texts == ["start phoenix in background", next(
        r["message"]["content"] for r in records if r["type"] == "user" and str(r["message"]["content"])
        .startswith("scrolling back"))]
    assert [row.details for row in chat_event_rows(entries)] == [
        Interrupted(cause="user"),
        CommandRan(name="mcp", output="Reconnected to tidewave."),  # the user-record form
        CommandRan(name="mcp", output="MCP dialog dismissed"),  # the system-record form
        Interrupted(cause="user"),
    ]
    [meta] = [e.payload.message for e in entries if isinstance(e.payload, CustomMessagePayload)
              and e.payload.message.custom_type == "claude_code.meta"]
    assert (meta.custom_type, meta.display, meta.content) == (
        "claude_code.meta", False, meta_record["message"]["content"])
    assert report.skipped == dict(not_messages)
    assert report.warnings == []
    session = await store.open_session(report.session_id, ctx)
    assert await session.get(addresses.session_name(), ctx) == "start phoenix in background"


@needs_shared_fixtures
async def test_compact_boundary_and_summary_become_one_compaction_and_the_dangling_parent_is_reported(
    store: Store, ctx: Context
) -> None:
    records = read_jsonl(EXCERPT)
    boundary, summary = records[0], records[1]
    assert (boundary["subtype"], summary["isCompactSummary"]) == ("compact_boundary", True)

    report = await import_claude_code_session(store, EXCERPT, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    compaction = entries[1].payload
    assert isinstance(compaction, CompactionPayload)
    assert compaction.summary == summary["message"]["content"]
    assert compaction.tokens_before == boundary["compactMetadata"]["preTokens"]
    assert compaction.retained_tail == []
    assert report.compactions == 1
    assert report.warnings == [
        f"line 1: system record {boundary['uuid']} names logicalParentUuid {boundary['logicalParentUuid']}, "
        "which is not in the file"]


# Synthetic below: no real transcript with a rewind was collected; this tree is written by hand.


def record(uuid: str, parent: str | None, kind: str, content: Any, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": kind, "content": content}
    if kind == "assistant":
        message |= {"id": f"msg-{uuid}", "model": "claude-x", "usage": {"input_tokens": 1, "output_tokens": 1}}
    return {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s", "message": message,
            "timestamp": "2026-01-01T00:00:00.000Z", **extra}


async def test_synthetic_rewind_keeps_the_last_path_and_reports_a_dangling_parent(
    store: Store, ctx: Context, tmp_path: Path
) -> None:
    """Synthetic transcript: a rewind leaves an abandoned prompt and reply; the branch is the
    path to the last record, and a parent missing from the file is reported, not guessed."""
    path = tmp_path / "synthetic-rewind.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        record("u1", "missing", "user", "first"),
        record("a1", "u1", "assistant", [{"type": "text", "text": "one"}]),
        record("u2", "a1", "user", "abandoned"),
        record("a2", "u2", "assistant", [{"type": "text", "text": "abandoned reply"}]),
        record("u3", "a1", "user", "rewritten"),
        record("a3", "u3", "assistant", [{"type": "text", "text": "three"}],
               isApiErrorMessage=True),
    ]), encoding="utf-8")

    report = await import_claude_code_session(store, path, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    imported = [e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]
    assert [joined_text(m.content) if isinstance(m, UserMessage) else m.role for m in imported] == [
        "first", "assistant", "rewritten"]
    # Claude Code's API error message is no reply of the model's: it is the turn's error row (CE-9).
    assert [(row.id, row.details) for row in chat_event_rows(entries)] == [
        (entries[-1].id, ErrorDetails(text="three"))]
    assert report.skipped == {"assistant record off the branch": 1, "user record off the branch": 1}
    assert report.warnings == ["line 1: user record u1 names parentUuid missing, which is not in the file"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"type":"session","id":"s","timestamp":"2026-01-01T00:00:00.000Z"}'], "this is a pi session file"),
        (['{"type":"progress","uuid":"p1","parentUuid":null,"data":{}}'], "not a Claude Code transcript"),
        (['{"type":"user","uuid":"u1","parentUuid":null,"message":{"role":"user"}}'],
         "line 1: record does not have the expected shape: missing field 'content'"),
        (['{"type":"user","uuid":"u1"', "x"], "line 1: not a JSON line"),
    ],
    ids=["pi-header", "no-messages", "bad-record", "bad-json"],
)
async def test_unsupported_files_are_refused_and_nothing_is_written(
    store: Store, ctx: Context, tmp_path: Path, lines: list[str], message: str
) -> None:
    path = tmp_path / "unsupported.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    with pytest.raises(UnsupportedFormat, match=message):
        await import_claude_code_session(store, path, "user", ctx)

    assert await store.list_sessions(ctx) == []


@needs_shared_fixtures
def test_cli_import_then_show_through_sqlite(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}?synchronous=NORMAL"
    runner = CliRunner()

    imported = runner.invoke(app, ["import", "claude-code", str(EXCERPT), "--store", store])

    assert imported.exit_code == 0, imported.output
    session_id = imported.stdout.strip()
    assert "1 compactions" in imported.stderr
    assert "logicalParentUuid" in imported.stderr
    shown = runner.invoke(app, ["show", session_id, "--store", store])
    assert shown.exit_code == 0, shown.output
    assert "── compaction (167117 tokens before, 0 messages kept) ──" in shown.stdout
    assert "This session is being continued from a previous conversation" in shown.stdout
    assert shown.stdout.count("assistant (anthropic/claude-opus-4-6, tool_use)") == 5
