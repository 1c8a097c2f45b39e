"""The Anthropic Messages adapter beyond the recorded fixtures, over real HTTP through the real SDK
to the replay server: aborts, dropped connections, in-stream errors, every stop reason, usage and
cost, and what the SDK actually sent.

White-box where it checks the request alone: it calls the adapter's `build_request_params`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from conftest import PROJECT_STREAMS, SHARED_FIXTURES, needs_shared_fixtures
from harness.context import Context
from harness.messages import (
    AssistantMessage,
    Message,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from harness.providers import (
    DoneEvent,
    ErrorEvent,
    Model,
    ModelCost,
    ProviderRequest,
    StreamEvent,
    StreamOptions,
    TextDeltaEvent,
    ToolSpec,
)
from harness.providers.anthropic_messages import AnthropicMessagesProvider, build_request_params
from harness.providers.replay import Hold, ReplayResponse, ReplayServer
from request_validators import problems

STREAMS = SHARED_FIXTURES / "provider-streams"
COST = ModelCost(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


@pytest.fixture
def model(server: ReplayServer) -> Model:
    return Model(
        id="claude-haiku-4-5", provider="anthropic", api="anthropic-messages", base_url=server.base_url,
        reasoning=True, max_tokens=32_000, cost=COST,
    )


def event(kind: str, **payload: Any) -> str:
    """One server-sent event as Anthropic frames it."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n"


def message_start(input_tokens: int = 10, cache_read: int = 0, cache_write: int = 0) -> str:
    usage = {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": cache_read,
             "cache_creation_input_tokens": cache_write}
    message: dict[str, Any] = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage,
    }
    return event("message_start", message=message)


def text_block(index: int, *pieces: str) -> list[str]:
    return [
        event("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *(event("content_block_delta", index=index, delta={"type": "text_delta", "text": p}) for p in pieces),
        event("content_block_stop", index=index),
    ]


def message_end(stop_reason: str, output_tokens: int = 5, **delta: Any) -> list[str]:
    return [
        event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": None, **delta},
              usage={"output_tokens": output_tokens}),
        event("message_stop"),
    ]


REQUEST = ProviderRequest(
    system_prompt="You answer in one word.",
    messages=(UserMessage(content="Weather in Florence?", timestamp=1),),
    tools=(ToolSpec(name="weather", description="Current weather.",
                    parameters={"type": "object", "properties": {"location": {"type": "string"}}}),),
)
OPTIONS = StreamOptions(api_key="test-key")


