"""A watcher's reconnect costs the server no store read when it can be served from memory (issue
29, the in-process fan-out's p99): a lane's fan-out keeps its recent durable events, so a resume
from an id among them is answered from them, and one from further back reads the log as before;
a source whose last watcher left stays open `source_grace_s` for a reconnect storm, and closes
after it, or at once when the server lets go of the conversation; a conversation's owner, once
read, is not read again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from drive_helpers import within
from harness.context import Context
from harness.providers.faux import delay, reply
from harness.server import ServerOptions, StoreTokens, fanout
from harness.session import Store, addresses
from harness_helpers import recording
from server_helpers import USER, Served, SseEvent, faux_app, serving, sse_until
from test_server_fanout import durable, logged_after, run_ended

KEEP = ServerOptions(source_grace_s=60, sweep_s=3600)
"""A source kept long after its watchers left, and no sweep reading the store meanwhile."""


def resume_reads(reads: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """`reads` but the live conversation's own: it looks for requests posted for it every second."""
    return [read for read in reads if read[1] != addresses.LANE_REQUEST_NAMESPACE]


async def until(condition: Callable[[], bool]) -> None:
    """Return once `condition()` holds (the server's fan-out changes in tasks of its own)."""
    while not condition():  # noqa: ASYNC110 (the fan-outs have no event for "a count changed")
        await asyncio.sleep(0.01)


async def one_run(served: Served, client: httpx.AsyncClient, conversation_id: str) -> list[SseEvent]:
    """A watcher's events from its snapshot to the end of one run it watched (then it leaves)."""
    opened = asyncio.Event()
    path = f"/api/conversations/{conversation_id}/events"
    watching = asyncio.create_task(sse_until(client, path, run_ended, opened=opened))
    await within(opened.wait())
    sent = await client.post(f"/api/conversations/{conversation_id}/messages", json={"text": "go"})
    await within(served.app.state.server.drives.wait(sent.json()["operation_id"]))
    return await within(watching)


async def test_a_resume_from_an_event_the_fanout_keeps_reads_nothing_from_the_store(store: Store,
                                                                                     ctx: Context) -> None:
    """Issue 29: a watcher that left after a run and reconnects with the id of an event of it is
    sent exactly the lane's log after that event, no snapshot, and the server reads nothing from
    the store for it: the owner is remembered, the source is the one the grace kept open, and
    the events come from its recent ones."""
    recorded, backend = recording(store)
    served = faux_app(recorded, [reply("one ", "two")], options=KEEP)
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        first = await one_run(served, client, conversation.id)
        resume_at = durable(first)[2][0]
        await within(until(lambda: served.app.state.server.fanouts.watchers == 0))
        backend.reads.clear()
        resumed = await within(sse_until(client, path, run_ended, last_event_id=resume_at))
        reads = resume_reads(backend.reads)

    assert reads == []
    assert resumed[0].name != "snapshot"
    assert durable(resumed) == await logged_after(served, conversation.id, resume_at, ctx)


