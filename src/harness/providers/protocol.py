"""The provider protocol: models, requests, stream events and the one fold of events into a reply.

A provider turns a `ProviderRequest` into a stream of `StreamEvent`s for one `Model`. Events carry
deltas only; `AssistantStreamAccumulator` is the single place that folds them into an
`AssistantMessage`, used by adapters to build their final message and by the runtime to rebuild a
partial reply from persisted frames after a crash.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from harness.context import Context
from harness.messages import (
    THINKING_LEVELS,
    AssistantContent,
    AssistantMessage,
    CleanJsonObject,
    Cost,
    Message,
    OutputSchema,
    TextContent,
    ThinkingContent,
    ThinkingLevel,
    ToolCall,
    Usage,
    clean_json,
    now_ms,
    parse_json_text,
)

ApiName: TypeAlias = Literal["openai-chat", "openai-responses", "anthropic-messages", "faux", "embedded"]
InputModality: TypeAlias = Literal["text", "image"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelCost(_Frozen):
    """US dollars per million tokens of each kind."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0


class Model(_Frozen):
    """One callable model: who serves it (`provider`), which wire format (`api`), where (`base_url`;
    None leaves it to the SDK and its environment variables) and what it can do.

    `cost` is its price (None: the `genai-prices` catalogue's, looked up when the registry
    resolves it for a request, `ModelRegistry.resolve`; a model used without the registry then
    costs nothing); `context_window` and `max_tokens` are in tokens; `api_key_env` names the environment variable
    holding its key (None: no key needed); `path` is a local weights file for the embedded api;
    `max_tool_steps` caps the steps with tool calls in one run for a model too weak to be trusted with
    more (None: no cap); `adaptive_thinking` marks a reasoning model that takes an effort level
    instead of a thinking budget in tokens (Anthropic's Opus 4.7 refuses a budget; 4.6 deprecates it);
    `max_thinking_level` is the highest thinking level a reasoning model takes (`xhigh` only for the
    few that do, such as OpenAI's gpt-5.2); `structured_output` is how a request's `output` schema
    is asked for: `native`, in the wire format's own field (OpenAI's `response_format` or
    `text.format`, Anthropic's `output_config.format`), or `tool`, as a final-answer tool the
    model calls (`harness.providers.structured`), for a server or model without the native field.
    """

    id: str
    provider: str
    api: ApiName
    name: str = ""
    base_url: str | None = None
    api_key_env: str | None = None
    context_window: int = 128_000
    max_tokens: int = 16_384
    input: tuple[InputModality, ...] = ("text",)
    reasoning: bool = False
    cost: ModelCost | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    path: str | None = None
    max_tool_steps: int | None = None
    adaptive_thinking: bool = False
    max_thinking_level: ThinkingLevel = "high"
    structured_output: Literal["native", "tool"] = "native"

    def thinking_levels(self) -> tuple[ThinkingLevel, ...]:
        """The thinking levels this model takes, lowest first: only `off` without `reasoning`, else
        every level up to `max_thinking_level`."""
        if not self.reasoning:
            return ("off",)
        return THINKING_LEVELS[: THINKING_LEVELS.index(self.max_thinking_level) + 1]

    def nearest_thinking_level(self, level: ThinkingLevel) -> ThinkingLevel:
        """The level an adapter sends for a lane set to `level`: `level` if this model takes it,
        else the highest level it takes, which is the nearest (the levels taken are the lowest ones).
        A lane keeps its level as set, so it may outlive a switch to a model that does not take it."""
        taken = self.thinking_levels()
        return level if level in taken else taken[-1]


def usage_with_cost(model: Model, usage: Usage) -> Usage:
    """`usage` with its cost in US dollars at `model.cost` (prices per million tokens; none: 0),
    and `total_tokens` as the sum of the token kinds when the provider reported none."""
    prices = model.cost or ModelCost()
    cost = Cost(
        input=usage.input * prices.input / 1e6,
        output=usage.output * prices.output / 1e6,
        cache_read=usage.cache_read * prices.cache_read / 1e6,
        cache_write=usage.cache_write * prices.cache_write / 1e6,
    )
    total_tokens = usage.total_tokens or usage.input + usage.output + usage.cache_read + usage.cache_write
    return usage.model_copy(
        update={
            "cost": cost.model_copy(update={"total": cost.input + cost.output + cost.cache_read + cost.cache_write}),
            "total_tokens": total_tokens,
        }
    )


class ToolSpec(_Frozen):
    """A tool as the model sees it: name, description and a JSON Schema object for its arguments."""

    name: str
    description: str
    parameters: CleanJsonObject


