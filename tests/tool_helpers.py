"""What the built-in tools' tests share (test_builtin_tools, test_tool_jobs, test_tool_safety,
test_permission_rules): one call of one tool, a built-in tool as it declares itself, what its
output says, a progress recorder, a wait for a process that is not ours to end, and an approval
callback answering from a list. Their
shared fixtures are in `tool_fixtures`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import JsonValue

from harness.context import Context
from harness.messages import TextContent
from harness.runtime import AgentTool, ToolCallRequest, ToolOutput
from harness.tools import Approval, ApprovalRequest, BackgroundJobs, Workspace, builtin_tools
from harness.tools.builtin import ASKS_FIRST


class Progress:
    """An `on_update` that records `(partial, checkpoint)` pairs; `reported` is set at the first."""

    def __init__(self) -> None:
        self.updates: list[tuple[JsonValue, bool]] = []
        self.reported = asyncio.Event()

    async def __call__(self, partial: JsonValue, checkpoint: bool) -> None:
        self.updates.append((partial, checkpoint))
        self.reported.set()

    def output(self) -> str:
        partial = self.updates[0][0]
        assert isinstance(partial, dict)
        return str(partial["output"])


async def call(workspace: Workspace, name: str, args: dict[str, JsonValue], *, jobs: BackgroundJobs | None = None,
               owner: str = "conversation-1", context: Context | None = None,
               progress: Progress | None = None) -> ToolOutput:
    """One call of the built-in tool `name` in `workspace`, its background jobs those of `owner`
    in `jobs` (a registry of its own when None)."""
    tool = {tool.name: tool for tool in builtin_tools(workspace, jobs=jobs, owner=owner)}[name]
    return await tool.execute("call-1", args, progress or Progress(), context or Context())


def builtin(name: str) -> AgentTool:
    """The built-in tool `name`, for what it declares (`replay`, `asks_first`), not to run."""
    return {tool.name: tool for tool in builtin_tools(Workspace(root=Path.cwd(), output_dir=Path.cwd()))}[name]


def text(output: ToolOutput) -> str:
    return "".join(block.text for block in output.content if isinstance(block, TextContent))


def details(output: ToolOutput) -> dict[str, JsonValue]:
    assert isinstance(output.details, dict)
    return output.details


async def wait_dead(pid: int, timeout_s: float = 5.0) -> bool:
    """Whether process `pid` (not our child, so not ours to reap) ends within `timeout_s`: waits on
    a pidfd, which becomes readable once the process has exited, zombie or reaped."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await asyncio.wait_for(exited, timeout_s)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def request(tool: str, **args: JsonValue) -> ToolCallRequest:
    """A call of the built-in `tool` with `args`, as the approval policy is asked about it."""
    return ToolCallRequest(operation_id="op-1", tool_call_id=f"call-{tool}", tool_name=tool, args=dict(args),
                           asks_first=tool in ASKS_FIRST)


class Asker:
    """An approval callback answering from a list and recording what it was asked."""

    def __init__(self, *answers: Approval) -> None:
        self.answers = list(answers)
        self.asked: list[ApprovalRequest] = []

    async def __call__(self, asked: ApprovalRequest, context: Context) -> Approval:
        self.asked.append(asked)
        return self.answers.pop(0)
