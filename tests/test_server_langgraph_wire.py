"""The LangGraph door's wire shapes (issue 16 item 6): stream modes and multitask strategies checked
before anything runs, journal entries as LangChain messages, and a run's stream resumed after any
event id with no gap and no duplicate."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from harness.errors import HarnessError
from harness.messages import AssistantMessage, TextContent, ThinkingContent, ToolCall, ToolResultMessage, UserMessage
from harness.server import (
    START,
    EntryPlaced,
    LangGraphPart,
    RunAccepted,
    RunItem,
    RunSettled,
    RunStream,
    langchain_message,
    multitask_strategy,
    parse_event_id,
    stream_modes,
)
from harness.session import Entry, LaneLastResult, MessagePayload


def entry(entry_id: str, message: UserMessage | AssistantMessage | ToolResultMessage) -> Entry:
    return Entry(id=entry_id, parent_id=None, seq=1, timestamp=0, payload=MessagePayload(message=message))


def reply(*content: TextContent | ThinkingContent | ToolCall, stop: str = "stop") -> AssistantMessage:
    return AssistantMessage(content=list(content), api="faux", provider="faux", model="faux",
                            stop_reason=stop)  # type: ignore[arg-type]


SETTLED = RunSettled(LaneLastResult(operation_id="run-1", kind="run", outcome="completed", tip_id="a2",
                                    started_at=0, ended_at=1), seq=31)
CALL = ToolCall(id="call-1", name="read", arguments={"path": "a.txt"})
FIRST = reply(ThinkingContent(thinking="Look first. "), TextContent(text="Reading it."), CALL, stop="tool_use")
SECOND = reply(TextContent(text="The file says hello, and that is all it says."))
TOOL_RESULT = entry("t1", ToolResultMessage(tool_call_id="call-1", tool_name="read",
                                           content=[TextContent(text="hello")]))
# Each item with the seq of its event in the lane's log: growing, not consecutive.
ITEMS: list[RunItem] = [RunAccepted(seq=4), EntryPlaced(entry("u1", UserMessage(content="What is in a.txt?")), seq=6),
         EntryPlaced(entry("a1", FIRST), seq=11), EntryPlaced(TOOL_RESULT, seq=17), EntryPlaced(entry("a2", SECOND),
                                                                                               seq=29), SETTLED]
# The live replies, under the entry ids reserved for them, streamed before the entries that
# complete them (after items 2 and 4).
LIVE = {2: ("a1", [reply(ThinkingContent(thinking="Look ")), reply(ThinkingContent(thinking="Look first. "),
                                                                   TextContent(text="Read"))]),
        4: ("a2", [reply(TextContent(text="The file ")), reply(TextContent(text="The file says hello,"))])}


def play(stream: RunStream, *, live: bool = True) -> list[LangGraphPart]:
    """The run's parts as `stream` renders them; without `live`, as a client resuming after the
    run ended gets them (the replies are entries by then, their streaming gone)."""
    parts = []
    for index, item in enumerate(ITEMS, start=1):
        parts += stream.item(item)
        reply_id, messages = LIVE.get(index, ("", []))
        for message in messages if live else []:
            parts += stream.live(reply_id, message)
    return parts


def new_stream(cursor: object = START) -> RunStream:
    return RunStream(run_id="run-1", thread_id="thread-1", modes=stream_modes(["values", "messages-tuple", "updates"]),
                     cursor=cursor)  # type: ignore[arg-type]


def strictly_growing(parts: list[LangGraphPart]) -> bool:
    """Whether the parts' ids only grow: none is repeated, none goes back."""
    ids = [parse_event_id(part.id) for part in parts]
    return all(earlier < later for earlier, later in itertools.pairwise(ids))


def data(part: LangGraphPart) -> Any:
    """A part's JSON, to index into."""
    return part.data


def text_of(parts: list[LangGraphPart]) -> str:
    """The thinking, then the text, of every reply chunk among `parts`, joined."""
    chunks = [data(part)[0] for part in parts if part.event == "messages"]
    return "".join(chunk["additional_kwargs"].get("reasoning_content", "") + chunk["content"]
                   for chunk in chunks if chunk["type"] == "AIMessageChunk")


def test_unsupported_stream_modes_and_rollback_are_refused_with_their_codes() -> None:
    """Issue 16 item 6: a mode the door does not serve and `rollback` are refused by code."""
    assert stream_modes(None) == ("values",)
    assert stream_modes(["messages-tuple", "values"]) == ("values", "messages-tuple")
    with pytest.raises(HarnessError) as refused:
        stream_modes(["values", "events"])
    assert refused.value.code == "stream_mode_unsupported"
    assert multitask_strategy(None) == "reject"
    assert multitask_strategy("enqueue") == "enqueue"
    with pytest.raises(HarnessError) as rollback:
        multitask_strategy("rollback")
    assert rollback.value.code == "rollback_unsupported"
    with pytest.raises(HarnessError) as unknown:
        multitask_strategy("later")
    assert unknown.value.code == "multitask_strategy_unknown"


