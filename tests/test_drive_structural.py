"""Compaction and navigation as operations: manual, at a token threshold, on overflow, the circuit
breaker, and moving the tip with and without a branch summary (issue 5, item 6).
White-box: a summary is recognised by the runtime's `branch_context.SUMMARY_PREFIX`."""

from __future__ import annotations

import asyncio

import pytest

from drive_helpers import ProbeTool, Rig, branch, messages, shape, start_rig, text, within
from harness.context import Context
from harness.providers import FAUX_MODEL
from harness.providers.faux import FauxReply, delay, failure, reply, tool_call
from harness.runtime import (
    CompactionEnd,
    CompactionSettings,
    CompactionStart,
    DriveSettings,
    HarnessClosed,
    LaneBusy,
    NavigationEnd,
    NotARun,
    NothingToCompact,
    PromptRequest,
    Settled,
)
from harness.runtime.branch_context import SUMMARY_PREFIX
from harness.session import BranchSummaryPayload, CompactionPayload, Store, UnknownEntry, addresses
from harness_helpers import said

KEEP_LITTLE = DriveSettings(compaction=CompactionSettings(keep_recent_tokens=40))
LONG = "word " * 60  # about 75 tokens: more than KEEP_LITTLE keeps


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled), outcome
    return outcome


CUT_SUMMARY = reply("the summary was cut", stop_reason="length")
"""A summary that stops early: its compaction fails with `the summary stopped early (length)`."""


async def small_window_rig(store: Store, ctx: Context, script: list[FauxReply | str], probe: ProbeTool) -> Rig:
    """A rig whose model's window (120 tokens, threshold at 110) a LONG reply and one more message
    pass, with the probe tool active."""
    settings = DriveSettings(compaction=CompactionSettings(reserve_tokens=10, keep_recent_tokens=40))
    rig = await start_rig(store, ctx, script, drive=settings, tools=[probe.tool])
    registry = rig.harness.options.models
    assert registry is not None
    registry.register_model(FAUX_MODEL.model_copy(update={"context_window": 120}))
    return rig


async def test_manual_compaction_writes_one_entry_with_summary_and_kept_tail(store: Store, ctx: Context) -> None:
    """The older part of the branch becomes the summary; the newest messages, from a user message
    on, are kept verbatim in the compaction entry, and the next request starts from them."""
    rig = await start_rig(store, ctx, [reply(LONG), reply(LONG), "SUMMARY", "after"], drive=KEEP_LITTLE)
    await rig.lane.prompt("first", None, ctx)
    await rig.lane.prompt("second", None, ctx)

    outcome = settled(await within(rig.lane.compact(ctx, custom_instructions="keep names")))
    await rig.lane.prompt("third", None, ctx)

    assert outcome.result.kind == "compaction"
    assert outcome.result.outcome == "completed"
    entries = await branch(rig.lane, ctx)
    compaction = entries[0].payload
    assert isinstance(compaction, CompactionPayload)
    assert compaction.summary == "SUMMARY"
    assert shape(compaction.retained_tail) == ["user:second", f"assistant:{LONG}"]
    summary_request = rig.faux.requests[2].request
    assert shape(summary_request.messages)[:2] == ["user:first", f"assistant:{LONG}"]
    assert "keep names" in text(summary_request.messages[-1])
    next_request = rig.requests()[3]
    assert text(next_request[0]).startswith(SUMMARY_PREFIX)
    assert shape(next_request[1:]) == ["user:second", f"assistant:{LONG}", "user:third"]
    assert [type(e).__name__ for e in rig.events.events if isinstance(e, CompactionStart | CompactionEnd)] == [
        "CompactionStart", "CompactionEnd"]


async def test_compaction_with_nothing_old_enough_is_refused_and_writes_nothing(store: Store, ctx: Context) -> None:
    rig = await start_rig(store, ctx, ["short"])
    await rig.lane.prompt("hi", None, ctx)

    with pytest.raises(NothingToCompact):
        await rig.lane.compact(ctx)

    assert (await rig.lane.inspect_execution(ctx)).current is None
    assert len(rig.faux.requests) == 1


