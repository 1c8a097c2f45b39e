"""The project's own provider streams (tests/streams, written for Harness in each API's wire format),
replayed by the replay server over real HTTP through the real SDK and the adapter for its API,
give the right message. Every adapter is covered on every path, in any clone: plain text,
reasoning (with its signature where the API has one), parallel tool calls whose arguments arrive
split across deltas, an error in the middle of the stream, and a 429 body.

The expectations are written by hand; signatures and encrypted content are read from the files,
so the test proves they arrive byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import PROJECT_STREAMS
from harness.context import Context
from harness.messages import TextContent, ThinkingContent, ToolCall
from harness.providers import ProviderErrorInfo
from harness.providers.replay import ReplayServer
from replayed_streams import Expected, Tokens, anthropic_signature, check_replayed_reply, responses_encrypted_content

INDEX: list[dict[str, Any]] = json.loads((PROJECT_STREAMS / "index.json").read_text())["entries"]


def stem(entry: dict[str, Any]) -> str:
    return Path(entry["file"]).stem


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


EXPECTED = {
    "openai-chat-text": Expected(
        content=[TextContent(text="The journal is written before anyone is told — so a crash loses nothing.")],
        stop_reason="stop",
        tokens=Tokens(input=34, output=14, cache_read=1024, total=1072),  # 1,058 prompt tokens, 1,024 cached
        response_id="chatcmpl-HxTextPlain0001aQ7mVb2kLr9",
    ),
    "openai-chat-reasoning": Expected(
        content=[
            ThinkingContent(thinking="Two files changed. The test only moved; the journal change matters."),
            TextContent(text="Only `journal.py` changed in a way that matters."),
        ],
        stop_reason="stop",
        tokens=Tokens(input=212, output=61),  # the 38 reasoning tokens are part of the output
        response_id="chatcmpl-HxReasoning0002pW4nZs8tYc1",
    ),
    "openai-chat-tools-parallel": Expected(
        content=[
            call("call_Hx3nY8cQ2vLm5Rt7Wp0aZb4E", "read", path="src/harness/cli.py"),
            call("call_Hx9sK1dF6gJ3hU2xC7vB5nM8", "grep", pattern="def main", path="src"),
        ],
        stop_reason="tool_use",
        tokens=Tokens(input=311, output=48),
        response_id="chatcmpl-HxToolsPar0003kD2fGh6jQw5",
    ),
    "openai-chat-midstream-error": Expected(
        content=[TextContent(text="Here is the summary of")],
        stop_reason="error",
        response_id="chatcmpl-HxMidError0004rT5yUi8oPa3",
        # A server error: worth retrying; the partial text is kept for the record.
        error=ProviderErrorInfo(
            kind="retryable", message="The server hit an internal error while generating the reply."
        ),
    ),
    "openai-chat-error-429": Expected(
        content=[],
        stop_reason="error",
        error=ProviderErrorInfo(
            kind="retryable",
            status=429,
            retry_after_ms=2000,
            message="Rate limit reached for requests per minute (RPM): limit 500, used 500, requested 1. "
            "Please try again in 2s.",
        ),
    ),
    "openai-responses-text": Expected(
        content=[TextContent(text="Resuming a turn asks the model again from the last entry.")],
        stop_reason="stop",
        tokens=Tokens(input=37, output=12),
        response_id="resp_0hx1text5f3c2a9e7d4b6c8a1e0f2d3b5c7a9e1f3d5b7",
    ),
    "openai-responses-reasoning-summary": Expected(
        content=[
            # Two summary parts, one thinking block, a blank line between them.
            ThinkingContent(
                thinking="**Finding the version**\n\nThe package version is declared in the project file, not in "
                "the code.\n\n**Choosing the tool**\n\nReading that one file answers it."
            ),
            call("call_Hx4mQ7wE2rT9yU1iO6pA3sD8", "read", path="pyproject.toml"),
        ],
        stop_reason="tool_use",
        tokens=Tokens(input=214, output=187, cache_read=1920),  # 2,134 input tokens, 1,920 cached
        response_id="resp_0hx2reason8a1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e1",
        encrypted_content=responses_encrypted_content(PROJECT_STREAMS / "openai-responses-reasoning-summary.sse"),
    ),
    "openai-responses-tools-parallel": Expected(
        content=[
            TextContent(text="Looking at both folders."),
            call("call_Hx5zX8cV3bN6mL1kJ4hG7fD0", "list", path="src/harness"),
            call("call_Hx6qW9eR4tY7uI2oP5aS8dF1", "list", path="tests/streams"),
        ],
        stop_reason="tool_use",
        tokens=Tokens(input=402, output=71),
        response_id="resp_0hx3tools2c4e6a8b0d2f4a6c8e0b2d4f6a8c0e2b4d6",
    ),
    "openai-responses-midstream-error": Expected(
        content=[TextContent(text="A partial answer")],
        stop_reason="error",
        response_id="resp_0hx4error3d5f7b9a1c3e5d7f9b1a3c5e7d9f1b3a5c7",
        # The error event decides; the `response.failed` after it says the same and changes nothing.
        error=ProviderErrorInfo(
            kind="retryable", message="The server hit an internal error while generating the response."
        ),
    ),
    "openai-responses-error-429": Expected(
        content=[],
        stop_reason="error",
        error=ProviderErrorInfo(
            kind="retryable",
            status=429,
            retry_after_ms=510,
            message="Rate limit reached for gpt-5-mini on tokens per min (TPM): limit 200000, used 199500, "
            "requested 1200. Please try again in 510ms.",
        ),
    ),
    "anthropic-text": Expected(
        content=[TextContent(text="A lane runs one turn at a time.")],
        stop_reason="stop",
        tokens=Tokens(input=25, output=11),
        response_id="msg_01HxTextPlain5Qm8Wn2Zr4Tv",
    ),
    "anthropic-thinking-signature": Expected(
        content=[
            ThinkingContent(
                thinking="The user asks which Python the project needs. pyproject.toml says; reading it is enough.",
                signature=anthropic_signature(PROJECT_STREAMS / "anthropic-thinking-signature.sse"),
            ),
            call("toolu_01Hx2Pq5Rs8Tu1Vw4Xy7Za0C", "read", path="pyproject.toml"),
        ],
        stop_reason="tool_use",
        tokens=Tokens(input=58, output=96, cache_read=2048),
        response_id="msg_01HxThinkSig8Lp3Kd7Xs1Bq",
    ),
    "anthropic-tools-parallel": Expected(
        content=[
            TextContent(text="I'll read the module and search the tests."),
            call("toolu_01Hx7Ab3Cd5Ef7Gh9Ij1Kl3M", "read", path="src/harness/__init__.py"),
            call("toolu_01Hx8Nq2Rs4Tu6Vw8Xy0Za2B", "grep", pattern="async def", path="tests"),
        ],
        stop_reason="tool_use",
        tokens=Tokens(input=640, output=121),
        response_id="msg_01HxToolsPar2Mv6Nb9Cz4Wy",
    ),
    "anthropic-midstream-error": Expected(
        content=[TextContent(text="The first step is")],
        stop_reason="error",
        response_id="msg_01HxMidError4Gt8Hy2Ju6Ki",
        error=ProviderErrorInfo(kind="retryable", message="Internal server error"),
    ),
    "anthropic-error-429": Expected(
        content=[],
        stop_reason="error",
        error=ProviderErrorInfo(
            kind="retryable",
            status=429,
            retry_after_ms=15_000,
            message="This request would exceed the rate limit for your organization of 50 requests per minute. "
            "Please slow down and try again shortly.",
        ),
    ),
}


@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


@pytest.mark.parametrize("entry", INDEX, ids=[stem(entry) for entry in INDEX])
async def test_project_stream_gives_the_right_message(
    entry: dict[str, Any], server: ReplayServer, ctx: Context
) -> None:
    """Issue 10: each of the project's streams, through the real SDK over HTTP, parses to the reply
    (or the classified error, with the server's retry-after) its author wrote it to carry."""
    await check_replayed_reply(entry, PROJECT_STREAMS / entry["file"], EXPECTED[stem(entry)], server, ctx)


def test_every_project_stream_has_an_expectation() -> None:
    """A stream added to the index without an expectation (or the reverse) fails here."""
    assert sorted(EXPECTED) == sorted(stem(entry) for entry in INDEX)
    bodies = [path.name for path in PROJECT_STREAMS.iterdir() if path.suffix in (".sse", ".json")]
    assert sorted(entry["file"] for entry in INDEX) == sorted(name for name in bodies if name != "index.json")