def test_event_ids_round_trip_and_foreign_ids_are_refused() -> None:
    assert parse_event_id("4-17-0").event_id == "4-17-0"
    for foreign in ["", "1", "1-2", "a-b-c", "1-2-3-4", "-1-0-0"]:
        with pytest.raises(HarnessError) as refused:
            parse_event_id(foreign)
        assert refused.value.code == "invalid_event_id"


def test_entries_become_langchain_messages() -> None:
    ai = langchain_message(entry("a1", FIRST))
    assert ai is not None
    assert ai["type"] == "ai"
    assert ai["content"] == "Reading it."
    assert ai["additional_kwargs"] == {"reasoning_content": "Look first. "}
    assert ai["tool_calls"] == [{"type": "tool_call", "id": "call-1", "name": "read", "args": {"path": "a.txt"}}]
    tool = langchain_message(TOOL_RESULT)
    assert tool == {"type": "tool", "id": "t1", "content": "hello", "tool_call_id": "call-1", "name": "read",
                    "status": "success"}


def test_a_whole_run_streams_every_mode_with_growing_ids() -> None:
    parts = play(new_stream())
    events = [part.event for part in parts]
    assert events[0] == "metadata"
    assert events[-1] == "end"
    assert parts[-1].data == {"run_id": "run-1", "status": "success"}
    assert strictly_growing(parts)
    assert text_of(parts) == "Look first. Reading it." + "The file says hello, and that is all it says."
    values = [data(part) for part in parts if part.event == "values"]
    assert [message["id"] for message in values[-1]["messages"]] == ["u1", "a1", "t1", "a2"]
    assert {"tools": {"messages": [langchain_message(TOOL_RESULT)]}} in [
        data(part) for part in parts if part.event == "updates"]
    assert parse_event_id(parts[0].id).item == 4
    assert parts[-1].id == "31-0-0"


def test_a_replys_chunks_carry_the_entry_id_values_shows() -> None:
    """A UI that merges messages by id sees each reply once: its chunks, live and final, carry
    the id of the entry it is written under, the id `values` and `updates` show."""
    parts = play(new_stream())
    chunks = [data(part)[0] for part in parts if part.event == "messages" and data(part)[0]["type"] == "AIMessageChunk"]
    assert {chunk["id"] for chunk in chunks} == {"a1", "a2"}
    values = [data(part) for part in parts if part.event == "values"]
    ai_ids = [message["id"] for message in values[-1]["messages"] if message["type"] == "ai"]
    assert [chunk["id"] for chunk in chunks if chunk["id"] not in ai_ids] == []


def test_resuming_after_any_event_id_misses_nothing_and_repeats_nothing() -> None:
    """Issue 16 item 6: whatever part a client saw last, the stream rebuilt after its id gives it
    exactly the rest: the same durable parts, and the reply's text completed without a repeat."""
    whole = play(new_stream())

    def states(parts: list[LangGraphPart]) -> list[LangGraphPart]:
        return [part for part in parts if part.event != "messages"]

    for cut in range(len(whole)):
        seen = whole[:cut + 1]
        for live in (True, False):
            got = seen + play(new_stream(parse_event_id(seen[-1].id)), live=live)
            assert strictly_growing(got), f"cut after {seen[-1].id}"
            assert states(got) == states(whole)
            assert text_of(got) == text_of(whole), f"cut after {seen[-1].id}"


def test_a_reply_and_its_final_chunk_carry_the_same_usage_and_response_metadata() -> None:
    """The `ai` message of a placed reply and the last `AIMessageChunk` a `messages-tuple` client
    gets for it both say the reply's usage, provider, model and finish reason."""
    stream = RunStream(run_id="run-1", thread_id="thread-1", modes=("messages-tuple",))
    stream.item(RunAccepted(seq=4))
    (part,) = stream.item(EntryPlaced(entry("a1", FIRST), seq=11))
    chunk: Any = part.data
    message: Any = langchain_message(entry("a1", FIRST))
    metadata = {"usage_metadata": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
                "response_metadata": {"model_provider": "faux", "model_name": "faux", "finish_reason": "tool_use"}}
    assert {key: chunk[0][key] for key in metadata} == metadata
    assert {key: message[key] for key in metadata} == metadata
    assert [call["id"] for call in message["tool_calls"]] == ["call-1"]
