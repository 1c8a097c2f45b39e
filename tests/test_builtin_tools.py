"""The built-in tools (read, write, edit, list, grep, shell) and the approval policy; background jobs
are in test_tool_jobs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from harness.context import Context
from harness.messages import ModelIdentity, TextContent, ToolResultMessage
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry
from harness.providers.faux import reply, tool_call
from harness.runtime import AgentHarness, AgentHarnessOptions, AgentTool, Block, RunHooks, Settled, ToolOutput
from harness.session import LaneConfig, MessagePayload, Store
from harness.tools import BUILTIN_TOOL_NAMES, Approval, ApprovalPolicy, ApprovalRequest, Workspace, builtin_tools
from harness.tools.approval import ALLOW_FOR_SESSION, ALLOW_ONCE, DENY
from tool_helpers import Asker, Progress, builtin, call, details, request, text, wait_dead

pytest_plugins = ["tool_fixtures"]  # root and workspace


def content(path: Path) -> str:
    return path.read_text()


def content_bytes(path: Path) -> bytes:
    return path.read_bytes()


# -- the set ---------------------------------------------------------------------------------------


def test_reads_are_replay_safe_and_changes_are_not(workspace: Workspace) -> None:
    """A crash mid-call reruns read, list, grep and jobs; write, edit and shell get an interruption
    (HA-25)."""
    tools = {tool.name: tool for tool in builtin_tools(workspace)}

    assert tuple(tools) == BUILTIN_TOOL_NAMES
    assert {name: tool.replay for name, tool in tools.items()} == {
        "read": "safe", "list": "safe", "grep": "safe", "jobs": "safe", "write": "never", "edit": "never",
        "shell": "never"}
    for tool in tools.values():
        assert tool.spec.parameters["type"] == "object"
        assert tool.spec.parameters["additionalProperties"] is False


# -- read ------------------------------------------------------------------------------------------


async def test_read_returns_the_file_text(workspace: Workspace, root: Path) -> None:
    (root / "notes.txt").write_text("one\ntwo\nthree\n")

    output = await call(workspace, "read", {"path": "notes.txt"})

    assert not output.is_error
    assert text(output) == "one\ntwo\nthree\n"
    assert details(output)["total_lines"] == 3


async def test_read_pages_with_offset_and_limit_and_says_how_to_continue(workspace: Workspace, root: Path) -> None:
    (root / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))

    output = await call(workspace, "read", {"path": "long.txt", "offset": 3, "limit": 2})

    assert text(output).startswith("line 3\nline 4\n")
    assert "showing lines 3-4 of 10; continue with offset=5" in text(output)


async def test_read_past_the_line_limit_is_cut_with_a_note_pointing_at_the_file(root: Path, tmp_path: Path) -> None:
    workspace = Workspace(root=root, output_dir=tmp_path / "out", max_lines=5)
    (root / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))

    output = await call(workspace, "read", {"path": "long.txt"})

    assert text(output).count("\n") < 10
    assert "showing lines 1-5 of 100; continue with offset=6" in text(output)
    assert details(output)["truncated"] is True


async def test_read_refuses_binary_files_and_directories(workspace: Workspace, root: Path) -> None:
    (root / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (root / "folder").mkdir()

    binary = await call(workspace, "read", {"path": "blob.bin"})
    folder = await call(workspace, "read", {"path": "folder"})

    assert "binary file" in text(binary)
    assert folder.is_error
    assert "is a directory" in text(folder)


async def test_read_of_a_missing_file_is_an_error_result(workspace: Workspace) -> None:
    output = await call(workspace, "read", {"path": "nope.txt"})

    assert output.is_error
    assert "No such file" in text(output)


async def test_named_pipes_are_never_opened_by_read_grep_or_write(workspace: Workspace, root: Path) -> None:
    """A named pipe in the working directory blocked `read` and `grep` forever in a worker
    thread, and the process could never exit: they are skipped and the result says so."""
    os.mkfifo(root / "pipe")
    (root / "notes.txt").write_text("needle here\n")

    read = await asyncio.wait_for(call(workspace, "read", {"path": "pipe"}), 10)
    found = await asyncio.wait_for(call(workspace, "grep", {"pattern": "needle"}), 10)
    written = await asyncio.wait_for(call(workspace, "write", {"path": "pipe", "content": "x"}), 10)

    assert read.is_error
    assert "not a regular file" in text(read)
    assert "notes.txt:1:needle here" in text(found)
    assert "not searched: 1 named pipes" in text(found)
    assert details(found)["not_regular_files"] == 1
    assert written.is_error


# -- write and edit ----------------------------------------------------------------------------------


async def test_write_creates_the_file_and_its_directories(workspace: Workspace, root: Path) -> None:
    output = await call(workspace, "write", {"path": "a/b/new.txt", "content": "hello\n"})

    assert not output.is_error
    assert (root / "a" / "b" / "new.txt").read_text() == "hello\n"
    assert details(output)["created"] is True


async def test_edit_replaces_exactly_one_occurrence(workspace: Workspace, root: Path) -> None:
    (root / "app.py").write_text("x = 1\ny = 2\n")

    output = await call(workspace, "edit", {"path": "app.py", "old_text": "y = 2", "new_text": "y = 3"})

    assert not output.is_error
    assert (root / "app.py").read_text() == "x = 1\ny = 3\n"
    assert "line 2" in text(output)
    assert "+y = 3" in str(details(output)["diff"])


async def test_edit_refuses_missing_and_ambiguous_text_and_changes_nothing(workspace: Workspace, root: Path) -> None:
    (root / "app.py").write_text("a\na\n")

    missing = await call(workspace, "edit", {"path": "app.py", "old_text": "b", "new_text": "c"})
    ambiguous = await call(workspace, "edit", {"path": "app.py", "old_text": "a", "new_text": "c"})

    assert missing.is_error
    assert "not found" in text(missing)
    assert ambiguous.is_error
    assert "occurs 2 times" in text(ambiguous)
    assert (root / "app.py").read_text() == "a\na\n"


async def test_edit_with_replace_all_replaces_every_occurrence(workspace: Workspace, root: Path) -> None:
    (root / "app.py").write_text("a\na\n")

    output = await call(workspace, "edit", {"path": "app.py", "old_text": "a", "new_text": "c", "replace_all": True})

    assert (root / "app.py").read_text() == "c\nc\n"
    assert details(output)["replacements"] == 2


# -- list and grep ---------------------------------------------------------------------------------


async def test_list_marks_directories_and_descends_to_the_depth_asked(workspace: Workspace, root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("")
    (root / "README").write_text("")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("")

    shallow = await call(workspace, "list", {})
    deep = await call(workspace, "list", {"depth": 3})

    assert text(shallow).splitlines() == [".git/", "README", "src/"]
    assert text(deep).splitlines() == [".git/", "README", "src/", "src/pkg/", "src/pkg/mod.py"]


async def test_grep_finds_matching_lines_with_glob_and_case_options(workspace: Workspace, root: Path) -> None:
    (root / "a.py").write_text("import os\nprint('Hello')\n")
    (root / "b.txt").write_text("hello there\n")

    everywhere = await call(workspace, "grep", {"pattern": "hello", "ignore_case": True})
    python_only = await call(workspace, "grep", {"pattern": "hello", "ignore_case": True, "glob": "*.py"})
    none = await call(workspace, "grep", {"pattern": "absent"})

    assert text(everywhere).splitlines() == ["a.py:2:print('Hello')", "b.txt:1:hello there"]
    assert text(python_only).splitlines() == ["a.py:2:print('Hello')"]
    assert not none.is_error
    assert "No matches" in text(none)


async def test_grep_with_a_bad_pattern_is_an_error_result(workspace: Workspace) -> None:
    output = await call(workspace, "grep", {"pattern": "("})

    assert output.is_error
    assert "not a valid regular expression" in text(output)


async def test_a_long_output_is_truncated_and_kept_whole_on_disk(root: Path, tmp_path: Path) -> None:
    """The model gets the head and a note naming the file; the file holds every line."""
    workspace = Workspace(root=root, output_dir=tmp_path / "home" / "tool-output", max_lines=10, max_chars=10_000)
    (root / "big.txt").write_text("".join(f"match {i}\n" for i in range(500)))

    output = await call(workspace, "grep", {"pattern": "match"})

    shown = text(output)
    full = Path(str(details(output)["full_output"]))
    assert details(output)["truncated"] is True
    assert shown.startswith("big.txt:1:match 0\n")
    assert "big.txt:11:" not in shown
    assert "showing the first 10 of 500 lines" in shown
    assert str(full) in shown
    assert full.parent == tmp_path / "home" / "tool-output"
    assert content(full).splitlines() == [f"big.txt:{i + 1}:match {i}" for i in range(500)]


async def test_the_kept_full_output_can_be_read_back_with_the_read_tool(root: Path, tmp_path: Path) -> None:
    workspace = Workspace(root=root, output_dir=tmp_path / "out", max_lines=10)
    (root / "big.txt").write_text("".join(f"match {i}\n" for i in range(50)))
    full = details(await call(workspace, "grep", {"pattern": "match"}))["full_output"]

    output = await call(workspace, "read", {"path": str(full), "offset": 49})

    assert not output.is_error
    assert text(output).startswith("big.txt:49:match 48\n")


def _peak_of(run: Callable[[], Awaitable[ToolOutput]]) -> Callable[[], Awaitable[tuple[ToolOutput, int]]]:
    async def measured() -> tuple[ToolOutput, int]:
        tracemalloc.start()
        try:
            output = await run()
            return output, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    return measured


async def test_read_counts_and_pages_lines_across_megabytes(workspace: Workspace, root: Path) -> None:
    """Lines outside the page are counted a megabyte at a time: the count and the page are exact
    across those chunks, a last line without a line end included."""
    (root / "numbers.txt").write_text("".join(f"line {i}\n" for i in range(1, 300_000)) + "line 300000")

    output = await call(workspace, "read", {"path": "numbers.txt", "offset": 250_000, "limit": 2})
    end = await call(workspace, "read", {"path": "numbers.txt", "offset": 300_000})

    assert text(output) == ("line 250000\nline 250001\n\n"
                            "[showing lines 250000-250001 of 300000; continue with offset=250002]")
    assert text(end) == "line 300000"
    assert details(end)["total_lines"] == 300_000


async def test_read_pages_a_huge_kept_line_in_a_few_megabytes(workspace: Workspace) -> None:
    """Issue 11: read held a whole line, so a shell output of one 20 MB line (kept whole, and the
    note sends the model to read it) cost 40 MB at the peak. It reads no further than it shows."""
    workspace.output_dir.mkdir(parents=True)
    kept = workspace.output_dir / "call-1.log"
    kept.write_bytes(b"a" * 20_000_000)

    output, peak = await _peak_of(lambda: call(workspace, "read", {"path": str(kept)}))()

    assert peak < 5_000_000, f"{peak:,} bytes at the peak"
    assert text(output) == "a" * 30_000 + "\n\n[line 1 is longer than 30000 characters and was cut]"
    assert details(output)["total_lines"] == 1


async def test_grep_searches_a_named_file_whatever_its_size_and_collects_at_most_its_match_limit(
    workspace: Workspace
) -> None:
    """Files over 10 MB are skipped in a tree, and were skipped when named too: grep found
    nothing in a large kept output it had been sent to search. A file that matches on every line
    collected every match before the 5,000 limit applied."""
    workspace.output_dir.mkdir(parents=True)
    kept = workspace.output_dir / "call-1.log"
    kept.write_bytes((b"x" * 99 + b"\n") * 110_000 + b"needle\n")  # 11 MB

    needle = await call(workspace, "grep", {"pattern": "needle", "path": str(kept)})
    every, peak = await _peak_of(lambda: call(workspace, "grep", {"pattern": "x", "path": str(kept)}))()

    assert text(needle) == f"{workspace.show(kept)}:110001:needle"
    assert details(every)["matches"] == 5_001  # 5,000 and the note saying it stopped
    assert peak < 5_000_000, f"{peak:,} bytes at the peak"


async def test_truncation_by_characters_cuts_a_single_huge_line(root: Path, tmp_path: Path) -> None:
    workspace = Workspace(root=root, output_dir=tmp_path / "out", max_chars=100)
    (root / "min.js").write_text("x" * 5_000)

    output = await call(workspace, "read", {"path": "min.js"})

    assert len(text(output)) < 300
    assert "longer than 100 characters" in text(output)


# -- confinement -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../secret.txt", "sub/../../secret.txt"])
async def test_paths_escaping_the_working_directory_are_refused(workspace: Workspace, tmp_path: Path,
                                                                path: str) -> None:
    (tmp_path / "secret.txt").write_text("secret")

    output = await call(workspace, "read", {"path": path})

    assert output.is_error
    assert "outside the working directory" in text(output)
    assert details(output)["code"] == "path_outside_workspace"


async def test_absolute_paths_are_allowed_inside_and_refused_outside(workspace: Workspace, root: Path,
                                                                    tmp_path: Path) -> None:
    (root / "in.txt").write_text("in")
    (tmp_path / "out.txt").write_text("out")

    inside = await call(workspace, "read", {"path": str(root / "in.txt")})
    outside = await call(workspace, "write", {"path": str(tmp_path / "out.txt"), "content": "changed"})

    assert text(inside) == "in"
    assert outside.is_error
    assert (tmp_path / "out.txt").read_text() == "out"


async def test_a_symlink_pointing_outside_is_refused(workspace: Workspace, root: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    (root / "link.txt").symlink_to(tmp_path / "secret.txt")

    read = await call(workspace, "read", {"path": "link.txt"})
    edit = await call(workspace, "edit", {"path": "link.txt", "old_text": "secret", "new_text": "x"})

    assert read.is_error
    assert edit.is_error
    assert (tmp_path / "secret.txt").read_text() == "secret"


async def test_grep_does_not_follow_a_symlink_out_of_the_working_directory(
    workspace: Workspace, root: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret.txt").write_text("API_KEY=hunter2\n")
    (root / "innocent.txt").symlink_to(tmp_path / "secret.txt")
    (root / "mine.txt").write_text("API_KEY=placeholder\n")

    found = await call(workspace, "grep", {"pattern": "API_KEY", "path": "."})

    assert "hunter2" not in text(found)
    assert "mine.txt" in text(found)


@pytest.mark.parametrize("command", ["sleep 9 & echo started", "setsid sleep 9 & echo started"])
async def test_a_background_child_neither_delays_nor_fails_the_command(workspace: Workspace, command: str) -> None:
    """The shell exits at once; a child that keeps the output pipe open (in the group, or in a
    session of its own) does not turn that into a timeout."""
    started = time.monotonic()

    output = await call(workspace, "shell", {"command": command, "timeout": 10})

    elapsed = time.monotonic() - started
    assert not output.is_error, text(output)
    assert "started" in text(output)
    assert elapsed < 8


async def test_a_background_child_holding_the_output_is_let_go_once_the_command_is_over(
        workspace: Workspace, root: Path) -> None:
    """Past the drain the call lets go of the output pipe: a child still holding it writes into a
    closed pipe (here it sees the error; by default SIGPIPE ends it) instead of filling a buffer
    nobody reads, and no transport is left open for a closed event loop to trip over."""
    output = await call(workspace, "shell", {
        "command": "(trap '' PIPE; sleep 3; echo late || touch write-failed) & echo $!", "timeout": 10})

    assert not output.is_error, text(output)
    child = int(text(output).split()[0])
    assert await wait_dead(child, timeout_s=10)  # the child wakes after 3 s
    assert (root / "write-failed").exists()


async def test_a_workspace_that_allows_outside_paths_reads_them(root: Path, tmp_path: Path) -> None:
    workspace = Workspace(root=root, output_dir=tmp_path / "out", allow_outside=True)
    (tmp_path / "other.txt").write_text("elsewhere")

    output = await call(workspace, "read", {"path": "../other.txt"})

    assert text(output) == "elsewhere"


# -- shell -----------------------------------------------------------------------------------------


async def test_shell_runs_in_the_working_directory_and_reports_the_exit_code(workspace: Workspace,
                                                                          root: Path) -> None:
    ok = await call(workspace, "shell", {"command": "pwd; echo out; echo err >&2"})
    failed = await call(workspace, "shell", {"command": "echo partial; exit 3"})

    assert not ok.is_error
    assert text(ok) == f"{root}\nout\nerr\n"
    assert details(ok)["exit_code"] == 0
    assert details(ok)["full_output"] is None
    assert failed.is_error
    assert text(failed) == "partial\n\n[exit code 3]"


async def test_a_long_shell_output_keeps_its_tail_and_the_whole_output_on_disk(root: Path, tmp_path: Path) -> None:
    workspace = Workspace(root=root, output_dir=tmp_path / "out", max_lines=5)

    output = await call(workspace, "shell", {"command": "seq 1 1000"})

    shown = text(output)
    full = Path(str(details(output)["full_output"]))
    assert shown.endswith("996\n997\n998\n999\n1000\n")
    assert "showing the last 5 of 1000 lines" in shown
    assert str(full) in shown
    assert content(full) == "".join(f"{i}\n" for i in range(1, 1001))


async def test_a_huge_shell_output_is_kept_on_disk_byte_exact_while_memory_holds_only_its_tail(
    root: Path, tmp_path: Path
) -> None:
    """Issue 11: 50 MB of output cost 477 MB, and 20 MB of short lines peaked at 79 MB of Python
    memory (a 4 MB tail held, then split into a million lines). Only the tail the model is shown
    is held now; the note counts the whole output, and the file holds every byte."""
    workspace = Workspace(root=root, output_dir=tmp_path / "out")  # the default cut: 30,000 characters
    tracemalloc.start()
    try:
        output = await call(workspace, "shell", {"command": "yes abc | head -c 20000000"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert peak < 2_000_000, f"{peak:,} bytes at the peak for 30,000 characters shown"
    shown = text(output)
    assert "showing the last 2000 of 5000000 lines (8000 of 20000000 characters)" in shown
    assert shown.endswith("\n\n" + "abc\n" * 2000)
    full = Path(str(details(output)["full_output"]))
    assert content_bytes(full) == b"abc\n" * 5_000_000
    assert details(output)["bytes"] == 20_000_000


async def test_one_output_keeps_at_most_max_kept_bytes_on_disk_and_says_so(root: Path, tmp_path: Path) -> None:
    workspace = Workspace(root=root, output_dir=tmp_path / "out", max_lines=5, max_kept_bytes=1_000)

    output = await call(workspace, "shell", {"command": "seq 1 2000"})

    full = Path(str(details(output)["full_output"]))
    assert content_bytes(full) == "".join(f"{i}\n" for i in range(1, 2001)).encode()[:1_000]
    assert f"only its first 1,000 bytes are in {full} (1,000 bytes is the most one output keeps)" in text(output)
    assert text(output).endswith("1996\n1997\n1998\n1999\n2000\n")


async def test_a_failing_disk_stops_the_file_not_the_command(root: Path, tmp_path: Path) -> None:
    """Issue 11, failing storage: a write of the full output that fails (here the file-size limit,
    as a full disk would) ends the file, the command runs on, and the model is told what is kept."""
    workspace = Workspace(root=root, output_dir=tmp_path / "out", max_lines=5)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    ignored = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so the write fails instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (5_000, limits[1]))
    try:
        output = await call(workspace, "shell", {"command": "seq 1 2000"})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, ignored)

    full = Path(str(details(output)["full_output"]))
    assert not output.is_error
    assert content_bytes(full) == "".join(f"{i}\n" for i in range(1, 2001)).encode()[:5_000]
    assert f"only its first 5,000 bytes are in {full} (writing more failed: File too large)" in text(output)
    assert text(output).endswith("1999\n2000\n")


def _old_outputs(directory: Path, sizes: list[int]) -> list[Path]:
    """Files in `directory` as earlier calls left them, oldest first (a minute apart)."""
    directory.mkdir(parents=True)
    files = []
    for age, size in enumerate(sizes):
        file = directory / f"old-{age}.log"
        file.write_bytes(b"x" * size)
        os.utime(file, (1_700_000_000 + 60 * age, 1_700_000_000 + 60 * age))
        files.append(file)
    return files


async def test_kept_outputs_do_not_pile_up_beyond_max_kept_files(root: Path, tmp_path: Path) -> None:
    """Nobody asked for these files: a new one deletes the oldest, so there are at most
    `max_kept_files` with it."""
    old = _old_outputs(tmp_path / "out", [10, 10, 10, 10])
    workspace = Workspace(root=root, output_dir=tmp_path / "out", max_lines=5, max_kept_files=3)

    output = await call(workspace, "shell", {"command": "seq 1 100"})

    full = Path(str(details(output)["full_output"]))
    assert sorted((tmp_path / "out").iterdir()) == sorted([old[2], old[3], full])


async def test_kept_outputs_do_not_pile_up_beyond_max_kept_bytes(root: Path, tmp_path: Path) -> None:
    old = _old_outputs(tmp_path / "out", [600, 300, 300, 300])
    workspace = Workspace(root=root, output_dir=tmp_path / "out", max_lines=5, max_kept_bytes=1_000)

    output = await call(workspace, "shell", {"command": "seq 1 100"})

    full = Path(str(details(output)["full_output"]))
    assert sorted((tmp_path / "out").iterdir()) == sorted([old[1], old[2], old[3], full])


async def test_shell_reports_progress_and_persists_a_checkpoint(workspace: Workspace) -> None:
    """Live updates while output arrives; the first is also a checkpoint (persisted), so a crash
    keeps what the command had printed."""
    progress = Progress()

    output = await call(workspace, "shell", {"command": "echo first; sleep 1.2; echo second"}, progress=progress)

    assert text(output) == "first\nsecond\n"
    assert progress.updates, "no progress was reported"
    first, checkpoint = progress.updates[0]
    assert checkpoint is True
    assert isinstance(first, dict)
    assert first["output"] == "first\n"


async def test_a_shell_command_past_its_timeout_is_killed_with_its_children(workspace: Workspace,
                                                                          root: Path) -> None:
    started = time.monotonic()

    output = await call(workspace, "shell", {"command": "sleep 30 & echo $! > child.pid; wait", "timeout": 0.5})

    assert time.monotonic() - started < 5
    assert output.is_error
    assert "timed out after 0.5 s" in text(output)
    assert details(output)["timed_out"] is True
    assert await wait_dead(int((root / "child.pid").read_text()))


async def test_cancelling_the_context_kills_the_shell_process_group(workspace: Workspace) -> None:
    """An abort cancels the call's Context; the command and its children are killed at once."""
    context, progress = Context(), Progress()
    task = asyncio.ensure_future(call(workspace, "shell", {"command": "sleep 30 & echo $!; wait"},
                                      context=context, progress=progress))
    await asyncio.wait_for(progress.reported.wait(), 10)
    started = time.monotonic()

    context.cancel("abort requested")
    output = await asyncio.wait_for(task, 10)

    assert time.monotonic() - started < 5
    assert output.is_error
    assert details(output)["cancelled"] is True
    assert "cancelled" in text(output)
    assert await wait_dead(int(progress.output()))


