"""The LangGraph door's stream of a run that dropped a reply (one conversation door, item 4): an
attempt that failed after part of it streamed (a retryable error, or a restart that cut it off) is
a side entry under its own id, and the next attempt streams under a new one. A client that had
chunks of the dropped attempt gets them taken back (a LangChain `remove` message of its id), and
the next attempt from its first character; a client that had none gets no `remove`. Whatever part
a client saw last, the stream rebuilt after its id leaves it holding exactly the final reply."""

from __future__ import annotations

from typing import Any

from harness.messages import AssistantMessage, TextContent, UserMessage
from harness.server import (
    START,
    EntryPlaced,
    LangGraphPart,
    ReplyDropped,
    RunAccepted,
    RunItem,
    RunSettled,
    RunStream,
    parse_event_id,
    stream_modes,
)
from harness.session import Entry, LaneLastResult, MessagePayload

FINAL = "The first part of a long answer, and at last the end."


def entry(entry_id: str, message: UserMessage | AssistantMessage) -> Entry:
    return Entry(id=entry_id, parent_id=None, seq=1, timestamp=0, payload=MessagePayload(message=message))


def reply(text: str) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)], api="faux", provider="faux", model="faux",
                            stop_reason="stop")


# The run: the prompt placed, attempt `x1` streamed and dropped, attempt `a1` streamed and placed.
ITEMS: list[RunItem] = [
    RunAccepted(seq=4), EntryPlaced(entry("u1", UserMessage(content="Tell me a long answer.")), seq=6),
    ReplyDropped("x1", seq=9), EntryPlaced(entry("a1", reply(FINAL)), seq=14),
    RunSettled(LaneLastResult(operation_id="run-1", kind="run", outcome="completed", tip_id="a1", started_at=0,
                              ended_at=1), seq=20)]
# The live replies after items 2 and 3, under the entry ids reserved for them.
LIVE = {2: ("x1", [reply("The first "), reply("The first part of a long answer, ")]),
        3: ("a1", [reply("The first part "), reply("The first part of a long answer, and")])}


def play(stream: RunStream, *, live: bool = True) -> list[LangGraphPart]:
    """The run's parts as `stream` renders them; without `live`, as a client resuming after the
    run ended gets them (the replies streamed are gone by then)."""
    parts = []
    for index, item in enumerate(ITEMS, start=1):
        parts += stream.item(item)
        reply_id, messages = LIVE.get(index, ("", []))
        for message in messages if live else []:
            parts += stream.live(reply_id, message)
    return parts


def new_stream(cursor: Any = START, modes: tuple[str, ...] = ("values", "messages-tuple", "updates")) -> RunStream:
    return RunStream(run_id="run-1", thread_id="thread-1", modes=stream_modes(list(modes)), cursor=cursor)


def messages(parts: list[LangGraphPart]) -> list[Any]:
    """The messages of the `messages-tuple` parts (each part is `[message, metadata]`)."""
    return [data[0] for part in parts if part.event == "messages" and isinstance(data := part.data, list)]


def held_by_id(parts: list[LangGraphPart]) -> dict[str, str]:
    """What a client that merges the `messages-tuple` chunks by id holds: each id's text; a
    `remove` drops its id and, as LangGraph's `add_messages` reducer does, fails for an id the
    client never had."""
    held: dict[str, str] = {}
    for message in messages(parts):
        if message["type"] == "remove":
            del held[message["id"]]
        elif message["type"] == "AIMessageChunk":
            held[message["id"]] = held.get(message["id"], "") + message["content"]
    return held


def states(parts: list[LangGraphPart]) -> list[LangGraphPart]:
    return [part for part in parts if part.event != "messages"]


def test_a_dropped_attempts_chunks_are_taken_back_before_the_next_attempt_streams_from_its_start() -> None:
    parts = play(new_stream())
    removal = next(index for index, part in enumerate(parts) if part.event == "messages"
                   and messages([part])[0]["type"] == "remove")

    assert held_by_id(parts[:removal]) == {"x1": "The first part of a long answer, "}
    assert messages([parts[removal]]) == [{"type": "remove", "id": "x1", "content": ""}]
    assert parts[removal].id == "6-33-1"  # after x1's chunks (33 characters), before item 9's parts
    assert (parts[removal + 1].id, parts[removal + 1].event) == ("9-0-0", "values")
    assert held_by_id(parts) == {"a1": FINAL}
    ids = [parse_event_id(part.id) for part in parts]
    assert ids == sorted(set(ids))


def test_a_client_that_had_no_chunk_of_the_dropped_attempt_gets_no_remove() -> None:
    """A full replay after the run ended, and a client that asked for no `messages-tuple`."""
    replay = play(new_stream(), live=False)
    values_only = play(new_stream(modes=("values",)))

    assert held_by_id(replay) == {"a1": FINAL}
    assert "remove" not in [message["type"] for message in messages(replay)]
    assert [part.event for part in values_only] == ["metadata", "values", "values", "values", "end"]


def test_resuming_after_any_event_id_leaves_the_client_holding_the_final_reply_once() -> None:
    """Whatever part a client saw last (a chunk of the dropped attempt, its removal, the item
    after it, a chunk of the next attempt), the stream rebuilt after its id, live or after the
    run ended, gives it exactly the rest: the same durable parts, ids that only grow, and by id
    the final reply whole, the dropped attempt gone."""
    whole = play(new_stream())
    for cut in range(len(whole)):
        seen = whole[:cut + 1]
        for live in (True, False):
            got = seen + play(new_stream(parse_event_id(seen[-1].id)), live=live)
            ids = [parse_event_id(part.id) for part in got]
            assert ids == sorted(set(ids)), f"cut after {seen[-1].id}"
            assert states(got) == states(whole), f"cut after {seen[-1].id}"
            assert held_by_id(got) == {"a1": FINAL}, f"cut after {seen[-1].id}"
