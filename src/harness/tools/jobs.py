"""Background shell jobs: commands the shell tool starts without waiting for them, tracked per owner
(a conversation), their output kept in the workspace's output directory, and every one of them
ended with the process that started it, as a foreground command is."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from pydantic import JsonValue

from harness.errors import HarnessError
from harness.runtime import ToolOutput
from harness.tools.files import text_output
from harness.tools.shell import ShellProcess, start_command
from harness.tools.workspace import LimitedOutput, OutputCapture, ToolFailure, Workspace

JobMode: TypeAlias = Literal["job", "service"]
"""`job`: work that ends by itself (a build, a test run); `service`: one meant to keep running (a
development server, a watcher). Only jobs, and handles started without a mode, hold up a project
switch (CE-20)."""

MAX_RUNNING_JOBS = 16
"""How many background commands one owner may have running at once."""


class JobNotFound(HarnessError):
    """No background job of this owner has that id; details `{job}`."""

    code = "job_not_found"


class TooManyJobs(HarnessError):
    """The owner already runs `MAX_RUNNING_JOBS` background commands; details `{running}`."""

    code = "too_many_jobs"


@dataclass(eq=False)
class Job:
    """One background command: `running` until its shell exits (`exit_code`; negative: killed by
    that signal) or it is stopped. All of its output goes to `output_file`."""

    id: str
    owner: str
    command: str
    directory: Path
    mode: JobMode | None
    started_at: float
    """Unix time in seconds."""
    capture: OutputCapture
    process: ShellProcess
    ended_at: float | None = None
    stopped: bool = False
    follower: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.ended_at is None

    @property
    def exit_code(self) -> int | None:
        return None if self.running else self.process.returncode

    @property
    def output_file(self) -> Path:
        return self.capture.path

    def output(self) -> LimitedOutput:
        """What the model reads of the output so far: its tail, cut to the workspace's limits."""
        return self.capture.view(hint="read the file with the read tool (offset/limit) or grep it")


class BackgroundJobs:
    """The background commands of this process, by owner.

    Each runs like the shell tool's foreground command (`SHELL -c`, its own process group, stdin
    closed, stdout and stderr merged, without the variables its workspace denies: see
    `Workspace.environment`), in the directory it was started in, with no time limit. A
    guard process ends its group if this process dies, so none outlives the process that started
    it; `close` stops them all on the way out."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._numbers = 0

    async def start(self, owner: str, command: str, workspace: Workspace, *, mode: JobMode | None = "job") -> Job:
        """Start `command` in `workspace.root` for `owner`; its output streams to a new file in
        `workspace.output_dir`. Raises `TooManyJobs` (nothing started) when the owner already runs
        `MAX_RUNNING_JOBS`, and `OSError` when the shell cannot be started."""
        running = sum(job.running for job in self.jobs(owner))
        if running >= MAX_RUNNING_JOBS:
            raise TooManyJobs(f"{running} background commands are running already; stop one first (jobs stop)",
                              running=running)
        self._numbers += 1
        job_id = f"job-{self._numbers}"
        capture = workspace.capture(job_id, ".log")
        try:
            process = await start_command(command, workspace, capture)
        except BaseException:
            capture.close()
            raise
        job = Job(id=job_id, owner=owner, command=command, directory=workspace.root, mode=mode,
                  started_at=time.time(), capture=capture, process=process)
        self._jobs[job_id] = job
        job.follower = asyncio.create_task(self._follow(job))
        return job

    async def _follow(self, job: Job) -> None:
        try:
            await job.process.exited
            await job.process.drain()
        finally:
            job.capture.close()
            await job.process.close()
            job.ended_at = time.time()

    def jobs(self, owner: str) -> list[Job]:
        """`owner`'s jobs, running or ended, oldest first."""
        return [job for job in self._jobs.values() if job.owner == owner]

    def job(self, owner: str, job_id: str) -> Job:
        """`owner`'s job `job_id`; `JobNotFound` for another owner's or an unknown one."""
        job = self._jobs.get(job_id)
        if job is None or job.owner != owner:
            raise JobNotFound(f"there is no background job {job_id!r} (jobs list shows them)", job=job_id)
        return job

    async def stop(self, owner: str, job_id: str) -> Job:
        """End `owner`'s job `job_id` with its children (SIGTERM, then SIGKILL after the shell
        tool's grace); an ended job is returned as it is. Raises `JobNotFound`."""
        job = self.job(owner, job_id)
        if job.running:
            job.stopped = True
            await job.process.kill()
        if job.follower is not None:
            await job.follower
        return job

    def running(self, owner: str) -> int:
        """How many of `owner`'s jobs still run and hold up a project switch: those of mode `job`
        and those started without a mode; services do not count (CE-20)."""
        return sum(1 for job in self.jobs(owner) if job.running and job.mode != "service")

    async def close(self) -> None:
        """Stop every running job of every owner (the process is leaving)."""
        for job in list(self._jobs.values()):
            await self.stop(job.owner, job.id)  # a group already gone is no error: `ShellProcess.signal`


# -- the tools -------------------------------------------------------------------------------------


async def start_job(jobs: BackgroundJobs, owner: str, workspace: Workspace, args: dict[str, JsonValue]) -> ToolOutput:
    """The shell tool with `background`: start `command` as a job of `owner` and answer at once
    with its id; `timeout` does not apply."""
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolFailure("`command` must be a non-empty string")
    match args.get("background"):
        case "job" | "service" as mode:
            pass
        case _:
            raise ToolFailure("`background` must be job or service")
    job = await jobs.start(owner, command, workspace, mode=mode)
    return text_output(f"started background {mode} {job.id} in {job.directory}; its output goes to "
                       f"{job.output_file}. Use the jobs tool to read its output or stop it.", _summary(job))


async def use_jobs(jobs: BackgroundJobs, owner: str, args: dict[str, JsonValue]) -> ToolOutput:
    """The jobs tool: `list` the owner's background commands, read one's `output` so far, or
    `stop` one."""
    action = args.get("action")
    job_id = args.get("job")
    if action == "list":
        listed = jobs.jobs(owner)
        if not listed:
            return text_output("no background jobs", {"jobs": []})
        return text_output("\n".join(_line(job) for job in listed), {"jobs": [_summary(job) for job in listed]})
    if action not in ("output", "stop"):
        raise ToolFailure("`action` must be list, output or stop")
    if not isinstance(job_id, str):
        raise ToolFailure(f"`job` (the job's id) is needed to {action} a job")
    job = await jobs.stop(owner, job_id) if action == "stop" else jobs.job(owner, job_id)
    shown = job.output()
    output = shown.text if job.capture.bytes else "(no output yet)" if job.running else "(no output)"
    return text_output(f"{_line(job)}\n\n{output}", {**_summary(job), **shown.details()})


def _line(job: Job) -> str:
    kind = job.mode or "job"
    if job.running:
        state = f"running for {time.time() - job.started_at:.0f} s"
    elif job.stopped:
        state = "stopped"
    else:
        code = job.exit_code
        state = f"exited with {code}" if code is None or code >= 0 else f"killed by signal {-code}"
    return f"{job.id} ({kind}, {state}) in {job.directory}: {job.command}"


def _summary(job: Job) -> dict[str, JsonValue]:
    return {"job": job.id, "mode": job.mode, "command": job.command, "directory": str(job.directory),
            "running": job.running, "exit_code": job.exit_code, "stopped": job.stopped,
            "output_file": str(job.output_file)}
