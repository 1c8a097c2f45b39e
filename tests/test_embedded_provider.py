"""The embedded provider: SmolLM2-135M run offline by llama-cpp-python through the provider protocol."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest

from harness.context import Context
from harness.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage
from harness.providers import (
    EMBEDDED_IDENTITY,
    DoneEvent,
    EmbeddedRuntimeMissing,
    EmbeddedWeightsMissing,
    ErrorEvent,
    Model,
    ModelRegistry,
    Provider,
    ProviderRequest,
    StreamEvent,
    StreamOptions,
    ToolSpec,
)
from harness.providers.embedded import EmbeddedProvider

# Deterministic: greedy decoding with a fixed seed gives the same reply every run.
GREEDY = StreamOptions(temperature=0.0, seed=42)
WEATHER = ToolSpec(
    name="get_weather",
    description="The current weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture(scope="module")
def embedded() -> tuple[Model, Provider]:
    return ModelRegistry().resolve(EMBEDDED_IDENTITY)


def ask(text: str, *tools: ToolSpec) -> ProviderRequest:
    return ProviderRequest(messages=(UserMessage(content=text),), tools=tools)


async def collect(stream: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [event async for event in stream]


async def test_answers_a_deterministic_prompt_offline_token_by_token(embedded: tuple[Model, Provider]) -> None:
    model, provider = embedded

    events = await collect(
        provider.stream(model, ask("What is the capital of France? Answer in one sentence."), GREEDY, Context())
    )

    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.message.api, done.message.provider, done.message.model) == ("embedded", "embedded", "smollm2-135m")
    assert done.message.stop_reason == "stop"
    assert "Paris" in "".join(block.text for block in done.message.content if isinstance(block, TextContent))
    assert sum(event.type == "text_delta" for event in events) > 1
    assert done.message.usage.input > 0
    assert done.message.usage.output > 0


async def test_a_forced_tool_call_has_schema_valid_arguments(embedded: tuple[Model, Provider]) -> None:
    model, provider = embedded
    options = GREEDY.model_copy(update={"tool_choice": "get_weather"})

    events = await collect(provider.stream(model, ask("What is the weather in Paris?", WEATHER), options, Context()))

    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.message.stop_reason == "tool_use"
    [call] = done.message.tool_calls
    assert call.name == "get_weather"
    assert call.raw_arguments is None
    assert set(call.arguments) == {"city"}
    assert isinstance(call.arguments["city"], str)


async def test_the_model_reads_tool_results(embedded: tuple[Model, Provider]) -> None:
    """A result reaches the model although llama's template renders no tool turns."""
    model, provider = embedded
    call = ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"})
    history = (
        UserMessage(content="What is the weather in Paris?"),
        AssistantMessage(content=[call], api="embedded", provider="embedded", model=model.id, stop_reason="tool_use"),
        ToolResultMessage(tool_call_id="call_1", tool_name="get_weather", content=[TextContent(text="Sunny, 21 C")]),
    )

    events = await collect(provider.stream(model, ProviderRequest(messages=history), GREEDY, Context()))

    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert "21" in "".join(block.text for block in done.message.content if isinstance(block, TextContent))


async def test_cancelling_the_context_stops_generation_with_the_partial_text(
    embedded: tuple[Model, Provider],
) -> None:
    """A cancel is honoured between two tokens: the reply ends with the one delta sent before it."""
    model, provider = embedded
    context = Context()
    seen: list[StreamEvent] = []

    async for event in provider.stream(model, ask("Write a long story about a dragon."), GREEDY, context):
        seen.append(event)
        if event.type == "text_delta":
            context.cancel("user pressed stop")

    last = seen[-1]
    assert isinstance(last, ErrorEvent)
    assert last.error.kind == "aborted"
    assert last.message.stop_reason == "aborted"
    first_delta = next(event.delta for event in seen if event.type == "text_delta")
    assert last.message.content == [TextContent(text=first_delta)]


async def test_a_reply_stopped_midway_carries_the_tokens_it_read_and_wrote(embedded: tuple[Model, Provider]) -> None:
    """Issue 33: the chat's token count stayed where it was after a long reply was interrupted,
    since the usage came only with the last chunk. Every chunk carries the usage so far."""
    model, provider = embedded
    context = Context()
    deltas = 0

    async for event in provider.stream(model, ask("Write a long story about a dragon."), GREEDY, context):
        deltas += event.type == "text_delta"
        if deltas == 3:
            context.cancel("user pressed stop")
        last = event

    assert isinstance(last, ErrorEvent)
    assert last.message.stop_reason == "aborted"
    usage = last.message.usage
    assert usage.input > 10  # the chat template around the prompt
    assert 3 <= usage.output <= 4  # a delta is one token (a multi-byte character may take two); one more may come
    assert usage.total_tokens == usage.input + usage.output


