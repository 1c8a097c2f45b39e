"""The intents a reply's commit carries for the tool calls that start at once, decided on the
session line: an abort committed while that commit waited for the line leaves the calls planned
and announces no `tool_start` after the abort (issue 12). White-box: it holds the abort's commit
on the SQLite database thread (`_commit_barrier`) until the drive reaches the line with the reply
(`DrivenOperation.commit`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from drive_helpers import FakeClock, ProbeTool, messages, results, start_rig, text, within
from harness.context import Context
from harness.providers import DoneEvent, StreamEvent
from harness.providers.faux import FauxReply, reply, tool_call
from harness.runtime import Settled
from harness.runtime.commit import Transition
from harness.runtime.drive.operation import DrivenOperation
from harness.session import connect
from harness.session.sqlite import SqliteBackend


async def test_an_abort_committed_while_the_reply_waits_for_the_line_leaves_its_calls_planned(
        tmp_path: Path, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await connect(f"sqlite:///{tmp_path / 'journal.db'}", ctx)
    try:
        backend = store.backend
        assert isinstance(backend, SqliteBackend)
        backend.inline_commit_limit_s = 0  # commits off the loop, as on PostgreSQL or a slow disk
        probe = ProbeTool(replay="safe")
        calls = [tool_call(probe.name, {"key": "a"}), tool_call(probe.name, {"key": "b"})]
        script: list[FauxReply | str] = [reply(*calls), "never asked"]
        rig = await start_rig(store, ctx, script, tools=[probe.tool], clock=FakeClock(hold_waits=True),
                              frame_interval_s=3600)

        holding, reached_line = threading.Event(), threading.Event()
        armed: list[bool] = []

        def hold_the_abort() -> None:  # inside the abort's commit, on the database thread
            if armed and armed.pop():
                holding.set()
                reached_line.wait(10)

        backend._commit_barrier = hold_the_abort
        commit = DrivenOperation.commit

        async def reaching_the_line(op: DrivenOperation, transition: Transition) -> bool:
            reached_line.set()
            return await commit(op, transition)

        monkeypatch.setattr(DrivenOperation, "commit", reaching_the_line)
        aborts: list[asyncio.Task[Any]] = []
        stream = rig.faux.stream

        async def abort_before_the_reply_ends(*args: Any) -> AsyncIterator[StreamEvent]:
            async for event in stream(*args):
                if isinstance(event, DoneEvent) and not aborts:
                    armed.append(True)
                    aborts.append(asyncio.get_running_loop().create_task(rig.lane.request_abort("user", ctx)))
                    assert await asyncio.to_thread(holding.wait, 10)  # the abort holds the line
                yield event

        monkeypatch.setattr(rig.faux, "stream", abort_before_the_reply_ends)
        outcome = await within(rig.lane.prompt("go", None, ctx))
        await within(aborts[0])
        assert isinstance(outcome, Settled)

        assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
        assert probe.runs == []
        types = rig.events.types
        assert "tool_start" not in types, types
        not_run = "The run was aborted before this tool call started; it was not run."
        assert [text(r) for r in results(await messages(rig.lane, ctx))] == [not_run, not_run]
        await rig.harness.close(ctx)
    finally:
        await store.close()
