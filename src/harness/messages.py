"""Messages and content blocks, usage, stop reasons, ModelIdentity and ThinkingLevel: the shared vocabulary.

Every type is a frozen pydantic model that round-trips through JSON exactly. Text entering the
system is cleaned at the boundary: a lone UTF-16 surrogate, which UTF-8 cannot carry, becomes
U+FFFD; a NUL character is data and is kept.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, NoReturn, Self, TypeAlias, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetPydanticSchema,
    JsonValue,
    TypeAdapter,
)
from pydantic_core import core_schema

from harness.errors import InvalidInput

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD; a valid surrogate pair becomes its character."""
    if text.isascii() or _SURROGATE.search(text) is None:  # isascii reads a flag the string keeps
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


MAX_JSON_DEPTH = 128


def clean_json(value: JsonValue, _depth: int = 0) -> JsonValue:
    """`value` with `clean_text` applied to every string in it, keys included.

    Raises `ValueError` for NaN or an infinity (JSON has neither; they would come back as null)
    and for nesting deeper than `MAX_JSON_DEPTH`, which JSON readers refuse to read back."""
    if _depth > MAX_JSON_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a JSON number")
    if isinstance(value, list):
        return [clean_json(item, _depth + 1) for item in value]
    if isinstance(value, dict):
        return {clean_text(key): clean_json(item, _depth + 1) for key, item in value.items()}
    return value


def parse_json_text(text: str | bytes) -> Any:
    """Parse strict JSON from outside; unlike pydantic's parser this accepts lone surrogate
    escapes, which the models then clean.

    Raises `ValueError` for anything that is not JSON, including `NaN` and the infinities (which
    `json.loads` would accept) and nesting too deep for the parser."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON value")


def now_ms() -> int:
    """Wall-clock time in Unix milliseconds, the unit of every timestamp here."""
    return time.time_ns() // 1_000_000


def _clean_from_python(source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
    # JSON text cannot carry a lone surrogate (the parser refuses one, escaped or raw), so only
    # text from Python needs cleaning: a read-back or a decode skips a Python call per string.
    text = handler(source)
    return core_schema.json_or_python_schema(
        json_schema=text, python_schema=core_schema.no_info_after_validator_function(clean_text, text))


CleanStr = Annotated[str, GetPydanticSchema(_clean_from_python)]
CleanJson = Annotated[JsonValue, AfterValidator(clean_json)]
CleanJsonObject = Annotated[dict[str, JsonValue], AfterValidator(clean_json)]


class Record(BaseModel):
    """A value the journal keeps: frozen, strict, extra fields refused, and only ever built by
    validation, so its JSON form always reads back (the journal skips reading back what it writes).

    `model_construct` validates as the constructor does, and so does `model_copy` with `update`
    (pydantic's own skip validation); an instance of a subclass is validated again where a field
    takes this class (`revalidate_instances`), so a subclass cannot bring in what this class
    refuses; a float must be finite (JSON has no NaN: it would be written as null and refused on
    reading). Raises pydantic's `ValidationError` for what does not fit.

    A record's lists and dicts are part of it: never change one in place. Nothing validates
    such a change, and the journal writes a record without reading it back."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False,
                              revalidate_instances="subclass-instances")

    @classmethod
    def model_construct(  # type: ignore[override]  # the pydantic plugin types each model's own fields
            cls, _fields_set: set[str] | None = None, **values: Any) -> Self:
        """Validates `values`, unlike pydantic's: a record is never built unchecked."""
        return cls.model_validate(values)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy (`deep`: of everything in it too) with `update`'s fields replaced, validated."""
        if not update:
            return super().model_copy(deep=deep)
        fields = super().model_copy(deep=True).__dict__ if deep else self.__dict__
        return type(self).model_validate({**fields, **update})


class ModelIdentity(Record):
    """A durable `{provider, model_id}` pair; nothing here resolves it (HA-6, HA-23)."""

    provider: CleanStr
    model_id: CleanStr

    @classmethod
    def parse(cls, spec: str) -> ModelIdentity:
        """`provider/id` as an identity; the id may itself contain `/` (e.g.
        `openrouter/moonshotai/kimi-k2`). Raises `InvalidInput` for anything else."""
        provider, separator, model_id = spec.partition("/")
        if not separator or not provider or not model_id:
            raise InvalidInput(f"a model is provider/id (e.g. openai/gpt-4o or embedded/smollm2-135m), not {spec!r}",
                               model=spec)
        return cls(provider=provider, model_id=model_id)

    @property
    def spec(self) -> str:
        """`provider/model_id`, the form `parse` reads and people are shown."""
        return f"{self.provider}/{self.model_id}"


