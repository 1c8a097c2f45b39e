"""What a turn costs the journal: its commits, its branch reads and its frame pages, counted on the
real backends. A turn's cost must not grow with the conversation (issue 12: the loop was quadratic
in history), and every count here is the one bench/README.md lists with the reason for each commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import pytest
from pydantic import JsonValue

from drive_helpers import FakeClock, ProbeTool, Rig, messages, start_rig, text, within
from harness.context import Context
from harness.messages import AssistantMessage, Message, TextContent
from harness.providers import ToolSpec
from harness.providers.faux import reply, tool_call
from harness.runtime import (
    AgentTool,
    DriveSettings,
    HarnessEvent,
    Lane,
    MessageEnd,
    ProgressCallback,
    RunHooks,
    Settled,
    ToolCallRequest,
    ToolOutput,
    ToolStart,
)
from harness.session import DeleteList, DeleteValue, Store, Write, addresses


class Calls:
    """Counts calls of some of a real backend's methods (they still run) and keeps the writes of
    each `commit` counted."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
        self.counts = dict.fromkeys(names, 0)
        self.writes: list[Write] = []
        for name in names:
            monkeypatch.setattr(store.backend, name, self._counting(name, getattr(store.backend, name)))

    def _counting(self, name: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            if name == "commit":
                self.writes += args[1]
            return await method(*args, **kwargs)

        return counted

    def deleted(self) -> list[str]:
        """The namespaces of the values and lists the counted commits deleted, in order."""
        return [write.namespace for write in self.writes if isinstance(write, DeleteList | DeleteValue)]

    def take(self) -> dict[str, int]:
        """The counts since the last take."""
        counts, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        return counts


def two_steps(probe: ProbeTool) -> list[Any]:
    """Replies for turns of two steps each: a tool call, then a text answer."""
    return [item for n in range(3) for item in (reply(tool_call(probe.name, {"key": str(n)})), reply(f"done {n}"))]


async def prompt(rig: Rig, words: str, ctx: Context) -> Settled:
    outcome = await within(rig.lane.prompt(words, None, ctx))
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed", outcome
    return outcome


async def test_a_turn_of_two_steps_and_one_tool_call_commits_five_times_and_reads_no_branch_twice(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    # Accept; step 1's intent; its settlement with the tool's intent; the tool's result with step
    # 2's intent; the last reply's settlement is the terminal commit too. Frames are paced at an
    # hour here, so a reply as quick as these writes none.
    probe = ProbeTool(replay="safe")
    clock = FakeClock(hold_waits=True)
    rig = await start_rig(store, ctx, two_steps(probe), tools=[probe.tool], clock=clock, frame_interval_s=3600)
    calls = Calls(store, monkeypatch, "commit", "walk_branch")

    await prompt(rig, "first", ctx)
    assert calls.take() == {"commit": 5, "walk_branch": 1}  # the branch is read once, on the first step

    for n in (1, 2):
        await prompt(rig, f"turn {n}", ctx)
        assert calls.take() == {"commit": 5, "walk_branch": 0}
    assert 3600 in clock.sleeps  # each reply started its frame pause, and the settlement did not wait it out


async def test_a_before_run_end_hook_runs_between_the_last_reply_and_a_terminal_commit_of_its_own(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    # The hook may append entries after the reply and before the run settles: the reply is
    # committed first, the hook reads it on the branch, then the terminal commit settles the run.
    probe = ProbeTool(replay="safe")
    seen: list[tuple[str | None, str | None]] = []

    async def before_run_end(lane: Lane, context: Context) -> None:
        execution = await lane.inspect_execution(context)
        seen.append((lane.tip_id, execution.current.id if execution.current else None))

    rig = await start_rig(store, ctx, two_steps(probe), tools=[probe.tool], clock=FakeClock(hold_waits=True),
                          frame_interval_s=3600, hooks=RunHooks(before_run_end=before_run_end))
    calls = Calls(store, monkeypatch, "commit")

    outcome = await prompt(rig, "first", ctx)

    assert calls.take() == {"commit": 6}
    assert seen == [(outcome.result.final_assistant_entry_id, outcome.operation_id)]  # the reply, the run still open


async def test_a_call_that_must_never_run_twice_commits_its_own_intent_and_a_close_before_it_leaves_it_to_run(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    # Listeners take the reply's events before a call starts. A call of a never-replay tool
    # commits its intent on its own, right before its effect (six commits), so a harness closed
    # while a listener holds the reply leaves the call planned: the next attachment runs it,
    # rather than answering it "interrupted" as if it might have run.
    probe = ProbeTool()
    rig = await start_rig(store, ctx, two_steps(probe), tools=[probe.tool], clock=FakeClock(hold_waits=True),
                          frame_interval_s=3600)
    calls = Calls(store, monkeypatch, "commit")
    await prompt(rig, "first", ctx)
    assert calls.take() == {"commit": 6}
    await rig.harness.close(ctx)

    holding, release = asyncio.Event(), asyncio.Event()

    async def slow_listener(event: HarnessEvent, context: Context) -> None:
        if isinstance(event, MessageEnd) and isinstance(event.message, AssistantMessage):
            holding.set()
            await release.wait()

    rig = await start_rig(store, ctx, [reply(tool_call(probe.name, {"key": "late"}))], tools=[probe.tool],
                          session=rig.session)
    rig.harness.add_listener(slow_listener)
    prompting = asyncio.get_running_loop().create_task(rig.lane.prompt("second", None, ctx))
    await within(holding.wait())
    closing = asyncio.get_running_loop().create_task(rig.harness.close(ctx))
    await asyncio.sleep(0)
    release.set()
    await within(closing)
    await asyncio.gather(prompting, return_exceptions=True)
    assert probe.runs == [{"key": "0"}]  # the second call never started

    rig = await start_rig(store, ctx, ["done"], tools=[probe.tool], session=rig.session)
    assert isinstance(await within(rig.lane.resume(ctx)), Settled)
    assert probe.runs == [{"key": "0"}, {"key": "late"}]
    assert [text(m) for m in await messages(rig.lane, ctx)][-2:] == ["probe:late", "done"]


async def test_a_before_tool_hook_keeps_the_calls_intent_apart_from_the_reply(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    # The hook may block the call or change its arguments, so the intent commits after it, on its
    # own: six commits where the turn without the hook takes five, and no `tool_start` before it.
    probe = ProbeTool(replay="safe")
    starts_before_the_hook: list[int] = []
    rig: list[Rig] = []

    async def before_tool(request: ToolCallRequest, context: Context) -> dict[str, JsonValue]:
        starts_before_the_hook.append(len(rig[0].events.of(ToolStart)))
        return {"key": "changed"}

    rig.append(await start_rig(store, ctx, two_steps(probe), tools=[probe.tool], clock=FakeClock(hold_waits=True),
                               frame_interval_s=3600, hooks=RunHooks(before_tool=before_tool)))
    calls = Calls(store, monkeypatch, "commit")

    await prompt(rig[0], "first", ctx)

    assert calls.take() == {"commit": 6}
    assert starts_before_the_hook == [0]
    assert [event.args for event in rig[0].events.of(ToolStart)] == [{"key": "changed"}]
    assert probe.runs == [{"key": "changed"}]


async def test_a_call_the_before_tool_hook_does_not_decide_starts_with_the_reply(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    # An approval policy gates only some tools (the terminal's: write, edit, shell): a call of
    # another tool never reaches the hook, so its intent commits with the reply, five commits.
    probe = ProbeTool(replay="safe")
    asked: list[str] = []

    async def before_tool(request: ToolCallRequest, context: Context) -> None:
        asked.append(request.tool_name)

    hooks = RunHooks(before_tool=before_tool, before_tool_applies=lambda tool: tool.name == "write")
    rig = await start_rig(store, ctx, two_steps(probe), tools=[probe.tool], clock=FakeClock(hold_waits=True),
                          frame_interval_s=3600, hooks=hooks)
    calls = Calls(store, monkeypatch, "commit")

    await prompt(rig, "first", ctx)

    assert calls.take() == {"commit": 5}
    assert probe.runs == [{"key": "0"}]
    await rig.harness.close(ctx)

    # In sequential execution the second call starts after the first one's result, on its own
    # intent: the hook is not asked about it either.
    script = [reply(tool_call(probe.name, {"key": "a"}), tool_call(probe.name, {"key": "b"})), reply("done")]
    rig = await start_rig(store, ctx, script, tools=[probe.tool], drive=DriveSettings(tool_execution="sequential"),
                          hooks=hooks)
    await prompt(rig, "second", ctx)

    assert probe.runs[1:] == [{"key": "a"}, {"key": "b"}]
    assert asked == []


async def test_calls_after_one_the_hook_decides_start_only_after_its_answer(store: Store, ctx: Context) -> None:
    # In parallel execution the calls before the first one the hook decides start with the reply;
    # that one waits for its answer, and so do the calls after it: none of them starts earlier.
    probe, gated = ProbeTool(replay="safe"), ProbeTool("write", replay="safe")
    started_when_asked: list[list[JsonValue]] = []
    rig: list[Rig] = []

    async def before_tool(request: ToolCallRequest, context: Context) -> None:
        started_when_asked.append([event.args for event in rig[0].events.of(ToolStart)])

    script = [reply(tool_call(probe.name, {"key": "a"}), tool_call(gated.name, {"key": "b"}),
                    tool_call(probe.name, {"key": "c"})), reply("done")]
    rig.append(await start_rig(store, ctx, script, tools=[probe.tool, gated.tool],
                               hooks=RunHooks(before_tool=before_tool,
                                              before_tool_applies=lambda tool: tool.name == gated.name)))

    await prompt(rig[0], "first", ctx)

    assert started_when_asked == [[{"key": "a"}]]
    assert [event.args for event in rig[0].events.of(ToolStart)] == [{"key": "a"}, {"key": "b"}, {"key": "c"}]
    assert (probe.runs, gated.runs) == ([{"key": "a"}, {"key": "c"}], [{"key": "b"}])


async def test_parallel_calls_start_with_the_reply_and_sequential_ones_one_by_one(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two calls in parallel: both intents commit with the reply; their results commit one by one,
    # the second with the next step's intent. In sequential execution the second call's intent
    # waits for the first call's result, one commit more.
    calls = Calls(store, monkeypatch, "commit")
    runs: list[tuple[Literal["parallel", "sequential"], int]] = [("parallel", 6), ("sequential", 7)]
    for execution, commits in runs:
        probe = ProbeTool(replay="safe")
        script = [reply(tool_call(probe.name, {"key": "a"}), tool_call(probe.name, {"key": "b"})), reply("done")]
        rig = await start_rig(store, ctx, script, tools=[probe.tool], clock=FakeClock(hold_waits=True),
                              frame_interval_s=3600, drive=DriveSettings(tool_execution=execution))
        calls.take()

        await prompt(rig, "first", ctx)

        assert calls.take() == {"commit": commits}, execution
        assert probe.runs == [{"key": "a"}, {"key": "b"}]
        await rig.harness.close(ctx)


async def test_a_turn_deletes_only_frame_pages_and_tool_checkpoints_it_wrote(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    # A reply that ends within one frame interval wrote no page and a call that reported no
    # progress persisted no checkpoint: their settlements delete nothing. A call that did persist
    # progress has its checkpoint deleted with its result (the journal keeps none after a turn).
    calls = Calls(store, monkeypatch, "commit")
    probe = ProbeTool(replay="safe")
    rig = await start_rig(store, ctx, two_steps(probe), tools=[probe.tool], clock=FakeClock(hold_waits=True),
                          frame_interval_s=3600)
    await prompt(rig, "first", ctx)
    assert "harness.pending.assistant_frame" not in calls.deleted()
    assert "harness.pending.tool_output" not in calls.deleted()

    async def reporting(call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                        context: Context) -> ToolOutput:
        await on_update({"done": "half"}, True)
        return ToolOutput(content=[TextContent(text="reported")])

    reporter = AgentTool(spec=ToolSpec(name="reporter", description="reports progress", parameters={}),
                         execute=reporting, replay="safe")
    rig = await start_rig(store, ctx, [reply(tool_call("reporter", {})), reply("done")], tools=[reporter],
                          frame_interval_s=0)
    calls.writes.clear()
    outcome = await prompt(rig, "second", ctx)
    assert calls.deleted().count("harness.pending.tool_output") == 1
    assert calls.deleted().count("harness.pending.assistant_frame") == 2  # both replies wrote pages
    session = rig.harness.session
    assert await session.scan_values(addresses.tool_checkpoint(outcome.operation_id, ""), ctx) == []


async def test_each_request_sends_the_branch_the_journal_holds_after_a_navigation(store: Store, ctx: Context) -> None:
    probe = ProbeTool()
    rig = await start_rig(store, ctx, two_steps(probe), tools=[probe.tool])
    await prompt(rig, "first", ctx)
    end_of_first = rig.lane.tip_id
    await prompt(rig, "second", ctx)
    journal = await messages(rig.lane, ctx)
    assert rig.requests()[2:] == [journal[:5], journal[:7]]

    # Back to the end of the first turn: the cached branch no longer ends at the tip.
    await within(rig.lane.navigate(end_of_first, ctx))
    await prompt(rig, "third", ctx)
    journal = await messages(rig.lane, ctx)
    assert [text(m) for m in journal[:5]] == ["first", "", "probe:0", "done 0", "third"]
    assert rig.requests()[4:] == [journal[:5], journal[:7]]


async def test_a_between_steps_hook_keeps_the_tool_results_commit_apart_from_the_next_intent(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    # The hook runs at the checkpoint between the result and the next step: the result commits
    # on its own, the hook sees it at the tip with the run still open, then the step commits
    # its intent (six commits where the turn without the hook takes five).
    probe = ProbeTool(replay="safe")
    seen: list[list[str]] = []

    async def between(lane: Lane, context: Context) -> list[Message]:
        seen.append([text(m) for m in await messages(lane, context)])
        return []

    rig = await start_rig(store, ctx, two_steps(probe), tools=[probe.tool], clock=FakeClock(hold_waits=True),
                          frame_interval_s=3600, hooks=RunHooks(between_steps=between))
    calls = Calls(store, monkeypatch, "commit")

    await prompt(rig, "first", ctx)

    assert calls.take() == {"commit": 6}
    assert seen == [["first", "", "probe:0"]]  # the result on the branch before the second step
    assert [text(m) for m in rig.requests()[1]] == ["first", "", "probe:0"]
