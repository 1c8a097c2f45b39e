"""Replies and tools that break their promises must never wedge a lane: each gets an in-band
result and the run settles. Providers speak through the real OpenAI SDK to the replay server.

Each docstring says what used to happen."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import JsonValue

from drive_helpers import branch, results, start_rig, within
from harness.context import Context
from harness.messages import ModelIdentity, TextContent, ToolResultMessage
from harness.providers import Model, ModelRegistry, ToolSpec
from harness.providers.faux import reply, tool_call
from harness.providers.replay import ReplayResponse, ReplayServer
from harness.runtime import AgentHarness, AgentHarnessOptions, AgentTool, Settled, ToolOutput
from harness.session import LaneConfig, Store

SCHEMA: dict[str, JsonValue] = {"type": "object"}


@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n"


def _tool_call_stream(arguments: str) -> ReplayResponse:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "echo", "arguments": arguments}}
    return ReplayResponse.sse(_chunk({"role": "assistant", "tool_calls": [call]}) + _chunk({}, "tool_calls")
                              + "data: [DONE]\n\n")


def _text_stream(text: str) -> ReplayResponse:
    return ReplayResponse.sse(_chunk({"role": "assistant", "content": text}) + _chunk({}, "stop") + "data: [DONE]\n\n")


def _echo() -> tuple[AgentTool, list[dict[str, JsonValue]]]:
    runs: list[dict[str, JsonValue]] = []

    async def execute(call_id: str, args: dict[str, JsonValue], on_update: Any, context: Context) -> ToolOutput:
        runs.append(args)
        return ToolOutput(content=[TextContent(text="echoed")])

    return AgentTool(spec=ToolSpec(name="echo", description="Echo.", parameters=SCHEMA), execute=execute,
                     replay="safe"), runs


HOSTILE_ARGUMENTS = {
    "NaN": '{"a": NaN}',
    "Infinity": '{"a": -Infinity}',
    "nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
    "nested 200 deep in an object": '{"a": ' + "[" * 200 + "]" * 200 + "}",
}


@pytest.mark.parametrize("case", list(HOSTILE_ARGUMENTS))
async def test_tool_call_arguments_that_are_not_strict_json_get_the_invalid_arguments_result(
    server: ReplayServer, store: Store, ctx: Context, case: str
) -> None:
    """`NaN`, `Infinity` or deep nesting in a provider's tool-call arguments used to raise out of
    the step (pydantic refuses what `json.loads` accepts, and `RecursionError` was not caught):
    every resume failed the same way and the lane was busy forever."""
    server.reset()
    server.enqueue(_tool_call_stream(HOSTILE_ARGUMENTS[case]), _text_stream("done"))
    tool, runs = _echo()
    model = Model.model_validate({"id": "m", "provider": "replay", "api": "openai-chat",
                                  "base_url": f"{server.base_url}/v1"})
    session = await store.create_session(ctx)
    await session.create_lane("main", LaneConfig(model=ModelIdentity(provider="replay", model_id="m"),
                                                 active_tools=["echo"]), ctx)
    registry = ModelRegistry([model], environ={"REPLAY_API_KEY": "k"})
    harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session, models=registry, tools=[tool]), ctx)
    try:
        outcome = await within(harness.lane("main").prompt("go", None, ctx))
        assert isinstance(outcome, Settled)
        assert outcome.result.outcome == "completed"
        assert runs == []
        [result] = results([e.payload.message for e in await branch(harness.lane("main"), ctx)
                            if e.payload.type == "message"])
        assert result.is_error
        assert "argument" in result.content[0].text  # type: ignore[union-attr]
    finally:
        await harness.close(ctx)


async def test_a_replay_safe_tool_that_raises_cancelled_error_itself_gets_an_error_result(
    store: Store, ctx: Context
) -> None:
    """A replay-safe tool that awaited a task someone else cancelled raised `CancelledError` out
    of its own code; it was taken for the harness's own cancellation and rerun in a hot loop
    (27,000 runs in 5 s) and the prompt never returned."""
    runs = 0

    async def execute(call_id: str, args: dict[str, JsonValue], on_update: Any, context: Context) -> ToolOutput:
        nonlocal runs
        runs += 1
        other = asyncio.ensure_future(asyncio.sleep(3600))
        other.cancel()
        await other  # raises CancelledError here, inside the tool
        raise AssertionError("unreachable")

    tool = AgentTool(spec=ToolSpec(name="victim", description="d", parameters=SCHEMA), execute=execute, replay="safe")
    rig = await start_rig(store, ctx, [reply(tool_call("victim", {})), reply("after")], tools=[tool])
    try:
        outcome = await within(rig.lane.prompt("go", None, ctx))
        assert isinstance(outcome, Settled)
        assert outcome.result.outcome == "completed"
        assert runs == 1
        [result] = results([e.payload.message for e in await branch(rig.lane, ctx) if e.payload.type == "message"])
        assert isinstance(result, ToolResultMessage)
        assert result.is_error
    finally:
        await rig.harness.close(ctx)


@pytest.mark.parametrize("exception", [SystemExit, KeyboardInterrupt, GeneratorExit])
async def test_a_tool_raising_an_interpreter_exit_gets_an_error_result_and_the_host_lives(
    store: Store, ctx: Context, exception: type[BaseException]
) -> None:
    """A tool that raised `SystemExit` or `KeyboardInterrupt` took the host process down."""

    async def execute(call_id: str, args: dict[str, JsonValue], on_update: Any, context: Context) -> ToolOutput:
        raise exception()

    tool = AgentTool(spec=ToolSpec(name="exiter", description="d", parameters=SCHEMA), execute=execute,
                     replay="never")
    rig = await start_rig(store, ctx, [reply(tool_call("exiter", {})), reply("after")], tools=[tool])
    try:
        outcome = await within(rig.lane.prompt("go", None, ctx))
        assert isinstance(outcome, Settled)
        assert outcome.result.outcome == "completed"
        [result] = results([e.payload.message for e in await branch(rig.lane, ctx) if e.payload.type == "message"])
        assert result.is_error
        assert exception.__name__ in result.content[0].text  # type: ignore[union-attr]
    finally:
        await rig.harness.close(ctx)
