"""Conversations and their chat events, through `ConversationService` on every backend: owners
(issue 13 item 1), chat events (CE-1 to CE-6), stopped and failed turns (CE-7 to CE-9), the
rename of a closed conversation (CE-15) and the typed live stream (CE-26)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from conversation_helpers import faux_service as service
from conversation_helpers import rows_of, transcript
from drive_helpers import FAUX, ProbeTool, text, within
from harness.context import Context
from harness.conversation import (
    CHAT_EVENT_TYPE,
    Alert,
    ChatEventPublished,
    CompactionStopped,
    ConversationService,
    ConversationSetup,
    ErrorDetails,
    Forbidden,
    InstanceEvent,
    Interrupted,
    ModelSwitched,
    Presence,
    Renamed,
    TurnActivity,
    chat_event_of,
    last_turn_error_text,
    parse_chat_event_details,
    render_chat_event_for_model,
)
from harness.conversation.service import OWNER
from harness.errors import HarnessError
from harness.messages import AssistantMessage, CustomMessage, Message, ModelIdentity
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry
from harness.providers.faux import delay, failure, reply, thinking, tool_call
from harness.runtime import CompactionSettings, DriveSettings, EntryAdded, RunEnd, RunHooks, Settled
from harness.session import LaneConfig, SetValue, Store, addresses
from harness_helpers import RecordingBackend

ALICE, BOB = "alice", "bob"
CONFIG = LaneConfig(model=FAUX)
OTHER_MODEL = ModelIdentity(provider="openai", model_id="gpt-4o")


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled)
    return outcome


# -- conversations and owners --------------------------------------------------------------------


async def test_each_call_checks_the_owner_and_a_listing_shows_only_ones_own(store: Store, ctx: Context) -> None:
    conversations, _ = service(store, [])
    mine = await conversations.create(ALICE, CONFIG, ctx, name="mine")
    theirs = await conversations.create(BOB, CONFIG, ctx)

    assert [info.id for info in await conversations.list(ALICE, ctx)] == [mine.id]
    for call in (lambda: conversations.open(BOB, mine.id, ctx),
                 lambda: conversations.record(BOB, mine.id, Renamed(name="x"), ctx),
                 lambda: conversations.rename(BOB, mine.id, "taken", ctx),
                 lambda: conversations.close(BOB, mine.id, ctx)):
        with pytest.raises(Forbidden) as refused:
            await call()
        assert refused.value.code == "forbidden"
    assert await transcript(mine, ctx) == []
    assert (await conversations.list(ALICE, ctx))[0].name == "mine"
    assert await conversations.open(ALICE, mine.id, ctx) is mine  # the live one
    assert theirs.id != mine.id
    await conversations.close_all(ctx)


async def test_a_conversations_owner_is_read_once_however_often_it_is_opened(store: Store, ctx: Context) -> None:
    """Issue 29: an owner never changes, so the service reads it once (a worker asks it, then opens
    the conversation; a server opens it at every turn), and still refuses another user."""
    recording = RecordingBackend(store.backend)
    conversations, _ = service(Store(recording, store.url), [])
    made = await conversations.create(ALICE, CONFIG, ctx)
    await conversations.close_all(ctx)
    recording.reads.clear()

    assert await conversations.owner_of(made.id, ctx) == ALICE
    for _ in range(2):
        await conversations.open(ALICE, made.id, ctx)
        await conversations.close_all(ctx)
    with pytest.raises(Forbidden):
        await conversations.open(BOB, made.id, ctx)

    assert recording.reads.count(("value", OWNER.namespace, OWNER.key)) == 1


async def test_one_damaged_session_does_not_take_the_listing_down(
        store: Store, ctx: Context, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 29: a session whose owner no longer decodes is left out of every listing, one whose
    name no longer decodes is listed nameless, both said in the log; the others are listed."""
    conversations, _ = service(store, [])
    mine = await conversations.create(ALICE, CONFIG, ctx, name="mine")
    renamed = await conversations.create(ALICE, CONFIG, ctx, name="to be damaged")
    lost = await conversations.create(ALICE, CONFIG, ctx, name="its owner damaged")
    await conversations.close_all(ctx)
    name = addresses.session_name()
    await store.backend.commit(renamed.id, [SetValue(name.namespace, name.key, '{"not": "a name"}')], None, ctx)
    await store.backend.commit(lost.id, [SetValue(OWNER.namespace, OWNER.key, "[1, 2]")], None, ctx)

    listed = {info.id: info.name for info in await conversations.list(ALICE, ctx)}

    assert listed == {mine.id: "mine", renamed.id: None}
    assert renamed.id in caplog.text
    assert lost.id in caplog.text


