"""Setting changes as chat events, through `ConversationService` on every backend: recorded live or
cold (CE-10), never between a tool call and its result (CE-11), the queued model switch (CE-12),
nothing before the first message but mode selections (CE-13), the reasoning level announced at
turn admission (CE-14) and the rename of a closed conversation (CE-15)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from conversation_helpers import faux_service, rows, transcript
from drive_helpers import FAUX, ProbeTool, within
from harness.context import Context
from harness.conversation import (
    ChatEventPublished,
    Conversation,
    ConversationService,
    DirectoryMoved,
    ErrorDetails,
    ModelSwitch,
    ModelSwitched,
    ModelSwitchFailed,
    ModelSwitchRefused,
    ModeSelected,
    ReasoningChanged,
    Renamed,
)
from harness.conversation.settings import READ_ONLY_TOOLS, TURN_BASELINE, TurnBaseline
from harness.errors import ModelUnavailable
from harness.messages import ModelIdentity
from harness.providers import FAUX_MODEL, FauxProvider
from harness.providers.faux import FauxDelay, FauxScript, delay, reply, tool_call
from harness.runtime import Settled
from harness.session import Claim, CommitResult, InsertEntry, LaneConfig, Store, StoreFull, Write
from harness_helpers import RecordingBackend

ALICE = "alice"
CONFIG = LaneConfig(model=FAUX)
SECOND = FAUX_MODEL.model_copy(update={"id": "faux-2"})
FAUX_2 = ModelIdentity(provider="faux", model_id="faux-2")
THIRD = FAUX_MODEL.model_copy(update={"id": "faux-3"})
FAUX_3 = ModelIdentity(provider="faux", model_id="faux-3")
NOWHERE = ModelIdentity(provider="nowhere", model_id="absent")
KEYED = FAUX_MODEL.model_copy(update={"id": "faux-keyed", "api_key_env": "HARNESS_TEST_KEY"})
KEYED_ID = ModelIdentity(provider="faux", model_id="faux-keyed")


async def roles(conversation: Conversation, ctx: Context) -> list[str]:
    return [message.role for message in await transcript(conversation, ctx)]


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    return outcome


async def spoken(conversations: ConversationService, ctx: Context) -> Conversation:
    """A live conversation of ALICE with one finished turn."""
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "hello", ctx)))
    return conversation


class HeldTurn:
    """A turn of `conversation` whose reply is held at `step` (a `delay` on an event) until
    `release()`."""

    def __init__(self, conversations: ConversationService, conversation: Conversation, step: FauxDelay,
                 ctx: Context) -> None:
        assert step.until is not None
        self.gate = step.until
        self.task = asyncio.ensure_future(conversations.send(ALICE, conversation.id, "a long one", ctx))

    async def release(self) -> None:
        self.gate.set()
        settled(await within(self.task))


async def held_turn(conversations: ConversationService, conversation: Conversation, step: FauxDelay,
                    ctx: Context) -> HeldTurn:
    """A `HeldTurn`, once its reply has reached `step`."""
    turn = HeldTurn(conversations, conversation, step, ctx)
    await within(step.reached.wait())
    return turn


async def waiting_switch(conversation: Conversation, model: ModelIdentity, ctx: Context) -> asyncio.Future[ModelSwitch]:
    """A switch that waits for completion behind the running turn, registered as the waiting pick
    when this returns. It is called on the live conversation's settings (what the service's
    `switch_model` calls after its owner check), which register the pick before their first
    suspension: one step of the loop, where the service's store read would take an unknown number."""
    waiting = asyncio.ensure_future(conversation.switch_model(model, ctx, wait_for_completion=True))
    await asyncio.sleep(0)
    assert conversation.waiting_model == model
    return waiting


# -- CE-10, CE-13: recorded when they happen, nothing before the first message ------------------


