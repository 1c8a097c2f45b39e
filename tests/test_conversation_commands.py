"""Typed commands and local shell commands as chat events, through `ConversationService` on every
backend (issue 13 item 5): one `run_command` for every command and door (CE-16), the built-in
commands, `/compact` read by the model after its compaction, and `!cmd` rows (CE-17)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from conversation_helpers import faux_service, rows, transcript
from drive_helpers import FAUX, ProbeTool, text, within
from harness.context import Context
from harness.conversation import (
    ChatEventPublished,
    CommandInvocation,
    CommandRan,
    CompactOutcome,
    ConversationService,
    ConversationSetup,
    FastOutcome,
    Forbidden,
    ModelOutcome,
    ModeOutcome,
    NoFastModel,
    RecordNow,
    RenameOutcome,
    RestartOutcome,
    ShellRan,
    UnknownCommand,
    chat_event_of,
    compact,
    fast,
    mode,
    model,
    restart,
    run_typed_command,
)
from harness.conversation.command_rows import SHELL_OUTPUT_CHARS
from harness.conversation.commands import FAST_BEFORE
from harness.errors import InvalidInput, ModelUnavailable
from harness.messages import CustomMessage, ModelIdentity, UserMessage
from harness.providers import FAUX_MODEL, FauxProvider
from harness.providers.faux import FauxScript, reply
from harness.runtime import CompactionSettings, DriveOutcome, DriveSettings, Settled
from harness.session import CompactionPayload, LaneConfig, Store, addresses

ALICE, BOB = "alice", "bob"
FAST = ModelIdentity(provider="faux", model_id="faux-fast")
CONFIG = LaneConfig(model=FAUX, thinking_level="high")
KEEP_LITTLE = DriveSettings(frame_interval_s=0, compaction=CompactionSettings(keep_recent_tokens=40))
LONG = "word " * 60  # about 75 tokens: more than KEEP_LITTLE keeps


def settled(outcome: DriveOutcome) -> Settled:
    assert isinstance(outcome, Settled)
    return outcome


# -- run_command (CE-16) --------------------------------------------------------------------------


async def test_a_typed_command_records_one_row_and_a_programs_call_none(store: Store, ctx: Context) -> None:
    """CE-16: with an invocation one row with the outcome; without one, the same command runs unrecorded."""
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    typed = await model(conversations, ALICE, conversation, "faux/faux-fast", ctx)
    await model(conversations, ALICE, conversation, "faux/faux", ctx, typed=False)

    assert typed == ModelOutcome(model=FAST)
    assert conversation.config().model == FAUX
    assert await rows(conversation, ctx) == [CommandRan(name="model", args="faux/faux-fast", outcome=typed)]
    await conversations.close_all(ctx)


async def test_a_failed_command_records_the_exact_error_text_and_raises_it(store: Store, ctx: Context) -> None:
    """CE-16: the row holds the very message the caller is answered with; nothing else changed."""
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    with pytest.raises(ModelUnavailable) as unavailable:
        await model(conversations, ALICE, conversation, "nowhere/none", ctx)
    with pytest.raises(InvalidInput) as malformed:
        await mode(conversations, ALICE, conversation, "sideways", ctx)

    assert await rows(conversation, ctx) == [
        CommandRan(name="model", args="nowhere/none", error=unavailable.value.message),
        CommandRan(name="mode", args="sideways", error=malformed.value.message)]
    assert conversation.config() == CONFIG
    await conversations.close_all(ctx)


async def test_a_command_can_record_its_row_above_the_turn_it_starts(store: Store, ctx: Context) -> None:
    """CE-16: `record_now` places the row before the kickoff turn, and the row is recorded once."""
    conversations, faux = service(store, ["on it"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    async def kick_off(record_now: RecordNow) -> DriveOutcome:
        assert await record_now(None) is True
        return await conversation.send("review the diff", ctx)

    invocation = CommandInvocation(name="review", args="the diff")
    settled(await within(conversations.run_command(ALICE, conversation, invocation, kick_off, lambda _: None, ctx)))

    messages = await transcript(conversation, ctx)
    assert [chat_event_of(messages[0]), messages[1].role, messages[2].role] == [
        CommandRan(name="review", args="the diff"), "user", "assistant"]
    assert len(messages) == 3
    assert [m.role for m in faux.requests[0].request.messages] == ["custom", "user"]
    await conversations.close_all(ctx)


async def test_run_command_refuses_another_users_conversation_before_running(store: Store, ctx: Context) -> None:
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    ran = []

    async def run(record_now: RecordNow) -> None:
        ran.append(True)

    with pytest.raises(Forbidden):
        await conversations.run_command(BOB, conversation, CommandInvocation(name="x"), run, lambda _: None, ctx)
    assert ran == []
    assert await rows(conversation, ctx) == []
    await conversations.close_all(ctx)


async def test_a_session_value_of_the_harness_itself_cannot_be_written_by_an_application(
        store: Store, ctx: Context) -> None:
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    with pytest.raises(InvalidInput):
        await conversation.set_value(addresses.session_name(), "sneaked in", ctx)

    assert await conversation.session_name(ctx) is None
    await conversations.close_all(ctx)


# -- /compact (CE-17) -----------------------------------------------------------------------------


async def test_compact_records_after_the_compaction_entry_so_the_model_reads_it(store: Store, ctx: Context) -> None:
    """CE-17: the row follows the compaction entry, inside the context the next request sends."""
    conversations, faux = service(store, [reply(LONG), reply(LONG), "SUMMARY", "after"], drive=KEEP_LITTLE)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversation.send("first", ctx)))
    settled(await within(conversation.send("second", ctx)))

    outcome = await within(compact(conversations, ALICE, conversation, None, ctx))
    settled(await within(conversation.send("third", ctx)))

    watch = await conversation.watch(ctx)
    watch.close()
    payloads = [entry.payload for entry in watch.snapshot.transcript]
    assert isinstance(payloads[0], CompactionPayload)
    assert outcome == CompactOutcome(result="compacted", tokens_before=payloads[0].tokens_before)
    row = CommandRan(name="compact", outcome=outcome)
    sent = list(faux.requests[-1].request.messages)
    assert chat_event_of(sent[-2]) == row
    assert text(sent[-2]) == "[The person ran /compact. The conversation was compacted.]"
    assert isinstance(sent[-1], UserMessage)
    assert text(sent[-1]) == "third"
    await conversations.close_all(ctx)


async def test_compact_with_nothing_old_enough_records_why(store: Store, ctx: Context) -> None:
    """CE-5, CE-17: the lane's refusal is a typed outcome, not an error."""
    conversations, _ = service(store, ["short"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversation.send("hi", ctx)))

    outcome = await compact(conversations, ALICE, conversation, None, ctx)

    assert outcome == CompactOutcome(result="nothing_old_enough")
    assert (await rows(conversation, ctx))[-1] == CommandRan(name="compact", outcome=outcome)
    await conversations.close_all(ctx)


