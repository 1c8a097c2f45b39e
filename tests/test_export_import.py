"""`harness export` and `harness import harness`: a session written out as JSONL and read back into a
new session has the same entries, ids, parent links, lanes, labels, name (marked as imported) and usage
ledger."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from harness.cli.config import local_user
from harness.context import Context
from harness.conversation import ConversationService
from harness.errors import UnsupportedFormat
from harness.imports import export_harness_session, import_harness_session
from harness.messages import (
    AssistantMessage,
    ModelIdentity,
    TextContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ToolSpec
from harness.providers.faux import reply, tool_call
from harness.runtime import (
    AgentHarness,
    AgentHarnessOptions,
    AgentTool,
    CompactionSettings,
    DriveSettings,
    PromptRequest,
    Settled,
    ToolOutput,
)
from harness.session import (
    BranchSummaryPayload,
    CompactionPayload,
    CustomPayload,
    EntryPayload,
    LaneConfig,
    LaneLastResult,
    LaneState,
    MessagePayload,
    Session,
    SessionMutator,
    Store,
    addresses,
    connect,
)

MODEL = ModelIdentity(provider="openai", model_id="gpt-4o")
FAUX = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)
READ = ToolSpec(name="read", description="Read a file.",
                parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})


def assistant(*content: TextContent | ToolCall, stop_reason: str = "stop", tokens: int = 10) -> MessagePayload:
    message = AssistantMessage.model_validate({
        "content": list(content), "api": "openai-chat", "provider": "openai", "model": "gpt-4o",
        "stop_reason": stop_reason, "usage": Usage(input=tokens, output=tokens, total_tokens=2 * tokens),
        "timestamp": 1_700_000_000_000,
    })
    return MessagePayload(message=message)


def user(text: str) -> MessagePayload:
    return MessagePayload(message=UserMessage(content=text, timestamp=1_700_000_000_000))


def result(call_id: str, name: str, text: str) -> MessagePayload:
    return MessagePayload(message=ToolResultMessage(tool_call_id=call_id, tool_name=name, is_error=False,
                                                    content=[TextContent(text=text)], details={"n": 1},
                                                    timestamp=1_700_000_000_000))


@dataclass
class Built:
    session: Session
    ids: dict[str, str]


async def build_session(store: Store, context: Context) -> Built:
    """A journal with everything an export must carry: a turn with two tool calls and their
    results, a failed attempt kept beside the branch (only its usage row names it), a compaction,
    a second lane forked from the first turn with a branch summary of an abandoned branch, labels,
    a session name, a last result and usage rows (one an adjustment with details)."""
    session = await store.create_session(context)
    await session.create_lane("main", LaneConfig(model=MODEL, active_tools=["read"]), context)
    ids: dict[str, str] = {}

    async def write(m: SessionMutator) -> None:
        def add(name: str, payload: EntryPayload, parent: str | None) -> str:
            ids[name] = m.insert_entry(payload, parent_id=parent)
            return ids[name]

        tip = add("prompt", user("What is in the repo?"), None)
        add("failed", assistant(TextContent(text="partial"), stop_reason="error", tokens=3), tip)
        calls = [ToolCall(id="call-a", name="read", arguments={"path": "a.txt"}),
                 ToolCall(id="call-b", name="list", arguments={})]
        tip = add("calls", assistant(TextContent(text="Looking."), *calls, stop_reason="tool_use"), tip)
        tip = add("result-a", result("call-a", "read", "alpha"), tip)
        tip = add("result-b", result("call-b", "list", "a.txt\nb.txt"), tip)
        tip = add("answer", assistant(TextContent(text="Two files.")), tip)
        tip = add("compaction", CompactionPayload(summary="The repo has two files.", tokens_before=1234,
                                                  retained_tail=[user("What is in the repo?").message]), tip)
        tip = add("next", user("And now?"), tip)
        tip = add("final", assistant(TextContent(text="Nothing else.")), tip)
        m.set(addresses.branch_tip("main"), tip)
        abandoned = add("abandoned", user("a path nobody names"), ids["answer"])
        side = add("summary", BranchSummaryPayload(from_id=abandoned, summary="tried something else"), ids["answer"])
        side = add("side-note", CustomPayload(custom_type="app.note", data={"k": [1, 2]}), side)
        m.set(addresses.branch_tip("side"), side)
        m.set(addresses.lane_config("side"), LaneConfig(model=FAUX, thinking_level="high"))
        m.set(addresses.lane_state("side"), LaneState())
        m.set(addresses.entry_label(ids["calls"]), "tool turn")
        m.set(addresses.entry_label(ids["compaction"]), "checkpoint")
        m.set(addresses.session_name(), "repo tour")
        m.set(addresses.lane_last_result("main"), LaneLastResult(
            operation_id="op-1", kind="run", outcome="completed", tip_id=tip, final_assistant_entry_id=ids["final"],
            started_at=1, ended_at=2))
        for name in ("failed", "calls", "answer", "final"):
            m.insert_usage(Usage(input=5, output=5, total_tokens=10), entry_id=ids[name])
        m.insert_usage(Usage(input=1), adjustment=True, details={"reason": "refund"})

    await session.mutate(write, context)
    return Built(session, ids)


async def journal(session: Session, entry_ids: list[str], context: Context) -> dict[str, Any]:
    """Everything a round trip must keep, independent of the export: the named entries, lanes,
    labels, name and usage ledger (seq numbers and commit timestamps are the store's own)."""
    entries = await session.entries(entry_ids, context)
    lanes: dict[str, tuple[object, ...]] = {}
    for lane in await session.lanes(context):
        tip = await session.get(addresses.branch_tip(lane), context)
        config = await session.get(addresses.lane_config(lane), context)
        last = await session.get(addresses.lane_last_result(lane), context)
        lanes[lane] = (tip, config, last)
    return {
        "entries": {i: (e.parent_id, e.payload) for i, e in entries.items()},
        "lanes": lanes,
        "labels": await session.scan_values(addresses.entry_label(""), context),
        "name": await session.get(addresses.session_name(), context),
        "usage": [(r.id, r.entry_id, r.adjustment, r.usage, r.details)
                  for r in await session.usage_ledger(context)],
    }


def as_imported(original: dict[str, Any]) -> dict[str, Any]:
    """What the import of `original` holds: the same, its name marked as imported (issue 33, item 12)."""
    return {**original, "name": f"{original['name']} (imported)"}


async def round_trip(store: Store, session: Session, tmp_path: Path, context: Context) -> Session:
    path = tmp_path / "session.jsonl"
    with path.open("w", encoding="utf-8") as file:
        await export_harness_session(session, file, context)
    report = await import_harness_session(store, path, "user", context)
    return await store.open_session(report.session_id, context)


async def test_a_round_trip_keeps_entries_lanes_labels_name_and_usage(store: Store, ctx: Context,
                                                                     tmp_path: Path) -> None:
    built = await build_session(store, ctx)

    imported = await round_trip(store, built.session, tmp_path, ctx)

    ids = list(built.ids.values())
    assert imported.id != built.session.id
    assert await journal(imported, ids, ctx) == as_imported(await journal(built.session, ids, ctx))
    assert len(await imported.entries(ids, ctx)) == len(ids)


async def test_an_import_is_a_conversation_of_the_importing_user_as_with_the_other_importers(
        store: Store, ctx: Context, tmp_path: Path) -> None:
    """The export carries no owner; the import records the importing user as the pi and Claude
    Code importers do, so the conversation service lists and opens it as theirs."""
    built = await build_session(store, ctx)

    imported = await round_trip(store, built.session, tmp_path, ctx)

    conversations = ConversationService(store)
    assert [info.id for info in await conversations.list("user", ctx)] == [imported.id]
    assert await conversations.list("someone else", ctx) == []


async def test_the_export_holds_every_entry_once_in_parent_order(store: Store, ctx: Context) -> None:
    built = await build_session(store, ctx)
    out = io.StringIO()

    report = await export_harness_session(built.session, out, ctx)

    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert records[0]["type"] == "session"
    assert records[0]["format"] == "harness"
    assert records[0]["name"] == "repo tour"
    entries = [r for r in records if r["type"] == "entry"]
    assert sorted(r["id"] for r in entries) == sorted(built.ids.values())
    seen: set[str] = set()
    for record in entries:
        assert record["parent_id"] is None or record["parent_id"] in seen
        seen.add(record["id"])
    assert [r["type"] for r in records].count("lane") == 2
    assert (report.entries, report.lanes, report.labels, report.usage_rows) == (len(built.ids), 2, 2, 5)
    assert report.warnings == []


async def test_an_open_operation_is_left_out_with_a_warning_and_imports_idle(store: Store, ctx: Context,
                                                                            tmp_path: Path) -> None:
    built = await build_session(store, ctx)
    harness, _ = await AgentHarness.create(AgentHarnessOptions(session=built.session), ctx)
    accepted = await harness.lane("main").accept(PromptRequest(text="one more"), ctx)
    out = io.StringIO()
    report = await export_harness_session(built.session, out, ctx)
    await harness.close(ctx)
    path = tmp_path / "open.jsonl"
    path.write_text(out.getvalue(), encoding="utf-8")

    imported = await store.open_session((await import_harness_session(store, path, "user", ctx)).session_id, ctx)

    assert any(accepted.operation_id in warning for warning in report.warnings)
    state = await imported.get(addresses.lane_state("main"), ctx)
    assert state is not None
    assert state.current_operation_id is None
    assert await imported.get(addresses.branch_tip("main"), ctx) == accepted.entry_ids[0]


async def test_a_session_written_by_real_runs_round_trips(store: Store, ctx: Context, tmp_path: Path) -> None:
    """Tool calls, a compaction and usage as the drive writes them, a second lane, labels, a name."""

    async def read(tool_call_id: str, args: dict[str, JsonValue], on_update: Any, context: Context) -> ToolOutput:
        return ToolOutput(content=[TextContent(text=f"contents of {args.get('path')}")], details={"bytes": 3})

    tool = AgentTool(spec=READ, execute=read, replay="safe")
    faux = FauxProvider([reply("Reading.", tool_call("read", {"path": "a.txt"})), "It says hi.",
                         "Second answer.", "Summary of the work so far."])
    session = await store.create_session(ctx)
    await session.create_lane("main", LaneConfig(model=FAUX, active_tools=["read"]), ctx)
    drive = DriveSettings(compaction=CompactionSettings(keep_recent_tokens=1), frame_interval_s=0.0)
    options = AgentHarnessOptions(session=session, models=ModelRegistry([FAUX_MODEL], providers={"faux": faux}),
                                  tools=[tool], drive=drive)
    harness, _ = await AgentHarness.create(options, ctx)
    try:
        lane = harness.lane("main")
        first = await lane.prompt("read a.txt", None, ctx)
        second = await lane.prompt("and then?", None, ctx)
        compacted = await lane.compact(ctx)
        assert isinstance(first, Settled)
        assert isinstance(second, Settled)
        assert isinstance(compacted, Settled)
        assert compacted.result.outcome == "completed"
        await harness.create_lane("fork", LaneConfig(model=FAUX), ctx, at=first.result.tip_id)
        await harness.set_entry_label(first.result.tip_id or "", "first turn", ctx)
        await harness.set_session_name("real runs", ctx)
        main_tip = lane.tip_id
    finally:
        await harness.close(ctx)
    assert main_tip is not None
    page = await session.read_branch(main_tip, ctx, limit=1000)
    ids = [entry.id for entry in page.entries]
    assert any(isinstance(entry.payload, CompactionPayload) for entry in page.entries)

    imported = await round_trip(store, session, tmp_path, ctx)

    assert await journal(imported, ids, ctx) == as_imported(await journal(session, ids, ctx))
    assert len(await imported.usage_ledger(ctx)) == 4


# -- refusals ----------------------------------------------------------------------------------------


def header(**fields: Any) -> str:
    return json.dumps({"type": "session", "format": "harness", "version": 1, "session_id": "s", "created_at": 1,
                       **fields})


def entry(entry_id: str, parent: str | None, text: str = "hi") -> str:
    return json.dumps({"type": "entry", "id": entry_id, "parent_id": parent, "seq": 1, "timestamp": 1,
                       "payload": {"type": "message", "message": {"role": "user", "content": text, "timestamp": 1}}})


@pytest.mark.parametrize(("lines", "problem"), [
    ([json.dumps({"type": "session", "version": 3})], "not a harness session file"),
    ([header(version=2)], "version 2 is not supported"),
    ([header(), entry("b", "a"), entry("a", None)], "names parent a, which does not come before it"),
    ([header(), entry("a", None), entry("a", None)], "entry a appears twice"),
    ([header(), json.dumps({"type": "lane", "name": "main", "tip_id": "zz", "config": {"model": {
        "provider": "p", "model_id": "m"}}})], "lane main names entry zz"),
    ([header(), json.dumps({"type": "mystery"})], "unknown record type"),
    ([header(), json.dumps({"type": "entry", "id": "a", "parent_id": None, "seq": 1, "timestamp": 1,
                            "payload": {"type": "message", "message": {"role": "robot"}}})], "expected shape"),
], ids=["other-format", "version", "parent-order", "duplicate", "dangling-lane", "unknown-type", "bad-payload"])
async def test_a_file_that_does_not_hold_a_harness_session_writes_nothing(tmp_path: Path, ctx: Context,
                                                                        lines: list[str], problem: str) -> None:
    store = await connect("memory://", ctx)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        with pytest.raises(UnsupportedFormat, match=problem):
            await import_harness_session(store, path, "user", ctx)
        assert await store.list_sessions(ctx) == []
    finally:
        await store.close()


# -- the commands -------------------------------------------------------------------------------------


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HARNESS_STORE", "HARNESS_HOME")}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], env={**env, "HARNESS_HOME": str(home)},
                          capture_output=True, text=True, timeout=120, check=False)


