"""The faux provider: scripted replies streamed token by token through the provider protocol."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from harness.context import Context
from harness.messages import AssistantMessage, Message, TextContent, ThinkingContent, ToolCall, Usage, UserMessage
from harness.providers import (
    DeferredProvider,
    DoneEvent,
    ErrorEvent,
    Model,
    ModelCost,
    ProviderRequest,
    StreamEvent,
    StreamOptions,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolCallDeltaEvent,
)
from harness.providers.faux import (
    FAUX_MODEL,
    FauxProvider,
    FauxReply,
    FauxRequest,
    deferred,
    delay,
    failure,
    reply,
    thinking,
    tool_call,
)

REQUEST = ProviderRequest(system_prompt="Be brief.", messages=(UserMessage(content="hello", timestamp=1),))
OPTIONS = StreamOptions(temperature=0.0)


async def collect(stream: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [event async for event in stream]


def final(events: list[StreamEvent]) -> AssistantMessage:
    last = events[-1]
    assert isinstance(last, DoneEvent | ErrorEvent)
    return last.message


async def test_text_streams_word_by_word_and_ends_with_stop(ctx: Context) -> None:
    faux = FauxProvider(["The capital is Paris."])

    events = await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx))

    assert [event.type for event in events] == [
        "start", "text_start", "text_delta", "text_delta", "text_delta", "text_delta", "text_end", "usage", "done",
    ]
    assert [event.delta for event in events if event.type == "text_delta"] == ["The ", "capital ", "is ", "Paris."]
    message = final(events)
    assert message.content == [TextContent(text="The capital is Paris.")]
    assert (message.stop_reason, message.api, message.provider, message.model) == ("stop", "faux", "faux", "faux")
    assert message.usage.output == 4
    assert message.usage.input == len(REQUEST.model_dump_json()) // 4


async def test_input_tokens_stay_the_requests_json_length_as_a_conversation_grows(ctx: Context) -> None:
    """Each message is serialized once per provider; the estimate is still the whole request's."""
    faux = FauxProvider(["one", "two", "three"])
    messages: tuple[Message, ...] = ()
    for said in ("first", "second", "third"):
        messages = (*messages, UserMessage(content=said, timestamp=1))
        request = ProviderRequest(system_prompt="Be brief.", messages=messages)
        message = final(await collect(faux.stream(FAUX_MODEL, request, OPTIONS, ctx)))
        assert message.usage.input == len(request.model_dump_json()) // 4
        messages = (*messages, message)


async def test_thinking_keeps_its_signature_and_tool_arguments_arrive_in_pieces(ctx: Context) -> None:
    faux = FauxProvider(
        [reply(thinking("Look it up.", signature="sig-1"), tool_call("read", {"path": "a.txt", "n": 2}))]
    )

    events = await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx))

    argument_deltas = [event.delta for event in events if event.type == "toolcall_delta"]
    assert len(argument_deltas) > 1
    assert "".join(argument_deltas) == '{"path": "a.txt", "n": 2}'
    message = final(events)
    assert message.content == [
        ThinkingContent(thinking="Look it up.", signature="sig-1"),
        ToolCall(id="faux-call-1-1", name="read", arguments={"path": "a.txt", "n": 2}),
    ]
    assert message.stop_reason == "tool_use"


async def test_block_deltas_send_each_blocks_text_whole_and_build_the_same_message(ctx: Context) -> None:
    parts = (thinking("Look it up.", signature="sig-1"), "The capital is Paris.",
             tool_call("read", {"path": "a.txt"}, id="call-1"))
    faux = FauxProvider([reply(*parts, deltas="block"), reply(*parts)])

    whole = await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx))
    words = await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx))

    deltas = (ThinkingDeltaEvent, TextDeltaEvent, ToolCallDeltaEvent)
    assert [event.delta for event in whole if isinstance(event, deltas)] == [
        "Look it up.", "The capital is Paris.", '{"path": "a.txt"}',
    ]
    assert len([event for event in words if isinstance(event, deltas)]) > 3
    assert final(whole).content == final(words).content


async def test_a_block_reply_yields_to_other_tasks_once_and_a_word_reply_before_each_frame(ctx: Context) -> None:
    faux = FauxProvider([reply("One two three.", deltas="block"), reply("One two three.")])
    ticks = 0

    async def count_ticks() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def ticks_per_event() -> list[int]:
        seen = []
        async for _ in faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx):
            seen.append(ticks)
        return seen

    counter = asyncio.create_task(count_ticks())
    try:
        whole, words = await ticks_per_event(), await ticks_per_event()
    finally:
        counter.cancel()

    # A block reply comes in one read: nothing else runs between its first frame and its end.
    assert whole[1] > whole[0]
    assert len(set(whole[1:])) == 1
    assert len(set(words[1:])) > 3


async def test_malformed_argument_text_is_kept_raw_and_flagged(ctx: Context) -> None:
    faux = FauxProvider([reply(tool_call("read", raw='{"path": "a.t', id="call_1"), tool_call("list", raw=""))])

    message = final(await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx)))

    assert message.tool_calls == [
        ToolCall(id="call_1", name="read", arguments={}, raw_arguments='{"path": "a.t'),
        ToolCall(id="faux-call-1-1", name="list", arguments={}),
    ]


