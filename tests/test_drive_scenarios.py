"""Driving runs, scenario by scenario, through the public API on the faux provider: steps, tools,
hooks, queues, abort, retries, deferred replies, fencing, watch, and recovery of a crashed run
(issue 5; HA-14, HA-23 to HA-28, HA-30). Each test asserts the durable state (the transcript of a
fresh watch snapshot, the lane's last result), the events, and what the provider was sent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from pydantic import JsonValue

from drive_helpers import (
    CRASHED_OP,
    FAUX,
    KEY_SCHEMA,
    FakeClock,
    ProbeTool,
    Rig,
    assistants,
    branch,
    frame_page,
    messages,
    results,
    shape,
    start_rig,
    text,
    within,
    write_crash,
)
from harness.context import Context
from harness.errors import Cancelled
from harness.messages import (
    AssistantMessage,
    CustomMessage,
    ImageContent,
    Message,
    ModelIdentity,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from harness.providers import FAUX_MODEL, StartEvent, TextDeltaEvent, TextStartEvent, ToolSpec
from harness.providers.faux import FauxReply, FauxRequest, FauxToolCall, deferred, delay, failure, reply, tool_call
from harness.runtime import (
    AgentTool,
    Block,
    DriveSettings,
    EntryAdded,
    HarnessEvent,
    InvalidMessage,
    Lane,
    MessageEnd,
    MessageUpdate,
    OperationAbort,
    OperationMismatch,
    ProgressCallback,
    PromptRequest,
    QueuedItem,
    RetryEnd,
    RetryInfo,
    RetryPolicy,
    RetryScheduled,
    RetryStart,
    RunEnd,
    RunHooks,
    RunningTool,
    RunResume,
    RunSuspend,
    Settled,
    Suspended,
    ToolCallRequest,
    ToolEnd,
    ToolOutput,
    ToolStart,
    TurnEnd,
    TurnStart,
    UsageRecorded,
    WaitingRetry,
    reduce_lane_snapshot,
)
from harness.session import AppendList, CustomPayload, LaneConfig, MessagePayload, SessionMutator, Store, addresses
from harness.session.records import (
    AssistantEffectPending,
    DeferredEffectPending,
    DeferredSuspended,
    GenerationContext,
    OperationState,
    PendingMessage,
    RunTools,
    ToolBatch,
    ToolCallState,
)
from harness_helpers import recording as recording_store
from harness_helpers import said

GONE = ModelIdentity(provider="gone", model_id="retired-model")


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled), outcome
    return outcome


def call(key: str, tool: str = "probe") -> FauxToolCall:
    """A call of `tool` with `{"key": key}` and the id `call-<key>`."""
    return tool_call(tool, {"key": key}, id=f"call-{key}")


def start(rig: Rig, prompt: str, context: Context) -> asyncio.Task[object]:
    """Prompt in the background, so the test can act while the run is under way."""
    return asyncio.get_running_loop().create_task(rig.lane.prompt(prompt, None, context))


def ended(tool_call_id: str) -> Callable[[ToolEnd], bool]:
    """Matches the `tool_end` of one call."""
    return lambda event: event.tool_call_id == tool_call_id


def tool_results_placed(rig: Rig) -> list[str]:
    """The tool call ids of the results placed on the branch, in placement order."""
    return [e.entry.payload.message.tool_call_id for e in rig.events.of(EntryAdded)
            if isinstance(e.entry.payload, MessagePayload) and isinstance(e.entry.payload.message, ToolResultMessage)]


# -- a plain reply ------------------------------------------------------------------------------


async def test_text_reply_settles_completed_and_leaves_no_frames(store: Store, ctx: Context) -> None:
    """Issue 5 items 1, 2: a text reply is settled under its reserved id, the run settles
    `completed` with that entry as its final assistant, and the frames persisted while it streamed
    are deleted by the settlement."""
    recorded, backend = recording_store(store)
    rig = await start_rig(recorded, ctx, ["Hello there, it is a fine day."])

    outcome = settled(await within(rig.lane.prompt("hi", None, ctx)))

    entries = await branch(rig.lane, ctx)
    assert shape([e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]) == [
        "user:hi", "assistant:Hello there, it is a fine day."]
    final = entries[-1]
    assert outcome.result.outcome == "completed"
    assert outcome.result.final_assistant_entry_id == final.id
    assert outcome.result.tip_id == final.id
    info = await rig.lane.inspect_execution(ctx)
    assert info.current is None
    assert info.last_result == outcome.result
    assert [shape(request) for request in rig.requests()] == [["user:hi"]]
    types = rig.events.types
    assert types[:4] == ["run_start", "message_start", "message_end", "entry_added"]  # the prompt
    assert types[4:6] == ["turn_start", "message_start"]
    assert set(types[6:types.index("message_end", 6)]) <= {"message_update"}  # updates are rate-bounded
    assert types[types.index("message_end", 6):] == ["message_end", "entry_added", "usage", "turn_end", "run_end"]
    frame_namespace = addresses.assistant_frames(outcome.operation_id, final.id).namespace
    assert any(isinstance(w, AppendList) and w.namespace == frame_namespace
               for commit in backend.commits for w in commit), "the reply's frames were never persisted"

    await rig.harness.close(ctx)
    assert await rig.session.read_list(addresses.assistant_frames(outcome.operation_id, final.id), ctx) == []
    ledger = await rig.session.usage_ledger(ctx)
    assert [row.entry_id for row in ledger] == [final.id]


# -- tools --------------------------------------------------------------------------------------


async def test_tool_call_then_result_then_reply(store: Store, ctx: Context) -> None:
    """Issue 5 item 3: a reply with a tool call runs the tool, places its result right after the
    call, and asks the model again with call and result; the run then completes."""
    probe = ProbeTool(details={"rows": 3})
    rig = await start_rig(store, ctx, [reply("Checking.", call("a")), "All done."], tools=[probe.tool])

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    transcript = await messages(rig.lane, ctx)
    assert shape(transcript) == ["user:go", "assistant:Checking.+probe", "result:call-a", "assistant:All done."]
    result = results(transcript)[0]
    assert (text(result), result.is_error, result.details) == ("probe:a", False, {"rows": 3})
    assert probe.runs == [{"key": "a"}]
    assert [shape(r) for r in rig.requests()] == [
        ["user:go"], ["user:go", "assistant:Checking.+probe", "result:call-a"]]
    assert outcome.result.outcome == "completed"
    types = [t for t in rig.events.types if t in ("tool_start", "tool_end", "entry_added", "turn_end")]
    # the reply, its tool, the result placed, the tools turn ends; then the final reply's turn
    assert types == ["entry_added", "entry_added", "tool_start", "tool_end", "entry_added", "turn_end",
                     "entry_added", "turn_end"]
    assert rig.events.of(ToolStart)[0].args == {"key": "a"}


async def test_parallel_calls_finish_out_of_order_but_results_are_placed_in_source_order(
    store: Store, ctx: Context
) -> None:
    """Issue 5 item 3: parallel calls run at once; released in reverse, each result is staged
    when its call ends but placed only once every earlier call has one, so the next request has
    the calls followed by their results in source order."""
    probe = ProbeTool()
    gates = {key: probe.gate(key) for key in "abc"}
    rig = await start_rig(store, ctx, [reply(call("a"), call("b"), call("c")), "Done."], tools=[probe.tool])

    task = start(rig, "go", ctx)
    for key in "abc":
        await probe.wait_started(key)
    assert probe.in_flight == 3
    for key in "cb":
        gates[key].set()
        await rig.events.wait_for(ToolEnd, ended(f"call-{key}"))
        assert results(await messages(rig.lane, ctx)) == [], "a result was placed before call-a had one"
    gates["a"].set()
    settled(await within(task))

    assert [e.tool_call_id for e in rig.events.of(ToolEnd)] == ["call-c", "call-b", "call-a"]
    assert tool_results_placed(rig) == ["call-a", "call-b", "call-c"]
    expected = ["user:go", "assistant:+probe+probe+probe", "result:call-a", "result:call-b", "result:call-c"]
    assert shape(await messages(rig.lane, ctx)) == [*expected, "assistant:Done."]
    assert shape(rig.requests()[1]) == expected
    assert [text(r) for r in results(rig.requests()[1])] == ["probe:a", "probe:b", "probe:c"]


async def test_sequential_mode_runs_one_call_at_a_time(store: Store, ctx: Context) -> None:
    """Issue 5 item 3: with `tool_execution="sequential"` the second call starts only after the
    first has its result."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await start_rig(store, ctx, [reply(call("a"), call("b")), "Done."], tools=[probe.tool],
                          drive=DriveSettings(tool_execution="sequential"))

    task = start(rig, "go", ctx)
    await probe.wait_started("a")
    for _ in range(3):  # round trips on the session line: a parallel drive would start call-b here
        await rig.lane.inspect_execution(ctx)
    watch = await rig.lane.watch(ctx)
    watch.close()
    assert watch.snapshot.operation is not None
    assert [t.tool_call_id for t in watch.snapshot.operation.running_tools] == ["call-a"]
    assert not probe.started["b"].is_set()
    gate.set()
    settled(await within(task))

    assert probe.max_in_flight == 1
    order = [(e.type, e.tool_call_id) for e in rig.events.events if isinstance(e, ToolStart | ToolEnd)]
    assert order == [("tool_start", "call-a"), ("tool_end", "call-a"), ("tool_start", "call-b"),
                     ("tool_end", "call-b")]
    assert shape(rig.requests()[1]) == ["user:go", "assistant:+probe+probe", "result:call-a", "result:call-b"]