async def test_setting_changes_record_nothing_before_the_first_message_but_modes_do(
        store: Store, ctx: Context) -> None:
    """CE-13: a rename, a directory move and an immediate model switch in a conversation nobody
    has spoken in apply without a row, live and closed; a mode selection records at once."""
    conversations, _ = service(store, ["hi"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    assert await conversations.rename(ALICE, conversation.id, "early", ctx) is True
    assert await conversations.record_setting(ALICE, conversation.id, DirectoryMoved(path="/srv"), ctx) is True
    assert await conversations.switch_model(ALICE, conversation.id, FAUX_2, ctx) == ModelSwitch(model=FAUX_2,
                                                                                                 queued=False)
    assert conversation.config().model == FAUX_2
    assert await conversations.select_mode(ALICE, conversation.id, "plan", ctx) is True
    await conversations.close(ALICE, conversation.id, ctx)
    assert await conversations.rename(ALICE, conversation.id, "still early", ctx) is True

    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert reopened.info.name == "still early"
    assert await rows(reopened, ctx) == [ModeSelected(mode="plan")]
    await conversations.close_all(ctx)


async def test_after_the_first_message_setting_changes_record_live_and_cold(store: Store, ctx: Context) -> None:
    """CE-10: once spoken, each change is one row, on the live conversation and on a closed one."""
    conversations, _ = service(store, ["hi"])
    conversation = await spoken(conversations, ctx)
    assert await conversations.rename(ALICE, conversation.id, "live name", ctx) is True
    assert await conversations.record_setting(ALICE, conversation.id, DirectoryMoved(path="/srv"), ctx) is True
    await conversations.close(ALICE, conversation.id, ctx)
    moved = DirectoryMoved(path="/srv/app", project="app")
    assert await conversations.record_setting(ALICE, conversation.id, moved, ctx) is True

    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert await rows(reopened, ctx) == [Renamed(name="live name"), DirectoryMoved(path="/srv"), moved]
    assert await roles(reopened, ctx) == ["user", "assistant", "custom", "custom", "custom"]
    await conversations.close_all(ctx)


async def test_a_renamed_closed_conversation_has_one_row_the_next_restore_reads(store: Store, ctx: Context) -> None:
    """CE-15 with CE-13 applied: the closed, spoken conversation gets one rename entry."""
    conversations, _ = service(store, ["hi"])
    conversation = await spoken(conversations, ctx)
    await conversations.close(ALICE, conversation.id, ctx)
    assert await conversations.rename(ALICE, conversation.id, "a better name", ctx) is True
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert reopened.info.name == "a better name"
    assert await rows(reopened, ctx) == [Renamed(name="a better name")]
    await conversations.close_all(ctx)


async def test_a_live_conversations_info_follows_its_renames(store: Store, ctx: Context) -> None:
    """CE-10: the live conversation's `info` names it as the service renamed it, and as a door
    that names its session through the harness did."""
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx, name="first")
    await conversations.rename(ALICE, conversation.id, "second", ctx)
    renamed = conversation.info.name
    await conversations.rename(ALICE, conversation.id, None, ctx)

    assert (renamed, conversation.info.name) == ("second", None)
    await conversations.close_all(ctx)


# -- CE-11: a row recorded during an operation waits for its boundary ---------------------------


async def test_a_mode_selected_during_a_tool_call_lands_after_its_result_and_limits_the_next_step(
        store: Store, ctx: Context) -> None:
    """CE-11, CE-13: plan mode chosen while a tool runs is a pending write placed after the
    call's result; the next request offers only the read-only tools."""
    probe, reader = ProbeTool(), ProbeTool("read", replay="safe")
    gate = probe.gate("k")
    conversations, faux = service(store, [reply(tool_call("probe", {"key": "k"})), "done"], tools=[probe, reader])
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX, active_tools=["probe", "read"]), ctx)
    running = asyncio.ensure_future(conversations.send(ALICE, conversation.id, "go", ctx))
    await probe.wait_started("k")
    assert await conversations.select_mode(ALICE, conversation.id, "plan", ctx) is True
    gate.set()
    settled(await within(running))

    assert await roles(conversation, ctx) == ["user", "assistant", "tool_result", "custom", "assistant"]
    assert await rows(conversation, ctx) == [ModeSelected(mode="plan")]
    assert [tool.name for tool in faux.requests[-1].request.tools] == ["read"]
    assert conversation.config().active_tools == sorted(READ_ONLY_TOOLS & {"probe", "read"})
    assert await conversations.select_mode(ALICE, conversation.id, "build", ctx) is True
    assert conversation.config().active_tools == ["probe", "read"]
    await conversations.close_all(ctx)


