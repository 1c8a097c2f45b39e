"""Requests built from hostile histories: through every adapter's `build_request_params`, checked
by each API's validator (tests/request_validators.py), plus `prepare_history` on its own and the
real transcripts of ../shared/fixtures/transcripts read back from the journal.

White-box: it calls each adapter's pure `build_request_params` and `transform.prepare_history`
directly, which `harness.providers` does not offer."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import SHARED_FIXTURES, needs_shared_fixtures
from harness.context import Context
from harness.imports import import_claude_code_session, import_pi_session
from harness.messages import (
    AssistantMessage,
    CustomMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ThinkingLevel,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from harness.providers import (
    Model,
    ProviderRequest,
    StreamOptions,
    ToolSpec,
    anthropic_messages,
    openai_chat,
    openai_responses,
)
from harness.providers.transform import INVALID_ARGUMENTS_TEXT, MISSING_RESULT_TEXT, prepare_history
from harness.session import BranchSummaryPayload, CompactionPayload, CustomMessagePayload, Entry, MessagePayload, Store
from journal_helpers import lane_branch
from request_validators import problems

BUILDERS: dict[str, Callable[[Model, ProviderRequest, StreamOptions], dict[str, Any]]] = {
    "anthropic-messages": anthropic_messages.build_request_params,
    "openai-chat": openai_chat.build_request_params,
    "openai-responses": openai_responses.build_request_params,
}
APIS = list(BUILDERS)

# The model each request is built for, per api: reads images or not, takes thinking.
VISION: dict[str, Model] = {
    "anthropic-messages": Model(
        id="claude-sonnet-4-5", provider="anthropic", api="anthropic-messages", reasoning=True,
        input=("text", "image"), max_tokens=64_000,
    ),
    "openai-chat": Model(id="gpt-4o", provider="openai", api="openai-chat", input=("text", "image")),
    "openai-responses": Model(
        id="gpt-5", provider="openai", api="openai-responses", reasoning=True, input=("text", "image")
    ),
}
TEXT_ONLY: dict[str, Model] = {api: model.model_copy(update={"input": ("text",)}) for api, model in VISION.items()}

TOOLS = (
    ToolSpec(name="read", description="Read a file.", parameters={"type": "object", "properties": {"path": {}}}),
    ToolSpec(name="grep", description="Search files.", parameters={"type": "object", "properties": {"q": {}}}),
)
PNG = ImageContent(
    data="iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==",
    mime_type="image/png",
)
# A real Anthropic signature (from ../shared/fixtures/provider-streams/anthropic-thinking-tool.sse), as bytes go.
ANTHROPIC_SIGNATURE = (
    "EtYDCkYICxgCKkAVHEWRYo6RgSMs4ZZDX4gW16kdfp2EIXftcLesVephGa/p1m+1Y8mRQPvvKOQICrOkGKYoJBKSNLJ4ukI/mo6LEgx7FMTw"
    "IpYzM2WTWT8aDKY6c2i52xIX2NYX3SIwY5gI8frldE4pwUhseod0S0xZV2hTAQhqMCOu4+effAu250K2RPrqrO98+VD/hjF9Kr0C7EzGQ7dZ"
)


def signed_thinking(model: Model, text: str) -> ThinkingContent:
    """Thinking as `model`'s own adapter stores it: the signature Anthropic sent, or the Responses
    reasoning item with its encrypted content; Chat Completions has no signature."""
    if model.api == "anthropic-messages":
        return ThinkingContent(thinking=text, signature=ANTHROPIC_SIGNATURE)
    if model.api == "openai-responses":
        item = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": text}],
                "encrypted_content": "gAAAAB-encrypted+/=="}
        return ThinkingContent(thinking=text, signature=json.dumps(item))
    return ThinkingContent(thinking=text, signature="reasoning_content")


def user(text: str) -> UserMessage:
    return UserMessage(content=text, timestamp=1)


def reply(
    model: Model, *content: TextContent | ThinkingContent | ToolCall, stop: StopReason = "stop"
) -> AssistantMessage:
    if stop == "stop" and any(isinstance(block, ToolCall) for block in content):
        stop = "tool_use"
    error = "terminated" if stop in ("error", "aborted") else None
    return AssistantMessage(
        content=list(content), api=model.api, provider=model.provider, model=model.id, stop_reason=stop,
        error_message=error, timestamp=2,
    )


def call(call_id: str, name: str = "read", **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def result(call_id: str, text: str, name: str = "read") -> ToolResultMessage:
    return ToolResultMessage(tool_call_id=call_id, tool_name=name, content=[TextContent(text=text)], timestamp=3)


FOREIGN = Model(id="some-model", provider="elsewhere", api="openai-chat")


@dataclass
class Wire:
    """What a built request says, read back the same way for every api."""

    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (id, name, arguments)
    results: list[tuple[str, str]] = field(default_factory=list)  # (call id, text)
    texts: list[str] = field(default_factory=list)  # every text the model reads, in order
    thinking: list[str] = field(default_factory=list)  # what goes back as thinking: signature, data, encrypted
    images: int = 0


def read_wire(api: str, params: dict[str, Any]) -> Wire:
    wire = Wire()
    if api == "anthropic-messages":
        for message in params["messages"]:
            for block in message["content"]:
                match block["type"]:
                    case "text":
                        wire.texts.append(block["text"])
                    case "image":
                        wire.images += 1
                    case "thinking":
                        wire.thinking.append(block["signature"])
                    case "redacted_thinking":
                        wire.thinking.append(block["data"])
                    case "tool_use":
                        wire.calls.append((block["id"], block["name"], block["input"]))
                    case "tool_result":
                        parts = block.get("content", [])
                        wire.images += sum(part["type"] == "image" for part in parts)
                        text = "\n".join(part["text"] for part in parts if part["type"] == "text")
                        wire.results.append((block["tool_use_id"], text))
                        wire.texts.append(text)
    elif api == "openai-chat":
        for message in params["messages"]:
            content = message.get("content")
            if message["role"] == "tool":
                wire.results.append((message["tool_call_id"], content))
                wire.texts.append(content)
                continue
            for part in [{"type": "text", "text": content}] if isinstance(content, str) else content or []:
                if part["type"] == "text":
                    wire.texts.append(part["text"])
                else:
                    wire.images += 1
            for tool_call in message.get("tool_calls", []):
                function = tool_call["function"]
                wire.calls.append((tool_call["id"], function["name"], json.loads(function["arguments"])))
    else:
        for item in params["input"]:
            match item.get("type", "message"):
                case "message":
                    content = item["content"]
                    for part in [{"type": "input_text", "text": content}] if isinstance(content, str) else content:
                        if part["type"] == "input_image":
                            wire.images += 1
                        else:
                            wire.texts.append(part["text"])
                case "function_call":
                    wire.calls.append((item["call_id"], item["name"], json.loads(item["arguments"])))
                case "function_call_output":
                    output = item["output"]
                    parts = [{"type": "input_text", "text": output}] if isinstance(output, str) else output
                    wire.images += sum(part["type"] == "input_image" for part in parts)
                    text = "\n".join(part["text"] for part in parts if part["type"] == "input_text")
                    wire.results.append((item["call_id"], text))
                    wire.texts.append(text)
                case "reasoning":
                    wire.thinking.append(item["encrypted_content"])
    return wire


def build(model: Model, messages: Sequence[Message], *, thinking_level: ThinkingLevel = "off") -> dict[str, Any]:
    request = ProviderRequest(system_prompt="Be brief.", messages=tuple(messages), tools=TOOLS)
    return BUILDERS[model.api](model, request, StreamOptions(thinking_level=thinking_level))


def valid_wire(model: Model, messages: Sequence[Message], *, thinking_level: ThinkingLevel = "off") -> Wire:
    """The request built for `model`, after asserting it keeps every rule of its api."""
    params = build(model, messages, thinking_level=thinking_level)
    assert problems(model.api, params, model) == []
    return read_wire(model.api, params)


@pytest.mark.parametrize("api", APIS)
def test_orphaned_call_is_answered_by_a_synthetic_error_result(api: str) -> None:
    model = VISION[api]
    history: list[Message] = [
        user("look"), reply(model, call("call_1", path="a"), call("call_2", path="b")), result("call_1", "A")
    ]

    wire = valid_wire(model, [*history, user("go on")])

    assert [text for _, text in wire.results] == ["A", MISSING_RESULT_TEXT]


@pytest.mark.parametrize("api", APIS)
def test_results_arriving_late_or_out_of_order_are_moved_next_to_their_calls(api: str) -> None:
    model = VISION[api]
    history: list[Message] = [
        user("look"),
        reply(model, call("call_1", path="a"), call("call_2", path="b")),
        user("also this"),  # a steer that landed between the calls and their results
        result("call_2", "B"),
        result("call_1", "A"),
    ]

    wire = valid_wire(model, history)

    assert [text for _, text in wire.results] == ["A", "B"]
    assert wire.texts.index("also this") > wire.texts.index("B")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stop", ["aborted", "error"])
def test_unfinished_reply_is_left_out_with_its_calls_and_their_results(api: str, stop: StopReason) -> None:
    model = VISION[api]
    history: list[Message] = [
        user("look"),
        reply(model, TextContent(text="partial answer"), call("call_1"), call("call_2"), stop=stop),
        result("call_1", "A"),
        user("try again"),
    ]

    wire = valid_wire(model, history)

    assert (wire.calls, wire.results) == ([], [])
    assert "partial answer" not in wire.texts


@pytest.mark.parametrize("api", APIS)
def test_foreign_thinking_is_sent_as_plain_text(api: str) -> None:
    model = VISION[api]
    foreign = ThinkingContent(thinking="I should read a", signature=ANTHROPIC_SIGNATURE)
    history: list[Message] = [user("look"), reply(FOREIGN, foreign, call("call_1", path="a")), result("call_1", "A")]

    wire = valid_wire(model, history, thinking_level="high")

    assert wire.thinking == []
    assert "I should read a" in wire.texts


@pytest.mark.parametrize("api", APIS)
def test_same_model_thinking_goes_back_with_its_signature_byte_identical(api: str) -> None:
    model = VISION[api]
    thinking = signed_thinking(model, "I should read a")
    history: list[Message] = [user("look"), reply(model, thinking, call("call_1", path="a")), result("call_1", "A")]

    wire = valid_wire(model, history, thinking_level="high")

    if api == "anthropic-messages":
        assert wire.thinking == [ANTHROPIC_SIGNATURE]
    elif api == "openai-responses":
        assert wire.thinking == [json.loads(thinking.signature or "")["encrypted_content"]]
    else:  # Chat Completions has no field for thinking: it is not sent at all
        assert wire.thinking == []
    assert "I should read a" not in wire.texts


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("signature", ["", None])
def test_thinking_without_a_signature_is_never_sent_as_thinking(api: str, signature: str | None) -> None:
    model = VISION[api]
    unsigned = ThinkingContent(thinking="half a thought", signature=signature)
    history: list[Message] = [user("look"), reply(model, unsigned, TextContent(text="done")), user("next")]

    wire = valid_wire(model, history, thinking_level="high")

    assert wire.thinking == []
    assert "half a thought" not in wire.texts  # same model: dropped (see prepare_history)


@pytest.mark.parametrize("api", APIS)
def test_redacted_thinking_goes_back_only_to_the_model_that_wrote_it(api: str) -> None:
    claude = VISION["anthropic-messages"]
    redacted = ThinkingContent(thinking="", signature="EqkECkYIBxgCKkA8-opaque", redacted=True)
    history: list[Message] = [user("look"), reply(claude, redacted, TextContent(text="answer")), user("next")]

    wire = valid_wire(VISION[api], history, thinking_level="high")

    assert wire.thinking == (["EqkECkYIBxgCKkA8-opaque"] if api == "anthropic-messages" else [])
    assert "answer" in wire.texts


@pytest.mark.parametrize("api", APIS)
def test_images_become_text_placeholders_for_a_text_only_model(api: str) -> None:
    model = TEXT_ONLY[api]
    screenshot = ToolResultMessage(
        tool_call_id="call_1", tool_name="read", content=[TextContent(text="shot:"), PNG], timestamp=3
    )
    history: list[Message] = [
        UserMessage(content=[TextContent(text="what is this?"), PNG], timestamp=1),
        reply(model, call("call_1", path="a.png")),
        screenshot,
    ]

    wire = valid_wire(model, history)

    assert wire.images == 0
    placeholders = [text for text in wire.texts if "image omitted (image/png)" in text]
    assert len(placeholders) == 2


@pytest.mark.parametrize("api", APIS)
def test_images_are_sent_to_a_model_that_reads_them(api: str) -> None:
    model = VISION[api]
    history: list[Message] = [UserMessage(content=[TextContent(text="what is this?"), PNG], timestamp=1)]

    wire = valid_wire(model, history)

    assert wire.images == 1
    assert not any("image omitted" in text for text in wire.texts)


@pytest.mark.parametrize("api", APIS)
def test_malformed_arguments_go_back_as_an_empty_object_answered_as_invalid(api: str) -> None:
    model = VISION[api]
    broken = ToolCall(id="call_1", name="grep", arguments={}, raw_arguments='{"q": "unterminated')
    history: list[Message] = [user("search"), reply(model, broken), user("well?")]

    wire = valid_wire(model, history)

    assert [(name, arguments) for _, name, arguments in wire.calls] == [("grep", {})]
    [(_, text)] = wire.results
    assert text.startswith(INVALID_ARGUMENTS_TEXT)
    assert '{"q": "unterminated' in text


@pytest.mark.parametrize("api", APIS)
def test_a_results_details_and_its_blocks_are_never_sent(api: str) -> None:
    """CE-22: a tool result carrying `details.blocks` (cards with image refs) builds the same
    request, byte for byte, as the same result without details."""
    model = VISION[api]
    bare = result("call_1", "three cards")
    blocks = {"blocks": [{"key": "alpha", "title": "Alpha", "text": "a card", "link": "https://example.com",
                          "image": {"ref": "ab" * 32}}]}
    history: list[Message] = [user("cards?"), reply(model, call("call_1")), bare]
    with_blocks = [*history[:-1], bare.model_copy(update={"details": blocks})]

    sent = [json.dumps(build(model, messages), sort_keys=True) for messages in (history, with_blocks)]

    assert sent[0] == sent[1]


@pytest.mark.parametrize("api", APIS)
def test_custom_messages_are_read_as_user_text(api: str) -> None:
    model = VISION[api]
    note = CustomMessage(custom_type="chat_event", content="The user renamed the chat.", timestamp=4)
    history: list[Message] = [user("hi"), reply(model, TextContent(text="hello")), note]

    wire = valid_wire(model, history)

    assert wire.texts[-1] == "The user renamed the chat."


def hostile_history(model: Model) -> list[Message]:
    """Every case above in one history, for `model`."""
    broken = ToolCall(id="call_bad", name="grep", arguments={}, raw_arguments="{oops")
    return [
        UserMessage(content=[TextContent(text="look at this"), PNG], timestamp=1),
        reply(FOREIGN, ThinkingContent(thinking="foreign thought", signature="x"), call("call_1", path="a")),
        result("call_1", "A"),
        reply(model, signed_thinking(model, "mine"), TextContent(text="  "), call("call_2"), broken, call("call_3")),
        user("steer"),
        result("call_3", "C"),
        result("call_2", "B"),
        result("call_unknown", "from nowhere"),
        reply(model, TextContent(text="partial"), call("call_4"), stop="aborted"),
        result("call_4", "D"),
        CustomMessage(custom_type="notice", content="[interrupted]", timestamp=5),
        reply(model, ThinkingContent(thinking="unsigned", signature=""), TextContent(text="ok")),
        reply(model, ThinkingContent(thinking="only thinking", signature=ANTHROPIC_SIGNATURE), stop="length"),
        user("continue"),
        reply(model, call("call_5")),
    ]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("models", [TEXT_ONLY, VISION], ids=["text-only", "vision"])
@pytest.mark.parametrize("thinking_level", ["off", "high"])
def test_a_hostile_history_gives_a_valid_request(
    api: str, models: dict[str, Model], thinking_level: ThinkingLevel
) -> None:
    model = models[api]

    wire = valid_wire(model, hostile_history(model), thinking_level=thinking_level)

    assert [name for _, name, _ in wire.calls] == ["read", "read", "grep", "read", "read"]
    assert len(wire.results) == 5  # answered, answered, invalid arguments, answered, synthetic
    assert "from nowhere" not in wire.texts
    assert "partial" not in wire.texts


THINKING_SENT: dict[str, Callable[[dict[str, Any]], Any]] = {
    "anthropic-messages": lambda params: params.get("thinking"),
    "openai-chat": lambda params: params.get("reasoning_effort"),
    "openai-responses": lambda params: params.get("reasoning"),
}
"""Where each api's request says how hard to think (None: it does not)."""


