"""Budgets and fallback models (issue 32, item 5): a run stopped by its budget with its row and
typed result, then going on once the cap is raised; a conversation's own cap honoured by another
service on the same SQLite store; a fallback model taking a step over after a 503 storm, with
its model-switch row; the same through `harness run`'s `--budget-tokens` and `--fallback`, and
their usage errors; prices from genai-prices, models.toml overriding them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import Agent, Context
from harness.conversation import (
    Budget,
    BudgetReached,
    ChatEventDetails,
    ChatEventPublished,
    ConversationEvent,
    ConversationService,
    ConversationSetup,
    ModelSwitched,
)
from harness.messages import ModelIdentity, Usage
from harness.providers import ModelCost, ModelRegistry
from harness.providers.models import priced
from harness.providers.protocol import usage_with_cost
from harness.providers.replay import ReplayResponse, ReplayServer
from harness.runtime import DriveSettings, RetryPolicy, Settled
from harness.session import LaneConfig, connect
from test_cli_run import chat_chunk, harness, openai_env, session_of

GPT_4O = ModelIdentity(provider="openai", model_id="gpt-4o")
GPT_4O_MINI = ModelIdentity(provider="openai", model_id="gpt-4o-mini")


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


@pytest.fixture
def served(server: ReplayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ReplayServer:
    for name, value in {**openai_env(server), "HARNESS_HOME": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HARNESS_STORE", raising=False)
    return server


def with_usage(tokens: int, *, text: str | None = None, call: tuple[str, dict[str, object]] | None = None
               ) -> ReplayResponse:
    """A Chat Completions stream of `text` or one tool `call`, reporting `tokens` tokens used (half in)."""
    if call is not None:
        name, arguments = call
        function = {"name": name, "arguments": json.dumps(arguments)}
        delta = {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                      "function": function}]}
        finish = "tool_calls"
    else:
        delta, finish = {"role": "assistant", "content": text or ""}, "stop"
    usage = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o", "choices": [],
             "usage": {"prompt_tokens": tokens // 2, "completion_tokens": tokens - tokens // 2, "total_tokens": tokens}}
    return ReplayResponse.sse(chat_chunk(delta), chat_chunk({}, finish), f"data: {json.dumps(usage)}\n\n",
                              "data: [DONE]\n\n")


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def rows(events: list[ConversationEvent]) -> list[ChatEventDetails]:
    return [event.row.details for event in events if isinstance(event, ChatEventPublished)]


async def streamed(agent: Agent, prompt: str, conversation: str | None = None) -> tuple[list[ConversationEvent], str]:
    stream = agent.stream(prompt, conversation=conversation)
    events = [event async for event in stream]
    assert stream.result is not None
    return events, stream.result.outcome


# -- a budget stop and a raise ------------------------------------------------------------------------


async def test_a_run_stops_at_its_token_budget_with_its_row_and_a_raised_cap_goes_on(served: ReplayServer) -> None:
    """The tool call's reply spends 150 tokens of a run's 100: before the next request the run
    stops, `budget_exceeded`, with a `BudgetReached` row and no `interrupted` one; with the cap
    raised the conversation's next run is answered."""
    served.enqueue(with_usage(150, call=("add", {"a": 2, "b": 3})), with_usage(40, text="5, at last"))

    async with Agent("openai/gpt-4o", tools=[add], budget=Budget(run_tokens=100)) as tight:
        result = await tight.run("What is 2 + 3?")
    assert result.outcome == "budget_exceeded"
    assert len(served.requests) == 1  # nothing was asked after the cap was reached

    async with Agent("openai/gpt-4o", tools=[add], budget=Budget(run_tokens=1_000)) as raised:
        events, outcome = await streamed(raised, "Go on.", result.conversation_id)

    assert outcome == "completed"
    assert len(served.requests) == 2
    earlier = served.requests[1].json()["messages"]
    assert any("budget of 100 tokens is spent (150 tokens used)" in str(m.get("content")) for m in earlier)
    assert not [row for row in rows(events) if isinstance(row, BudgetReached)]


