"""Delegation through `ConversationService` (CE-18): the `delegate` tool runs a sub-agent on a lane
of its own in the conversation's session, in the foreground (its reply is the tool result) or the
background (its result reaches the parent as a hidden `harness.subagent-result` message with a
finish marker, and a delegation row where the parent received it, live, after a reload and in
the display read); a `workflow` runs several, with a tally; an aborted parent aborts its children
with cause `parent`; a conversation reopened from the journal mid-delegation completes it exactly
once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from conversation_helpers import faux_service, rows_of, transcript
from drive_helpers import FAUX, ProbeTool, text, within
from harness.context import Context
from harness.conversation import (
    SUBAGENT_RESULT_TYPE,
    AgentDefinition,
    AgentFinish,
    AgentRegistry,
    Conversation,
    ConversationService,
    ConversationSetup,
    DelegationFinished,
    DelegationRow,
    Interrupted,
    NodeTally,
    WorkflowFinish,
)
from harness.conversation.delegation import SubagentResult, subagent_result_of
from harness.errors import InvalidInput
from harness.messages import CustomMessage, Message, ToolResultMessage
from harness.providers import FauxProvider
from harness.providers.faux import FauxDelay, FauxReply, FauxRequest, delay, failure, reply, tool_call
from harness.runtime import DriveSettings, HarnessClosed, QueueUpdate, Settled
from harness.session import LaneConfig, Store

ALICE = "alice"
CONFIG = LaneConfig(model=FAUX, active_tools=["probe", "delegate", "workflow"])
READER = AgentDefinition(name="reader", description="reads things", instructions="READER: read, then report.",
                         tools=("probe",))
WRITER = AgentDefinition(name="writer", description="writes things", instructions="WRITER: write it down.")
LOOPER = AgentDefinition(name="looper", description="never stops", instructions="LOOPER: keep probing.")
AGENTS = AgentRegistry([READER, WRITER, LOOPER])

Script = list[FauxReply | str] | Callable[[FauxRequest], FauxReply | str]


class Scripts:
    """Replies by who asks: each agent by its instructions (the system prompt its lane runs with),
    the parent by anything else."""

    def __init__(self, parent: Sequence[FauxReply | str], **agents: Script) -> None:
        self.parent = list(parent)
        self.agents = {f"{name.upper()}:": script for name, script in agents.items()}
        self.asked: dict[str, list[FauxRequest]] = {}

    def __call__(self, request: FauxRequest) -> FauxReply | str:
        prompt = request.request.system_prompt or ""
        who = next((key for key in self.agents if prompt.startswith(key)), "parent")
        self.asked.setdefault(who.rstrip(":").lower(), []).append(request)
        script = self.parent if who == "parent" else self.agents[who]
        return script(request) if callable(script) else script.pop(0)


def service(store: Store, scripts: Scripts, probe: ProbeTool | None = None, *,
            drive: DriveSettings | None = None) -> tuple[ConversationService, FauxProvider]:
    setup = ConversationSetup(drive=drive or DriveSettings(frame_interval_s=0), agents=AGENTS)
    return faux_service(store, scripts, tools=[probe or ProbeTool()], setup=setup)


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled)
    return outcome


def results_of(messages: Sequence[Message]) -> list[tuple[str, SubagentResult]]:
    return [(text(m), result) for m in messages if (result := subagent_result_of(m)) is not None]


def tool_results(messages: Sequence[Message], name: str) -> list[ToolResultMessage]:
    return [m for m in messages if isinstance(m, ToolResultMessage) and m.tool_name == name]


def child_lanes(conversation: Conversation) -> list[str]:
    return sorted(info.name for info in conversation.lanes() if info.name != "main")


async def child_transcript(conversation: Conversation, lane: str, ctx: Context) -> list[Message]:
    watch = await conversation.watch(ctx, lane=lane)
    watch.close()
    return [entry.payload.message for entry in watch.snapshot.transcript if hasattr(entry.payload, "message")]


async def next_row(conversation_watch: object) -> DelegationFinished:
    async def first() -> DelegationFinished:
        async for event in conversation_watch:  # type: ignore[attr-defined]
            if isinstance(event, DelegationFinished):
                return event
        raise AssertionError("the watch ended without a delegation row")

    return await within(first())


# -- foreground ------------------------------------------------------------------------------------


async def test_a_foreground_delegation_is_its_tool_call_run_on_a_lane_of_its_own(store: Store, ctx: Context) -> None:
    """The child runs on its own lane with its agent's instructions and tools; its final reply is
    the tool result, and the parent has no result message and no row (CE-18)."""
    scripts = Scripts([reply(tool_call("delegate", {"agent": "reader", "task": "Read the notes\nand sum up"})),
                       "The reader says hi."], reader=["The notes say hi."])
    conversations, _ = service(store, scripts)
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    outcome = settled(await within(conversations.send(ALICE, conversation.id, "delegate it", ctx)))

    assert outcome.result.outcome == "completed"
    messages = await transcript(conversation, ctx)
    [result] = tool_results(messages, "delegate")
    assert text(result) == "The notes say hi."
    assert not result.is_error
    assert results_of(messages) == []
    watch = await conversation.watch(ctx)
    watch.close()
    assert watch.delegations == []
    [lane] = child_lanes(conversation)
    assert lane.endswith(f"/{result.tool_call_id}")
    child = await child_transcript(conversation, lane, ctx)
    assert [text(m) for m in child] == ["Read the notes\nand sum up", "The notes say hi."]
    [asked] = scripts.asked["reader"]
    assert asked.request.system_prompt == READER.instructions
    assert [tool.name for tool in asked.request.tools] == ["probe"]
    assert {tool.name for tool in scripts.asked["parent"][0].request.tools} == {"probe", "delegate", "workflow"}
    await conversations.close_all(ctx)


# -- background ------------------------------------------------------------------------------------


async def test_a_background_result_reaches_the_idle_parent_with_its_marker_live_and_after_a_reload(
        store: Store, ctx: Context) -> None:
    """The call answers with a job id at once; the finished child's result is one hidden
    subagent-result message on the parent's branch whose details carry the finish marker, its row
    published live and derived again after the conversation is reopened; the model reads it in
    the next request, and no turn started for it (CE-18)."""
    gate = asyncio.Event()
    scripts = Scripts([reply(tool_call("delegate", {"agent": "writer", "task": "Find the bug\nin parser.py",
                                                    "background": True})),
                       "It runs in the background.", "Noted: it is fixed."],
                      writer=[reply(delay(gate), "Fixed the bug.")])
    conversations, _ = service(store, scripts)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "find it", ctx)))
    [started] = tool_results(await transcript(conversation, ctx), "delegate")
    assert "Started background job" in text(started)
    assert started.details is not None

    watch = await conversation.watch(ctx)
    gate.set()
    row = await next_row(watch)
    watch.close()

    marker = AgentFinish(agent="writer", task="Find the bug", outcome="completed")
    assert row.lane == "main"
    assert row.row.finish == marker
    messages = await transcript(conversation, ctx)
    [(content, details)] = results_of(messages)
    assert details.finish == marker
    assert details.job_id in text(started)
    assert "Fixed the bug." in content
    result_message = messages[-1]
    assert isinstance(result_message, CustomMessage)
    assert result_message.custom_type == SUBAGENT_RESULT_TYPE
    assert not result_message.display
    assert conversation.operation() is None  # no turn started for it
    assert len(scripts.asked["parent"]) == 2

    settled(await within(conversations.send(ALICE, conversation.id, "and?", ctx)))
    assert "Fixed the bug." in "".join(text(m) for m in scripts.asked["parent"][2].request.messages)

    await conversations.close_all(ctx)
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    again = await reopened.watch(ctx)
    again.close()
    assert again.delegations == [row.row]
    display = await conversations.read_display(ALICE, conversation.id, ctx)
    assert [r for r in display.rows if r.kind == "delegation"] == [DelegationRow(id=row.row.id, finish=marker)]
    await conversations.close_all(ctx)


async def test_a_result_while_the_parent_runs_waits_for_the_boundary_after_the_batch(
        store: Store, ctx: Context) -> None:
    """A child that ends while its parent's tool batch still runs leaves a pending write, placed
    after every result of the batch and read with the parent's next request (CE-11, CE-18)."""
    probe = ProbeTool()
    hold = probe.gate("slow")
    scripts = Scripts([reply(tool_call("delegate", {"agent": "writer", "task": "Quick one", "background": True}),
                             tool_call("probe", {"key": "slow"})),
                       "Both done."], writer=["Quick answer."])
    conversations, _ = service(store, scripts, probe)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    watch = await conversation.watch(ctx)
    turn = asyncio.create_task(conversations.send(ALICE, conversation.id, "go", ctx))

    async def pending_result() -> None:
        async for event in watch:
            if isinstance(event, QueueUpdate) and any(
                    isinstance(w.message, CustomMessage) and w.message.custom_type == SUBAGENT_RESULT_TYPE
                    for w in event.pending_writes):
                return

    await within(pending_result())
    hold.set()
    settled(await within(turn))
    watch.close()

    messages = await transcript(conversation, ctx)
    kinds = [type(m).__name__ for m in messages]
    assert kinds[-4:] == ["ToolResultMessage", "ToolResultMessage", "CustomMessage", "AssistantMessage"]
    assert "Quick answer." in "".join(text(m) for m in scripts.asked["parent"][1].request.messages)
    await conversations.close_all(ctx)


