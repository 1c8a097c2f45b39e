"""History conversion: the one place that makes a message history safe for any wire format.

Every adapter calls `prepare_history` before it serializes, so the rules below hold for every API:

- a reply that did not finish (stop reason `error`, `aborted` or `deferred`) is left out, and so are
  the tool results that answered its calls;
- every tool call is answered by its result directly after the assistant message that made it, in
  call order: results that came later or out of order are moved there, a call with no result gets a
  synthetic error result, a result with no call is dropped;
- custom messages are read by the model as user messages;
- thinking goes back as thinking only to the exact provider, api and model that wrote it, and only
  with a non-empty signature; elsewhere readable thinking becomes plain text;
- images go only to models that read them; for others each image becomes a short text placeholder;
- text that is empty or only whitespace is left out (APIs refuse empty text blocks), and so is a
  message left with nothing to say, which includes an assistant reply left with only thinking.

The input is never changed: messages are frozen, and changed ones are new copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harness.messages import (
    AssistantContent,
    AssistantMessage,
    CustomMessage,
    ImageContent,
    Message,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
)
from harness.providers.protocol import Model

MISSING_RESULT_TEXT = "no result was recorded for this call"
INVALID_ARGUMENTS_TEXT = "the arguments of this call were not valid JSON, so it was not run"
# Enough of the malformed text for the model to see what went wrong, without replaying a huge blob.
RAW_ARGUMENTS_SHOWN = 1_000

_UNFINISHED_STOP_REASONS = frozenset({"error", "aborted", "deferred"})


def prepare_history(messages: Sequence[Message], model: Model) -> list[Message]:
    """`messages` (oldest first) as any adapter may send them to `model`, by the rules in this
    module's docstring. Pure: returns new messages and never mutates the input; raises nothing.

    Choices the rules leave open:
    - a thinking block from the same provider, api and model without a signature is dropped, not
      turned into text: its server cannot verify it, and showing a model its own reasoning as
      something it said would teach it to think aloud;
    - a result answers the most recent earlier call with its id that is still unanswered, so a
      provider that reuses call ids across turns still pairs correctly.
    """
    kept = [
        message for message in messages
        if not (isinstance(message, AssistantMessage) and message.stop_reason in _UNFINISHED_STOP_REASONS)
    ]
    prepared: list[Message] = []
    for message in _pair_tool_results(kept):
        converted = _convert(message, model)
        if converted is not None:
            prepared.append(converted)
    return prepared


def rename_tool_call_ids(messages: Sequence[Message], wire_id: Callable[[str, set[str]], str]) -> list[Message]:
    """`messages` (as `prepare_history` returns them) with each tool call's id replaced by
    `wire_id(id, taken)` and its adjacent results following it, for wire formats that restrict ids.

    `taken` holds the ids given so far; `wire_id` must return one not in it, so a provider that
    reused an id across turns still gets unique ids. Results are matched to the assistant message
    directly before them, which `prepare_history` guarantees.
    """
    taken: set[str] = set()
    renamed: list[Message] = []
    pending: dict[str, list[str]] = {}  # the last assistant message's call ids -> new ids, in call order
    for message in messages:
        if isinstance(message, AssistantMessage):
            pending = {}
            content: list[AssistantContent] = []
            for block in message.content:
                if isinstance(block, ToolCall):
                    new_id = wire_id(block.id, taken)
                    taken.add(new_id)
                    pending.setdefault(block.id, []).append(new_id)
                    block = block.model_copy(update={"id": new_id})
                content.append(block)
            message = message.model_copy(update={"content": content})
        elif isinstance(message, ToolResultMessage) and pending.get(message.tool_call_id):
            message = message.model_copy(update={"tool_call_id": pending[message.tool_call_id].pop(0)})
        renamed.append(message)
    return renamed


def _missing_result(call: ToolCall, timestamp: int) -> ToolResultMessage:
    # Synthetic results carry no details (HA-25).
    if call.raw_arguments is not None:
        shown = call.raw_arguments[:RAW_ARGUMENTS_SHOWN]
        more = "" if len(call.raw_arguments) <= RAW_ARGUMENTS_SHOWN else " (cut)"
        text = f"{INVALID_ARGUMENTS_TEXT}; the arguments were{more}: {shown}"
    else:
        text = MISSING_RESULT_TEXT
    return ToolResultMessage(
        tool_call_id=call.id, tool_name=call.name, content=[TextContent(text=text)], is_error=True, timestamp=timestamp
    )


def _pair_tool_results(messages: list[Message]) -> list[Message]:
    # Pass 1: give each result to the latest earlier call with its id that is still open.
    open_calls: dict[str, list[tuple[int, int]]] = {}  # call id -> (message position, call order)
    answers: dict[tuple[int, int], ToolResultMessage] = {}
    for position, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            for order, call in enumerate(message.tool_calls):
                open_calls.setdefault(call.id, []).append((position, order))
        elif isinstance(message, ToolResultMessage):
            waiting = open_calls.get(message.tool_call_id)
            if waiting:
                latest = max(waiting, key=lambda slot: (slot[0], -slot[1]))
                waiting.remove(latest)
                answers[latest] = message
    # Pass 2: each assistant message is followed by one result per call, in call order.
    paired: list[Message] = []
    for position, message in enumerate(messages):
        if isinstance(message, ToolResultMessage):
            continue  # placed after its call above, or answering nothing
        paired.append(message)
        if isinstance(message, AssistantMessage):
            for order, call in enumerate(message.tool_calls):
                paired.append(answers.get((position, order)) or _missing_result(call, message.timestamp))
    return paired


def _convert(message: Message, model: Model) -> Message | None:
    match message:
        case AssistantMessage():
            same_model = (message.provider, message.api, message.model) == (model.provider, model.api, model.id)
            content = [out for block in message.content if (out := _assistant_block(block, same_model)) is not None]
            if all(isinstance(block, ThinkingContent) for block in content):
                # Reasoning alone says nothing, and Responses refuses a reasoning item with nothing after it.
                return None
            return message if content == message.content else message.model_copy(update={"content": content})
        case ToolResultMessage():
            blocks = _user_blocks(message.content, model)
            return message if blocks == message.content else message.model_copy(update={"content": blocks})
        case UserMessage():
            if isinstance(message.content, str):
                return message if message.content.strip() else None
            blocks = _user_blocks(message.content, model)
            if not blocks:
                return None
            return message if blocks == message.content else message.model_copy(update={"content": blocks})
        case CustomMessage():
            return _convert(UserMessage(content=message.content, timestamp=message.timestamp), model)


def _assistant_block(block: AssistantContent, same_model: bool) -> AssistantContent | None:
    if isinstance(block, TextContent):
        return block if block.text.strip() else None
    if isinstance(block, ToolCall):
        return block
    if same_model:
        return block if block.signature else None
    if block.redacted or not block.thinking.strip():
        return None
    return TextContent(text=block.thinking)


def _user_blocks(blocks: list[UserContent], model: Model) -> list[UserContent]:
    reads_images = "image" in model.input
    converted: list[UserContent] = []
    for block in blocks:
        if isinstance(block, ImageContent):
            converted.append(block if reads_images else _image_placeholder(block))
        elif block.text.strip():
            converted.append(block)
    return converted


def _image_placeholder(image: ImageContent) -> TextContent:
    return TextContent(text=f"[image omitted ({image.mime_type}): this model reads text only]")
