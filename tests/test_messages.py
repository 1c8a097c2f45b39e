"""The message model: strict JSON round-trip and text cleaning at the boundary."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from harness.messages import (
    MESSAGE_ADAPTER,
    AssistantMessage,
    CustomMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    clean_text,
    message_from_json,
)

ASSISTANT = AssistantMessage(
    content=[
        ThinkingContent(thinking="plan", signature="EqQBCkYIBxgCKkB+/=="),
        ThinkingContent(thinking="", signature="opaque", redacted=True),
        TextContent(text="Calling."),
        ToolCall(id="call_1", name="add", arguments={"a": 2, "b": [1, None, {"c": "d"}]}),
    ],
    api="anthropic-messages",
    provider="anthropic",
    model="claude-sonnet-4",
    usage=Usage(input=10, output=20, cache_read=3, cache_write=4, total_tokens=37),
    stop_reason="tool_use",
    response_id="msg_1",
    timestamp=1_700_000_000_000,
)


@pytest.mark.parametrize(
    "message",
    [
        ASSISTANT,
        UserMessage(content=[TextContent(text="see"), ImageContent(data="iVBORw0KGgo=", mime_type="image/png")]),
        UserMessage(content="plain"),
        ToolResultMessage(tool_call_id="call_1", tool_name="add", content=[TextContent(text="5")], details={"n": 5}),
        ToolResultMessage(tool_call_id="call_2", tool_name="gone", content=[TextContent(text="no")], is_error=True),
        CustomMessage(custom_type="chat_event", content="renamed", display=False, details={"kind": "renamed"}),
    ],
)
def test_every_message_round_trips_through_json_exactly(message: object) -> None:
    text = MESSAGE_ADAPTER.dump_json(message)  # type: ignore[arg-type]
    assert MESSAGE_ADAPTER.validate_json(text) == message
    assert MESSAGE_ADAPTER.dump_json(MESSAGE_ADAPTER.validate_json(text)) == text


def test_thinking_signature_is_kept_byte_exact() -> None:
    signature = "Eu8BCkgIBRABGAIiQP+/  \n=="
    message = ASSISTANT.model_copy(update={"content": [ThinkingContent(thinking="t", signature=signature)]})
    decoded = MESSAGE_ADAPTER.validate_json(MESSAGE_ADAPTER.dump_json(message))
    assert isinstance(decoded, AssistantMessage)
    block = decoded.content[0]
    assert isinstance(block, ThinkingContent)
    assert block.signature == signature


def test_lone_surrogates_become_replacement_characters_everywhere() -> None:
    raw = json.dumps({
        "role": "assistant", "api": "a", "provider": "p", "model": "m", "stop_reason": "stop",
        "content": [{"type": "text", "text": "x\ud800y"},
                    {"type": "tool_call", "id": "1", "name": "n", "arguments": {"k\udc00": ["\ud83d"]}}],
    })
    message = message_from_json(raw)
    assert isinstance(message, AssistantMessage)
    assert message.content[0] == TextContent(text="x\ufffdy")
    assert message.content[1] == ToolCall(id="1", name="n", arguments={"k\ufffd": ["\ufffd"]})
    MESSAGE_ADAPTER.dump_json(message)  # encodable as UTF-8 now


@pytest.mark.parametrize("raw", ['{"role": "user", "content": "x\\ud800"}', '{"role": "user", "content": "x\ud800"}',
                                 b'{"role": "user", "content": "x\xed\xa0\x80"}'])
def test_json_text_cannot_bring_a_lone_surrogate_into_a_model(raw: str | bytes) -> None:
    # Why CleanStr cleans only text from Python: the models' own JSON parser refuses a lone
    # surrogate, escaped, as a character or as its UTF-8 bytes, so no decoded text holds one.
    with pytest.raises(ValidationError):
        MESSAGE_ADAPTER.validate_json(raw)


def test_nul_is_data_and_is_kept() -> None:
    message = UserMessage(content="a\x00b")
    decoded = MESSAGE_ADAPTER.validate_json(MESSAGE_ADAPTER.dump_json(message))
    assert isinstance(decoded, UserMessage)
    assert decoded.content == "a\x00b"


def test_a_valid_surrogate_pair_becomes_its_character() -> None:
    assert clean_text("\ud83d\ude00") == "😀"


def test_unknown_fields_and_stop_reasons_are_rejected() -> None:
    with pytest.raises(ValidationError):
        MESSAGE_ADAPTER.validate_python({"role": "user", "content": "x", "extra": 1})
    with pytest.raises(ValidationError):
        AssistantMessage.model_validate({**ASSISTANT.model_dump(), "stop_reason": "pending"})


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF)))
def test_cleaned_text_always_encodes_and_keeps_everything_else(text: str) -> None:
    cleaned = clean_text(text)
    cleaned.encode("utf-8")
    if all(not 0xD800 <= ord(c) <= 0xDFFF for c in text):
        assert cleaned == text