# -- workflows -------------------------------------------------------------------------------------


async def test_a_workflow_runs_its_nodes_on_lanes_of_their_own_and_tallies_how_they_ended(
        store: Store, ctx: Context) -> None:
    """Three nodes: one completes, one fails, one reaches the step ceiling; the background result's
    marker has the title, the outcome and the tally (CE-18)."""
    scripts = Scripts(
        [reply(tool_call("workflow", {"title": "Survey", "background": True, "nodes": [
            {"agent": "reader", "task": "Read it"}, {"agent": "writer", "task": "Write it"},
            {"agent": "looper", "task": "Loop"}]})), "Started."],
        reader=["Read: fine."], writer=[failure("invalid_request", "the writer's request was refused")],
        looper=lambda _: reply(tool_call("probe", {"key": "again"})))
    conversations, _ = service(store, scripts, drive=DriveSettings(frame_interval_s=0, step_ceiling=2))
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    watch = await conversation.watch(ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "survey", ctx)))
    row = await next_row(watch)
    watch.close()

    assert row.row.finish == WorkflowFinish(title="Survey", outcome="aborted",
                                            tally=NodeTally(completed=1, failed=1, aborted=1))
    assert len(child_lanes(conversation)) == 3
    [(content, _)] = results_of(await transcript(conversation, ctx))
    assert "1 completed, 1 failed, 1 aborted" in content
    assert "Read: fine." in content
    assert "the writer's request was refused" in content
    await conversations.close_all(ctx)


