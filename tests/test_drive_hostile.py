"""Providers and tools that break their promises, and closing mid-tool: the run stays in-band and
the journal stays replayable (issue 5 items 2, 3 and 8; HA-25).

White-box: "replayable" is checked by building each adapter's request (`build_request_params`)
from the context the runtime would send (`runtime.branch_context.context_messages`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

from pydantic import JsonValue

from drive_helpers import ProbeTool, branch, start_rig, within
from harness.context import Context
from harness.messages import TextContent, ToolCall, ToolResultMessage
from harness.providers import (
    Model,
    ProviderRequest,
    StartEvent,
    StreamEvent,
    StreamOptions,
    TextDeltaEvent,
    TextStartEvent,
    ToolSpec,
    anthropic_messages,
    openai_chat,
    openai_responses,
)
from harness.providers.faux import reply, tool_call
from harness.runtime import AgentTool, Settled, ToolOutput
from harness.runtime.branch_context import context_messages
from harness.runtime.requests import MAX_INPUT_BYTES
from harness.session import Store
from request_validators import problems

SCHEMA: dict[str, JsonValue] = {"type": "object"}
WIRE = {
    "openai-chat": (openai_chat.build_request_params, Model(id="gpt-4o", provider="openai", api="openai-chat")),
    "openai-responses": (openai_responses.build_request_params,
                         Model(id="gpt-5", provider="openai", api="openai-responses")),
    "anthropic-messages": (anthropic_messages.build_request_params,
                           Model(id="claude-sonnet-4-5", provider="anthropic", api="anthropic-messages")),
}


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled), outcome
    return outcome


def returning(value: Any) -> AgentTool:
    async def execute(call_id: str, args: dict[str, JsonValue], on_update: Any, context: Context) -> Any:
        return value

    return AgentTool(spec=ToolSpec(name="odd", description="returns something odd", parameters=SCHEMA),
                     execute=execute)


async def test_calls_with_repeated_or_empty_ids_and_names_are_journaled_answerable(
    store: Store, ctx: Context
) -> None:
    """A reply whose calls repeat an id, have none, or have no name is stored with fresh ids and a
    placeholder name, so every later request passes each API's pairing rules."""
    probe = ProbeTool()
    rig = await start_rig(store, ctx, [
        reply(tool_call("probe", {"key": "a"}, id="dup"), tool_call("probe", {"key": "b"}, id="dup"),
              tool_call("probe", {"key": "c"}, id=""), tool_call("", {})),
        "done",
    ], tools=[probe.tool])

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "completed"
    entries = await branch(rig.lane, ctx)
    messages = context_messages(entries)
    ids = [b.id for m in messages if m.role == "assistant" for b in m.content if isinstance(b, ToolCall)]
    assert len(ids) == 4
    assert len(set(ids)) == 4
    assert all(ids)
    answered = [m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)]
    assert answered == ids
    for api, (build, model) in WIRE.items():
        params = build(model, ProviderRequest(messages=tuple(messages)), StreamOptions())
        assert problems(api, params, model) == [], api


class RaisingProvider:
    """Breaks the protocol: raises instead of ending with an error event."""

    def __init__(self, after_events: int) -> None:
        self.after_events = after_events
        self.calls = 0

    async def stream(self, model: Model, request: ProviderRequest, options: StreamOptions,
                     context: Context) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        if self.after_events == 0:
            raise ConnectionResetError("the socket went away")
        yield StartEvent(api=model.api, provider=model.provider, model=model.id)
        yield TextStartEvent(content_index=0)
        yield TextDeltaEvent(content_index=0, delta="partial ")
        raise RuntimeError("the provider broke mid-stream")


async def test_a_provider_that_raises_fails_the_step_in_band(store: Store, ctx: Context) -> None:
    """A raise before or during the stream is classified like an error event: a connection error
    is retried, a bug fails the run with an `assistant_error`; the caller gets an outcome."""
    rig = await start_rig(store, ctx, [])
    registry = rig.harness.options.models
    assert registry is not None
    registry.register_provider("faux", RaisingProvider(after_events=1))

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "failed"
    assert outcome.result.error is not None
    assert "broke mid-stream" in outcome.result.error.message
    assert (await rig.lane.inspect_execution(ctx)).current is None