@pytest.mark.parametrize(
    ("bad_call", "problem"),
    [
        (tool_call("nowhere", {"key": "x"}, id="call-bad"), "'nowhere' is not available"),
        (tool_call("probe", {"key": 7}, id="call-bad"), "not valid for tool 'probe'"),
        (tool_call("probe", raw='{"key": ', id="call-bad"), "not a JSON object"),
    ],
    ids=["unknown-tool", "schema-mismatch", "malformed-arguments"],
)
async def test_a_call_that_cannot_run_gets_an_error_result_and_the_run_continues(
    store: Store, ctx: Context, bad_call: FauxToolCall, problem: str
) -> None:
    """HA-25: an unknown tool, arguments failing the JSON schema and argument text that is not a
    JSON object each get an `is_error` result without running anything; synthetic results carry
    no details (the real result beside it does); the run goes on to the next request."""
    probe = ProbeTool(details={"real": True})
    rig = await start_rig(store, ctx, [reply(bad_call, call("ok")), "Recovered."], tools=[probe.tool])

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert probe.runs == [{"key": "ok"}]
    bad, good = results(await messages(rig.lane, ctx))
    assert (bad.tool_call_id, bad.is_error, bad.details) == ("call-bad", True, None)
    assert problem in text(bad)
    assert (good.is_error, good.details) == (False, {"real": True})
    assert shape(rig.requests()[1])[-2:] == ["result:call-bad", "result:call-ok"]
    assert outcome.result.outcome == "completed"
    assert not [e for e in rig.events.of(ToolStart) if e.tool_call_id == "call-bad"]  # it never started


async def test_a_tool_that_raises_answers_with_an_error_result(store: Store, ctx: Context) -> None:
    """Issue 5 item 3: a tool's exception is its result (`is_error`, naming the error), not the
    run's failure; the run goes on."""

    async def broken(call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                     context: Context) -> ToolOutput:
        raise OSError("disk on fire")

    tool = AgentTool(spec=ToolSpec(name="broken", description="raises", parameters=KEY_SCHEMA), execute=broken)
    rig = await start_rig(store, ctx, [reply(call("a", "broken")), "Sorry about that."], tools=[tool])

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    (result,) = results(await messages(rig.lane, ctx))
    assert result.is_error
    assert "disk on fire" in text(result)
    assert outcome.result.outcome == "completed"
    assert len(rig.faux.requests) == 2


async def test_a_terminating_result_ends_the_run_after_its_batch(store: Store, ctx: Context) -> None:
    """Issue 5 item 3: when every result of a batch asks to terminate, the run finishes after
    placing them without asking the model again."""

    async def final(call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                    context: Context) -> ToolOutput:
        return ToolOutput(content=[TextContent(text="handed over")], terminate=True)

    tool = AgentTool(spec=ToolSpec(name="hand_over", description="ends the run", parameters=KEY_SCHEMA),
                     execute=final)
    rig = await start_rig(store, ctx, [reply(call("a", "hand_over")), "never asked"], tools=[tool])

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "completed"
    assert len(rig.faux.requests) == 1
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:+hand_over", "result:call-a"]
    assert [e.terminate for e in rig.events.of(ToolEnd)] == [True]


# -- before_tool and after_tool -----------------------------------------------------------------


async def test_before_tool_block_gives_an_error_result_without_running(store: Store, ctx: Context) -> None:
    """Issue 5 item 3: a `Block` from `before_tool` answers the call with an error result that
    gives the reason; the tool does not run; the run continues."""
    probe = ProbeTool()
    asked: list[ToolCallRequest] = []

    async def before(request: ToolCallRequest, context: Context) -> Block | dict[str, JsonValue] | None:
        asked.append(request)
        return Block(reason="the person said no")

    rig = await start_rig(store, ctx, [reply(call("a")), "Understood."], tools=[probe.tool],
                          hooks=RunHooks(before_tool=before))
    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert [(r.tool_call_id, r.tool_name, r.args) for r in asked] == [("call-a", "probe", {"key": "a"})]
    assert asked[0].operation_id == outcome.operation_id
    assert probe.runs == []
    result = results(await messages(rig.lane, ctx))[0]
    assert (result.is_error, result.details) == (True, None)
    assert "the person said no" in text(result)
    assert outcome.result.outcome == "completed"
    assert rig.events.of(ToolStart) == []


async def test_before_tool_that_raises_blocks_the_call(store: Store, ctx: Context) -> None:
    """Issue 5 item 3: approval fails closed: a `before_tool` that raises blocks the call."""
    probe = ProbeTool()

    async def before(request: ToolCallRequest, context: Context) -> Block | dict[str, JsonValue] | None:
        raise RuntimeError("approval service unreachable")

    rig = await start_rig(store, ctx, [reply(call("a")), "Understood."], tools=[probe.tool],
                          hooks=RunHooks(before_tool=before))
    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert probe.runs == []
    result = results(await messages(rig.lane, ctx))[0]
    assert result.is_error
    assert "approval service unreachable" in text(result)
    assert outcome.result.outcome == "completed"


async def test_before_tool_replacement_args_are_used(store: Store, ctx: Context) -> None:
    """Issue 5 item 3: replacement arguments from `before_tool` are what the tool runs with and
    what `tool_start` shows."""
    probe = ProbeTool()

    async def before(request: ToolCallRequest, context: Context) -> Block | dict[str, JsonValue] | None:
        return {"key": "approved-" + str(request.args["key"])}

    rig = await start_rig(store, ctx, [reply(call("a")), "Done."], tools=[probe.tool],
                          hooks=RunHooks(before_tool=before))
    settled(await within(rig.lane.prompt("go", None, ctx)))

    assert probe.runs == [{"key": "approved-a"}]
    assert rig.events.of(ToolStart)[0].args == {"key": "approved-a"}
    assert text(results(await messages(rig.lane, ctx))[0]) == "probe:approved-a"


async def test_after_tool_replaces_the_output(store: Store, ctx: Context) -> None:
    """Issue 5 item 3: `after_tool` sees the tool's output and its replacement is the result."""
    probe = ProbeTool()
    seen: list[str] = []

    async def after(request: ToolCallRequest, output: ToolOutput, context: Context) -> ToolOutput | None:
        seen.append(text(UserMessage(content=output.content)))
        return ToolOutput(content=[TextContent(text="[redacted]")], details={"redacted": True})

    rig = await start_rig(store, ctx, [reply(call("a")), "Done."], tools=[probe.tool],
                          hooks=RunHooks(after_tool=after))
    settled(await within(rig.lane.prompt("go", None, ctx)))

    assert seen == ["probe:a"]
    result = results(await messages(rig.lane, ctx))[0]
    assert (text(result), result.details) == ("[redacted]", {"redacted": True})
    assert text(results(rig.requests()[1])[0]) == "[redacted]"


async def test_after_tool_sees_an_output_that_lands_during_an_abort(store: Store, ctx: Context) -> None:
    """Issue 14 item 3: a tool that finishes within the abort's grace period has its output
    stored, so `after_tool` still sees it first (the conversation layer keeps image bytes out of
    the journal there, CE-22)."""
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(call_id: str, args: dict[str, JsonValue], on_update: object, context: Context) -> ToolOutput:
        started.set()
        await release.wait()
        return ToolOutput(content=[TextContent(text="raw")], details={"secret": True})

    async def after(request: ToolCallRequest, output: ToolOutput, context: Context) -> ToolOutput | None:
        return ToolOutput(content=[TextContent(text="[cleaned]")])

    tool = AgentTool(spec=ToolSpec(name="slow", description="finishes when released", parameters=KEY_SCHEMA),
                     execute=slow)
    rig = await start_rig(store, ctx, [reply(call("a", "slow")), "never asked"], tools=[tool],
                          hooks=RunHooks(after_tool=after))
    task = start(rig, "go", ctx)
    await within(started.wait())
    await rig.lane.request_abort("user", ctx)
    release.set()
    outcome = settled(await within(task))

    assert outcome.result.outcome == "aborted"
    (result,) = results(await messages(rig.lane, ctx))
    assert (text(result), result.details) == ("[cleaned]", None)


# -- abort --------------------------------------------------------------------------------------