# -- aborts ----------------------------------------------------------------------------------------


async def test_aborting_the_parent_during_a_foreground_delegation_aborts_the_child_with_cause_parent(
        store: Store, ctx: Context) -> None:
    """CE-7, CE-18: the cancelled call stops its child, whose lane records `interrupted` (parent)."""
    streaming = delay(asyncio.Event())
    scripts = Scripts([reply(tool_call("delegate", {"agent": "writer", "task": "Take forever"}))],
                      writer=[reply("Working", streaming)])
    conversations, _ = service(store, scripts)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    turn = asyncio.create_task(conversations.send(ALICE, conversation.id, "go", ctx))
    await within(reached(streaming))

    await conversation.stop(ctx)

    assert settled(await within(turn)).result.outcome == "aborted"
    [lane] = child_lanes(conversation)
    last = (await conversation.inspect(ctx, lane=lane)).last_result
    assert last is not None
    assert last.outcome == "aborted"
    assert last.abort_cause == "parent"
    assert rows_of(await child_transcript(conversation, lane, ctx)) == [Interrupted(cause="parent")]
    [result] = tool_results(await transcript(conversation, ctx), "delegate")
    assert result.is_error
    assert "stopped" in text(result)
    await conversations.close_all(ctx)


async def test_aborting_the_parent_while_a_background_child_runs_aborts_it(store: Store, ctx: Context) -> None:
    """CE-18: the child is aborted with cause `parent`, and its result (aborted) still reaches the
    parent, placed when the parent's run settles."""
    probe = ProbeTool()
    probe.gate("slow")
    streaming = delay(asyncio.Event())
    scripts = Scripts([reply(tool_call("delegate", {"agent": "writer", "task": "Slow job", "background": True}),
                             tool_call("probe", {"key": "slow"}))],
                      writer=[reply("Partial", streaming)])
    conversations, _ = service(store, scripts, probe)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    watch = await conversation.watch(ctx)
    turn = asyncio.create_task(conversations.send(ALICE, conversation.id, "go", ctx))
    await within(reached(streaming))
    await probe.wait_started("slow")

    await conversation.stop(ctx)

    assert settled(await within(turn)).result.outcome == "aborted"
    row = await next_row(watch)
    watch.close()
    assert row.row.finish == AgentFinish(agent="writer", task="Slow job", outcome="aborted")
    [lane] = child_lanes(conversation)
    last = (await conversation.inspect(ctx, lane=lane)).last_result
    assert last is not None
    assert last.abort_cause == "parent"
    await conversations.close_all(ctx)


