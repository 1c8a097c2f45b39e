"""Tool approvals answered from a server that does not hold the conversation (issues 28 and 30,
"approval answers" reach the holder as a posted request): server A drives a turn whose tool call
waits for approval; server B, a second app on the same database, lists the call and answers it,
A's run goes on with that answer, and B answers 200 once A took it. The first answer wins; a
later one, or one after the run was stopped, is 409 `approval_answered` and changes nothing. The
two servers are two `Store`s on one database, as in `test_server_holds`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from drive_helpers import ProbeTool, within
from harness.context import Context
from harness.conversation import ApprovalChange, ApprovalDecision, ConversationService
from harness.conversation.approvals import STOPPED_BY, JournalApprovals
from harness.providers.faux import reply, tool_call
from harness.runtime import Settled
from harness.server import Approvals, pending_address
from harness.session import LaneConfig, Store
from server_helpers import FAUX, USER, Served, SseEvent, asgi_client, faux_app, serving, sse_until
from test_server_ai_sdk import answer_body, parts_of
from test_server_holds import QUIET, stores  # noqa: F401  (stores is a fixture)


def gated(probe: ProbeTool, store: Store, script: list[Any], *, options: Any = None) -> tuple[Served, asyncio.Event]:
    """An app whose calls of a tool that asks first (`probe`) wait for approval, and an event set once one waits."""
    approvals = Approvals()
    asked = asyncio.Event()
    approvals.listen(lambda change: asked.set() if change.answer is None else None)
    return faux_app(store, script, tools=[probe], approvals=approvals, options=options), asked


@dataclass(frozen=True)
class Waiting:
    """A's turn `operation_id`, held by a probe call waiting for approval; `a` is a client of A,
    `b` of B."""

    probe: ProbeTool
    holder: Served
    a: httpx.AsyncClient
    b: httpx.AsyncClient
    conversation: str
    operation_id: str


@asynccontextmanager
async def a_call_waiting_in_a(pair: tuple[Store, Store], script: list[Any]) -> AsyncIterator[Waiting]:
    """Server A (the pair's first store) drives a turn of `script` until its probe call waits for
    approval; server B (the second) is up beside it, holding nothing."""
    store, other = pair
    probe = ProbeTool(asks_first=True)
    holder, asked = gated(probe, store, script)
    elsewhere, _ = gated(probe, other, [], options=QUIET)
    async with asgi_client(holder.app) as a, asgi_client(elsewhere.app) as b:
        conversation = (await a.post("/api/conversations", json={})).json()["id"]
        started = (await a.post(f"/api/conversations/{conversation}/messages", json={"text": "go"})).json()
        await within(asked.wait())
        yield Waiting(probe, holder, a, b, conversation, started["operation_id"])


async def answer_from_elsewhere(pair: tuple[Store, Store], ctx: Context, body: dict[str, Any]
                                ) -> tuple[ProbeTool, list[Any], httpx.Response, Settled, list[Any],
                                           list[ApprovalDecision | None]]:
    """A's turn waits for approval of one probe call; B lists it and answers it with `body`.
    Returns the probe, B's listing while the call waited, B's answer, A's outcome, B's listing
    after, and the answers the journal's copies of the call hold after."""
    async with a_call_waiting_in_a(pair, [reply(tool_call("probe", {"key": "k"})), "done"]) as waits:
        approvals = f"/api/conversations/{waits.conversation}/approvals"
        waiting = (await waits.b.get(approvals)).json()
        ended = asyncio.ensure_future(waits.holder.app.state.server.drives.wait(waits.operation_id))
        answered = await waits.b.post(f"{approvals}/{waiting[0]['tool_call_id']}", json=body)
        outcome = await within(ended)
        after = (await waits.b.get(approvals)).json()
        copies = await (await pair[1].open_session(waits.conversation, ctx)).scan_values(pending_address(""), ctx)
    assert isinstance(outcome, Settled)
    return waits.probe, waiting, answered, outcome, after, [copy.decided for _, copy in copies]


async def test_another_server_lists_and_allows_a_call_waiting_in_the_holder(stores: tuple[Store, Store],  # noqa: F811
                                                                          ctx: Context) -> None:
    """Issues 28 and 30: B lists the call A keeps waiting (it listed none) and allows it, answered
    200 once A took that answer; A runs the tool and the turn completes; the call's journal copy
    now holds the answer, by whom."""
    probe, waiting, answered, outcome, after, copies = await answer_from_elsewhere(stores, ctx, {"allow": True})

    assert [(pending["tool_name"], pending["args"]) for pending in waiting] == [("probe", {"key": "k"})]
    assert answered.status_code == 200, answered.text
    assert answered.json()["tool_call_id"] == waiting[0]["tool_call_id"]
    assert outcome.result.outcome == "completed"
    assert probe.runs == [{"key": "k"}]
    assert after == []
    assert [(decided.allow, decided.by) for decided in copies if decided is not None] == [(True, USER)]


async def test_another_servers_refusal_reaches_the_call_waiting_in_the_holder(stores: tuple[Store, Store],  # noqa: F811
                                                                            ctx: Context) -> None:
    """Issue 28: B's refusal, posted to A, refuses the call there: the tool never runs and the
    turn goes on to its end; the call no longer waits."""
    probe, _, answered, outcome, after, copies = await answer_from_elsewhere(
        stores, ctx, {"allow": False, "reason": "not now"})

    assert answered.status_code == 200, answered.text
    assert outcome.result.outcome == "completed"
    assert probe.runs == []
    assert after == []
    assert [(decided.allow, decided.reason) for decided in copies if decided is not None] == [(False, "not now")]


async def test_the_first_answer_wins_and_a_later_one_is_a_conflict(stores: tuple[Store, Store],  # noqa: F811
                                                                  ctx: Context) -> None:
    """Issue 30: A's own answer to its waiting call comes first; B's refusal after it is 409
    `approval_answered`, naming who answered, and changes nothing: the tool ran."""
    async with a_call_waiting_in_a(stores, [reply(tool_call("probe", {"key": "k"})), "done"]) as waits:
        approvals = f"/api/conversations/{waits.conversation}/approvals"
        [pending] = (await waits.b.get(approvals)).json()
        ended = asyncio.ensure_future(waits.holder.app.state.server.drives.wait(waits.operation_id))
        first = await waits.a.post(f"{approvals}/{pending['tool_call_id']}", json={"allow": True})
        again = await waits.a.post(f"{approvals}/{pending['tool_call_id']}", json={"allow": False})
        later = await waits.b.post(f"{approvals}/{pending['tool_call_id']}", json={"allow": False})
        outcome = await within(ended)

    assert first.status_code == 200, first.text
    assert (again.status_code, again.json()["code"]) == (409, "approval_answered")
    assert (later.status_code, later.json()["code"]) == (409, "approval_answered")
    assert later.json()["details"]["by"] == USER
    assert isinstance(outcome, Settled)
    assert waits.probe.runs == [{"key": "k"}]


async def test_an_answer_after_the_run_was_stopped_changes_nothing(stores: tuple[Store, Store],  # noqa: F811
                                                                  ctx: Context) -> None:
    """Issue 30: B stops the run while its call waits in A (the stop refuses it); B's answer after
    that is 409 `approval_answered` (refused by the run's stop), the tool never runs and the run
    settles aborted."""
    async with a_call_waiting_in_a(stores, [reply(tool_call("probe", {"key": "k"})), "done"]) as waits:
        approvals = f"/api/conversations/{waits.conversation}/approvals"
        [pending] = (await waits.b.get(approvals)).json()
        ended = asyncio.ensure_future(waits.holder.app.state.server.drives.wait(waits.operation_id))
        stopped = await waits.b.post(f"/api/conversations/{waits.conversation}/stop")
        outcome = await within(ended)
        late = await waits.b.post(f"{approvals}/{pending['tool_call_id']}", json={"allow": True})

    assert stopped.status_code == 202, stopped.text
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "aborted"
    assert (late.status_code, late.json()["code"]) == (409, "approval_answered"), late.text
    assert late.json()["details"]["by"] == STOPPED_BY
    assert waits.probe.runs == []


async def test_an_unknown_call_is_not_found_on_a_server_that_does_not_hold_it(
        stores: tuple[Store, Store], ctx: Context) -> None:  # noqa: F811
    """Issue 28: with no call waiting anywhere under that id, B answers 404 `approval_not_found`
    and posts nothing."""
    store, other = stores
    probe = ProbeTool(asks_first=True)
    holder, _ = gated(probe, store, ["hi"])
    elsewhere, _ = gated(probe, other, [], options=QUIET)
    async with asgi_client(holder.app) as a, asgi_client(elsewhere.app) as b:
        conversation = (await a.post("/api/conversations", json={})).json()["id"]
        answered = await b.post(f"/api/conversations/{conversation}/approvals/nope", json={"allow": True})

    assert answered.status_code == 404
    assert answered.json()["code"] == "approval_not_found"


async def test_the_ai_sdk_door_of_another_server_answers_a_call_waiting_in_the_holder(
        stores: tuple[Store, Store], ctx: Context) -> None:  # noqa: F811
    """Issue 28 (one door): the assistant message posted back to B's AI SDK door with the answer
    on its tool part reaches the call waiting in A, as B's approvals route does (it was
    `approval_not_found`: that door read only B's own waiting calls); B streams the rest of the
    run, the call's output included, to its end."""
    async with a_call_waiting_in_a(stores, [reply(tool_call("probe", {"key": "a"})), "Found it."]) as waits:
        [pending] = (await waits.b.get(f"/api/conversations/{waits.conversation}/approvals")).json()
        call = pending["tool_call_id"]
        answered = await within(waits.b.post("/api/chat", json=answer_body(
            waits.conversation, waits.operation_id, call, {"id": call, "approved": True})))

    assert answered.status_code == 200, answered.text
    assert waits.probe.runs == [{"key": "a"}]
    assert {"type": "tool-output-available", "toolCallId": call, "output": "probe:a"} in parts_of(answered.text)


async def test_the_event_stream_of_another_server_shows_a_call_waiting_in_the_holder_and_its_answer(
        stores: tuple[Store, Store], ctx: Context) -> None:  # noqa: F811
    """Issue 30: the native `GET .../events` stream of a server that does not hold the
    conversation gets an `approval` event for the call waiting in A as A keeps it in the journal,
    and another with the answer once A took B's answer (the journal's copy says so)."""
    asked = asyncio.Event()

    def answered(event: SseEvent) -> bool:
        if event.name == "approval" and event.data["answer"] is None:
            asked.set()
        return event.name == "approval" and event.data["answer"] is not None

    async with a_call_waiting_in_a(stores, [reply(tool_call("probe", {"key": "k"})), "done"]) as waits:
        watching, _ = gated(waits.probe, stores[1], [], options=QUIET)  # streams are read over HTTP, not ASGI
        async with serving(watching.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            stream = asyncio.ensure_future(sse_until(client, f"/api/conversations/{waits.conversation}/events",
                                                     answered))
            await within(asked.wait())
            approvals = f"/api/conversations/{waits.conversation}/approvals"
            [pending] = (await waits.b.get(approvals)).json()
            allowed = await waits.b.post(f"{approvals}/{pending['tool_call_id']}", json={"allow": True})
            events = await within(stream)

    assert allowed.status_code == 200, allowed.text
    assert [(event.data["pending"]["tool_call_id"], event.data["answer"]) for event in events
            if event.name == "approval"] == [(pending["tool_call_id"], None),
                                             (pending["tool_call_id"], {"allow": True, "reason": None})]
    assert waits.probe.runs == [{"key": "k"}]


async def test_an_event_stream_whose_approvals_reader_fails_ends_with_an_error_and_logs_it(
        stores: tuple[Store, Store], ctx: Context, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 30: should reading the approvals waiting elsewhere fail otherwise than the store does
    (a fault here, injected), the stream does not go on quietly without them: it ends with an
    `error` event, and the failure is logged."""
    store, other = stores
    service = ConversationService(store)
    conversation = await service.create(USER, LaneConfig(model=FAUX), ctx)
    await service.close(USER, conversation.id, ctx)

    async def broken(self: JournalApprovals, context: Context) -> list[ApprovalChange]:
        raise RuntimeError("a fault in the reader")

    monkeypatch.setattr(JournalApprovals, "changes", broken)
    watching, _ = gated(ProbeTool(asks_first=True), other, [], options=QUIET)
    async with serving(watching.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        events = await within(sse_until(client, f"/api/conversations/{conversation.id}/events", lambda _: False))

    assert [event.name for event in events] == ["snapshot", "error"]
    assert "could not be read" in events[-1].data["message"]
    assert any(record.exc_info and "a fault in the reader" in str(record.exc_info[1]) for record in caplog.records)


async def test_an_answer_through_the_ai_sdk_door_after_another_came_first_is_a_conflict(
        stores: tuple[Store, Store], ctx: Context) -> None:  # noqa: F811
    """Issue 30: a client asked for a call (its stream paused there) answers after the person at A
    did: the journal's copy says the call was answered, so B's AI SDK door answers 409
    `approval_answered`, naming who answered first (it was 404 `approval_not_found`), and
    nothing changes."""
    async with a_call_waiting_in_a(stores, [reply(tool_call("probe", {"key": "a"})), "Found it."]) as waits:
        approvals = f"/api/conversations/{waits.conversation}/approvals"
        [pending] = (await waits.b.get(approvals)).json()
        call = pending["tool_call_id"]
        ended = asyncio.ensure_future(waits.holder.app.state.server.drives.wait(waits.operation_id))
        first = await waits.a.post(f"{approvals}/{call}", json={"allow": True})
        await within(ended)
        late = await within(waits.b.post("/api/chat", json=answer_body(
            waits.conversation, waits.operation_id, call, {"id": call, "approved": False})))

    assert first.status_code == 200, first.text
    assert (late.status_code, late.json()["code"]) == (409, "approval_answered"), late.text
    assert (late.json()["details"]["by"], late.json()["details"]["allow"]) == (USER, True)
    assert waits.probe.runs == [{"key": "a"}]


async def test_the_watchers_of_a_conversation_share_one_reader_of_its_approvals_waiting_elsewhere(
        stores: tuple[Store, Store], ctx: Context) -> None:  # noqa: F811
    """Issue 29: four watchers of a conversation whose call waits in another server share one
    journal reader (`Approvals.readers`), started with the first and stopped after the last; each
    is told the same changes from the point it joined, and one joining after the call started
    waiting is told it at once."""
    async with a_call_waiting_in_a(stores, [reply(tool_call("probe", {"key": "k"})), "done"]) as waits:
        approvals = Approvals()
        journal = await stores[1].open_session(waits.conversation, ctx)
        told: list[list[tuple[str, bool]]] = []
        asked, answered = [asyncio.Event() for _ in range(4)], [asyncio.Event() for _ in range(4)]

        def follow(n: int) -> asyncio.Future[None]:
            told.append([])

            def changed(change: ApprovalChange) -> None:
                told[n].append((change.pending.tool_call_id, change.answer is not None and change.answer.allow))
                (asked if change.answer is None else answered)[n].set()

            return asyncio.ensure_future(approvals.follow_elsewhere(journal, stores[1].changes, 0.05, changed))

        first = [follow(n) for n in range(3)]
        await within(asyncio.gather(*(event.wait() for event in asked[:3])))
        readers_of_three = approvals.readers
        late = follow(3)
        await asyncio.sleep(0)  # it joins: told what waits now, with no read of its own
        told_on_joining = list(told[3])
        [pending] = (await waits.b.get(f"/api/conversations/{waits.conversation}/approvals")).json()
        allowed = await waits.b.post(f"/api/conversations/{waits.conversation}/approvals/{pending['tool_call_id']}",
                                     json={"allow": True})
        await within(asyncio.gather(*(event.wait() for event in answered)))
        readers_of_four = approvals.readers
        for follower in (*first, late):
            follower.cancel()
        await asyncio.gather(*first, late, return_exceptions=True)

    call = pending["tool_call_id"]
    assert allowed.status_code == 200, allowed.text
    assert (readers_of_three, readers_of_four, approvals.readers) == (1, 1, 0)
    assert told_on_joining == [(call, False)]
    assert told == [[(call, False), (call, True)]] * 4