@pytest.mark.parametrize("api", APIS)
def test_a_thinking_level_the_model_does_not_take_is_sent_as_the_nearest_it_does(api: str) -> None:
    """Issue 12: a lane keeps any level; each adapter sends the nearest level the model takes:
    `xhigh` as `high` to a model that stops at `high`, as no thinking to one without reasoning."""
    thinking = VISION[api].model_copy(update={"reasoning": True})
    plain = VISION[api].model_copy(update={"reasoning": False})
    sent = THINKING_SENT[api]

    assert sent(build(thinking, [user("think hard")], thinking_level="xhigh")) == sent(
        build(thinking, [user("think hard")], thinking_level="high")) is not None
    assert sent(build(plain, [user("think hard")], thinking_level="xhigh")) is None


@pytest.mark.parametrize(("api", "expected"), [
    ("anthropic-messages", {"type": "enabled", "budget_tokens": 62_976}),  # 64,000 less 1,024 kept for the answer
    ("openai-chat", "xhigh"),
    ("openai-responses", {"effort": "xhigh", "summary": "auto"}),
])
def test_a_model_declared_to_take_xhigh_is_asked_for_it(api: str, expected: Any) -> None:
    """`max_thinking_level = "xhigh"` (for the few models that take it) lets `xhigh` through."""
    model = VISION[api].model_copy(update={"reasoning": True, "max_thinking_level": "xhigh"})

    params = build(model, [user("think hard")], thinking_level="xhigh")

    assert problems(api, params, model) == []
    assert THINKING_SENT[api](params) == expected