async def test_a_cold_rename_while_a_stopped_process_left_a_tool_call_open_waits_for_its_result(
        store: Store, ctx: Context) -> None:
    """CE-10, CE-11, CE-12: recorded on the closed conversation, the rows are placed after the
    result; a turn nobody drives holds no turn lock, so the switch lands at once and the resumed
    turn runs on the new model."""
    probe = ProbeTool(replay="safe")
    probe.gate("k")
    conversations, faux = service(store, [reply(tool_call("probe", {"key": "k"})), "done"], tools=[probe])
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX, active_tools=["probe"]), ctx)
    running = asyncio.ensure_future(conversations.send(ALICE, conversation.id, "go", ctx))
    await probe.wait_started("k")
    await conversations.close(ALICE, conversation.id, ctx)  # stops where it is, as a crash would
    with pytest.raises(Exception):  # noqa: B017, PT011  (HarnessClosed: the drive was halted)
        await running

    assert await conversations.rename(ALICE, conversation.id, "from outside", ctx) is True
    switch = await conversations.switch_model(ALICE, conversation.id, FAUX_2, ctx)
    probe.gate("k").set()
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    settled(await within(reopened.resume(ctx)))
    assert switch == ModelSwitch(model=FAUX_2, queued=False)
    assert await roles(reopened, ctx) == ["user", "assistant", "tool_result", "custom", "custom", "assistant"]
    assert await rows(reopened, ctx) == [Renamed(name="from outside"), ModelSwitched(previous=FAUX, model=FAUX_2)]
    assert reopened.config().model == FAUX_2
    assert faux.requests[-1].model.id == "faux-2"
    await conversations.close_all(ctx)


# -- CE-12: the model switch --------------------------------------------------------------------


async def test_an_immediate_switch_records_only_a_real_change_and_fails_synchronously(
        store: Store, ctx: Context) -> None:
    conversations, faux = service(store, ["hi", "on the second"])
    conversation = await spoken(conversations, ctx)
    assert await conversations.switch_model(ALICE, conversation.id, FAUX, ctx) == ModelSwitch(model=FAUX,
                                                                                               queued=False)
    assert await conversations.switch_model(ALICE, conversation.id, FAUX_2, ctx) == ModelSwitch(model=FAUX_2,
                                                                                                 queued=False)
    with pytest.raises(ModelUnavailable):
        await conversations.switch_model(ALICE, conversation.id, NOWHERE, ctx)
    assert conversation.config().model == FAUX_2
    assert await rows(conversation, ctx) == [ModelSwitched(previous=FAUX, model=FAUX_2)]
    settled(await within(conversations.send(ALICE, conversation.id, "and now?", ctx)))
    assert faux.requests[-1].model.id == "faux-2"
    await conversations.close_all(ctx)


async def test_a_switch_during_a_turn_is_acknowledged_queued_and_applies_when_the_turn_ends(
        store: Store, ctx: Context) -> None:
    """The acknowledgement comes while the turn runs; the model is not active until the completion
    row is observed; the turn that was running finishes on its own model; the completion is
    recorded after that turn's reply."""
    hold = delay(asyncio.Event())
    conversations, faux = service(store, ["hi", reply("working", hold), "next"])
    conversation = await spoken(conversations, ctx)
    watch = await conversation.watch(ctx)
    turn = await held_turn(conversations, conversation, hold, ctx)

    ack = await conversations.switch_model(ALICE, conversation.id, FAUX_2, ctx, acknowledge_after_s=0)
    assert ack == ModelSwitch(model=FAUX_2, queued=True)
    assert conversation.config().model == FAUX
    assert conversation.waiting_model == FAUX_2
    await turn.release()
    async for event in watch:
        if isinstance(event, ChatEventPublished) and isinstance(event.row.details, ModelSwitched):
            break
    watch.close()
    assert conversation.config().model == FAUX_2
    assert conversation.waiting_model is None
    assert faux.requests[-1].model.id == "faux"
    assert await roles(conversation, ctx) == ["user", "assistant", "user", "assistant", "custom"]
    assert (await rows(conversation, ctx)) == [ModelSwitched(previous=FAUX, model=FAUX_2)]
    await conversations.close_all(ctx)


