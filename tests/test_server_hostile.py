"""`harness serve` against a hostile client (issue 29, part 4): a `--no-auth` server answers
loopback hosts and origins only (DNS rebinding); a revoked token's open streams end within
seconds; free-form fields and bodies have bounds; what a client gets wrong, and a damaged garden
or goal file, is a 4xx with a stable code that changes nothing, never a 500; a 503 names no host,
port or role."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from conftest import backend_url
from drive_helpers import FAUX, within
from harness.context import Context
from harness.garden import Garden, Gardener, GardenSetup
from harness.providers.faux import delay, reply
from harness.server import (
    MAX_REQUEST_BYTES,
    METADATA_BYTES,
    SHELL_COMMAND_CHARS,
    TEXT_CHARS,
    ServerOptions,
    StoreTokens,
)
from harness.server.gardens import INBOX_FILES, INBOX_TEXT_BYTES
from harness.session import Store, connect
from server_helpers import USER, Served, asgi_client, faux_app, forwarder, serving


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, ctx: Context,
                monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Store]:
    """SQLite and PostgreSQL, with HARNESS_HOME (where the server finds gardens) in `tmp_path`."""
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    opened = await connect(backend_url(request.param, tmp_path, request), ctx)
    yield opened
    await opened.close()


def ask(text: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}]}


async def new_conversation(client: httpx.AsyncClient, headers: dict[str, str] | None = None) -> str:
    created = await client.post("/api/conversations", json={}, headers=headers)
    assert created.status_code == 201, created.text
    conversation_id: str = created.json()["id"]
    return conversation_id


# -- DNS rebinding ------------------------------------------------------------------------------------


async def test_no_auth_answers_loopback_hosts_and_origins_only(store: Store, ctx: Context) -> None:
    """Issue 29: a page at evil.example that rebinding DNS points at the loopback port is refused
    (403 `host_not_allowed`, or `origin_not_allowed` from its scripts) before any route runs, so it
    creates nothing; loopback names and addresses, with or without a port, are served; a server
    with tokens answers any host (the token is its guard)."""
    served = faux_app(store)
    evil = {"Host": "evil.example:8765"}
    async with asgi_client(served.app) as client:
        created = await client.post("/api/conversations", json={}, headers=evil)
        listed = await client.get("/api/conversations", headers=evil)
        from_page = await client.post("/api/conversations", json={},
                                      headers={"Origin": "http://evil.example:8765"})
        null_origin = await client.get("/api/conversations", headers={"Origin": "null"})
        page = await client.get("/", headers=evil)
        loopback = [await client.get("/api/conversations", headers={"Host": host, "Origin": origin})
                    for host, origin in [("localhost:8765", "http://localhost:8765"), ("127.0.0.1", "http://127.0.0.1"),
                                         ("[::1]:8765", "http://[::1]:8765"), ("LOCALHOST", "http://localhost")]]
        remaining = await client.get("/api/conversations")
    token, _ = await store.tokens.create(USER, ctx)
    with_tokens = faux_app(store, auth=StoreTokens(store.tokens))
    async with asgi_client(with_tokens.app) as client:
        tokened = await client.get("/api/conversations", headers={**evil, "Authorization": f"Bearer {token}"})

    assert (created.status_code, created.json()["code"]) == (403, "host_not_allowed")
    assert (listed.status_code, page.status_code) == (403, 403)
    assert (from_page.status_code, from_page.json()["code"]) == (403, "origin_not_allowed")
    assert (null_origin.status_code, null_origin.json()["code"]) == (403, "origin_not_allowed")
    assert [answer.status_code for answer in loopback] == [200, 200, 200, 200]
    assert remaining.json() == []  # neither refused creation made a conversation
    assert tokened.status_code == 200


# -- revoked tokens ---------------------------------------------------------------------------------------


async def ends(client: httpx.AsyncClient, path: str, opened: asyncio.Event, headers: dict[str, str]) -> int:
    """Read the stream at `path` to its end; `opened` is set once its first bytes arrived. Returns
    its status."""
    async with client.stream("GET", path, headers=headers) as response:
        async for _ in response.aiter_bytes():
            opened.set()
    return response.status_code


async def test_streams_of_one_token_share_its_lookups(store: Store, ctx: Context) -> None:
    """Issue 29: the open streams of one token check it again through one lookup per half
    `token_check_s`, not one each (200 watchers on one token read the token table 40 times a
    second); a revocation is still seen once that lookup is stale."""
    lookups: list[str | None] = []
    tokens = StoreTokens(store.tokens)

    class Counted:
        async def user_of(self, token: str | None, context: Context) -> str:
            lookups.append(token)
            return await tokens.user_of(token, context)

    served = faux_app(store, auth=Counted(), options=ServerOptions(token_check_s=3_600))
    state = served.app.state.server
    token, info = await store.tokens.create(USER, ctx)

    users = await asyncio.gather(*(state.token_user(token, ctx) for _ in range(20)))
    await store.tokens.revoke(info.id, ctx)
    cached = await state.token_user(token, ctx)
    served_fresh = faux_app(store, auth=Counted(), options=ServerOptions(token_check_s=0))
    revoked = await served_fresh.app.state.server.token_user(token, ctx)

    assert users == [USER] * 20
    assert lookups[:1] == [token]
    assert len(lookups) == 2  # the twenty at once and the cached one: one lookup; the fresh server: one
    assert (cached, revoked) == (USER, None)


async def test_revoking_a_token_ends_its_open_streams_within_seconds(store: Store, ctx: Context) -> None:
    """Issue 29: the native watch and feed, the AI SDK stream of a turn in progress and the
    LangGraph run and thread streams, each opened with a token that is then revoked, end within
    `token_check_s` though their turn still runs and heartbeats would keep them up; a reconnect
    is 401. Another token's stream of the same conversation stays open."""
    hold = asyncio.Event()
    served = faux_app(store, [reply("a reply that waits", delay(hold), " to be let go")],
                      auth=StoreTokens(store.tokens), options=ServerOptions(token_check_s=0.05, heartbeat_s=0.02))
    token, info = await store.tokens.create(USER, ctx)
    other, _ = await store.tokens.create(USER, ctx)
    mine, theirs = {"Authorization": f"Bearer {token}"}, {"Authorization": f"Bearer {other}"}
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        conversation_id = await new_conversation(client, mine)
        run = await client.post(f"/threads/{conversation_id}/runs", headers=mine,
                                json={"assistant_id": "harness", "input": ask("hello")})
        run_id = run.json()["run_id"]
        streams = [f"/api/conversations/{conversation_id}/events", "/api/feed", f"/api/chat/{conversation_id}/stream",
                   f"/threads/{conversation_id}/runs/{run_id}/stream", f"/threads/{conversation_id}/stream"]
        opened = [asyncio.Event() for _ in streams]
        reading = [asyncio.create_task(ends(client, path, event, mine))
                   for path, event in zip(streams, opened, strict=True)]
        kept_open = asyncio.Event()
        kept = asyncio.create_task(ends(client, streams[0], kept_open, theirs))
        await within(asyncio.gather(*(event.wait() for event in [*opened, kept_open])))
        await store.tokens.revoke(info.id, ctx)
        statuses = await within(asyncio.gather(*reading), 5)
        again = await client.get(f"/api/conversations/{conversation_id}/events", headers=mine)
        still_open = not kept.done()
        hold.set()
        kept.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await kept

    assert statuses == [200] * len(streams)  # each ended by itself, none cut by the test
    assert (again.status_code, again.json()["code"]) == (401, "unauthorized")
    assert still_open


