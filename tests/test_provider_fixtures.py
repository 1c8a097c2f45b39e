"""Every recorded provider stream and error body in the shared fixtures, replayed by the replay
server over real HTTP through the real SDK and the adapter for its API, gives the right message:
text, thinking with its signature, redacted thinking, tool calls with parsed arguments, usage and
cost, stop reason; and for error bodies the error's classification and message.

The expectations are written by hand from the recorded files. Where a signature is long, the
expected value is read straight from the file, so the test still proves it arrives byte for byte.
One fixture, `openai-responses-error-event-context-length-exceeded`, is only the data payload of
an in-stream `error` event; `replay_response` serves it inside a SYNTHETIC one-event stream.
A clone without `../shared` skips this module; tests/test_provider_streams.py covers the same
adapter paths with the project's own streams.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import HAS_SHARED_FIXTURES, SHARED_FIXTURES
from harness.context import Context
from harness.messages import TextContent, ThinkingContent, ToolCall
from harness.providers import ProviderErrorInfo
from harness.providers.replay import ReplayServer
from replayed_streams import (
    Expected,
    Tokens,
    anthropic_signature,
    check_replayed_reply,
    responses_encrypted_content,
    sse_payloads,
)

if not HAS_SHARED_FIXTURES:
    pytest.skip(f"the recorded corpus {SHARED_FIXTURES} is not beside this checkout", allow_module_level=True)

STREAMS = SHARED_FIXTURES / "provider-streams"
INDEX: list[dict[str, Any]] = json.loads((STREAMS / "index.json").read_text())["entries"]


def fixture_id(entry: dict[str, Any]) -> str:
    """The file's stem; the file name where two files share a stem (an `.sse` and a `.json`)."""
    path = Path(entry["file"])
    shared = sum(Path(other["file"]).stem == path.stem for other in INDEX) > 1
    return path.name if shared else path.stem


def anthropic_redacted_data(stem: str) -> list[str]:
    return [
        p["content_block"]["data"] for p in sse_payloads(STREAMS / f"{stem}.sse")
        if p["type"] == "content_block_start" and p["content_block"]["type"] == "redacted_thinking"
    ]


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


QUOTA_TEXT = (
    "You exceeded your current quota, please check your plan and billing details. For more information on this "
    "error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."
)
GROQ_THINKING = (
    'We need to call the tool with invalid parameters first, then second call with valid args. The user wants us to '
    'test error handling. So first call should have wrong parameters (e.g., missing required "name" or extra param). '
    'The tool expects only "name". If we send extra property, that might cause error. Or missing "name". We\'ll do a '
    'call with missing name: {}. Then second call with name: "test". Let\'s do that.'
)
GROQ_ERROR = (
    "Tool call validation failed: tool call validation failed: parameters for tool get_something_by_name did not "
    "match schema: errors: [missing properties: 'name', additionalProperties 'invalid_param' not allowed]"
)
WEATHER_SUMMARY = (
    "**Getting weather info**\n\nI need to respond to the user's question about the weather in Florence, Italy. "
    "I'll use the weather tool, which requires the location string. According to the instructions, I can call "
    "functions.weather directly since I only need one tool for this task. There's no need for parallel execution "
    "here. I'll call the tool to retrieve the current weather information for Florence and see what it returns!"
)
WEATHER_THINKING = (
    'The user is asking for weather information for Florence, Italy. I have access to a weather function that '
    'takes a location parameter. The user has provided the location as "Florence, Italy" which is specific enough '
    'for the weather function. I have all the required parameters to make the function call.'
)


