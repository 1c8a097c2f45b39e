"""Adversarial tests of the rebuilt run loop: a cached branch, fewer commits, paced frames.
Each test names the promise it checks; each failed on main before its fix (or is marked xfail)."""

from __future__ import annotations

import asyncio

import pytest

from drive_helpers import ProbeTool, messages, shape, start_rig, within
from harness.context import Context
from harness.messages import CustomMessage, Message, UserMessage
from harness.providers import FAUX_MODEL
from harness.providers.faux import delay, reply, tool_call
from harness.runtime import CompactionSettings, CompactionStart, DriveSettings, HarnessClosed, Lane, RunHooks, Settled
from harness.session import Store


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled), outcome
    return outcome


async def test_follow_up_placed_before_a_close_is_answered_on_resume(store: Store, ctx: Context) -> None:
    """A follow-up placed when the run would finish makes the run go on (DESIGN: queues). The
    harness closing (as a crash) after that placement but before the next step's intent must not
    turn the resume into a completion that leaves the placed follow-up unanswered."""
    reached_second = asyncio.Event()
    never = asyncio.Event()
    calls = 0
    lane_box: list[Lane] = []

    async def transform(items: list[Message], context: Context) -> list[Message]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await lane_box[0].follow_up(UserMessage(content="and then?"), context)
        elif calls == 2:
            reached_second.set()
            await never.wait()
        return items

    rig = await start_rig(store, ctx, ["first answer"], hooks=RunHooks(transform_context=transform))
    lane_box.append(rig.lane)
    prompt = asyncio.ensure_future(rig.lane.prompt("hi", None, ctx))
    await within(reached_second.wait())
    await rig.harness.close(ctx)
    with pytest.raises(HarnessClosed):
        await prompt

    again = await start_rig(store, ctx, ["second answer"], session=rig.session)
    assert [op.lane for op in again.open] == ["main"]
    outcome = settled(await within(again.lane.resume(ctx)))
    assert outcome.result.outcome == "completed"
    assert shape(await messages(again.lane, ctx)) == [
        "user:hi", "assistant:first answer", "user:and then?", "assistant:second answer"]
    await again.harness.close(ctx)


KEEP_LITTLE = DriveSettings(compaction=CompactionSettings(keep_recent_tokens=40))
LONG = "word " * 60  # about 75 tokens: more than KEEP_LITTLE keeps


async def test_write_appended_during_a_manual_compaction_stays_on_the_branch(store: Store, ctx: Context) -> None:
    """A message appended while a compaction runs is a pending write that its settlement places
    after the compaction entry (CE-11); the lane's tip is then that write, and the next request
    and the journal both hold it."""
    hold = asyncio.Event()
    pause = delay(hold)
    rig = await start_rig(store, ctx, [reply(LONG), reply(LONG), reply(pause, "SUMMARY"), "after"],
                          drive=KEEP_LITTLE)
    await rig.lane.prompt("first", None, ctx)
    await rig.lane.prompt("second", None, ctx)
    compaction = asyncio.ensure_future(rig.lane.compact(ctx))
    await within(pause.reached.wait())
    written = await rig.lane.append_message(UserMessage(content="noted meanwhile"), ctx)
    hold.set()
    assert settled(await within(compaction)).result.outcome == "completed"
    assert rig.lane.tip_id == written
    await rig.lane.prompt("third", None, ctx)

    assert shape(rig.requests()[3])[-2:] == ["user:noted meanwhile", "user:third"]
    journal = shape(await messages(rig.lane, ctx))
    assert journal[-3:] == ["user:noted meanwhile", "user:third", "assistant:after"]
    await rig.harness.close(ctx)


async def test_between_steps_messages_placed_before_a_close_are_not_placed_twice(store: Store, ctx: Context) -> None:
    """The between-step hook's messages are placed once, at the boundary after the tool batch. A
    close (as a crash) after that placement and before the next step's intent must not place them
    a second time when the run resumes: the journal and the request hold one copy."""
    probe = ProbeTool()
    blocked = asyncio.Event()
    never = asyncio.Event()
    requests = 0

    async def between(lane: Lane, context: Context) -> list[Message]:
        return [CustomMessage(custom_type="note", content="the build is green", display=False)]

    async def transform(items: list[Message], context: Context) -> list[Message]:
        nonlocal requests
        requests += 1
        if requests == 2:
            blocked.set()
            await never.wait()
        return items

    rig = await start_rig(store, ctx, [reply(tool_call("probe", {"key": "a"}, id="call-a"))], tools=[probe.tool],
                          hooks=RunHooks(between_steps=between, transform_context=transform))
    prompt = asyncio.ensure_future(rig.lane.prompt("go", None, ctx))
    await within(blocked.wait())
    await rig.harness.close(ctx)
    with pytest.raises(HarnessClosed):
        await prompt

    again = await start_rig(store, ctx, ["Noted."], session=rig.session, tools=[probe.tool],
                            hooks=RunHooks(between_steps=between))
    settled(await within(again.lane.resume(ctx)))
    expected = ["user:go", "assistant:+probe", "result:call-a", "custom:the build is green"]
    assert shape(again.requests()[0]) == expected
    assert shape(await messages(again.lane, ctx)) == [*expected, "assistant:Noted."]
    await again.harness.close(ctx)


async def test_between_steps_messages_are_placed_once_across_a_threshold_compaction(
        store: Store, ctx: Context) -> None:
    """The between-step hook runs once per boundary: when the boundary's placement pushes the
    context over the threshold and the run compacts, the checkpoint it resumes to must not call
    the hook again and place its messages a second time. (On main each compaction's resume placed
    another copy, which defeated the "nothing new since the last compaction" guard: the run
    compacted again and again, here until the script ran out.)"""
    probe = ProbeTool()
    hook_calls = 0

    async def between(lane: Lane, context: Context) -> list[Message]:
        nonlocal hook_calls
        hook_calls += 1
        return [CustomMessage(custom_type="note", content="the build is green", display=False)]

    settings = DriveSettings(compaction=CompactionSettings(reserve_tokens=10, keep_recent_tokens=40))
    rig = await start_rig(store, ctx, ["hi", reply("word " * 300, tool_call("probe", {"key": "a"}, id="call-a")),
                                       "SUMMARY", "done"],
                          drive=settings, tools=[probe.tool], hooks=RunHooks(between_steps=between))
    registry = rig.harness.options.models
    assert registry is not None
    registry.register_model(FAUX_MODEL.model_copy(update={"context_window": 400}))
    await rig.lane.prompt("hello", None, ctx)
    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "completed"
    assert [s.reason for s in rig.events.of(CompactionStart)] == ["threshold"]
    assert hook_calls == 1
    assert shape(rig.requests()[-1]).count("custom:the build is green") == 1
    await rig.harness.close(ctx)
