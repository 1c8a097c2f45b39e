"""The OpenAI adapters beyond the recorded fixtures, over real HTTP through the real SDK: aborts by
the caller's Context, dropped connections, retry-after, tool-call streaming edge cases, and the
request the SDK actually sent. Streams here are written by hand in the servers' formats.

White-box where it checks a request or an error alone: it calls the adapters'
`build_request_params` and `providers.errors`' classifiers."""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from conftest import PROJECT_STREAMS
from harness.context import Context
from harness.messages import AssistantMessage, TextContent, ThinkingContent, ToolCall, ToolResultMessage, UserMessage
from harness.providers import (
    DoneEvent,
    ErrorEvent,
    Model,
    Provider,
    ProviderRequest,
    StreamEvent,
    StreamOptions,
    TextDeltaEvent,
    ToolCallEndEvent,
    ToolCallStartEvent,
    ToolSpec,
)
from harness.providers.errors import classify_exception, is_context_overflow
from harness.providers.openai_chat import OpenAIChatProvider
from harness.providers.openai_chat import build_request_params as build_chat_params
from harness.providers.openai_responses import OpenAIResponsesProvider
from harness.providers.openai_responses import build_request_params as build_responses_params
from harness.providers.replay import Hold, ReplayResponse, ReplayServer

OPTIONS = StreamOptions(api_key="replay-key")
HELLO = ProviderRequest(messages=(UserMessage(content="say hello"),))


@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


@pytest.fixture(autouse=True)
def fresh(server: ReplayServer) -> None:
    server.reset()


def chat_model(server: ReplayServer, **fields: Any) -> Model:
    return Model.model_validate(
        {"id": "chat-model", "provider": "replay", "api": "openai-chat", "base_url": f"{server.base_url}/v1", **fields}
    )


def responses_model(server: ReplayServer, **fields: Any) -> Model:
    return Model.model_validate({
        "id": "responses-model", "provider": "replay", "api": "openai-responses", "base_url": f"{server.base_url}/v1",
        **fields,
    })


def chat_chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> str:
    """One Chat Completions SSE event, as OpenAI-compatible servers send it."""
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "chat-model",
             "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(chunk)}\n\n"


CHAT_DONE = "data: [DONE]\n\n"