async def test_a_cancel_while_the_prompt_is_read_ends_the_reply_and_frees_the_model(
    embedded: tuple[Model, Provider],
) -> None:
    """The prompt (here with tools, so it is long) is read in batches a cancel can stop between."""
    model, provider = embedded
    context = Context()
    long_prompt = ask("Summarize: " + "the journal keeps every turn. " * 150, WEATHER)

    events: list[StreamEvent] = []

    async for event in provider.stream(model, long_prompt, GREEDY, context):
        events.append(event)
        context.cancel("user pressed stop")  # at the start event, before the prompt is read

    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert last.error.kind == "aborted"
    assert last.message.content == []
    short = GREEDY.model_copy(update={"max_tokens": 2})
    after = await collect(provider.stream(model, ask("Say hi."), short, Context()))
    assert isinstance(after[-1], DoneEvent)


async def test_with_tools_the_decision_and_the_call_stay_within_max_tokens(embedded: tuple[Model, Provider]) -> None:
    """Offered a tool, the model spends the same token budget on choosing and calling it as on text."""
    model, provider = embedded
    options = GREEDY.model_copy(update={"max_tokens": 3})

    events = await collect(provider.stream(model, ask("What is the weather in Paris?", WEATHER), options, Context()))

    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.message.stop_reason == "length"
    assert done.message.usage.output <= 3


async def test_a_long_essay_ends_at_the_window_the_prompt_leaves(embedded: tuple[Model, Provider]) -> None:
    """The reply gets what the context window leaves after the prompt, even when more is asked."""
    model, provider = embedded
    small = model.model_copy(update={"context_window": 128, "max_tokens": 1024})
    notes = "Ships sailed, storms came, ports grew. " * 8  # most of the window, so the reply is short

    events = await collect(provider.stream(small, ask(f"Write a very long essay about the sea. Notes: {notes}"),
                                           GREEDY, Context()))

    done = events[-1]
    assert isinstance(done, DoneEvent), done
    assert done.message.stop_reason == "length"
    assert done.message.usage.input + done.message.usage.output == 128


async def test_a_prompt_that_fills_the_window_is_a_context_overflow(embedded: tuple[Model, Provider]) -> None:
    model, provider = embedded
    small = model.model_copy(update={"context_window": 64})

    events = await collect(provider.stream(small, ask("many words " * 80), GREEDY, Context()))

    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert last.error.kind == "context_overflow"
    assert "exceed context window of 64" in last.error.message


TRICKY = "Tom's <b> & \"Jerry\""


def test_texts_reach_the_prompt_unescaped(embedded: tuple[Model, Provider]) -> None:
    """User text, tool results and the model's own earlier replies are sent exactly as written."""
    model, _ = embedded
    call = ToolCall(id="call_1", name="get_weather", arguments={"city": TRICKY})
    history = (
        UserMessage(content=f"first {TRICKY}"),
        AssistantMessage(content=[TextContent(text=f"reply {TRICKY}"), call], api="embedded", provider="embedded",
                         model=model.id, stop_reason="tool_use"),
        ToolResultMessage(tool_call_id="call_1", tool_name="get_weather",
                          content=[TextContent(text=f"result {TRICKY}")]),
        AssistantMessage(content=[TextContent(text=f"second reply {TRICKY}")], api="embedded", provider="embedded",
                         model=model.id, stop_reason="stop"),
        UserMessage(content=f"second {TRICKY}"),
    )

    prompt = EmbeddedProvider().render_prompt(model, ProviderRequest(messages=history, tools=(WEATHER,)), GREEDY)

    for text in ("first", "reply", "result", "second reply", "second"):
        assert f"{text} {TRICKY}" in prompt
    assert '"city": "Tom\'s <b> & \\"Jerry\\""' in prompt
    for entity in ("&#39;", "&amp;", "&lt;", "&#34;", "&quot;"):
        assert entity not in prompt


async def test_the_model_repeats_its_own_reply_with_quotes_and_ampersands_intact(
    embedded: tuple[Model, Provider],
) -> None:
    model, provider = embedded
    said = "It's 4 & that's <all>."
    history = (
        UserMessage(content="What's 2 & 2?"),
        AssistantMessage(content=[TextContent(text=said)], api="embedded", provider="embedded", model=model.id,
                         stop_reason="stop"),
        UserMessage(content="Say what you said again, exactly."),
    )

    events = await collect(provider.stream(model, ProviderRequest(messages=history), GREEDY, Context()))

    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.message.content == [TextContent(text=said)]


def test_missing_weights_are_named_before_the_stream_starts(embedded: tuple[Model, Provider]) -> None:
    model, provider = embedded
    elsewhere = model.model_copy(update={"path": "/nonexistent/model.gguf"})

    with pytest.raises(EmbeddedWeightsMissing) as raised:
        provider.stream(elsewhere, ask("hi"), GREEDY, Context())

    assert raised.value.code == "embedded_weights_missing"
    assert raised.value.details["path"] == "/nonexistent/model.gguf"


def test_a_missing_runtime_names_its_install_command(
    embedded: tuple[Model, Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, provider = embedded
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # what an environment without it looks like

    with pytest.raises(EmbeddedRuntimeMissing) as raised:
        provider.stream(model, ask("hi"), GREEDY, Context())

    assert raised.value.code == "embedded_runtime_missing"
    assert "pip install 'llama-cpp-python==0.3.36'" in raised.value.message
