"""Turns through the HTTP API: a message accepted with 202 and driven by the server, steer and
follow-up while it runs, a durable stop, tool approvals answered over HTTP, commands, the display
read, the native watch over SSE (a slow client cut off, never blocking the run), auth and
owners, and a restart that finishes an accepted turn exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from drive_helpers import ProbeTool, within
from harness.context import Context
from harness.providers.faux import delay, reply, tool_call
from harness.runtime import Settled
from harness.server import ApprovalChange, Approvals, ServerOptions, StoreTokens
from harness.session import Store, connect
from server_helpers import USER, Served, StalledClient, asgi_client, faux_app, serving, sse_events


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/harness.db"


@pytest.fixture
async def store(store_url: str, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(store_url, ctx)
    yield opened
    await opened.close()


async def _outcome(app: Any, operation_id: str) -> Settled:
    outcome = await within(app.state.server.drives.wait(operation_id))
    assert isinstance(outcome, Settled)
    return outcome


async def _beside_a_stalled_client(served: Served, client: StalledClient, conversation_id: str,
                                   ctx: Context) -> Settled:
    """Run a turn of "go" while `client` reads nothing after its first event, then let it read
    to the end of its stream; the turn's outcome."""
    async with served.app.router.lifespan_context(served.app):
        stream = asyncio.create_task(client.run())
        await within(client.snapshot_sent.wait())
        _, accepted = await served.app.state.server.start_turn(USER, conversation_id, "go", ctx)
        outcome = await _outcome(served.app, accepted.operation_id)
        client.release()
        await within(stream)
    return outcome


async def _new(client: httpx.AsyncClient) -> str:
    answer = await client.post("/api/conversations", json={})
    assert answer.status_code == 201
    return str(answer.json()["id"])


def _texts(page: dict[str, Any]) -> list[tuple[str, str]]:
    return [(row["kind"], row.get("text", "")) for row in page["rows"] if row["kind"] in ("user", "assistant")]


async def test_a_message_is_accepted_with_202_and_driven_by_the_server(store: Store) -> None:
    served = faux_app(store, ["Hello back."])
    async with asgi_client(served.app) as client:
        conversation = await _new(client)
        answer = await client.post(f"/api/conversations/{conversation}/messages", json={"text": "Hello"})
        assert answer.status_code == 202
        outcome = await _outcome(served.app, answer.json()["operation_id"])
        page = (await client.get(f"/api/conversations/{conversation}/display")).json()

    assert outcome.result.outcome == "completed"
    assert _texts(page) == [("user", "Hello"), ("assistant", "Hello back.")]


async def test_steer_follow_up_and_a_busy_send_while_a_turn_runs(store: Store) -> None:
    gate = asyncio.Event()
    pause = delay(gate)
    served = faux_app(store, [reply("thinking ", pause, "done"), "after the follow-up"])
    async with asgi_client(served.app) as client:
        conversation = await _new(client)
        started = (await client.post(f"/api/conversations/{conversation}/messages", json={"text": "go"})).json()
        await within(pause.reached.wait())
        busy = await client.post(f"/api/conversations/{conversation}/messages", json={"text": "again"})
        queued = await client.post(f"/api/conversations/{conversation}/follow-up", json={"text": "and then?"})
        gate.set()
        await _outcome(served.app, started["operation_id"])
        idle = await client.post(f"/api/conversations/{conversation}/steer", json={"text": "too late"})

    assert busy.status_code == 409
    assert busy.json()["code"] == "lane_busy"
    assert queued.status_code == 202
    assert queued.json()["entry_id"]
    assert idle.status_code == 409
    assert idle.json()["code"] == "no_active_operation"
    assert [request.request.messages[-1].role for request in served.faux.requests] == ["user", "user"]


async def test_stop_is_a_durable_abort_with_cause_user(store: Store) -> None:
    pause = delay(asyncio.Event())  # never released: only the stop ends the reply
    served = faux_app(store, [reply("half a ", pause)])
    async with asgi_client(served.app) as client:
        conversation = await _new(client)
        started = (await client.post(f"/api/conversations/{conversation}/messages", json={"text": "go"})).json()
        await within(pause.reached.wait())
        stopped = await client.post(f"/api/conversations/{conversation}/stop")
        outcome = await _outcome(served.app, started["operation_id"])
        again = await client.post(f"/api/conversations/{conversation}/stop")

    assert stopped.status_code == 202
    assert stopped.json() == {"operation_id": started["operation_id"], "newly_requested": True}
    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert again.status_code == 409