async def test_a_failure_after_partial_content_keeps_that_content_and_its_classification(ctx: Context) -> None:
    faux = FauxProvider([failure("retryable", "overloaded", "Half an ans", status=529, retry_after_ms=1500)])

    events = await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx))

    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert (last.error.kind, last.error.status, last.error.retry_after_ms) == ("retryable", 529, 1500)
    assert last.message.content == [TextContent(text="Half an ans")]
    assert (last.message.stop_reason, last.message.error_message) == ("error", "overloaded")


async def test_a_delay_holds_the_stream_until_its_event_is_set(ctx: Context) -> None:
    gate = asyncio.Event()
    pause = delay(gate)
    faux = FauxProvider([reply("before ", pause, "after")])
    seen: list[StreamEvent] = []

    async def consume() -> None:
        async for event in faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx):
            seen.append(event)

    task = asyncio.create_task(consume())
    await pause.reached.wait()
    assert [event.type for event in seen][-1] == "text_end"
    gate.set()
    await task

    assert final(seen).content == [TextContent(text="before "), TextContent(text="after")]


async def test_a_delay_in_seconds_passes_by_itself(ctx: Context) -> None:
    faux = FauxProvider([reply("a", delay(0.001), "b")])

    message = final(await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx)))

    assert message.stop_reason == "stop"


async def test_cancelling_the_context_during_a_delay_aborts_with_the_partial_content(ctx: Context) -> None:
    pause = delay(asyncio.Event())
    faux = FauxProvider([reply("partial", pause, "never")])
    task = asyncio.create_task(collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx)))

    await pause.reached.wait()
    ctx.cancel("user pressed stop")
    events = await task

    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert last.error.kind == "aborted"
    assert last.message.stop_reason == "aborted"
    assert last.message.error_message == "the request was aborted (user pressed stop)"
    assert last.message.content == [TextContent(text="partial")]


async def test_cancelling_the_context_between_tokens_stops_at_the_next_token(ctx: Context) -> None:
    faux = FauxProvider(["one two three"])
    seen: list[StreamEvent] = []

    async for event in faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx):
        seen.append(event)
        if event.type == "text_delta":
            ctx.cancel()

    assert final(seen).stop_reason == "aborted"
    assert final(seen).content == [TextContent(text="one ")]


async def test_deferred_replies_are_polled_through_scripted_outcomes_and_cancelled(ctx: Context) -> None:
    """HA-27: a deferred reply carries its id; polls answer pending, then the result."""
    faux = FauxProvider([deferred("job-1")], polls={"job-1": [deferred("job-1"), "ready"]})
    assert isinstance(faux, DeferredProvider)

    first = final(await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx)))
    pending = final(await collect(faux.poll(FAUX_MODEL, "job-1", OPTIONS, ctx)))
    answered = final(await collect(faux.poll(FAUX_MODEL, "job-1", OPTIONS, ctx)))
    await faux.cancel(FAUX_MODEL, "job-1", ctx)

    assert (first.stop_reason, first.deferred_id) == ("deferred", "job-1")
    assert (pending.stop_reason, pending.deferred_id) == ("deferred", "job-1")
    assert (answered.stop_reason, answered.content) == ("stop", [TextContent(text="ready")])
    assert [poll.deferred_id for poll in faux.polls] == ["job-1", "job-1"]
    assert faux.cancelled == ["job-1"]


async def test_a_function_script_answers_from_the_request(ctx: Context) -> None:
    def echo(call: FauxRequest) -> FauxReply | str:
        last = call.request.messages[-1]
        assert isinstance(last, UserMessage)
        return f"you said {last.content}"

    faux = FauxProvider(echo)

    message = final(await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx)))

    assert message.content == [TextContent(text="you said hello")]


async def test_every_request_is_recorded_with_its_model_and_options(ctx: Context) -> None:
    faux = FauxProvider(["a"])
    faux.push("b")

    await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx))
    await collect(faux.stream(FAUX_MODEL, REQUEST, StreamOptions(seed=7), ctx))

    assert [(call.number, call.model, call.request, call.options.seed) for call in faux.requests] == [
        (1, FAUX_MODEL, REQUEST, None),
        (2, FAUX_MODEL, REQUEST, 7),
    ]


async def test_a_used_up_script_ends_the_stream_with_an_error_saying_so(ctx: Context) -> None:
    faux = FauxProvider([])

    events = await collect(faux.stream(FAUX_MODEL, REQUEST, OPTIONS, ctx))

    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert last.error.kind == "other"
    assert last.message.error_message == "faux provider: no scripted reply for request 1"


async def test_scripted_usage_is_reported_and_estimates_are_priced_by_the_model(ctx: Context) -> None:
    priced = Model(id="priced", provider="faux", api="faux", cost=ModelCost(input=1.0, output=2.0))
    faux = FauxProvider([reply("x", usage=Usage(input=5, output=6, total_tokens=11)), "y z"])

    given = final(await collect(faux.stream(priced, REQUEST, OPTIONS, ctx)))
    estimated = final(await collect(faux.stream(priced, REQUEST, OPTIONS, ctx)))

    assert given.usage == Usage(input=5, output=6, total_tokens=11)
    input_tokens = len(REQUEST.model_dump_json()) // 4
    assert estimated.usage.total_tokens == input_tokens + 2
    assert estimated.usage.cost.total == pytest.approx((input_tokens * 1.0 + 2 * 2.0) / 1e6)