async def test_the_budget_row_is_published_with_its_scope_limit_and_spending(served: ReplayServer) -> None:
    served.enqueue(with_usage(150, call=("add", {"a": 2, "b": 3})))

    async with Agent("openai/gpt-4o", tools=[add], budget=Budget(run_tokens=100)) as agent:
        events, outcome = await streamed(agent, "What is 2 + 3?")

    assert outcome == "budget_exceeded"
    assert [row for row in rows(events) if row.kind in ("budget", "interrupted")] == [
        BudgetReached(scope="run", unit="tokens", limit=100, spent=150)]


async def test_a_conversations_own_cap_holds_in_another_service_on_the_same_store_until_raised(
        served: ReplayServer, tmp_path: Path) -> None:
    """The cap is a value of the conversation: a second service on the same SQLite file stops its
    next run before any request, in dollars at genai-prices' price of gpt-4o, and goes on once
    that service raises it."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    served.enqueue(with_usage(2_000, text="first"), with_usage(10, text="after the raise"))
    async with Agent("openai/gpt-4o", store=url) as first:
        conversation = (await first.run("Hello")).conversation_id
        await first.set_budget(conversation, Budget(conversation_usd=0.001))  # 2,000 tokens cost more

    async with Agent("openai/gpt-4o", store=url) as second:
        events, outcome = await streamed(second, "Again", conversation)
        assert outcome == "budget_exceeded"
        assert len(served.requests) == 1
        (row,) = [row for row in rows(events) if isinstance(row, BudgetReached)]
        assert (row.scope, row.unit, row.limit) == ("conversation", "usd", 0.001)
        assert row.spent == pytest.approx(1_000 * 2.5 / 1e6 + 1_000 * 10 / 1e6)

        await second.set_budget(conversation, Budget(conversation_usd=1.0))
        result = await second.run("Again", conversation=conversation)

    assert (result.outcome, result.output) == ("completed", "after the raise")


# -- a fallback after a 503 storm -------------------------------------------------------------------


async def test_a_fallback_model_takes_the_step_after_a_503_storm_with_its_row(
        server: ReplayServer, tmp_path: Path) -> None:
    """gpt-4o answers 503 to the step and to its retry: gpt-4o-mini takes the step over, the lane
    switched to it with a model-switch row by `fallback` that the new request reads, and the run
    completes with its answer."""
    unavailable = {"error": {"message": "the service is overloaded", "type": "server_error"}}
    server.enqueue(ReplayResponse.json(unavailable, status=503), ReplayResponse.json(unavailable, status=503),
                   with_usage(10, text="from the fallback"))
    models = ModelRegistry.load(home=tmp_path, environ=openai_env(server))
    drive = DriveSettings(retry=RetryPolicy(max_retries=1, base_delay_ms=1), fallback=(GPT_4O_MINI,))
    context = Context()
    store = await connect(f"sqlite:///{tmp_path / 'journal.db'}", context)
    service = ConversationService(store, ConversationSetup(models=models, drive=drive))
    try:
        conversation = await service.create("someone", LaneConfig(model=GPT_4O), context)
        watch = await conversation.watch(context)
        outcome = await conversation.send("Hello?", context)
        seen = watch.buffered()
        watch.close()
        model = conversation.config().model
    finally:
        await service.close_all(context)
        await store.close()

    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    assert [request.json()["model"] for request in server.requests] == ["gpt-4o", "gpt-4o", "gpt-4o-mini"]
    assert model == GPT_4O_MINI
    (switched,) = [row for row in rows(seen) if isinstance(row, ModelSwitched)]
    assert (switched.previous, switched.model, switched.by) == (GPT_4O, GPT_4O_MINI, "fallback")
    assert "overloaded" in (switched.reason or "")
    last = server.requests[2].json()["messages"]
    assert "took the request over" in last[-1]["content"]


# -- through harness run ------------------------------------------------------------------------------

UNAVAILABLE = ReplayResponse.json({"error": {"message": "the service is overloaded", "type": "server_error"}},
                                  status=503)


def test_harness_run_stops_at_budget_tokens_with_its_row_and_a_raised_cap_goes_on(
        server: ReplayServer, tmp_path: Path) -> None:
    """`--budget-tokens 100`: the read's reply spends 150, so the run stops before asking again,
    exit status 4 with the budget row on stderr; the same session with `--budget-tokens 1000`
    is answered."""
    (tmp_path / "notes.txt").write_text("five\n")
    server.enqueue(with_usage(150, call=("read", {"path": "notes.txt"})), with_usage(40, text="It says five."))

    stopped = harness(tmp_path, tmp_path, "run", "What do the notes say?", "--model", "openai/gpt-4o",
                      "--budget-tokens", "100", env=openai_env(server))
    requests_then = len(server.requests)
    raised = harness(tmp_path, tmp_path, "run", "Go on.", "--session", session_of(stopped),
                     "--budget-tokens", "1000", env=openai_env(server))

    assert stopped.returncode == 4, stopped.stderr
    assert "stopped: the run reached its budget of 100 tokens (150 tokens used)" in stopped.stderr
    assert "abort" not in stopped.stderr  # the row says why, once
    assert requests_then == 1
    assert raised.returncode == 0, raised.stderr
    assert raised.stdout.strip() == "It says five."


def test_harness_run_fallback_takes_the_run_over_after_a_503_storm_and_prints_its_row(
        server: ReplayServer, tmp_path: Path) -> None:
    server.enqueue(*[UNAVAILABLE] * 4, with_usage(10, text="from the fallback"))

    run = harness(tmp_path, tmp_path, "run", "Hello?", "--model", "openai/gpt-4o", "--fallback", "openai/gpt-4o-mini",
                  env={**openai_env(server), "HARNESS_RETRY_DELAY_MS": "0"})

    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "from the fallback"
    assert [request.json()["model"] for request in server.requests] == ["gpt-4o"] * 4 + ["gpt-4o-mini"]
    assert "model: openai/gpt-4o -> openai/gpt-4o-mini (fallback: " in run.stderr
    assert "overloaded" in run.stderr


@pytest.mark.parametrize(("command", "option", "value", "said"), [
    ("run", "--budget-tokens", "0", "--budget-tokens"),
    ("run", "--budget-tokens", "many", "--budget-tokens"),
    ("run", "--budget-usd", "-1", "positive number of US dollars"),
    ("run", "--budget-usd", "nan", "positive number of US dollars"),
    ("run", "--fallback", "gpt-4o-mini", "provider/id"),
    ("chat", "--budget-usd", "0", "positive number of US dollars"),
    ("chat", "--fallback", "gpt-4o-mini", "provider/id"),
])
def test_a_bad_budget_or_fallback_is_a_usage_error_that_writes_nothing(
        tmp_path: Path, command: str, option: str, value: str, said: str) -> None:
    refused = harness(tmp_path, tmp_path, command, *(["hi"] if command == "run" else []), option, value)

    assert refused.returncode == 2
    assert said in refused.stderr
    assert not (tmp_path / "harness.db").exists()


def test_a_fallback_model_that_cannot_run_is_refused_before_anything_is_written(
        server: ReplayServer, tmp_path: Path) -> None:
    refused = harness(tmp_path, tmp_path, "run", "hi", "--model", "openai/gpt-4o", "--fallback", "nowhere/no-model",
                      env=openai_env(server))

    assert refused.returncode == 1
    assert "model_unavailable" in refused.stderr
    assert not server.requests
    assert harness(tmp_path, tmp_path, "sessions").stdout == ""


# -- prices --------------------------------------------------------------------------------------------


def test_genai_prices_prices_a_built_in_model_and_models_toml_overrides_it(tmp_path: Path) -> None:
    catalogued = priced(ModelRegistry.load(home=tmp_path, environ={}).model(GPT_4O))
    assert catalogued.cost == ModelCost(input=2.5, output=10.0, cache_read=1.25)
    assert usage_with_cost(catalogued, Usage(input=1_000_000, output=100_000)).cost.total == pytest.approx(3.5)

    (tmp_path / "models.toml").write_text(
        '[providers.openai]\n[[providers.openai.models]]\nid = "gpt-4o"\ncost = { input = 1.0, output = 2.0 }\n')
    overridden = priced(ModelRegistry.load(home=tmp_path, environ={}).model(GPT_4O))
    assert overridden.cost == ModelCost(input=1.0, output=2.0)