# -- bounds -----------------------------------------------------------------------------------------------


async def test_free_form_fields_are_bounded_and_refused_before_anything_is_made(store: Store, ctx: Context) -> None:
    """Issue 29: LangGraph thread and run `metadata` over `METADATA_BYTES`, a typed command line
    over `TEXT_CHARS` and a body over `MAX_REQUEST_BYTES` are refused (400 `invalid_input` naming
    the field, 413 `request_too_large`) and make no thread, run or row."""
    served = faux_app(store, ["unused"])
    big = {"notes": "x" * METADATA_BYTES}
    async with asgi_client(served.app) as client:
        thread = await client.post("/threads", json={"metadata": big})
        conversation_id = await new_conversation(client)
        run = await client.post(f"/threads/{conversation_id}/runs",
                                json={"assistant_id": "harness", "input": ask("hi"), "metadata": big})
        line = await client.post(f"/api/conversations/{conversation_id}/command",
                                 json={"line": "/rename " + "n" * TEXT_CHARS})
        body = await client.post("/threads", content=b" " * (MAX_REQUEST_BYTES + 1),
                                 headers={"Content-Type": "application/json"})
        threads = await client.post("/threads/search", json={})
        runs = await client.get(f"/threads/{conversation_id}/runs")
        view = await client.get(f"/api/conversations/{conversation_id}")

    assert (thread.status_code, thread.json()["code"]) == (400, "invalid_input")
    assert thread.json()["details"]["problems"][0]["loc"] == ["body", "metadata"]
    assert (run.status_code, run.json()["code"]) == (400, "invalid_input")
    assert (line.status_code, line.json()["code"]) == (400, "invalid_input")
    assert (body.status_code, body.json()["code"]) == (413, "request_too_large")
    assert [found["thread_id"] for found in threads.json()] == [conversation_id]
    assert runs.json() == []
    assert view.json()["name"] is None