class ProviderRequest(_Frozen):
    """What one provider request carries: the system prompt, the message history (oldest first),
    the tools the model may call and, when its answer must be JSON of a shape, that shape (`output`:
    the adapter asks for it in the wire format's field; `Model.structured_output` says whether a
    model takes it so)."""

    system_prompt: str | None = None
    messages: tuple[Message, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    output: OutputSchema | None = None


class StreamOptions(_Frozen):
    """Per-request settings. `max_tokens` None means the model's own limit; `session_id` is a
    stable cache/affinity key (the runtime passes `{session_id}:{lane}`); `api_key` overrides the
    key from the environment; `tool_choice` names a tool of the request the model must call (None:
    the model decides)."""

    temperature: float | None = None
    max_tokens: int | None = None
    thinking_level: ThinkingLevel = "off"
    session_id: str | None = None
    api_key: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    seed: int | None = None
    tool_choice: str | None = None


ErrorKind: TypeAlias = Literal[
    "retryable", "context_overflow", "authentication", "invalid_request", "aborted", "other"
]


class ProviderErrorInfo(_Frozen):
    """How a failed request should be treated: retry it (after `retry_after_ms` if the server said),
    compact and retry (context overflow), or give up. `status` is the HTTP status when there was one."""

    kind: ErrorKind
    message: str
    status: int | None = None
    retry_after_ms: int | None = None


class StartEvent(_Frozen):
    """The reply began. `timestamp` (Unix ms) is set by whoever persists the stream, so a reply
    rebuilt from stored frames is the same every time it is rebuilt."""

    type: Literal["start"] = "start"
    api: str
    provider: str
    model: str
    response_id: str | None = None
    timestamp: int | None = None


class TextStartEvent(_Frozen):
    type: Literal["text_start"] = "text_start"
    content_index: int


class TextDeltaEvent(_Frozen):
    type: Literal["text_delta"] = "text_delta"
    content_index: int
    delta: str


class TextEndEvent(_Frozen):
    type: Literal["text_end"] = "text_end"
    content_index: int


class ThinkingStartEvent(_Frozen):
    type: Literal["thinking_start"] = "thinking_start"
    content_index: int
    redacted: bool = False


class ThinkingDeltaEvent(_Frozen):
    type: Literal["thinking_delta"] = "thinking_delta"
    content_index: int
    delta: str


class ThinkingEndEvent(_Frozen):
    """Closes a thinking block; `signature` is the provider's opaque replay token, kept byte-exact."""

    type: Literal["thinking_end"] = "thinking_end"
    content_index: int
    signature: str | None = None


class ToolCallStartEvent(_Frozen):
    type: Literal["toolcall_start"] = "toolcall_start"
    content_index: int
    id: str
    name: str


class ToolCallDeltaEvent(_Frozen):
    """A piece of the call's argument JSON text, as streamed."""

    type: Literal["toolcall_delta"] = "toolcall_delta"
    content_index: int
    delta: str


class ToolCallEndEvent(_Frozen):
    type: Literal["toolcall_end"] = "toolcall_end"
    content_index: int


class UsageEvent(_Frozen):
    """The reply's usage so far (replaces any earlier one) and, once known, the response id."""

    type: Literal["usage"] = "usage"
    usage: Usage
    response_id: str | None = None


class DoneEvent(_Frozen):
    """The stream finished normally; `message` is the complete reply."""

    type: Literal["done"] = "done"
    message: AssistantMessage


class ErrorEvent(_Frozen):
    """The stream failed or was aborted; `message` holds the partial content with stop reason
    `error` or `aborted` and an `error_message`; `error` says how to treat it."""

    type: Literal["error"] = "error"
    message: AssistantMessage
    error: ProviderErrorInfo


_Frames = (
    StartEvent
    | TextStartEvent
    | TextDeltaEvent
    | TextEndEvent
    | ThinkingStartEvent
    | ThinkingDeltaEvent
    | ThinkingEndEvent
    | ToolCallStartEvent
    | ToolCallDeltaEvent
    | ToolCallEndEvent
    | UsageEvent
)

StreamFrame: TypeAlias = Annotated[_Frames, Field(discriminator="type")]
"""Every non-terminal event: what the runtime persists as frames while a reply streams."""

StreamEvent: TypeAlias = Annotated[_Frames | DoneEvent | ErrorEvent, Field(discriminator="type")]
"""A frame, or the stream's one terminal event (`done` or `error`)."""


@runtime_checkable
class Provider(Protocol):
    """A model server speaking one wire format.

    `stream` may raise before its first event only for caller errors (bad model or options).
    Once started it never raises: it ends with exactly one `DoneEvent` or `ErrorEvent`. Cancelling
    `context` aborts the HTTP request and ends the stream with an `ErrorEvent` whose message has
    stop reason `aborted` and the partial content.
    """

    def stream(
        self, model: Model, request: ProviderRequest, options: StreamOptions, context: Context
    ) -> AsyncIterator[StreamEvent]: ...


@runtime_checkable
class DeferredProvider(Provider, Protocol):
    """A provider that can answer later: `stream` may end with stop reason `deferred` and a
    `deferred_id`; `poll` streams the answer (or another `deferred` reply if still pending);
    `cancel` is best effort and raises nothing (HA-27)."""

    def poll(self, model: Model, deferred_id: str, options: StreamOptions, context: Context) -> AsyncIterator[
        StreamEvent
    ]: ...

    async def cancel(self, model: Model, deferred_id: str, context: Context) -> None: ...


def parse_tool_arguments(text: str) -> tuple[dict[str, JsonValue], str | None]:
    """Parse streamed tool-call argument text into `(arguments, raw_arguments)`.

    Empty text means `{}`. Text that is not a strict JSON object (also `NaN`, infinities, or
    nesting deeper than a message may hold) gives `({}, text)`: the raw text is kept so the call
    can be answered with an error instead of being run or resent malformed.
    """
    if not text.strip():
        return {}, None
    try:
        value = parse_json_text(text)
        if not isinstance(value, dict):
            return {}, text
        # Cleaned as a message would clean it; refused if it could not be stored (too deep, for one).
        cleaned = clean_json(value)
    except ValueError:
        return {}, text
    assert isinstance(cleaned, dict)
    return cleaned, None


_NO_USAGE = Usage()  # frozen: one shared until a usage event replaces it


class AssistantStreamAccumulator:
    """Folds stream events into an `AssistantMessage`; the one reducer of events and frames.

    Blocks are kept by `content_index` in the order they started. Tool-call argument text is
    parsed when the call ends (or when the message is built, for a call still open).
    """

    def __init__(self, *, api: str, provider: str, model: str) -> None:
        self.api, self.provider, self.model = api, provider, model
        self.response_id: str | None = None
        self.usage = _NO_USAGE
        self.timestamp = now_ms()
        self._blocks: dict[int, _OpenBlock] = {}

    def apply(self, event: StreamFrame) -> None:
        """Fold one non-terminal event in. Raises `ValueError` on an event for a block that was
        never started or has another kind (a corrupt frame list)."""
        match event:
            case StartEvent():
                self.api, self.provider, self.model = event.api, event.provider, event.model
                self.response_id = event.response_id or self.response_id
                self.timestamp = event.timestamp if event.timestamp is not None else self.timestamp
            case TextStartEvent():
                self._blocks[event.content_index] = _OpenBlock("text")
            case ThinkingStartEvent():
                self._blocks[event.content_index] = _OpenBlock("thinking", redacted=event.redacted)
            case ToolCallStartEvent():
                self._blocks[event.content_index] = _OpenBlock("tool_call", call_id=event.id, name=event.name)
            case TextDeltaEvent() | ThinkingDeltaEvent() | ToolCallDeltaEvent():
                self._block(event.content_index, _KIND_OF_DELTA[event.type]).parts.append(event.delta)
            case ThinkingEndEvent():
                self._block(event.content_index, "thinking").signature = event.signature
            case TextEndEvent() | ToolCallEndEvent():
                self._block(event.content_index, "text" if event.type == "text_end" else "tool_call")
            case UsageEvent():
                self.usage = event.usage
                self.response_id = event.response_id or self.response_id

    def _block(self, index: int, kind: str) -> _OpenBlock:
        block = self._blocks.get(index)
        if block is None or block.kind != kind:
            raise ValueError(f"stream event for {kind} block {index}, which was not started as one")
        return block

    def content(self) -> list[AssistantContent]:
        """The content blocks so far, in start order."""
        return [block.build() for _, block in sorted(self._blocks.items())]

    def message(
        self, stop_reason: Literal["stop", "length", "tool_use", "error", "aborted", "deferred"],
        *, error_message: str | None = None, deferred_id: str | None = None,
    ) -> AssistantMessage:
        """The reply as it stands, ended with `stop_reason`."""
        return AssistantMessage(
            content=self.content(),
            api=self.api,
            provider=self.provider,
            model=self.model,
            usage=self.usage,
            stop_reason=stop_reason,
            error_message=error_message,
            response_id=self.response_id,
            deferred_id=deferred_id,
            timestamp=self.timestamp,
        )


_KIND_OF_DELTA = {"text_delta": "text", "thinking_delta": "thinking", "toolcall_delta": "tool_call"}


class _OpenBlock:
    __slots__ = ("call_id", "kind", "name", "parts", "redacted", "signature")

    def __init__(self, kind: str, *, redacted: bool = False, call_id: str = "", name: str = "") -> None:
        self.kind = kind
        self.parts: list[str] = []
        self.redacted = redacted
        self.signature: str | None = None
        self.call_id, self.name = call_id, name

    def build(self) -> AssistantContent:
        text = "".join(self.parts)
        if self.kind == "text":
            return TextContent(text=text)
        if self.kind == "thinking":
            return ThinkingContent(thinking=text, signature=self.signature, redacted=self.redacted)
        arguments, raw = parse_tool_arguments(text)
        return ToolCall(id=self.call_id, name=self.name, arguments=arguments, raw_arguments=raw)