async def test_compaction_is_refused_while_a_run_is_open(store: Store, ctx: Context) -> None:
    rig = await start_rig(store, ctx, [reply(LONG)], drive=KEEP_LITTLE)
    await rig.lane.accept(PromptRequest(text="open"), ctx)

    with pytest.raises(LaneBusy):
        await rig.lane.compact(ctx)


async def test_threshold_compaction_runs_inside_the_run_before_the_next_request(store: Store, ctx: Context) -> None:
    """When the estimated context passes the window minus the reserve, the run compacts first,
    then asks the model with the summary (automatic compaction)."""
    small_window = FAUX_MODEL.model_copy(update={"context_window": 120})
    settings = DriveSettings(compaction=CompactionSettings(reserve_tokens=10, keep_recent_tokens=40))
    rig = await start_rig(store, ctx, [reply(LONG), "SUMMARY", "answer"], drive=settings)
    registry = rig.harness.options.models
    assert registry is not None
    registry.register_model(small_window)
    await rig.lane.prompt("first", None, ctx)

    outcome = settled(await within(rig.lane.prompt(LONG, None, ctx)))

    assert outcome.result.outcome == "completed"
    starts = rig.events.of(CompactionStart)
    assert [s.reason for s in starts] == ["threshold"]
    assert text(rig.requests()[2][0]).startswith(SUMMARY_PREFIX)
    assert isinstance((await branch(rig.lane, ctx))[0].payload, CompactionPayload)


async def test_a_context_overflow_is_compacted_once_and_the_step_retried(store: Store, ctx: Context) -> None:
    """Overflow: compact, then retry the same step; the failed attempt stays out of the branch."""
    rig = await start_rig(store, ctx, [
        reply(LONG), reply(LONG),
        failure("context_overflow", "prompt is too long"), "SUMMARY", "fits now",
    ], drive=KEEP_LITTLE)
    await rig.lane.prompt("first", None, ctx)
    await rig.lane.prompt("second", None, ctx)

    outcome = settled(await within(rig.lane.prompt("third", None, ctx)))

    assert outcome.result.outcome == "completed"
    assert [s.reason for s in rig.events.of(CompactionStart)] == ["overflow"]
    entries = await branch(rig.lane, ctx)
    compaction = entries[0].payload
    assert isinstance(compaction, CompactionPayload)
    assert shape(compaction.retained_tail) == ["user:third"]  # the turn being answered is kept
    assert shape([e.payload.message for e in entries[1:]]) == ["assistant:fits now"]  # type: ignore[union-attr]
    assert shape(rig.requests()[-1])[1:] == ["user:third"]


async def test_a_second_overflow_in_the_same_step_fails_the_run(store: Store, ctx: Context) -> None:
    rig = await start_rig(store, ctx, [
        reply(LONG), reply(LONG),
        failure("context_overflow", "prompt is too long"), "SUMMARY",
        failure("context_overflow", "still too long"),
    ], drive=KEEP_LITTLE)
    await rig.lane.prompt("first", None, ctx)
    await rig.lane.prompt("second", None, ctx)

    outcome = settled(await within(rig.lane.prompt("third", None, ctx)))

    assert outcome.result.outcome == "failed"
    assert outcome.result.error is not None
    assert outcome.result.error.code == "context_overflow"