async def test_a_shell_command_no_process_can_take_is_refused_and_runs_nothing(store: Store, ctx: Context,
                                                                              tmp_path: Path) -> None:
    """Issue 29: `.../shell` with a NUL, or longer than `SHELL_COMMAND_CHARS` (a 50 MB one is over
    the body bound), is 400 `invalid_input` (413 `request_too_large`), where it was a 500; nothing
    runs, and a command at the bound does."""
    served = faux_app(store)
    marker = tmp_path / "marker"
    async with asgi_client(served.app) as client:
        conversation_id = await new_conversation(client)
        shell = f"/api/conversations/{conversation_id}/shell"
        nul = await client.post(shell, json={"command": f"touch {marker}\x00"})
        long = await client.post(shell, json={"command": f"touch {marker} #" + "x" * SHELL_COMMAND_CHARS})
        huge = await client.post(shell, json={"command": "x" * 50_000_000})
        refused_all = not marker.exists()
        at_bound = f"touch {marker} #"
        ran = await client.post(shell, json={"command": at_bound + "x" * (SHELL_COMMAND_CHARS - len(at_bound))})

    assert [(answer.status_code, answer.json()["code"]) for answer in (nul, long, huge)] == [
        (400, "invalid_input"), (400, "invalid_input"), (413, "request_too_large")]
    assert refused_all
    assert ran.status_code == 200, ran.text
    assert marker.exists()


# -- the LangGraph door -------------------------------------------------------------------------------------


async def test_langgraph_event_ids_it_never_sent_are_refused_before_streaming(store: Store, ctx: Context) -> None:
    """Issue 29: a run stream's `Last-Event-ID` of superscript digits is 400 `invalid_event_id`
    (a 500 before), and a thread stream's naming no run of the thread 404 `run_not_found` before
    any of it streams (a 200, then a cut)."""
    served = faux_app(store, ["Hello."])
    async with asgi_client(served.app) as client:
        conversation_id = await new_conversation(client)
        run = await client.post(f"/threads/{conversation_id}/runs",
                                json={"assistant_id": "harness", "input": ask("hi")})
        run_id = run.json()["run_id"]
        superscript = await client.get(f"/threads/{conversation_id}/runs/{run_id}/stream",
                                       headers={b"Last-Event-ID": "¹-0-0".encode("latin-1")})  # read as "¹"
        thread = await client.get(f"/threads/{conversation_id}/stream", headers={"Last-Event-ID": "nope:0-0-0"})

    assert run.status_code == 200, run.text
    assert (superscript.status_code, superscript.json()["code"]) == (400, "invalid_event_id")
    assert (thread.status_code, thread.json()["code"]) == (404, "run_not_found")


async def test_a_lone_surrogate_in_run_metadata_is_cleaned_and_the_run_made_once(store: Store, ctx: Context) -> None:
    """Issue 29: a lone surrogate in a run's `metadata` (which UTF-8 cannot store) was a 500 after
    the run was made and driven, so a retrying client made it twice. Text from outside is cleaned
    at the boundary (U+FFFD), as the messages are: the run is made once and answered 200."""
    served = faux_app(store, ["Hello."])
    raw = b'{"assistant_id": "harness", "input": {"messages": [{"role": "user", "content": "hi"}]}, ' \
          b'"metadata": {"tag": "\\ud800"}}'
    async with asgi_client(served.app) as client:
        conversation_id = await new_conversation(client)
        made = await client.post(f"/threads/{conversation_id}/runs", content=raw,
                                 headers={"Content-Type": "application/json"})
        thread = await client.post("/threads", content=b'{"metadata": {"\\udfff": 1}}',
                                   headers={"Content-Type": "application/json"})
        runs = await client.get(f"/threads/{conversation_id}/runs")

    assert made.status_code == 200, made.text
    assert made.json()["metadata"] == {"tag": "\ufffd"}
    assert [found["run_id"] for found in runs.json()] == [made.json()["run_id"]]
    assert thread.status_code == 200, thread.text
    assert thread.json()["metadata"] == {"\ufffd": 1}


# -- gardens ------------------------------------------------------------------------------------------------


async def garden_of(served: Served, ctx: Context, name: str) -> Garden:
    service = served.service
    setup = GardenSetup(store=service.store, service=service, models=service.setup.models)
    return await Garden.create(name, Gardener(model=FAUX), setup, ctx, owner=USER)