# prepare_history on its own.


def test_prepare_history_never_changes_its_input() -> None:
    model = VISION["anthropic-messages"]
    history = hostile_history(model)
    before = [message.model_dump_json() for message in history]

    prepare_history(history, TEXT_ONLY["anthropic-messages"])

    assert [message.model_dump_json() for message in history] == before


def test_a_result_answers_the_latest_open_call_with_its_id() -> None:
    """Some servers number calls per reply, so ids repeat across turns."""
    model = VISION["openai-chat"]
    history: list[Message] = [
        user("a"),
        reply(model, call("functions.add:0", "add")),  # never answered
        user("b"),
        reply(model, call("functions.add:0", "add")),
        result("functions.add:0", "5", "add"),
    ]

    prepared = prepare_history(history, model)

    assert [(m.role, getattr(m, "content", None)) for m in prepared if isinstance(m, ToolResultMessage)] == [
        ("tool_result", [TextContent(text=MISSING_RESULT_TEXT)]),
        ("tool_result", [TextContent(text="5")]),
    ]
    assert [m.role for m in prepared] == ["user", "assistant", "tool_result", "user", "assistant", "tool_result"]


def test_a_result_before_its_call_and_a_second_result_are_dropped() -> None:
    model = VISION["openai-chat"]
    history: list[Message] = [
        result("call_1", "too early"),
        user("a"),
        reply(model, call("call_1")),
        result("call_1", "first"),
        result("call_1", "second"),
    ]

    prepared = prepare_history(history, model)

    results = [m for m in prepared if isinstance(m, ToolResultMessage)]
    assert [r.content for r in results] == [[TextContent(text="first")]]