async def test_a_gated_tool_call_waits_for_the_owners_answer_over_http(store: Store) -> None:
    probe = ProbeTool(asks_first=True)
    approvals = Approvals()
    asked = asyncio.Event()
    approvals.listen(lambda change: asked.set())
    served = faux_app(store, [reply(tool_call("probe", {"key": "k"})), "ran it"], tools=[probe], approvals=approvals)
    async with asgi_client(served.app) as client:
        conversation = (await client.post("/api/conversations", json={})).json()["id"]
        started = (await client.post(f"/api/conversations/{conversation}/messages", json={"text": "go"})).json()
        await within(asked.wait())  # the call reached the hook in the drive's task
        waiting = (await client.get(f"/api/conversations/{conversation}/approvals")).json()
        wrong = await client.post(f"/api/conversations/{conversation}/approvals/nope", json={"allow": True})
        answered = await client.post(f"/api/conversations/{conversation}/approvals/{waiting[0]['tool_call_id']}",
                                     json={"allow": True})
        outcome = await _outcome(served.app, started["operation_id"])

    assert waiting[0]["tool_name"] == "probe"
    assert waiting[0]["summary"].startswith("probe")
    assert wrong.status_code == 404
    assert wrong.json()["code"] == "approval_not_found"
    assert answered.status_code == 200
    assert outcome.result.outcome == "completed"
    assert probe.runs == [{"key": "k"}]


async def test_stop_reaches_a_call_waiting_for_approval(store: Store, ctx: Context) -> None:
    """The durable stop refuses the waiting call (it never runs, its approval is withdrawn), the
    run settles aborted (cause `user`) with the call answered, and the interrupted row shows."""
    probe = ProbeTool(asks_first=True)
    approvals = Approvals()
    changes: list[ApprovalChange] = []
    asked = asyncio.Event()

    def on_change(change: ApprovalChange) -> None:
        changes.append(change)
        asked.set()

    approvals.listen(on_change)
    served = faux_app(store, [reply(tool_call("probe", {"key": "k"})), "never"], tools=[probe], approvals=approvals)
    async with asgi_client(served.app) as client:
        conversation = await _new(client)
        started = (await client.post(f"/api/conversations/{conversation}/messages", json={"text": "go"})).json()
        await within(asked.wait())
        stopped = await client.post(f"/api/conversations/{conversation}/stop")
        outcome = await _outcome(served.app, started["operation_id"])
        waiting = (await client.get(f"/api/conversations/{conversation}/approvals")).json()
        page = (await client.get(f"/api/conversations/{conversation}/display")).json()

    assert stopped.status_code == 202
    assert (outcome.result.outcome, outcome.result.abort_cause) == ("aborted", "user")
    assert probe.runs == []
    assert waiting == []
    assert [change.answer.allow if change.answer else None for change in changes] == [None, False]
    tool, interrupted = page["rows"][-2:]
    assert (tool["kind"], tool["id"], tool["result"]["is_error"]) == ("tool", changes[0].pending.tool_call_id, True)
    assert interrupted["details"] == {"kind": "interrupted", "v": 1, "cause": "user"}


async def test_commands_one_route_each(store: Store) -> None:
    served = faux_app(store, ["hi"])
    async with asgi_client(served.app) as client:
        conversation = await _new(client)
        sent = (await client.post(f"/api/conversations/{conversation}/messages", json={"text": "hi"})).json()
        await _outcome(served.app, sent["operation_id"])
        renamed = await client.post(f"/api/conversations/{conversation}/command", json={"line": "/rename notes"})
        unknown = await client.post(f"/api/conversations/{conversation}/command", json={"line": "/nope"})
        compacted = await client.post(f"/api/conversations/{conversation}/compact", json={})
        fast = await client.post(f"/api/conversations/{conversation}/fast")
        model = await client.put(f"/api/conversations/{conversation}/model",
                                 json={"model": {"provider": "faux", "model_id": "faux"}})
        missing = await client.put(f"/api/conversations/{conversation}/model",
                                   json={"model": {"provider": "faux", "model_id": "nope"}})
        shell = await client.post(f"/api/conversations/{conversation}/shell", json={"command": "echo from-shell"})
        projects = await client.get("/api/projects")
        listed = (await client.get("/api/conversations")).json()

    assert renamed.json() == {"command": "rename", "name": "notes"}
    assert listed[0]["name"] == "notes"
    assert unknown.status_code == 400
    assert unknown.json()["code"] == "unknown_command"
    assert compacted.status_code == 200
    assert compacted.json()["command"] == "compact"
    assert fast.status_code == 400
    assert fast.json()["code"] == "no_fast_model"
    assert model.status_code == 200
    assert model.json()["queued"] is False
    assert missing.status_code == 400
    assert missing.json()["code"] == "model_unavailable"
    assert shell.json() == {"exit_code": 0, "output": "from-shell\n", "recorded": True}
    assert projects.json() == []


async def test_a_model_switch_with_wait_for_completion_answers_when_it_applied(store: Store) -> None:
    """CE-12: `PUT .../model` with `wait_for_completion` while a tool call runs is answered 200
    once the turn ended and the switch applied, not 202 `queued`."""
    probe = ProbeTool()
    gate = probe.gate("k")
    served = faux_app(store, [reply(tool_call("probe", {"key": "k"})), "done"], tools=[probe])
    async with asgi_client(served.app) as client:
        conversation = await _new(client)
        sent = (await client.post(f"/api/conversations/{conversation}/messages", json={"text": "go"})).json()
        await within(probe.wait_started("k"))
        switching = asyncio.ensure_future(client.put(
            f"/api/conversations/{conversation}/model",
            json={"model": {"provider": "faux", "model_id": "faux"}, "wait_for_completion": True}))
        await within(served.service.open(USER, conversation, Context()))
        gate.set()
        await _outcome(served.app, sent["operation_id"])
        switched = await within(switching)

    assert switched.status_code == 200, switched.text
    assert switched.json()["queued"] is False


