"""The one conversation door: every surface acts on a conversation through `Conversation` and
`ConversationService`, so a typed command, a stop or a goal behaves and is recorded the same
whichever door it came through, and none of them can reach the lane or the harness underneath.
Each test here failed when a door went around the service (issue: one conversation door)."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest

from conversation_helpers import faux_service, rows, rows_of, transcript
from drive_helpers import FAUX, ProbeTool, within
from garden_helpers import OWNER, make_garden
from harness.context import Context
from harness.conversation import (
    BUILT_IN_COMMANDS,
    ChatEventPublished,
    CommandRan,
    Conversation,
    ConversationEnded,
    ConversationService,
    ConversationSetup,
    ErrorDetails,
    EventRow,
    GardenMessage,
    GoalStatus,
    Interrupted,
    ModelOutcome,
    ModelSwitch,
    ModelSwitched,
    ModelSwitchFailed,
    ModelSwitchRefused,
    ModeSelected,
    PostedCommand,
    Renamed,
    RenameOutcome,
    fast,
    model,
    rename,
    run_typed_command,
)
from harness.conversation.garden_messages import garden_message_of
from harness.errors import HarnessError
from harness.garden import GardenWriteFailed, goal_command
from harness.messages import ModelIdentity, UserMessage
from harness.providers import FAUX_MODEL
from harness.providers.faux import FauxReply, delay, reply, tool_call
from harness.runtime import DriveOutcome, DriveSettings, LaneBusy, PromptTooLarge, QueueUpdate, Settled, ValueUpdate
from harness.runtime.requests import MAX_INPUT_BYTES
from harness.session import LaneConfig, SessionNotFound, Store
from harness.session.addresses import lane_request
from harness.session.backend import SetValue
from harness.session.ids import new_id

SRC = Path(__file__).resolve().parents[1] / "src" / "harness"
SECOND = FAUX_MODEL.model_copy(update={"id": "faux-2"})
FAUX_2 = ModelIdentity(provider="faux", model_id="faux-2")
THIRD = FAUX_MODEL.model_copy(update={"id": "faux-3"})
FAUX_3 = ModelIdentity(provider="faux", model_id="faux-3")
KEYED = FAUX_MODEL.model_copy(update={"id": "faux-keyed", "api_key_env": "HARNESS_TEST_ABSENT_KEY"})
KEYED_ID = ModelIdentity(provider="faux", model_id="faux-keyed")
TOOLS = LaneConfig(model=FAUX, active_tools=["probe"])


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled)
    return outcome


async def in_a_tool_call(conversations: ConversationService, probe: ProbeTool,
                         ctx: Context) -> tuple[Conversation, asyncio.Future[DriveOutcome]]:
    """A new conversation of OWNER whose first turn is inside `probe`'s call with key `k` (held
    while that key's gate is closed), and the task driving that turn."""
    conversation = await conversations.create(OWNER, TOOLS, ctx)
    running = asyncio.ensure_future(conversation.send("go", ctx))
    await probe.wait_started("k")
    return conversation, running


def test_no_door_reaches_a_conversations_lane_harness_or_settings() -> None:
    """The doors (cli, server, garden, worker) use the conversation's own methods; its lane,
    harness and settings are private to `harness.conversation`."""
    private = re.compile(r"(?<!self)\.(_lane|_harness|_settings)\b|\bconversation\.(lane|harness|settings)\b")
    reached = [f"{path.relative_to(SRC)}:{number}: {line.strip()}"
               for room in ("cli", "server", "garden", "worker")
               for path in sorted((SRC / room).rglob("*.py"))
               for number, line in enumerate(path.read_text().splitlines(), 1) if private.search(line)]
    assert reached == []
    assert not hasattr(Conversation, "lane")
    assert not hasattr(Conversation, "harness")