async def test_abort_mid_stream_keeps_the_partial_reply(store: Store, ctx: Context) -> None:
    """Issue 5 item 5: an abort while the reply streams settles the run `aborted` with cause
    `user`; the partial reply stays on the branch with stop reason `aborted`; no other reply."""
    pause = delay(asyncio.Event())  # never released: only the abort ends the reply
    rig = await start_rig(store, ctx, [reply("Partial answer so far ", pause, "never streamed")])

    task = start(rig, "go", ctx)
    await within(pause.reached.wait())
    request = await rig.lane.request_abort("user", ctx)
    outcome = settled(await within(task))

    assert request.newly_requested
    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    info = await rig.lane.inspect_execution(ctx)
    assert (info.current, info.last_result) == (None, outcome.result)
    transcript = await messages(rig.lane, ctx)
    assert shape(transcript) == ["user:go", "assistant:Partial answer so far "]
    assert assistants(transcript)[0].stop_reason == "aborted"
    assert len(rig.faux.requests) == 1
    assert [e.cause for e in rig.events.of(OperationAbort)] == ["user"]
    assert rig.events.of(RunEnd)[0].result == outcome.result


async def test_abort_before_any_output_leaves_no_empty_reply(store: Store, ctx: Context) -> None:
    """Issue 5 item 5: an abort before the model said anything settles `aborted` without an
    empty assistant entry."""
    pause = delay(asyncio.Event())
    rig = await start_rig(store, ctx, [reply(pause, "never streamed")])

    task = start(rig, "go", ctx)
    await within(pause.reached.wait())
    await rig.lane.request_abort("user", ctx)
    outcome = settled(await within(task))

    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert shape(await messages(rig.lane, ctx)) == ["user:go"]
    assert outcome.result.final_assistant_entry_id is None
    assert not [e for e in rig.events.of(EntryAdded) if isinstance(e.entry.payload, MessagePayload)
                and isinstance(e.entry.payload.message, AssistantMessage)]


async def test_abort_inside_before_tool_of_the_first_call_answers_both_and_runs_neither(
    store: Store, ctx: Context
) -> None:
    """Issue 5 items 3, 5: an abort requested inside `before_tool` of the first of two calls: the
    second is never asked about or run, neither tool runs, both calls get a result, and the run
    settles `aborted` without asking the model again."""
    probe = ProbeTool()
    asked: list[str] = []
    lanes: list[Lane] = []

    async def before(request: ToolCallRequest, context: Context) -> Block | dict[str, JsonValue] | None:
        asked.append(request.tool_call_id)
        await lanes[0].request_abort("user", ctx)
        return None  # approved, but too late: the run is aborting

    rig = await start_rig(store, ctx, [reply(call("a"), call("b")), "never asked"], tools=[probe.tool],
                          hooks=RunHooks(before_tool=before))
    lanes.append(rig.lane)
    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert asked == ["call-a"]
    assert probe.runs == []
    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    transcript = await messages(rig.lane, ctx)
    assert shape(transcript) == ["user:go", "assistant:+probe+probe", "result:call-a", "result:call-b"]
    for result in results(transcript):
        assert result.is_error
        assert result.details is None
        assert "not run" in text(result) or "interrupted" in text(result)
    assert len(rig.faux.requests) == 1
    assert rig.events.of(ToolStart) == []


async def test_an_abort_that_lands_between_the_reply_and_its_calls_answers_them_as_not_run(
    store: Store, ctx: Context
) -> None:
    """Issue 12: the reply's settlement commits the intents of the calls that start at once (their
    `tool_start`s come with it); an abort committed before the drive starts them answers each call
    "not run", never "interrupted", and runs neither."""
    probe = ProbeTool(replay="safe")
    rig = await start_rig(store, ctx, [reply(call("a"), call("b")), "never asked"], tools=[probe.tool])
    watch = await rig.lane.watch(ctx)
    aborts: list[asyncio.Task[object]] = []

    async def abort_on_the_first_tool_start(event: HarnessEvent, context: Context) -> None:
        # The drive waits for this delivery before it goes on; the abort's own events reach the
        # watch at its commit, while this listener still holds the bus.
        if isinstance(event, ToolStart) and not aborts:
            aborts.append(asyncio.get_running_loop().create_task(rig.lane.request_abort("user", ctx)))
            async for seen in watch:
                if isinstance(seen.event, OperationAbort):
                    break

    rig.harness.add_listener(abort_on_the_first_tool_start)
    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))
    await within(aborts[0])
    watch.close()

    assert probe.runs == []
    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert [e.tool_call_id for e in rig.events.of(ToolStart)] == ["call-a", "call-b"]
    transcript = await messages(rig.lane, ctx)
    assert shape(transcript) == ["user:go", "assistant:+probe+probe", "result:call-a", "result:call-b"]
    not_run = "The run was aborted before this tool call started; it was not run."
    assert [text(r) for r in results(transcript)] == [not_run, not_run]
    assert len(rig.faux.requests) == 1


async def test_a_tool_that_ignores_cancellation_cannot_hold_the_abort(store: Store, ctx: Context) -> None:
    """Issue 5 item 5: a tool that ignores cancellation gets an interrupted result once the grace
    period is over, the run settles `aborted`, and the tool's late result is discarded."""
    release, started, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()
    cancellations: list[str] = []

    async def stubborn(
        call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback, context: Context
    ) -> ToolOutput:
        started.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:  # ignored on purpose
                cancellations.append(call_id)
        finished.set()
        return ToolOutput(content=[TextContent(text="LATE RESULT")], details={"late": True})

    tool = AgentTool(spec=ToolSpec(name="stubborn", description="ignores cancellation", parameters=KEY_SCHEMA),
                     execute=stubborn)
    rig = await start_rig(store, ctx, [reply(call("a", "stubborn")), "never asked"], tools=[tool],
                          drive=DriveSettings(abort_grace_s=0.05))

    task = start(rig, "go", ctx)
    await within(started.wait())
    await rig.lane.request_abort("user", ctx)
    outcome = settled(await within(task))

    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert cancellations == ["call-a"]  # the grace period ran out and the effect was cancelled
    (result,) = results(await messages(rig.lane, ctx))
    assert result.is_error
    assert "interrupted" in text(result)
    result_id = (await branch(rig.lane, ctx))[-1].id

    release.set()
    await within(finished.wait())
    for _ in range(5):  # let the late result reach the session line, where it must be dropped
        await rig.lane.inspect_execution(ctx)
    assert "LATE RESULT" not in str([e.model_dump() for e in rig.events.events])
    assert "LATE RESULT" not in str(await messages(rig.lane, ctx))
    info = await rig.lane.inspect_execution(ctx)
    assert (info.current, info.last_result) == (None, outcome.result)
    await rig.harness.close(ctx)
    assert await rig.session.get(addresses.pending_entry(result_id), ctx) is None
    assert len(rig.faux.requests) == 1


# -- queues -------------------------------------------------------------------------------------


async def test_steer_during_a_blocked_tool_is_placed_after_the_results_before_the_next_request(
    store: Store, ctx: Context
) -> None:
    """Issue 5 item 4, HA-18: a steer sent while a tool is blocked waits in the queue, is placed
    after the batch's results (never between a call and its result) and goes into the very next
    request."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await start_rig(store, ctx, [reply(call("a")), "Turning left."], tools=[probe.tool])

    task = start(rig, "go", ctx)
    await probe.wait_started("a")
    steer_id = await rig.lane.steer(said("turn left"), ctx)
    watch = await rig.lane.watch(ctx)
    watch.close()
    assert [item.entry_id for item in watch.snapshot.queues.steer] == [steer_id]
    gate.set()
    settled(await within(task))

    entries = await branch(rig.lane, ctx)
    transcript = [e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]
    assert shape(transcript) == ["user:go", "assistant:+probe", "result:call-a", "user:turn left",
                                 "assistant:Turning left."]
    assert entries[3].id == steer_id
    assert shape(rig.requests()[1]) == ["user:go", "assistant:+probe", "result:call-a", "user:turn left"]


async def test_follow_up_is_placed_only_when_the_run_would_otherwise_finish(store: Store, ctx: Context) -> None:
    """Issue 5 item 4, HA-18: a follow-up sent during a tool call is not placed at the tool
    boundary; it is placed when the run would finish, and the run asks the model again."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await start_rig(store, ctx, [reply(call("a")), "First answer.", "Second answer."], tools=[probe.tool])

    task = start(rig, "go", ctx)
    await probe.wait_started("a")
    follow_id = await rig.lane.follow_up(said("one more thing"), ctx)
    gate.set()
    outcome = settled(await within(task))

    assert [shape(r) for r in rig.requests()] == [
        ["user:go"],
        ["user:go", "assistant:+probe", "result:call-a"],
        ["user:go", "assistant:+probe", "result:call-a", "assistant:First answer.", "user:one more thing"],
    ]
    entries = await branch(rig.lane, ctx)
    assert entries[4].id == follow_id
    assert outcome.result.final_assistant_entry_id == entries[-1].id
    assert text(entries[-1].payload.message) == "Second answer."  # type: ignore[union-attr]


