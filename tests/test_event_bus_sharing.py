"""One read-only form of each event, shared by every listener and watcher of its emission: delivery
costs one pass per emission, not a copy per recipient, and no recipient can change what another
sees or what the harness holds (HA-10, HA-13, issue 29)."""

from __future__ import annotations

from collections.abc import Callable

from drive_helpers import branch, start_rig, text, within
from harness.context import Context
from harness.messages import CustomMessage, TextContent, UserMessage
from harness.runtime import (
    DriveSettings,
    EntryAdded,
    EventReadOnly,
    HandlerError,
    HarnessEvent,
    MessageEnd,
    MessageUpdate,
    PromptRequest,
    QueueUpdate,
)
from harness.session import CustomPayload, MessagePayload, Store
from harness_helpers import harness_with_lane, record_events

REPLY = "Hello there, it is a fine day for a long reply."


def refused(change: Callable[[], object]) -> str | None:
    """The code `change` was refused with, None if it went through."""
    try:
        change()
    except EventReadOnly as error:
        return error.code
    return None


async def test_every_recipient_of_an_emission_gets_the_same_event(store: Store, ctx: Context) -> None:
    """Issue 29: two listeners and two watches of a commit receive one event object, not a copy
    each, so a recipient costs no copy of the payload (a long reply's update included)."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    first, second = record_events(harness), record_events(harness)
    watches = await lane.watch(ctx), await lane.watch(ctx)

    await lane.append_custom("app.state", {"n": [1]}, ctx)

    assert "entry_added" in [event.type for event in first]
    assert len(first) == len(second)
    assert all(mine is theirs for mine, theirs in zip(first, second, strict=True))
    for watch in watches:
        assert all(delivery.event is heard for delivery, heard in zip(watch.buffered(), first, strict=True))
    await harness.close(ctx)


async def test_a_recipient_cannot_change_a_delivered_event_in_place(store: Store, ctx: Context) -> None:
    """HA-10: the lists and dicts of a delivered event refuse changes (`EventReadOnly`), so a
    vandal listener reaches neither another listener, a watch, nor a later snapshot; a deep copy of
    the event is its own to change."""
    refusals: list[str | None] = []
    copies: list[HarnessEvent] = []

    def vandal(event: HarnessEvent, context: Context) -> None:
        if isinstance(event, EntryAdded) and isinstance(event.entry.payload, CustomPayload):
            data = event.entry.payload.data
            assert isinstance(data, dict)
            numbers = data["n"]
            assert isinstance(numbers, list)
            refusals.append(refused(lambda: numbers.append("vandalised")))
            refusals.append(refused(lambda: data.update(n="vandalised")))
            copy = event.model_copy(deep=True)
            assert isinstance(copy.entry.payload, CustomPayload)
            assert isinstance(copy.entry.payload.data, dict)
            copy.entry.payload.data["n"] = "mine"
            copies.append(copy)
        if isinstance(event, MessageEnd) and isinstance(event.message, UserMessage):
            content = event.message.content
            if isinstance(content, list):  # the appended message; the prompt's is a string
                refusals.append(refused(content.clear))
        if isinstance(event, QueueUpdate) and event.queues.steer:
            message = event.queues.steer[0].message
            assert isinstance(message, CustomMessage)
            details = message.details
            assert isinstance(details, dict)
            refusals.append(refused(lambda: details.__setitem__("who", "vandal")))

    harness = await harness_with_lane(store, ctx, listeners=[vandal])
    lane = harness.lane("main")
    seen = record_events(harness)
    watch = await lane.watch(ctx)

    await lane.append_custom("app.state", {"n": [1]}, ctx)
    await lane.append_message(UserMessage(content=[TextContent(text="hello")], timestamp=0), ctx)
    await lane.accept(PromptRequest(text="go"), ctx)
    await lane.steer(CustomMessage(custom_type="chat", content="hi", details={"who": "ann"}, timestamp=0), ctx)

    assert refusals == ["event_read_only"] * 4
    assert [e for e in seen if isinstance(e, HandlerError)] == []
    added = [event for event in seen if isinstance(event, EntryAdded)]
    assert added[0].entry.payload == CustomPayload(custom_type="app.state", data={"n": [1]})
    assert next(d.event for d in watch.buffered() if isinstance(d.event, EntryAdded)) == added[0]
    copied = copies[0]
    assert isinstance(copied, EntryAdded)
    assert isinstance(copied.entry.payload, CustomPayload)
    assert copied.entry.payload.data == {"n": "mine"}
    later = (await lane.watch(ctx)).snapshot
    assert later.transcript[0].payload == CustomPayload(custom_type="app.state", data={"n": [1]})
    hello = later.transcript[1].payload
    assert isinstance(hello, MessagePayload)
    assert hello.message.content == [TextContent(text="hello")]
    steer = later.queues.steer[0].message
    assert isinstance(steer, CustomMessage)
    assert steer.details == {"who": "ann"}
    await harness.close(ctx)


async def test_a_listener_changing_a_streaming_update_is_refused_and_the_reply_stands(
    store: Store, ctx: Context
) -> None:
    """HA-10, issue 29: every `message_update` of a streaming reply is shared by its recipients; a
    listener that empties one in place fails (`handler_error`), and every other listener still
    sees each partial reply whole, and the settled reply is the model's."""
    rig = await start_rig(store, ctx, [REPLY], drive=DriveSettings(presentation_interval_s=0))

    def vandal(event: HarnessEvent, context: Context) -> None:
        if isinstance(event, MessageUpdate):
            event.message.content.clear()

    rig.harness.add_listener(vandal)

    await within(rig.lane.prompt("hi", None, ctx))

    updates = rig.events.of(MessageUpdate)
    assert updates
    assert all(REPLY.startswith(text(update.message)) and update.message.content for update in updates)
    errors = rig.events.of(HandlerError)
    assert len(errors) == len(updates)
    assert all(error.event_type == "message_update" and error.error.startswith("EventReadOnly")
               for error in errors)
    entries = await branch(rig.lane, ctx)
    final = entries[-1].payload
    assert isinstance(final, MessagePayload)
    assert text(final.message) == REPLY
    await rig.harness.close(ctx)