class OutputSchema(Record):
    """The shape a run's final answer must take (issue 32): a JSON Schema object (`json_schema`,
    what pydantic's `model_json_schema` gives) under `name` (letters, digits, `_` and `-`, at most
    64: what every provider takes for a schema's or a tool's name), with an optional description.
    A request that carries one asks the model for JSON of that shape: natively where the wire
    format offers it, else through a final-answer tool of that name."""

    name: Annotated[CleanStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = "final_result"
    json_schema: CleanJsonObject
    description: CleanStr | None = None
    wrapped: bool = False
    """The answer is the `response` property of the JSON object the model gives: providers take
    only an object at a schema's root, so `of` wraps any other shape (a list, a number) in one."""

    @classmethod
    def of(cls, json_schema: dict[str, JsonValue], *, name: str = "final_result",
           description: str | None = None) -> OutputSchema:
        """The output schema of answers shaped by `json_schema`, wrapped as `{"response": ...}`
        when its root is not an object (its `$defs` kept at the root, where its references point).
        Raises pydantic's `ValidationError` for a name providers refuse."""
        if json_schema.get("type") == "object":
            return cls(name=name, json_schema=json_schema, description=description)
        inner = {key: value for key, value in json_schema.items() if key != "$defs"}
        wrapper: dict[str, JsonValue] = {"type": "object", "properties": {"response": inner},
                                         "required": ["response"], "additionalProperties": False}
        if "$defs" in json_schema:
            wrapper["$defs"] = json_schema["$defs"]
        return cls(name=name, json_schema=wrapper, description=description, wrapped=True)

    def answer(self, given: JsonValue) -> JsonValue:
        """The answer in the JSON the model gave (already validated against `json_schema`)."""
        return given["response"] if self.wrapped and isinstance(given, dict) else given


ThinkingLevel: TypeAlias = Literal["off", "minimal", "low", "medium", "high", "xhigh"]
"""How hard a model is asked to think, as a lane configures it and a request carries it. A model
takes a prefix of `THINKING_LEVELS`; its adapter sends the nearest level it takes
(`Model.nearest_thinking_level`)."""

THINKING_LEVELS: tuple[ThinkingLevel, ...] = get_args(ThinkingLevel)
"""Every thinking level, lowest first."""


class TextContent(Record):
    type: Literal["text"] = "text"
    text: CleanStr


class ThinkingContent(Record):
    """Model reasoning. `signature` is replayed byte-exact to the provider that made it;
    `redacted` marks opaque reasoning whose text is not readable."""

    type: Literal["thinking"] = "thinking"
    thinking: CleanStr
    signature: str | None = None
    redacted: bool = False


class ImageContent(Record):
    """An image as base64 `data` with its `mime_type`."""

    type: Literal["image"] = "image"
    data: str
    mime_type: CleanStr


class ToolCall(Record):
    """A model's request to run tool `name` with JSON `arguments`; `id` pairs it with its result.

    `raw_arguments` is set only when the model's argument text was not a JSON object: it keeps that
    text verbatim, `arguments` is then `{}`, and the call is answered with a tool error, never run
    and never sent back to a provider malformed.
    """

    type: Literal["tool_call"] = "tool_call"
    id: CleanStr
    name: CleanStr
    arguments: CleanJsonObject
    raw_arguments: CleanStr | None = None


UserContent: TypeAlias = Annotated[TextContent | ImageContent, Field(discriminator="type")]
AssistantContent: TypeAlias = Annotated[
    TextContent | ThinkingContent | ToolCall, Field(discriminator="type")
]

# `deferred`: the provider accepted the request and will answer later under `deferred_id` (HA-27).
StopReason: TypeAlias = Literal["stop", "length", "tool_use", "error", "aborted", "deferred"]


class Cost(Record):
    """Cost in US dollars, per token kind and in total."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    total: float = 0.0


class Usage(Record):
    """Token counts of one provider reply; `total_tokens` is what the provider reported or the sum."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total_tokens: int = 0
    cost: Cost = Cost()


class UserMessage(Record):
    role: Literal["user"] = "user"
    content: CleanStr | list[UserContent]
    timestamp: int = Field(default_factory=now_ms)


class AssistantMessage(Record):
    """One model reply. `api` is the wire format (e.g. `openai-chat`), `provider` and `model` name
    who answered; `error_message` is set when `stop_reason` is `error` or `aborted`."""

    role: Literal["assistant"] = "assistant"
    content: list[AssistantContent]
    api: CleanStr
    provider: CleanStr
    model: CleanStr
    usage: Usage = Usage()
    stop_reason: StopReason
    error_message: CleanStr | None = None
    response_id: CleanStr | None = None
    deferred_id: CleanStr | None = None
    timestamp: int = Field(default_factory=now_ms)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [block for block in self.content if isinstance(block, ToolCall)]


class ToolResultMessage(Record):
    """The answer to tool call `tool_call_id`. `details` is the tool's own structured data, never
    sent to a provider; synthetic results carry none (HA-25)."""

    role: Literal["tool_result"] = "tool_result"
    tool_call_id: CleanStr
    tool_name: CleanStr
    content: list[UserContent]
    details: CleanJson | None = None
    is_error: bool = False
    timestamp: int = Field(default_factory=now_ms)


class CustomMessage(Record):
    """An application message the model reads as user-role text (e.g. a chat event, CE-1);
    `display` says whether surfaces show it."""

    role: Literal["custom"] = "custom"
    custom_type: CleanStr
    content: CleanStr | list[UserContent]
    display: bool = True
    details: CleanJson | None = None
    timestamp: int = Field(default_factory=now_ms)


Message: TypeAlias = Annotated[
    UserMessage | AssistantMessage | ToolResultMessage | CustomMessage, Field(discriminator="role")
]

MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def message_from_json(text: str | bytes) -> Message:
    """Decode one message from JSON text, cleaning lone surrogates (see `parse_json_text`)."""
    return MESSAGE_ADAPTER.validate_python(parse_json_text(text), strict=False)


def text_of(content: str | Sequence[object], separator: str = "") -> str:
    """The text of a message's content: a string as it is, or its `TextContent` blocks' texts
    joined with `separator` (images, thinking and tool calls left out)."""
    if isinstance(content, str):
        return content
    return separator.join(block.text for block in content if isinstance(block, TextContent))