async def test_queue_next_run_waits_for_the_next_accepted_run(store: Store, ctx: Context) -> None:
    """Issue 5 item 4, HA-18: an item queued for the next run is not placed by the open run; the
    next accepted run places it before its own prompt."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await start_rig(store, ctx, [reply(call("a")), "First.", "Second."], tools=[probe.tool])

    task = start(rig, "go", ctx)
    await probe.wait_started("a")
    next_id = await rig.lane.queue_next_run(said("for later"), ctx)
    gate.set()
    settled(await within(task))

    assert len(rig.faux.requests) == 2
    assert "user:for later" not in shape(await messages(rig.lane, ctx))
    watch = await rig.lane.watch(ctx)
    watch.close()
    assert [item.entry_id for item in watch.snapshot.queues.next_run] == [next_id]

    settled(await within(rig.lane.prompt("now", None, ctx)))
    assert shape(rig.requests()[2])[-2:] == ["user:for later", "user:now"]
    assert [e.id for e in await branch(rig.lane, ctx)][-3] == next_id


async def test_abort_drains_steer_and_follow_up_and_returns_them(store: Store, ctx: Context) -> None:
    """Issue 5 item 5: `request_abort` drains the queued steer and follow-up items, keeps them
    stored while the run aborts, and returns them in the `Settled` outcome; none is placed."""
    probe = ProbeTool()
    probe.gate("a")  # only the abort's cancellation ends the call
    rig = await start_rig(store, ctx, [reply(call("a")), "never asked"], tools=[probe.tool])

    task = start(rig, "go", ctx)
    await probe.wait_started("a")
    steer_id = await rig.lane.steer(said("steer me"), ctx)
    follow_id = await rig.lane.follow_up(said("follow me"), ctx)
    request = await rig.lane.request_abort("user", ctx)
    outcome = settled(await within(task))

    assert (request.steer, request.follow_up) == ((steer_id,), (follow_id,))
    assert outcome.steer == (QueuedItem(entry_id=steer_id, message=said("steer me")),)
    assert outcome.follow_up == (QueuedItem(entry_id=follow_id, message=said("follow me")),)
    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:+probe", "result:call-a"]
    abort_event = rig.events.of(OperationAbort)[0]
    assert (abort_event.steer, abort_event.follow_up) == (outcome.steer, outcome.follow_up)
    assert len(rig.faux.requests) == 1
    await rig.harness.close(ctx)
    for entry_id in (steer_id, follow_id):
        assert await rig.session.get(addresses.pending_entry(entry_id), ctx) is None


async def test_steer_during_a_final_reply_is_placed_and_answered(store: Store, ctx: Context) -> None:
    """Issue 5 item 4: a steer sent while a reply without tool calls streams is placed after that
    reply, and the run asks the model again instead of finishing."""
    gate = asyncio.Event()
    pause = delay(gate)
    rig = await start_rig(store, ctx, [reply("Going ", pause, "straight."), "Turning now."])

    task = start(rig, "go", ctx)
    await within(pause.reached.wait())
    await rig.lane.steer(said("turn left"), ctx)
    gate.set()
    outcome = settled(await within(task))

    assert shape(rig.requests()[1]) == ["user:go", "assistant:Going straight.", "user:turn left"]
    assert shape(await messages(rig.lane, ctx))[-1] == "assistant:Turning now."
    assert outcome.result.final_assistant_entry_id == (await branch(rig.lane, ctx))[-1].id


async def test_a_pending_write_is_not_stranded_by_an_abort(store: Store, ctx: Context) -> None:
    """Issue 5 item 4, CE-4: an append made while a run is open is a pending write placed at a
    boundary; an abort must not leave it queued on an idle lane, where a later idle append would
    land before it."""
    probe = ProbeTool()
    probe.gate("a")
    rig = await start_rig(store, ctx, [reply(call("a"))], tools=[probe.tool])

    task = start(rig, "go", ctx)
    await probe.wait_started("a")
    during = await rig.lane.append_custom("note", {"order": 1}, ctx)
    await rig.lane.request_abort("user", ctx)
    settled(await within(task))
    after = await rig.lane.append_custom("note", {"order": 2}, ctx)

    watch = await rig.lane.watch(ctx)
    watch.close()
    assert watch.snapshot.pending_writes == ()
    notes = [e.id for e in watch.snapshot.transcript if isinstance(e.payload, CustomPayload)]
    assert notes == [during, after]


# -- retries ------------------------------------------------------------------------------------


async def test_transient_429_then_success_keeps_the_reply_and_sides_the_failed_attempt(
    store: Store, ctx: Context
) -> None:
    """Issue 5 item 2: a transient 429 is retried after the policy's backoff (an injected clock
    and sleep, no real waiting) with `retry_scheduled`, `retry_start`, `retry_end`; the successful
    reply is on the branch, parented on the prompt; the failed attempt is a side entry that no
    request carries."""
    policy = RetryPolicy(max_retries=2, base_delay_ms=1_000, max_delay_ms=60_000)
    rig = await start_rig(store, ctx, [failure("retryable", "rate limited", "Partial ", status=429), "Recovered."],
                          drive=DriveSettings(retry=policy))
    start_ms = rig.clock.now

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "completed"
    assert rig.clock.waits == [1.0]
    scheduled, = rig.events.of(RetryScheduled)
    assert (scheduled.attempt, scheduled.max_attempts, scheduled.not_before) == (2, 3, start_ms + 1_000)
    assert [e.attempt for e in rig.events.of(RetryStart)] == [2]
    assert [(e.attempt, e.success) for e in rig.events.of(RetryEnd)] == [(2, True)]
    types = rig.events.types
    assert types.index("retry_scheduled") < types.index("retry_start") < types.index("retry_end")
    entries = await branch(rig.lane, ctx)
    assert shape([e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]) == [
        "user:go", "assistant:Recovered."]
    assert entries[-1].parent_id == entries[0].id
    assert [shape(r) for r in rig.requests()] == [["user:go"], ["user:go"]]
    failed_end = next(e for e in rig.events.of(MessageEnd) if isinstance(e.message, AssistantMessage)
                      and e.message.stop_reason == "error")
    assert failed_end.entry_id is not None

    await rig.harness.close(ctx)
    side = await rig.session.entry(failed_end.entry_id, ctx)
    assert side is not None
    assert side.parent_id == entries[0].id
    assert isinstance(side.payload, MessagePayload)
    assert text(side.payload.message) == "Partial "
    assert [row.entry_id for row in await rig.session.usage_ledger(ctx)] == [failed_end.entry_id, entries[-1].id]


async def test_retries_exhausted_fail_the_run_with_assistant_error(store: Store, ctx: Context) -> None:
    """Issue 5 item 2, HA-26: when every attempt fails transiently the run settles `failed` with
    code `assistant_error`; the last attempt's errored reply is on the branch, the earlier one not."""
    rig = await start_rig(store, ctx, [failure("retryable", "rate limited", status=429),
                                       failure("retryable", "still rate limited", status=429)],
                          drive=DriveSettings(retry=RetryPolicy(max_retries=1, base_delay_ms=500)))

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "failed"
    assert outcome.result.error is not None
    assert (outcome.result.error.code, outcome.result.error.message) == ("assistant_error", "still rate limited")
    assert rig.clock.waits == [0.5]
    assert [(e.attempt, e.success, e.final_error) for e in rig.events.of(RetryEnd)] == [
        (2, False, "still rate limited")]
    replies = assistants(await messages(rig.lane, ctx))
    assert [(r.stop_reason, r.error_message) for r in replies] == [("error", "still rate limited")]
    assert len(rig.faux.requests) == 2


async def test_drive_can_return_at_a_retry_wait_and_a_later_drive_continues(store: Store, ctx: Context) -> None:
    """Issue 5 item 1: `wait_for_retry=False` returns `WaitingRetry` with `not_before` instead of
    waiting; the operation stays open (no local owner) with its retry in the snapshot; a later
    drive waits it out and completes."""
    rig = await start_rig(store, ctx, [failure("retryable", "rate limited", status=429), "Later answer."],
                          drive=DriveSettings(retry=RetryPolicy(max_retries=3, base_delay_ms=2_000)))
    accepted = await rig.lane.accept(PromptRequest(text="go"), ctx)

    first = await within(rig.lane.drive(accepted.operation_id, ctx, wait_for_retry=False))

    assert isinstance(first, WaitingRetry)
    assert (first.operation_id, first.not_before) == (accepted.operation_id, rig.clock.now + 2_000)
    assert rig.clock.waits == []
    info = await rig.lane.inspect_execution(ctx)
    assert info.current is not None
    assert info.current.status == "open"
    watch = await rig.lane.watch(ctx)
    watch.close()
    assert watch.snapshot.operation is not None
    assert watch.snapshot.operation.retry == RetryInfo(attempt=2, max_attempts=4, next_attempt_at=first.not_before)

    second = settled(await within(rig.lane.drive(accepted.operation_id, ctx)))
    assert second.result.outcome == "completed"
    assert rig.clock.waits == [2.0]
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:Later answer."]