async def test_a_queued_switch_done_before_the_delay_answers_applied_and_records_an_unchanged_pair(
        store: Store, ctx: Context) -> None:
    """A queued completion always records, even for the model already configured."""
    hold = delay(asyncio.Event())
    conversations, _ = service(store, ["hi", reply("working", hold)])
    conversation = await spoken(conversations, ctx)
    turn = await held_turn(conversations, conversation, hold, ctx)
    switching = asyncio.ensure_future(conversations.switch_model(ALICE, conversation.id, FAUX, ctx,
                                                                 acknowledge_after_s=60))
    await turn.release()
    assert await within(switching) == ModelSwitch(model=FAUX, queued=False)
    assert await rows(conversation, ctx) == [ModelSwitched(previous=FAUX, model=FAUX)]
    await conversations.close_all(ctx)


async def test_a_later_pick_supersedes_a_waiting_one_which_is_refused(store: Store, ctx: Context) -> None:
    hold = delay(asyncio.Event())
    conversations, _ = service(store, ["hi", reply("working", hold)])
    conversation = await spoken(conversations, ctx)
    turn = await held_turn(conversations, conversation, hold, ctx)
    first = await waiting_switch(conversation, FAUX_2, ctx)
    second = await conversations.switch_model(ALICE, conversation.id, FAUX_3, ctx, acknowledge_after_s=0)
    assert second == ModelSwitch(model=FAUX_3, queued=True)
    with pytest.raises(ModelSwitchRefused) as refused:
        await within(first)
    assert refused.value.code == "model_switch_refused"
    assert refused.value.details["reason"] == "superseded"
    assert conversation.config().model == FAUX  # the refused pick never applied

    watch = await conversation.watch(ctx)
    await turn.release()
    async for event in watch:
        if isinstance(event, ChatEventPublished):
            break
    watch.close()
    assert conversation.config().model == FAUX_3
    assert await rows(conversation, ctx) == [ModelSwitched(previous=FAUX, model=FAUX_3)]
    await conversations.close_all(ctx)


async def test_closing_the_conversation_drops_its_waiting_pick(store: Store, ctx: Context) -> None:
    hold = delay(asyncio.Event())
    conversations, _ = service(store, ["hi", reply("working", hold), "resumed"])
    conversation = await spoken(conversations, ctx)
    turn = await held_turn(conversations, conversation, hold, ctx)
    waiting = await waiting_switch(conversation, FAUX_2, ctx)
    await conversations.close(ALICE, conversation.id, ctx)
    with pytest.raises(ModelSwitchRefused) as refused:
        await within(waiting)
    assert refused.value.details["reason"] == "closed"
    assert conversation.waiting_model is None
    with pytest.raises(Exception):  # noqa: B017, PT011  (HarnessClosed: the drive was halted)
        await turn.task

    reopened = await conversations.open(ALICE, conversation.id, ctx)
    turn.gate.set()
    settled(await within(reopened.resume(ctx)))
    assert reopened.config().model == FAUX
    assert await rows(reopened, ctx) == []
    await conversations.close_all(ctx)


