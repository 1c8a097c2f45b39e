"""The shell tool: one command in its own process group, with a time limit, progress reports and
cancellation that kills the whole group, also when the process that started it is killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from harness.context import Context
from harness.runtime import ProgressCallback, ToolOutput
from harness.tools.files import text_output
from harness.tools.workspace import OutputCapture, ToolFailure, Workspace

SHELL = "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"
PROGRESS_INTERVAL_S = 0.5
"""How often a running command reports new output (`on_update`, live only)."""
CHECKPOINT_INTERVAL_S = 5.0
"""How often that report is also persisted as the call's checkpoint, so a crash keeps it."""
KILL_GRACE_S = 2.0
"""How long a process group gets between SIGTERM and SIGKILL."""
_DRAIN_S = 1.0  # after the shell exits, how long a background child may keep the pipe before we stop reading
_PROGRESS_TAIL_CHARS = 2_000


async def run_shell(workspace: Workspace, tool_call_id: str, args: dict[str, JsonValue],
                    on_update: ProgressCallback, context: Context) -> ToolOutput:
    """Run `command` with `SHELL -c` in `workspace.root`, stdin closed, stdout and stderr merged,
    in this process's environment less the variables the workspace denies (`Workspace.environment`:
    by default `DEFAULT_ENV_DENY`, provider keys, tokens, secrets and passwords).

    The output streams to a file in `workspace.output_dir` as it arrives, and only its tail is
    held in memory (see `OutputCapture`); the model gets that tail (cut to the workspace's limits,
    with a note naming the file and how much was cut) and the file is removed when nothing was
    cut. Progress (`{output, bytes, elapsed_s}`) goes to `on_update` every `PROGRESS_INTERVAL_S`
    while there is new output, persisted every `CHECKPOINT_INTERVAL_S`.
    On timeout or cancellation of `context` the process group gets SIGTERM, then SIGKILL after
    `KILL_GRACE_S`; the result is an error either way, as is a non-zero exit status."""
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolFailure("`command` must be a non-empty string")
    timeout = args.get("timeout", workspace.shell_timeout_s)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise ToolFailure("`timeout` must be a positive number of seconds")
    timeout = min(float(timeout), workspace.max_shell_timeout_s)
    context.raise_if_cancelled()

    capture = workspace.capture(tool_call_id, ".log")
    started = time.monotonic()
    try:
        process = await start_command(command, workspace, capture)
    except BaseException:
        capture.close()
        raise
    exited = process.exited
    cancelled = context.cancellation()
    ends: set[asyncio.Future[Any]] = {exited, cancelled}
    ended_by: str | None = None
    try:
        # The first report is persisted at once, later ones every CHECKPOINT_INTERVAL_S.
        reported, checkpointed = 0, started - CHECKPOINT_INTERVAL_S
        while not exited.done():
            remaining = started + timeout - time.monotonic()
            if remaining <= 0:
                ended_by = "timeout"
                break
            await asyncio.wait(ends, timeout=min(PROGRESS_INTERVAL_S, remaining),
                               return_when=asyncio.FIRST_COMPLETED)
            if cancelled.done() and not exited.done():
                ended_by = "cancelled"
                break
            if capture.bytes > reported and not exited.done():
                reported = capture.bytes
                persist = time.monotonic() - checkpointed >= CHECKPOINT_INTERVAL_S
                if persist:
                    checkpointed = time.monotonic()
                await on_update(_progress(capture, time.monotonic() - started), persist)
        if ended_by is not None:
            await process.kill()
        await process.drain()
    except BaseException:
        # The task itself was cancelled (an abort past its grace) or something broke: leave nothing running.
        process.signal(signal.SIGKILL)
        capture.close()
        raise
    finally:
        cancelled.cancel()
        await process.close()

    elapsed = time.monotonic() - started
    exit_code = process.returncode
    limited = capture.finish(hint="read it with the read tool (offset/limit) or grep it")
    footer = _footer(ended_by, exit_code, timeout)
    text = limited.text if capture.bytes else "(no output)"
    if footer:
        text = f"{text.rstrip(chr(10))}\n\n[{footer}]"
    details: dict[str, JsonValue] = {
        "command": command, "exit_code": exit_code, "timed_out": ended_by == "timeout",
        "cancelled": ended_by == "cancelled", "duration_ms": round(elapsed * 1000), "bytes": capture.bytes,
        **limited.details(),
    }
    return text_output(text, details, is_error=ended_by is not None or exit_code != 0)


def _footer(ended_by: str | None, exit_code: int | None, timeout: float) -> str:
    if ended_by == "timeout":
        return f"timed out after {timeout:g} s; the command and its children were killed"
    if ended_by == "cancelled":
        return "cancelled: the run was aborted; the command and its children were killed"
    if exit_code:
        return f"exit code {exit_code}" if exit_code > 0 else f"killed by signal {-exit_code}"
    return ""


def _progress(capture: OutputCapture, elapsed_s: float) -> JsonValue:
    return {"output": capture.last(_PROGRESS_TAIL_CHARS), "bytes": capture.bytes, "elapsed_s": round(elapsed_s, 1)}