def comparable(jsonl: str) -> list[dict[str, Any]]:
    """The records with what a store assigns (session id and creation, seq, commit time) removed."""
    records = [json.loads(line) for line in jsonl.splitlines()]
    for record in records:
        for key in ("session_id", "created_at", "seq", "timestamp"):
            record.pop(key, None)
    return records


async def test_export_and_import_commands_round_trip(tmp_path: Path, ctx: Context) -> None:
    home = tmp_path / "home"
    home.mkdir()
    store = await connect(f"sqlite:///{home / 'harness.db'}", ctx)
    try:
        source = (await build_session(store, ctx)).session.id
    finally:
        await store.close()

    exported = cli(home, "export", source)
    to_file = cli(home, "export", source, "-o", str(tmp_path / "out.jsonl"))
    imported = cli(home, "import", "harness", str(tmp_path / "out.jsonl"))
    again = cli(home, "export", imported.stdout.strip())

    assert exported.returncode == 0, exported.stderr
    assert to_file.returncode == 0, to_file.stderr
    assert (tmp_path / "out.jsonl").read_text(encoding="utf-8") == exported.stdout
    assert imported.returncode == 0, imported.stderr
    assert "imported harness: 7 messages, 2 tool calls" in imported.stderr
    assert again.returncode == 0, again.stderr
    header, *rest = comparable(again.stdout)
    assert [{**header, "name": "repo tour"}, *rest] == comparable(exported.stdout)
    assert header["name"] == "repo tour (imported)"  # issue 33, item 12: `harness show "repo tour"` is not ambiguous
    store = await connect(f"sqlite:///{home / 'harness.db'}", ctx)
    try:
        owned = [info.id for info in await ConversationService(store).list(local_user(), ctx)]
    finally:
        await store.close()
    assert owned == [imported.stdout.strip()]  # the local account's, as `import pi` and `import claude-code` make it


