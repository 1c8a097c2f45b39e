"""`/goal pause|resume|drop GOAL_ID` typed in a conversation (one conversation door): a goal
action is a command with one row, its typed outcome or its exact error text, and that row is the
change's one record in the conversation (CE-5, CE-6, CE-16)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.text import Text

from conftest import backend_url
from conversation_helpers import rows, transcript
from drive_helpers import FAUX, within
from garden_helpers import OWNER, conversation, conversations, make_garden
from harness.cli.chat_rows import chat_row
from harness.context import Context
from harness.conversation import (
    CommandOutcome,
    CommandRan,
    Conversation,
    ConversationService,
    GoalActionOutcome,
    GoalOutcome,
    GoalStatus,
    chat_event_of,
    run_typed_command,
)
from harness.errors import HarnessError, InvalidInput
from harness.garden import (
    ConversationOrigin,
    Garden,
    GardenNotFound,
    GoalChanged,
    GoalNotFound,
    GoalState,
    goal_action_of,
    goal_command,
    read_garden_events,
)
from harness.messages import CustomMessage
from harness.session import LaneConfig, Store
from harness.session.ids import new_id


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request)


async def typed(service: ConversationService, talk: Conversation, garden: Garden, line: str,
                ctx: Context) -> CommandOutcome:
    return await within(run_typed_command(service, OWNER, talk, line, ctx, commands={"goal": goal_command(garden)}))


async def refused(service: ConversationService, talk: Conversation, garden: Garden, line: str,
                  ctx: Context) -> HarnessError:
    with pytest.raises(HarnessError) as raised:
        await typed(service, talk, garden, line, ctx)
    return raised.value


async def test_pause_resume_and_drop_each_record_one_command_row_and_no_goal_row(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-16, CE-6: each typed action sets the goal's status and leaves exactly one row in the
    conversation, its command row with the typed outcome; no goal row repeats the change there,
    and the garden's feed still tells of each change."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    talk = await conversation(service, ctx)
    given = await typed(service, talk, garden, "/goal Turn the compost heap", ctx)
    assert isinstance(given, GoalOutcome)
    goal_id = given.goal_id
    before = await rows(talk, ctx)

    outcomes = [await typed(service, talk, garden, f"/goal {action} {goal_id}", ctx)
                for action in ("pause", "resume", "pause", "drop")]

    expected = [GoalActionOutcome(garden="allotment", goal_id=goal_id, title="Turn the compost heap", status=status)
                for status in ("paused", "active", "paused", "dropped")]
    assert outcomes == expected
    assert garden.goal(goal_id).status == "dropped"
    added = (await rows(talk, ctx))[len(before):]
    assert added == [CommandRan(name="goal", args=f"{action} {goal_id}", outcome=outcome)
                     for action, outcome in zip(("pause", "resume", "pause", "drop"), expected, strict=True)]
    assert not any(isinstance(row, GoalStatus) for row in added)
    changes = [(e.goal_id, e.status) for e in read_garden_events(garden.root) if isinstance(e, GoalChanged)]
    assert changes == [(goal_id, "paused"), (goal_id, "active"), (goal_id, "paused"), (goal_id, "dropped")]


async def test_the_model_reads_the_action_from_the_row_written_once(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-1, CE-5: the row's model text says what the action did, in English, from its outcome."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    talk = await conversation(service, ctx)
    given = await typed(service, talk, garden, "/goal Turn the compost heap", ctx)
    assert isinstance(given, GoalOutcome)

    await typed(service, talk, garden, f"/goal pause {given.goal_id}", ctx)

    last = (await transcript(talk, ctx))[-1]
    assert isinstance(last, CustomMessage)
    assert last.content == (f"[The person ran /goal pause {given.goal_id}. The goal 'Turn the compost heap' of "
                            "the garden allotment is paused until it is resumed.]")


@pytest.mark.parametrize(("status", "action", "rule"), [
    ("done", "resume", "only a paused goal is resumed"),
    ("dropped", "pause", "only an active goal is paused"),
    ("active", "resume", "only a paused goal is resumed"),
    ("paused", "pause", "only an active goal is paused"),
    ("done", "drop", "only an active or paused goal is dropped"),
])
async def test_an_action_the_goals_status_does_not_allow_is_recorded_as_its_error_and_changes_nothing(
        store: Store, tmp_path: Path, ctx: Context, status: GoalState, action: str, rule: str) -> None:
    """CE-16: a done or dropped goal is over, and an action to the status a goal has is no
    change: the person is answered `invalid_input`, the row records that exact text, and the goal
    keeps its status."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    talk = await conversation(service, ctx)
    goal = await garden.add_goal("durable", "Prune the roses", ctx,
                                 origin=ConversationOrigin(conversation_id=talk.id, message_id="m-1"))
    await garden.set_status(goal.id, status, ctx)
    before = await rows(talk, ctx)

    error = await refused(service, talk, garden, f"/goal {action} {goal.id}", ctx)

    assert isinstance(error, InvalidInput)
    assert error.message == f"goal 'Prune the roses' is {status}; {rule}"
    assert (await rows(talk, ctx))[len(before):] == [
        CommandRan(name="goal", args=f"{action} {goal.id}", error=error.message)]
    assert garden.goal(goal.id).status == status