def test_synthetic_results_are_errors_without_details() -> None:
    model = VISION["openai-chat"]

    prepared = prepare_history([user("a"), reply(model, call("call_1"))], model)

    synthetic = prepared[-1]
    assert isinstance(synthetic, ToolResultMessage)
    assert (synthetic.tool_call_id, synthetic.is_error, synthetic.details) == ("call_1", True, None)


def test_deferred_reply_is_left_out() -> None:
    model = VISION["openai-chat"]
    deferred = reply(model, TextContent(text="later"), stop="deferred").model_copy(update={"deferred_id": "d1"})

    prepared = prepare_history([user("a"), deferred, user("b")], model)

    assert prepared == [user("a"), user("b")]


def test_thinking_is_kept_only_for_the_same_provider_api_and_model() -> None:
    model = VISION["anthropic-messages"]
    thinking = ThinkingContent(thinking="t", signature=ANTHROPIC_SIGNATURE)
    same = reply(model, thinking, TextContent(text="a"))
    other_model = same.model_copy(update={"model": "claude-opus-4-5"})
    other_provider = same.model_copy(update={"provider": "bedrock"})
    other_api = same.model_copy(update={"api": "openai-chat"})

    prepared = prepare_history([same, other_model, other_provider, other_api], model)

    kept = [m.content[0] for m in prepared if isinstance(m, AssistantMessage)]
    assert kept == [thinking, TextContent(text="t"), TextContent(text="t"), TextContent(text="t")]


