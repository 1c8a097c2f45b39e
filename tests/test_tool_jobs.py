"""Background shell jobs: the shell tool starts them without waiting (`background`), the jobs tool
lists them, reads their output and stops them, each call of the built-in tools works in the
directory it is given, which jobs hold up a project switch (CE-20), and no job outlives the
process that started it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness.context import Context
from harness.tools import BackgroundJobs, Workspace, builtin_tools
from harness.tools.jobs import JobNotFound
from tool_helpers import Progress, call, details, text, wait_dead

pytest_plugins = ["tool_fixtures"]  # root and workspace

WAIT_FOR_GO = "i=0; while [ ! -f go ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done"
"""Runs until the file `go` appears in its directory (at most about 30 s)."""


@pytest.fixture
async def jobs(root: Path) -> AsyncIterator[BackgroundJobs]:
    registry = BackgroundJobs()
    yield registry
    (root / "go").touch()
    await registry.close()


def content(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def test_a_background_command_answers_at_once_and_the_jobs_tool_reads_and_stops_it(
        workspace: Workspace, jobs: BackgroundJobs, root: Path, tmp_path: Path) -> None:
    """`shell` with `background` returns its job id while the command runs; `jobs output` shows
    what it printed so far, `jobs stop` ends it, and its whole output stays in tool-output."""
    started = await call(workspace, "shell", {"command": f"echo first; {WAIT_FOR_GO}; echo never",
                                              "background": "job"}, jobs=jobs)
    assert not started.is_error, text(started)
    job_id = str(details(started)["job"])
    job = jobs.job("conversation-1", job_id)
    assert job.running
    while job.capture.bytes == 0:  # noqa: ASYNC110 (the capture has no event for "some output came")
        await asyncio.sleep(0.01)

    listed = await call(workspace, "jobs", {"action": "list"}, jobs=jobs)
    output = await call(workspace, "jobs", {"action": "output", "job": job_id}, jobs=jobs)
    stopped = await call(workspace, "jobs", {"action": "stop", "job": job_id}, jobs=jobs)

    assert f"{job_id} (job, running for" in text(listed)
    assert "first" in text(output)
    assert details(stopped)["running"] is False
    assert details(stopped)["stopped"] is True
    assert "stopped" in text(stopped)
    kept = Path(str(details(stopped)["output_file"]))
    assert kept.parent == tmp_path / "home" / "tool-output"
    assert content(kept) == "first\n"


async def test_a_job_that_ends_reports_its_exit_code_and_output(workspace: Workspace, jobs: BackgroundJobs) -> None:
    started = await call(workspace, "shell", {"command": "pwd; exit 4", "background": "job"}, jobs=jobs)
    job = jobs.job("conversation-1", str(details(started)["job"]))
    assert job.follower is not None
    await job.follower

    output = await call(workspace, "jobs", {"action": "output", "job": job.id}, jobs=jobs)

    assert "exited with 4" in text(output)
    assert str(workspace.root) in text(output)
    assert details(output)["exit_code"] == 4


async def test_jobs_belong_to_their_owner(workspace: Workspace, jobs: BackgroundJobs) -> None:
    """Another conversation's jobs are neither listed nor reachable."""
    started = await call(workspace, "shell", {"command": WAIT_FOR_GO, "background": "job"}, jobs=jobs, owner="a")

    listed = await call(workspace, "jobs", {"action": "list"}, jobs=jobs, owner="b")
    stop = await call(workspace, "jobs", {"action": "stop", "job": str(details(started)["job"])}, jobs=jobs,
                      owner="b")

    assert text(listed) == "no background jobs"
    assert stop.is_error
    assert details(stop)["code"] == JobNotFound.code
    assert jobs.job("a", str(details(started)["job"])).running


async def test_jobs_and_modeless_handles_hold_up_a_switch_and_services_do_not(
        workspace: Workspace, jobs: BackgroundJobs) -> None:
    """CE-20: `running` counts the owner's running jobs and handles without a mode, not its services
    nor the jobs that ended."""
    await jobs.start("c", WAIT_FOR_GO, workspace, mode="service")
    assert jobs.running("c") == 0
    job = await jobs.start("c", WAIT_FOR_GO, workspace, mode="job")
    await jobs.start("c", WAIT_FOR_GO, workspace, mode=None)
    assert jobs.running("c") == 2

    await jobs.stop("c", job.id)

    assert jobs.running("c") == 1
    assert jobs.running("someone else") == 0


async def test_each_call_works_in_the_directory_given_when_it_starts(workspace: Workspace, tmp_path: Path) -> None:
    """The tools of a conversation follow its current directory from one call to the next."""
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        (folder / "where.txt").write_text(folder.name)
    current = [first]
    tools = {tool.name: tool for tool in builtin_tools(workspace, directory=lambda: current[0])}

    before = await tools["read"].execute("c1", {"path": "where.txt"}, Progress(), Context())
    current[0] = second
    after = await tools["read"].execute("c2", {"path": "where.txt"}, Progress(), Context())
    shell = await tools["shell"].execute("c3", {"command": "pwd"}, Progress(), Context())

    assert (text(before), text(after)) == ("first", "second")
    assert text(shell) == f"{second}\n"


_CHILD = """
import asyncio, sys
from pathlib import Path
from harness.tools import BackgroundJobs, Workspace

async def main() -> None:
    root = Path(sys.argv[1])
    jobs = BackgroundJobs()
    await jobs.start("c", "sleep 300 & echo $! > sleep.pid; wait", Workspace(root=root, output_dir=root / "out"))
    print("started", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
async def test_a_job_ends_with_the_process_that_started_it(root: Path) -> None:
    """kill -9 of the process that started a job ends the job and its children too."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, str(root), stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert child.stdout is not None
        assert (await asyncio.wait_for(child.stdout.readline(), 10)).strip() == b"started"
        pid_file = root / "sleep.pid"
        deadline = time.monotonic() + 10
        while not content(pid_file).strip():
            assert time.monotonic() < deadline, "the job never started its child"
            await asyncio.sleep(0.02)
        pid = int(content(pid_file))

        child.send_signal(signal.SIGKILL)
        await child.wait()

        assert await wait_dead(pid)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