async def test_cancelling_the_task_kills_the_shell_process_group(workspace: Workspace) -> None:
    """Past the abort grace the runtime cancels the tool's task: nothing may keep running."""
    progress = Progress()
    task = asyncio.ensure_future(call(workspace, "shell", {"command": "sleep 30 & echo $!; wait"},
                                      progress=progress))
    await asyncio.wait_for(progress.reported.wait(), 10)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert await wait_dead(int(progress.output()))


# -- approval --------------------------------------------------------------------------------------


async def test_approval_asks_for_changes_and_not_for_reads(ctx: Context) -> None:
    asker = Asker(ALLOW_ONCE)
    policy = ApprovalPolicy(asker)

    read = await policy(request("read", path="a"), ctx)
    shell = await policy(request("shell", command="make test"), ctx)

    assert read is None
    assert shell is None
    assert [(a.tool_name, a.summary) for a in asker.asked] == [("shell", "shell: make test")]


async def test_allowing_once_asks_again_and_allowing_for_the_session_does_not(ctx: Context) -> None:
    asker = Asker(ALLOW_ONCE, ALLOW_FOR_SESSION)
    policy = ApprovalPolicy(asker)

    for _ in range(4):
        assert await policy(request("write", path="a", content="x"), ctx) is None

    assert len(asker.asked) == 2
    assert policy.allowed_for_session == {"write"}
    assert policy.needs_approval(builtin("shell"))