async def test_a_drive_that_does_not_wait_makes_a_retry_once_it_is_due(store: Store, ctx: Context) -> None:
    """Issue 5 item 1: once `not_before` has passed, `wait_for_retry=False` makes the attempt
    instead of handing the wait back again; a worker drives this way, and an answer that only
    repeated `WaitingRetry` would have it claim and release the session for ever."""
    rig = await start_rig(store, ctx, [failure("retryable", "rate limited", status=429), "Later answer."],
                          drive=DriveSettings(retry=RetryPolicy(max_retries=3, base_delay_ms=2_000)))
    accepted = await rig.lane.accept(PromptRequest(text="go"), ctx)
    first = await within(rig.lane.drive(accepted.operation_id, ctx, wait_for_retry=False))
    assert isinstance(first, WaitingRetry)

    rig.clock.now = first.not_before
    second = settled(await within(rig.lane.drive(accepted.operation_id, ctx, wait_for_retry=False)))

    assert second.result.outcome == "completed"
    assert rig.clock.waits == []
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:Later answer."]


async def test_abort_during_a_retry_wait_settles_aborted_without_retrying(store: Store, ctx: Context) -> None:
    """Issue 5 item 5: an abort during a retry wait ends the wait at once and settles `aborted`;
    the failed attempt stays a side entry and no retry is sent."""
    clock = FakeClock(hold_waits=True)
    rig = await start_rig(store, ctx, [failure("retryable", "rate limited", "Half", status=429), "never asked"],
                          drive=DriveSettings(retry=RetryPolicy(max_retries=3, base_delay_ms=30_000)), clock=clock)

    task = start(rig, "go", ctx)
    await within(clock.waiting.wait())
    watch = await rig.lane.watch(ctx)
    watch.close()
    assert watch.snapshot.operation is not None
    assert watch.snapshot.operation.retry is not None
    await rig.lane.request_abort("user", ctx)
    outcome = settled(await within(task))

    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert outcome.result.final_assistant_entry_id is None
    assert len(rig.faux.requests) == 1
    assert rig.events.of(RetryStart) == []
    assert shape(await messages(rig.lane, ctx)) == ["user:go"]


# -- configuration failures (HA-23) -------------------------------------------------------------


async def test_a_model_not_in_the_registry_fails_the_run_in_band(store: Store, ctx: Context) -> None:
    """HA-23, HA-26: a captured model the registry does not know fails the run with
    `model_unavailable {provider, model_id}` before any provider request: no assistant entry, no
    usage row, no reserved ids."""
    rig = await start_rig(store, ctx, ["never asked"], model=GONE)

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "failed"
    assert outcome.result.error is not None
    assert outcome.result.error.code == "model_unavailable"
    assert outcome.result.error.details == {"provider": "gone", "model_id": "retired-model"}
    assert outcome.result.final_assistant_entry_id is None
    assert shape(await messages(rig.lane, ctx)) == ["user:go"]
    assert rig.faux.requests == []
    assert rig.events.of(TurnStart) == []
    assert rig.events.of(UsageRecorded) == []
    await rig.harness.close(ctx)
    assert await rig.session.usage_ledger(ctx) == []


async def test_an_active_tool_without_an_implementation_fails_the_run_in_band(store: Store, ctx: Context) -> None:
    """HA-23: an active tool the harness has no implementation of fails the run with
    `configured_tools_unavailable {tools}` before any provider request."""
    probe = ProbeTool()
    rig = await start_rig(store, ctx, ["never asked"], tools=[probe.tool], active_tools=["probe", "missing"])

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "failed"
    assert outcome.result.error is not None
    assert outcome.result.error.code == "configured_tools_unavailable"
    assert outcome.result.error.details == {"tools": ["missing"]}
    assert shape(await messages(rig.lane, ctx)) == ["user:go"]
    assert rig.faux.requests == []
    await rig.harness.close(ctx)
    assert await rig.session.usage_ledger(ctx) == []


