"""The Anthropic Messages adapter (api `anthropic-messages`) on the official `anthropic` SDK.

`build_request_params` turns a `ProviderRequest` into the exact keyword arguments of
`AsyncAnthropic.messages.create` (pure); `MessagesStreamParser` turns the raw server-sent events
into protocol events; `AnthropicMessagesProvider.stream` joins them through the shared read loop
of `harness.providers.streaming`.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

import anthropic
from anthropic.types import (
    InputJSONDelta,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    RawMessageStreamEvent,
    RedactedThinkingBlock,
    SignatureDelta,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
)

from harness.context import Context
from harness.messages import (
    AssistantMessage,
    Message,
    TextContent,
    ThinkingContent,
    ThinkingLevel,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserContent,
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
    UsageEvent,
    usage_with_cost,
)
from harness.providers.streaming import ClientCache, Finish, Outcome, resolve_api_key, stream_reply
from harness.providers.transform import prepare_history, rename_tool_call_ids

API = "anthropic-messages"

# Thinking budget in tokens per level, for models that take a budget; the API's minimum is 1,024.
THINKING_BUDGETS: dict[ThinkingLevel, int] = {
    "minimal": 1_024, "low": 4_096, "medium": 10_240, "high": 32_768, "xhigh": 64_000,
}
MIN_THINKING_BUDGET = 1_024
# Output tokens kept for the answer itself when a budget has to shrink to fit under max_tokens.
MIN_ANSWER_TOKENS = 1_024
# Effort per level, for models with adaptive thinking (`Model.adaptive_thinking`).
THINKING_EFFORTS: dict[ThinkingLevel, str] = {
    "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "max",
}

IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_TOOL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_TOOL_ID_FORBIDDEN = re.compile(r"[^a-zA-Z0-9_-]")
_CACHE = {"type": "ephemeral"}

# Every stop reason the API sends, mapped to ours. `pause_turn` (a server tool paused a long turn)
# ends the reply as it stands; `refusal` is handled apart: the reply fails, so it is never replayed.
STOP_REASONS: dict[str, Finish] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_use",
}


class AnthropicMessagesProvider:
    """Streams replies from the Anthropic Messages API or a server speaking it (`Provider`, api
    `anthropic-messages`).

    Clients are cached per (base URL, API key) and event loop. `model.base_url` None leaves the URL
    to the SDK, so `ANTHROPIC_BASE_URL` works; the key is `options.api_key`, else the variable
    `model.api_key_env` names, else the SDK's own default (`ANTHROPIC_API_KEY`). The SDK does not
    retry: the runtime retries durably, using the `error` event's classification.
    """

    def __init__(self) -> None:
        self._clients = ClientCache(_new_client)

    def stream(
        self, model: Model, request: ProviderRequest, options: StreamOptions, context: Context
    ) -> AsyncIterator[StreamEvent]:
        """Stream one reply (see `Provider`): `start`, then `done`, or `error` holding the partial
        reply (stop reason `aborted` when `context` is cancelled, which drops the HTTP request).
        A `refusal` ends in `error` of kind `other`, so the refused reply is never sent back; an
        in-stream `error` event (e.g. `overloaded_error`) is classified like an HTTP error."""
        params = build_request_params(model, request, options)

        async def open_stream() -> anthropic.AsyncStream[RawMessageStreamEvent]:
            client = self._clients.get(model.base_url, resolve_api_key(model, options))
            stream: anthropic.AsyncStream[RawMessageStreamEvent] = await client.messages.create(**params)
            return stream

        return stream_reply(model, context, open_stream, MessagesStreamParser(model))


def _new_client(base_url: str | None, api_key: str | None) -> anthropic.AsyncAnthropic:
    # No SDK retries: the runtime retries durably. None values leave URL and key to the SDK.
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)


def build_request_params(model: Model, request: ProviderRequest, options: StreamOptions) -> dict[str, Any]:
    """The keyword arguments `AsyncAnthropic.messages.create` is called with for `request` (pure).

    - `messages`: the history after `prepare_history`, tool call ids made safe for the API's
      `^[a-zA-Z0-9_-]{1,64}$` (and unique), consecutive messages of one role merged (tool results
      first in the user turn after their calls), images in a type the API does not read replaced by
      a text placeholder, and a prompt-cache breakpoint on the last user block;
    - `system`: the system prompt as one text block with a cache breakpoint;
    - `tools`: name, description and `input_schema`;
    - `max_tokens`: `options.max_tokens`, else `model.max_tokens`;
    - `thinking` at the nearest level the model takes (`Model.nearest_thinking_level`), unless that
      is `off`: an effort (`output_config`) for
      `model.adaptive_thinking`, else a budget from `THINKING_BUDGETS`, shrunk to leave
      `MIN_ANSWER_TOKENS` under `max_tokens` and left out below the API's 1,024 or when the
      assistant turn the request continues (its tool results are last) has no thinking to start
      with, which the API refuses with a budget;
    - `output_config.format` a `json_schema` for `request.output`, in the shape the API takes
      (the SDK's `transform_schema`: objects closed, constraints it does not enforce moved into
      descriptions; the run still validates the answer against the schema as given);
    - `extra_body.temperature` only when `options.temperature` is set and thinking is off (the SDK
      no longer takes it as an argument, and thinking requires the default);
    - `extra_headers`: `model.headers` and `options.headers` merged, when there are any.
    """
    history = rename_tool_call_ids(prepare_history(request.messages, model), _wire_tool_id)
    messages = _wire_messages(history)
    max_tokens = options.max_tokens or model.max_tokens
    params: dict[str, Any] = {"model": model.id, "max_tokens": max_tokens, "messages": messages, "stream": True}
    if request.system_prompt:
        params["system"] = [{"type": "text", "text": request.system_prompt, "cache_control": _CACHE}]
    if request.tools:
        params["tools"] = [
            {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
            for tool in request.tools
        ]
    # The API refuses a forced tool together with extended thinking: forcing a tool wins.
    thinking = {} if options.tool_choice else _thinking_params(model, options.thinking_level, max_tokens, messages)
    if options.tool_choice is not None:
        params["tool_choice"] = {"type": "tool", "name": options.tool_choice}
    params.update(thinking)
    if request.output is not None:
        answer = {"type": "json_schema", "schema": anthropic.transform_schema(request.output.json_schema)}
        params["output_config"] = {**params.get("output_config", {}), "format": answer}
    if options.temperature is not None and not thinking:
        params["extra_body"] = {"temperature": options.temperature}
    if headers := {**model.headers, **options.headers}:
        params["extra_headers"] = headers
    return params


def _thinking_params(
    model: Model, level: ThinkingLevel, max_tokens: int, messages: list[dict[str, Any]]
) -> dict[str, Any]:
    level = model.nearest_thinking_level(level)
    if level == "off":
        return {}
    if model.adaptive_thinking:
        return {
            "thinking": {"type": "adaptive", "display": "summarized"},
            "output_config": {"effort": THINKING_EFFORTS[level]},
        }
    budget = min(THINKING_BUDGETS[level], max_tokens - MIN_ANSWER_TOKENS)
    if budget < MIN_THINKING_BUDGET or not _continues_with_thinking(messages):
        return {}
    return {"thinking": {"type": "enabled", "budget_tokens": budget}}


def _continues_with_thinking(messages: list[dict[str, Any]]) -> bool:
    """False when the request ends with tool results for an assistant turn that does not start with
    thinking (a reply from another model, or one made with thinking off): the API requires that turn
    to start with thinking when a budget is set."""
    if len(messages) < 2 or not any(block["type"] == "tool_result" for block in messages[-1]["content"]):
        return True
    return messages[-2]["content"][0]["type"] in ("thinking", "redacted_thinking")


def _wire_tool_id(call_id: str, taken: set[str]) -> str:
    candidate = call_id if _TOOL_ID.fullmatch(call_id) else (_TOOL_ID_FORBIDDEN.sub("_", call_id)[:64] or "call")
    number = 1
    unique = candidate
    while unique in taken:
        number += 1
        unique = f"{candidate[:56]}_{number}"
    return unique


def _wire_messages(history: Sequence[Message]) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    for message in history:
        role, blocks = _wire_message(message)
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)  # one turn per role: results and a steer share a user turn
        else:
            wire.append({"role": role, "content": blocks})
    if wire and wire[-1]["role"] == "user":
        wire[-1]["content"][-1] = {**wire[-1]["content"][-1], "cache_control": _CACHE}
    return wire


def _wire_message(message: Message) -> tuple[Literal["user", "assistant"], list[dict[str, Any]]]:
    match message:
        case AssistantMessage():
            return "assistant", [_assistant_block(block) for block in message.content]
        case ToolResultMessage():
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
            if message.content:
                result["content"] = [_user_block(block) for block in message.content]
            if message.is_error:
                result["is_error"] = True
            return "user", [result]
        case _:  # a user message; prepare_history has made custom messages user messages
            if isinstance(message.content, str):
                return "user", [{"type": "text", "text": message.content}]
            return "user", [_user_block(block) for block in message.content]


def _assistant_block(block: TextContent | ThinkingContent | ToolCall) -> dict[str, Any]:
    match block:
        case TextContent():
            return {"type": "text", "text": block.text}
        case ThinkingContent(redacted=True):
            return {"type": "redacted_thinking", "data": block.signature}
        case ThinkingContent():
            return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
        case ToolCall():
            # A call whose argument text was malformed has arguments {}; the raw text is never sent.
            return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.arguments}


def _user_block(block: UserContent) -> dict[str, Any]:
    if isinstance(block, TextContent):
        return {"type": "text", "text": block.text}
    if block.mime_type not in IMAGE_MEDIA_TYPES:
        return {"type": "text", "text": f"[image omitted ({block.mime_type}): not a type this model reads]"}
    return {"type": "image", "source": {"type": "base64", "media_type": block.mime_type, "data": block.data}}


class _Block:
    """A content block of the reply still streaming: our index, its kind, and what arrives apart
    from the deltas (a thinking signature, a tool call's input given whole at its start)."""

    __slots__ = ("index", "kind", "signature", "start_input", "streamed_input")

    def __init__(self, index: int, kind: str, *, signature: str = "", start_input: dict[str, object] | None = None):
        self.index = index
        self.kind = kind
        self.signature = signature
        self.start_input = start_input
        self.streamed_input = False


class MessagesStreamParser:
    """Turns the raw events of one Messages stream into protocol events (`StreamParser`).

    Blocks are numbered in the order they start; server-tool blocks and block kinds this version
    does not know are skipped. Usage comes with `message_start` and again, cumulative, with
    `message_delta`; each gives a `usage` event with the cost from `model.cost`.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self._blocks: dict[int, _Block] = {}  # the server's block index -> the open block
        self._next_index = 0
        self._usage = Usage()
        self._response_id: str | None = None
        self._stop_reason: str | None = None
        self._refusal: str | None = None
        self._has_tool_call = False
        self._complete = False

    def feed(self, event: RawMessageStreamEvent) -> list[StreamFrame]:
        """The events one raw stream event contributes."""
        return list(self._frames(event))

    def finish(self) -> tuple[list[StreamFrame], Outcome]:
        """Close what is still open and say how the reply ended: by its stop reason after
        `message_stop`, a retryable failure without it, an `other` failure for a refusal."""
        closing = [frame for block in self._blocks.values() for frame in self._end_block(block)]
        self._blocks.clear()
        if not self._complete:
            ended = "the stream ended before the reply was complete"
            return closing, ProviderErrorInfo(kind="retryable", message=ended)
        if self._stop_reason == "refusal":
            detail = f": {self._refusal}" if self._refusal else ""
            return closing, ProviderErrorInfo(kind="other", message=f"the model declined to answer{detail}")
        stop = STOP_REASONS.get(self._stop_reason or "end_turn")
        if stop is None:  # a stop reason newer than this adapter: end the reply as it stands
            stop = "tool_use" if self._has_tool_call else "stop"
        return closing, stop

    def _frames(self, event: RawMessageStreamEvent) -> Iterator[StreamFrame]:
        match event:
            case RawMessageStartEvent(message=message):
                self._response_id = message.id
                usage = message.usage
                yield self._count_usage(
                    usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens,
                    usage.cache_creation_input_tokens,
                )
            case RawContentBlockStartEvent(index=server_index, content_block=block):
                yield from self._start_block(server_index, block)
            case RawContentBlockDeltaEvent(index=server_index, delta=delta):
                if (open_block := self._blocks.get(server_index)) is not None:
                    yield from self._delta(open_block, delta)
            case RawContentBlockStopEvent(index=server_index):
                if (open_block := self._blocks.pop(server_index, None)) is not None:
                    yield from self._end_block(open_block)
            case RawMessageDeltaEvent(delta=delta, usage=usage):
                self._stop_reason = delta.stop_reason or self._stop_reason
                if delta.stop_details is not None:
                    self._refusal = delta.stop_details.explanation or delta.stop_details.category
                yield self._count_usage(
                    usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens,
                    usage.cache_creation_input_tokens,
                )
            case RawMessageStopEvent():
                self._complete = True

    def _start_block(self, server_index: int, block: object) -> Iterator[StreamFrame]:
        index = self._next_index
        match block:
            case TextBlock(text=text):
                self._blocks[server_index] = _Block(index, "text")
                yield TextStartEvent(content_index=index)
                if text:
                    yield TextDeltaEvent(content_index=index, delta=text)
            case ThinkingBlock(thinking=thinking, signature=signature):
                self._blocks[server_index] = _Block(index, "thinking", signature=signature)
                yield ThinkingStartEvent(content_index=index)
                if thinking:
                    yield ThinkingDeltaEvent(content_index=index, delta=thinking)
            case RedactedThinkingBlock(data=data):
                # Opaque reasoning: no text, and its data is what goes back, kept as the signature.
                self._blocks[server_index] = _Block(index, "thinking", signature=data)
                yield ThinkingStartEvent(content_index=index, redacted=True)
            case ToolUseBlock(id=call_id, name=name, input=start_input):
                self._blocks[server_index] = _Block(index, "tool_call", start_input=start_input)
                self._has_tool_call = True
                yield ToolCallStartEvent(content_index=index, id=call_id, name=name)
            case _:
                return
        self._next_index += 1

    def _delta(self, block: _Block, delta: object) -> Iterator[StreamFrame]:
        match delta:
            case TextDelta(text=text) if text and block.kind == "text":
                yield TextDeltaEvent(content_index=block.index, delta=text)
            case ThinkingDelta(thinking=thinking) if thinking and block.kind == "thinking":
                yield ThinkingDeltaEvent(content_index=block.index, delta=thinking)
            case SignatureDelta(signature=signature) if block.kind == "thinking":
                block.signature += signature
            case InputJSONDelta(partial_json=fragment) if fragment and block.kind == "tool_call":
                block.streamed_input = True
                yield ToolCallDeltaEvent(content_index=block.index, delta=fragment)

    def _end_block(self, block: _Block) -> Iterator[StreamFrame]:
        if block.kind == "text":
            yield TextEndEvent(content_index=block.index)
        elif block.kind == "thinking":
            yield ThinkingEndEvent(content_index=block.index, signature=block.signature or None)
        else:
            if not block.streamed_input and block.start_input:
                # The whole input came with the block's start instead of as deltas.
                yield ToolCallDeltaEvent(content_index=block.index, delta=json.dumps(block.start_input))
            yield ToolCallEndEvent(content_index=block.index)

    def _count_usage(
        self, input: int | None, output: int, cache_read: int | None, cache_write: int | None
    ) -> UsageEvent:
        # message_delta counts are cumulative; a count it leaves out keeps message_start's value.
        counts = {"input": input, "output": output, "cache_read": cache_read, "cache_write": cache_write}
        self._usage = self._usage.model_copy(update={k: v for k, v in counts.items() if v is not None})
        # Anthropic's input count excludes cache reads and writes; the total is the sum of all four.
        return UsageEvent(usage=usage_with_cost(self.model, self._usage), response_id=self._response_id)