async def test_three_failed_threshold_compactions_stop_the_trying_and_say_why(store: Store, ctx: Context) -> None:
    """The circuit breaker: after three failed compactions in a row the run stops compacting and
    the last `compaction_end` carries the typed reason; the run itself goes on."""
    small_window = FAUX_MODEL.model_copy(update={"context_window": 100})
    settings = DriveSettings(compaction=CompactionSettings(reserve_tokens=10, keep_recent_tokens=30))
    broken = failure("invalid_request", "summaries are refused")
    rig = await start_rig(store, ctx, [reply(LONG), broken, broken, broken, "done"], drive=settings)
    registry = rig.harness.options.models
    assert registry is not None
    registry.register_model(small_window)
    await rig.lane.prompt("first", None, ctx)

    outcome = settled(await within(rig.lane.prompt(LONG, None, ctx)))

    ends = rig.events.of(CompactionEnd)
    assert outcome.result.outcome == "completed"
    assert [e.status for e in ends] == ["failed", "failed", "failed"]
    assert [e.error.code for e in ends if e.error] == ["compaction_failed", "compaction_failed", "compaction_stopped"]
    assert text(rig.requests()[-1][-1]) == LONG  # the step went ahead without a compaction


async def test_navigation_moves_the_tip_and_labels_the_target(store: Store, ctx: Context) -> None:
    rig = await start_rig(store, ctx, ["one", "two"])
    await rig.lane.prompt("first", None, ctx)
    target = rig.lane.tip_id
    assert target is not None
    await rig.lane.prompt("second", None, ctx)

    outcome = settled(await within(rig.lane.navigate(target, ctx, label="good point")))

    assert outcome.result.kind == "navigation"
    assert rig.lane.tip_id == target
    assert await rig.harness.entry_label(target, ctx) == "good point"
    assert [e.tip_id for e in rig.events.of(NavigationEnd)] == [target]
    assert shape([e.payload.message for e in await branch(rig.lane, ctx)]) == [  # type: ignore[union-attr]
        "user:first", "assistant:one"]


async def test_navigation_with_a_summary_keeps_the_branch_left_behind_as_one_entry(
    store: Store, ctx: Context
) -> None:
    rig = await start_rig(store, ctx, ["one", "two", "what we tried"])
    await rig.lane.prompt("first", None, ctx)
    target = rig.lane.tip_id
    await rig.lane.prompt("second", None, ctx)
    old_tip = rig.lane.tip_id

    settled(await within(rig.lane.navigate(target, ctx, summarize=True)))

    entries = await branch(rig.lane, ctx)
    summary = entries[-1].payload
    assert isinstance(summary, BranchSummaryPayload)
    assert (summary.summary, summary.from_id) == ("what we tried", old_tip)
    assert entries[-1].parent_id == target
    assert shape(rig.faux.requests[2].request.messages)[:2] == ["user:second", "assistant:two"]


async def test_navigation_to_a_missing_entry_is_refused(store: Store, ctx: Context) -> None:
    rig = await start_rig(store, ctx, ["one"])

    with pytest.raises(UnknownEntry):
        await rig.lane.navigate("no-such-entry", ctx)

    assert (await rig.lane.inspect_execution(ctx)).current is None


async def test_an_abort_during_a_compaction_settles_it_aborted_without_an_entry(store: Store, ctx: Context) -> None:
    rig = await start_rig(store, ctx, [reply(LONG), reply(LONG)], drive=KEEP_LITTLE)
    await rig.lane.prompt("first", None, ctx)
    await rig.lane.prompt("second", None, ctx)
    held = delay(asyncio.Event())
    rig.faux.push(reply("never finished", held))

    task = asyncio.ensure_future(rig.lane.compact(ctx))
    await within(held.reached.wait())
    await rig.lane.request_abort("user", ctx)
    outcome = settled(await within(task))

    assert outcome.result.outcome == "aborted"
    assert outcome.result.abort_cause == "user"
    assert not [e for e in await branch(rig.lane, ctx) if isinstance(e.payload, CompactionPayload)]
    await rig.harness.close(ctx)
    state = await rig.session.get(addresses.lane_state("main"), ctx)
    assert state is not None
    assert state.current_operation_id is None