def test_blank_text_and_empty_messages_are_left_out() -> None:
    model = VISION["anthropic-messages"]
    history: list[Message] = [
        user("   "),
        UserMessage(content=[TextContent(text="\n\n")], timestamp=1),
        reply(model, TextContent(text="\n\n"), TextContent(text="answer")),
        reply(FOREIGN, ThinkingContent(thinking="", signature="s"), TextContent(text="")),
        reply(FOREIGN, ThinkingContent(thinking="opaque", signature="s", redacted=True)),
    ]

    prepared = prepare_history(history, model)

    assert prepared == [reply(model, TextContent(text="answer"))]


# The real transcripts, imported and read back as a branch.

TRANSCRIPTS = sorted((SHARED_FIXTURES / "transcripts").glob("*.jsonl"))


@pytest.fixture
def store_url() -> str:
    """These tests run on memory only (conftest's `store` otherwise runs on every backend)."""
    return "memory://"


def context_messages(entries: list[Entry]) -> list[Message]:
    """What a request carries from a branch (root first): the newest compaction's summary and
    retained tail, then every message after it; branch summaries as user-role text."""
    start = max((i for i, e in enumerate(entries) if isinstance(e.payload, CompactionPayload)), default=-1)
    messages: list[Message] = []
    if start >= 0:
        compaction = entries[start].payload
        assert isinstance(compaction, CompactionPayload)
        messages.append(CustomMessage(custom_type="compaction_summary", content=compaction.summary, timestamp=0))
        messages.extend(compaction.retained_tail)
    for entry in entries[start + 1:]:
        match entry.payload:
            case MessagePayload(message=message) | CustomMessagePayload(message=message):
                messages.append(message)
            case BranchSummaryPayload(summary=summary):
                messages.append(CustomMessage(custom_type="branch_summary", content=summary, timestamp=0))
    return messages