async def test_a_failed_compaction_records_its_public_reason(store: Store, ctx: Context) -> None:
    conversations, _ = service(store, [reply(LONG), reply(LONG), reply("cut", stop_reason="length")],
                               drive=KEEP_LITTLE)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversation.send("first", ctx)))
    settled(await within(conversation.send("second", ctx)))

    outcome = await within(compact(conversations, ALICE, conversation, "keep names", ctx))

    assert outcome == CompactOutcome(result="failed", error="the summary stopped early (length)")
    assert (await rows(conversation, ctx))[-1] == CommandRan(name="compact", args="keep names", outcome=outcome)
    await conversations.close_all(ctx)


# -- /fast, /mode, /rename, /restart ----------------------------------------------------------------


async def test_fast_switches_to_the_fast_model_and_back_to_what_was_set_across_a_restore(
        store: Store, ctx: Context) -> None:
    """`/fast` lowers the reasoning level too; what it switched from is a session value, so `/fast`
    after a reopen restores it."""
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    on = await fast(conversations, ALICE, conversation, None, ctx)
    await conversations.close(ALICE, conversation.id, ctx)
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    off = await fast(conversations, ALICE, reopened, None, ctx)

    assert on == FastOutcome(on=True, model=FAST, thinking_level="low")
    assert off == FastOutcome(on=False, model=FAUX, thinking_level="high")
    assert reopened.config() == CONFIG
    assert await reopened.journal.get(FAST_BEFORE, ctx) is None
    assert await rows(reopened, ctx) == [CommandRan(name="fast", outcome=on), CommandRan(name="fast", outcome=off)]
    await conversations.close_all(ctx)


async def test_fast_without_a_fast_model_is_refused_and_recorded(store: Store, ctx: Context) -> None:
    conversations = ConversationService(store, ConversationSetup())
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    with pytest.raises(NoFastModel) as refused:
        await fast(conversations, ALICE, conversation, None, ctx)

    assert refused.value.code == "no_fast_model"
    assert await rows(conversation, ctx) == [CommandRan(name="fast", error=refused.value.message)]
    assert conversation.config() == CONFIG
    await conversations.close_all(ctx)


async def test_plan_mode_offers_only_read_only_tools_and_build_every_one(store: Store, ctx: Context) -> None:
    reader, writer = ProbeTool("read", replay="safe"), ProbeTool("write")
    conversations, _ = service(store, [], tools=[reader, writer])
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX, active_tools=["read", "write"]), ctx)

    plan = await mode(conversations, ALICE, conversation, "plan", ctx)
    planned = conversation.config().active_tools
    build = await mode(conversations, ALICE, conversation, "build", ctx)

    assert (plan, planned) == (ModeOutcome(mode="plan"), ["read"])
    assert (build, conversation.config().active_tools) == (ModeOutcome(mode="build"), ["read", "write"])
    await conversations.close_all(ctx)