async def test_input_sent_during_a_compaction_is_refused_up_front_or_kept_for_the_next_run(
        store: Store, ctx: Context) -> None:
    """Issue 12: a steer sent while a compaction ran was accepted, then handed back unsent when it
    ended. A compaction reads no messages, so a steer or follow-up is refused (`not_a_run`,
    nothing written) and a next-run message waits for the run that follows."""
    rig = await start_rig(store, ctx, [reply(LONG), reply(LONG)], drive=KEEP_LITTLE)
    await rig.lane.prompt("first", None, ctx)
    await rig.lane.prompt("second", None, ctx)
    release = asyncio.Event()
    held = delay(release)
    rig.faux.push(reply("the summary", held), reply("answered"))
    task = asyncio.ensure_future(rig.lane.compact(ctx))
    await within(held.reached.wait())

    for send in (rig.lane.steer, rig.lane.follow_up):
        with pytest.raises(NotARun) as refused:
            await send(said("during the compaction"), ctx)
        assert refused.value.code == "not_a_run"
    await rig.lane.queue_next_run(said("kept for the next run"), ctx)
    release.set()
    compacted = settled(await within(task))
    assert compacted.result.outcome == "completed"
    assert compacted.steer == compacted.follow_up == ()

    answered = settled(await within(rig.lane.prompt("", None, ctx)))
    assert answered.result.outcome == "completed"
    assert shape(rig.requests()[-1])[-1] == "user:kept for the next run"
    assert "during the compaction" not in [text(m) for m in await messages(rig.lane, ctx)]


async def test_a_turn_too_large_to_compact_goes_ahead_without_looping(store: Store, ctx: Context) -> None:
    """Over the threshold with nothing but the latest turn (grown past it by a long reply and its
    tool result): no compaction is attempted (and none repeated); the step is sent and the
    provider decides. (A prompt that alone passes the window is refused at acceptance.)"""
    probe = ProbeTool()
    rig = await small_window_rig(store, ctx, [reply(LONG, tool_call("probe", {"key": "a"})), "answered anyway"],
                                 probe)

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "completed"
    assert rig.events.of(CompactionStart) == []
    assert len(rig.faux.requests) == 2


async def test_closing_mid_run_stops_the_drive_and_the_next_attachment_finishes_it(
    store: Store, ctx: Context
) -> None:
    """Close is a controlled crash: the reply in flight is cut, nothing is settled, the open
    operation is in the next attachment's inventory and `resume` finishes it."""
    held = delay(asyncio.Event())
    rig = await start_rig(store, ctx, [reply("partial ", held, "never")])
    driving = asyncio.ensure_future(rig.lane.prompt("go", None, ctx))
    await within(held.reached.wait())

    await within(rig.harness.close(ctx))

    with pytest.raises(HarnessClosed):
        await within(driving)
    again = await start_rig(store, ctx, ["finished after the restart"], session=rig.session)
    assert [o.lane for o in again.open] == ["main"]
    outcome = settled(await within(again.lane.resume(ctx)))
    assert outcome.result.outcome == "completed"
    assert shape([e.payload.message for e in await branch(again.lane, ctx)])[-1] == (  # type: ignore[union-attr]
        "assistant:finished after the restart")


async def test_default_compaction_fits_a_small_model_instead_of_compacting_every_step(
    store: Store, ctx: Context
) -> None:
    """The default reserve (16,384 tokens) is more than a 4,096-token window: it is capped at a
    quarter of the window, so a short conversation on a small model never compacts."""
    small = FAUX_MODEL.model_copy(update={"context_window": 4096})
    rig = await start_rig(store, ctx, ["one", "two"], drive=DriveSettings())
    registry = rig.harness.options.models
    assert registry is not None
    registry.register_model(small)

    await rig.lane.prompt("first", None, ctx)
    await rig.lane.prompt("second", None, ctx)

    assert rig.events.of(CompactionStart) == []
    fitted = CompactionSettings().for_window(4096)
    assert (fitted.reserve_tokens, fitted.keep_recent_tokens) == (1024, 1024)


