"""The session commands as a person runs them: `sessions`, `show`, `export`, `delete` and `abort` as
real subprocesses on a SQLite store under a temporary HARNESS_HOME, a SESSION given by id, id
prefix or name, and a journal damaged on disk. White-box in one test: the doctor's store check is
called in-process (`cli.config.check_store`), since `harness doctor` also runs the embedded model."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pexpect
import pytest

from harness.cli.config import LEGACY_DOCTOR_SESSION_ID, check_store
from harness.context import Context
from harness.messages import ModelIdentity
from harness.providers.replay import Hold, ReplayResponse, ReplayServer
from harness.session import LaneConfig, LaneLastResult, SessionInfo, addresses, connect
from journal_helpers import append_chain
from test_cli_run import environment

TIMEOUT_S = 60
GPT_4O = LaneConfig(model=ModelIdentity(provider="openai", model_id="gpt-4o"))
NOT_UTF8 = "CAST(X'80ff' AS TEXT)"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


def harness(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=home, env=environment(home, **(env or {})),
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)


def openai_env(server: ReplayServer) -> dict[str, str]:
    return {"OPENAI_BASE_URL": f"{server.base_url}/v1", "OPENAI_API_KEY": "test"}


def chat_text(*pieces: str | Hold) -> ReplayResponse:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        body = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(body)}\n\n"

    parts: list[str | Hold] = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": p}) if isinstance(p, str) else p for p in pieces]
    return ReplayResponse.sse(*parts, chunk({}, "stop"), "data: [DONE]\n\n")


def store_url(home: Path) -> str:
    return f"sqlite:///{home / 'harness.db'}"


def make_session(home: Path, texts: list[str], *, name: str | None = None, session_id: str | None = None
                 ) -> tuple[str, list[str]]:
    """A session in the home's store with lane main on gpt-4o holding `texts` as user messages."""

    async def build() -> tuple[str, list[str]]:
        context = Context()
        store = await connect(store_url(home), context)
        try:
            session = await store.create_session(context, session_id=session_id)
            await session.create_lane("main", GPT_4O, context)
            ids = await append_chain(session, texts, context) if texts else []
            if name is not None:
                async def rename(m: Any) -> None:
                    m.set(addresses.session_name(), name)

                await session.mutate(rename, context)
            return session.id, ids
        finally:
            await store.close(context)

    return asyncio.run(build())


def listed_sessions(home: Path) -> list[SessionInfo]:
    async def read() -> list[SessionInfo]:
        context = Context()
        store = await connect(store_url(home), context)
        try:
            return await store.list_sessions(context)
        finally:
            await store.close(context)

    return asyncio.run(read())


def lane_record(home: Path, session_id: str) -> tuple[str | None, LaneLastResult | None]:
    """Lane main's current operation id and last result."""

    async def read() -> tuple[str | None, LaneLastResult | None]:
        context = Context()
        store = await connect(store_url(home), context)
        try:
            session = await store.open_session(session_id, context)
            state = await session.get(addresses.lane_state("main"), context)
            assert state is not None
            return state.current_operation_id, await session.get(addresses.lane_last_result("main"), context)
        finally:
            await store.close(context)

    return asyncio.run(read())


def damage_entry(home: Path, entry_id: str) -> None:
    with sqlite3.connect(home / "harness.db") as db:
        db.execute(f"UPDATE entries SET payload = {NOT_UTF8} WHERE id = ?", (entry_id,))


def when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M")


# -- listing and naming a session -------------------------------------------------------------------


def test_sessions_lists_each_session_with_created_and_updated_times_and_name(home: Path) -> None:
    first, _ = make_session(home, ["hello"], name="first chat")
    second, _ = make_session(home, [])

    listed = harness(home, "sessions")

    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["SESSION", "CREATED", "UPDATED", "NAME"]
    infos = {info.id: info for info in listed_sessions(home)}
    assert rows == [
        f"{first}  {when(infos[first].created_at)}  {when(infos[first].updated_at)}  first chat",
        f"{second}  {when(infos[second].created_at)}  {when(infos[second].updated_at)}",
    ]


def test_a_session_is_named_by_its_id_a_unique_prefix_or_its_exact_name(home: Path) -> None:
    make_session(home, ["by id"], session_id="abc-1")
    make_session(home, ["by prefix"], session_id="abd-2")
    make_session(home, ["by name"], session_id="xyz-3", name="my notes")

    for reference, text in (("abc-1", "by id"), ("abd", "by prefix"), ("my notes", "by name")):
        shown = harness(home, "show", reference)
        assert shown.returncode == 0, shown.stderr
        assert text in shown.stdout

    ambiguous = harness(home, "show", "ab")
    assert ambiguous.returncode == 1
    assert "error [ambiguous_session]" in ambiguous.stderr
    assert "abc-1" in ambiguous.stderr
    assert "abd-2" in ambiguous.stderr
    unknown = harness(home, "export", "my note")
    assert unknown.returncode == 1
    assert "error [session_not_found]" in unknown.stderr


