"""The `openai-responses` adapter: the OpenAI Responses API on `client.responses.create(stream=True)`.

Requests are stateless (`store=False`): the whole history is sent every time, and a reasoning
model's reasoning comes back encrypted (`include=["reasoning.encrypted_content"]`) so it can be
replayed to the same model next turn. A reasoning item is kept as the `signature` of its thinking
block: the item's JSON (`type`, `id`, `summary`, `encrypted_content`), whose `encrypted_content`
is the server's string byte for byte; only items that have it are replayed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import openai
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseRefusalDeltaEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseUsage,
)

from harness.context import Context
from harness.messages import (
    AssistantMessage,
    CustomMessage,
    ImageContent,
    Message,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserContent,
    UserMessage,
    text_of,
)
from harness.providers.errors import classify_error_payload
from harness.providers.openai_chat import (
    image_data_url,
    is_openai_endpoint,
    is_openai_reasoning_model,
    new_openai_client,
    openai_api_key,
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
from harness.providers.streaming import ClientCache, Outcome, stream_reply
from harness.providers.structured import openai_json_schema
from harness.providers.transform import prepare_history


class OpenAIResponsesProvider:
    """Streams replies from the Responses API (`Provider`, api `openai-responses`).

    Clients, keys and base URLs work as for `OpenAIChatProvider`; the SDK does not retry.
    """

    def __init__(self) -> None:
        self._clients = ClientCache(new_openai_client)

    def stream(
        self, model: Model, request: ProviderRequest, options: StreamOptions, context: Context
    ) -> AsyncIterator[StreamEvent]:
        """Stream one reply (see `Provider`); the request is built before the first event."""
        params = build_request_params(model, request, options)

        async def open_stream() -> openai.AsyncStream[ResponseStreamEvent]:
            client = self._clients.get(model.base_url, openai_api_key(model, options))
            try:
                stream: openai.AsyncStream[ResponseStreamEvent] = await client.responses.create(**params)
            except openai.NotFoundError as error:
                if error.code == "model_not_found":
                    raise
                raise ResponsesApiMissing(f"{error.request.url} answered 404 (not found): "
                                          f"{no_responses_api(model)}") from error
            return stream

        return stream_reply(model, context, open_stream, ResponsesStreamParser(model))


class ResponsesApiMissing(Exception):
    """The server has no Responses endpoint; classified as `other` (retrying cannot help)."""


def no_responses_api(model: Model) -> str:
    """What to say when `model`'s server does not speak the Responses API, and how to switch."""
    return (f"this server does not offer the Responses API; to use Chat Completions, set api = \"openai-chat\" "
            f"under [providers.{model.provider}] in models.toml")


def build_request_params(model: Model, request: ProviderRequest, options: StreamOptions) -> dict[str, Any]:
    """The keyword arguments for `client.responses.create`, exactly as sent. Pure, no I/O.

    The history goes through `prepare_history` first and is then only serialized, as input
    items: user messages; an assistant reply as its reasoning items (only those whose signature
    holds encrypted content), `message` items for its text, and `function_call` items (arguments
    as JSON text, `{}` for malformed ones); each tool result as a `function_call_output`. Always
    `store=False`; a reasoning model also gets `include=["reasoning.encrypted_content"]` and, with
    thinking on, `reasoning={"effort", "summary": "auto"}` at the nearest level the model takes
    (`Model.nearest_thinking_level`). The system prompt is `instructions`;
    `options.tool_choice` forces that tool; `request.output` is `text.format` `json_schema`,
    strict when the schema allows it (`openai_json_schema`); `max_output_tokens` only when `options.max_tokens` is
    set; `temperature` not to OpenAI's reasoning models, which refuse it; `prompt_cache_key` (from
    `options.session_id`) only to OpenAI; `extra_headers` merges `model.headers` and
    `options.headers`.
    """
    params: dict[str, Any] = {
        "model": model.id,
        "input": _wire_input(prepare_history(request.messages, model)),
        "stream": True,
        "store": False,
    }
    if request.system_prompt:
        params["instructions"] = request.system_prompt
    if model.reasoning:
        params["include"] = ["reasoning.encrypted_content"]
        if (effort := model.nearest_thinking_level(options.thinking_level)) != "off":
            params["reasoning"] = {"effort": effort, "summary": "auto"}
    if request.tools:
        params["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
                "strict": False,
            }
            for tool in request.tools
        ]
    if options.tool_choice is not None:
        params["tool_choice"] = {"type": "function", "name": options.tool_choice}
    if request.output is not None:
        params["text"] = {"format": {"type": "json_schema", **openai_json_schema(request.output)}}
    if options.max_tokens is not None:
        params["max_output_tokens"] = options.max_tokens
    if options.temperature is not None and not is_openai_reasoning_model(model):
        params["temperature"] = options.temperature
    if options.session_id and is_openai_endpoint(model):
        params["prompt_cache_key"] = options.session_id
    headers = {**model.headers, **options.headers}
    if headers:
        params["extra_headers"] = headers
    return params