async def test_a_failure_after_the_acknowledgement_is_logged_and_recorded_with_a_typed_notice(
        store: Store, ctx: Context, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """CE-12: the model could run when the switch was queued; its key is gone when the turn ends."""
    hold = delay(asyncio.Event())
    conversations, _ = faux_service(store, ["hi", reply("working", hold)], models=[KEYED])
    conversation = await spoken(conversations, ctx)
    watch = await conversation.watch(ctx)
    turn = await held_turn(conversations, conversation, hold, ctx)
    monkeypatch.setenv("HARNESS_TEST_KEY", "set for now")
    ack = await conversations.switch_model(ALICE, conversation.id, KEYED_ID, ctx, acknowledge_after_s=0)
    assert ack.queued is True
    monkeypatch.delenv("HARNESS_TEST_KEY")
    with caplog.at_level(logging.ERROR, logger="harness.conversation"):
        await turn.release()
        async for event in watch:
            if isinstance(event, ChatEventPublished):
                break
    watch.close()

    [row] = await rows(conversation, ctx)
    assert isinstance(row, ErrorDetails)
    assert row.notice == ModelSwitchFailed(requested=KEYED_ID)
    assert row.text.startswith("the switch to faux/faux-keyed failed:")
    assert conversation.config().model == FAUX
    assert any("faux/faux-keyed" in record.getMessage() for record in caplog.records)
    await conversations.close_all(ctx)


async def test_a_model_that_cannot_run_here_is_refused_before_it_is_queued(store: Store, ctx: Context) -> None:
    """CE-12: a pick no provider serves is refused at once while a turn runs, not acknowledged
    `queued` and failed when the turn ends; nothing waits."""
    hold = delay(asyncio.Event())
    conversations, _ = service(store, ["hi", reply("working", hold)])
    conversation = await spoken(conversations, ctx)
    turn = await held_turn(conversations, conversation, hold, ctx)

    with pytest.raises(ModelUnavailable):
        await conversations.switch_model(ALICE, conversation.id, NOWHERE, ctx)

    assert conversation.waiting_model is None
    await turn.release()
    assert await rows(conversation, ctx) == []
    await conversations.close_all(ctx)


async def test_a_failure_before_the_acknowledgement_stays_a_synchronous_error(store: Store, ctx: Context) -> None:
    hold = delay(asyncio.Event())
    conversations, _ = service(store, ["hi", reply("working", hold)])
    conversation = await spoken(conversations, ctx)
    turn = await held_turn(conversations, conversation, hold, ctx)
    switching = asyncio.ensure_future(conversations.switch_model(ALICE, conversation.id, NOWHERE, ctx,
                                                                 wait_for_completion=True))
    await turn.release()
    with pytest.raises(ModelUnavailable):
        await within(switching)
    assert await rows(conversation, ctx) == []
    await conversations.close_all(ctx)


async def test_a_prompt_sent_while_a_switch_waits_runs_on_the_switched_model(store: Store, ctx: Context) -> None:
    """The switch holds the turn lock while it waits: the next admission waits behind it."""
    hold = delay(asyncio.Event())
    conversations, faux = service(store, ["hi", reply("working", hold), "on faux-2"])
    conversation = await spoken(conversations, ctx)
    turn = await held_turn(conversations, conversation, hold, ctx)
    assert (await conversations.switch_model(ALICE, conversation.id, FAUX_2, ctx, acknowledge_after_s=0)).queued
    following = asyncio.ensure_future(conversations.send(ALICE, conversation.id, "next", ctx))
    await turn.release()
    settled(await within(following))
    assert [request.model.id for request in faux.requests] == ["faux", "faux", "faux-2"]
    assert await roles(conversation, ctx) == ["user", "assistant", "user", "assistant", "custom", "user",
                                              "assistant"]
    await conversations.close_all(ctx)


async def test_a_switch_of_a_closed_conversation_applies_and_always_records(store: Store, ctx: Context) -> None:
    """The completion of a switch on a cold conversation records even before the first message."""
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    await conversations.close(ALICE, conversation.id, ctx)
    assert await conversations.switch_model(ALICE, conversation.id, FAUX_2, ctx) == ModelSwitch(model=FAUX_2,
                                                                                                 queued=False)
    with pytest.raises(ModelUnavailable):
        await conversations.switch_model(ALICE, conversation.id, NOWHERE, ctx)
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert reopened.config().model == FAUX_2
    assert await rows(reopened, ctx) == [ModelSwitched(previous=FAUX, model=FAUX_2)]
    await conversations.close_all(ctx)


# -- CE-14: the reasoning level, announced at admission -----------------------------------------


async def test_a_reasoning_change_is_announced_once_at_the_next_admission(store: Store, ctx: Context) -> None:
    """Nothing for the first turn or for cycling away and back; one row above the prompt for a
    real change; not again on the next turn, nor after a respawn."""
    conversations, faux = service(store, ["one", "two", "three", "four", "five"])
    conversation = await spoken(conversations, ctx)
    await conversation.set_thinking_level("high", ctx)
    await conversation.set_thinking_level("off", ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "cycled", ctx)))
    assert await rows(conversation, ctx) == []

    await conversation.set_thinking_level("high", ctx)
    assert await rows(conversation, ctx) == []  # recorded at admission only
    settled(await within(conversations.send(ALICE, conversation.id, "think harder", ctx)))
    changed = ReasoningChanged(previous="off", level="high")
    assert await rows(conversation, ctx) == [changed]
    sent = faux.requests[-1].request.messages
    assert [m.role for m in sent][-2:] == ["custom", "user"]

    settled(await within(conversations.send(ALICE, conversation.id, "again", ctx)))
    await conversations.close(ALICE, conversation.id, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "after a respawn", ctx)))
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert await rows(reopened, ctx) == [changed]
    await conversations.close_all(ctx)