# -- queued input across a failed threshold compaction (issue 10, item 7) -------------------------


async def test_a_follow_up_is_answered_when_the_threshold_compaction_before_it_fails(
    store: Store, ctx: Context
) -> None:
    """A follow-up placed when the run would finish pushes the context over the threshold; the
    compaction's summary stops early (`length`) every time: the follow-up is still sent and
    answered, and the compaction ends say why nothing was compacted."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await small_window_rig(store, ctx, [
        reply(tool_call("probe", {"key": "a"}, id="call-a")), reply(LONG),
        CUT_SUMMARY, CUT_SUMMARY, CUT_SUMMARY, "the follow-up answered",
    ], probe)

    running = asyncio.ensure_future(rig.lane.prompt("go", None, ctx))
    await probe.wait_started("a")
    follow_id = await rig.lane.follow_up(said("one more thing"), ctx)
    gate.set()
    outcome = settled(await within(running))

    assert outcome.result.outcome == "completed"
    assert outcome.follow_up == ()
    ends = rig.events.of(CompactionEnd)
    assert [e.error.code for e in ends if e.error] == ["compaction_failed", "compaction_failed", "compaction_stopped"]
    assert ends[0].error is not None
    assert ends[0].error.message == "the summary stopped early (length)"
    assert shape(rig.requests()[-1])[-2:] == [f"assistant:{LONG}", "user:one more thing"]
    entries = await branch(rig.lane, ctx)
    assert entries[-2].id == follow_id
    assert outcome.result.final_assistant_entry_id == entries[-1].id
    assert text(entries[-1].payload.message) == "the follow-up answered"  # type: ignore[union-attr]


async def test_a_steer_is_answered_when_the_threshold_compaction_before_it_fails(store: Store, ctx: Context) -> None:
    """A steer placed after a tool batch passes the threshold; the compaction fails (`length`)
    each time: the steer goes out in the next request and is answered."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await small_window_rig(store, ctx, [
        reply(LONG, tool_call("probe", {"key": "a"}, id="call-a")),
        CUT_SUMMARY, CUT_SUMMARY, CUT_SUMMARY, "the steer answered",
    ], probe)

    running = asyncio.ensure_future(rig.lane.prompt("go", None, ctx))
    await probe.wait_started("a")
    await rig.lane.steer(said("turn left"), ctx)
    gate.set()
    outcome = settled(await within(running))

    assert outcome.result.outcome == "completed"
    assert outcome.steer == ()
    assert [e.status for e in rig.events.of(CompactionEnd)] == ["failed", "failed", "failed"]
    assert shape(rig.requests()[-1])[-2:] == ["result:call-a", "user:turn left"]
    assert text((await messages(rig.lane, ctx))[-1]) == "the steer answered"


async def test_a_next_run_item_waits_through_a_failed_threshold_compaction(store: Store, ctx: Context) -> None:
    """An item queued for the next run is not touched by the open run's failed compactions: it
    stays queued and the next run places it before its prompt."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await small_window_rig(store, ctx, [
        reply(LONG, tool_call("probe", {"key": "a"}, id="call-a")),
        CUT_SUMMARY, CUT_SUMMARY, CUT_SUMMARY, "first run done", "SUMMARY", "second run done",
    ], probe)

    running = asyncio.ensure_future(rig.lane.prompt("go", None, ctx))
    await probe.wait_started("a")
    next_id = await rig.lane.queue_next_run(said("for later"), ctx)
    gate.set()
    settled(await within(running))
    watch = await rig.lane.watch(ctx)
    watch.close()
    outcome = settled(await within(rig.lane.prompt("now", None, ctx)))

    assert [item.entry_id for item in watch.snapshot.queues.next_run] == [next_id]
    assert outcome.result.outcome == "completed"
    assert shape(rig.requests()[-1])[-2:] == ["user:for later", "user:now"]