async def test_a_resume_from_before_the_kept_events_reads_the_log_and_misses_nothing(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: with the fan-out keeping its newest three durable events, a resume from the
    oldest of them is served from memory, and one from the event just before it reads the log;
    both get exactly the lane's log after their event."""
    monkeypatch.setattr(fanout, "RECENT_EVENTS", 3)
    recorded, backend = recording(store)
    served = faux_app(recorded, [reply("one ", "two")], options=KEEP)
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        first = await one_run(served, client, conversation.id)
        oldest_kept, just_before = durable(first)[-3][0], durable(first)[-4][0]
        await within(until(lambda: served.app.state.server.fanouts.watchers == 0))
        backend.reads.clear()
        inside = await within(sse_until(client, path, run_ended, last_event_id=oldest_kept))
        reads_inside = resume_reads(backend.reads)
        outside = await within(sse_until(client, path, run_ended, last_event_id=just_before))
        reads_outside = list(backend.reads)

    assert reads_inside == []
    assert any(read[0] == "list" for read in reads_outside)  # the lane's log
    assert durable(inside) == await logged_after(served, conversation.id, oldest_kept, ctx)
    assert durable(outside) == await logged_after(served, conversation.id, just_before, ctx)


async def test_a_resume_racing_new_events_gets_each_once_in_order(store: Store, ctx: Context) -> None:
    """Issue 29: a watch joins mid-run (the `Last-Event-ID` resume's first step) and the run goes
    on to its end before it replays what it missed, so the fan-out's recent events run past its
    snapshot. Its replay up to its snapshot (what the native watch sends from `read_events`),
    then its own events, are exactly the lane's log after the event it resumes from: none
    twice, none missing, in order; and the replay read nothing from the store."""
    gate = asyncio.Event()
    recorded, backend = recording(store)
    served = faux_app(recorded, [reply("one ", delay(gate), "two")], options=KEEP)
    state: Any = served.app.state.server
    conversation = await served.service.create(USER, state.new_lane(None), ctx)
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        opened = asyncio.Event()
        first = asyncio.create_task(sse_until(client, path, lambda event: event.name == "message_start", opened=opened))
        await within(opened.wait())
        sent = await client.post(f"/api/conversations/{conversation.id}/messages", json={"text": "go"})
        resume_at = int(durable(await within(first))[-1][0])
        resumed = await state.watch(USER, conversation.id, ctx)
        everything = await state.watch(USER, conversation.id, ctx)
        gate.set()
        await within(served.app.state.server.drives.wait(sent.json()["operation_id"]))
        async for event in everything:  # the fan-out has handed out the whole run
            if event.type == "run_end":
                break
        backend.reads.clear()
        page = await resumed.read_events(resume_at - 1, 500, ctx)
        reads = resume_reads(backend.reads)
        joined_at = resumed.snapshot.event_seq
        replayed = [event for event in page.events if event.event_seq is not None and event.event_seq <= joined_at]
        own = [event for event in resumed.buffered() if event.event_seq is not None]
        resumed.close()
        everything.close()

    assert page.events[-1].event_seq > joined_at  # the race: kept events past the point it joined at
    assert reads == []
    logged = await logged_after(served, conversation.id, str(resume_at - 1), ctx)
    assert [(str(event.event_seq), event.type) for event in replayed + own] == logged


async def test_a_source_nobody_came_back_to_closes_after_its_grace(store: Store, ctx: Context) -> None:
    """Issue 29: the lane's source outlives its last watcher by `source_grace_s`, then closes."""
    served = faux_app(store, options=ServerOptions(source_grace_s=1, sweep_s=3600))
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    fanouts = served.app.state.server.fanouts
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        await within(sse_until(client, f"/api/conversations/{conversation.id}/events", lambda _: True))
        await within(until(lambda: fanouts.watchers == 0))
        in_grace = fanouts.sources
        await within(until(lambda: fanouts.sources == 0))

    assert in_grace == 1


async def test_a_source_in_its_grace_closes_when_the_server_lets_go_of_the_conversation(
        store: Store, ctx: Context) -> None:
    """Issue 29: the grace keeps no conversation attached: when the server lets go of an idle
    conversation, the live watch a grace kept open ends and its source closes at once, and a
    watcher coming back is served a follow of the lane, the conversation still let go."""
    served = faux_app(store, [reply("hi")], options=ServerOptions(source_grace_s=60, idle_release_s=0,
                                                                   sweep_s=3600))
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    state: Any = served.app.state.server
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        first = await one_run(served, client, conversation.id)
        await within(until(lambda: state.fanouts.watchers == 0))
        in_grace = state.fanouts.sources
        await state.holds.sweep(ctx)
        await within(until(lambda: state.fanouts.sources == 0))
        held_after_sweep = state.holds.held
        again = await within(sse_until(client, path, lambda _: True))
        held_after_watch = state.holds.held

    assert in_grace == 1
    assert held_after_sweep == held_after_watch == ()
    assert again[0].name == "snapshot"
    assert again[0].id == durable(first)[-1][0]


async def test_a_remembered_owner_still_refuses_another_users_watch(store: Store, ctx: Context) -> None:
    """Issue 29: once the owner check of a watch is served from memory, another user's watch of
    the conversation is still refused as one that does not exist (404, as before the owner was
    remembered: `Forbidden` names nothing of another user's), and its owner's still answered."""
    served = faux_app(store, auth=StoreTokens(store.tokens), options=KEEP)
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    owner, _ = await store.tokens.create(USER, ctx)
    stranger, _ = await store.tokens.create("mallory", ctx)
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        async with client.stream("GET", path, headers={"Authorization": f"Bearer {owner}"}) as first:
            first_status = first.status_code
        refused = await client.get(path, headers={"Authorization": f"Bearer {stranger}"})
        async with client.stream("GET", path, headers={"Authorization": f"Bearer {owner}"}) as again:
            again_status = again.status_code

    assert (first_status, again_status) == (200, 200)
    assert (refused.status_code, refused.json()["code"]) == (404, "session_not_found")