async def test_a_change_announced_by_an_admission_whose_baseline_was_lost_is_not_announced_again(
        store: Store, ctx: Context) -> None:
    """The row an admission accepted counts as the baseline even when the baseline write after it
    never happened (a crash between the two commits)."""
    conversations, _ = service(store, ["one", "two", "three"])
    conversation = await spoken(conversations, ctx)
    stale = await conversation.journal.get(TURN_BASELINE, ctx)
    assert isinstance(stale, TurnBaseline)
    assert stale.level == "off"
    await conversation.set_thinking_level("medium", ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "announce", ctx)))
    await conversation.set_value(TURN_BASELINE, stale, ctx)  # as if that write was lost
    settled(await within(conversations.send(ALICE, conversation.id, "once more", ctx)))
    assert await rows(conversation, ctx) == [ReasoningChanged(previous="off", level="medium")]
    await conversations.close_all(ctx)


def service(store: Store, script: FauxScript, *, tools: Sequence[ProbeTool] = ()) -> tuple[ConversationService,
                                                                                      FauxProvider]:
    """A service whose registry also holds the second and third faux models."""
    return faux_service(store, script, tools=tools, models=[SECOND, THIRD])


async def test_a_switch_and_its_row_are_one_commit(store: Store, ctx: Context) -> None:
    """CE-10, CE-12: the store refusing the commit that writes the switch's row changes neither
    the model nor the rows. (The model was set in one commit and its row appended in a second, so
    a refusal or a close between them left a switch nobody was told of.)"""
    backend = RowRefusingBackend(store.backend)
    conversations, _ = faux_service(Store(backend, store.url), ["hi"], models=[SECOND])
    conversation = await spoken(conversations, ctx)
    backend.refuse_next_row = True

    with pytest.raises(StoreFull):
        await conversation.switch_model(FAUX_2, ctx)

    assert conversation.config().model == FAUX
    assert await rows(conversation, ctx) == []
    assert (await conversation.switch_model(FAUX_2, ctx)).queued is False
    assert await rows(conversation, ctx) == [ModelSwitched(previous=FAUX, model=FAUX_2)]
    await conversations.close_all(ctx)


class RowRefusingBackend(RecordingBackend):
    """Refuses, once asked, the next commit that adds an entry, as a full disk would."""

    refuse_next_row = False

    async def commit(self, session_id: str, writes: Sequence[Write], claim: Claim | None,
                     context: Context) -> CommitResult:
        if self.refuse_next_row and any(isinstance(write, InsertEntry) for write in writes):
            self.refuse_next_row = False
            raise StoreFull("the disk is full")
        return await super().commit(session_id, writes, claim, context)