async def test_a_damaged_garden_or_goal_file_hurts_that_garden_only(store: Store, ctx: Context,
                                                                    tmp_path: Path) -> None:
    """Issue 29: a torn `garden.json` made `GET /api/gardens` and `/goal` a 500 for every user, a
    folder with a name no garden has a 400, and a truncated goal file a plain-text 500. Now the
    other gardens list and take goals; the damaged garden answers 409 `garden_damaged`, the
    damaged goal 409 `goal_damaged` (JSON), and nothing is written."""
    served = faux_app(store, ["Noted."])
    torn = await garden_of(served, ctx, "allotment")
    whole = await garden_of(served, ctx, "orchard")
    goal = await whole.add_goal("durable", "Prune the pear", ctx)
    torn.root.garden_file.write_text(torn.root.garden_file.read_text()[:20])
    (tmp_path / "home" / "gardens" / "Not A Garden").mkdir()
    (tmp_path / "home" / "gardens" / "Not A Garden" / "garden.json").write_text("{}")
    truncated = whole.root.goal_file(goal.id)
    truncated.write_text(torn_goal := truncated.read_text()[:30])
    async with asgi_client(served.app) as client:
        listed = await client.get("/api/gardens")
        conversation_id = await new_conversation(client)
        given = await client.post(f"/api/conversations/{conversation_id}/goal", json={"text": "Water the figs"})
        damaged = await client.get("/api/gardens/allotment/goals")
        action = await client.post(f"/api/gardens/orchard/goals/{goal.id}/action", json={"action": "pause"})
        goals = await client.get("/api/gardens/orchard/goals")
        too_long = await client.post("/api/gardens/orchard/goals", json={"type": "durable", "text": "x" * (
            TEXT_CHARS + 1)})

    assert [garden["name"] for garden in listed.json()] == ["orchard"]
    assert given.status_code == 202, given.text  # your only readable garden
    assert given.json()["garden"] == "orchard"
    assert (damaged.status_code, damaged.json()["code"]) == (409, "garden_damaged")
    assert (action.status_code, action.json()["code"]) == (409, "goal_damaged")
    assert truncated.read_text() == torn_goal
    assert [found["text"] for found in goals.json()] == ["Water the figs"]
    assert (too_long.status_code, too_long.json()["code"]) == (400, "invalid_input")


async def test_the_inbox_is_bounded_in_files_and_in_each_files_text(store: Store, ctx: Context) -> None:
    """Issue 29: a garden that leaves a note at every tending, however large, is read as its
    newest `INBOX_FILES` notes, newest first, each at most `INBOX_TEXT_BYTES` (`truncated`, with
    its whole `size`), and `more` says older ones were left out."""
    served = faux_app(store)
    garden = await garden_of(served, ctx, "allotment")
    notes = garden.root.notes_dir
    notes.mkdir(parents=True)
    for number in range(INBOX_FILES + 1):
        path = notes / f"note-{number:03}.md"
        path.write_text(f"note {number}\n")
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))
    (notes / "note-big.md").write_text("é" * INBOX_TEXT_BYTES)  # the newest: written last, now
    async with asgi_client(served.app) as client:
        inbox = (await client.get("/api/gardens/allotment/inbox")).json()

    names = [note["name"] for note in inbox["notes"]]
    assert len(names) == INBOX_FILES
    assert names[:3] == ["note-big.md", f"note-{INBOX_FILES:03}.md", f"note-{INBOX_FILES - 1:03}.md"]
    assert {"note-000.md", "note-001.md"}.isdisjoint(names)
    big = inbox["notes"][0]
    assert (big["size"], big["truncated"]) == (2 * INBOX_TEXT_BYTES, True)
    assert len(big["text"].encode()) <= INBOX_TEXT_BYTES
    assert inbox["more"] is True


# -- store faults -------------------------------------------------------------------------------------------


async def test_a_store_fault_is_a_503_that_names_no_host_port_or_role(
        request: pytest.FixtureRequest, ctx: Context, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 29: a PostgreSQL server that stops taking connections makes a new turn (attaching
    its conversation takes a connection of its own) a 503 `store_unavailable` whose body says so
    without the driver's text (which names the host, the port and the role); that text goes to
    the server's log."""
    async with forwarder(request.getfixturevalue("postgres_schema_url")) as forwarded:
        port = forwarded.port
        store, creator = await connect(forwarded.url, ctx), await connect(forwarded.url, ctx)
        try:
            served = faux_app(store)
            # Made by another store: the server's keeps no spare claim connection of it to reuse.
            made = faux_app(creator).service
            conversation_id = (await made.create(USER, served.app.state.server.new_lane(None), ctx)).id
            await made.close(USER, conversation_id, ctx)
            async with asgi_client(served.app) as client:
                await served.service.info(USER, conversation_id, ctx)  # the read pool's connection is open
                forwarded.refuse()  # new connections are refused from here on
                answer = await client.post(f"/api/conversations/{conversation_id}/messages", json={"text": "hi"})
        finally:
            await store.close()
            await creator.close()

    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "store_unavailable"
    assert answer.json()["details"] == {}
    for leak in ("127.0.0.1", str(port), "postgres", "role", "connection to server"):
        assert leak not in answer.text
    assert str(port) in caplog.text