def native_model(messages: list[Message], api: str) -> Model:
    """The model of the transcript's latest reply on `api` (so its own thinking is replayed), else
    the vision model of that api."""
    for message in reversed(messages):
        if isinstance(message, AssistantMessage) and message.api == api:
            return VISION[api].model_copy(update={"provider": message.provider, "id": message.model})
    return VISION[api]


@needs_shared_fixtures
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda path: path.stem)
async def test_real_transcript_read_back_from_the_journal_gives_a_valid_request(
    store: Store, ctx: Context, path: Path, api: str
) -> None:
    importer = import_pi_session if path.name.startswith("pi-") else import_claude_code_session
    report = await importer(store, path, "user", ctx)
    messages = context_messages(await lane_branch(store, report.session_id, ctx))
    assert messages

    for model in (native_model(messages, api), TEXT_ONLY[api]):
        for thinking_level in ("off", "high"):
            params = build(model, messages, thinking_level=thinking_level)
            assert problems(api, params, model) == [], (model.id, thinking_level)


# The validators themselves: each rejects a request that breaks its rules.

CLAUDE = VISION["anthropic-messages"]
BAD_ANTHROPIC: dict[str, list[dict[str, Any]]] = {
    "unanswered call": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": "b"},
    ],
    "result not first": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "b"},
                                     {"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
    ],
    "result for no call": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}]},
    ],
    "roles do not alternate": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "empty signature": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""}]},
        {"role": "user", "content": "b"},
    ],
    "bad tool id": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "functions.add:0", "name": "add", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "functions.add:0", "content": "x"}]},
    ],
    "image for a text-only model": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                    "data": PNG.data}}]},
    ],
    "blank text": [{"role": "user", "content": [{"type": "text", "text": "  "}]}],
}