def responses_event(kind: str, **fields: Any) -> str:
    """One Responses SSE event."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1, "model": "responses-model", "status": "in_progress",
            "output": []}


def hello_stream(provider: Provider, hold: Hold) -> ReplayResponse:
    """A reply whose first two text deltas ("Hel", "lo") arrive, then the server holds."""
    if isinstance(provider, OpenAIChatProvider):
        start = chat_chunk({"role": "assistant", "content": "Hel"}) + chat_chunk({"content": "lo"})
        rest = chat_chunk({"content": " world"}) + chat_chunk(finish="stop") + CHAT_DONE
    else:
        start = (
            responses_event("response.created", response=RESPONSE, sequence_number=0)
            + responses_event("response.output_item.added", output_index=0, sequence_number=1,
                              item={"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress",
                                    "content": []})
            + responses_event("response.output_text.delta", output_index=0, content_index=0, item_id="msg_1",
                              delta="Hel", sequence_number=2, logprobs=[])
            + responses_event("response.output_text.delta", output_index=0, content_index=0, item_id="msg_1",
                              delta="lo", sequence_number=3, logprobs=[])
        )
        rest = responses_event("response.completed", response={**RESPONSE, "status": "completed"}, sequence_number=4)
    return ReplayResponse.sse(start, hold, rest)


ADAPTERS = [pytest.param(OpenAIChatProvider, id="openai-chat"), pytest.param(OpenAIResponsesProvider, id="responses")]


def model_for(provider: Provider, server: ReplayServer) -> Model:
    return chat_model(server) if isinstance(provider, OpenAIChatProvider) else responses_model(server)


async def collect(
    provider: Provider, model: Model, request: ProviderRequest, context: Context, options: StreamOptions = OPTIONS
) -> list[StreamEvent]:
    return [event async for event in provider.stream(model, request, options, context)]


def ending(events: list[StreamEvent]) -> DoneEvent | ErrorEvent:
    """The terminal event, checking that there is exactly one and it is last."""
    assert [type(event) for event in events[:-1] if isinstance(event, DoneEvent | ErrorEvent)] == []
    last = events[-1]
    assert isinstance(last, DoneEvent | ErrorEvent)
    return last


def failure(events: list[StreamEvent]) -> ErrorEvent:
    last = ending(events)
    assert isinstance(last, ErrorEvent), last
    return last


def is_delta(event: StreamEvent, text: str) -> bool:
    return isinstance(event, TextDeltaEvent) and event.delta == text


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_cancelling_the_context_mid_stream_aborts_the_request(
    adapter: type[Provider], server: ReplayServer
) -> None:
    """Issue 4: cancelling the Context while a read is pending drops the HTTP connection and ends
    the stream with an `error` event: stop reason `aborted`, the partial text, no exception."""
    provider, hold, context = adapter(), Hold(), Context()
    server.enqueue(hello_stream(provider, hold))
    events: list[StreamEvent] = []

    async for event in provider.stream(model_for(provider, server), HELLO, OPTIONS, context):
        events.append(event)
        if is_delta(event, "lo"):
            # The next read now waits on the held server; cancel while it is pending.
            asyncio.get_running_loop().call_soon(context.cancel, "user pressed stop")

    terminal = failure(events)
    assert terminal.error.kind == "aborted"
    assert terminal.message.stop_reason == "aborted"
    assert terminal.message.content == [TextContent(text="Hello")]
    assert "user pressed stop" in (terminal.message.error_message or "")
    assert await asyncio.to_thread(hold.disconnected.wait, 5.0)
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0  # the abort left no cancellation behind


async def test_a_context_cancelled_before_the_stream_sends_nothing(server: ReplayServer) -> None:
    """Issue 4: a Context already cancelled ends the stream at once, aborted, with no request."""
    context = Context()
    context.cancel("gave up")

    events = await collect(OpenAIChatProvider(), chat_model(server), HELLO, context)

    assert [event.type for event in events] == ["start", "error"]
    assert failure(events).message.stop_reason == "aborted"
    assert server.requests == []


async def test_cancelling_the_consuming_task_still_cancels_it(server: ReplayServer) -> None:
    """Only the Context turns into an `aborted` reply: cancelling the task that reads the stream
    propagates as CancelledError (and still drops the connection)."""
    provider, hold = OpenAIChatProvider(), Hold()
    server.enqueue(hello_stream(provider, hold))
    second_delta = asyncio.Event()

    async def consume() -> None:
        async for event in provider.stream(chat_model(server), HELLO, OPTIONS, Context()):
            if is_delta(event, "lo"):
                second_delta.set()

    task = asyncio.create_task(consume())
    await second_delta.wait()
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(hold.disconnected.wait, 5.0)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_dropped_connection_ends_in_a_retryable_error_with_the_partial_reply(
    adapter: type[Provider], server: ReplayServer
) -> None:
    """Issue 4: once started a stream never raises; a connection lost mid-body is a retryable
    `error` event holding what arrived."""
    provider = adapter()
    held = hello_stream(provider, Hold())
    server.enqueue(ReplayResponse.sse(held.body[0], end="drop"))  # the first part, then the server hangs up

    events = await collect(provider, model_for(provider, server), HELLO, Context())

    terminal = failure(events)
    assert terminal.error.kind == "retryable"
    assert terminal.message.stop_reason == "error"
    assert terminal.message.content == [TextContent(text="Hello")]


@pytest.mark.parametrize(
    ("status", "headers", "kind", "retry_after_ms"),
    [
        (429, {"retry-after": "7"}, "retryable", 7000),
        (429, {"retry-after-ms": "1500", "retry-after": "2"}, "retryable", 1500),
        (529, {"retry-after": "0.25"}, "retryable", 250),
        (500, {}, "retryable", None),
        (401, {"retry-after": "7"}, "authentication", None),
        (400, {"retry-after": "7"}, "invalid_request", None),
    ],
)
async def test_error_status_is_classified_with_the_servers_retry_after(
    status: int, headers: dict[str, str], kind: str, retry_after_ms: int | None, server: ReplayServer
) -> None:
    """Issue 4: 429/5xx/529 are retryable after the server's `retry-after-ms` or `retry-after`;
    other statuses are not retried, whatever their headers say."""
    server.enqueue(ReplayResponse.json({"error": {"message": "nope", "type": "x"}}, status=status, headers=headers))

    events = await collect(OpenAIChatProvider(), chat_model(server), HELLO, Context())

    error = failure(events).error
    assert (error.kind, error.status, error.retry_after_ms, error.message) == (kind, status, retry_after_ms, "nope")


async def test_retry_after_as_an_http_date(server: ReplayServer) -> None:
    """`retry-after` may be an HTTP date; the wait is the time until then."""
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.enqueue(ReplayResponse.json({"error": {"message": "slow down"}}, status=503, headers={"retry-after": when}))

    events = await collect(OpenAIChatProvider(), chat_model(server), HELLO, Context())

    retry_after = failure(events).error.retry_after_ms
    assert retry_after is not None
    assert 27_000 <= retry_after <= 30_000


async def test_tool_calls_by_index_new_ids_empty_and_malformed_arguments(server: ReplayServer) -> None:
    """Issue 4: arguments split across chunks; an index arriving again with a new call id is a new
    call (some servers number every call 0); empty arguments mean {}; text that is not JSON is kept
    raw and flagged, the arguments then being {}."""

    def tool_delta(call_id: str | None, name: str | None, arguments: str) -> str:
        function: dict[str, Any] = {"arguments": arguments}
        if name is not None:
            function["name"] = name
        call: dict[str, Any] = {"index": 0, "function": function}
        if call_id is not None:
            call |= {"id": call_id, "type": "function"}
        return chat_chunk({"tool_calls": [call]})

    server.enqueue(ReplayResponse.sse(
        tool_delta("call_a", "read", '{"path": "RE'),
        tool_delta(None, None, 'ADME.md"}'),
        tool_delta("call_b", "list", ""),
        tool_delta("call_c", "write", '{"path": "x", "text": '),
        tool_delta(None, None, "unterminated"),
        chat_chunk(finish="tool_calls"),
        CHAT_DONE,
    ))

    events = await collect(OpenAIChatProvider(), chat_model(server), HELLO, Context())

    message = ending(events).message
    assert message.stop_reason == "tool_use"
    assert message.content == [
        ToolCall(id="call_a", name="read", arguments={"path": "README.md"}),
        ToolCall(id="call_b", name="list", arguments={}),
        ToolCall(id="call_c", name="write", arguments={}, raw_arguments='{"path": "x", "text": unterminated'),
    ]
    starts = [event.content_index for event in events if isinstance(event, ToolCallStartEvent)]
    ends = [event.content_index for event in events if isinstance(event, ToolCallEndEvent)]
    assert starts == ends == [0, 1, 2]


async def test_chat_stream_without_a_finish_reason_is_a_retryable_error(server: ReplayServer) -> None:
    """A stream that ends cleanly but never said why it stopped was cut short."""
    server.enqueue(ReplayResponse.sse(chat_chunk({"content": "Hi"}), CHAT_DONE))

    events = await collect(OpenAIChatProvider(), chat_model(server), HELLO, Context())

    assert failure(events).error.kind == "retryable"
    assert failure(events).message.content == [TextContent(text="Hi")]


@pytest.mark.parametrize(
    ("finish", "stop_reason"),
    [("stop", "stop"), ("length", "length"), ("tool_calls", "tool_use"), ("function_call", "tool_use"),
     ("content_filter", "error")],
)
async def test_chat_finish_reasons_map_to_stop_reasons(finish: str, stop_reason: str, server: ReplayServer) -> None:
    """Issue 4: every finish_reason value the API documents maps to a stop reason."""
    server.enqueue(ReplayResponse.sse(chat_chunk({"content": "Hi"}), chat_chunk(finish=finish), CHAT_DONE))

    events = await collect(OpenAIChatProvider(), chat_model(server), HELLO, Context())

    assert ending(events).message.stop_reason == stop_reason


@pytest.mark.parametrize(
    ("reason", "stop_reason"), [("max_output_tokens", "length"), ("content_filter", "error")]
)
async def test_responses_incomplete_reasons_map_to_stop_reasons(
    reason: str, stop_reason: str, server: ReplayServer
) -> None:
    """Issue 4: an incomplete response stops with `length` when it ran out of output tokens and
    fails otherwise."""
    incomplete = {**RESPONSE, "status": "incomplete", "incomplete_details": {"reason": reason}}
    server.enqueue(ReplayResponse.sse(
        responses_event("response.created", response=RESPONSE, sequence_number=0),
        responses_event("response.incomplete", response=incomplete, sequence_number=1),
    ))

    events = await collect(OpenAIResponsesProvider(), responses_model(server), HELLO, Context())

    assert ending(events).message.stop_reason == stop_reason


async def test_chat_request_as_the_sdk_sent_it(server: ReplayServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 4: the request asks for usage in the stream, carries tools and the history, goes to
    `OPENAI_BASE_URL` when the model leaves the base URL to the SDK, with the key from the
    model's key variable; the body is `build_request_params` minus the headers it names."""
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.base_url}/v1")
    monkeypatch.setenv("REPLAY_TEST_KEY", "sk-from-env")
    model = Model(id="gpt-test", provider="openai", api="openai-chat", api_key_env="REPLAY_TEST_KEY")
    request = ProviderRequest(
        system_prompt="Be brief.",
        messages=(UserMessage(content="read it"),),
        tools=(ToolSpec(name="read", description="Read a file", parameters={"type": "object", "properties": {}}),),
    )
    options = StreamOptions(max_tokens=300, session_id="s1:main", headers={"x-trace": "t1"})
    server.enqueue(ReplayResponse.sse(chat_chunk({"content": "ok"}, finish="stop"), CHAT_DONE))

    events = await collect(OpenAIChatProvider(), model, request, Context(), options)

    assert isinstance(ending(events), DoneEvent)
    (sent,) = server.requests
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.headers["authorization"] == "Bearer sk-from-env"
    assert sent.headers["x-trace"] == "t1"
    body = sent.json()
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] == 300  # OpenAI itself: the newer name
    assert body["prompt_cache_key"] == "s1:main"
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "read it"}]
    assert body["tools"][0]["function"]["name"] == "read"
    expected = build_chat_params(model, request, options)
    del expected["extra_headers"]
    assert body == expected