async def test_a_mode_selects_among_the_configured_tools_and_a_conversation_without_tools_gets_none(
        store: Store, ctx: Context) -> None:
    """CE-13: build gives back the tools the conversation was configured with, not every tool of
    the service (none to one configured with none, as the tiny embedded model is); plan mode
    survives a restore, and build after it, by either door, gives back what plan remembered."""
    reader, writer, shell = ProbeTool("read", replay="safe"), ProbeTool("write"), ProbeTool("shell")
    conversations, _ = service(store, [], tools=[reader, writer, shell])
    bare = await conversations.create(ALICE, LaneConfig(model=FAUX), ctx)
    configured = await conversations.create(ALICE, LaneConfig(model=FAUX, active_tools=["read", "write"]), ctx)

    await mode(conversations, ALICE, bare, "plan", ctx)
    await mode(conversations, ALICE, bare, "build", ctx)
    await mode(conversations, ALICE, configured, "plan", ctx)
    await conversations.close(ALICE, configured.id, ctx)
    reopened = await conversations.open(ALICE, configured.id, ctx)
    planned = (reopened.mode, reopened.config().active_tools)
    await conversations.select_mode(ALICE, reopened.id, "build", ctx)  # Shift+Tab's door

    assert (bare.mode, bare.config().active_tools) == ("build", [])
    assert planned == ("plan", ["read"])
    assert (reopened.mode, reopened.config().active_tools) == ("build", ["read", "write"])
    await conversations.close_all(ctx)


async def test_a_typed_line_runs_its_built_in_and_an_unknown_name_records_nothing(store: Store, ctx: Context) -> None:
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    outcome = await run_typed_command(conversations, ALICE, conversation, "/rename  the plan ", ctx)
    with pytest.raises(UnknownCommand):
        await run_typed_command(conversations, ALICE, conversation, "/nope now", ctx)

    assert outcome == RenameOutcome(name="the plan")
    assert (await conversations.list(ALICE, ctx))[0].name == "the plan"
    assert await rows(conversation, ctx) == [CommandRan(name="rename", args="the plan", outcome=outcome)]
    await conversations.close_all(ctx)


async def test_restart_writes_its_row_before_reopening_from_the_journal(store: Store, ctx: Context) -> None:
    """CE-17: the old conversation's stream publishes the row before its harness is disposed."""
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    watch = await conversation.watch(ctx)

    outcome = await restart(conversations, ALICE, conversation, None, ctx)

    seen = [event async for event in watch]  # the dispose ended the watch
    published = [event.row.details for event in seen if isinstance(event, ChatEventPublished)]
    assert published == [CommandRan(name="restart", outcome=RestartOutcome())]
    assert outcome == RestartOutcome()
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert reopened is not conversation
    assert await rows(reopened, ctx) == published
    await conversations.close_all(ctx)


# -- !cmd (CE-17) -----------------------------------------------------------------------------------


async def test_a_shell_row_precedes_the_next_message_which_is_sent_as_typed(store: Store, ctx: Context) -> None:
    """CE-17: the row goes in as is, and the prompt after it is unchanged."""
    conversations, faux = service(store, ["seen"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    assert await conversations.record_local_shell(ALICE, conversation.id, "ls", 0, "a.txt\n", ctx) is True
    settled(await within(conversation.send("what is in a.txt?", ctx)))

    sent = list(faux.requests[0].request.messages)
    assert [chat_event_of(m) if isinstance(m, CustomMessage) else text(m) for m in sent] == [
        ShellRan(command="ls", exit_code=0, output="a.txt\n"), "what is in a.txt?"]
    await conversations.close_all(ctx)


async def test_long_shell_output_keeps_its_end_on_a_closed_conversation(store: Store, ctx: Context) -> None:
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    await conversations.close(ALICE, conversation.id, ctx)
    output = "x" * SHELL_OUTPUT_CHARS + "the end"

    assert await conversations.record_local_shell(ALICE, conversation.id, "make", None, output, ctx) is True

    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert await rows(reopened, ctx) == [
        ShellRan(command="make", exit_code=None, output=output[-SHELL_OUTPUT_CHARS:], truncated=True)]
    await conversations.close_all(ctx)


def service(store: Store, script: FauxScript, *, tools: Sequence[ProbeTool] = (),
            drive: DriveSettings | None = None) -> tuple[ConversationService, FauxProvider]:
    """A service with a fast model (`FAST`, served by the faux provider too) for `/fast`."""
    setup = ConversationSetup(drive=drive or DriveSettings(frame_interval_s=0), fast_model=FAST)
    return faux_service(store, script, tools=tools, models=[FAUX_MODEL.model_copy(update={"id": FAST.model_id})],
                        setup=setup)