async def test_a_tool_configured_away_during_a_batch_fails_the_next_step_in_band(store: Store, ctx: Context) -> None:
    """HA-23: an active tool configured without an implementation while a batch runs fails the
    next step before its request, though nothing else stood between the results and that step
    (the commit of the results would otherwise carry its intent): the result is kept, no second
    request is sent and no intent is reserved for it."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await start_rig(store, ctx, [reply(call("a")), "never asked"], tools=[probe.tool])

    task = start(rig, "go", ctx)
    await probe.wait_started("a")
    await rig.lane.set_active_tools(["probe", "missing"], ctx)
    gate.set()
    outcome = settled(await within(task))

    assert outcome.result.outcome == "failed"
    assert outcome.result.error is not None
    assert outcome.result.error.code == "configured_tools_unavailable"
    assert outcome.result.error.details == {"tools": ["missing"]}
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:+probe", "result:call-a"]
    assert len(rig.faux.requests) == 1
    assert len(rig.events.of(TurnStart)) == 1


async def test_a_thinking_level_the_model_does_not_take_still_runs(store: Store, ctx: Context) -> None:
    """Issue 12: `xhigh` on a model without reasoning is kept as set and the run settles
    `completed`, its operation closed: the request carries the level and the adapter sends what the
    model takes (here, nothing)."""
    rig = await start_rig(store, ctx, ["thought enough"])
    await rig.lane.set_thinking_level("xhigh", ctx)

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "completed"
    assert (await rig.lane.inspect_execution(ctx)).current is None
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:thought enough"]
    assert [request.options.thinking_level for request in rig.faux.requests] == ["xhigh"]
    assert FAUX_MODEL.nearest_thinking_level("xhigh") == "off"
    await rig.harness.close(ctx)


# -- step ceiling -------------------------------------------------------------------------------


async def test_step_ceiling_aborts_a_run_that_keeps_calling_tools(store: Store, ctx: Context) -> None:
    """Issue 5 item 2: with `step_ceiling=2`, a model that always calls a tool is stopped after
    its second step: the run settles `aborted` with cause `step_ceiling`, every call answered; the
    cause reaches the settlement and its events (CE-7)."""
    probe = ProbeTool()

    def always_call(request: FauxRequest) -> FauxReply:
        return reply(call(str(request.number)))

    rig = await start_rig(store, ctx, always_call, tools=[probe.tool], drive=DriveSettings(step_ceiling=2))

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "step_ceiling")
    assert len(rig.faux.requests) == 2
    assert probe.runs == [{"key": "1"}, {"key": "2"}]
    assert shape(await messages(rig.lane, ctx)) == [
        "user:go", "assistant:+probe", "result:call-1", "assistant:+probe", "result:call-2"]
    assert [e.cause for e in rig.events.of(OperationAbort)] == ["step_ceiling"]


# -- deferred replies (HA-27) -------------------------------------------------------------------


async def test_a_deferred_reply_suspends_and_resume_polls_it_once(store: Store, ctx: Context) -> None:
    """HA-27: a deferred reply makes drive return `Suspended` (reason `deferred`) with the handle;
    the operation stays open; `resume` polls once and settles with the late answer."""
    rig = await start_rig(store, ctx, [deferred("job-1", "Working on it.")],
                          polls={"job-1": ["The late answer."]})

    first = await within(rig.lane.prompt("go", None, ctx))

    assert isinstance(first, Suspended)
    assert (first.reason, first.deferred.id) == ("deferred", "job-1")
    info = await rig.lane.inspect_execution(ctx)
    assert info.current is not None
    assert (info.current.id, info.current.status) == (first.operation_id, "open")
    watch = await rig.lane.watch(ctx)
    watch.close()
    assert watch.snapshot.operation is not None
    assert watch.snapshot.operation.deferred is not None
    assert watch.snapshot.operation.deferred.handle.id == "job-1"
    assert [e.deferred.id for e in rig.events.of(RunSuspend)] == ["job-1"]

    second = settled(await within(rig.lane.resume(ctx)))

    assert (second.operation_id, second.result.outcome) == (first.operation_id, "completed")
    assert [p.deferred_id for p in rig.faux.polls] == ["job-1"]
    assert len(rig.faux.requests) == 1
    assert len(rig.events.of(RunResume)) == 1
    entries = await branch(rig.lane, ctx)
    assert shape([e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]) == [
        "user:go", "assistant:Working on it.", "assistant:The late answer."]
    assert second.result.final_assistant_entry_id == entries[-1].id


async def test_abort_while_suspended_cancels_the_deferred_request(store: Store, ctx: Context) -> None:
    """HA-27, issue 5 item 5: an abort of a suspended run cancels the provider's deferred request
    and settles `aborted` without polling it."""
    rig = await start_rig(store, ctx, [deferred("job-1")], polls={"job-1": ["never fetched"]})
    first = await within(rig.lane.prompt("go", None, ctx))
    assert isinstance(first, Suspended)

    await rig.lane.request_abort("user", ctx)
    outcome = settled(await within(rig.lane.drive(first.operation_id, ctx)))

    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert rig.faux.cancelled == ["job-1"]
    assert rig.faux.polls == []


async def test_a_plain_drive_does_not_poll_and_a_poll_still_pending_suspends_again(
    store: Store, ctx: Context
) -> None:
    """HA-27: drive (not resume) of a suspended run returns `Suspended` without polling; a poll
    that is still pending suspends again with the poll counted; the next resume gets the answer."""
    rig = await start_rig(store, ctx, [deferred("job-1")], polls={"job-1": [deferred("job-1"), "Finally."]})
    first = await within(rig.lane.prompt("go", None, ctx))
    assert isinstance(first, Suspended)

    again = await within(rig.lane.drive(first.operation_id, ctx))
    assert isinstance(again, Suspended)
    assert rig.faux.polls == []

    pending = await within(rig.lane.resume(ctx))
    assert isinstance(pending, Suspended)
    assert (pending.operation_id, pending.deferred.id) == (first.operation_id, "job-1")
    assert [e.poll for e in rig.events.of(RunSuspend)] == [0, 1]

    done = settled(await within(rig.lane.resume(ctx)))
    assert done.result.outcome == "completed"
    assert len(rig.faux.polls) == 2
    assert shape(await messages(rig.lane, ctx))[-1] == "assistant:Finally."


# -- fencing ------------------------------------------------------------------------------------


async def test_drive_with_another_operation_id_is_a_mismatch(store: Store, ctx: Context) -> None:
    """Issue 5 item 1: drive is fenced: an id that is not the lane's current operation (nor its
    last settled one) raises `OperationMismatch` and starts nothing."""
    rig = await start_rig(store, ctx, ["never asked"])
    accepted = await rig.lane.accept(PromptRequest(text="go"), ctx)

    with pytest.raises(OperationMismatch) as raised:
        await rig.lane.drive("some-other-operation", ctx)

    assert raised.value.code == "operation_mismatch"
    assert raised.value.details["current_operation_id"] == accepted.operation_id
    info = await rig.lane.inspect_execution(ctx)
    assert info.current is not None
    assert (info.current.id, info.current.status) == (accepted.operation_id, "open")
    assert rig.faux.requests == []


async def test_drive_of_a_settled_operation_returns_its_result(store: Store, ctx: Context) -> None:
    """Issue 5 item 1: driving an operation that already settled returns its result again and
    runs nothing."""
    rig = await start_rig(store, ctx, ["Only once."])
    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    again = settled(await within(rig.lane.drive(outcome.operation_id, ctx)))

    assert again.result == outcome.result
    assert len(rig.faux.requests) == 1


async def test_concurrent_drives_of_one_operation_share_one_run(store: Store, ctx: Context) -> None:
    """Issue 5 item 1, HA-6: the operation is `open` after acceptance and `running` while a drive
    owns it; two concurrent drives of it share one run (the provider is asked once) and get the
    same outcome."""
    gate = asyncio.Event()
    pause = delay(gate)
    rig = await start_rig(store, ctx, [reply("Shared ", pause, "reply.")])
    accepted = await rig.lane.accept(PromptRequest(text="go"), ctx)
    before = await rig.lane.inspect_execution(ctx)
    assert before.current is not None
    assert before.current.status == "open"

    loop = asyncio.get_running_loop()
    first = loop.create_task(rig.lane.drive(accepted.operation_id, ctx))
    second = loop.create_task(rig.lane.drive(accepted.operation_id, ctx))
    await within(pause.reached.wait())
    during = await rig.lane.inspect_execution(ctx)
    assert during.current is not None
    assert during.current.status == "running"
    gate.set()
    one, two = settled(await within(first)), settled(await within(second))

    assert one == two
    assert one.result.outcome == "completed"
    assert len(rig.faux.requests) == 1
    assert len(assistants(await messages(rig.lane, ctx))) == 1
    assert len(rig.events.of(RunEnd)) == 1
    after = await rig.lane.inspect_execution(ctx)
    assert after.current is None


async def test_cancelling_the_drive_context_stops_waiting_but_does_not_abort(store: Store, ctx: Context) -> None:
    """HA-22, issue 5 item 1: cancelling the Context of a drive call makes that call stop waiting;
    the run goes on, and a later drive of the same id gets its outcome."""
    gate = asyncio.Event()
    pause = delay(gate)
    rig = await start_rig(store, ctx, [reply("Still ", pause, "here.")])
    accepted = await rig.lane.accept(PromptRequest(text="go"), ctx)
    caller = Context({"caller": "impatient"})

    waiting = asyncio.get_running_loop().create_task(rig.lane.drive(accepted.operation_id, caller))
    await within(pause.reached.wait())
    caller.cancel("gave up")
    with pytest.raises(Cancelled):
        await within(waiting)
    info = await rig.lane.inspect_execution(ctx)
    assert info.current is not None
    assert info.current.status == "running"
    gate.set()
    outcome = settled(await within(rig.lane.drive(accepted.operation_id, ctx)))

    assert (outcome.result.outcome, outcome.result.abort_cause) == ("completed", None)
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:Still here."]
    assert len(rig.faux.requests) == 1


# -- prompt (HA-30) -----------------------------------------------------------------------------


async def test_prompt_has_exactly_two_call_shapes(store: Store, ctx: Context) -> None:
    """HA-30: `prompt(text, images, context)` and `prompt(messages, context)` (one message or a
    list); any other shape is refused before anything is written."""
    image = ImageContent(data="aGVsbG8=", mime_type="image/png")
    rig = await start_rig(store, ctx, ["one", "two", "three", "four"])

    for outcome in [
        await within(rig.lane.prompt("plain text", None, ctx)),
        await within(rig.lane.prompt("with a picture", [image], ctx)),
        await within(rig.lane.prompt(said("one message"), ctx)),
        await within(rig.lane.prompt([said("first"), said("second")], ctx)),
    ]:
        assert settled(outcome).result.outcome == "completed"

    requests = rig.requests()
    assert shape(requests[0]) == ["user:plain text"]
    assert requests[1][-1] == UserMessage(content=[TextContent(text="with a picture"), image],
                                          timestamp=requests[1][-1].timestamp)
    assert shape(requests[2])[-1] == "user:one message"
    assert shape(requests[3])[-2:] == ["user:first", "user:second"]
    tip = rig.lane.tip_id
    with pytest.raises(InvalidMessage):
        await rig.lane.prompt("text without images", ctx)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage):
        await rig.lane.prompt(ctx)  # type: ignore[call-overload]
    with pytest.raises(InvalidMessage):
        await rig.lane.prompt("text", None, None, ctx)  # type: ignore[call-overload]
    assert rig.lane.tip_id == tip
    assert len(rig.faux.requests) == 4


async def test_prompt_takes_its_two_shapes_by_name_too(store: Store, ctx: Context) -> None:
    """HA-30 with keywords: `text=` (images may be left out), `messages=`, or positions then names;
    naming both shapes at once is refused before anything is written."""
    rig = await start_rig(store, ctx, ["one", "two", "three", "four"])
    for outcome in [
        await within(rig.lane.prompt(text="by name", context=ctx)),
        await within(rig.lane.prompt(text="with images", images=None, context=ctx)),
        await within(rig.lane.prompt("by position", None, context=ctx)),
        await within(rig.lane.prompt(messages=said("a message by name"), context=ctx)),
    ]:
        assert settled(outcome).result.outcome == "completed"
    assert [shape(request)[-1] for request in rig.requests()] == [
        "user:by name", "user:with images", "user:by position", "user:a message by name"]
    tip = rig.lane.tip_id
    with pytest.raises(InvalidMessage):
        await rig.lane.prompt(text="both", messages=said("shapes"), context=ctx)  # type: ignore[call-overload]
    with pytest.raises(InvalidMessage):
        await rig.lane.prompt("twice", text="named", context=ctx)  # type: ignore[call-overload]
    assert rig.lane.tip_id == tip


# -- watch (HA-14) ------------------------------------------------------------------------------


async def test_watch_during_streaming_shows_what_was_streamed_so_far(store: Store, ctx: Context) -> None:
    """HA-14, HA-9, issue 5 item 9: while the reply is paused mid-stream (a stalled network, a
    model thinking), the live presentation catches up with everything received so far (updates
    may be rate-bounded, but the last one is not dropped), and a watch shows it, status `running`."""
    gate = asyncio.Event()
    pause = delay(gate)
    rig = await start_rig(store, ctx, [reply("Thinking out loud ", pause, "and done.")])

    task = start(rig, "go", ctx)
    await within(pause.reached.wait())
    await rig.events.wait_for(MessageUpdate, lambda e: text(e.message) == "Thinking out loud ", timeout_s=2.0)
    watch = await rig.lane.watch(ctx)
    watch.close()
    gate.set()
    settled(await within(task))

    operation = watch.snapshot.operation
    assert operation is not None
    assert operation.status == "running"
    assert operation.streaming_message is not None
    assert text(operation.streaming_message) == "Thinking out loud "


async def test_watch_shows_running_tools_and_its_events_fold_to_a_fresh_snapshot(store: Store, ctx: Context) -> None:
    """HA-14, HA-9, HA-13: a watch during a blocked tool shows the call in `running_tools` with its
    args; a watch taken before the run, folded with every event it buffered, equals a fresh
    snapshot after settlement."""
    probe = ProbeTool()
    gate = probe.gate("a")
    rig = await start_rig(store, ctx, [reply("Calling.", call("a")), "Finished."], tools=[probe.tool])
    watch = await rig.lane.watch(ctx)

    task = start(rig, "go", ctx)
    await probe.wait_started("a")
    during = await rig.lane.watch(ctx)
    during.close()
    assert during.snapshot.operation is not None
    assert during.snapshot.operation.streaming_message is None
    assert during.snapshot.operation.running_tools == (
        RunningTool(tool_call_id="call-a", tool_name="probe", args={"key": "a"}),)
    gate.set()
    settled(await within(task))

    folded = watch.snapshot
    deliveries = watch.buffered()
    watch.close()
    for delivery in deliveries:
        folded = reduce_lane_snapshot(folded, delivery.event)
    fresh = await rig.lane.watch(ctx)
    fresh.close()
    assert [e.id for e in folded.transcript] == [e.id for e in fresh.snapshot.transcript]
    for live, stored in zip(folded.transcript, fresh.snapshot.transcript, strict=True):
        assert live == stored, f"entry_added carried {live.seq=} for an entry stored with {stored.seq=}"
    assert folded == fresh.snapshot
    assert {d.event.type for d in deliveries} >= {"run_start", "tool_start", "tool_end", "run_end"}


# -- recovery after a crash ---------------------------------------------------------------------


def _generation(config: LaneConfig, prompt_id: str, *, max_attempts: int = 3) -> GenerationContext:
    return GenerationContext(step_id="step-1", trigger_entry_id=prompt_id, config=config, step=1,
                             max_attempts=max_attempts, base_delay_ms=1_000)


async def test_recovery_settles_an_effect_pending_reply_from_its_frames_then_retries(
    store: Store, ctx: Context
) -> None:
    """Issue 5 item 8, HA-24: a run that crashed while its reply streamed is settled, under the
    reserved response and usage ids, as an interrupted reply rebuilt from its frame pages (a side
    entry, its frames deleted); the step is then retried and completes."""
    config = LaneConfig(model=FAUX)

    def crashed(m: SessionMutator, prompt_id: str) -> tuple[OperationState, str]:
        frames = addresses.assistant_frames(CRASHED_OP, "resp-reserved")
        m.append(frames, frame_page(StartEvent(api="faux", provider="faux", model="faux"),
                                    TextStartEvent(content_index=0), TextDeltaEvent(content_index=0, delta="Half of ")))
        m.append(frames, frame_page(TextDeltaEvent(content_index=0, delta="an answer")))
        state = AssistantEffectPending(generation=_generation(config, prompt_id), attempt=1,
                                       response_entry_id="resp-reserved", usage_id="usage-reserved")
        return state, prompt_id

    crash = await write_crash(store, ctx, config, crashed)
    rig = await start_rig(store, ctx, ["Recovered answer."], session=crash.session)
    assert [(o.operation_id, o.kind, o.aborting) for o in rig.open] == [(CRASHED_OP, "run", False)]

    outcome = settled(await within(rig.lane.resume(ctx)))

    assert (outcome.operation_id, outcome.result.outcome) == (CRASHED_OP, "completed")
    entries = await branch(rig.lane, ctx)
    assert shape([e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]) == [
        "user:go", "assistant:Recovered answer."]
    assert entries[-1].parent_id == crash.prompt_id
    assert [shape(r) for r in rig.requests()] == [["user:go"]]
    assert [e.attempt for e in rig.events.of(RetryScheduled)] == [2]
    assert [(e.attempt, e.success) for e in rig.events.of(RetryEnd)] == [(2, True)]

    await rig.harness.close(ctx)
    interrupted = await rig.session.entry("resp-reserved", ctx)
    assert interrupted is not None
    assert interrupted.parent_id == crash.prompt_id
    assert isinstance(interrupted.payload, MessagePayload)
    message = interrupted.payload.message
    assert isinstance(message, AssistantMessage)
    assert (text(message), message.stop_reason) == ("Half of an answer", "error")
    assert message.error_message is not None
    assert "interrupted" in message.error_message
    ledger = await rig.session.usage_ledger(ctx)
    assert next((row.id, row.entry_id) for row in ledger) == ("usage-reserved", "resp-reserved")
    assert [row.entry_id for row in ledger][1:] == [entries[-1].id]
    assert await rig.session.read_list(addresses.assistant_frames(CRASHED_OP, "resp-reserved"), ctx) == []


async def test_recovery_of_a_tool_batch_replays_only_safe_calls_and_keeps_staged_results(
    store: Store, ctx: Context
) -> None:
    """Issue 5 item 8, HA-25, HA-28: after a crash in the tools phase, an effect-pending call of a
    `replay="never"` tool gets an interrupted result without running; one of a `replay="safe"`
    tool runs again with its stored args (shown as running, the outcome-ready call not); an
    outcome-ready call keeps its staged result; all are placed in source order."""
    never = ProbeTool("never_tool", replay="never")
    safe = ProbeTool("safe_tool", replay="safe", details={"replayed": True})
    staged = ProbeTool("staged_tool")
    safe_gate = safe.gate("effective")
    config = LaneConfig(model=FAUX, active_tools=["never_tool", "safe_tool", "staged_tool"])
    staged_result = ToolResultMessage(tool_call_id="call-t", tool_name="staged_tool",
                                      content=[TextContent(text="staged before the crash")], details={"kept": True})

    def crashed(m: SessionMutator, prompt_id: str) -> tuple[OperationState, str]:
        reply_message = AssistantMessage(
            content=[TextContent(text="Working."),
                     ToolCall(id="call-n", name="never_tool", arguments={"key": "n"}),
                     ToolCall(id="call-s", name="safe_tool", arguments={"key": "s"}),
                     ToolCall(id="call-t", name="staged_tool", arguments={"key": "t"})],
            api="faux", provider="faux", model="faux", stop_reason="tool_use", timestamp=0)
        m.insert_entry(MessagePayload(message=reply_message), parent_id=prompt_id, entry_id="assistant-1")
        stored: list[dict[str, JsonValue]] = [{"key": "n"}, {"key": "effective"}, {"key": "t"}]  # 2: as approved
        for index, args in enumerate(stored, start=1):
            m.set(addresses.tool_args(CRASHED_OP, "turn-1", index), args)
        m.set(addresses.pending_entry("result-t"), PendingMessage(message=staged_result))
        calls = [
            ToolCallState(source_index=1, result_entry_id="result-n", status="effect_pending", replay="never"),
            ToolCallState(source_index=2, result_entry_id="result-s", status="effect_pending", replay="safe"),
            ToolCallState(source_index=3, result_entry_id="result-t", status="outcome_ready", replay="never"),
        ]
        batch = ToolBatch(assistant_entry_id="assistant-1", turn_id="turn-1", config=config, calls=calls)
        return RunTools(batch=batch), "assistant-1"

    crash = await write_crash(store, ctx, config, crashed)
    rig = await start_rig(store, ctx, ["Recovered after tools."], session=crash.session,
                          tools=[never.tool, safe.tool, staged.tool])

    task = asyncio.get_running_loop().create_task(rig.lane.resume(ctx))
    await safe.wait_started("effective")
    watch = await rig.lane.watch(ctx)
    watch.close()
    assert watch.snapshot.operation is not None
    assert [t.tool_call_id for t in watch.snapshot.operation.running_tools] == ["call-s"]
    safe_gate.set()
    outcome = settled(await within(task))

    assert outcome.result.outcome == "completed"
    assert (never.runs, safe.runs, staged.runs) == ([], [{"key": "effective"}], [])
    entries = await branch(rig.lane, ctx)
    transcript = [e.payload.message for e in entries if isinstance(e.payload, MessagePayload)]
    assert shape(transcript) == ["user:go", "assistant:Working.+never_tool+safe_tool+staged_tool",
                                 "result:call-n", "result:call-s", "result:call-t", "assistant:Recovered after tools."]
    assert [e.id for e in entries[2:5]] == ["result-n", "result-s", "result-t"]
    interrupted, replayed, kept = results(transcript)
    assert (interrupted.is_error, interrupted.details) == (True, None)
    assert "interrupted" in text(interrupted)
    assert (text(replayed), replayed.is_error, replayed.details) == ("safe_tool:effective", False, {"replayed": True})
    assert (text(kept), kept.details) == ("staged before the crash", {"kept": True})
    assert shape(rig.requests()[0])[-3:] == ["result:call-n", "result:call-s", "result:call-t"]


async def test_recovery_of_a_deferred_reply_whose_model_is_gone_fails_without_a_settlement(
    store: Store, ctx: Context
) -> None:
    """HA-24, HA-23: a suspended deferred reply whose model is no longer configured is abandoned
    through a configuration failure `model_unavailable`: nothing is polled, no reply or usage row
    is invented."""
    config = LaneConfig(model=GONE)
    handle = AssistantMessage(content=[TextContent(text="Queued.")], api="faux", provider="gone",
                              model="retired-model", stop_reason="deferred", deferred_id="job-9", timestamp=0)

    def crashed(m: SessionMutator, prompt_id: str) -> tuple[OperationState, str]:
        m.insert_entry(MessagePayload(message=handle), parent_id=prompt_id, entry_id="deferred-source")
        state = DeferredSuspended(generation=_generation(config, prompt_id), source_entry_id="deferred-source")
        return state, "deferred-source"

    crash = await write_crash(store, ctx, config, crashed)
    rig = await start_rig(store, ctx, ["never asked"], polls={"job-9": ["never fetched"]}, session=crash.session)

    outcome = settled(await within(rig.lane.resume(ctx)))

    assert outcome.result.outcome == "failed"
    assert outcome.result.error is not None
    assert outcome.result.error.code == "model_unavailable"
    assert outcome.result.error.details == {"provider": "gone", "model_id": "retired-model"}
    assert (rig.faux.polls, rig.faux.requests) == ([], [])
    assert shape(await messages(rig.lane, ctx)) == ["user:go", "assistant:Queued."]
    await rig.harness.close(ctx)
    assert await rig.session.usage_ledger(ctx) == []


def _half_answer(m: SessionMutator, response_id: str) -> None:
    frames = addresses.assistant_frames(CRASHED_OP, response_id)
    m.append(frames, frame_page(StartEvent(api="faux", provider="gone", model="retired-model"),
                                TextStartEvent(content_index=0), TextDeltaEvent(content_index=0, delta="Half")))


async def test_recovery_settles_an_effect_pending_reply_before_its_model_fails_the_run(
    store: Store, ctx: Context
) -> None:
    """HA-24, HA-23: a restored effect-pending request whose model is gone is first settled under
    its reserved ids (the interrupted partial reply, its usage row, frames deleted); only the
    retry then fails the run with `model_unavailable`."""
    config = LaneConfig(model=GONE)

    def crashed(m: SessionMutator, prompt_id: str) -> tuple[OperationState, str]:
        _half_answer(m, "resp-reserved")
        return AssistantEffectPending(generation=_generation(config, prompt_id), attempt=1,
                                      response_entry_id="resp-reserved", usage_id="usage-reserved"), prompt_id

    crash = await write_crash(store, ctx, config, crashed)
    rig = await start_rig(store, ctx, ["never asked"], session=crash.session)

    outcome = settled(await within(rig.lane.resume(ctx)))

    assert outcome.result.outcome == "failed"
    assert outcome.result.error is not None
    assert outcome.result.error.code == "model_unavailable"
    assert rig.faux.requests == []
    await rig.harness.close(ctx)
    interrupted = await rig.session.entry("resp-reserved", ctx)
    assert interrupted is not None
    assert isinstance(interrupted.payload, MessagePayload)
    assert text(interrupted.payload.message) == "Half"
    assert [(row.id, row.entry_id) for row in await rig.session.usage_ledger(ctx)] == [
        ("usage-reserved", "resp-reserved")]
    assert await rig.session.read_list(addresses.assistant_frames(CRASHED_OP, "resp-reserved"), ctx) == []


async def test_recovery_of_a_deferred_poll_whose_model_is_gone_abandons_it_without_a_settlement(
    store: Store, ctx: Context
) -> None:
    """HA-24: a poll of a deferred reply that was in flight at the crash, whose model is gone, is
    abandoned through a configuration failure `model_unavailable`: its frames are deleted and
    nothing is written under its reserved response and usage ids."""
    config = LaneConfig(model=GONE)
    handle = AssistantMessage(content=[], api="faux", provider="gone", model="retired-model",
                              stop_reason="deferred", deferred_id="job-9", timestamp=0)

    def crashed(m: SessionMutator, prompt_id: str) -> tuple[OperationState, str]:
        m.insert_entry(MessagePayload(message=handle), parent_id=prompt_id, entry_id="deferred-source")
        _half_answer(m, "poll-reserved")
        state = DeferredEffectPending(generation=_generation(config, prompt_id), source_entry_id="deferred-source",
                                      poll=1, response_entry_id="poll-reserved", usage_id="poll-usage")
        return state, "deferred-source"

    crash = await write_crash(store, ctx, config, crashed)
    rig = await start_rig(store, ctx, ["never asked"], session=crash.session)

    outcome = settled(await within(rig.lane.resume(ctx)))

    assert outcome.result.outcome == "failed"
    assert outcome.result.error is not None
    assert outcome.result.error.code == "model_unavailable"
    assert rig.faux.polls == []
    await rig.harness.close(ctx)
    assert await rig.session.entry("poll-reserved", ctx) is None
    assert await rig.session.usage_ledger(ctx) == []
    assert await rig.session.read_list(addresses.assistant_frames(CRASHED_OP, "poll-reserved"), ctx) == []


# -- hooks --------------------------------------------------------------------------------------


async def test_between_steps_messages_go_into_the_very_next_request(store: Store, ctx: Context) -> None:
    """Issue 5 item 7: `between_steps` is awaited after a tool batch settles and before the next
    request; the messages it returns are placed and sent in that very request."""
    probe = ProbeTool()
    calls: list[str | None] = []

    async def between(lane: Lane, context: Context) -> list[Message]:
        calls.append(lane.tip_id)
        return [CustomMessage(custom_type="note", content="the build is green", display=False)]

    rig = await start_rig(store, ctx, [reply(call("a")), "Noted."], tools=[probe.tool],
                          hooks=RunHooks(between_steps=between))
    settled(await within(rig.lane.prompt("go", None, ctx)))

    assert len(calls) == 1  # not before the first step, not at the end
    assert shape(rig.requests()[1]) == ["user:go", "assistant:+probe", "result:call-a", "custom:the build is green"]
    assert calls[0] == (await branch(rig.lane, ctx))[2].id  # called once the result was placed
    assert shape(await messages(rig.lane, ctx)) == [
        "user:go", "assistant:+probe", "result:call-a", "custom:the build is green", "assistant:Noted."]


async def test_before_run_end_appends_a_custom_entry_placed_before_settlement(store: Store, ctx: Context) -> None:
    """Issue 5 item 7, CE-23: `before_run_end` runs inside the run; a custom entry it appends is
    placed (parented on the final reply) before the run settles, and asks the model nothing."""

    async def before_end(lane: Lane, context: Context) -> None:
        await lane.append_custom("blocks", {"v": 1, "blocks": []}, context)

    rig = await start_rig(store, ctx, ["The answer."], hooks=RunHooks(before_run_end=before_end))
    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    entries = await branch(rig.lane, ctx)
    custom = entries[-1]
    assert isinstance(custom.payload, CustomPayload)
    assert (custom.payload.custom_type, custom.payload.data) == ("blocks", {"v": 1, "blocks": []})
    assert custom.parent_id == entries[-2].id == outcome.result.final_assistant_entry_id
    assert outcome.result.tip_id == custom.id
    assert len(rig.faux.requests) == 1
    added = [i for i, e in enumerate(rig.events.events) if isinstance(e, EntryAdded) and e.entry.id == custom.id]
    ended = [i for i, e in enumerate(rig.events.events) if isinstance(e, RunEnd)]
    assert added
    assert ended
    assert added[0] < ended[0]


async def test_transform_context_receives_errored_and_aborted_replies(store: Store, ctx: Context) -> None:
    """Issue 5 item 2, CE-8: the messages handed to `transform_context` keep errored and aborted
    replies; what the hook returns is what the provider receives."""
    seen: list[list[Message]] = []

    async def transform(items: list[Message], context: Context) -> list[Message]:
        seen.append(list(items))
        return [m for m in items if not (isinstance(m, AssistantMessage) and m.stop_reason in ("error", "aborted"))]

    pause = delay(asyncio.Event())
    rig = await start_rig(store, ctx, [failure("invalid_request", "the model broke", "Half a thought"),
                                       reply("Cut ", pause, "off"), "Third time lucky."],
                          hooks=RunHooks(transform_context=transform))

    first = settled(await within(rig.lane.prompt("first", None, ctx)))
    assert first.result.outcome == "failed"
    task = start(rig, "second", ctx)
    await within(pause.reached.wait())
    await rig.lane.request_abort("user", ctx)
    assert settled(await within(task)).result.outcome == "aborted"
    settled(await within(rig.lane.prompt("third", None, ctx)))

    last = seen[-1]
    assert shape(last) == ["user:first", "assistant:Half a thought", "user:second", "assistant:Cut ", "user:third"]
    assert [m.stop_reason for m in assistants(last)] == ["error", "aborted"]
    assert shape(rig.requests()[-1]) == ["user:first", "user:second", "user:third"]


async def test_turn_end_carries_every_result_of_a_batch_placed_over_several_commits(
    store: Store, ctx: Context
) -> None:
    """Parallel results are placed as their prefix completes, in separate commits here; the
    batch's `turn_end` still lists all of them, in source order."""
    probe = ProbeTool()
    late = probe.gate("b")
    rig = await start_rig(store, ctx, [reply(tool_call("probe", {"key": "a"}), tool_call("probe", {"key": "b"})),
                                       "done"], tools=[probe.tool])
    driving = asyncio.ensure_future(rig.lane.prompt("go", None, ctx))
    await within(rig.events.wait_for(ToolEnd, lambda e: e.result.content[0].text == "probe:a"))  # type: ignore[union-attr]
    late.set()

    settled = await within(driving)

    assert isinstance(settled, Settled)
    [turn] = [e for e in rig.events.of(TurnEnd) if e.tool_results]
    assert [r.content[0].text for r in turn.tool_results] == ["probe:a", "probe:b"]  # type: ignore[union-attr]
