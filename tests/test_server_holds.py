"""A server holds a conversation only while it uses it (issue 29, "attach on demand, detach when
idle"): it lets go of idle ones, never holds more than `max_held`, serves reads and watches of a
conversation another process holds, and drives an open turn nobody holds at its next sweep. The
other process is a second `Store` on the same database, as in the journal's own tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import typer
from typer.core import TyperOption

from conftest import backend_url
from conversation_helpers import faux_service, transcript
from drive_helpers import within
from harness.cli import app
from harness.context import Context
from harness.conversation.service import HOLDER_CHECK_S, OWNER
from harness.errors import HarnessError
from harness.messages import AssistantMessage, text_of
from harness.providers import FAUX_MODEL
from harness.providers.faux import delay, reply
from harness.runtime import Settled
from harness.server import IDLE_RELEASE_S, MAX_HELD, ServerOptions
from harness.session import LaneConfig, SetValue, Store, addresses, connect
from harness_helpers import RecordingBackend
from server_helpers import FAUX, USER, asgi_client, faux_app, forwarder, serving, sse_events, sse_until

SHARED = ["sqlite", "postgres"]  # the backends two processes can share

SECOND = FAUX_MODEL.model_copy(update={"id": "faux-2"})
"""A second model of the faux provider, to switch to."""

QUIET = ServerOptions(idle_release_s=0.0, max_held=2, sweep_s=3_600)
"""Idle at once, two at most, and no sweep but the test's own."""