@pytest.mark.parametrize("case", BAD_ANTHROPIC)
def test_anthropic_validator_rejects(case: str) -> None:
    params = {"model": CLAUDE.id, "max_tokens": 100, "messages": BAD_ANTHROPIC[case]}

    assert problems("anthropic-messages", params, TEXT_ONLY["anthropic-messages"]) != []


BAD_CHAT: dict[str, list[dict[str, Any]]] = {
    "unanswered call": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "user", "content": "b"},
    ],
    "result for no call": [{"role": "user", "content": "a"}, {"role": "tool", "tool_call_id": "c9", "content": "x"}],
    "malformed arguments": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{oops"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
    ],
    "image for a text-only model": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
    ],
}


@pytest.mark.parametrize("case", BAD_CHAT)
def test_chat_validator_rejects(case: str) -> None:
    params = {"model": "gpt-4o", "messages": BAD_CHAT[case]}

    assert problems("openai-chat", params, TEXT_ONLY["openai-chat"]) != []


BAD_RESPONSES: dict[str, list[dict[str, Any]]] = {
    "unanswered call": [
        {"role": "user", "content": "a"},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"role": "user", "content": "b"},
    ],
    "result for no call": [
        {"role": "user", "content": "a"}, {"type": "function_call_output", "call_id": "c9", "output": "x"},
    ],
    "reasoning without encrypted content": [
        {"role": "user", "content": "a"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": "b"},
    ],
    "reasoning with nothing after it": [
        {"role": "user", "content": "a"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"},
        {"role": "user", "content": "b"},
    ],
}


@pytest.mark.parametrize("case", BAD_RESPONSES)
def test_responses_validator_rejects(case: str) -> None:
    params = {"model": "gpt-5", "input": BAD_RESPONSES[case], "store": False,
              "include": ["reasoning.encrypted_content"]}

    assert problems("openai-responses", params, TEXT_ONLY["openai-responses"]) != []


FORCED_TOOL = {
    "anthropic-messages": {"type": "tool", "name": "grep"},
    "openai-chat": {"type": "function", "function": {"name": "grep"}},
    "openai-responses": {"type": "function", "name": "grep"},
}


@pytest.mark.parametrize("api", APIS)
def test_a_forced_tool_choice_reaches_every_wire_format(api: str) -> None:
    """`StreamOptions.tool_choice` names the tool the model must call, in each api's own shape;
    Anthropic refuses forced tools with extended thinking, so forcing drops thinking there."""
    model = VISION[api]
    request = ProviderRequest(messages=(user("find it"),), tools=TOOLS)

    params = BUILDERS[api](model, request, StreamOptions(tool_choice="grep", thinking_level="high"))

    assert params["tool_choice"] == FORCED_TOOL[api]
    if api == "anthropic-messages":
        assert "thinking" not in params
    assert problems(api, params, model) == []