async def test_a_connection_error_raised_by_a_provider_is_retried(store: Store, ctx: Context) -> None:
    rig = await start_rig(store, ctx, [])
    registry = rig.harness.options.models
    assert registry is not None
    flaky = RaisingProvider(after_events=0)
    registry.register_provider("faux", flaky)

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "failed"  # every attempt raised
    assert flaky.calls == 4  # the first attempt and three retries: it was classified retryable


async def test_a_tool_returning_something_unstorable_answers_with_an_error_result(
    store: Store, ctx: Context
) -> None:
    """None, or details that are not JSON (NaN): the call gets an error result, the run goes on."""
    for value in (None, ToolOutput(content=[TextContent(text="x")], details={"ratio": math.nan})):
        rig = await start_rig(store, ctx, [reply(tool_call("odd", {})), "after"], tools=[returning(value)])

        outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

        assert outcome.result.outcome == "completed"
        messages = context_messages(await branch(rig.lane, ctx))
        [result] = [m for m in messages if isinstance(m, ToolResultMessage)]
        assert result.is_error
        assert result.details is None


async def test_a_tool_result_over_the_input_bound_becomes_an_error_result_and_the_run_goes_on(
    store: Store, ctx: Context
) -> None:
    """Issue 11: a tool's output of any size was journaled whole, then decoded on every read of the
    branch and sent in every later request. One over `MAX_INPUT_BYTES` is answered with an error
    result saying how large it was; the journal keeps that, not the output."""
    huge = ToolOutput(content=[TextContent(text="x" * MAX_INPUT_BYTES)], details={"note": "y" * 1000})
    rig = await start_rig(store, ctx, [reply(tool_call("odd", {})), "after"], tools=[returning(huge)])

    outcome = settled(await within(rig.lane.prompt("go", None, ctx)))

    assert outcome.result.outcome == "completed"
    entries = await branch(rig.lane, ctx)
    [result] = [m for m in context_messages(entries) if isinstance(m, ToolResultMessage)]
    assert result.is_error
    [block] = result.content
    assert isinstance(block, TextContent)
    assert f"more than one result may take ({MAX_INPUT_BYTES:,})" in block.text
    assert len(block.text) < 200
    assert [m.role for m in rig.requests()[-1]] == ["user", "assistant", "tool_result"]


async def test_closing_during_a_tool_call_records_no_outcome_and_the_restart_replays_safely(
    store: Store, ctx: Context
) -> None:
    """Close is a crash: a tool cut off by it is not answered with its cancellation; after
    reattaching, a `safe` tool runs again and a `never` tool is answered as interrupted."""
    safe, never = ProbeTool(name="safe", replay="safe"), ProbeTool(name="never", replay="never")
    safe.gate("s")
    never.gate("n")
    rig = await start_rig(store, ctx, [reply(tool_call("safe", {"key": "s"}), tool_call("never", {"key": "n"}))],
                          tools=[safe.tool, never.tool])
    driving = asyncio.ensure_future(rig.lane.prompt("go", None, ctx))
    await within(safe.wait_started("s"))
    await within(never.wait_started("n"))

    await within(rig.harness.close(ctx))
    await asyncio.gather(driving, return_exceptions=True)

    again = await start_rig(store, ctx, ["finished"], tools=[safe.tool, never.tool], session=rig.session)
    safe.gate("s").set()
    outcome = settled(await within(again.lane.resume(ctx)))

    assert outcome.result.outcome == "completed"
    results = {m.tool_name: m for m in context_messages(await branch(again.lane, ctx))
               if isinstance(m, ToolResultMessage)}
    assert not results["safe"].is_error
    assert results["never"].is_error
    assert "interrupted" in "".join(b.text for b in results["never"].content if isinstance(b, TextContent))
    assert [run["key"] for run in never.runs] == ["n"]  # never run twice
