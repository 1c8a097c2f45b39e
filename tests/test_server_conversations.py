"""The conversation routes of `harness serve` through HTTP: create, list, rename, close; owners;
the error shape; the command table."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from drive_helpers import within
from harness.context import Context
from harness.conversation import BUILT_IN_COMMANDS
from harness.session import Store, connect
from server_helpers import USER, asgi_client, faux_app, serving


@pytest.fixture
async def store(tmp_path: object, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(f"sqlite:///{tmp_path}/harness.db", ctx)
    yield opened
    await opened.close()


async def test_create_then_list_over_a_real_socket(store: Store) -> None:
    """A conversation created over HTTP is listed for its owner, newest first, with its name."""
    import httpx

    served = faux_app(store)
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url) as client:
        first = await client.post("/api/conversations", json={"name": "first"})
        second = await client.post("/api/conversations", json={})
        listed = await client.get("/api/conversations")

    assert first.status_code == second.status_code == 201
    assert [row["id"] for row in listed.json()] == [second.json()["id"], first.json()["id"]]
    assert listed.json()[1]["name"] == "first"


async def test_another_users_conversations_are_not_listed(store: Store, ctx: Context) -> None:
    served = faux_app(store)
    theirs = await served.service.create("bob", served.app.state.server.new_lane(None), ctx)
    async with asgi_client(served.app) as client:
        mine = (await client.post("/api/conversations", json={})).json()
        listed = (await client.get("/api/conversations")).json()

    assert [row["id"] for row in listed] == [mine["id"]]
    assert theirs.info.owner == "bob" != USER


async def test_a_malformed_body_is_400_with_the_error_shape_and_writes_nothing(store: Store, ctx: Context) -> None:
    served = faux_app(store)
    async with asgi_client(served.app) as client:
        answer = await client.post("/api/conversations", json={"name": "x", "colour": "blue"})

    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_input"
    assert set(answer.json()) == {"code", "message", "details"}
    assert await store.list_sessions(ctx) == []


async def test_the_commands_are_listed_with_the_command_tables_words(store: Store) -> None:
    """`GET /api/commands`: the built-in command table in its order, each as `{name, usage,
    summary}` with the words the table gives it, the ones the terminal's `/help` shows."""
    async with asgi_client(faux_app(store).app) as client:
        listed = await client.get("/api/commands")

    assert listed.status_code == 200, listed.text
    assert listed.json() == [{"name": name, "usage": command.usage, "summary": command.summary}
                             for name, command in BUILT_IN_COMMANDS.items()]
    assert listed.json()[list(BUILT_IN_COMMANDS).index("rename")] == {
        "name": "rename", "usage": "/rename NAME", "summary": "name the conversation"}


async def test_the_models_are_listed_and_a_conversation_view_names_its_current_model(
        store: Store, ctx: Context) -> None:
    """`GET /api/models` is the registry in preference order; a conversation's view names the model
    its next request goes to, the switched one after a switch, and another user's answers 404."""
    served = faux_app(store)
    theirs = await served.service.create("bob", served.app.state.server.new_lane(None), ctx)
    async with asgi_client(served.app) as client:
        models = (await client.get("/api/models")).json()
        mine = (await client.post("/api/conversations", json={"name": "mine"})).json()
        before = (await client.get(f"/api/conversations/{mine['id']}")).json()
        embedded = {"provider": models[1]["provider"], "model_id": models[1]["model_id"]}
        switched = await client.put(f"/api/conversations/{mine['id']}/model", json={"model": embedded})
        after = (await client.get(f"/api/conversations/{mine['id']}")).json()
        other = await client.get(f"/api/conversations/{theirs.id}")

    assert models[0] == {"provider": "faux", "model_id": "faux", "name": "Scripted test model",
                         "context_window": 128_000, "key_present": True}
    assert len(models) == 2  # and the embedded model, always in a registry
    assert before == {**mine, "model": {"provider": "faux", "model_id": "faux"}}
    assert switched.status_code == 200
    assert after["model"] == embedded
    assert other.status_code == 404


async def test_a_conversations_view_reads_its_own_row_as_the_listing_shows_it(store: Store, ctx: Context) -> None:
    """A view is read alone (`ConversationService.info`), not found in the whole listing, and
    shows the same name and times, `updated_at` moved by the turn since its creation."""
    served = faux_app(store, ["hi"])
    async with asgi_client(served.app) as client:
        created = (await client.post("/api/conversations", json={"name": "mine"})).json()
        await client.post("/api/conversations", json={"name": "another"})
        sent = (await client.post(f"/api/conversations/{created['id']}/messages", json={"text": "hi"})).json()
        await within(served.app.state.server.drives.wait(sent["operation_id"]))
        view = (await client.get(f"/api/conversations/{created['id']}")).json()
        listed = {row["id"]: row for row in (await client.get("/api/conversations")).json()}

    assert {key: view[key] for key in listed[created["id"]]} == listed[created["id"]]
    assert view["updated_at"] > created["updated_at"]
