"""The `openai-chat` adapter: OpenAI Chat Completions and the servers that speak it (OpenRouter,
Groq, Ollama, vLLM, llama.cpp's server), on `openai.AsyncOpenAI`.

Two parts are pure and reused by the embedded provider, which has no HTTP: `build_request_params`
(our request as the `chat.completions.create` keyword arguments) and `ChatStreamParser`
(`ChatCompletionChunk` objects into protocol events).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall
from openai.types.completion_usage import CompletionUsage

from harness.context import Context
from harness.messages import (
    AssistantMessage,
    CustomMessage,
    ImageContent,
    Message,
    TextContent,
    ToolResultMessage,
    Usage,
    UserContent,
    UserMessage,
    text_of,
)
from harness.providers.protocol import (
    Model,
    ProviderErrorInfo,
    ProviderRequest,
    StreamEvent,
    StreamFrame,
    StreamOptions,
    TextDeltaEvent,
    TextEndEvent,
    TextStartEvent,
    ThinkingDeltaEvent,
    ThinkingEndEvent,
    ThinkingStartEvent,
    ToolCallDeltaEvent,
    ToolCallEndEvent,
    ToolCallStartEvent,
    ToolSpec,
    UsageEvent,
    usage_with_cost,
)
from harness.providers.streaming import ClientCache, Finish, Outcome, resolve_api_key, stream_reply
from harness.providers.structured import openai_json_schema
from harness.providers.transform import prepare_history

# A local server needs no key, but the SDK refuses to start without one.
_NO_KEY = "no-key-needed"


class OpenAIChatProvider:
    """Streams replies from a Chat Completions endpoint (`Provider`, api `openai-chat`).

    Clients are cached per (base URL, API key) and event loop. `model.base_url` None leaves the URL
    to the SDK, so `OPENAI_BASE_URL` works; the key is `options.api_key`, else the variable
    `model.api_key_env` names, else the SDK's `OPENAI_API_KEY` (a model with a base URL and no
    `api_key_env` needs none). The SDK does not retry: the runtime retries durably, using the
    `error` event's classification.
    """

    def __init__(self) -> None:
        self._clients = ClientCache(new_openai_client)

    def stream(
        self, model: Model, request: ProviderRequest, options: StreamOptions, context: Context
    ) -> AsyncIterator[StreamEvent]:
        """Stream one reply (see `Provider`). Builds the request before the first event, so a
        history the wire format cannot carry raises here rather than mid-stream."""
        params = build_request_params(model, request, options)

        async def open_stream() -> openai.AsyncStream[ChatCompletionChunk]:
            client = self._clients.get(model.base_url, openai_api_key(model, options))
            stream: openai.AsyncStream[ChatCompletionChunk] = await client.chat.completions.create(**params)
            return stream

        return stream_reply(model, context, open_stream, ChatStreamParser(model))


def new_openai_client(base_url: str | None, api_key: str | None) -> openai.AsyncOpenAI:
    """An SDK client that does not retry (the runtime does, durably); None values leave the base
    URL and key to the SDK and its environment variables."""
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)


def openai_api_key(model: Model, options: StreamOptions) -> str | None:
    """The key to send (see `OpenAIChatProvider`); None lets the SDK read `OPENAI_API_KEY`."""
    key = resolve_api_key(model, options)
    if key is None and model.api_key_env is None and model.base_url is not None:
        return _NO_KEY
    return key


def is_openai_endpoint(model: Model) -> bool:
    """Whether `model` is served by OpenAI itself (base URL None: the SDK default or
    `OPENAI_BASE_URL`), which accepts OpenAI-only parameters other servers may refuse."""
    return model.base_url is None or "api.openai.com" in model.base_url


def is_openai_reasoning_model(model: Model) -> bool:
    """A reasoning model served by OpenAI itself, which refuses a `temperature`."""
    return model.reasoning and is_openai_endpoint(model)


def build_request_params(model: Model, request: ProviderRequest, options: StreamOptions) -> dict[str, Any]:
    """The keyword arguments for `client.chat.completions.create`, exactly as sent. Pure, no I/O.

    The history goes through `prepare_history` first (pairing, thinking, images) and is then only
    serialized: thinking is not sent (Chat Completions has no field for it), a tool call's
    `arguments` are sent as JSON text (`{}` for a call whose text was malformed, never the raw
    text), and images in tool results follow the results as one user message, since a `tool`
    message carries text only. Streaming asks for usage (`stream_options.include_usage`).
    `options.tool_choice` forces that tool. `request.output` is `response_format` `json_schema`,
    strict when the schema allows it (`openai_json_schema`). `max_tokens` is sent only when `options.max_tokens`
    is set (as `max_completion_tokens` to OpenAI itself); `reasoning_effort` only for a reasoning
    model with thinking on, at the nearest level the model takes (`Model.nearest_thinking_level`);
    `temperature` not to OpenAI's reasoning models, which refuse it; `prompt_cache_key` (from
    `options.session_id`) only to OpenAI. `extra_headers` merges `model.headers` and `options.headers`.
    """
    messages: list[dict[str, Any]] = []
    if request.system_prompt:
        messages.append({"role": "system", "content": request.system_prompt})
    messages.extend(_wire_messages(prepare_history(request.messages, model)))
    params: dict[str, Any] = {
        "model": model.id,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        params["tools"] = [_wire_tool(tool) for tool in request.tools]
    if options.tool_choice is not None:
        params["tool_choice"] = {"type": "function", "function": {"name": options.tool_choice}}
    if request.output is not None:
        params["response_format"] = {"type": "json_schema", "json_schema": openai_json_schema(request.output)}
    if options.max_tokens is not None:
        params["max_completion_tokens" if is_openai_endpoint(model) else "max_tokens"] = options.max_tokens
    if options.temperature is not None and not is_openai_reasoning_model(model):
        params["temperature"] = options.temperature
    if options.seed is not None:
        params["seed"] = options.seed
    if (effort := model.nearest_thinking_level(options.thinking_level)) != "off":
        params["reasoning_effort"] = effort
    if options.session_id and is_openai_endpoint(model):
        params["prompt_cache_key"] = options.session_id
    headers = {**model.headers, **options.headers}
    if headers:
        params["extra_headers"] = headers
    return params


def image_data_url(image: ImageContent) -> str:
    """`image` as a `data:` URL, the form both OpenAI APIs take inline images in."""
    return f"data:{image.mime_type};base64,{image.data}"


def _wire_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def _wire_messages(history: list[Message]) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    tool_images: list[dict[str, Any]] = []  # images of the tool results just serialized
    for message in history:
        if tool_images and not isinstance(message, ToolResultMessage):
            wire.append(_tool_images_message(tool_images))
            tool_images = []
        match message:
            case UserMessage() | CustomMessage():
                wire.append({"role": "user", "content": _wire_user_content(message.content)})
            case AssistantMessage():
                wire.extend(_wire_assistant(message))
            case ToolResultMessage():
                text = text_of(message.content, "\n")
                images = [_image_part(block) for block in message.content if isinstance(block, ImageContent)]
                if images and not text:
                    text = "(the result is the image that follows)"
                wire.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": text})
                tool_images.extend(images)
    if tool_images:
        wire.append(_tool_images_message(tool_images))
    return wire


def _tool_images_message(images: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": "Images from the tool results above:"}, *images]}


def _wire_user_content(content: str | list[UserContent]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": block.text} if isinstance(block, TextContent) else _image_part(block)
        for block in content
    ]


def _image_part(image: ImageContent) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": image_data_url(image)}}


def _wire_assistant(message: AssistantMessage) -> list[dict[str, Any]]:
    text = text_of(message.content)
    calls = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }
        for call in message.tool_calls
    ]
    if not text and not calls:
        return []  # only thinking, which this wire format does not carry
    wire: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        wire["tool_calls"] = calls
    return [wire]


# finish_reason values servers send, as stop reasons; anything else counts as a normal stop.
_FINISH_REASONS: dict[str, Finish] = {
    "stop": "stop",
    "end_turn": "stop",
    "length": "length",
    "max_tokens": "length",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "tool_use": "tool_use",
}
# finish_reason values that mean the server withheld or broke off the reply.
_FAILED_FINISH_REASONS = {
    "content_filter": "the server's content filter stopped the reply",
    "error": "the server reported an error as the finish reason",
}


@dataclass
class _OpenCall:
    id: str
    content_index: int


class ChatStreamParser:
    """Turns `ChatCompletionChunk`s into protocol events (a `StreamParser`). Pure, no I/O.

    - `delta.content` (and `refusal`) is text; reasoning is thinking, from `reasoning_content`,
      else `reasoning`, else the texts of `reasoning_details` (servers that send both `reasoning`
      and `reasoning_details` repeat one text in both);
    - tool calls are kept by `index`, their argument text arriving in pieces; several indexes are
      parallel calls, and an index that arrives again with a new call id starts a new call;
    - a text or thinking block ends when a block of another kind begins;
    - usage replaces earlier usage (cached prompt tokens become `cache_read`, reasoning tokens
      are part of `output`), priced from `model.cost`; the chunk id is the response id;
    - `finish_reason` becomes the stop reason (`tool_use` whenever calls arrived and the reason
      was a normal stop); `content_filter` ends the reply as an error, and a stream with no
      `finish_reason` as a retryable one.

    Only the first choice is read (requests never ask for more).
    """

    def __init__(self, model: Model) -> None:
        self._model = model
        self._blocks = 0
        self._text: int | None = None
        self._thinking: int | None = None
        self._calls: dict[int, _OpenCall] = {}  # by the server's tool call index
        self._ended_calls: list[int] = []
        self._response_id: str | None = None
        self._finish_reason: str | None = None

    def feed(self, chunk: ChatCompletionChunk) -> list[StreamFrame]:
        events: list[StreamFrame] = []
        if chunk.id and chunk.id != self._response_id:
            self._response_id = chunk.id
            if chunk.usage is None:
                events.append(UsageEvent(usage=Usage(), response_id=chunk.id))
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            self._delta(choice.delta, events)
            if choice.finish_reason:
                self._finish_reason = choice.finish_reason
        if chunk.usage is not None:
            events.append(UsageEvent(usage=self._usage(chunk.usage), response_id=self._response_id))
        return events

    def finish(self) -> tuple[list[StreamFrame], Outcome]:
        events: list[StreamFrame] = []
        self._end_prose(events)
        events.extend(ToolCallEndEvent(content_index=call.content_index) for call in self._calls.values())
        called = bool(self._calls or self._ended_calls)
        self._calls = {}
        reason = self._finish_reason
        if reason is None:
            return events, ProviderErrorInfo(kind="retryable", message="the stream ended without a finish reason")
        if reason in _FAILED_FINISH_REASONS:
            return events, ProviderErrorInfo(kind="other", message=_FAILED_FINISH_REASONS[reason])
        stop = _FINISH_REASONS.get(reason, "stop")
        return events, "tool_use" if called and stop == "stop" else stop

    def _delta(self, delta: ChoiceDelta, events: list[StreamFrame]) -> None:
        thinking = _reasoning_text(delta)
        if thinking:
            if self._text is not None:
                self._end_text(events)
            if self._thinking is None:
                self._thinking = self._new_block()
                events.append(ThinkingStartEvent(content_index=self._thinking))
            events.append(ThinkingDeltaEvent(content_index=self._thinking, delta=thinking))
        for text in (delta.content, delta.refusal):
            if text:
                if self._thinking is not None:
                    self._end_thinking(events)
                if self._text is None:
                    self._text = self._new_block()
                    events.append(TextStartEvent(content_index=self._text))
                events.append(TextDeltaEvent(content_index=self._text, delta=text))
        for call in delta.tool_calls or ():
            self._tool_call(call, events)

    def _tool_call(self, call: ChoiceDeltaToolCall, events: list[StreamFrame]) -> None:
        self._end_prose(events)
        function = call.function
        current = self._calls.get(call.index)
        if current is None or (call.id and call.id != current.id):
            if current is not None:
                events.append(ToolCallEndEvent(content_index=current.content_index))
                self._ended_calls.append(current.content_index)
            # Some servers send no id; the call still needs one to pair with its result.
            current = _OpenCall(id=call.id or f"call_{secrets.token_hex(12)}", content_index=self._new_block())
            self._calls[call.index] = current
            name = function.name if function is not None and function.name else ""
            events.append(ToolCallStartEvent(content_index=current.content_index, id=current.id, name=name))
        if function is not None and function.arguments:
            events.append(ToolCallDeltaEvent(content_index=current.content_index, delta=function.arguments))

    def _usage(self, usage: CompletionUsage) -> Usage:
        details = usage.prompt_tokens_details
        cached = (details.cached_tokens or 0) if details is not None else 0
        written = (details.cache_write_tokens or 0) if details is not None else 0
        counts = Usage(
            input=max(0, usage.prompt_tokens - cached - written),
            output=usage.completion_tokens,
            cache_read=cached,
            cache_write=written,
            total_tokens=usage.total_tokens,
        )
        return usage_with_cost(self._model, counts)

    def _new_block(self) -> int:
        index = self._blocks
        self._blocks += 1
        return index

    def _end_prose(self, events: list[StreamFrame]) -> None:
        self._end_thinking(events)
        self._end_text(events)

    def _end_text(self, events: list[StreamFrame]) -> None:
        if self._text is not None:
            events.append(TextEndEvent(content_index=self._text))
            self._text = None

    def _end_thinking(self, events: list[StreamFrame]) -> None:
        if self._thinking is not None:
            events.append(ThinkingEndEvent(content_index=self._thinking))
            self._thinking = None


def _reasoning_text(delta: ChoiceDelta) -> str:
    extra = delta.model_extra or {}
    for field in ("reasoning_content", "reasoning"):
        value = extra.get(field)
        if isinstance(value, str) and value:
            return value
    details = extra.get("reasoning_details")
    if not isinstance(details, list):
        return ""
    texts = [
        text
        for detail in details
        if isinstance(detail, dict)
        for text in (detail.get("text"), detail.get("summary"))
        if isinstance(text, str)
    ]
    return "".join(texts)