async def test_chat_history_is_serialized_with_calls_answered_and_no_raw_arguments(server: ReplayServer) -> None:
    """Issue 4: a malformed call goes back with `{}` as its arguments, never the raw text, and is
    answered; results follow their calls; thinking is not sent to Chat Completions."""
    model = chat_model(server)
    reply = AssistantMessage(
        content=[
            ThinkingContent(thinking="plan", signature=None),
            TextContent(text="Reading."),
            ToolCall(id="call_1", name="read", arguments={"path": "a"}),
            ToolCall(id="call_2", name="read", arguments={}, raw_arguments="{oops"),
        ],
        api="openai-chat", provider="replay", model=model.id, stop_reason="tool_use",
    )
    result = ToolResultMessage(tool_call_id="call_1", tool_name="read", content=[TextContent(text="A")])
    request = ProviderRequest(messages=(UserMessage(content="go"), reply, result))
    server.enqueue(ReplayResponse.sse(chat_chunk({"content": "ok"}, finish="stop"), CHAT_DONE))

    await collect(OpenAIChatProvider(), model, request, Context())

    messages = server.requests[0].json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "Reading."
    assert [c["function"]["arguments"] for c in messages[1]["tool_calls"]] == ['{"path": "a"}', "{}"]
    assert [m["tool_call_id"] for m in messages[2:]] == ["call_1", "call_2"]
    assert "{oops" in messages[3]["content"]  # the model is told what was wrong with its call