async def test_a_typed_model_switch_during_a_tool_call_waits_for_the_turn(store: Store, ctx: Context) -> None:
    """CE-12, CE-16: `/model` typed while a tool runs is queued behind the turn; the turn's next
    step stays on its model; the command's row says it is queued, and the switch's own row lands
    when the turn has ended. (It used to switch the running turn.)"""
    probe = ProbeTool()
    gate = probe.gate("k")
    conversations, faux = faux_service(store, [reply(tool_call("probe", {"key": "k"})), "done", "next"],
                                       tools=[probe], models=[SECOND])
    conversation, running = await in_a_tool_call(conversations, probe, ctx)

    typed = asyncio.ensure_future(run_typed_command(conversations, OWNER, conversation, "/model faux/faux-2", ctx))
    await asyncio.sleep(0)
    gate.set()
    settled(await within(running))
    await within(typed)
    settled(await within(conversation.send("and now?", ctx)))

    assert [request.model.id for request in faux.requests] == ["faux", "faux", "faux-2"]
    assert await rows(conversation, ctx) == [
        CommandRan(name="model", args="faux/faux-2", outcome=ModelOutcome(model=FAUX_2, queued=True)),
        ModelSwitched(previous=FAUX, model=FAUX_2)]
    await conversations.close_all(ctx)


async def test_a_typed_model_switch_when_idle_is_one_command_row(store: Store, ctx: Context) -> None:
    """CE-6, CE-12: between turns the switch applies at once and its command row is its only record."""
    conversations, _ = faux_service(store, ["hi"], models=[SECOND])
    conversation = await conversations.create(OWNER, LaneConfig(model=FAUX), ctx)
    settled(await within(conversation.send("hello", ctx)))

    outcome = await model(conversations, OWNER, conversation, "faux/faux-2", ctx)

    assert outcome == ModelOutcome(model=FAUX_2)
    assert conversation.config().model == FAUX_2
    assert await rows(conversation, ctx) == [CommandRan(name="model", args="faux/faux-2", outcome=outcome)]
    await conversations.close_all(ctx)


async def test_every_door_names_a_conversation_from_its_first_prompt(store: Store, ctx: Context) -> None:
    """A conversation made without a name takes one from the first prompt admitted on it, in the
    service, so the HTTP API and the Agent name it as the chat does; a later prompt or a chosen
    name is left alone."""
    conversations, _ = faux_service(store, ["one", "two", "three"])
    unnamed = await conversations.create(OWNER, LaneConfig(model=FAUX), ctx)
    named = await conversations.create(OWNER, LaneConfig(model=FAUX), ctx, name="Kept")

    settled(await within(unnamed.send("\n  Plan   the trip\nto Lyon", ctx)))
    settled(await within(unnamed.send("And back?", ctx)))
    settled(await within(named.send("Something else", ctx)))

    assert await unnamed.session_name(ctx) == "Plan the trip"
    assert await named.session_name(ctx) == "Kept"
    assert await rows(unnamed, ctx) == []  # nobody chose the name: no row
    await conversations.close_all(ctx)