def test_export_counts_in_words_and_an_import_keeps_the_name_unambiguous(home: Path) -> None:
    """Issue 33, item 12: `export` said "1 lanes", and an imported session took the original's name,
    so the name no longer named one session; `show`'s first line ran the name into the lane."""
    session_id, _ = make_session(home, ["the only entry"], name="my notes")
    exported = harness(home, "export", session_id, "-o", str(home / "notes.jsonl"))

    imported = harness(home, "import", "harness", str(home / "notes.jsonl"))

    assert exported.stderr.splitlines()[0] == "exported 1 entry, 1 lane, 0 labels, 0 usage rows"
    assert imported.returncode == 0, imported.stderr
    original = harness(home, "show", "my notes")
    assert original.returncode == 0, original.stderr
    assert original.stdout.startswith("my notes · lane main\n")
    assert harness(home, "show", "my notes (imported)").stdout.startswith("my notes (imported) · lane main\n")


def test_run_session_takes_a_prefix_too(home: Path, server: ReplayServer) -> None:
    session_id, _ = make_session(home, [], session_id="prefix-run-1")
    server.enqueue(chat_text("Answered."))

    run = harness(home, "run", "question", "--session", "prefix-run", env=openai_env(server))

    assert run.returncode == 0, run.stderr
    assert f"session {session_id}" in run.stderr


# -- delete -----------------------------------------------------------------------------------------