class _CommandOutput(asyncio.SubprocessProtocol):
    """A command's merged output, written to its capture as it arrives; the shell's exit and the
    end of its output as futures. (`Process.wait()` on Python 3.11 also waits for the pipes to
    close, which a background child can hold open forever: the exit is told apart here.)"""

    def __init__(self, capture: OutputCapture) -> None:
        loop = asyncio.get_running_loop()
        self.capture = capture
        self.exited: asyncio.Future[int] = loop.create_future()
        self.output_ended: asyncio.Future[None] = loop.create_future()
        self.error: OSError | None = None
        self._transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if self.error is None:
            try:
                self.capture.write(data)
            except OSError as error:  # the output folder failed: told by `drain`, once the command is over
                self.error = error

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if not self.output_ended.done():
            self.output_ended.set_result(None)

    def process_exited(self) -> None:
        assert self._transport is not None
        code = self._transport.get_returncode()
        if not self.exited.done() and code is not None:
            self.exited.set_result(code)


class ShellProcess:
    """A command started by `start_command`: `SHELL -c command` in a process group of its own (so a
    kill reaches every child), stdin closed, stdout and stderr merged into its capture, guarded by
    a `GroupGuard`. `exited` resolves to the shell's exit status (negative: killed by that signal)
    as soon as the shell exits; `close` releases the pipe and the guard once it is over."""

    def __init__(self, transport: asyncio.SubprocessTransport, output: _CommandOutput, guard: GroupGuard) -> None:
        self._transport, self._output, self._guard = transport, output, guard
        self.exited = output.exited
        self.pid = transport.get_pid()
        self._closed = False

    @property
    def returncode(self) -> int | None:
        return self._transport.get_returncode()

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the command's whole process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def kill(self) -> None:
        """SIGTERM the group, SIGKILL it if the shell has not gone after `KILL_GRACE_S`."""
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self.exited), KILL_GRACE_S)
        except TimeoutError:
            self.signal(signal.SIGKILL)
            await self.exited
        # Children that ignored SIGTERM may outlive the shell; the group is ours to end.
        self.signal(signal.SIGKILL)

    async def drain(self) -> None:
        """Wait for the end of the output, once the shell has exited; a background child that keeps
        the pipe open past `_DRAIN_S` is left running, its later output not captured. Raises the
        `OSError` that writing the capture met, if any."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._output.output_ended), _DRAIN_S)
        if self._output.error is not None:
            raise self._output.error

    async def close(self) -> None:
        """Let go of the pipe (a child still holding it no longer writes to us) and release the
        guard; idempotent. A shell still running is killed first."""
        if self._closed:
            return
        self._closed = True
        self._transport.close()
        await self._guard.release()


async def start_command(command: str, workspace: Workspace, capture: OutputCapture) -> ShellProcess:
    """Start `command` in `workspace.root` with `workspace.environment()` (no provider keys, tokens
    or secrets unless allowed), its output streaming into `capture`; close the returned
    `ShellProcess` once the command is over."""
    guard = await GroupGuard.start()
    argv, guard_pipe = guard.command_argv(command)
    try:
        transport, output = await asyncio.get_running_loop().subprocess_exec(
            lambda: _CommandOutput(capture), *argv, cwd=workspace.root,
            stdin=guard_pipe, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=workspace.environment(),
            start_new_session=True)
    except BaseException:
        await guard.release()
        raise
    return ShellProcess(transport, output, guard)


_GUARD_SCRIPT = f"""trap '' HUP INT TERM
read -r group || exit 0
if read -r _; then exit 0; fi
kill -s TERM -- "-$group" 2>/dev/null && sleep {KILL_GRACE_S:g} && kill -s KILL -- "-$group" 2>/dev/null
exit 0"""
"""The guard's script: read the group id, then exit on a second line, or end the group on EOF."""


class GroupGuard:
    """A small watcher process that ends a command's process group if this process dies before
    the command ends (a chat killed with SIGKILL, say), so no command outlives the harness
    unseen. It waits on a pipe whose write end only this process holds: the kernel closes it on
    any death, and the watcher, in its own session, then sends the group SIGTERM and SIGKILL.
    It is started before the command, and the command's shell tells it the group itself
    (`command_argv`) before it runs anything, so no death of this process leaves it unguarded."""

    def __init__(self, watcher: asyncio.subprocess.Process, write_end: int) -> None:
        self._watcher, self._write_end = watcher, write_end

    @classmethod
    async def start(cls) -> GroupGuard:
        read_end, write_end = os.pipe()
        try:
            watcher = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", _GUARD_SCRIPT, stdin=read_end, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return cls(watcher, write_end)

    def command_argv(self, command: str) -> tuple[list[str], int]:
        """The argv that runs `command` in `SHELL` under this guard, and the descriptor to give it
        as stdin: its shell first writes its own pid (its group's id, in a new session) down the
        guard's pipe, then swaps stdin for /dev/null and runs `command` in its place, before
        anything of `command` runs and whatever this process does meanwhile."""
        announce = 'printf "%s\\n" "$$" >&0; exec 0</dev/null; exec "$0" -c "$1"'
        return [SHELL, "-c", announce, SHELL, command], self._write_end

    async def release(self) -> None:
        """The command is over (or was killed here): the watcher leaves without touching the group."""
        with contextlib.suppress(OSError):
            os.write(self._write_end, b"done\n")
        os.close(self._write_end)
        await self._watcher.wait()
