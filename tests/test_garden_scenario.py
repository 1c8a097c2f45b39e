"""A garden actually runs (issue 15): its faux gardener tends, concludes a durable goal started by
`/goal` in a conversation, and answers a converse goal; the inbox, the notes, the per-run records,
the event feed and the conversation hold exactly what OM-1 to OM-9 say."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conversation_helpers import faux_service, rows, transcript
from drive_helpers import text, within
from garden_helpers import ANSWER, CONCLUDED, OWNER, SURVEY, conversation, conversations, files_in, make_garden
from harness.context import Context
from harness.conversation import (
    CommandRan,
    Conversation,
    ConversationEnded,
    GardenMessage,
    GoalOutcome,
    GoalStatus,
    chat_event_of,
    run_typed_command,
)
from harness.conversation.garden_messages import garden_message_of
from harness.garden import (
    ConversationOrigin,
    Garden,
    GoalChanged,
    RunFinished,
    TendFinished,
    goal_command,
    read_garden_events,
    read_operator_message_records,
    schema_errors,
    validate_operator_message_record,
)
from harness.messages import ToolResultMessage, UserMessage
from harness.providers.faux import FauxReply, FauxRequest, reply, tool_call
from harness.runtime import AgentHarness, RunEnd, ToolEnd
from harness.session import Store


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'harness.db'}"


async def test_a_garden_tends_concludes_a_goal_from_goal_and_answers_a_conversation(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """OM-1, OM-2, OM-4, OM-5, OM-6, OM-9, CE-16: every write lands where its policy says."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    root = garden.root
    talk = await conversation(service, ctx)
    tend = await garden.add_goal("tend", "Water the beds and look around.", ctx, every_s=3600)

    # /goal in the conversation: the row above the kickoff turn, then the goal with its origin.
    commands = {"goal": goal_command(garden)}
    outcome = await within(run_typed_command(service, OWNER, talk, "/goal Turn the compost heap", ctx,
                                             commands=commands))
    assert isinstance(outcome, GoalOutcome)
    durable = garden.goal(outcome.goal_id)
    assert (durable.type, durable.status, durable.text) == ("durable", "active", "Turn the compost heap")
    messages = await transcript(talk, ctx)
    command_row = next(i for i, m in enumerate(messages) if isinstance(chat_event_of(m), CommandRan))
    kickoff = next(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
    assert command_row < kickoff  # CE-16: the goal row sits above the turn it starts
    assert durable.origin is not None
    assert durable.origin.conversation_id == talk.id

    asking = await conversation(service, ctx)
    question = await garden.add_goal("converse", "How much sun do tomatoes want?", ctx,
                                     origin=ConversationOrigin(conversation_id=asking.id, message_id="m-1"))

    finished = await within(garden.tend(ctx))

    # The tend run: a note, out of band, and its tend_finished derived from its records (OM-9).
    tend_event = next(event for event in finished if isinstance(event, TendFinished))
    tend_records = read_operator_message_records(tend_event.run_id, root=root)
    assert [(r.kind, r.transcript_policy, r.delivery_policy) for r in tend_records] == [
        ("tend_survey", "none", "out_of_band_note")]
    note = tend_records[0]
    assert note.origin is None
    assert note.conversation_message_id is None
    assert note.delivery_path == f"inbox/allotment/notes/{note.emission_id}.md"
    assert (root.path / note.delivery_path).read_text() == SURVEY + "\n"
    assert (tend_event.goal_id, tend_event.status, tend_event.operator_note_written,
            tend_event.operator_note_path) == (tend.id, "completed", True, note.delivery_path)

    # The durable goal: concluded, its note canonical in the conversation, a copy in the reply folder.
    durable_event = next(e for e in finished if isinstance(e, RunFinished) and e.goal_id == durable.id)
    concluded = read_operator_message_records(durable_event.run_id, root=root)
    assert [(r.kind, r.transcript_policy, r.delivery_policy) for r in concluded] == [
        ("recently_concluded", "canonical", "reply_copy")]
    record = concluded[0]
    assert record.emission_id is not None
    assert record.origin == durable.origin
    assert record.delivery_path == f"inbox/allotment/{record.emission_id}.md"
    assert garden.goal(durable.id).status == "done"
    said = [(entry_id, details) for entry_id, details in await garden_messages(talk, ctx)]
    assert said == [(record.conversation_message_id, GardenMessage(
        garden="allotment", kind="recently_concluded", emission_id=record.emission_id, goal_id=durable.id,
        run_id=durable_event.run_id, text=CONCLUDED))]
    assert GoalStatus(goal_id=durable.id, status="done", title="Turn the compost heap") in await rows(talk, ctx)

    # The converse goal: answered in its conversation as the garden, with no operator record.
    answer_event = next(e for e in finished if isinstance(e, RunFinished) and e.goal_id == question.id)
    assert read_operator_message_records(answer_event.run_id, root=root) == []
    assert [d.text for _, d in await garden_messages(asking, ctx)] == [ANSWER]
    assert [d.kind for _, d in await garden_messages(asking, ctx)] == ["reply"]
    assert garden.goal(question.id).status == "done"

    # OM-5: the reply folder holds only the transcript-backed copy; the note is under notes/.
    assert files_in(root.reply_dir) == [f"{record.emission_id}.md"]
    assert files_in(root.notes_dir) == [f"{note.emission_id}.md"]
    assert (root.reply_dir / f"{record.emission_id}.md").read_text() == CONCLUDED + "\n"

    # Every record the code wrote passes the validator and the JSON Schema alike (OM-2, OM-3).
    for written in [*tend_records, *concluded]:
        line = written.model_dump(mode="json", exclude_none=True)
        assert validate_operator_message_record(line).ok
        assert schema_errors(line) == []

    # The feed carries the same, readable from the runtime root.
    feed = read_garden_events(root)
    assert tend_event in feed
    assert durable_event in feed
    assert answer_event in feed
    assert [(e.goal_id, e.status) for e in feed if isinstance(e, GoalChanged)] == [
        (durable.id, "done"), (question.id, "done")]

    # A second pass: the tend goal's schedule is not due, and the finished goals are done.
    assert await within(garden.tend(ctx, every_tend_goal=False)) == []
    await garden.close(ctx)
    await service.close_all(ctx)


async def garden_messages(talk: Conversation, ctx: Context) -> list[tuple[str, GardenMessage]]:
    """The garden messages on the conversation's branch, with their entry ids."""
    watch = await talk.watch(ctx)
    watch.close()
    found = []
    for entry in watch.snapshot.transcript:
        message = getattr(entry.payload, "message", None)
        if (details := garden_message_of(message)) is not None:
            found.append((entry.id, details))
    return found


async def test_the_gardeners_shell_commands_see_the_run_context(store: Store, tmp_path: Path, ctx: Context) -> None:
    """Issue 15 item 3: around a run the driver puts `HARNESS_GARDEN_*` in its subprocesses' environment."""
    def script(request: FauxRequest) -> FauxReply | str:
        if isinstance(request.request.messages[-1], ToolResultMessage):
            return "Seen."
        return reply(tool_call("shell", {"command": "env | grep ^HARNESS_GARDEN_ | sort"}))

    service, _ = faux_service(store, script)
    garden = await make_garden(store, service, tmp_path / "root", ctx, builtin_tools=("shell",))
    goal = await garden.add_goal("tend", "Look at the environment.", ctx)
    seen: list[str] = []
    harness = await garden_harness(garden, ctx)
    harness.add_listener(lambda event, _: seen.append(text(event.result)) if isinstance(event, ToolEnd) else None)
    event = await within(garden.pursue(goal.id, ctx))
    assert isinstance(event, TendFinished)
    assert event.operator_note_written is False  # no survey: nothing in the records, whatever the inbox holds
    output = seen[0]
    for line in ("HARNESS_GARDEN_NAME=allotment", f"HARNESS_GARDEN_GOAL_ID={goal.id}",
                 "HARNESS_GARDEN_GOAL_TYPE=tend", f"HARNESS_GARDEN_RUN_ID={event.run_id}",
                 "HARNESS_GARDEN_CALLER=gardener", f"HARNESS_GARDEN_ROOT={garden.root.path}"):
        assert line in output
    await garden.close(ctx)
    await service.close_all(ctx)


async def test_serve_tends_until_its_context_is_cancelled(store: Store, tmp_path: Path, ctx: Context) -> None:
    """Issue 15 item 1: `serve` keeps a garden tending; a tend goal runs when its schedule is due."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    goal = await garden.add_goal("tend", "Water the beds.", ctx, every_s=3600)
    ran = asyncio.Event()
    (await garden_harness(garden, ctx)).add_listener(lambda event, _: ran.set() if isinstance(event, RunEnd) else None)
    serving = Context({})
    task = asyncio.ensure_future(garden.serve(serving, poll_s=0.05))
    await within(ran.wait())
    serving.cancel("test over")  # the pass under way finishes; serve stops before the next
    await within(task)
    runs = [e for e in read_garden_events(garden.root) if isinstance(e, TendFinished)]
    assert [(e.goal_id, e.operator_note_written) for e in runs] == [(goal.id, True)]  # once: not due again
    await garden.close(ctx)
    await service.close_all(ctx)


async def test_an_ended_conversation_takes_no_turn(store: Store, ctx: Context) -> None:
    """OM-7's "still open": an ended conversation refuses a new turn, and ending twice writes nothing."""
    service, _ = conversations(store)
    talk = await conversation(service, ctx)
    assert await service.is_open(OWNER, talk.id, ctx)
    assert await service.end(OWNER, talk.id, ctx)
    assert not await service.end(OWNER, talk.id, ctx)
    with pytest.raises(ConversationEnded):
        await service.send(OWNER, talk.id, "hello?", ctx)
    assert not await service.is_open(OWNER, talk.id, ctx)
    await service.close_all(ctx)


async def garden_harness(garden: Garden, ctx: Context) -> AgentHarness:
    """The gardener's harness, attached by a first look at a lane (white-box: the test listens to it)."""
    return await garden._gardener(ctx)