def reasoning_signature(item: ResponseReasoningItem) -> str | None:
    """The signature kept for a finished reasoning item: its replayable JSON, or None when the
    server sent no encrypted content (such an item cannot be replayed with `store=False`)."""
    if not item.encrypted_content:
        return None
    replayable = {
        "type": "reasoning",
        "id": item.id,
        "summary": [{"type": "summary_text", "text": part.text} for part in item.summary],
        "encrypted_content": item.encrypted_content,
    }
    return json.dumps(replayable, ensure_ascii=False, separators=(",", ":"))


def _wire_input(history: list[Message]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for message in history:
        match message:
            case UserMessage() | CustomMessage():
                items.append({"role": "user", "content": _wire_user_content(message.content)})
            case AssistantMessage():
                items.extend(_wire_assistant(message))
            case ToolResultMessage():
                items.append(
                    {"type": "function_call_output", "call_id": message.tool_call_id, "output": _wire_output(message)}
                )
    return items


def _wire_user_content(content: str | list[UserContent]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [_wire_user_part(block) for block in content]


def _wire_user_part(block: UserContent) -> dict[str, Any]:
    if isinstance(block, TextContent):
        return {"type": "input_text", "text": block.text}
    return {"type": "input_image", "image_url": image_data_url(block), "detail": "auto"}


def _wire_output(result: ToolResultMessage) -> str | list[dict[str, Any]]:
    if any(isinstance(block, ImageContent) for block in result.content):
        return [_wire_user_part(block) for block in result.content]
    return text_of(result.content, "\n")


def _wire_assistant(message: AssistantMessage) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ThinkingContent):
            reasoning = _replayable_reasoning(block.signature)
            if reasoning is not None:
                items.append(reasoning)
        elif isinstance(block, TextContent):
            items.append({"type": "message", "role": "assistant", "content": block.text})
        elif isinstance(block, ToolCall):
            arguments = json.dumps(block.arguments, ensure_ascii=False)
            items.append({"type": "function_call", "call_id": block.id, "name": block.name, "arguments": arguments})
    return items


def _replayable_reasoning(signature: str | None) -> dict[str, Any] | None:
    """The reasoning item a signature holds, if it is one this adapter wrote with encrypted content."""
    if not signature:
        return None
    try:
        item = json.loads(signature)
    except ValueError:
        return None
    if not isinstance(item, dict) or item.get("type") != "reasoning" or not item.get("encrypted_content"):
        return None
    return item


@dataclass
class _Item:
    """An output item being streamed, by its `output_index`."""

    kind: Literal["thinking", "text", "tool_call"]
    content_index: int | None = None  # None until its block starts
    part: int = 0  # the summary part or content part deltas last came for
    arguments_streamed: bool = False


# `incomplete_details.reason` values: running out of output tokens is `length`; others are failures.
_INCOMPLETE_REASONS = {
    "content_filter": "the server's content filter stopped the reply",
    "max_messages": "the response stopped at the server's message limit",
    "steered": "the response was interrupted by steering",
}


class ResponsesStreamParser:
    """Turns Responses stream events into protocol events (a `StreamParser`). Pure, no I/O.

    - a reasoning item is one thinking block: its summary deltas (parts separated by a blank
      line; raw `reasoning_text` deltas from servers that send them) and, when it is done, its
      `reasoning_signature`; an item with neither text nor encrypted content leaves no block;
    - a message item (including `phase: commentary` narration) is one text block of its text
      and refusal deltas; a `function_call` item is a tool call with its argument deltas;
    - an item whose text arrives only in its `done` event gets it as a single delta;
    - `response.completed` gives usage (cached input tokens as `cache_read`, reasoning tokens
      inside `output`) and `tool_use` or `stop`; `response.incomplete` gives `length` for
      `max_output_tokens` and an error otherwise; `response.failed` and `error` events end the
      reply with the server's error, classified;
    - a stream without a single `response.*` event (a server that does not offer the API) fails
      as `other`, saying how to switch to Chat Completions.
    """

    def __init__(self, model: Model) -> None:
        self._model = model
        self._blocks = 0
        self._items: dict[int, _Item] = {}
        self._called = False
        self._response_id: str | None = None
        self._outcome: Outcome | None = None
        self._spoke_responses = False

    def feed(self, event: ResponseStreamEvent) -> list[StreamFrame]:
        events: list[StreamFrame] = []
        kind = getattr(event, "type", None)
        self._spoke_responses = self._spoke_responses or (isinstance(kind, str) and kind.startswith("response."))
        match event:
            case ResponseCreatedEvent() | ResponseInProgressEvent():
                if event.response.id != self._response_id:
                    self._response_id = event.response.id
                    events.append(UsageEvent(usage=Usage(), response_id=event.response.id))
            case ResponseOutputItemAddedEvent():
                self._item_added(event, events)
            case ResponseReasoningSummaryTextDeltaEvent():
                self._delta(event.output_index, event.summary_index, event.delta, events)
            case ResponseReasoningTextDeltaEvent():
                self._delta(event.output_index, event.content_index, event.delta, events)
            case ResponseTextDeltaEvent() | ResponseRefusalDeltaEvent():
                self._delta(event.output_index, event.content_index, event.delta, events)
            case ResponseFunctionCallArgumentsDeltaEvent():
                item = self._items.get(event.output_index)
                if item is not None and item.content_index is not None and event.delta:
                    item.arguments_streamed = True
                    events.append(ToolCallDeltaEvent(content_index=item.content_index, delta=event.delta))
            case ResponseOutputItemDoneEvent():
                self._item_done(event, events)
            case ResponseCompletedEvent():
                self._usage(event.response.usage, events)
                self._end("tool_use" if self._called else "stop")
            case ResponseIncompleteEvent():
                self._usage(event.response.usage, events)
                details = event.response.incomplete_details
                reason = details.reason if details is not None else None
                if reason == "max_output_tokens":
                    self._end("length")
                else:
                    message = _INCOMPLETE_REASONS.get(reason or "", f"the response is incomplete ({reason})")
                    self._end(ProviderErrorInfo(kind="other", message=message))
            case ResponseFailedEvent():
                self._usage(event.response.usage, events)
                error = event.response.error
                payload = error.model_dump() if error is not None else "the response failed"
                self._end(classify_error_payload(payload))
            case ResponseErrorEvent():
                self._end(classify_error_payload({"code": event.code, "message": event.message}))
        return events

    def finish(self) -> tuple[list[StreamFrame], Outcome]:
        events: list[StreamFrame] = []
        for item in self._items.values():
            self._end_block(item, None, events)
        self._items = {}
        if self._outcome is None and not self._spoke_responses:
            # e.g. a Chat Completions stream served on any path: retrying cannot help.
            message = f"the reply held no Responses API events: {no_responses_api(self._model)}"
            return events, ProviderErrorInfo(kind="other", message=message)
        if self._outcome is None:
            return events, ProviderErrorInfo(kind="retryable", message="the stream ended before the response completed")
        return events, self._outcome

    def _item_added(self, event: ResponseOutputItemAddedEvent, events: list[StreamFrame]) -> None:
        item = event.item
        if isinstance(item, ResponseReasoningItem):
            self._items[event.output_index] = _Item("thinking")
        elif isinstance(item, ResponseOutputMessage):
            self._items[event.output_index] = _Item("text")
        elif isinstance(item, ResponseFunctionToolCall):
            self._called = True
            index = self._new_block()
            self._items[event.output_index] = _Item("tool_call", content_index=index)
            events.append(ToolCallStartEvent(content_index=index, id=item.call_id, name=item.name))

    def _delta(self, output_index: int, part: int, delta: str, events: list[StreamFrame]) -> None:
        item = self._items.get(output_index)
        if item is None or item.kind == "tool_call" or not delta:
            return
        index = item.content_index
        if index is None:
            index = self._start_block(item, events)
        elif part != item.part and item.kind == "thinking":
            delta = "\n\n" + delta  # a new summary part
        item.part = part
        events.append(_delta_event(item, index, delta))

    def _item_done(self, event: ResponseOutputItemDoneEvent, events: list[StreamFrame]) -> None:
        item = self._items.pop(event.output_index, None)
        if item is None:
            return
        done = event.item
        signature: str | None = None
        late_text = ""  # text the server sent only in the finished item
        if isinstance(done, ResponseReasoningItem):
            signature = reasoning_signature(done)
            summary = "\n\n".join(part.text for part in done.summary)
            late_text = summary or "".join(part.text for part in done.content or ())
        elif isinstance(done, ResponseOutputMessage):
            late_text = "".join(
                part.text if isinstance(part, ResponseOutputText) else part.refusal for part in done.content
            )
        elif isinstance(done, ResponseFunctionToolCall) and not item.arguments_streamed:
            late_text = done.arguments
        index = item.content_index
        if index is None and (late_text or signature):
            index = self._start_block(item, events)
        elif item.kind != "tool_call":
            late_text = ""  # its deltas carried the text already
        if index is not None and late_text:
            events.append(_delta_event(item, index, late_text))
        self._end_block(item, signature, events)

    def _start_block(self, item: _Item, events: list[StreamFrame]) -> int:
        index = item.content_index = self._new_block()
        if item.kind == "thinking":
            events.append(ThinkingStartEvent(content_index=index))
        else:
            events.append(TextStartEvent(content_index=index))
        return index

    def _end_block(self, item: _Item, signature: str | None, events: list[StreamFrame]) -> None:
        index = item.content_index
        if index is None:
            return
        if item.kind == "thinking":
            events.append(ThinkingEndEvent(content_index=index, signature=signature))
        elif item.kind == "text":
            events.append(TextEndEvent(content_index=index))
        else:
            events.append(ToolCallEndEvent(content_index=index))

    def _usage(self, usage: ResponseUsage | None, events: list[StreamFrame]) -> None:
        if usage is None:
            return
        details = usage.input_tokens_details
        # Older servers omit `cache_write_tokens`; the SDK then leaves the attribute unset.
        cached = getattr(details, "cached_tokens", None) or 0
        written = getattr(details, "cache_write_tokens", None) or 0
        counts = Usage(
            input=max(0, usage.input_tokens - cached - written),
            output=usage.output_tokens,
            cache_read=cached,
            cache_write=written,
            total_tokens=usage.total_tokens,
        )
        events.append(UsageEvent(usage=usage_with_cost(self._model, counts), response_id=self._response_id))

    def _end(self, outcome: Outcome) -> None:
        # The first terminal event decides: an `error` event is followed by `response.failed`.
        if self._outcome is None:
            self._outcome = outcome

    def _new_block(self) -> int:
        index = self._blocks
        self._blocks += 1
        return index


def _delta_event(item: _Item, index: int, text: str) -> StreamFrame:
    if item.kind == "thinking":
        return ThinkingDeltaEvent(content_index=index, delta=text)
    if item.kind == "tool_call":
        return ToolCallDeltaEvent(content_index=index, delta=text)
    return TextDeltaEvent(content_index=index, delta=text)
