"""One follow per lane per process, deltas on the wire, slow clients bounded in bytes (issue 29,
part 3): the watchers of a conversation in one server share one source and its fan-out, each
still getting the snapshot and then every later event once, in order; the streaming reply goes
out as `message_delta`s after it was sent whole once; a client that never reads holds at most its
byte bound and is cut, then resumes from its last event id without a gap."""

from __future__ import annotations

import asyncio
import re

import httpx

from drive_helpers import within
from harness.context import Context
from harness.conversation import Conversation
from harness.messages import text_of
from harness.providers.faux import delay, reply
from harness.runtime import DriveSettings, HarnessEvent, MessageUpdate, read_lane_events
from harness.server import ServerOptions
from harness.session import Store
from server_helpers import USER, Served, SseEvent, StalledClient, faux_app, reply_texts, serving, sse_until

LIVE = DriveSettings(frame_interval_s=0, presentation_interval_s=0)
"""Every chunk of a reply published as it comes, so a reply streams many updates."""


def run_ended(event: SseEvent) -> bool:
    return event.name == "run_end"


async def logged_after(served: Served, conversation_id: str, event_id: str | None,
                       ctx: Context) -> list[tuple[str, str]]:
    """The lane's log after event `event_id`, as `(id, type)`."""
    session = await served.service.store.open_session(conversation_id, ctx)
    page = await read_lane_events(session, "main", None if event_id is None else int(event_id), 10_000, ctx)
    return [(str(event.event_seq), event.type) for event in page.events]


def durable(events: list[SseEvent]) -> list[tuple[str, str]]:
    return [(event.id, event.name) for event in events
            if event.id is not None and "." not in event.id and event.name != "snapshot"]


async def streaming(conversation: Conversation, text: str) -> None:
    """Return once the conversation's streaming reply shows `text`."""
    watch = await conversation.lane_events(Context())
    try:
        operation = watch.snapshot.operation
        if operation is not None and operation.streaming_message is not None and text_of(
                operation.streaming_message.content) == text:
            return
        async for event in watch:
            if isinstance(event, MessageUpdate) and text_of(event.message.content) == text:
                return
    finally:
        watch.close()


async def test_watchers_of_a_conversation_share_one_source_and_each_gets_the_whole_story(store: Store,
                                                                                         ctx: Context) -> None:
    """Issue 29: eight watchers from the start and one joining mid-reply share one source; each
    gets a snapshot, then exactly the lane's log after it, in order, and ends holding the whole
    reply, the late one from the snapshot's streaming reply on. The source closes with the last."""
    gate = asyncio.Event()
    served = faux_app(store, [reply("First ", "half. ", delay(gate), "second ", "half.")], drive=LIVE)
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    fanouts = served.app.state.server.fanouts
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        opened = [asyncio.Event() for _ in range(8)]
        early = [asyncio.create_task(sse_until(client, path, run_ended, opened=event)) for event in opened]
        await within(asyncio.gather(*(event.wait() for event in opened)))
        sources_early = fanouts.sources
        sent = await client.post(f"/api/conversations/{conversation.id}/messages", json={"text": "go"})
        await within(streaming(conversation, "First half. "))
        late_opened = asyncio.Event()
        late = asyncio.create_task(sse_until(client, path, run_ended, opened=late_opened))
        await within(late_opened.wait())
        sources_late, watchers_late = fanouts.sources, fanouts.watchers
        gate.set()
        await within(served.app.state.server.drives.wait(sent.json()["operation_id"]))
        everyone = [await within(task) for task in [*early, late]]
    sources_after = fanouts.sources

    assert (sources_early, sources_late, watchers_late, sources_after) == (1, 1, 9, 0)
    for events in everyone:
        assert events[0].name == "snapshot"
        assert durable(events) == await logged_after(served, conversation.id, events[0].id, ctx)
        assert reply_texts(events)[-1] == "First half. second half."
    assert reply_texts(everyone[-1])[0] == "First half. "  # the late one's snapshot