def expectations() -> dict[str, Expected]:
    return {
        "openai-chat-tools-parallel": Expected(
            content=[
                call("call_ehIWdjL1abZk1h8FWGLQ0Hie", "add", a=2, b=3),
                call("call_fBSgA47J5VeONggizTIvl7AH", "multiply", a=2, b=3),
            ],
            stop_reason="tool_use",
            tokens=Tokens(input=106, output=50, total=156),
            response_id="chatcmpl-DuLdMEdkw5VsZSxKY3i9G934hT7LM",
        ),
        "openrouter-chat-reasoning-tools-parallel": Expected(
            content=[
                # `reasoning` and `reasoning_details` carry the same text; it must appear once.
                ThinkingContent(
                    thinking=" The user wants me to add and multiply the numbers 2 and 3. According to my "
                    "instructions, I should use both `add` and `multiply` at the same time. Since these are "
                    "independent function calls, I can make them in the same function_calls block."
                ),
                call("functions.add:0", "add", a=2, b=3),
                call("functions.multiply:1", "multiply", a=2, b=3),
            ],
            stop_reason="tool_use",
            # 125 prompt tokens of which 64 cached; 97 completion tokens include 56 of reasoning.
            tokens=Tokens(input=61, output=97, cache_read=64, total=222),
            response_id="gen-1777319918-UVrg0z9Yj2HXXL5dYZY3",
        ),
        "groq-chat-midstream-error": Expected(
            content=[ThinkingContent(thinking=GROQ_THINKING)],
            stop_reason="error",
            response_id="chatcmpl-4f39f3af-3267-4ac1-a0cf-6aa7451877dc",
            error=ProviderErrorInfo(kind="invalid_request", message=GROQ_ERROR, status=400),
        ),
        "openrouter-chat-midstream-error": Expected(
            content=[ThinkingContent(thinking="We need to respond to a greeting. The user")],
            stop_reason="error",
            response_id="gen-1762179802-UN8pkJI4AGZvryk0kFnb",
            # The output limit, not the context window: not an overflow, and not worth retrying.
            error=ProviderErrorInfo(kind="invalid_request", message="Token limit reached", status=400),
        ),
        "openai-responses-reasoning-tools-parallel": Expected(
            # The reasoning item has neither summary nor encrypted content: nothing to show or replay.
            content=[
                call("call_inViAUr9eV0GDtyOywkCxp59", "add", a=2, b=3),
                call("call_Op66UUnzuOoKmgGeFJQJFTUY", "multiply", a=2, b=3),
            ],
            stop_reason="tool_use",
            tokens=Tokens(input=109, output=223, total=332),
            response_id="resp_0a7836d50cf181dd016a3c122cf3b881a1947fb8d49897cfca",
        ),
        "openai-responses-reasoning-summary-tool": Expected(
            content=[
                ThinkingContent(thinking=WEATHER_SUMMARY),
                call("call_zgUaIBRPTwxxOusyyKw5NVMH", "weather", location="Florence, Italy"),
            ],
            stop_reason="tool_use",
            tokens=Tokens(input=63, output=121, total=184),
            response_id="resp_017e85da2ae23b69016a3c12518cc0819da56cbbdd33f128f3",
            encrypted_content=responses_encrypted_content(STREAMS / "openai-responses-reasoning-summary-tool.sse"),
        ),
        "openai-responses-commentary-reasoning-tool": Expected(
            content=[
                ThinkingContent(thinking=""),
                TextContent(text="I’ll check the capital lookup tool for “PotatoLand.”"),
                call("call_LabG58Uhrq9kZvR52BYKjToD", "get_capital", country="PotatoLand"),
            ],
            stop_reason="tool_use",
            tokens=Tokens(input=63, output=69, total=132),
            response_id="resp_0fabc13af1ee0049006a691dfdab8881a1a75f2db7ff78cb83",
            encrypted_content=responses_encrypted_content(STREAMS / "openai-responses-commentary-reasoning-tool.sse"),
        ),
        "openai-responses-error-insufficient-quota.sse": Expected(
            content=[],
            stop_reason="error",
            response_id="resp_05500b38c2cd9bfc00691c7c9d222481a3b595421266dab424",
            # Out of credit: retrying cannot help, so it is not `retryable` although OpenAI sends 429 for it.
            error=ProviderErrorInfo(kind="other", message=QUOTA_TEXT),
        ),
        "openai-responses-error-event-context-length-exceeded": Expected(
            content=[],
            stop_reason="error",
            error=ProviderErrorInfo(
                kind="context_overflow",
                message="Your input exceeds the context window of this model. Please adjust your input and try again.",
            ),
        ),
        "openrouter-error-429-rate-limit": Expected(
            content=[],
            stop_reason="error",
            error=ProviderErrorInfo(
                kind="retryable",
                status=429,
                # The router's own text says nothing; the upstream text it forwards says what happened.
                message="Provider returned error: google/gemini-2.0-flash-exp:free is temporarily rate-limited "
                "upstream. Please retry shortly, or add your own key to accumulate your rate limits: "
                "https://openrouter.ai/settings/integrations",
            ),
        ),
        "openai-responses-error-insufficient-quota.json": Expected(
            content=[], stop_reason="error", error=ProviderErrorInfo(kind="other", message=QUOTA_TEXT, status=429)
        ),
        "openai-chat-error-400-context-length-exceeded": Expected(
            content=[],
            stop_reason="error",
            error=ProviderErrorInfo(
                kind="context_overflow",
                status=400,
                message="This model's maximum context length is 4097 tokens. However, your messages resulted in "
                "4294 tokens. Please reduce the length of the messages.",
            ),
        ),
        "anthropic-thinking-tool": Expected(
            content=[
                ThinkingContent(
                    thinking=WEATHER_THINKING, signature=anthropic_signature(STREAMS / "anthropic-thinking-tool.sse")
                ),
                call("toolu_01Js4AMfx5qpTLhwTusnvT68", "weather", location="Florence, Italy"),
            ],
            stop_reason="tool_use",
            tokens=Tokens(input=424, output=119),
            response_id="msg_01KTBB57LAzaSZs8kMNvfnsY",
        ),
        "anthropic-tools-parallel": Expected(
            content=[
                TextContent(text="I'll add and multiply the numbers 2 and 3 for you."),
                call("toolu_01UYxUYC2zRPY8wiutnF48eP", "add", a=2, b=3),
                call("toolu_01VaRx1jpWCvPhi7L4kywAcd", "multiply", a=2, b=3),
            ],
            stop_reason="tool_use",
            tokens=Tokens(input=502, output=137),
            response_id="msg_01PSvJdjd5keNSD63VHjYzex",
        ),
        "anthropic-redacted-thinking": Expected(
            content=[
                *(
                    ThinkingContent(thinking="", signature=data, redacted=True)
                    for data in anthropic_redacted_data("anthropic-redacted-thinking")
                ),
                TextContent(
                    text="I notice that you've sent what appears to be some kind of test string or command. I don't "
                    'have any special "magic string" triggers or backdoor commands that would expose internal '
                    "systems or change my behavior.\n\nI'm Claude, an AI assistant created by Anthropic to be "
                    "helpful, harmless, and honest. How can I assist you today with a legitimate task or question?"
                ),
            ],
            stop_reason="stop",
            tokens=Tokens(input=92, output=189),
            response_id="msg_018XZkwvj9asBiffg3fXt88s",
        ),
        "anthropic-error-event-overloaded": Expected(
            content=[],
            stop_reason="error",
            error=ProviderErrorInfo(kind="retryable", message="Overloaded"),
        ),
        "anthropic-error-400-prompt-too-long": Expected(
            content=[],
            stop_reason="error",
            error=ProviderErrorInfo(
                kind="context_overflow", status=400, message="prompt is too long: 219898 tokens > 200000 maximum"
            ),
        ),
        "anthropic-error-400-context-limit-max-tokens": Expected(
            content=[],
            stop_reason="error",
            error=ProviderErrorInfo(
                kind="context_overflow",
                status=400,
                message="input length and `max_tokens` exceed context limit: 143653 + 64000 > 200000, decrease "
                "input length or `max_tokens` and try again",
            ),
        ),
    }


EXPECTED = expectations()


@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


@pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")  # the SDK's note on old ids
@pytest.mark.parametrize("entry", INDEX, ids=[fixture_id(entry) for entry in INDEX])
async def test_recorded_response_gives_the_right_message(
    entry: dict[str, Any], server: ReplayServer, ctx: Context
) -> None:
    """Issue 4: a recorded stream or error body, through the real SDK over HTTP, parses to the
    reply (or the classified error) a person reading the recording would expect."""
    await check_replayed_reply(entry, SHARED_FIXTURES.parent / entry["file"], EXPECTED[fixture_id(entry)], server, ctx)


def test_every_index_entry_has_an_expectation() -> None:
    """A fixture added to the index without an expectation fails here, not silently."""
    assert sorted(EXPECTED) == sorted(fixture_id(entry) for entry in INDEX)