async def collect(events: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [item async for item in events]


async def reply_to(model: Model, options: StreamOptions = OPTIONS) -> StreamEvent:
    """The last event of one reply to `REQUEST`, as the server scripted it."""
    events = await collect(AnthropicMessagesProvider().stream(model, REQUEST, options, Context()))
    return events[-1]


async def test_cancelling_the_context_mid_stream_drops_the_request_and_keeps_the_partial_reply(
    server: ReplayServer, model: Model, ctx: Context
) -> None:
    hold = Hold()
    head, tail = text_block(0, "Sunny", " and")[:3], text_block(0, " warm")[1:]
    server.enqueue(ReplayResponse.sse(message_start(), *head, hold, *tail, *message_end("end_turn")))
    seen: list[StreamEvent] = []

    async for item in AnthropicMessagesProvider().stream(model, REQUEST, OPTIONS, ctx):
        seen.append(item)
        if isinstance(item, TextDeltaEvent) and item.delta == " and":
            ctx.cancel("user pressed stop")

    last = seen[-1]
    assert isinstance(last, ErrorEvent)
    assert (last.error.kind, last.message.stop_reason) == ("aborted", "aborted")
    assert last.message.content == [TextContent(text="Sunny and")]
    assert "user pressed stop" in (last.message.error_message or "")
    # The server saw the client hang up while it held the rest of the body.
    assert await asyncio.to_thread(hold.disconnected.wait, 10)


async def test_cancelling_while_waiting_for_the_first_event_aborts_with_an_empty_reply(
    server: ReplayServer, model: Model, ctx: Context
) -> None:
    hold = Hold()
    server.enqueue(ReplayResponse.sse(hold, message_start(), *text_block(0, "late"), *message_end("end_turn")))
    stream = AnthropicMessagesProvider().stream(model, REQUEST, OPTIONS, ctx)

    first = await anext(stream)  # `start` comes before the request is sent
    pending = asyncio.ensure_future(collect(stream))
    await asyncio.to_thread(hold.reached.wait, 10)
    ctx.cancel()
    rest = await pending

    assert first.type == "start"
    last = rest[-1]
    assert isinstance(last, ErrorEvent)
    assert (last.message.stop_reason, last.message.content) == ("aborted", [])
    assert await asyncio.to_thread(hold.disconnected.wait, 10)


async def test_a_dropped_connection_ends_in_a_retryable_error_with_the_partial_reply(
    server: ReplayServer, model: Model
) -> None:
    server.enqueue(ReplayResponse.sse(message_start(), *text_block(0, "Sunny", " and")[:3], end="drop"))

    last = await reply_to(model)

    assert isinstance(last, ErrorEvent)
    assert (last.error.kind, last.message.stop_reason) == ("retryable", "error")
    assert last.message.content == [TextContent(text="Sunny and")]


async def test_a_stream_that_ends_without_message_stop_is_a_retryable_error(server: ReplayServer, model: Model) -> None:
    server.enqueue(ReplayResponse.sse(message_start(), *text_block(0, "Sunny")))

    last = await reply_to(model)

    assert isinstance(last, ErrorEvent)
    assert (last.error.kind, last.message.content) == ("retryable", [TextContent(text="Sunny")])


@needs_shared_fixtures
async def test_an_overloaded_error_event_mid_stream_is_retryable_and_keeps_the_partial_reply(
    server: ReplayServer, model: Model
) -> None:
    # The recorded error event after a synthetic start: no full recording of this case exists
    # (see PROVENANCE.md, Gaps).
    recorded_error = (STREAMS / "anthropic-error-event-overloaded.sse").read_text()
    server.enqueue(ReplayResponse.sse(message_start(), *text_block(0, "Sunny")[:2], recorded_error))

    last = await reply_to(model)

    assert isinstance(last, ErrorEvent)
    assert (last.error.kind, last.message.stop_reason) == ("retryable", "error")
    assert "Overloaded" in last.error.message
    assert last.message.content == [TextContent(text="Sunny")]


async def test_a_rate_limit_status_is_retryable_after_the_time_the_server_asked_for(
    server: ReplayServer, model: Model
) -> None:
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests exceeded"}}
    server.enqueue(ReplayResponse.json(body, status=429, headers={"retry-after": "7"}))

    last = await reply_to(model)

    assert isinstance(last, ErrorEvent)
    assert (last.error.kind, last.error.status, last.error.retry_after_ms) == ("retryable", 429, 7000)
    assert last.message.content == []
    assert len(server.requests) == 1  # the SDK did not retry on its own


@pytest.mark.parametrize(
    ("stop_reason", "expected"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("pause_turn", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_use"),
    ],
)
async def test_every_stop_reason_is_mapped(
    server: ReplayServer, model: Model, stop_reason: str, expected: str
) -> None:
    server.enqueue(ReplayResponse.sse(message_start(), *text_block(0, "Sunny"), *message_end(stop_reason)))

    last = await reply_to(model)

    assert isinstance(last, DoneEvent)
    assert last.message.stop_reason == expected


async def test_a_refusal_ends_in_an_error_so_it_is_never_replayed(server: ReplayServer, model: Model) -> None:
    details = {"type": "refusal", "category": "cyber", "explanation": "This could enable harm."}
    server.enqueue(ReplayResponse.sse(
        message_start(), *text_block(0, "I can"), *message_end("refusal", stop_details=details)
    ))

    last = await reply_to(model)

    assert isinstance(last, ErrorEvent)
    assert (last.error.kind, last.message.stop_reason) == ("other", "error")
    assert "This could enable harm." in last.error.message


async def test_usage_counts_cache_reads_and_writes_and_is_priced_per_million(
    server: ReplayServer, model: Model
) -> None:
    server.enqueue(ReplayResponse.sse(
        message_start(input_tokens=1_000, cache_read=2_000_000, cache_write=100_000),
        *text_block(0, "Sunny"), *message_end("end_turn", output_tokens=40_000),
    ))

    last = await reply_to(model)

    assert isinstance(last, DoneEvent)
    usage = last.message.usage
    assert (usage.input, usage.output, usage.cache_read, usage.cache_write) == (1_000, 40_000, 2_000_000, 100_000)
    assert usage.total_tokens == 2_141_000
    assert usage.cost.input == pytest.approx(0.003)
    assert usage.cost.output == pytest.approx(0.6)
    assert usage.cost.cache_read == pytest.approx(0.6)
    assert usage.cost.cache_write == pytest.approx(0.375)
    assert usage.cost.total == pytest.approx(1.578)
    assert last.message.response_id == "msg_1"


async def test_tool_input_sent_whole_at_block_start_and_malformed_input(server: ReplayServer, model: Model) -> None:
    whole = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"location": "Florence"}}
    broken = {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}}
    server.enqueue(ReplayResponse.sse(
        message_start(),
        event("content_block_start", index=0, content_block=whole),
        event("content_block_stop", index=0),
        event("content_block_start", index=1, content_block=broken),
        event("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": '{"location": '}),
        event("content_block_stop", index=1),
        *message_end("tool_use"),
    ))

    last = await reply_to(model)

    assert isinstance(last, DoneEvent)
    assert last.message.content == [
        ToolCall(id="toolu_1", name="weather", arguments={"location": "Florence"}),
        ToolCall(id="toolu_2", name="weather", arguments={}, raw_arguments='{"location": '),
    ]