def test_export_of_an_unknown_session_fails(tmp_path: Path) -> None:
    exported = cli(tmp_path, "export", "no-such-session")

    assert exported.returncode == 1
    assert "session_not_found" in exported.stderr


async def test_export_into_a_missing_folder_is_a_coded_error_not_a_traceback(tmp_path: Path, ctx: Context) -> None:
    """`export -o` into a missing directory printed a FileNotFoundError traceback."""
    home = tmp_path / "home"
    home.mkdir()
    store = await connect(f"sqlite:///{home / 'harness.db'}", ctx)
    try:
        source = (await build_session(store, ctx)).session.id
    finally:
        await store.close()

    exported = cli(home, "export", source, "-o", str(tmp_path / "missing" / "out.jsonl"))

    assert exported.returncode == 1
    assert "error [export_unwritable]" in exported.stderr
    assert "Traceback" not in exported.stderr


def test_importing_a_line_nested_100000_deep_is_unsupported_not_a_traceback(tmp_path: Path) -> None:
    """A JSONL line nested 100,000 levels deep raised RecursionError with a traceback."""
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")

    imported = cli(tmp_path, "import", "harness", str(deep))

    assert imported.returncode == 1
    assert "unsupported_format" in imported.stderr
    assert "Traceback" not in imported.stderr


async def test_an_abandoned_branch_nothing_names_is_exported_too(store: Store, ctx: Context, tmp_path: Path) -> None:
    """No data is lost: an entry off every lane's branch, with no label or usage naming it, is
    still in the export and in the imported session."""
    built = await build_session(store, ctx)
    some_entry = next(iter(built.ids.values()))

    async def abandon(m: SessionMutator) -> str:
        return m.insert_entry(user("a path not taken"), parent_id=some_entry)

    abandoned = await built.session.mutate(abandon, ctx)

    imported = await round_trip(store, built.session, tmp_path, ctx)

    assert await imported.entry(abandoned, ctx) is not None
