"""Import of pi session files: the real v1 files from ../shared/fixtures, synthetic v2/v3 files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import SHARED_FIXTURES, needs_shared_fixtures
from harness.context import Context
from harness.errors import UnsupportedFormat
from harness.imports import import_pi_session
from harness.messages import AssistantMessage, CustomMessage, Message, ToolResultMessage, UserMessage
from harness.session import (
    BranchSummaryPayload,
    CompactionPayload,
    CustomMessagePayload,
    CustomPayload,
    Entry,
    MessagePayload,
    Store,
    addresses,
    connect,
)
from journal_helpers import lane_branch, read_jsonl

# The real files are read from `../shared` (here and in CI), never copied; a clone without it skips them.
FIXTURES = SHARED_FIXTURES
HEAD25 = FIXTURES / "pi" / "large-session.head25.jsonl"
ERROR_TERMINATED = FIXTURES / "transcripts" / "pi-session-v1-error-terminated.jsonl"
COMPACTION = FIXTURES / "transcripts" / "pi-session-v1-compaction.jsonl"
REAL_FILES = [HEAD25, ERROR_TERMINATED, COMPACTION]

ROLES = {"user": "user", "assistant": "assistant", "toolResult": "tool_result"}


# `ctx` comes from conftest.py. These tests use one backend; the conformance suite covers the rest.
@pytest.fixture
def store_url() -> str:
    """These tests run on memory only (conftest's `store` otherwise runs on every backend)."""
    return "memory://"


def messages(entries: list[Entry]) -> list[Message]:
    return [e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]


def signature(raw: dict[str, Any]) -> tuple[str, int, str | None]:
    """What identifies a raw pi message: role, its own timestamp, the call it answers."""
    return ROLES[raw["role"]], raw["timestamp"], raw.get("toolCallId")


def our_signature(message: Message) -> tuple[str, int, str | None]:
    return message.role, message.timestamp, getattr(message, "tool_call_id", None)


@needs_shared_fixtures
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
async def test_real_v1_file_keeps_every_message_in_file_order(
    store: Store, ctx: Context, path: Path
) -> None:
    raw = read_jsonl(path)
    expected = [signature(line["message"]) for line in raw if line["type"] == "message"]

    report = await import_pi_session(store, path, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    assert [our_signature(m) for m in messages(entries)] == expected
    assert report.messages == len(expected)
    # One entry per record after the header, plus the root entry that keeps the header, plus the
    # row after each stopped or failed reply.
    stopped = [line["message"] for line in raw if line["type"] == "message"
               and line["message"].get("stopReason") in ("aborted", "error")]
    assert report.entries == len(entries) == len(raw) + len(stopped)
    assert entries[0].payload == CustomPayload(
        custom_type="import.source",
        data={"format": "pi", "version": 1, "file": path.name, "header": raw[0]},
    )


@needs_shared_fixtures
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
async def test_tool_calls_are_followed_by_their_results_and_unanswered_ones_stay_so(
    store: Store, ctx: Context, path: Path
) -> None:
    raw = [line["message"] for line in read_jsonl(path) if line["type"] == "message"]
    calls = [b["id"] for m in raw if m["role"] == "assistant" for b in m["content"] if b["type"] == "toolCall"]
    answered = {m["toolCallId"] for m in raw if m["role"] == "toolResult"}

    report = await import_pi_session(store, path, "user", ctx)

    imported = messages(await lane_branch(store, report.session_id, ctx))
    call_at = {c.id: i for i, m in enumerate(imported) if isinstance(m, AssistantMessage) for c in m.tool_calls}
    result_at = {m.tool_call_id: i for i, m in enumerate(imported) if isinstance(m, ToolResultMessage)}
    assert list(call_at) == calls
    assert set(result_at) == answered & set(calls)
    assert all(call_at[call] < result_at[call] for call in answered & set(calls))
    assert report.tool_calls == len(calls)
    assert report.unanswered_tool_calls == len([c for c in calls if c not in answered])


@needs_shared_fixtures
async def test_error_terminated_reply_keeps_its_16_unanswered_calls_and_nothing_is_invented(
    store: Store, ctx: Context
) -> None:
    raw_last = read_jsonl(ERROR_TERMINATED)[-1]["message"]

    report = await import_pi_session(store, ERROR_TERMINATED, "user", ctx)

    imported = messages(await lane_branch(store, report.session_id, ctx))
    last = imported[-1]
    assert isinstance(last, AssistantMessage)
    assert (last.stop_reason, last.error_message) == ("error", "terminated")
    assert len(last.tool_calls) == 16
    assert [c.id for c in last.tool_calls] == [b["id"] for b in raw_last["content"] if b["type"] == "toolCall"]
    assert report.unanswered_tool_calls == 16
    assert not any(isinstance(m, ToolResultMessage) and m.tool_call_id in {c.id for c in last.tool_calls}
                   for m in imported)


@needs_shared_fixtures
async def test_aborted_reply_is_kept_as_it_was_with_usage_total_computed(store: Store, ctx: Context) -> None:
    raw = [line["message"] for line in read_jsonl(ERROR_TERMINATED) if line["type"] == "message"]
    raw_reply = raw[3]  # the first answered reply; its usage has no totalTokens (old shape)
    assert "totalTokens" not in raw_reply["usage"]

    report = await import_pi_session(store, ERROR_TERMINATED, "user", ctx)

    imported = messages(await lane_branch(store, report.session_id, ctx))
    aborted = imported[1]
    assert isinstance(aborted, AssistantMessage)
    assert (aborted.content, aborted.stop_reason, aborted.error_message) == ([], "aborted", "Request was aborted")
    assert (aborted.api, aborted.provider, aborted.model) == ("openai-responses", "openai", "gpt-5.1-codex")
    reply = imported[3]
    assert isinstance(reply, AssistantMessage)
    usage = raw_reply["usage"]
    assert reply.usage.total_tokens == usage["input"] + usage["output"] + usage["cacheRead"] + usage["cacheWrite"]
    assert (reply.usage.cache_read, reply.usage.cache_write) == (usage["cacheRead"], usage["cacheWrite"])
    assert reply.usage.cost.total == usage["cost"]["total"]
    assert reply.stop_reason == "tool_use"


@needs_shared_fixtures
async def test_model_change_is_recorded_on_the_branch_and_configures_the_lane(
    store: Store, ctx: Context
) -> None:
    change = next(line for line in read_jsonl(ERROR_TERMINATED) if line["type"] == "model_change")

    report = await import_pi_session(store, ERROR_TERMINATED, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    assert [e.payload for e in entries if isinstance(e.payload, CustomPayload)][1:] == [
        CustomPayload(custom_type="import.model_change",
                      data={"provider": change["provider"], "model_id": change["modelId"]})
    ]
    session = await store.open_session(report.session_id, ctx)
    config = await session.get(addresses.lane_config("main"), ctx)
    assert config is not None
    assert (config.model.provider, config.model.model_id) == (change["provider"], change["modelId"])
    assert await session.get(addresses.session_name(), ctx) == "/mode"  # the first user text


@needs_shared_fixtures
async def test_thinking_level_changes_are_entries_and_the_last_one_configures_the_lane(
    store: Store, ctx: Context
) -> None:
    levels = [line["thinkingLevel"] for line in read_jsonl(COMPACTION) if line["type"] == "thinking_level_change"]
    assert len(levels) == 4

    report = await import_pi_session(store, COMPACTION, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    recorded = [e.payload.data for e in entries
                if isinstance(e.payload, CustomPayload) and e.payload.custom_type == "import.thinking_level_change"]
    assert recorded == [{"thinking_level": level} for level in levels]
    session = await store.open_session(report.session_id, ctx)
    config = await session.get(addresses.lane_config("main"), ctx)
    assert config is not None
    assert config.thinking_level == levels[-1]


@needs_shared_fixtures
async def test_v1_compaction_keeps_from_first_kept_index_counting_the_header(
    store: Store, ctx: Context
) -> None:
    raw = read_jsonl(COMPACTION)
    at = next(i for i, line in enumerate(raw) if line["type"] == "compaction")
    compaction = raw[at]
    first = compaction["firstKeptEntryIndex"]
    # Index 0 is the header: the kept range opens on the user message that starts a turn.
    assert raw[first]["message"]["role"] == "user"
    kept = [signature(line["message"]) for line in raw[first:at] if line["type"] == "message"]

    stopped_before = sum(1 for line in raw[:at] if line["type"] == "message"
                         and line["message"].get("stopReason") in ("aborted", "error"))

    report = await import_pi_session(store, COMPACTION, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    [(position, payload)] = [(i, e.payload) for i, e in enumerate(entries) if isinstance(e.payload, CompactionPayload)]
    # The header's entry stands where the header stood; each stopped reply before has its row.
    assert position == at + stopped_before
    assert payload.summary == compaction["summary"]
    assert payload.tokens_before == compaction["tokensBefore"]
    assert [our_signature(m) for m in payload.retained_tail] == kept
    # The branch still holds every message before the compaction, not only the kept ones.
    before = [signature(line["message"]) for line in raw[:at] if line["type"] == "message"]
    assert [our_signature(m) for m in messages(entries[:position])] == before
    assert report.compactions == 1


@needs_shared_fixtures
async def test_import_through_sqlite_reads_back_after_reopening(tmp_path: Path, ctx: Context) -> None:
    url = f"sqlite:///{tmp_path / 'journal.db'}?synchronous=NORMAL"
    writer = await connect(url, ctx)
    try:
        report = await import_pi_session(writer, HEAD25, "user", ctx)
    finally:
        await writer.close()

    reader = await connect(url, ctx)
    try:
        imported = messages(await lane_branch(reader, report.session_id, ctx))
        assert [info.id for info in await reader.list_sessions(ctx)] == [report.session_id]
    finally:
        await reader.close()
    raw = [line["message"] for line in read_jsonl(HEAD25) if line["type"] == "message"]
    assert [our_signature(m) for m in imported] == [signature(m) for m in raw]


@needs_shared_fixtures
def test_cli_imports_a_file_and_show_prints_it(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    cli = [sys.executable, "-c", "from harness.cli import main; main()"]

    imported = subprocess.run([*cli, "import", "pi", str(ERROR_TERMINATED), "--store", store],
                              capture_output=True, text=True, check=False, timeout=120)

    assert imported.returncode == 0, imported.stderr
    session_id = imported.stdout.strip()
    assert "31 messages" in imported.stderr
    assert "16 unanswered" in imported.stderr
    shown = subprocess.run([*cli, "show", session_id, "--store", store],
                           capture_output=True, text=True, check=False, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "■ interrupted by you" in shown.stdout  # the aborted reply's row, worded from its details
    assert "terminated" in shown.stdout
    assert "(import.model_change)" in shown.stdout
    lines = shown.stdout.splitlines()
    assert sum(line.startswith("  → ") for line in lines) == 31  # every tool call, answered or not
    assert sum(line.startswith("  ← ") for line in lines) == 15  # and only the results the file holds


@needs_shared_fixtures
def test_cli_refuses_an_unsupported_file_with_its_code(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    claude_code = FIXTURES / "transcripts" / "claude-code-rejected-parallel-tools.jsonl"
    cli = [sys.executable, "-c", "from harness.cli import main; main()"]

    result = subprocess.run([*cli, "import", "pi", str(claude_code), "--store", store],
                            capture_output=True, text=True, check=False, timeout=120)

    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error [unsupported_format]: claude-code-rejected-parallel-tools.jsonl line 1")


# Synthetic files below: no real pi v2/v3 session file is available (see PROVENANCE.md, Gaps).


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def user(entry_id: str, parent: str | None, text: str, ts: int) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent, "timestamp": "2026-01-01T00:00:00.000Z",
            "message": {"role": "user", "content": text, "timestamp": ts}}


def reply(entry_id: str, parent: str, text: str, ts: int) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent, "timestamp": "2026-01-01T00:00:01.000Z",
            "message": {"role": "assistant", "content": [{"type": "text", "text": text}],
                        "api": "anthropic-messages", "provider": "anthropic", "model": "claude-x",
                        "usage": {"input": 1, "output": 2, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 3,
                                  "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}},
                        "stopReason": "stop", "timestamp": ts}}


async def test_synthetic_v3_follows_the_leaf_path_with_tree_entries(
    store: Store, ctx: Context, tmp_path: Path
) -> None:
    """Synthetic v3 file: a tree with an abandoned path; the branch is the last entry's path."""
    path = write_jsonl(tmp_path / "synthetic-v3.jsonl", [
        {"type": "session", "version": 3, "id": "s", "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/w"},
        user("u1", None, "first question", 1),
        reply("a1", "u1", "first answer", 2),
        user("u2", "a1", "abandoned question", 3),
        reply("a2", "u2", "abandoned answer", 4),
        {"type": "branch_summary", "id": "b1", "parentId": "a1", "timestamp": "2026-01-01T00:00:05.000Z",
         "fromId": "a2", "summary": "we tried the other way"},
        {"type": "custom_message", "id": "c1", "parentId": "b1", "timestamp": "2026-01-01T00:00:06.000Z",
         "customType": "note", "content": "injected", "display": True},
        {"type": "custom", "id": "x1", "parentId": "c1", "timestamp": "2026-01-01T00:00:06.500Z",
         "customType": "ext-state", "data": {"count": 2}},
        user("u3", "x1", "next question", 7),
        {"type": "compaction", "id": "k1", "parentId": "u3", "timestamp": "2026-01-01T00:00:08.000Z",
         "summary": "summary so far", "firstKeptEntryId": "c1", "tokensBefore": 1234},
        reply("a3", "k1", "after compaction", 9),
        {"type": "label", "id": "l1", "parentId": "a3", "timestamp": "2026-01-01T00:00:10.000Z",
         "targetId": "u1", "label": "start"},
        {"type": "session_info", "id": "i1", "parentId": "l1", "timestamp": "2026-01-01T00:00:11.000Z",
         "name": "Synthetic tree"},
    ])

    report = await import_pi_session(store, path, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    kinds = [e.type for e in entries]
    assert kinds == ["custom", "message", "message", "branch_summary", "custom_message", "custom", "message",
                     "compaction", "message"]
    assert [m.timestamp for m in messages(entries)] == [1, 2, 7, 9]
    summary = entries[3].payload
    assert isinstance(summary, BranchSummaryPayload)
    assert (summary.from_id, summary.summary) == (None, "we tried the other way")
    custom_message = entries[4].payload
    assert isinstance(custom_message, CustomMessagePayload)
    assert (custom_message.message.custom_type, custom_message.message.content) == ("pi.note", "injected")
    assert entries[5].payload == CustomPayload(custom_type="pi.ext-state", data={"count": 2})
    compaction = entries[7].payload
    assert isinstance(compaction, CompactionPayload)
    assert compaction.tokens_before == 1234
    tail = compaction.retained_tail
    assert [type(m) for m in tail] == [CustomMessage, UserMessage]
    assert report.skipped == {"entry on another branch": 2}
    session = await store.open_session(report.session_id, ctx)
    assert await session.get(addresses.entry_label(entries[1].id), ctx) == "start"
    assert await session.get(addresses.session_name(), ctx) == "Synthetic tree"


async def test_synthetic_v2_reads_hook_messages_and_reports_a_dangling_parent(
    store: Store, ctx: Context, tmp_path: Path
) -> None:
    """Synthetic v2 file: the v2 `hookMessage` role, and a first entry whose parent is missing."""
    path = write_jsonl(tmp_path / "synthetic-v2.jsonl", [
        {"type": "session", "version": 2, "id": "s", "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/w"},
        user("u1", "gone", "hello", 1),
        {"type": "message", "id": "h1", "parentId": "u1", "timestamp": "2026-01-01T00:00:02.000Z",
         "message": {"role": "hookMessage", "customType": "hook", "content": [{"type": "text", "text": "hi"}],
                     "display": False, "timestamp": 2}},
        {"type": "model_change", "id": "m1", "parentId": "h1", "timestamp": "2026-01-01T00:00:03.000Z",
         "provider": "openai", "modelId": "gpt-x"},
    ])

    report = await import_pi_session(store, path, "user", ctx)

    entries = await lane_branch(store, report.session_id, ctx)
    assert [e.type for e in entries] == ["custom", "message", "custom_message", "custom"]
    hook = entries[2].payload
    assert isinstance(hook, CustomMessagePayload)
    assert (hook.message.custom_type, hook.message.display) == ("pi.hook", False)
    assert report.warnings == ["line 2: entry u1 names parent gone, which is not in the file; "
                               "the branch starts at this entry"]
    session = await store.open_session(report.session_id, ctx)
    config = await session.get(addresses.lane_config("main"), ctx)
    assert config is not None
    assert (config.model.provider, config.model.model_id) == ("openai", "gpt-x")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"type":"session","version":4,"id":"s"}', '{"type":"message"}'], "version 4 is not supported"),
        (['{"type":"session","version":"3","id":"s"}'], "version '3' is not supported"),
        (['{"type":"message","message":{"role":"user","content":"hi"}}'], "not a pi session file"),
        (['{"type":"session","id":"s"}', "{not json"], "line 2: not a JSON line"),
        (['{"type":"session","id":"s"}', '{"type":"message","message":{"role":"assistant","content":[]}}'],
         "line 2: record does not have the expected shape"),
        ([], "holds no records"),
    ],
    ids=["version-4", "version-string", "no-header", "bad-json", "bad-record", "empty"],
)
async def test_unsupported_files_are_refused_and_nothing_is_written(
    store: Store, ctx: Context, tmp_path: Path, lines: list[str], message: str
) -> None:
    path = tmp_path / "unsupported.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    with pytest.raises(UnsupportedFormat, match=message):
        await import_pi_session(store, path, "user", ctx)

    assert await store.list_sessions(ctx) == []


@needs_shared_fixtures
async def test_a_claude_code_file_is_not_a_pi_session(store: Store, ctx: Context) -> None:
    with pytest.raises(UnsupportedFormat, match="first line is not a `session` header"):
        await import_pi_session(store, FIXTURES / "transcripts" / "claude-code-after-compaction-excerpt.jsonl",
                                "user", ctx)

    assert await store.list_sessions(ctx) == []