# -- reopened from the journal mid-delegation --------------------------------------------------------


async def test_a_foreground_delegation_reopened_mid_reply_completes_once(store: Store, ctx: Context) -> None:
    """The harness closes while the child streams (as a crash leaves it); reopened, the child lane's
    open run is listed, and resuming the parent replays the call, which resumes the same child
    rather than starting another; the delegation completes exactly once (CE-18, HA-25)."""
    streaming = delay(asyncio.Event())
    first = Scripts([reply(tool_call("delegate", {"agent": "writer", "task": "Long answer"}))],
                    writer=[reply("Half an ans", streaming)])
    conversations, _ = service(store, first)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    turn = asyncio.create_task(conversations.send(ALICE, conversation.id, "go", ctx))
    await within(reached(streaming))
    [lane] = child_lanes(conversation)
    child_operation = conversation.operation(lane)
    assert child_operation is not None
    await conversations.close(ALICE, conversation.id, ctx)
    with pytest.raises(HarnessClosed):
        await turn

    second = Scripts(["The parent is done."], writer=["The whole answer."])
    reopened_service, _ = service(store, second)
    reopened = await reopened_service.open(ALICE, conversation.id, ctx)
    assert {op.lane for op in reopened.open_operations} == {"main", lane}

    settled(await within(reopened.resume(ctx)))

    assert child_lanes(reopened) == [lane]
    last = (await reopened.inspect(ctx, lane=lane)).last_result
    assert last is not None
    assert last.operation_id == child_operation.id
    assert last.outcome == "completed"
    [result] = tool_results(await transcript(reopened, ctx), "delegate")
    assert text(result) == "The whole answer."
    assert len(second.asked["writer"]) == 1
    assert len(reopened.delegation.jobs if reopened.delegation else []) == 1
    await reopened_service.close_all(ctx)


async def test_a_background_job_reopened_mid_reply_runs_on_and_is_delivered_once(store: Store, ctx: Context) -> None:
    """Reopening the conversation resumes the background child by itself; its result is placed
    once, and a later reopening delivers nothing again (CE-18)."""
    streaming = delay(asyncio.Event())
    first = Scripts([reply(tool_call("delegate", {"agent": "writer", "task": "Background", "background": True})),
                     "Started it."], writer=[reply("Early", streaming)])
    conversations, _ = service(store, first)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "go", ctx)))
    await within(reached(streaming))
    await conversations.close(ALICE, conversation.id, ctx)

    second = Scripts([], writer=["Late but whole."])
    reopened_service, _ = service(store, second)
    reopened = await reopened_service.open(ALICE, conversation.id, ctx)
    watch = await reopened.watch(ctx)
    if not watch.delegations:
        await next_row(watch)
    watch.close()
    await reopened_service.close_all(ctx)

    third_service, _ = service(store, Scripts([]))
    third = await third_service.open(ALICE, conversation.id, ctx)
    assert third.delegation is not None
    await within(third.delegation.wait_background())  # a delivery whose mark a close cut off ends here
    [(content, details)] = results_of(await transcript(third, ctx))
    assert "Late but whole." in content
    assert details.finish is not None
    assert [job.delivered for job in third.delegation.jobs] == [True]
    assert len(second.asked["writer"]) == 1
    await third_service.close_all(ctx)


# -- agent definitions -------------------------------------------------------------------------------


async def test_agents_are_checked_against_the_conversations_tools(store: Store) -> None:
    with pytest.raises(InvalidInput):
        ConversationService(store, ConversationSetup(agents=AgentRegistry([READER])))  # no probe tool here
    with pytest.raises(InvalidInput):
        AgentRegistry([READER, READER])
    with pytest.raises(InvalidInput):
        AgentRegistry([READER], default="writer")
    nested = READER.model_copy(update={"tools": ("delegate",)})
    with pytest.raises(InvalidInput):
        ConversationService(store, ConversationSetup(agents=AgentRegistry([nested])))


async def reached(part: FauxDelay) -> None:
    await part.reached.wait()
