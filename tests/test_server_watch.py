"""The native watch's durable event ids (issue 16 item 4): every event describing a committed fact
carries `id:` = its `event_seq`; `Last-Event-ID` resumes after it without a snapshot while the
lane's log holds it (also from a server killed and started again), and with a `reset` snapshot
once the log no longer does."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from drive_helpers import ProbeTool, within
from harness.context import Context
from harness.conversation import Conversation
from harness.conversation.service import chat_event_rows
from harness.providers.faux import FauxReply, delay, reply, tool_call
from harness.providers.replay import Hold, ReplayServer
from harness.runtime import MessageUpdate
from harness.session import Store
from server_helpers import (
    SERVE_START_S,
    USER,
    ReplyText,
    Served,
    SseEvent,
    faux_app,
    reply_texts,
    serve_process,
    serving,
    sse_until,
)
from test_cli_run import chat_text, openai_env


def named(name: str) -> Callable[[SseEvent], bool]:
    return lambda event: event.name == name


def last_id(events: list[SseEvent]) -> str | None:
    """The id a client resumes from after `events`: the last `id:` it saw (SSE keeps it)."""
    ids = [event.id for event in events if event.id is not None]
    return ids[-1] if ids else None


async def shown(conversation: Conversation, text: str, then: Callable[[], None]) -> None:
    """Call `then`, and return once the conversation's streaming reply shows `text` (the reply
    publishes its progress at a bounded rate, so the provider reaching a pause is not yet enough)."""
    watch = await conversation.lane_events(Context())
    try:
        then()
        async for event in watch:
            if isinstance(event, MessageUpdate) and text in [getattr(block, "text", None)
                                                              for block in event.message.content]:
                return
    finally:
        watch.close()


async def settle(served: Served, operation_id: str) -> None:
    await within(served.app.state.server.drives.wait(operation_id))


async def test_reconnects_with_last_event_id_receive_the_durable_log_once_with_no_gap(store: Store,
                                                                                      ctx: Context) -> None:
    """Four connections over one turn with a tool call and an event row, each resuming from the
    last id the one before saw (once from between the row and its event): the durable events
    received are the lane's log after the first snapshot, in order, each once; the row shows once;
    only the first connection gets a snapshot; a resume mid-reply gets the streaming reply so far."""
    probe = ProbeTool()
    release = asyncio.Event()
    pause = delay(release)
    served = faux_app(store, [
        reply("Let me check. ", tool_call("probe", {"key": "a"})),
        FauxReply(parts=(*reply("First half. ").parts, pause, *reply("second half.").parts)),
    ], tools=[probe])
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    gate = probe.gate("a")
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        opened = asyncio.Event()
        first = asyncio.create_task(sse_until(client, path, named("tool_start"), opened=opened))
        await within(opened.wait())
        accepted = (await client.post(f"/api/conversations/{conversation.id}/messages", json={"text": "go"})).json()
        connections = [await within(first)]  # cut while the tool call runs

        await served.service.record_local_shell(USER, conversation.id, "ls", 0, "notes.txt\n", ctx)
        await within(shown(conversation, "First half. ", gate.set))
        connections.append(await within(sse_until(client, path, named("chat_event"),
                                                  last_event_id=last_id(connections[-1]))))  # cut mid-group
        connections.append(await within(sse_until(client, path, named("message_update"),
                                                  last_event_id=last_id(connections[-1]))))
        release.set()
        await settle(served, accepted["operation_id"])
        connections.append(await within(sse_until(client, path, named("run_end"),
                                                  last_event_id=last_id(connections[-1]))))
        watch = await conversation.lane_events(ctx)
        watch.close()
        log = await watch.read_events(connections[0][0].data["event_seq"], 10_000, ctx)
        snapshot = watch.snapshot

    received = [event for events in connections for event in events]
    durable = [(event.id, event.name) for event in received if event.id is not None and "." not in event.id]
    assert durable == [(str(event.event_seq), event.type) for event in log.events]
    assert [event.name for event in received].count("snapshot") == 1
    assert connections[0][0].name == "snapshot"
    assert {event.name for event in received} >= {"tool_start", "tool_end", "chat_event", "run_end"}
    assert [event.data["row"]["id"] for event in received if event.name == "chat_event"] == [
        row.id for row in chat_event_rows(snapshot.transcript)]
    row = connections[1][-1]
    assert row.id is not None
    assert row.id.endswith(".1")
    assert connections[2][0].id == row.id.removesuffix(".1")  # the row's own entry_added, and not the row again
    assert connections[2][0].name == "entry_added"
    streaming = connections[2][-1].data["message"]["content"]
    assert [block["text"] for block in streaming if block["type"] == "text"] == ["First half. "]


async def test_an_id_the_log_no_longer_holds_gets_a_fresh_snapshot_marked_reset(store: Store, ctx: Context) -> None:
    """The log keeps 4 events after each settlement: after a second turn, the first turn's first
    id is gone, so resuming from it starts with the whole snapshot and `reset`; the newest id
    still resumes, with only what came after it."""
    served = faux_app(store, ["one", "two"], event_log_limit=4)
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        ended: list[list[SseEvent]] = []
        for text in ("first", "second"):
            opened = asyncio.Event()
            watching = asyncio.create_task(sse_until(client, path, named("run_end"), opened=opened))
            await within(opened.wait())
            accepted = await client.post(f"/api/conversations/{conversation.id}/messages", json={"text": text})
            await settle(served, accepted.json()["operation_id"])
            ended.append(await within(watching))
        oldest = next(event.id for event in ended[0] if event.id is not None and event.name != "snapshot")
        reset = await within(sse_until(client, path, lambda _: True, last_event_id=oldest))
        newest = last_id(ended[1])
        await served.service.rename(USER, conversation.id, "notes", ctx)
        resumed = await within(sse_until(client, path, named("entry_added"), last_event_id=newest))

    assert reset[0].name == "snapshot"
    assert reset[0].data["reset"] is True
    assert len(reset[0].data["transcript"]) == 4
    assert reset[0].id == newest
    assert ended[0][0].data["reset"] is False
    assert [event.name for event in resumed] == ["message_start", "message_end", "chat_event", "entry_added"]
    assert int(resumed[0].id or 0) > int(newest or 0)


async def test_a_watch_refuses_an_id_it_never_sends_and_someone_elses_conversation(store: Store,
                                                                                   ctx: Context) -> None:
    """Both are answered before any stream starts: `invalid_event_id` (400), and 404 exactly as
    for a conversation that does not exist."""
    served = faux_app(store)
    mine = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    theirs = await served.service.create("bob", served.app.state.server.new_lane(None), ctx)
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        wrong = await client.get(f"/api/conversations/{mine.id}/events", headers={"Last-Event-ID": "7.x"})
        other = await client.get(f"/api/conversations/{theirs.id}/events", headers={"Last-Event-ID": "7"})

    assert wrong.status_code == 400
    assert wrong.json()["code"] == "invalid_event_id"
    assert other.status_code == 404
    assert other.json()["code"] == "session_not_found"


def text_of(message: Any) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(
        block["text"] for block in content if block["type"] == "text")


def held_by_id(events: list[SseEvent]) -> dict[str, str]:
    """The messages a client of the watch holds, by entry id, with their text: the snapshot's
    transcript, then each `entry_added` (a reply that ended off the branch is never added)."""
    held: dict[str, str] = {}
    for event in events:
        entries = (event.data["transcript"] if event.name == "snapshot"
                   else [event.data["entry"]] if event.name == "entry_added" else [])
        held |= {entry["id"]: text_of(entry["payload"]["message"]) for entry in entries
                 if entry["payload"]["type"] == "message"}
    return held


def streams(text: str) -> Callable[[SseEvent], bool]:
    reply = ReplyText()
    return lambda event: reply.apply(event) == text


async def test_a_watch_resumed_after_a_restart_cut_its_reply_holds_the_final_reply_whole(tmp_path: Path) -> None:
    """One conversation door, item 4: `harness serve` SIGKILLed mid-reply and started again on the
    same store keeps the cut-off attempt off the branch and asks the step again. The watch resumed
    with its last event id gets the log's events after it once (the cut-off attempt's
    `message_end`, the retry), then the new attempt's streaming reply, from its first character
    (whole, then deltas); by entry id the client holds what a fresh snapshot holds, the final reply
    whole. (A guard: the native watch held before the fix of the other doors.)"""
    parts = ["The first part of a long answer, ", "then the second part of it, ", "and at last the end."]
    cut, retried = Hold(), Hold()
    with ReplayServer([chat_text(parts[0], cut, "never sent."),
                       chat_text(parts[0], parts[1], retried, parts[2])]) as models:
        async with serve_process(tmp_path, openai_env(models)) as server, \
                httpx.AsyncClient(base_url=server.url, timeout=SERVE_START_S) as client:
            conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
            path = f"/api/conversations/{conversation_id}/events"
            opened = asyncio.Event()
            first = asyncio.create_task(sse_until(client, path, streams(parts[0]), opened=opened))
            await within(opened.wait())
            sent = await client.post(f"/api/conversations/{conversation_id}/messages",
                                     json={"text": "Tell me a long answer."})
            assert sent.status_code == 202, sent.text
            before = await within(first, SERVE_START_S)
            server.kill()
            await server.start()
            assert await asyncio.to_thread(retried.reached.wait, SERVE_START_S)
            resumed = asyncio.Event()
            rejoined = asyncio.create_task(sse_until(client, path, named("run_end"), last_event_id=last_id(before),
                                                     opened=resumed))
            await within(resumed.wait(), SERVE_START_S)
            retried.release()
            after = await within(rejoined, SERVE_START_S)
            [fresh] = await within(sse_until(client, path, named("snapshot")))

    final = held_by_id([fresh])
    assert list(final.values())[-1] == "".join(parts)
    assert held_by_id(before + after) == final
    assert after[0].name != "snapshot"  # resumed from the log, no snapshot
    shown = reply_texts(after)
    assert shown
    assert all("".join(parts).startswith(text) for text in shown)
    ends = [event.data for event in after if event.name == "message_end"]
    assert (ends[-1]["entry_id"], text_of(ends[-1]["message"])) == list(final.items())[-1]
    ids = [int(event.id) for event in before + after if event.id is not None and event.name != "snapshot"
           and "." not in event.id]
    assert all(earlier < later for earlier, later in itertools.pairwise(ids))