# -- chat events (CE-1 to CE-6) -------------------------------------------------------------------


async def test_a_chat_event_is_one_entry_the_model_reads_live_and_after_a_restore(store: Store, ctx: Context) -> None:
    """CE-1, CE-2: one custom-message entry with the typed details and the model's text, stored
    once; the next request carries it, and so does the first after the conversation is reopened."""
    conversations, faux = service(store, ["first", "second"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversation.send("hello", ctx)))
    switched = ModelSwitched(previous=FAUX, model=OTHER_MODEL)
    assert await conversation.record(switched, ctx) is True

    stored = [m for m in await transcript(conversation, ctx) if isinstance(m, CustomMessage)]
    assert len(stored) == 1
    assert stored[0].custom_type == CHAT_EVENT_TYPE
    assert stored[0].content == render_chat_event_for_model(switched)
    assert stored[0].content == "[The person switched the model to openai/gpt-4o.]"
    assert chat_event_of(stored[0]) == switched

    await conversations.close(ALICE, conversation.id, ctx)
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    settled(await within(reopened.send("again", ctx)))
    sent = list(faux.requests[-1].request.messages)
    assert [m for m in sent if isinstance(m, CustomMessage)] == stored
    await conversations.close_all(ctx)


async def test_recording_never_starts_a_turn_and_a_refused_append_says_false(store: Store, ctx: Context) -> None:
    """CE-3: no request is made for a row, and a harness that cannot append answers False."""
    conversations, faux = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    assert await conversation.record(Renamed(name="a name"), ctx) is True
    assert faux.requests == []
    await conversation.detach_now(ctx)
    assert await conversation.record(Renamed(name="another"), ctx) is False


async def test_a_row_recorded_during_a_tool_call_waits_for_its_result(store: Store, ctx: Context) -> None:
    """CE-4, CE-11: while the run is open the row is a pending write, placed at the next boundary,
    never between the call and its result."""
    probe = ProbeTool()
    gate = probe.gate("k")
    conversations, _ = service(store, [reply(tool_call("probe", {"key": "k"})), "done"], tools=[probe])
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX, active_tools=["probe"]), ctx)
    running = asyncio.ensure_future(conversation.send("go", ctx))
    await probe.wait_started("k")
    assert await conversation.record(Renamed(name="while a tool runs"), ctx) is True
    gate.set()
    settled(await within(running))

    roles = [m.role for m in await transcript(conversation, ctx)]
    assert roles == ["user", "assistant", "tool_result", "custom", "assistant"]
    await conversations.close_all(ctx)


async def test_a_row_recorded_while_the_final_reply_streams_starts_no_step(store: Store, ctx: Context) -> None:
    """CE-3: the row waits for the run's end and is placed there; the model is not asked again."""
    release = asyncio.Event()
    held = delay(release)
    conversations, faux = service(store, [reply("the answer", held)])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    running = asyncio.ensure_future(conversation.send("a question", ctx))
    await within(held.reached.wait())
    assert await conversation.record(Renamed(name="while it answers"), ctx)
    release.set()
    assert settled(await within(running)).result.outcome == "completed"

    assert len(faux.requests) == 1
    assert [m.role for m in await transcript(conversation, ctx)] == ["user", "assistant", "custom"]
    await conversations.close_all(ctx)


def test_a_shape_this_version_does_not_know_renders_nothing_and_logs_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """CE-5."""
    with caplog.at_level(logging.ERROR, logger="harness.conversation"):
        assert parse_chat_event_details({"kind": "teleported", "v": 1}) is None
        assert parse_chat_event_details({"kind": "error", "v": 2, "text": "x"}) is None
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2


# -- stopped and failed turns (CE-7 to CE-9) -------------------------------------------------------