async def test_responses_request_is_stateless_and_asks_for_encrypted_reasoning(server: ReplayServer) -> None:
    """Issue 4: `store=false` with `include=["reasoning.encrypted_content"]` for a reasoning
    model, and the body is exactly `build_request_params` minus the headers."""
    model = responses_model(server, reasoning=True)
    request = ProviderRequest(system_prompt="Be brief.", messages=(UserMessage(content="hi"),))
    options = StreamOptions(api_key="replay-key", thinking_level="high")
    server.enqueue(ReplayResponse.sse(
        responses_event("response.completed", response={**RESPONSE, "status": "completed"}, sequence_number=0)
    ))

    await collect(OpenAIResponsesProvider(), model, request, Context(), options)

    (sent,) = server.requests
    assert sent.path == "/v1/responses"
    body = sent.json()
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert body["instructions"] == "Be brief."
    assert body == build_responses_params(model, request, options)


async def test_responses_reasoning_is_replayed_byte_identical_to_the_same_model(server: ReplayServer) -> None:
    """Issue 4: the encrypted reasoning parsed from a stream goes back, in the next request to the
    same model, as a reasoning item with exactly the server's encrypted content, followed by the
    call and its result."""
    streamed = PROJECT_STREAMS / "openai-responses-reasoning-summary.sse"
    model = responses_model(server, id="gpt-5-mini-2025-08-07", reasoning=True)
    server.enqueue(ReplayResponse.from_file(streamed))
    first = await collect(OpenAIResponsesProvider(), model, HELLO, Context())
    reply = ending(first).message
    (call,) = reply.tool_calls
    result = ToolResultMessage(tool_call_id=call.id, tool_name=call.name, content=[TextContent(text="sunny")])
    server.reset()
    server.enqueue(ReplayResponse.sse(
        responses_event("response.completed", response={**RESPONSE, "status": "completed"}, sequence_number=0)
    ))

    follow_up = ProviderRequest(messages=(*HELLO.messages, reply, result))
    await collect(OpenAIResponsesProvider(), model, follow_up, Context())

    items = server.requests[0].json()["input"]
    assert [item.get("type", "message") for item in items] == [
        "message", "reasoning", "function_call", "function_call_output"
    ]
    streamed_item = next(
        payload["item"] for payload in map(json.loads, _data_lines(streamed))
        if payload["type"] == "response.output_item.done" and payload["item"]["type"] == "reasoning"
    )
    assert items[1]["encrypted_content"] == streamed_item["encrypted_content"]
    assert items[1]["id"] == streamed_item["id"]
    assert items[2] == {"type": "function_call", "call_id": call.id, "name": "read",
                        "arguments": '{"path": "pyproject.toml"}'}
    assert items[3] == {"type": "function_call_output", "call_id": call.id, "output": "sunny"}


