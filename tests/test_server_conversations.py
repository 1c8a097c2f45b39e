"""The conversation routes of `harness serve` through HTTP: create, list, rename, close; owners;
the error shape."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from harness.context import Context
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