async def test_a_refusal_blocks_the_call_with_the_reason(ctx: Context) -> None:
    policy = ApprovalPolicy(Asker(DENY, Approval(allow=False, reason="use the test database")))

    plain = await policy(request("edit", path="a"), ctx)
    explained = await policy(request("edit", path="a"), ctx)

    assert plain == Block(reason="the person declined it")
    assert explained == Block(reason="the person declined it: use the test database")


async def test_approval_fails_closed_when_the_callback_raises(ctx: Context) -> None:
    async def broken(asked: ApprovalRequest, context: Context) -> Approval:
        raise RuntimeError("terminal went away")

    blocked = await ApprovalPolicy(broken)(request("shell", command="rm -rf build"), ctx)

    assert isinstance(blocked, Block)
    assert "terminal went away" in blocked.reason


async def test_without_anyone_to_ask_changes_are_blocked(ctx: Context) -> None:
    policy = ApprovalPolicy(None, unavailable_reason="nobody is here")

    blocked = await policy(request("write", path="a", content=""), ctx)

    assert blocked == Block(reason="`write` needs approval and nobody is here")
    assert await ApprovalPolicy.allow_all()(request("shell", command="true"), ctx) is None


async def test_a_declined_call_does_not_run_and_the_model_reads_why(store: Store, ctx: Context, root: Path,
                                                                   tmp_path: Path) -> None:
    """The policy as the harness's `before_tool` hook: the write never happens, its result says why."""
    workspace = Workspace(root=root, output_dir=tmp_path / "out")
    tools: list[AgentTool] = builtin_tools(workspace)
    faux = FauxProvider([reply(tool_call("write", {"path": "x.txt", "content": "x"})), "I could not write it."])
    session = await store.create_session(ctx)
    model = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)
    await session.create_lane("main", LaneConfig(model=model, active_tools=list(BUILTIN_TOOL_NAMES)), ctx)
    asker = Asker(DENY)
    options = AgentHarnessOptions(session=session, models=ModelRegistry([FAUX_MODEL], providers={"faux": faux}),
                                  tools=tools, hooks=RunHooks(before_tool=ApprovalPolicy(asker)))
    harness, _ = await AgentHarness.create(options, ctx)
    try:
        outcome = await harness.lane("main").prompt("write x.txt", None, ctx)
        tip = harness.lane("main").tip_id
    finally:
        await harness.close(ctx)

    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    assert [a.summary for a in asker.asked] == ["write x.txt (1 byte)"]
    assert not (root / "x.txt").exists()
    assert tip is not None
    page = await session.read_branch(tip, ctx)
    results = [e.payload.message for e in page.entries
               if isinstance(e.payload, MessagePayload) and isinstance(e.payload.message, ToolResultMessage)]
    assert len(results) == 1
    assert results[0].is_error
    assert "declined" in "".join(b.text for b in results[0].content if isinstance(b, TextContent))


def _live_members(group_id: int) -> list[int]:
    """The processes of group `group_id` that have not exited (zombies count as exited)."""
    live = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == group_id and fields[0] != "Z":
            live.append(int(stat_file.parent.name))
    return live


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process groups from /proc")
def test_a_command_is_guarded_even_when_its_starter_dies_before_another_step(tmp_path: Path) -> None:
    """The command's own shell tells the guard its group before it runs anything
    (`GroupGuard.command_argv`), so a process SIGKILLed the moment the command is spawned, before
    it could tell the guard itself, leaves nothing of the command running."""
    starter = (
        "import asyncio, os, signal, subprocess\n"
        "from harness.tools.shell import GroupGuard\n"
        "async def main():\n"
        "    guard = await GroupGuard.start()\n"
        "    argv, pipe = guard.command_argv('sleep 300 & wait')\n"
        "    command = subprocess.Popen(argv, stdin=pipe, start_new_session=True)\n"
        "    print(command.pid, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n")
    started = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, timeout=60)
    group_id = int(started.stdout)
    deadline = time.monotonic() + 30
    try:
        while members := _live_members(group_id):
            assert time.monotonic() < deadline, f"the command's processes {members} outlived their starter"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group_id, signal.SIGKILL)
