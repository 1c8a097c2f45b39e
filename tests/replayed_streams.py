"""A provider response body (recorded by others, or written for this project) served by the replay
server over real HTTP, read through the real SDK and the adapter for its API, and the reply it
folds into checked against what a person reading the body expects.

A body is described by an index entry, as in `../shared/fixtures/provider-streams/index.json` and
`tests/streams/index.json`: `kind` (`sse`, `json-error-body` or `sse-event-payload`), `api`,
`model` and `http` (`status`, `content_type`, optional `headers`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.context import Context
from harness.messages import AssistantContent, ThinkingContent, UserMessage
from harness.providers import (
    ApiName,
    DoneEvent,
    ErrorEvent,
    Model,
    ModelCost,
    Provider,
    ProviderErrorInfo,
    ProviderRequest,
    StartEvent,
    StreamEvent,
    StreamOptions,
)
from harness.providers.anthropic_messages import AnthropicMessagesProvider
from harness.providers.openai_chat import OpenAIChatProvider
from harness.providers.openai_responses import OpenAIResponsesProvider
from harness.providers.replay import ReplayResponse, ReplayServer

# Prices (dollars per million tokens), so that every body also checks the cost arithmetic.
PRICES = ModelCost(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
REQUEST = ProviderRequest(messages=(UserMessage(content="replayed"),))
OPTIONS = StreamOptions(api_key="replay-key")
# A recording that kept no status; OpenAI documents insufficient_quota as HTTP 429.
UNRECORDED_STATUS = 429

APIS: dict[str, tuple[ApiName, type[Provider], str]] = {  # index api -> (api, adapter, base URL path)
    "openai-chat-completions": ("openai-chat", OpenAIChatProvider, "/v1"),
    "openai-responses": ("openai-responses", OpenAIResponsesProvider, "/v1"),
    "anthropic-messages": ("anthropic-messages", AnthropicMessagesProvider, ""),
}


@dataclass(frozen=True)
class Tokens:
    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0
    total: int | None = None  # what the server reported; None: the sum


@dataclass(frozen=True)
class Expected:
    """What one body must parse to: a finished reply, or an error with the partial content.

    `encrypted_content` is for Responses reasoning, whose signature is the reasoning item's JSON:
    the first thinking block's signature must hold exactly this encrypted content."""

    content: list[AssistantContent]
    stop_reason: str
    tokens: Tokens | None = None
    response_id: str | None = None
    error: ProviderErrorInfo | None = None
    encrypted_content: str | None = None


def sse_payloads(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON `data:` payloads of an `.sse` file, in order."""
    for line in path.read_text().splitlines():
        if line.startswith("data: {"):
            yield json.loads(line.removeprefix("data: "))


def anthropic_signature(path: Path) -> str:
    """The thinking signature an Anthropic stream sends, its `signature_delta`s joined."""
    return "".join(
        p["delta"]["signature"] for p in sse_payloads(path) if p.get("delta", {}).get("type") == "signature_delta"
    )


def responses_encrypted_content(path: Path) -> str:
    """The encrypted content of a Responses stream's finished reasoning item (the API says the one
    in `output_item.added` may be incomplete)."""
    (content,) = [
        p["item"]["encrypted_content"] for p in sse_payloads(path)
        if p["type"] == "response.output_item.done" and p["item"]["type"] == "reasoning"
    ]
    return str(content)


def replay_response(entry: dict[str, Any], path: Path) -> ReplayResponse:
    """What the server answers: the body at `path` with the entry's status, content type and headers."""
    http = entry["http"]
    headers = http.get("headers", {})
    if entry["kind"] == "sse":
        return ReplayResponse(status=http["status"], content_type=http["content_type"], body=(path.read_bytes(),),
                              headers=headers)
    if entry["kind"] == "json-error-body":
        return ReplayResponse.json(path.read_bytes(), status=http["status"] or UNRECORDED_STATUS, headers=headers)
    assert entry["kind"] == "sse-event-payload", entry["kind"]
    # SYNTHETIC WRAPPER: the recording holds only this event's data payload. The smallest valid
    # stream around it is that one event, framed as SSE; every byte of the payload is recorded.
    payload = path.read_text().strip()
    return ReplayResponse.sse(f"event: {json.loads(payload)['type']}\ndata: {payload}\n\n")


async def check_replayed_reply(
    entry: dict[str, Any], path: Path, expected: Expected, server: ReplayServer, ctx: Context
) -> None:
    """Serve the body at `path` once and assert the adapter's events and folded reply: `start`
    first, one `done` or `error` last, the content, stop reason, response id, error, usage and
    cost as `expected` says, and a single request (the SDK did not retry on its own)."""
    api, adapter, base_path = APIS[entry["api"]]
    model = Model(id=entry["model"] or "recorded-model", provider="replay", api=api,
                  base_url=server.base_url + base_path, cost=PRICES, reasoning=True)
    server.reset()
    server.enqueue(replay_response(entry, path))

    events: list[StreamEvent] = [event async for event in adapter().stream(model, REQUEST, OPTIONS, ctx)]

    assert isinstance(events[0], StartEvent)
    assert [event for event in events[1:-1] if isinstance(event, StartEvent | DoneEvent | ErrorEvent)] == []
    terminal = events[-1]
    assert isinstance(terminal, DoneEvent if expected.error is None else ErrorEvent)
    message = terminal.message
    content = list(message.content)
    if expected.encrypted_content is not None:
        reasoning = content[0]
        assert isinstance(reasoning, ThinkingContent)
        assert reasoning.signature is not None
        assert json.loads(reasoning.signature)["encrypted_content"] == expected.encrypted_content
        content[0] = reasoning.model_copy(update={"signature": None})
    assert content == expected.content
    assert message.stop_reason == expected.stop_reason
    assert message.response_id == expected.response_id
    assert (message.api, message.provider, message.model) == (api, "replay", model.id)
    if isinstance(terminal, ErrorEvent):
        assert terminal.error == expected.error
        assert message.error_message == terminal.error.message
    else:
        assert message.error_message is None
    if expected.tokens is not None:
        tokens, usage = expected.tokens, message.usage
        counts = (tokens.input, tokens.output, tokens.cache_read, tokens.cache_write)
        assert (usage.input, usage.output, usage.cache_read, usage.cache_write) == counts
        assert usage.total_tokens == (tokens.total or sum(counts))
        prices = (PRICES.input, PRICES.output, PRICES.cache_read, PRICES.cache_write)
        assert usage.cost.total == pytest.approx(sum(n * price for n, price in zip(counts, prices, strict=True)) / 1e6)
    assert len(server.requests) == 1  # the SDK did not retry on its own: the runtime decides
