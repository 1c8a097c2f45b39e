"""Run requests and their state-independent normalization into messages (HA-17).

Normalization happens before the lane job: it needs no lane state, so a bad request is refused
without touching the session.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from harness.context import Context, check_context
from harness.messages import (
    MESSAGE_ADAPTER,
    CustomMessage,
    ImageContent,
    Message,
    OutputSchema,
    TextContent,
    UserContent,
    UserMessage,
)
from harness.runtime.errors import InvalidMessage, PromptTooLarge, UnknownSkill, UnknownTemplate

MAX_INPUT_BYTES = 4 * 1024 * 1024
"""The most one input from outside the model may take as the journal stores it (UTF-8 JSON): a
prompt's messages together, one queued or appended message, one tool result. 4 MiB is the text
that fills the largest window the built-in registry knows (gpt-4.1's 1,047,576 tokens at four
bytes a token) and leaves room for a 3 MB photo; whatever the model, more is refused
(`PromptTooLarge`) before anything is written, since every copy the journal, the request and the
provider adapter make of it is held at once (issue 11: a 10 MB prompt cost 150 MB)."""


@dataclass(frozen=True)
class Skill:
    """Instructions the person can invoke by name; `content` is given to the model verbatim."""

    name: str
    description: str
    content: str


@dataclass(frozen=True)
class PromptTemplate:
    """A reusable prompt: `$1`..`$9` are replaced by positional args, `$@` and `$ARGUMENTS` by all
    of them joined with spaces."""

    name: str
    description: str
    content: str


@dataclass(frozen=True)
class PromptRequest:
    """Start a run from `text` and `images`, or from `messages` (one message or a list).

    `operation_id` and `entry_ids` (one per resulting message) may be supplied so a caller can
    retry an acceptance idempotently; otherwise they are minted. `output` makes the run's final
    answer JSON of that shape, an answer that does not fit sent back to the model up to
    `output_retries` times (issue 32, `harness.runtime.output`)."""

    text: str = ""
    images: Sequence[ImageContent] = ()
    messages: Message | Sequence[Message] | None = None
    operation_id: str | None = None
    entry_ids: Sequence[str] | None = None
    output: OutputSchema | None = None
    output_retries: int = 2


PROMPT_SHAPES = "prompt takes (text, images, context) or (messages, context), by position or by name"

_TEXT_SHAPE = ("text", "images", "context")
_MESSAGES_SHAPE = ("messages", "context")


def prompt_call(args: tuple[object, ...], kwargs: dict[str, object]) -> tuple[PromptRequest, Context]:
    """The request and Context of a `Lane.prompt` call, bound as Python binds arguments to the
    shape (text, images, context), images optional by name, or (messages, context) (HA-30).
    Raises `InvalidMessage` for any other shape; nothing is written then."""
    first = args[0] if args else kwargs.get("text", kwargs.get("messages"))
    names = _TEXT_SHAPE if "text" in kwargs or isinstance(first, str) else _MESSAGES_SHAPE
    if len(args) > len(names) or set(kwargs) - set(names) or set(kwargs) & set(names[:len(args)]):
        raise InvalidMessage(PROMPT_SHAPES)
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    if "context" not in bound:
        raise InvalidMessage(PROMPT_SHAPES)
    context = bound["context"]
    check_context(context)
    assert isinstance(context, Context)
    if names == _MESSAGES_SHAPE:
        messages = bound.get("messages")
        if not isinstance(messages, BaseModel | list | tuple):
            raise InvalidMessage(PROMPT_SHAPES)
        # Which kinds of message they are is checked at acceptance, as for any request.
        return PromptRequest(messages=cast("Message | Sequence[Message]", messages)), context
    text, images = bound.get("text"), bound.get("images")
    if not isinstance(text, str) or not isinstance(images, list | tuple | None):
        raise InvalidMessage(PROMPT_SHAPES)
    return PromptRequest(text=text, images=tuple(images or ())), context


@dataclass(frozen=True)
class SkillRequest:
    """Run skill `name`, with optional extra instructions after it."""

    name: str
    additional_instructions: str | None = None
    operation_id: str | None = None


@dataclass(frozen=True)
class TemplateRequest:
    """Run prompt template `name` with positional `args`."""

    name: str
    args: Sequence[str] = field(default_factory=tuple)
    operation_id: str | None = None


RunRequest = PromptRequest | SkillRequest | TemplateRequest


@dataclass(frozen=True)
class NormalizedRequest:
    messages: tuple[Message, ...]
    operation_id: str | None
    entry_ids: tuple[str, ...] | None


_PLACEHOLDER = re.compile(r"\$(ARGUMENTS|@|[1-9])")


def expand_template(content: str, args: Sequence[str]) -> str:
    """Replace `$1`..`$9`, `$@` and `$ARGUMENTS` in one pass (a replaced value is never re-read)."""

    def replace(match: re.Match[str]) -> str:
        key = match.group(1)
        if key in ("@", "ARGUMENTS"):
            return " ".join(args)
        index = int(key) - 1
        return args[index] if index < len(args) else ""

    return _PLACEHOLDER.sub(replace, content)


def format_skill(skill: Skill, additional_instructions: str | None) -> str:
    text = f'<skill name="{skill.name}">\n{skill.content}\n</skill>'
    if additional_instructions:
        text += f"\n\n{additional_instructions}"
    return text


def normalize_request(
    request: RunRequest, skills: Mapping[str, Skill], templates: Mapping[str, PromptTemplate]
) -> NormalizedRequest:
    """Turn a request into the messages it places (HA-17). Raises `InvalidMessage` for an assistant
    or tool result in a prompt, mismatched `entry_ids`, or both text and messages; `UnknownSkill`
    and `UnknownTemplate` for names not configured; `PromptTooLarge` for messages that take more
    than `MAX_INPUT_BYTES` together. An empty prompt gives no messages: acceptance
    allows that only when queued next-run input supplies some (HA-18)."""
    for supplied in [request.operation_id, *(getattr(request, "entry_ids", None) or [])]:
        if supplied is not None:
            check_supplied_id(supplied)
    entry_ids: tuple[str, ...] | None = None
    match request:
        case SkillRequest():
            skill = skills.get(request.name)
            if skill is None:
                raise UnknownSkill(f"no skill named {request.name!r}", name=request.name)
            messages: tuple[Message, ...] = (UserMessage(content=format_skill(skill, request.additional_instructions)),)
        case TemplateRequest():
            template = templates.get(request.name)
            if template is None:
                raise UnknownTemplate(f"no prompt template named {request.name!r}", name=request.name)
            messages = (UserMessage(content=expand_template(template.content, request.args)),)
        case _:
            messages = _prompt_messages(request)
            entry_ids = tuple(request.entry_ids) if request.entry_ids is not None else None
            if entry_ids is not None and (len(entry_ids) != len(messages) or len(set(entry_ids)) != len(entry_ids)):
                raise InvalidMessage(f"entry_ids must name each of the {len(messages)} messages once",
                                     entry_ids=list(entry_ids))
    check_input_size(messages, "prompt")
    return NormalizedRequest(messages, request.operation_id, entry_ids)


def _prompt_messages(request: PromptRequest) -> tuple[Message, ...]:
    if request.messages is not None:
        if isinstance(request.messages, str | bytes):
            raise InvalidMessage("messages must be a message or a list of messages; put text in `text`")
        if request.text or request.images:
            raise InvalidMessage("a prompt is either text and images or messages, not both")
        supplied = (request.messages,) if not isinstance(request.messages, Sequence) else tuple(request.messages)
        for message in supplied:
            check_input_message(message, "prompt")
        return supplied
    if not isinstance(request.text, str):
        raise InvalidMessage(f"the prompt text must be a string, not {type(request.text).__name__}",
                             given=type(request.text).__name__)
    if not request.text and not request.images:
        return ()
    if not request.images:
        return (UserMessage(content=request.text),)
    content: list[UserContent] = [TextContent(text=request.text)] if request.text else []
    content.extend(request.images)
    try:
        message = UserMessage(content=content)
    except ValidationError as error:
        raise InvalidMessage(f"the prompt's images are not valid: {describe_invalid(error)}") from None
    check_input_message(message, "prompt")
    return (message,)


MAX_ID_LENGTH = 200


def check_supplied_id(identifier: object) -> None:
    """A caller-supplied operation or entry id: a non-empty string of at most 200 characters
    without NUL or lone surrogates (every backend stores it the same way)."""
    if (not isinstance(identifier, str) or not identifier or len(identifier) > MAX_ID_LENGTH
            or "\x00" in identifier or any("\ud800" <= c <= "\udfff" for c in identifier)):
        raise InvalidMessage(f"a supplied id must be 1 to {MAX_ID_LENGTH} characters without NUL or surrogates",
                             id=repr(identifier)[:80])


def check_input_message(message: object, what: str = "message") -> None:
    """Input a person or program queues must be a valid user or custom message (HA-17): an
    assistant reply or a tool result cannot start or steer a run.

    The message is read back through its JSON form, as the journal will read it: one changed
    after validation (a list of it edited in place, an attribute written directly) may hold
    anything, and the journal writes records without reading them back. Raises
    `InvalidMessage`, or `PromptTooLarge` naming the message `what` it is when it takes more
    than `MAX_INPUT_BYTES`."""
    if not isinstance(message, UserMessage | CustomMessage):
        role = getattr(message, "role", None)
        if isinstance(message, BaseModel) and isinstance(role, str):
            raise InvalidMessage(f"a {role} message cannot be queued as input; send user or custom messages",
                                 role=role)
        raise InvalidMessage(f"a message must be a UserMessage or CustomMessage, not {type(message).__name__}",
                             given=type(message).__name__)
    _refuse_if_over(_text_length(message), what)  # before encoding: a huge one is refused uncopied
    try:
        encoded = MESSAGE_ADAPTER.dump_json(message, warnings="error")
        MESSAGE_ADAPTER.validate_json(encoded)
    except (ValidationError, PydanticSerializationError, RecursionError) as error:
        raise InvalidMessage(f"the {message.role} message is not valid: {describe_invalid(error)}") from None
    _refuse_if_over(len(encoded), what)


def check_input_size(messages: Sequence[Message], what: str) -> None:
    """Refuse `messages` (valid ones) that take more than `MAX_INPUT_BYTES` together as the journal
    stores them, with `PromptTooLarge` naming `what` they are (details: `bytes`, at least their
    size as `input_bytes` finds it, and `limit_bytes`)."""
    _refuse_if_over(input_bytes(messages), what)


def input_bytes(messages: Sequence[Message]) -> int:
    """The bytes `messages` take together as the journal stores them (UTF-8 JSON); when their text
    alone is longer than `MAX_INPUT_BYTES`, that length instead, found without encoding them."""
    length = sum(_text_length(message) for message in messages)
    if length > MAX_INPUT_BYTES:
        return length
    try:
        return sum(len(MESSAGE_ADAPTER.dump_json(message, warnings=False)) for message in messages)
    except (PydanticSerializationError, RecursionError):
        return length  # not storable at all: the journal refuses it when it is written (InvalidInput)


def _text_length(message: object) -> int:
    """The characters of a message's text and image data: never more than its JSON's bytes, and
    read without copying anything. Tolerates a message built without validation."""
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return len(content)
    blocks = content if isinstance(content, list) else []
    return sum(len(value) for block in blocks
               if isinstance(value := getattr(block, "text", getattr(block, "data", None)), str))


def _refuse_if_over(size: int, what: str) -> None:
    if size > MAX_INPUT_BYTES:
        raise PromptTooLarge(
            f"this {what} takes at least {size:,} bytes and the most one input may take is {MAX_INPUT_BYTES:,} "
            f"({MAX_INPUT_BYTES // 2**20} MiB); shorten it, send it in parts, or save it to a file and "
            "refer to that", bytes=size, limit_bytes=MAX_INPUT_BYTES)


def describe_invalid(error: ValidationError | PydanticSerializationError | RecursionError) -> str:
    """One short line saying what is wrong with a value that failed validation or encoding."""
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "value"
        return f"{where}: {first['msg']}"[:200]
    if isinstance(error, RecursionError):
        return "it is nested too deeply"
    found = re.search(r"field_name='([^']*)', input_value=(.{0,40}?), input_type=(\w+)", str(error))
    if found:
        return f"{found[1]} holds a {found[3]} ({found[2]}), which its type does not allow"
    return "it holds a value its type does not allow (was it built without validation?)"