@pytest.fixture(params=SHARED)
async def stores(request: pytest.FixtureRequest, tmp_path: Path, ctx: Context) -> AsyncIterator[tuple[Store, Store]]:
    """The server's store and another process's, on one database."""
    url = backend_url(request.param, tmp_path, request)
    server, other = await connect(url, ctx), await connect(url, ctx)
    try:
        yield server, other
    finally:
        await other.close()
        await server.close()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_server_lets_go_of_idle_conversations_and_holds_no_more_than_max_held(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """Thirty conversations, a turn each, one after another: the server never holds more than
    `max_held`, its descriptors (files, sockets) stay flat, and after a sweep it holds none, so
    another process attaches any of them. (Every conversation stayed attached until `/close`,
    pinning a connection or a descriptor each.)"""
    store, other = stores
    served = faux_app(store, [f"answer {n}" for n in range(40)], options=QUIET)
    holds = served.app.state.server.holds
    async with asgi_client(served.app) as client:
        async def one_turn() -> str:
            conversation_id: str = (await client.post("/api/conversations", json={})).json()["id"]
            sent = (await client.post(f"/api/conversations/{conversation_id}/messages", json={"text": "hi"})).json()
            await within(served.app.state.server.drives.wait(sent["operation_id"]))
            return conversation_id

        for _ in range(3):  # pools and caches warm up
            await one_turn()
        before = open_descriptors()
        held_most, ids = 0, []
        for _ in range(30):
            ids.append(await one_turn())
            held_most = max(held_most, len(holds.held))
        after = open_descriptors()
        await holds.sweep(ctx)
        held_after_sweep = holds.held

        elsewhere, _ = faux_service(other, [])
        last = (await transcript(await elsewhere.open(USER, ids[-1], ctx), ctx))[-1]
        await elsewhere.close_all(ctx)

    assert isinstance(last, AssistantMessage)
    assert text_of(last.content) == "answer 32"
    assert held_most <= 2
    assert after <= before + 2
    assert held_after_sweep == ()


async def test_reads_and_watches_of_a_conversation_another_process_holds_are_served(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """Another process holds the conversation: its view, its rows and its watch are served, not
    refused `session_owned`."""
    store, other = stores
    elsewhere, _ = faux_service(other, ["from elsewhere"])
    conversation = await elsewhere.create(USER, LaneConfig(model=FAUX), ctx)
    await within(conversation.send("hello", ctx))
    served = faux_app(store, options=QUIET)
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        view = await client.get(f"/api/conversations/{conversation.id}")
        display = await client.get(f"/api/conversations/{conversation.id}/display")
        [(name, snapshot)] = await within(sse_events(client, f"/api/conversations/{conversation.id}/events", 1))

    assert view.status_code == 200, view.text
    assert display.status_code == 200, display.text
    assert name == "snapshot"
    assert [entry["payload"]["message"]["role"] for entry in snapshot["transcript"]] == ["user", "assistant"]
    assert served.app.state.server.holds.held == ()
    await elsewhere.close_all(ctx)


async def test_an_open_turn_nobody_holds_is_driven_at_the_next_sweep(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """A turn another process admitted and left (it died, or let go before driving) is driven by
    the server's next sweep, without a restart. (It was found only when the server started.) A
    conversation beside it whose lane and owner no longer decode is left, not the sweep."""
    store, other = stores
    served = faux_app(store, ["picked up"], options=QUIET)
    async with asgi_client(served.app) as client:
        elsewhere, _ = faux_service(other, [])
        damaged = await elsewhere.create(USER, LaneConfig(model=FAUX), ctx)
        conversation = await elsewhere.create(USER, LaneConfig(model=FAUX), ctx)
        accepted = await conversation.admit("who finishes this?", ctx)
        await elsewhere.close_all(ctx)
        for address in (addresses.lane_state("main"), OWNER):
            await other.backend.commit(damaged.id, [SetValue(address.namespace, address.key, "[1]")], None, ctx)

        await served.app.state.server.holds.sweep(ctx)
        await within(served.app.state.server.drives.wait(accepted.operation_id))
        view = await client.get(f"/api/conversations/{conversation.id}")

    assert view.status_code == 200
    last = (await transcript(await elsewhere.open(USER, conversation.id, ctx), ctx))[-1]
    assert isinstance(last, AssistantMessage)
    assert text_of(last.content) == "picked up"
    await elsewhere.close_all(ctx)


async def test_the_sweep_resumes_open_turns_through_the_holds_within_max_held(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """The sweep attaches the conversations it resumes as a request does (`Holds.use`): with two
    turns it resumed still running, a third conversation left open would pass `max_held` (2), so
    it waits for the next sweep, once those two have ended and been let go. (The sweep attached
    them outside the holds: past `max_held`, and under a delete that used one alone.)"""
    store, other = stores
    held = asyncio.Event()
    served = faux_app(store, [reply("one", delay(held)), reply("two", delay(held)), reply("three")], options=QUIET)
    holds = served.app.state.server.holds
    async with asgi_client(served.app):
        elsewhere, _ = faux_service(other, [])
        left = []
        for n in range(3):
            conversation = await elsewhere.create(USER, LaneConfig(model=FAUX), ctx)
            left.append((conversation.id, (await conversation.admit(f"turn {n}", ctx)).operation_id))
        await elsewhere.close_all(ctx)

        first = await holds.resume_open(ctx)
        assert len(first) == 2  # the third would pass max_held while both drive
        assert len(holds.held) == 2
        held.set()
        for operation_id in first:
            await within(served.app.state.server.drives.wait(operation_id))
        await holds.sweep(ctx)  # lets go of the two (idle at once), then resumes the third
        [(waiting_id, waiting_operation)] = [item for item in left if item[1] not in first]
        await within(served.app.state.server.drives.wait(waiting_operation))
        assert waiting_id in holds.held
    await elsewhere.close_all(ctx)


async def test_a_busy_server_says_so_with_a_503(stores: tuple[Store, Store], ctx: Context) -> None:
    """With `max_held` conversations each running a turn, one more is `server_busy` (503), and
    nothing is attached for it."""
    store, _ = stores
    held = asyncio.Event()
    served = faux_app(store, [reply("slow", delay(held)), reply("slow", delay(held))],
                      options=ServerOptions(idle_release_s=0.0, max_held=2, sweep_s=3_600))
    async with asgi_client(served.app) as client:
        ids = [(await client.post("/api/conversations", json={})).json()["id"] for _ in range(3)]
        runs = [(await client.post(f"/api/conversations/{ids[n]}/messages", json={"text": "go"})).json()
                for n in range(2)]
        refused = await client.post(f"/api/conversations/{ids[2]}/messages", json={"text": "go"})
        held.set()
        for run in runs:
            await within(served.app.state.server.drives.wait(run["operation_id"]))

    assert refused.status_code == 503
    assert refused.json()["code"] == "server_busy"
    assert ids[2] not in served.app.state.server.holds.held


@pytest.mark.postgres
async def test_a_turn_cut_off_from_its_store_settles_once_the_store_answers_again(
        request: pytest.FixtureRequest, ctx: Context) -> None:
    """Issue 29, "recovery without restart": every connection of the server to PostgreSQL is cut
    mid-turn (as `pg_terminate_backend` of them all would). The drive fails; the next sweep
    detaches the broken conversation, attaches it again and finishes the turn, and the next
    request works. (Turns never settled and requests answered 500 until a restart.)"""
    async with forwarder(request.getfixturevalue("postgres_schema_url")) as forwarded:
        store = await connect(forwarded.url, ctx)
        try:
            resume = asyncio.Event()
            streaming = delay(resume)
            served = faux_app(store, [reply("cut off", streaming), "finished after all", "next"], options=QUIET)
            state = served.app.state.server
            async with asgi_client(served.app) as client:
                conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
                sent = (await client.post(f"/api/conversations/{conversation_id}/messages",
                                          json={"text": "go"})).json()
                await within(streaming.reached.wait())
                forwarded.cut()
                resume.set()
                with pytest.raises(HarnessError):
                    await within(state.drives.wait(sent["operation_id"]))

                await state.holds.sweep(ctx)
                outcome = await within(state.drives.wait(sent["operation_id"]))
                again = await client.post(f"/api/conversations/{conversation_id}/messages", json={"text": "and now"})
                await within(state.drives.wait(again.json()["operation_id"]))
                last = (await transcript(await served.service.open(USER, conversation_id, ctx), ctx))[-1]
        finally:
            await store.close()

    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    assert again.status_code == 202, again.text
    assert isinstance(last, AssistantMessage)
    assert text_of(last.content) == "next"


def test_serve_takes_a_bound_on_the_conversations_it_holds(tmp_path: Path) -> None:
    """`harness serve --max-held N` sets the bound; none at all is a usage error, before anything
    starts."""
    refused = subprocess.run([sys.executable, "-m", "harness.cli", "serve", "--no-auth", "--max-held", "0"],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "HARNESS_HOME": str(tmp_path)}, check=False)

    assert refused.returncode == 2
    assert "--max-held" in refused.stderr


def test_serve_says_the_bounds_it_holds_by_default() -> None:
    """`harness serve --help` gives the defaults of `--max-held` and `--idle-release`, which the
    server takes from `MAX_HELD` and `IDLE_RELEASE_S` (the option held its own copy of each)."""
    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    helps = {option.name: option.help or "" for option in serve.params if isinstance(option, TyperOption)}

    assert f"(default {MAX_HELD};" in helps["max_held"]
    assert f"(default {IDLE_RELEASE_S:g})" in helps["idle_release"]


async def test_a_turn_sent_to_another_server_is_admitted_once_the_idle_holder_lets_go(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """Issue 29: server A holds a conversation, idle; a message sent to server B asks A to let go
    (`ReleaseRequest`), and B admits and drives the turn (it waited, then answered 409
    `conversation_held`)."""
    store, other = stores
    first = faux_app(store, [], options=ServerOptions(idle_release_s=3_600, sweep_s=3_600))
    second = faux_app(other, ["answered by B"], options=QUIET)
    async with asgi_client(first.app) as a, asgi_client(second.app) as b:
        conversation_id = (await a.post("/api/conversations", json={})).json()["id"]
        sent = await within(b.post(f"/api/conversations/{conversation_id}/messages", json={"text": "hi"}))
        await within(second.app.state.server.drives.wait(sent.json()["operation_id"]))
        held_by_a = first.app.state.server.holds.held

    assert sent.status_code == 202, sent.text
    assert held_by_a == ()
    elsewhere, _ = faux_service(other, [])
    last = (await transcript(await elsewhere.open(USER, conversation_id, ctx), ctx))[-1]
    assert isinstance(last, AssistantMessage)
    assert text_of(last.content) == "answered by B"
    await elsewhere.close_all(ctx)


async def test_every_route_of_a_conversation_the_other_server_drives_works_here(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """Issue 29: server A drives a turn; on server B the conversation's view, rows, rename,
    watch and stop work (the stop reaches A, whose turn settles `aborted`), and once it settled a
    turn posted to B is admitted (A lets go). (Each answered `session_owned` on the server that
    did not hold it.)"""
    store, other = stores
    held = asyncio.Event()
    first = faux_app(store, [reply("slow", delay(held))], options=ServerOptions(idle_release_s=3_600, sweep_s=3_600))
    second = faux_app(other, ["answered by B"], options=QUIET)
    async with asgi_client(first.app) as a, serving(second.app) as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as b:
        path = f"/api/conversations/{(await a.post('/api/conversations', json={})).json()['id']}"
        sent = (await a.post(f"{path}/messages", json={"text": "go"})).json()
        # Waited on from now: the stop can settle the drive before the last request returns.
        driven = asyncio.ensure_future(first.app.state.server.drives.wait(sent["operation_id"]))
        opened = asyncio.Event()
        watch = asyncio.create_task(sse_until(b, f"{path}/events", lambda event: event.name == "run_end",
                                              opened=opened))
        await within(opened.wait())
        on_b = [await b.get(path), await b.get(f"{path}/display"), await b.patch(path, json={"name": "renamed"}),
                await b.post(f"{path}/stop")]
        outcome = await within(driven)
        ended = await within(watch)
        again = await b.post(f"{path}/messages", json={"text": "and now"})
        await within(second.app.state.server.drives.wait(again.json()["operation_id"]))
        named = (await a.get(path)).json()["name"]

    assert [response.status_code for response in on_b] == [200, 200, 200, 202], [r.text for r in on_b]
    assert isinstance(outcome, Settled)
    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert ended[-1].data["operation_id"] == sent["operation_id"]
    assert again.status_code == 202, again.text
    assert named == "renamed"


@pytest.mark.postgres
async def test_the_sweep_on_postgres_reads_only_the_lanes_with_a_turn_open(
        request: pytest.FixtureRequest, ctx: Context) -> None:
    """Issue 29: on PostgreSQL the sweep finds open turns through the store's open-work query,
    which reads only the lanes with an operation open: a conversation whose lane state this
    version cannot decode (a newer version's), with nothing open, is not read, and another's
    open turn is driven. (Every sweep read every conversation's lane state, and that one failed
    them all.)"""
    url = request.getfixturevalue("postgres_schema_url")
    store, other = await connect(url, ctx), await connect(url, ctx)
    try:
        served = faux_app(store, ["picked up"], options=QUIET)
        async with asgi_client(served.app):
            elsewhere, _ = faux_service(other, [])
            unreadable = await elsewhere.create(USER, LaneConfig(model=FAUX), ctx)
            conversation = await elsewhere.create(USER, LaneConfig(model=FAUX), ctx)
            accepted = await conversation.admit("who finishes this?", ctx)
            await elsewhere.close_all(ctx)
            with psycopg.connect(url, autocommit=True) as pg:
                pg.execute("UPDATE record_values SET value = %s WHERE session_id = %s "
                           "AND namespace = 'harness.lane.state'", ('{"written_by": "a newer version"}', unreadable.id))

            await served.app.state.server.holds.sweep(ctx)
            outcome = await within(served.app.state.server.drives.wait(accepted.operation_id))
    finally:
        await other.close()
        await store.close()

    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"


async def test_close_refuses_a_conversation_another_request_uses(stores: tuple[Store, Store], ctx: Context) -> None:
    """Issue 29: `POST .../close` and `DELETE` while another request of the server uses the
    conversation (as a route does, through `Holds.use`) are 409 `conversation_in_use` and close
    and delete nothing: that request goes on with the conversation attached, and a close and a
    delete after it work. (It closed the conversation under the request.)"""
    store, _ = stores
    served = faux_app(store, ["hello"], options=ServerOptions(idle_release_s=3_600, sweep_s=3_600))
    holds = served.app.state.server.holds
    async with asgi_client(served.app) as client:
        conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
        address = f"/api/conversations/{conversation_id}"
        async with holds.use(USER, conversation_id, ctx) as conversation:
            refused = await client.post(f"{address}/close")
            not_deleted = await client.delete(address)
            accepted = await conversation.admit("still here?", ctx)
            outcome = await within(conversation.drive(accepted.operation_id, ctx))
        closed = await client.post(f"{address}/close")
        deleted = await client.delete(address)
        gone = await client.get(address)

    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "conversation_in_use"
    assert (not_deleted.status_code, not_deleted.json()["code"]) == (409, "conversation_in_use")
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    assert closed.status_code == 204, closed.text
    assert holds.held == ()
    assert deleted.status_code == 204, deleted.text
    assert gone.status_code == 404, gone.text


class DeleteGate(RecordingBackend):
    """A backend whose `delete_session` says it was `reached`, then waits for `go`."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.reached, self.go = asyncio.Event(), asyncio.Event()

    async def delete_session(self, session_id: str, context: Context) -> None:
        self.reached.set()
        await self.go.wait()
        await self.inner.delete_session(session_id, context)


async def test_a_request_racing_a_delete_is_refused_and_the_delete_goes_through(store: Store, ctx: Context) -> None:
    """Issue 29: a message posted while a `DELETE` of its conversation runs (held at its last
    step, the session's delete) is 409 `conversation_in_use` and attaches nothing, and the delete
    then deletes the conversation. (The delete opened the conversation outside the server's hold:
    the message attached it again and admitted a turn, and the delete answered `session_owned`.)"""
    gate = DeleteGate(store.backend)
    served = faux_app(Store(gate, store.url), ["never sent"],
                      options=ServerOptions(idle_release_s=3_600, sweep_s=3_600))
    async with asgi_client(served.app) as client:
        address = f"/api/conversations/{(await client.post('/api/conversations', json={})).json()['id']}"
        deleting = asyncio.create_task(client.delete(address))
        await within(gate.reached.wait())
        sent = await client.post(f"{address}/messages", json={"text": "hi"})
        gate.go.set()
        deleted = await within(deleting)
        gone = await client.get(address)
        held = served.app.state.server.holds.held

    assert (sent.status_code, sent.json()["code"]) == (409, "conversation_in_use"), sent.text
    assert deleted.status_code == 204, deleted.text
    assert gone.status_code == 404, gone.text
    assert held == ()


async def test_a_switch_waiting_for_a_holder_that_dies_is_refused_within_seconds(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """CE-12, issue 29: `PUT .../model` with `wait_for_completion` is posted to the process that
    holds the conversation, which queues it behind its running turn, then dies (detached at
    once, as a crash): the switch never applied, and the server answers 409
    `model_switch_refused` (`holder_stopped`) within `HOLDER_CHECK_S` or so. (It waited without
    bound.)"""
    store, other = stores
    held = asyncio.Event()
    streaming = delay(held)
    holder, _ = faux_service(other, [reply("slow", streaming)], models=[SECOND])
    conversation = await holder.create(USER, LaneConfig(model=FAUX), ctx)
    accepted = await conversation.admit("go", ctx)
    driving = asyncio.ensure_future(conversation.drive(accepted.operation_id, ctx))
    await within(streaming.reached.wait())
    served = faux_app(store, options=QUIET, models=[SECOND])
    async with asgi_client(served.app) as client:
        waiting = asyncio.create_task(client.put(f"/api/conversations/{conversation.id}/model", json={
            "model": {"provider": "faux", "model_id": "faux-2"}, "wait_for_completion": True}))
        commits = other.changes.subscribe(conversation.id)
        while conversation.waiting_model is None:  # taken by the holder, and queued behind its turn
            await conversation.take_requests(ctx)
            await commits.wait(0.05)
        commits.close()
        await holder.drop(conversation.id, ctx)
        refused = await within(waiting, HOLDER_CHECK_S * 3)
    held.set()
    await asyncio.gather(driving, return_exceptions=True)

    assert refused.status_code == 409, refused.text
    assert (refused.json()["code"], refused.json()["details"]["reason"]) == ("model_switch_refused", "holder_stopped")
