"""The garden doors of `harness serve` (issue 16 item 1): `/goal` from a conversation (202 once its
kickoff turn is accepted), a garden's goals and their actions, its inbox, and who may see them (the
garden's owner only; anyone else gets the 404 of a garden that does not exist)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from drive_helpers import FAUX, within
from garden_helpers import SURVEY, gardener_script
from harness.context import Context
from harness.conversation import CommandRan, GoalActionOutcome, GoalOutcome, GoalStatus
from harness.conversation.service import chat_event_rows
from harness.garden import ConversationOrigin, Garden, Gardener, GardenSetup
from harness.messages import UserMessage
from harness.runtime import Settled
from harness.server import StoreTokens
from harness.session import MessagePayload, Store, connect
from harness.session.ids import new_id
from server_helpers import USER, Served, asgi_client, faux_app


@pytest.fixture
async def store(tmp_path: Path, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Store]:
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))  # the gardens the server reaches live here
    opened = await connect(f"sqlite:///{tmp_path}/harness.db", ctx)
    yield opened
    await opened.close()


async def garden_of(served: Served, ctx: Context, name: str = "allotment", owner: str = USER) -> Garden:
    service = served.service
    setup = GardenSetup(store=service.store, service=service, models=service.setup.models)
    return await Garden.create(name, Gardener(model=FAUX), setup, ctx, owner=owner)


async def test_goal_gives_the_garden_a_goal_from_the_conversation_and_answers_once_its_turn_is_accepted(
        store: Store, ctx: Context) -> None:
    """CE-16: the command's row sits above the kickoff turn, the goal's origin is this
    conversation, the server drives the turn; a goal action shows there as a goal row; an empty
    text is refused (and recorded), and so is a `/goal` naming no garden when you have two."""
    served = faux_app(store, gardener_script)
    garden = await garden_of(served, ctx)
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    path = f"/api/conversations/{conversation.id}"
    async with asgi_client(served.app) as client:
        given = await client.post(f"{path}/goal", json={"text": "Turn the compost"})
        outcome = await within(served.app.state.server.drives.wait(given.json()["operation_id"]))
        paused = await client.post(f"/api/gardens/allotment/goals/{given.json()['goal_id']}/action",
                                   json={"action": "pause"})
        empty = await client.post(f"{path}/goal", json={"text": "  "})
        await garden_of(served, ctx, name="orchard")
        unnamed = await client.post(f"{path}/goal", json={"text": "Prune"})
        watch = await conversation.watch(ctx)
        watch.close()

    assert given.status_code == 202
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    goal = garden.goal(given.json()["goal_id"])
    assert goal.origin is not None
    assert goal.origin.conversation_id == conversation.id
    assert (goal.type, goal.text, goal.status) == ("durable", "Turn the compost", "paused")
    transcript = watch.snapshot.transcript
    rows = [row.details for row in chat_event_rows(transcript)]
    assert isinstance(rows[0], CommandRan)
    assert isinstance(rows[0].outcome, GoalOutcome)
    assert rows[0].outcome.goal_id == goal.id
    row_index = next(i for i, entry in enumerate(transcript) if chat_event_rows([entry]))
    assert transcript[row_index + 1].id == goal.origin.message_id  # the kickoff message, under the row
    assert paused.json()["status"] == "paused"
    assert GoalStatus(goal_id=goal.id, status="paused", title=goal.title) in rows
    assert empty.status_code == unnamed.status_code == 400
    assert empty.json()["code"] == unnamed.json()["code"] == "invalid_input"
    assert unnamed.json()["details"]["gardens"] == ["allotment", "orchard"]


async def test_a_goal_action_typed_as_goals_text_is_the_chats_command_with_its_row(store: Store, ctx: Context) -> None:
    """CE-16: `pause|resume|drop GOAL_ID` as `/goal`'s text is the command the chat's `/goal`
    runs: 200 with its typed outcome and no turn started, or the refusal whose exact text its
    row records; no goal row repeats the change in this conversation (CE-6)."""
    served = faux_app(store, gardener_script)
    garden = await garden_of(served, ctx)
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    goal = await garden.add_goal("durable", "Turn the compost", ctx,
                                 origin=ConversationOrigin(conversation_id=conversation.id, message_id="m-1"))
    path = f"/api/conversations/{conversation.id}"
    missing = new_id()
    async with asgi_client(served.app) as client:
        paused = await client.post(f"{path}/goal", json={"text": f"pause {goal.id}"})
        again = await client.post(f"{path}/goal", json={"text": f"pause {goal.id}"})
        unknown = await client.post(f"{path}/goal", json={"text": f"drop {missing}"})
        watch = await conversation.watch(ctx)
        watch.close()

    outcome = GoalActionOutcome(garden="allotment", goal_id=goal.id, title="Turn the compost", status="paused")
    assert paused.status_code == 200
    assert paused.json() == outcome.model_dump(mode="json")
    assert (again.status_code, again.json()["code"]) == (400, "invalid_input")
    assert again.json()["message"] == "goal 'Turn the compost' is paused; only an active goal is paused"
    assert (unknown.status_code, unknown.json()["code"]) == (404, "goal_not_found")
    assert [row.details for row in chat_event_rows(watch.snapshot.transcript)] == [
        CommandRan(name="goal", args=f"pause {goal.id}", outcome=outcome),
        CommandRan(name="goal", args=f"pause {goal.id}", error=again.json()["message"]),
        CommandRan(name="goal", args=f"drop {missing}", error=unknown.json()["message"]),
    ]
    assert not [entry for entry in watch.snapshot.transcript  # no turn started: no person's message
                if isinstance(entry.payload, MessagePayload) and isinstance(entry.payload.message, UserMessage)]
    assert garden.goal(goal.id).status == "paused"


async def test_goals_actions_and_the_inbox_are_the_gardens_owners_only(store: Store, ctx: Context) -> None:
    """A goal given over HTTP, tended, leaves a note in the inbox (OM-5: notes apart from replies);
    to another user the garden, its goals and its inbox answer as a garden that does not exist."""
    token, _ = await store.tokens.create(USER, ctx)
    bobs, _ = await store.tokens.create("bob", ctx)
    served = faux_app(store, gardener_script, auth=StoreTokens(store.tokens))
    garden = await garden_of(served, ctx)
    mine, theirs = {"Authorization": f"Bearer {token}"}, {"Authorization": f"Bearer {bobs}"}
    async with asgi_client(served.app) as client:
        added = await client.post("/api/gardens/allotment/goals", json={"type": "tend", "text": "Water the beds"},
                                  headers=mine)
        await garden.tend(ctx)
        inbox = await client.get("/api/gardens/allotment/inbox", headers=mine)
        dropped = await client.post(f"/api/gardens/allotment/goals/{added.json()['id']}/action",
                                    json={"action": "drop"}, headers=mine)
        goals = await client.get("/api/gardens/allotment/goals", headers=mine)
        listed = await client.get("/api/gardens", headers=mine)
        unknown_goal = await client.post("/api/gardens/allotment/goals/nope/action", json={"action": "resume"},
                                         headers=mine)
        as_bob = [await client.get("/api/gardens/allotment/inbox", headers=theirs),
                  await client.get("/api/gardens/allotment/goals", headers=theirs),
                  await client.post(f"/api/gardens/allotment/goals/{added.json()['id']}/action",
                                    json={"action": "resume"}, headers=theirs)]
        missing = await client.get("/api/gardens/nowhere/inbox", headers=theirs)
        bobs_gardens = await client.get("/api/gardens", headers=theirs)
    await garden.close(ctx)

    assert added.status_code == 201
    assert inbox.json()["replies"] == []
    assert [note["text"].strip() for note in inbox.json()["notes"]] == [SURVEY]
    assert dropped.json()["status"] == "dropped"
    assert [(goal["id"], goal["status"]) for goal in goals.json()] == [(added.json()["id"], "dropped")]
    assert [(g["name"], g["active_goals"]) for g in listed.json()] == [("allotment", 0)]
    assert unknown_goal.status_code == 404
    assert unknown_goal.json()["code"] == "goal_not_found"
    assert [answer.status_code for answer in as_bob] == [404, 404, 404]
    assert all(answer.json() == {**missing.json(), "message": missing.json()["message"].replace("nowhere", "allotment"),
                                 "details": {"garden": "allotment"}} for answer in as_bob)
    assert garden.goal(added.json()["id"]).status == "dropped"
    assert bobs_gardens.json() == []