async def test_command_refusals_are_recorded_at_every_door(store: Store, ctx: Context,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """CE-16: `/model` with an id no provider offers or whose key is not set, `/rename` with no
    name and `/fast` to a model whose key is not set each fail with a row holding the very text
    the caller got; nothing else changed. (The terminal refused them before the service saw them.)"""
    monkeypatch.delenv("HARNESS_TEST_ABSENT_KEY", raising=False)
    conversations, _ = faux_service(store, [], models=[KEYED], setup=ConversationSetup(
        drive=DriveSettings(frame_interval_s=0), fast_model=KEYED_ID))
    conversation = await conversations.create(OWNER, LaneConfig(model=FAUX), ctx)
    errors = []
    for command, args in ((model, "nowhere/none"), (model, "faux/faux-keyed"), (rename, ""), (fast, None)):
        with pytest.raises(HarnessError) as refused:
            await command(conversations, OWNER, conversation, args, ctx)
        errors.append(refused.value)

    assert [type(error).__name__ for error in errors] == [
        "ModelUnavailable", "MissingApiKey", "InvalidInput", "MissingApiKey"]
    assert await rows(conversation, ctx) == [
        CommandRan(name="model", args="nowhere/none", error=str(errors[0])),
        CommandRan(name="model", args="faux/faux-keyed", error=str(errors[1])),
        CommandRan(name="rename", error=str(errors[2])),
        CommandRan(name="fast", error=str(errors[3]))]
    assert conversation.config() == LaneConfig(model=FAUX)
    assert await conversation.session_name(ctx) is None
    await conversations.close_all(ctx)


async def test_a_goal_refused_by_a_running_turn_records_the_refusal_and_no_goal(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-16: `/goal` while a turn runs is refused (`lane_busy`): its row says so, no goal is
    given, and the model reads no claim that a garden pursues one. (It recorded a success.)"""
    probe = ProbeTool()
    gate = probe.gate("k")
    conversations, _ = faux_service(store, [reply(tool_call("probe", {"key": "k"})), "done"], tools=[probe])
    garden = await make_garden(store, conversations, tmp_path / "garden", ctx)
    conversation, running = await in_a_tool_call(conversations, probe, ctx)

    with pytest.raises(LaneBusy) as busy:
        await run_typed_command(conversations, OWNER, conversation, "/goal Turn the compost", ctx,
                                commands={"goal": goal_command(garden)})
    gate.set()
    settled(await within(running))

    assert garden.goals() == []
    assert await rows(conversation, ctx) == [CommandRan(name="goal", args="Turn the compost",
                                                        error=busy.value.message)]
    await conversations.close_all(ctx)
    await garden.close(ctx)


async def test_a_goal_in_an_ended_conversation_is_refused_and_recorded(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-16: an ended conversation takes no kickoff turn, so `/goal` gives no goal; the refusal
    is its row."""
    conversations, faux = faux_service(store, ["hi"])
    garden = await make_garden(store, conversations, tmp_path / "garden", ctx)
    conversation = await conversations.create(OWNER, LaneConfig(model=FAUX), ctx)
    settled(await within(conversation.send("hello", ctx)))
    assert await conversations.end(OWNER, conversation.id, ctx) is True

    with pytest.raises(ConversationEnded) as ended:
        await run_typed_command(conversations, OWNER, conversation, "/goal Turn the compost", ctx,
                                commands={"goal": goal_command(garden)})

    assert garden.goals() == []
    assert len(faux.requests) == 1
    assert await rows(conversation, ctx) == [CommandRan(name="goal", args="Turn the compost",
                                                        error=ended.value.message)]
    await conversations.close_all(ctx)
    await garden.close(ctx)


async def test_a_goal_the_garden_cannot_keep_admits_no_turn_and_claims_nothing(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-16: a goal the garden fails to write (here a file stands where its goals folder goes)
    starts no turn and its row records the failure; it used to admit the kickoff turn under a
    row saying the garden pursues the goal."""
    conversations, faux = faux_service(store, ["never"])
    garden = await make_garden(store, conversations, tmp_path / "garden", ctx)
    conversation = await conversations.create(OWNER, LaneConfig(model=FAUX), ctx)
    goals = tmp_path / "garden" / "goals"
    shutil.rmtree(goals, ignore_errors=True)
    goals.write_text("not a folder")

    with pytest.raises(GardenWriteFailed) as failed:
        await run_typed_command(conversations, OWNER, conversation, "/goal Turn the compost", ctx,
                                commands={"goal": goal_command(garden)})

    assert str(tmp_path) not in str(failed.value)
    assert faux.requests == []
    assert conversation.operation() is None
    assert await rows(conversation, ctx) == [CommandRan(name="goal", args="Turn the compost",
                                                        error=str(failed.value))]
    await conversations.close_all(ctx)
    await garden.close(ctx)


async def test_a_stop_during_a_tool_call_is_recorded_as_such(store: Store, ctx: Context) -> None:
    """CE-7: a person's stop that lands while a tool call runs settles with the cause
    `user_during_tool`, and that is the `interrupted` row."""
    probe = ProbeTool()
    probe.gate("k")
    conversations, _ = faux_service(store, [reply(tool_call("probe", {"key": "k"}))], tools=[probe])
    conversation, running = await in_a_tool_call(conversations, probe, ctx)

    await conversation.stop(ctx)
    outcome = settled(await within(running))

    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user_during_tool")
    assert await rows(conversation, ctx) == [Interrupted(cause="user_during_tool")]
    await conversations.close_all(ctx)


async def test_a_model_switch_applies_at_once_to_a_turn_a_stopped_process_left_open(
        store: Store, ctx: Context) -> None:
    """CE-12: a turn nobody drives (its process stopped) does not hold the turn lock: a switch
    lands at once, and the resumed turn runs on the new model."""
    probe = ProbeTool()
    probe.gate("k")
    conversations, _ = faux_service(store, [reply(tool_call("probe", {"key": "k"}))], tools=[probe])
    conversation, running = await in_a_tool_call(conversations, probe, ctx)
    await conversation.detach_now(ctx)  # as a crash stops it
    with pytest.raises(Exception):  # noqa: B017, PT011 - the drive ends with the harness, however it says so
        await within(running)

    again, faux = faux_service(store, ["done"], tools=[ProbeTool()], models=[SECOND])
    reopened = await again.open(OWNER, conversation.id, ctx)
    switch = await within(reopened.switch_model(FAUX_2, ctx, wait_for_completion=True))
    outcome = settled(await within(reopened.resume(ctx)))

    assert switch.queued is False
    assert outcome.result.outcome == "completed"
    assert [request.model.id for request in faux.requests] == ["faux-2"]
    messages = await transcript(reopened, ctx)
    assert isinstance(messages[0], UserMessage)
    await again.close_all(ctx)


async def test_rows_and_garden_messages_reach_a_conversation_another_holder_has(store: Store, ctx: Context) -> None:
    """CE-3, CE-11, OM-4: while one holder (a chat, a server) has the conversation live, another
    one's row and garden message are posted to it and land after the running tool call's result,
    once each, a retried emission too. (They were refused `session_owned`, and the note lost.)"""
    probe = ProbeTool()
    gate = probe.gate("k")
    holder, _ = faux_service(store, [reply(tool_call("probe", {"key": "k"})), "done"], tools=[probe])
    elsewhere, _ = faux_service(store, [])
    conversation, running = await in_a_tool_call(holder, probe, ctx)
    said = GardenMessage(garden="allotment", kind="reply", emission_id=new_id(), goal_id="g-1", run_id="r-1",
                         text="The roses need a person.")

    assert await elsewhere.record(OWNER, conversation.id, GoalStatus(goal_id="g-1", status="done", title="Roses"),
                                  ctx) is True
    entry_id = await elsewhere.post_garden_message(OWNER, conversation.id, said, ctx)
    assert await elsewhere.post_garden_message(OWNER, conversation.id, said, ctx) == entry_id
    watch = await conversation.watch(ctx)
    if len(watch.snapshot.pending_writes) < 2:
        async for event in watch:  # the holder takes both while the tool call still runs
            if isinstance(event, QueueUpdate) and len(event.pending_writes) == 2:
                break
    watch.close()
    gate.set()
    settled(await within(running))

    messages = await transcript(conversation, ctx)
    assert [message.role for message in messages] == ["user", "assistant", "tool_result", "custom", "custom",
                                                      "assistant"]
    assert rows_of(messages) == [GoalStatus(goal_id="g-1", status="done", title="Roses")]
    assert garden_message_of(messages[4]) == said
    await holder.close_all(ctx)


async def test_steer_commands_switches_and_stops_reach_a_conversation_another_holder_has(
        store: Store, ctx: Context) -> None:
    """CE-7, CE-12, CE-16: while one holder has the conversation live with a tool call running,
    another process's steer, typed command and model switch are posted to it (accepted, not
    `session_owned`) and applied as its own door would: the steer read after the call, the
    command's row recorded, the switch queued behind the turn; a stop ends its next turn."""
    probe = ProbeTool()
    gate = probe.gate("k")
    hold = delay(asyncio.Event())
    setup = ConversationSetup(drive=DriveSettings(frame_interval_s=0), commands=BUILT_IN_COMMANDS)
    script: list[FauxReply | str] = [reply(tool_call("probe", {"key": "k"})), "noted", reply("stopping", hold)]
    holder, faux = faux_service(store, script, tools=[probe], models=[SECOND], setup=setup)
    elsewhere, _ = faux_service(store, [], models=[SECOND], setup=setup)
    conversation = await holder.create(OWNER, TOOLS, ctx)
    watch = await conversation.watch(ctx)
    running = asyncio.ensure_future(conversation.send("go", ctx))
    await probe.wait_started("k")

    entry_id, steer_id = await elsewhere.queue(OWNER, conversation.id, "steer", UserMessage(content="be brief"), ctx)
    posted = await elsewhere.command(OWNER, conversation.id, "/rename notes", ctx)
    switch = await elsewhere.switch_model(OWNER, conversation.id, FAUX_2, ctx)
    async for event in watch:  # the holder took the steer, then ran the rename (after naming it from "go")
        if isinstance(event, ValueUpdate) and event.key == "session_name" and event.value == "notes":
            break
    watch.close()
    gate.set()
    settled(await within(running))
    second = asyncio.ensure_future(conversation.send("one more", ctx))
    await within(hold.reached.wait())
    stopped = await elsewhere.stop(OWNER, conversation.id, ctx)
    outcome = settled(await within(second))

    assert entry_id is None
    assert isinstance(steer_id, str)
    assert isinstance(posted, PostedCommand)
    assert switch == ModelSwitch(model=FAUX_2, queued=True)
    assert [request.model.id for request in faux.requests] == ["faux", "faux", "faux-2"]
    assert "be brief" in str(faux.requests[1].request.messages)
    assert (stopped.operation_id, outcome.result.outcome) == (outcome.operation_id, "aborted")
    details = await rows(conversation, ctx)
    assert details[:2] == [CommandRan(name="rename", args="notes", outcome=RenameOutcome(name="notes")),
                           ModelSwitched(previous=FAUX, model=FAUX_2)]
    await holder.close_all(ctx)


async def test_a_switch_posted_with_wait_for_completion_answers_once_it_applied(store: Store, ctx: Context) -> None:
    """CE-12: a switch posted to a holder whose turn runs a tool call, with `wait_for_completion`,
    is answered once the turn ended and the switch applied (it was acknowledged `queued` at once,
    whatever was asked); one the holder cannot make is `ModelSwitchRefused` (`failed`), and the
    holder records its failure as a model-switch-failed error row (it was only logged)."""
    probe = ProbeTool()
    gate = probe.gate("k")
    holder, _ = faux_service(store, [reply(tool_call("probe", {"key": "k"})), "done"], tools=[probe],
                             models=[SECOND])
    elsewhere, _ = faux_service(store, [], models=[SECOND, THIRD])
    conversation = await holder.create(OWNER, TOOLS, ctx)
    running = asyncio.ensure_future(conversation.send("go", ctx))
    await probe.wait_started("k")

    commits = store.changes.subscribe(conversation.id)
    waiting = asyncio.ensure_future(elsewhere.switch_model(OWNER, conversation.id, FAUX_2, ctx,
                                                           wait_for_completion=True))

    async def taken() -> None:  # by the holder (its taker, or this look), and queued behind the turn
        while conversation.waiting_model != FAUX_2:
            await conversation.take_requests(ctx)
            await commits.wait(0.05)

    await within(taken())
    commits.close()
    assert not waiting.done()
    gate.set()
    settled(await within(running))
    switched = await within(waiting)

    with pytest.raises(ModelSwitchRefused) as refused:
        await within(elsewhere.switch_model(OWNER, conversation.id, FAUX_3, ctx, wait_for_completion=True))

    assert switched == ModelSwitch(model=FAUX_2, queued=False)
    assert conversation.config().model == FAUX_2
    assert refused.value.details["reason"] == "failed"
    last = (await rows(conversation, ctx))[-1]
    assert isinstance(last, ErrorDetails)
    assert last.notice == ModelSwitchFailed(requested=FAUX_3)
    await holder.close_all(ctx)


async def posted_row_is_placed_by_the_holders_close(holder: ConversationService, elsewhere: ConversationService,
                                                    conversation: Conversation, store: Store, ctx: Context) -> None:
    """`elsewhere` records a row while `holder` has the conversation, then `holder` closes: the
    row is on the branch and no request is left."""
    row = GoalStatus(goal_id="g-1", status="done", title="Roses")
    assert await elsewhere.record(OWNER, conversation.id, row, ctx) is True
    await holder.close(OWNER, conversation.id, ctx)

    page = await elsewhere.read_display(OWNER, conversation.id, ctx)
    assert [shown.details for shown in page.rows if isinstance(shown, EventRow)] == [row]
    journal = await store.open_session(conversation.id, ctx)
    assert await journal.scan_records(lane_request(""), ctx) == []


async def test_a_row_posted_as_the_holder_lets_go_is_placed_by_its_last_look(store: Store, ctx: Context) -> None:
    """CE-3: a holder that closes takes what was posted once more before it lets go, so a row the
    poster was told is queued is in the journal, not left for a next holder."""
    holder, _ = faux_service(store, ["hi"])
    elsewhere, _ = faux_service(store, [])
    conversation = await holder.create(OWNER, LaneConfig(model=FAUX), ctx)
    settled(await within(conversation.send("hello", ctx)))

    await posted_row_is_placed_by_the_holders_close(holder, elsewhere, conversation, store, ctx)


async def test_what_the_holder_would_refuse_is_refused_before_it_is_posted(store: Store, ctx: Context) -> None:
    """A garden message too large for the conversation fails for its sender, as it would on a
    conversation nobody holds, instead of being acknowledged and then dropped by the holder."""
    holder, _ = faux_service(store, [])
    elsewhere, _ = faux_service(store, [])
    conversation = await holder.create(OWNER, LaneConfig(model=FAUX), ctx)
    huge = GardenMessage(garden="allotment", kind="reply", emission_id=new_id(), goal_id="g-1", run_id="r-1",
                         text="x" * (MAX_INPUT_BYTES + 1))

    with pytest.raises(PromptTooLarge):
        await elsewhere.post_garden_message(OWNER, conversation.id, huge, ctx)

    journal = await store.open_session(conversation.id, ctx)
    assert await journal.scan_records(lane_request(""), ctx) == []
    await holder.close_all(ctx)


async def test_a_request_that_does_not_decode_blocks_none_after_it(store: Store, ctx: Context) -> None:
    """A posted request this version cannot read (a newer one's kind) is dropped with a log line;
    the row posted after it is placed."""
    holder, _ = faux_service(store, [])
    elsewhere, _ = faux_service(store, [])
    conversation = await holder.create(OWNER, LaneConfig(model=FAUX), ctx)
    journal = await store.open_session(conversation.id, ctx)
    unknown = '{"kind": "rename", "lane": "main", "name": "x", "requested_at": 1}'
    await journal._backend.post(journal.id, [SetValue(lane_request("").namespace, new_id(), unknown)], ctx)

    await posted_row_is_placed_by_the_holders_close(holder, elsewhere, conversation, store, ctx)


async def test_a_stop_posted_during_a_tool_call_is_recorded_as_such(store: Store, ctx: Context) -> None:
    """CE-7: a person's stop from another process lands as one at the holder's own door would."""
    probe = ProbeTool()
    probe.gate("k")
    holder, _ = faux_service(store, [reply(tool_call("probe", {"key": "k"}))], tools=[probe])
    elsewhere, _ = faux_service(store, [])
    conversation, running = await in_a_tool_call(holder, probe, ctx)

    await elsewhere.stop(OWNER, conversation.id, ctx)
    outcome = settled(await within(running))

    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user_during_tool")
    await holder.close_all(ctx)


async def test_a_conversation_deleted_mid_run_settles_its_run_as_deleted_then_goes(store: Store, ctx: Context) -> None:
    """CE-7: deleting a conversation whose turn is inside a tool call stops the turn with the
    cause `deleted` (no row) and lets it settle before the journal is deleted."""
    probe = ProbeTool()
    probe.gate("k")
    conversations, _ = faux_service(store, [reply(tool_call("probe", {"key": "k"}))], tools=[probe])
    conversation, running = await in_a_tool_call(conversations, probe, ctx)
    watch = await conversation.watch(ctx)

    await conversations.delete(OWNER, conversation.id, ctx)
    outcome = settled(await within(running))
    events = watch.buffered()
    watch.close()

    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "deleted")
    assert not any(isinstance(event, ChatEventPublished) for event in events)
    assert conversation.id not in {info.id for info in await conversations.list(OWNER, ctx)}
    with pytest.raises(SessionNotFound):
        await store.open_session(conversation.id, ctx)


async def test_a_rename_and_a_mode_reach_a_conversation_another_holder_has(store: Store, ctx: Context) -> None:
    """CE-10, CE-13: a rename and a work mode chosen in another process while one holder has the
    conversation are posted to it and made as its own door makes them, each with its row."""
    holder, _ = faux_service(store, ["hi"], setup=ConversationSetup(commands=BUILT_IN_COMMANDS))
    elsewhere, _ = faux_service(store, [])
    conversation = await holder.create(OWNER, LaneConfig(model=FAUX), ctx)
    settled(await within(conversation.send("hello", ctx)))

    assert await elsewhere.rename(OWNER, conversation.id, "roses", ctx) is True
    assert await elsewhere.select_mode(OWNER, conversation.id, "plan", ctx) is True
    await holder.close(OWNER, conversation.id, ctx)  # its last look takes both, and waits for them

    reopened = await elsewhere.open(OWNER, conversation.id, ctx)
    assert (await reopened.session_name(ctx), reopened.mode) == ("roses", "plan")
    assert await rows(reopened, ctx) == [Renamed(name="roses"), ModeSelected(mode="plan")]
    await elsewhere.close_all(ctx)