async def test_an_unknown_goal_id_is_recorded_as_its_error(store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-16: `goal_not_found`, its exact text on the row, and no goal given either."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    talk = await conversation(service, ctx)
    missing = new_id()

    error = await refused(service, talk, garden, f"/goal drop {missing}", ctx)

    assert isinstance(error, GoalNotFound)
    assert await rows(talk, ctx) == [CommandRan(name="goal", args=f"drop {missing}", error=error.message)]
    assert garden.goals() == []


async def test_a_goal_from_another_conversation_is_acted_on_there_not_here(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-16: refused with its exact text recorded here; the goal and its own conversation are
    left as they were."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    home, elsewhere = await conversation(service, ctx), await conversation(service, ctx)
    given = await typed(service, home, garden, "/goal Turn the compost heap", ctx)
    assert isinstance(given, GoalOutcome)
    home_rows = await rows(home, ctx)

    error = await refused(service, elsewhere, garden, f"/goal pause {given.goal_id}", ctx)

    assert isinstance(error, InvalidInput)
    assert error.message == "goal 'Turn the compost heap' came from another conversation: act on it there"
    assert await rows(elsewhere, ctx) == [CommandRan(name="goal", args=f"pause {given.goal_id}", error=error.message)]
    assert await rows(home, ctx) == home_rows
    assert garden.goal(given.goal_id).status == "active"


async def test_a_goal_of_another_users_garden_is_refused_as_no_garden(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-16: a garden that is not the person's answers as one that does not exist; recorded,
    nothing changed."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    goal = await garden.add_goal("tend", "Water the beds", ctx)
    theirs = await service.create("bob", LaneConfig(model=FAUX), ctx)

    with pytest.raises(GardenNotFound) as raised:
        await within(run_typed_command(service, "bob", theirs, f"/goal pause {goal.id}", ctx,
                                       commands={"goal": goal_command(garden)}))

    assert raised.value.message == "no garden 'allotment'"
    assert await rows(theirs, ctx) == [CommandRan(name="goal", args=f"pause {goal.id}", error="no garden 'allotment'")]
    assert garden.goal(goal.id).status == "active"


async def test_a_goal_from_no_conversation_is_acted_on_from_its_owners_conversation(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-16: a goal no conversation gave (a tend goal) belongs to no other conversation; the
    command's row is the change's only record."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    goal = await garden.add_goal("tend", "Water the beds", ctx)
    talk = await conversation(service, ctx)

    outcome = await typed(service, talk, garden, f"/goal pause {goal.id.upper()}", ctx)

    assert outcome == GoalActionOutcome(garden="allotment", goal_id=goal.id, title="Water the beds", status="paused")
    assert await rows(talk, ctx) == [CommandRan(name="goal", args=f"pause {goal.id.upper()}", outcome=outcome)]
    assert garden.goal(goal.id).status == "paused"


async def test_a_status_change_recorded_elsewhere_still_shows_in_the_goals_own_conversation(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-6: `set_status` leaves out the goal row only in the conversation that records the change
    itself; the goal's origin conversation, when it is another, gets its goal row as before."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    home, elsewhere = await conversation(service, ctx), await conversation(service, ctx)
    goal = await garden.add_goal("durable", "Prune the roses", ctx,
                                 origin=ConversationOrigin(conversation_id=home.id, message_id="m-1"))

    await garden.set_status(goal.id, "paused", ctx, recorded_in=elsewhere.id)
    await garden.set_status(goal.id, "active", ctx, recorded_in=home.id)

    assert await rows(home, ctx) == [GoalStatus(goal_id=goal.id, status="paused", title="Prune the roses")]
    assert await rows(elsewhere, ctx) == []


@pytest.mark.parametrize(("args", "action"), [
    ("pause 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ("pause", "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")),
    ("  resume   0190A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B ", ("resume", "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")),
    ("drop 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", ("drop", "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")),
    ("pause the hedge trimming", None),
    ("pause hedges", None),
    ("Pause 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", None),
    ("drop 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b today", None),
    ("conclude 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", None),
    ("pause", None),
    (None, None),
])
def test_an_action_is_exactly_an_action_word_and_one_minted_goal_id(
        args: str | None, action: tuple[str, str] | None) -> None:
    """The rule that keeps `/goal TEXT` as it was: any other text is a new goal's."""
    assert goal_action_of(args) == action


async def test_a_goal_text_that_starts_with_an_action_word_gives_a_goal(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """CE-16: `/goal pause the hedge trimming` is a goal's text, recorded as `/goal TEXT` is."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    talk = await conversation(service, ctx)

    outcome = await typed(service, talk, garden, "/goal pause the hedge trimming", ctx)

    assert isinstance(outcome, GoalOutcome)
    assert garden.goal(outcome.goal_id).text == "pause the hedge trimming"


@pytest.mark.parametrize(("status", "said"), [("paused", "paused"), ("active", "resumed"), ("dropped", "dropped")])
def test_the_terminal_words_the_row_from_its_outcome(status: str, said: str) -> None:
    """CE-5: the terminal's row says what the action did from its typed outcome."""
    outcome = GoalActionOutcome.model_validate(
        {"garden": "allotment", "goal_id": "g-1", "title": "Prune the roses", "status": status})
    row = CommandRan(name="goal", args="pause g-1", outcome=outcome)

    assert Text.from_markup(chat_row(row)).plain == f"/goal pause g-1: goal Prune the roses {said}"


def test_a_row_of_the_action_reads_back_as_its_typed_outcome() -> None:
    """CE-5: the outcome is a closed, typed shape a reader validates."""
    row = CommandRan(name="goal", args="drop g-1",
                     outcome=GoalActionOutcome(garden="allotment", goal_id="g-1", title="t", status="dropped"))
    message = CustomMessage(custom_type="harness.chat-event", content="", details=row.model_dump(mode="json"))

    assert chat_event_of(message) == row