def test_delete_without_a_terminal_needs_yes_and_then_removes_the_session(home: Path) -> None:
    doomed, _ = make_session(home, ["goodbye"], name="doomed")
    kept, _ = make_session(home, ["stay"])

    refused = harness(home, "delete", "doomed")
    assert refused.returncode == 2
    assert "--yes" in refused.stderr
    assert {info.id for info in listed_sessions(home)} == {doomed, kept}

    deleted = harness(home, "delete", doomed[:30], "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert f"deleted session {doomed} (doomed)" in deleted.stderr
    assert [info.id for info in listed_sessions(home)] == [kept]
    shown = harness(home, "show", doomed)
    assert shown.returncode == 1
    assert "error [session_not_found]" in shown.stderr


def test_delete_asks_in_a_terminal(home: Path) -> None:
    session_id, _ = make_session(home, ["maybe"])
    command = [sys.executable, "-m", "harness.cli", "delete", session_id]

    declined = pexpect.spawn(command[0], command[1:], env=environment(home), encoding="utf-8", timeout=TIMEOUT_S)
    declined.expect_exact(f"delete session {session_id} and all its entries? [y/N]")
    declined.sendline("n")
    declined.expect_exact("nothing deleted")
    declined.expect(pexpect.EOF)
    declined.close()
    assert declined.exitstatus == 1
    assert [info.id for info in listed_sessions(home)] == [session_id]

    accepted = pexpect.spawn(command[0], command[1:], env=environment(home), encoding="utf-8", timeout=TIMEOUT_S)
    accepted.expect_exact("[y/N]")
    accepted.sendline("y")
    accepted.expect_exact(f"deleted session {session_id}")
    accepted.expect(pexpect.EOF)
    accepted.close()
    assert accepted.exitstatus == 0
    assert listed_sessions(home) == []


def test_delete_is_refused_while_the_session_is_attached(home: Path) -> None:
    session_id, _ = make_session(home, ["busy"])

    async def attempt_while_attached() -> subprocess.CompletedProcess[str]:
        context = Context()
        store = await connect(store_url(home), context)
        try:
            ownership = await (await store.open_session(session_id, context)).attach("a chat", context)
            try:
                return await asyncio.to_thread(harness, home, "delete", session_id, "--yes")
            finally:
                await ownership.detach(context)
        finally:
            await store.close(context)

    refused = asyncio.run(attempt_while_attached())

    assert refused.returncode == 1
    assert "error [session_owned]" in refused.stderr
    assert [info.id for info in listed_sessions(home)] == [session_id]


# -- damaged bytes and abort ------------------------------------------------------------------------


def test_show_ends_at_the_last_line_of_text(home: Path, server: ReplayServer) -> None:
    """A reply ending in a code block or a table is rendered with rich's padding under it, which
    `show` printed as trailing blank lines."""
    server.enqueue(chat_text("Run it:\n\n```sh\nls -l\n```\n"), chat_text("| a | b |\n|---|---|\n| 1 | 2 |\n"))
    first = harness(home, "run", "how?", "--model", "openai/gpt-4o", "--no-tools", env=openai_env(server))
    session_id = listed_sessions(home)[0].id
    code_block = harness(home, "show", session_id)
    harness(home, "run", "and?", "--session", session_id, env=openai_env(server))
    table = harness(home, "show", session_id)

    assert first.returncode == 0, first.stderr
    assert code_block.stdout.splitlines()[-1].strip() == "ls -l"
    assert table.stdout.splitlines()[-1].strip().split() == ["1", "2"]
    assert not code_block.stdout.endswith("\n\n")


def test_show_cuts_long_texts_says_so_and_full_prints_them_whole(home: Path, server: ReplayServer) -> None:
    """Issue 33, item 11: a long reply was cut with no way to see it whole."""
    words = " ".join(f"word{i}" for i in range(200))
    server.enqueue(chat_text(words + " THE END"))
    harness(home, "run", "long?", "--model", "openai/gpt-4o", "--no-tools", env=openai_env(server))
    session_id = listed_sessions(home)[0].id

    cut = harness(home, "show", session_id)
    whole = harness(home, "show", session_id, "--full")

    assert "THE END" not in cut.stdout
    assert cut.stdout.splitlines()[-1] == (f"(1 text was cut at 400 characters: `harness show {session_id} --full` "
                                           "shows them whole)")
    assert whole.returncode == 0, whole.stderr
    assert " ".join(whole.stdout.split()).endswith(words + " THE END")
    assert "cut at" not in whole.stdout


def test_show_keeps_the_lines_of_a_reply_whose_code_fence_is_missing(home: Path, server: ReplayServer) -> None:
    """Issue 33, item 11: code whose opening fence the model left out was reflowed into one
    paragraph, and the lone closing fence's code block printed as lines of spaces."""
    server.enqueue(chat_text("Here it is:\ndef main():\n    return 1\n```\n\nDone."))
    harness(home, "run", "code?", "--model", "openai/gpt-4o", "--no-tools", env=openai_env(server))

    shown = harness(home, "show", listed_sessions(home)[0].id)

    lines = shown.stdout.splitlines()
    reply = lines[lines.index("Here it is:"):]
    assert reply[1:3] == ["def main():", "return 1"]
    assert all(line == line.rstrip() for line in lines)
    assert reply[-1] == " Done."  # what follows a lone fence is code, as CommonMark says


def test_show_and_export_report_damaged_bytes_as_storage_corruption(home: Path) -> None:
    """Issue 10: bytes that are not UTF-8 in an entry's payload made `show` and `export` die with a
    traceback of sqlite3.OperationalError; now a coded one-line error names the entry."""
    session_id, ids = make_session(home, ["fine", "damaged", "fine again"])
    damage_entry(home, ids[1])

    for command in (["show", session_id], ["export", session_id]):
        failed = harness(home, *command)
        assert failed.returncode == 1, command
        assert "Traceback" not in failed.stderr
        assert f"error [storage_corruption]: entry {ids[1]} holds bytes that are not UTF-8" in failed.stderr


def test_abort_with_nothing_open_says_so(home: Path) -> None:
    session_id, _ = make_session(home, ["idle"])

    aborted = harness(home, "abort", session_id)

    assert aborted.returncode == 0, aborted.stderr
    assert f"nothing to abort: lane main of session {session_id} has no open operation" in aborted.stdout


def run_killed_mid_reply(home: Path, server: ReplayServer) -> str:
    """Start `harness run`, kill it (SIGKILL) once part of the reply is persisted as frames, and
    return its session id."""
    hold = Hold()
    server.enqueue(chat_text("Partial, ", hold, "never sent."))
    process = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "count", "--model", "openai/gpt-4o"],
                               cwd=home, env=environment(home, **openai_env(server)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert hold.reached.wait(TIMEOUT_S), "the request never reached the hold"
        deadline = time.monotonic() + TIMEOUT_S
        while not persisted_frames(home):
            assert time.monotonic() < deadline, "no frame was persisted"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        hold.release()
        if process.poll() is None:
            process.kill()
    found = re.search(r"session (\S+)", stderr)
    assert found, stderr
    return found.group(1)


FRAMES = addresses.assistant_frames("", "").namespace
"""The list namespace of a streaming reply's frame pages (the event log's rows are list items too)."""


def persisted_frames(home: Path) -> int:
    """The frame pages holding the reply's text so far (a first page may hold only its start)."""
    with sqlite3.connect(home / "harness.db") as db:
        count: int = db.execute("SELECT count(*) FROM list_items WHERE namespace = ? AND value LIKE '%Partial, %'",
                                (FRAMES,)).fetchone()[0]
    return count


def test_abort_settles_a_run_a_killed_process_left_open(home: Path, server: ReplayServer) -> None:
    """`harness abort` finishes a run whose process was killed mid-reply, with no model key set."""
    session_id = run_killed_mid_reply(home, server)
    operation_id, _ = lane_record(home, session_id)
    assert operation_id is not None

    aborted = harness(home, "abort", session_id[:30])

    assert aborted.returncode == 0, aborted.stderr
    assert aborted.stdout.strip() == f"run {operation_id} on lane main of session {session_id}: aborted (user)"
    current, last = lane_record(home, session_id)
    assert current is None
    assert last is not None
    assert last.outcome == "aborted"
    assert last.abort_cause == "user"


def test_resume_after_a_kill_says_it_resumes_and_prints_only_the_new_reply(home: Path, server: ReplayServer) -> None:
    """Issue 33, item 8: the fragment a killed run had streamed is discarded by `--resume`, not printed
    before the new reply as if both were the answer, and stderr says it resumes, not that it retries."""
    session_id = run_killed_mid_reply(home, server)
    server.enqueue(chat_text("Whole answer."))

    resumed = harness(home, "run", "--session", session_id, "--resume", env=openai_env(server))

    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "Whole answer.\n"
    assert "retrying" not in resumed.stderr
    said = resumed.stderr.splitlines()
    assert said[-2:] == ["the reply cut off when the earlier process stopped is discarded",
                         "resuming the run: asking the model again"]


def test_a_damaged_branch_refuses_a_run_and_a_run_left_open_on_one_is_aborted_from_the_cli(
        home: Path, server: ReplayServer) -> None:
    """Issue 10: a run on a branch holding damaged bytes is refused with `storage_corruption` (no
    traceback) and nothing is admitted (admission reads the branch for the reasoning level it
    announces, CE-14); a run a killed process left open on a branch damaged since is settled by
    `harness abort` without reading the damaged entry."""
    session_id, ids = make_session(home, ["damaged history"])
    damage_entry(home, ids[0])

    run = harness(home, "run", "next question", "--session", session_id, env=openai_env(server))

    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert f"error [storage_corruption]: entry {ids[0]}" in run.stderr
    assert server.requests == []
    assert lane_record(home, session_id)[0] is None

    left_open = run_killed_mid_reply(home, server)
    operation_id, _ = lane_record(home, left_open)
    assert operation_id is not None
    with sqlite3.connect(home / "harness.db") as db:
        [first] = db.execute("SELECT id FROM entries WHERE session_id = ? ORDER BY seq LIMIT 1",
                             (left_open,)).fetchone()
    damage_entry(home, first)

    aborted = harness(home, "abort", left_open, "--cause", "user")

    assert aborted.returncode == 0, aborted.stderr
    assert aborted.stdout.strip() == f"run {operation_id} on lane main of session {left_open}: aborted (user)"
    assert lane_record(home, left_open)[0] is None


def test_abort_settles_a_run_whose_streamed_frames_are_damaged(home: Path, server: ReplayServer) -> None:
    """What had streamed cannot be read back (its frames hold bytes that are not UTF-8): the abort
    still settles, instead of failing on them and leaving the lane busy for good."""
    session_id = run_killed_mid_reply(home, server)
    with sqlite3.connect(home / "harness.db") as db:
        damaged = db.execute(f"UPDATE list_items SET value = {NOT_UTF8} WHERE namespace = ?", (FRAMES,)).rowcount
    assert damaged > 0

    aborted = harness(home, "abort", session_id)

    assert aborted.returncode == 0, aborted.stderr
    assert aborted.stdout.strip().endswith("aborted (user)")
    assert lane_record(home, session_id)[0] is None


def test_abort_refuses_an_unknown_cause(home: Path) -> None:
    session_id, _ = make_session(home, [])

    refused = harness(home, "abort", session_id, "--cause", "boredom")

    assert refused.returncode == 2
    assert "user" in refused.stderr


# -- doctor -----------------------------------------------------------------------------------------


def test_doctor_store_check_leaves_no_session_and_removes_the_old_scratch_session(home: Path) -> None:
    make_session(home, [], session_id=LEGACY_DOCTOR_SESSION_ID)

    checks = asyncio.run(check_store(store_url(home), Context()))

    assert [(check.name, check.status) for check in checks] == [("store", "ok"), ("store write", "ok")]
    assert listed_sessions(home) == []
    assert harness(home, "sessions").stdout == ""