async def test_an_aborted_turn_leaves_one_interrupted_row_published_before_its_end(
        store: Store, ctx: Context) -> None:
    """CE-7: one row with the cause, committed in the settlement and published before run_end;
    CE-8: the next request replays the cut reply's text (not its reasoning) before that row."""
    held = delay(asyncio.Event())
    conversations, faux = service(store, [reply(thinking("secret plan"), "I was saying", held), "a new answer"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    watch = await conversation.watch(ctx)
    running = asyncio.ensure_future(conversation.send("talk", ctx))
    await within(held.reached.wait())
    await conversation.stop(ctx)
    assert settled(await within(running)).result.outcome == "aborted"

    published: list[object] = []
    async for event in watch:
        published.append(event)
        if isinstance(event, RunEnd):
            break
    watch.close()
    kinds = [type(event).__name__ for event in published]
    assert kinds.index("ChatEventPublished") < kinds.index("RunEnd")
    row = next(event for event in published if isinstance(event, ChatEventPublished))
    assert row.row.details == Interrupted(cause="user")
    assert rows_of(await transcript(conversation, ctx)) == [Interrupted(cause="user")]

    settled(await within(conversation.send("go on", ctx)))
    sent = list(faux.requests[-1].request.messages)
    replayed = [m for m in sent if isinstance(m, AssistantMessage)]
    assert len(replayed) == 1
    assert replayed[0].stop_reason == "stop"
    assert text(replayed[0]) == "I was saying"
    assert all(block.type == "text" for block in replayed[0].content)
    assert [m.role for m in sent] == ["user", "assistant", "custom", "user"]
    await conversations.close_all(ctx)


async def test_a_run_aborted_for_a_deleted_conversation_or_a_probe_records_nothing(
        store: Store, ctx: Context) -> None:
    """CE-7: the `deleted` and `probe` causes leave no row."""
    for cause in ("deleted", "probe"):
        held = delay(asyncio.Event())
        conversations, _ = service(store, [reply("partial", held)])
        conversation = await conversations.create(ALICE, CONFIG, ctx)
        running = asyncio.ensure_future(conversation.send("talk", ctx))
        await within(held.reached.wait())
        await conversation.stop(ctx, cause=cause)
        assert settled(await within(running)).result.abort_cause == cause
        assert rows_of(await transcript(conversation, ctx)) == []
        await conversations.close_all(ctx)


async def test_a_failed_turn_leaves_one_error_row_with_public_text(store: Store, ctx: Context) -> None:
    """CE-9: the row's text is the provider's, cleaned of markup and cut; `last_turn_error_text`
    reads it back; a provider's own text has no notice."""
    raw = "<html><body><h1>502 Bad Gateway</h1>" + "upstream said no " * 100 + "</body></html>"
    conversations, _ = service(store, [failure("other", raw)])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    assert settled(await within(conversation.send("hi", ctx))).result.outcome == "failed"

    messages = await transcript(conversation, ctx)
    [row] = rows_of(messages)
    assert isinstance(row, ErrorDetails)
    assert row.notice is None
    assert row.text.startswith("502 Bad Gateway upstream said no")
    assert "<" not in row.text
    assert len(row.text) <= 600
    assert last_turn_error_text(messages) == row.text
    await conversations.close_all(ctx)


class HookRefused(HarnessError):
    code = "hook_refused"


async def test_a_drive_that_raises_after_admission_leaves_one_error_row(store: Store, ctx: Context) -> None:
    """CE-9 (a turn that failed after admission): a door's hook raising out of the drive leaves
    one error row with the cleaned text, however many drives of the open run fail; a stop then
    settles it without calling the model."""
    async def refuse(messages: list[Message], context: Context) -> list[Message]:
        raise HookRefused("<b>the context store</b> is down")

    conversations, faux = service(store, ["never"], setup=ConversationSetup(
        drive=DriveSettings(frame_interval_s=0), hooks=RunHooks(transform_context=refuse)))
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    with pytest.raises(HookRefused):
        await within(conversation.send("hi", ctx))
    with pytest.raises(HookRefused):
        await within(conversation.resume(ctx))
    row = ErrorDetails(text="the context store is down")
    assert rows_of(await transcript(conversation, ctx)) == [row]

    await conversation.stop(ctx)
    assert settled(await within(conversation.resume(ctx))).result.outcome == "aborted"
    assert faux.requests == []
    await conversations.close_all(ctx)


async def test_a_compaction_circuit_breaker_stop_leaves_an_error_row_with_its_stop_report(
        store: Store, ctx: Context) -> None:
    """CE-9: after three failed compactions in a row the run goes on without compacting, and one
    error row, whose notice is the typed stop report, is placed at the run's next boundary."""
    broken = failure("invalid_request", "summaries are refused")
    faux = FauxProvider([reply("x " * 200), broken, broken, broken, "done"])
    registry = ModelRegistry([FAUX_MODEL.model_copy(update={"context_window": 100})], providers={"faux": faux})
    settings = DriveSettings(frame_interval_s=0,
                             compaction=CompactionSettings(reserve_tokens=10, keep_recent_tokens=30))
    conversations = ConversationService(store, ConversationSetup(models=registry, drive=settings))
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversation.send("first", ctx)))
    assert settled(await within(conversation.send("y " * 100, ctx))).result.outcome == "completed"
    await conversations.close(ALICE, conversation.id, ctx)

    reopened = await conversations.open(ALICE, conversation.id, ctx)
    [row] = rows_of(await transcript(reopened, ctx))
    assert isinstance(row, ErrorDetails)
    assert row.notice == CompactionStopped(failures=3, last_error="compaction_failed")
    await conversations.close_all(ctx)