async def test_the_watch_sends_a_snapshot_then_the_turns_events_over_sse(store: Store) -> None:
    served = faux_app(store, ["streamed reply"])
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        conversation = await _new(client)
        subscribed = asyncio.Event()
        feed = asyncio.create_task(sse_events(client, "/api/feed", 2, opened=subscribed))
        await within(subscribed.wait())
        first = await within(sse_events(client, f"/api/conversations/{conversation}/events", 1))
        started = (await client.post(f"/api/conversations/{conversation}/messages", json={"text": "go"})).json()
        await _outcome(served.app, started["operation_id"])
        activity = await within(feed)

    assert first[0][0] == "snapshot"
    assert first[0][1]["transcript"] == []
    assert [event["running"] for _, event in activity] == [True, False]
    assert {name for name, _ in activity} == {"activity"}


async def test_a_slow_client_is_cut_off_and_never_blocks_the_run(store: Store, ctx: Context) -> None:
    """The client reads nothing while a turn commits more bytes of events than its buffer holds
    (issue 29: bytes, not events): the run completes all the same, and the stream then ends with
    `overflow`."""
    served = faux_app(store, ["word " * 50], options=ServerOptions(client_buffer_bytes=1_000))
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    client = StalledClient(served.app, f"/api/conversations/{conversation.id}/events")
    outcome = await _beside_a_stalled_client(served, client, conversation.id, ctx)

    assert outcome.result.outcome == "completed"
    assert client.body.rstrip().endswith(b'data: {"type":"overflow","limit":1000,"unit":"bytes"}')


async def test_a_slow_client_of_the_feed_is_cut_off_after_its_events(store: Store, ctx: Context) -> None:
    """The feed holds `client_buffer` events for a client that reads nothing: past them the run
    goes on all the same, and the stream ends with `overflow` counted in events."""
    served = faux_app(store, ["hi"], options=ServerOptions(client_buffer=1))
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    client = StalledClient(served.app, "/api/feed", first=b"subscribed")
    outcome = await _beside_a_stalled_client(served, client, conversation.id, ctx)

    assert outcome.result.outcome == "completed"
    assert client.body.rstrip().endswith(b'data: {"type":"overflow","limit":1,"unit":"events"}')


async def test_tokens_let_their_user_in_and_someone_elses_conversation_reads_as_missing(store: Store,
                                                                                          ctx: Context) -> None:
    token, _ = await store.tokens.create(USER, ctx)
    bobs, _ = await store.tokens.create("bob", ctx)
    served = faux_app(store, auth=StoreTokens(store.tokens))
    async with asgi_client(served.app) as client:
        none = await client.get("/api/conversations")
        bad = await client.get("/api/conversations", headers={"Authorization": "Bearer harness_nope"})
        mine = (await client.post("/api/conversations", json={},
                                  headers={"Authorization": f"Bearer {token}"})).json()["id"]
        as_bob = {"Authorization": f"Bearer {bobs}"}
        theirs = await client.get(f"/api/conversations/{mine}/display", headers=as_bob)
        missing = await client.get("/api/conversations/no-such-id/display", headers=as_bob)
        stop = await client.post(f"/api/conversations/{mine}/stop", headers=as_bob)
        image = await client.get(f"/api/conversations/{mine}/images/{'0' * 64}", headers=as_bob)

    assert none.status_code == bad.status_code == 401
    assert none.json()["code"] == "unauthorized"
    assert theirs.status_code == missing.status_code == stop.status_code == image.status_code == 404
    assert theirs.json() == {**missing.json(), "message": missing.json()["message"].replace("no-such-id", mine),
                             "details": {"conversation_id": mine}}


async def test_a_restart_finishes_an_accepted_turn_exactly_once(store_url: str, ctx: Context) -> None:
    """Accepted, then the server stops mid-reply; a new server on the same store resumes it at
    start and the turn completes once, with one reply."""
    pause = delay(asyncio.Event())  # the first server's reply never finishes
    first_store = await connect(store_url, ctx)
    first = faux_app(first_store, [reply("cut ", pause)])
    async with asgi_client(first.app) as client:
        conversation = await _new(client)
        started = (await client.post(f"/api/conversations/{conversation}/messages", json={"text": "go"})).json()
        await within(pause.reached.wait())
    await first_store.close()

    second_store = await connect(store_url, ctx)
    second = faux_app(second_store, ["the whole answer"])
    try:
        async with asgi_client(second.app) as client:
            outcome = await _outcome(second.app, started["operation_id"])
            page = (await client.get(f"/api/conversations/{conversation}/display")).json()
    finally:
        await second_store.close()

    assert outcome.result.outcome == "completed"
    assert len(second.faux.requests) == 1
    assert [text for kind, text in _texts(page) if kind == "assistant"] == ["the whole answer"]