async def test_the_streaming_reply_goes_out_whole_once_then_as_deltas(store: Store, ctx: Context) -> None:
    """Issue 29: a watcher gets the reply whole in `message_start`, then only `message_delta`s
    whose appends are the text that followed (no whole `message_update`); one that joins
    mid-reply gets the reply so far in its snapshot, then deltas."""
    gate = asyncio.Event()
    served = faux_app(store, [reply("one ", "two ", delay(gate), "three ", "four")], drive=LIVE)
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        opened = asyncio.Event()
        first = asyncio.create_task(sse_until(client, path, run_ended, opened=opened))
        await within(opened.wait())
        sent = await client.post(f"/api/conversations/{conversation.id}/messages", json={"text": "go"})
        await within(streaming(conversation, "one two "))
        joined = asyncio.Event()
        late = asyncio.create_task(sse_until(client, path, run_ended, opened=joined))
        await within(joined.wait())
        gate.set()
        await within(served.app.state.server.drives.wait(sent.json()["operation_id"]))
        from_start, from_middle = await within(first), await within(late)

    whole = "one two three four"
    shown = [event.name for event in from_start if event.name in ("message_update", "message_delta")
             or (event.name == "message_start" and event.data["message"]["role"] == "assistant")]
    assert shown[0] == "message_start"
    assert set(shown[1:]) == {"message_delta"}
    texts = reply_texts(from_start)
    assert texts[-1] == whole
    assert all(whole.startswith(text) for text in texts)

    assert "message_update" not in [event.name for event in from_middle]
    assert "message_delta" in [event.name for event in from_middle]
    assert reply_texts(from_middle)[0] == "one two "  # the snapshot's streaming reply
    assert reply_texts(from_middle)[-1] == whole


async def test_a_client_that_never_reads_holds_at_most_its_bytes_then_is_cut_and_resumes_without_a_gap(
        store: Store, ctx: Context) -> None:
    """Issue 29: during a 100 KB reply streamed in 200 updates, a client that stops reading after
    its snapshot holds at most `client_buffer_bytes` (the fan-out's `held_bytes`, sampled at every
    event the run emits; a whole reply per update would be 10 MB), and is cut when the reply's
    end would pass it: its stream ends with `overflow`. Resumed from its last event id, it gets
    exactly the lane's log after its snapshot, the reply whole."""
    bound = 16_000
    chunk = "x" * 499 + " "
    served = faux_app(store, ["hello", reply(*([chunk] * 200))], drive=LIVE,
                      options=ServerOptions(client_buffer_bytes=bound))
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    await within(conversation.send("hi", ctx))  # so the snapshot the client stops after has an event id
    fanouts = served.app.state.server.fanouts
    path = f"/api/conversations/{conversation.id}/events"
    stalled = StalledClient(served.app, path)
    held: list[int] = []
    updates: list[MessageUpdate] = []

    def sample(event: HarnessEvent, _: Context) -> None:
        held.append(fanouts.held_bytes)
        if isinstance(event, MessageUpdate):
            updates.append(event)

    conversation.listen(sample)
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        stuck = asyncio.create_task(stalled.run())
        await within(stalled.snapshot_sent.wait())
        sent = await client.post(f"/api/conversations/{conversation.id}/messages", json={"text": "go"})
        await within(served.app.state.server.drives.wait(sent.json()["operation_id"]))
        held.append(fanouts.held_bytes)
        stalled.release()
        await within(stuck)
        last_id = re.findall(rb"^id: (\S+)", bytes(stalled.body), re.MULTILINE)[-1].decode()
        resumed = await within(sse_until(client, path, run_ended, last_event_id=last_id))

    assert len(updates) >= 199
    assert 0 < max(held) <= bound
    assert bytes(stalled.body).rstrip().endswith(f'data: {{"type":"overflow","limit":{bound},"unit":"bytes"}}'.encode())
    assert resumed[0].name != "snapshot"
    assert durable(resumed) == await logged_after(served, conversation.id, last_id, ctx)
    assert reply_texts(resumed)[-1] == chunk * 200


async def test_watchers_of_a_conversation_held_nowhere_share_one_follow_of_it(store: Store, ctx: Context) -> None:
    """Issue 29: twenty watchers of a conversation this server does not hold share one follow of
    its lane (`follow_lane`: the store read once per wake-up, not once per watcher); the turn a
    request then drives here reaches each of them, exactly the lane's log after its snapshot, the
    reply whole from the persisted frames."""
    served = faux_app(store, [reply("Read ", "from ", "the ", "journal.")])
    conversation = await served.service.create(USER, served.app.state.server.new_lane(None), ctx)
    await served.service.close(USER, conversation.id, ctx)
    fanouts = served.app.state.server.fanouts
    path = f"/api/conversations/{conversation.id}/events"
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        opened = [asyncio.Event() for _ in range(20)]
        watching = [asyncio.create_task(sse_until(client, path, run_ended, opened=event)) for event in opened]
        await within(asyncio.gather(*(event.wait() for event in opened)))
        shared = (fanouts.sources, fanouts.watchers)
        sent = await client.post(f"/api/conversations/{conversation.id}/messages", json={"text": "go"})
        assert sent.status_code == 202, sent.text
        everyone = [await within(task) for task in watching]

    assert shared == (1, 20)
    for events in everyone:
        assert durable(events) == await logged_after(served, conversation.id, events[0].id, ctx)
        assert reply_texts(events)[-1] == "Read from the journal."