# -- rename of a closed conversation (CE-15) and the cold path ------------------------------------


async def test_renaming_a_closed_conversation_appends_one_row_the_next_restore_reads(
        store: Store, ctx: Context) -> None:
    """Spoken in first: before the first message a rename records no row (CE-13)."""
    conversations, _ = service(store, ["hi"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversation.send("hello", ctx)))
    await conversations.close(ALICE, conversation.id, ctx)

    assert await conversations.rename(ALICE, conversation.id, "a better name", ctx) is True
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert reopened.info.name == "a better name"
    assert rows_of(await transcript(reopened, ctx)) == [Renamed(name="a better name")]
    await conversations.close_all(ctx)


async def test_a_cold_row_for_a_run_a_stopped_process_left_open_waits_for_its_boundary(
        store: Store, ctx: Context) -> None:
    """CE-10, CE-11: recorded from outside while the run a closed harness left open is in its
    tool call, the row is a pending write placed after the call's result when the run resumes."""
    probe = ProbeTool(replay="safe")
    probe.gate("k")
    conversations, _ = service(store, [reply(tool_call("probe", {"key": "k"})), "done"], tools=[probe])
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX, active_tools=["probe"]), ctx)
    running = asyncio.ensure_future(conversation.send("go", ctx))
    await probe.wait_started("k")
    await conversations.close(ALICE, conversation.id, ctx)  # stops where it is, as a crash would
    with pytest.raises(Exception):  # noqa: B017, PT011  (HarnessClosed: the drive was halted)
        await running

    assert await conversations.record(ALICE, conversation.id, Renamed(name="from outside"), ctx) is True
    probe.gate("k").set()
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    settled(await within(reopened.resume(ctx)))
    roles = [m.role for m in await transcript(reopened, ctx)]
    assert roles == ["user", "assistant", "tool_result", "custom", "assistant"]
    await conversations.close_all(ctx)


async def test_the_live_stream_types_chat_event_rows_when_their_append_commits(store: Store, ctx: Context) -> None:
    """CE-26: a `chat_event` row in the stream, right before the entry it came from."""
    conversations, _ = service(store, [])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    watch = await conversation.watch(ctx)
    assert await conversation.record(Renamed(name="streamed"), ctx)
    seen: list[object] = []
    async for event in watch:
        seen.append(event)
        if isinstance(event, EntryAdded):
            break
    watch.close()
    published = [event for event in seen if isinstance(event, ChatEventPublished)]
    assert [event.row.details for event in published] == [Renamed(name="streamed")]
    assert seen.index(published[0]) == len(seen) - 2
    await conversations.close_all(ctx)


async def test_the_instance_feed_carries_activity_and_presence_and_no_chat_events(store: Store, ctx: Context) -> None:
    """CE-26: the service's feed says which conversations are live and what their turns do, with
    a failed turn's public error text as its row stores it (CE-9), and never a chat-event row."""
    conversations, _ = service(store, ["fine", failure("other", "<b>quota</b> exceeded")])
    feed = conversations.feed.watch()
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversation.send("one", ctx)))
    settled(await within(conversation.send("two", ctx)))
    assert await conversation.record(Renamed(name="renamed"), ctx)
    await conversations.close(ALICE, conversation.id, ctx)

    seen: list[InstanceEvent] = []
    async for event in feed:
        seen.append(event)
        if isinstance(event, Presence) and not event.live:
            break
    feed.close()
    assert all(isinstance(event, TurnActivity | Presence | Alert) for event in seen)
    assert [(type(e).__name__, getattr(e, "running", None), getattr(e, "outcome", None)) for e in seen] == [
        ("Presence", None, None), ("TurnActivity", True, None), ("TurnActivity", False, "completed"),
        ("TurnActivity", True, None), ("TurnActivity", False, "failed"), ("Presence", None, None)]
    failed = seen[4]
    assert isinstance(failed, TurnActivity)
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert failed.error_text == last_turn_error_text(await transcript(reopened, ctx))
    assert failed.error_text == "quota exceeded"
    await conversations.close_all(ctx)