def _data_lines(path: Any) -> list[str]:
    return [line.removeprefix("data: ") for line in path.read_text().splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize(
    "text",
    [
        "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
        "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
        "Your input exceeds the context window of this model. Please adjust your input and try again.",
        "prompt is too long: 219898 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 143653 + 64000 > 200000, decrease input length or "
        "`max_tokens` and try again",
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
        "Input is too long for requested model.",
        "This model's maximum prompt length is 131072 but the request contains 142610 tokens.",
        "the request exceeds the available context size, try increasing it",
        "The prompt (total length 25938) is too long to fit into the model (context length 4096).",
        "The decoder prompt (length 17772) is longer than the maximum model length of 16384.",
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length",
        "Please reduce the length of the messages or completion.",
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 32769. Given: 32000 `inputs` tokens "
        "and 1000 `max_new_tokens`",
        "This endpoint's maximum context length is 163840 tokens. However, you requested about 200000 tokens.",
    ],
)
def test_overflow_texts_of_every_server_family_are_recognized(text: str) -> None:
    """Issue 4: context overflow by message text, as OpenAI, Anthropic, Gemini, Bedrock, xAI,
    llama.cpp, vLLM, Mistral, Groq, text-generation-inference and OpenRouter word it."""
    assert is_context_overflow(text)


@pytest.mark.parametrize(
    "text",
    [
        "Token limit reached",  # the output limit, mid-stream
        "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, "
        "Requested 2000.",
        "Overloaded",
        "Invalid 'messages[1].content': string too long.",
    ],
)
def test_texts_that_are_not_overflow(text: str) -> None:
    assert not is_context_overflow(text)


async def test_a_refused_connection_is_retryable_and_says_why() -> None:
    """Issue 4: a connection failure is retryable; the SDK's bare "Connection error." keeps its
    cause in the message, and (issue 10) the message names the URL it tried."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = Model(id="m", provider="replay", api="openai-chat", base_url=f"http://127.0.0.1:{port}/v1")

    events = await collect(OpenAIChatProvider(), model, HELLO, Context())

    error = failure(events).error
    assert error.kind == "retryable"
    assert error.message.startswith(f"cannot connect to http://127.0.0.1:{port}/v1/chat/completions: "
                                    "Connection error. (ConnectError:")


def test_the_replay_command_serves_files_and_prints_its_url() -> None:
    """`python -m harness.providers.replay STATUS:FILE` prints the base URL first, then answers
    with the file (the entry later CLI end-to-end tests point OPENAI_BASE_URL at)."""
    body = PROJECT_STREAMS / "openai-chat-error-429.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.providers.replay", f"429:{body}"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="replay-key", max_retries=0)
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert raised.value.code == "rate_limit_exceeded"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_local_runtime_overflow_is_classified_as_context_overflow() -> None:
    """The embedded runtime reports overflow as a plain ValueError; the runtime still compacts."""
    error = ValueError("Requested tokens (5000) exceed context window of 4096")

    assert classify_exception(error).kind == "context_overflow"
    assert classify_exception(ValueError("something else")).kind == "other"
