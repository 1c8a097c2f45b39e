"""Pausing a drive at its next step boundary (`Lane.pause_drive`, the `Paused` outcome), as a worker
that is asked to stop does: the step in hand ends (its tool batch, its retry wait), nothing more
starts, the operation stays open in its durable phase, and a later drive finishes the run from
there without repeating what was done. On every backend; the worker's use of it is in
test_worker_processes.py."""

from __future__ import annotations

import asyncio

from drive_helpers import FakeClock, ProbeTool, messages, shape, start_rig, within
from harness.context import Context
from harness.providers.faux import failure, reply, tool_call
from harness.runtime import DriveSettings, Paused, PromptRequest, RetryPolicy, Settled
from harness.session import Store, addresses
from harness.session.records import RunCheckpoint


async def test_a_pause_during_a_tool_lets_the_batch_finish_and_the_next_drive_ends_the_run(
        store: Store, ctx: Context) -> None:
    """The tool runs once and its result is placed; no second request is sent before the pause
    returns; the operation waits at `run_checkpoint` and a new drive asks the model and settles."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await start_rig(store, ctx, [reply(tool_call("probe", {"key": "a"}, id="call-a")), "Done."],
                          tools=[probe.tool])
    accepted = await rig.lane.accept(PromptRequest(text="go"), ctx)
    drive = asyncio.ensure_future(rig.lane.drive(accepted.operation_id, ctx))
    await probe.wait_started("a")

    assert await rig.lane.pause_drive(ctx)
    gate.set()
    assert await within(drive) == Paused(operation_id=accepted.operation_id)

    assert len(rig.faux.requests) == 1
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:+probe", "result:call-a"]
    phase = await rig.session.get(addresses.operation_state(accepted.operation_id), ctx)
    assert isinstance(phase, RunCheckpoint)
    outcome = await within(rig.lane.drive(accepted.operation_id, ctx))
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    assert len(probe.runs) == 1
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:+probe", "result:call-a",
                                                    "assistant:Done."]


async def test_a_pause_ends_a_retry_wait_without_sending_the_retry(store: Store, ctx: Context) -> None:
    """Paused in a 30 s backoff: it returns at once, the retry is still due, and the next drive sends it."""
    clock = FakeClock(hold_waits=True)
    rig = await start_rig(store, ctx, [failure("retryable", "rate limited", status=429), "Later."],
                          drive=DriveSettings(retry=RetryPolicy(max_retries=3, base_delay_ms=30_000)), clock=clock)
    accepted = await rig.lane.accept(PromptRequest(text="go"), ctx)
    drive = asyncio.ensure_future(rig.lane.drive(accepted.operation_id, ctx))
    await within(clock.waiting.wait())

    assert await rig.lane.pause_drive(ctx)
    assert await within(drive) == Paused(operation_id=accepted.operation_id)
    assert len(rig.faux.requests) == 1

    assert clock.hold is not None
    clock.hold.set()
    outcome = await within(rig.lane.drive(accepted.operation_id, ctx))
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    assert len(rig.faux.requests) == 2


async def test_an_abort_requested_with_the_pause_still_settles_the_run(store: Store, ctx: Context) -> None:
    """A pause never holds back a stop: the tool's call is answered and the run settles aborted."""
    probe = ProbeTool()
    probe.gate("a")
    rig = await start_rig(store, ctx, [reply(tool_call("probe", {"key": "a"}, id="call-a")), "never asked"],
                          tools=[probe.tool])
    accepted = await rig.lane.accept(PromptRequest(text="go"), ctx)
    drive = asyncio.ensure_future(rig.lane.drive(accepted.operation_id, ctx))
    await probe.wait_started("a")

    assert await rig.lane.pause_drive(ctx)
    await rig.lane.request_abort("user", ctx)
    outcome = await within(drive)

    assert isinstance(outcome, Settled)
    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert len(rig.faux.requests) == 1


async def test_pausing_a_lane_nobody_drives_changes_nothing(store: Store, ctx: Context) -> None:
    rig = await start_rig(store, ctx, ["Hello."])
    accepted = await rig.lane.accept(PromptRequest(text="go"), ctx)

    assert not await rig.lane.pause_drive(ctx)
    outcome = await within(rig.lane.drive(accepted.operation_id, ctx))
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