async def test_the_sdk_sends_system_tools_thinking_budget_key_and_headers(server: ReplayServer, model: Model) -> None:
    server.enqueue(ReplayResponse.sse(message_start(), *text_block(0, "Sunny"), *message_end("end_turn")))
    model = model.model_copy(update={"headers": {"x-team": "research"}})
    options = StreamOptions(api_key="test-key", thinking_level="medium", headers={"x-trace": "t1"})

    await collect(AnthropicMessagesProvider().stream(model, REQUEST, options, Context()))

    [sent] = server.requests
    body = sent.json()
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert (sent.headers["authorization"], sent.headers["x-team"], sent.headers["x-trace"]) == (
        "Bearer test-key", "research", "t1"
    )
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 10_240}
    assert body["system"] == [
        {"type": "text", "text": "You answer in one word.", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["tools"] == [{"name": "weather", "description": "Current weather.",
                              "input_schema": REQUEST.tools[0].parameters}]
    assert (body["max_tokens"], body["stream"], "temperature" in body) == (32_000, True, False)
    expected = build_request_params(model, REQUEST, options)
    assert body == {key: value for key, value in expected.items() if not key.startswith("extra_")}


async def test_temperature_goes_in_the_body_only_without_thinking(server: ReplayServer, model: Model) -> None:
    server.enqueue(ReplayResponse.sse(message_start(), *text_block(0, "Sunny"), *message_end("end_turn")))

    await reply_to(model, options=StreamOptions(api_key="test-key", temperature=0.2))

    body = server.requests[0].json()
    assert (body["temperature"], "thinking" in body) == (0.2, False)


async def test_without_base_url_the_sdk_reads_its_environment(
    server: ReplayServer, model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.enqueue(ReplayResponse.sse(message_start(), *text_block(0, "Sunny"), *message_end("end_turn")))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("HARNESS_TEST_ANTHROPIC_KEY", "key-from-env")
    model = model.model_copy(update={"base_url": None, "api_key_env": "HARNESS_TEST_ANTHROPIC_KEY"})

    last = await reply_to(model, options=StreamOptions())

    assert isinstance(last, DoneEvent)
    assert server.requests[0].headers["authorization"] == "Bearer key-from-env"


async def test_a_thinking_reply_goes_back_with_its_signature_byte_identical(
    server: ReplayServer, model: Model
) -> None:
    """A thinking + tool_use stream, answered and sent back as the next request."""
    streamed = PROJECT_STREAMS / "anthropic-thinking-signature.sse"
    server.enqueue(ReplayResponse.from_file(streamed))
    server.enqueue(ReplayResponse.sse(message_start(), *text_block(0, "Sunny"), *message_end("end_turn")))
    options = StreamOptions(api_key="test-key", thinking_level="low")
    provider = AnthropicMessagesProvider()

    first = (await collect(provider.stream(model, REQUEST, options, Context())))[-1]
    assert isinstance(first, DoneEvent)
    thinking, call = first.message.content
    assert isinstance(thinking, ThinkingContent)
    assert isinstance(call, ToolCall)
    answered = ToolResultMessage(tool_call_id=call.id, tool_name=call.name, content=[TextContent(text="40C")])
    follow_up = REQUEST.model_copy(update={"messages": (*REQUEST.messages, first.message, answered)})
    await collect(provider.stream(model, follow_up, options, Context()))

    replayed = server.requests[1].json()["messages"][1]["content"]
    sent = [line for line in streamed.read_text().splitlines() if '"signature_delta"' in line]
    assert replayed[0]["signature"] == json.loads(sent[0][len("data: "):])["delta"]["signature"]
    assert replayed[0]["thinking"] == thinking.thinking
    assert replayed[1] == {"type": "tool_use", "id": call.id, "name": "read", "input": {"path": "pyproject.toml"}}
    assert server.requests[1].json()["thinking"] == {"type": "enabled", "budget_tokens": 4_096}


# Request building: what only the Messages API needs.


def claude_reply(model: Model, *content: TextContent | ThinkingContent | ToolCall) -> AssistantMessage:
    return AssistantMessage(content=list(content), api=model.api, provider=model.provider, model=model.id,
                            stop_reason="tool_use", timestamp=2)


def answer(call_id: str, text: str) -> ToolResultMessage:
    return ToolResultMessage(tool_call_id=call_id, tool_name="weather", content=[TextContent(text=text)], timestamp=3)


def test_tool_call_ids_are_made_valid_and_unique_with_their_results_following(model: Model) -> None:
    """Other servers' ids ("functions.add:0", repeated every turn) break Anthropic's id rule."""
    kimi = Model(id="kimi-k2.5", provider="openrouter", api="openai-chat")
    history: list[Message] = [
        UserMessage(content="a", timestamp=1),
        claude_reply(kimi, ToolCall(id="functions.add:0", name="weather", arguments={})),
        answer("functions.add:0", "first"),
        claude_reply(kimi, ToolCall(id="functions.add:0", name="weather", arguments={}),
                     ToolCall(id="call_1|fc_2", name="weather", arguments={})),
        answer("call_1|fc_2", "third"),
        answer("functions.add:0", "second"),
    ]

    params = build_request_params(model, ProviderRequest(messages=tuple(history)), OPTIONS)

    assert problems("anthropic-messages", params, model) == []
    pairs = [(block["tool_use_id"], block["content"][0]["text"]) for message in params["messages"]
             for block in message["content"] if block["type"] == "tool_result"]
    assert pairs == [("functions_add_0", "first"), ("functions_add_0_2", "second"), ("call_1_fc_2", "third")]


@pytest.mark.parametrize(
    ("max_tokens", "thinking"),
    [
        (None, {"type": "enabled", "budget_tokens": 32_768}),  # the model's 32,000 leaves room: level budget
        (5_000, {"type": "enabled", "budget_tokens": 3_976}),  # shrunk to leave 1,024 for the answer
        (2_000, None),  # below the API's minimum budget of 1,024: no thinking
    ],
)
def test_the_thinking_budget_fits_under_max_tokens(model: Model, max_tokens: int | None, thinking: Any) -> None:
    model = model.model_copy(update={"max_tokens": 40_000})
    options = StreamOptions(thinking_level="high", max_tokens=max_tokens)

    params = build_request_params(model, REQUEST, options)

    assert params.get("thinking") == thinking
    assert problems("anthropic-messages", params, model) == []


def test_no_budget_when_the_request_answers_a_turn_that_did_not_start_with_thinking(model: Model) -> None:
    """The API refuses a budget when the turn whose tool results end the request has no thinking."""
    call = ToolCall(id="toolu_1", name="weather", arguments={})
    plain = claude_reply(model, call)
    thinking_first = claude_reply(model, ThinkingContent(thinking="t", signature="sig"), call)

    def request(reply: AssistantMessage) -> ProviderRequest:
        return ProviderRequest(messages=(UserMessage(content="a", timestamp=1), reply, answer("toolu_1", "sunny")))

    without = build_request_params(model, request(plain), StreamOptions(thinking_level="high"))
    with_thinking = build_request_params(model, request(thinking_first), StreamOptions(thinking_level="high"))

    assert "thinking" not in without
    assert with_thinking["thinking"]["type"] == "enabled"
    assert problems("anthropic-messages", without, model) == []
    assert problems("anthropic-messages", with_thinking, model) == []


def test_a_model_with_adaptive_thinking_gets_an_effort_instead_of_a_budget(model: Model) -> None:
    model = model.model_copy(update={"adaptive_thinking": True})

    params = build_request_params(model, REQUEST, StreamOptions(thinking_level="medium", temperature=0.3))

    assert (params["thinking"], params["output_config"]) == (
        {"type": "adaptive", "display": "summarized"}, {"effort": "medium"}
    )
    assert "extra_body" not in params  # no temperature with thinking
