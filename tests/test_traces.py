"""A run's OpenTelemetry spans by the GenAI semantic conventions (issue 32, item 4): their names,
attributes and parentage, captured with the SDK's in-memory exporter; the trace context stored
with the run at admission; one trace across a SIGKILL and a resume in another process.

White-box where it names the crash suite's `FaultPoint` and reads the operation's stored record."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.context import Context as OtelContext
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, StatusCode, TraceState
from opentelemetry.util.types import Attributes
from pydantic import JsonValue

from drive_crash_child import CONFIG, SAFE, CrashTools, attach, script
from harness import Agent
from harness.context import Context
from harness.errors import InvalidInput
from harness.messages import ModelIdentity, TextContent, Usage
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ToolSpec
from harness.providers.faux import failure, reply, tool_call
from harness.runtime import AgentHarness, AgentHarnessOptions, AgentTool, PromptRequest, Settled, ToolOutput
from harness.runtime.fault_points import ENVIRONMENT_VARIABLE, FaultPoint
from harness.session import LaneConfig, Session, SessionOwned, addresses, connect

TESTS = Path(__file__).resolve().parent
CHILD_TIMEOUT_S = 60.0  # a guard against a child that never reaches its point, never a wait
ATTACH_ATTEMPTS = 200


class Switch(Sampler):
    """Samples every span while `on`, none otherwise: the process's provider is set once for good,
    and the other tests a worker runs should make no spans."""

    on = False

    def should_sample(self, parent_context: OtelContext | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state: TraceState | None = None) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE if self.on else Decision.DROP, attributes)

    def get_description(self) -> str:
        return "Switch"


SWITCH = Switch()
EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider(sampler=SWITCH)
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans this test makes: the process's tracer provider records while it runs."""
    if trace.get_tracer_provider() is not PROVIDER:
        trace.set_tracer_provider(PROVIDER)  # once per process: OpenTelemetry allows no other
    assert trace.get_tracer_provider() is PROVIDER
    EXPORTER.clear()
    SWITCH.on = True
    try:
        yield EXPORTER
    finally:
        SWITCH.on = False
        EXPORTER.clear()


LOOKUP_SCHEMA: dict[str, JsonValue] = {"type": "object", "properties": {"key": {"type": "string"}}}


async def lookup(tool_call_id: str, args: dict[str, JsonValue],
                 on_update: Callable[[JsonValue, bool], Awaitable[None]], context: Context) -> ToolOutput:
    """Finds every key but `gone`, for which it answers an error result."""
    key = args.get("key")
    return ToolOutput(content=[TextContent(text=f"no {key}" if key == "gone" else f"found {key}")],
                      is_error=key == "gone")


LOOKUP = AgentTool(spec=ToolSpec(name="lookup", description="Look a key up.", parameters=LOOKUP_SCHEMA),
                   execute=lookup, replay="safe")
FAUX = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)


async def harness_with(session: Session, faux: FauxProvider, ctx: Context) -> AgentHarness:
    await session.create_lane("main", LaneConfig(model=FAUX, active_tools=["lookup"]), ctx)
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": faux})
    harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session, models=registry, tools=[LOOKUP],
                                                               agent_name="librarian"), ctx)
    return harness


def named(finished: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in finished if span.name == name]


def ids(traceparent: str | None) -> tuple[str, str]:
    """A W3C traceparent's trace id and parent span id, in hex."""
    assert traceparent is not None
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else int(span.parent.span_id)


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


async def test_a_run_is_one_trace_of_genai_spans(spans: InMemorySpanExporter, ctx: Context) -> None:
    """Issue 32: acceptance, then `invoke_agent {agent}` with `chat {model}` and `execute_tool
    {tool}` under it, carrying the model, the reply's usage and finish reason, the tool's name and
    call id; the acceptance's context is what the run stores."""
    faux = FauxProvider([
        reply(tool_call("lookup", {"key": "k"}, id="call-1"), usage=Usage(input=100, output=7, cache_read=20)),
        reply("found it", usage=Usage(input=130, output=3)),
    ])
    store = await connect("memory://", ctx)
    session = await store.create_session(ctx)
    harness = await harness_with(session, faux, ctx)
    lane = harness.lane("main")

    accepted = await lane.accept(PromptRequest(text="find k"), ctx)
    meta = await session.get(addresses.operation_meta(accepted.operation_id), ctx)
    outcome = await lane.drive(accepted.operation_id, ctx)
    await harness.close(ctx)

    assert isinstance(outcome, Settled)
    finished = spans.get_finished_spans()
    assert sorted(span.name for span in finished) == [
        "accept_run", "chat faux", "chat faux", "execute_tool lookup", "invoke_agent librarian"]
    [accept] = named(finished, "accept_run")
    [agent] = named(finished, "invoke_agent librarian")
    first, second = sorted(named(finished, "chat faux"), key=lambda span: span.start_time or 0)
    [tool] = named(finished, "execute_tool lookup")
    assert meta is not None
    assert ids(meta.traceparent) == hex_ids(accept)
    assert {hex_ids(span)[0] for span in finished} == {hex_ids(accept)[0]}
    assert parent_id(agent) == span_id(accept)
    assert [parent_id(span) for span in (first, tool, second)] == [span_id(agent)] * 3
    assert (first.kind, tool.kind, agent.kind) == (SpanKind.CLIENT, SpanKind.INTERNAL, SpanKind.INTERNAL)

    assert dict(first.attributes or {}) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "faux", "gen_ai.system": "faux",
        "gen_ai.request.model": "faux", "gen_ai.response.model": "faux", "gen_ai.response.id": "faux-1",
        "gen_ai.conversation.id": session.id, "gen_ai.response.finish_reasons": ("tool_call",),
        "gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 20, "gen_ai.usage.cache_creation.input_tokens": 0,
        "harness.step": 1, "harness.attempt": 1}
    assert (second.attributes or {})["gen_ai.response.finish_reasons"] == ("stop",)
    assert dict(tool.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "call-1",
        "gen_ai.tool.type": "function", "gen_ai.tool.description": "Look a key up.",
        "gen_ai.conversation.id": session.id}
    assert dict(agent.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "librarian",
        "gen_ai.provider.name": "faux", "gen_ai.request.model": "faux", "gen_ai.conversation.id": session.id,
        "harness.lane": "main", "harness.operation_id": accepted.operation_id,
        "harness.resumed": False, "gen_ai.usage.input_tokens": 250, "gen_ai.usage.output_tokens": 10,
        "harness.run.outcome": "completed"}


async def test_an_agents_runs_carry_its_name(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    """Issue 32: `Agent(name=...)` names its runs' `invoke_agent` spans and their
    `gen_ai.agent.name`, the conversation's id their `gen_ai.conversation.id`."""
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": FauxProvider(["hello"])})
    async with Agent(FAUX, models=registry, store=f"sqlite:///{tmp_path / 'journal.db'}", user="someone",
                     name="librarian") as agent:
        result = await agent.run("hi")

    [span] = named(spans.get_finished_spans(), "invoke_agent librarian")
    attributes = span.attributes or {}
    assert attributes["gen_ai.agent.name"] == "librarian"
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attributes["gen_ai.conversation.id"] == result.conversation_id


def test_an_agent_without_a_name_is_refused() -> None:
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": FauxProvider([])})

    with pytest.raises(InvalidInput):
        Agent(FAUX, models=registry, store="memory://", name=" ")


async def test_a_failed_reply_and_a_failed_tool_are_errors_of_their_spans(spans: InMemorySpanExporter,
                                                                          ctx: Context) -> None:
    """Issue 32: a tool's error result marks its span `tool_error`, and a call answered without
    running (an unknown tool) has none; a provider failure marks the chat span with its kind and
    the run's span with the run's error code."""
    faux = FauxProvider([reply(tool_call("lookup", {"key": "gone"}, id="call-1"), tool_call("unknown", id="call-2")),
                         failure("other", "the model went away")])
    store = await connect("memory://", ctx)
    session = await store.create_session(ctx)
    harness = await harness_with(session, faux, ctx)

    outcome = await harness.lane("main").prompt("find k", None, ctx)
    await harness.close(ctx)

    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "failed"
    finished = spans.get_finished_spans()
    [tool] = named(finished, "execute_tool lookup")
    assert tool.status.status_code is StatusCode.ERROR
    assert (tool.attributes or {})["error.type"] == "tool_error"
    assert named(finished, "execute_tool unknown") == []
    failed_chat = sorted(named(finished, "chat faux"), key=lambda span: span.start_time or 0)[-1]
    assert failed_chat.status.status_code is StatusCode.ERROR
    assert (failed_chat.attributes or {})["error.type"] == "other"
    [agent] = named(finished, "invoke_agent librarian")
    assert agent.status.status_code is StatusCode.ERROR
    assert (agent.attributes or {})["error.type"] == "assistant_error"
    assert (agent.attributes or {})["harness.run.outcome"] == "failed"


async def test_a_run_accepted_while_nothing_records_stores_no_trace(ctx: Context) -> None:
    """Issue 32: without an SDK (or unsampled) the spans are no-ops and the run keeps no context."""
    store = await connect("memory://", ctx)
    session = await store.create_session(ctx)
    harness = await harness_with(session, FauxProvider(["hello"]), ctx)

    accepted = await harness.lane("main").accept(PromptRequest(text="hi"), ctx)

    meta = await session.get(addresses.operation_meta(accepted.operation_id), ctx)
    assert meta is not None
    assert meta.traceparent is None
    await harness.close(ctx)


def read_spans(path: Path) -> list[dict[str, JsonValue]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_run_killed_and_resumed_in_another_process_is_one_trace(
        spans: InMemorySpanExporter, tmp_path: Path, ctx: Context) -> None:
    """Issue 32, prove it: a child accepts and drives a run with an SDK installed and SIGKILLs
    itself after its tool effects; this process resumes the run, and its `invoke_agent` span
    (`harness.resumed`) and everything under it continue the trace the child's acceptance began."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    store = await connect(url, ctx)
    try:
        session = await store.create_session(ctx)
        await session.create_lane("main", CONFIG, ctx)
        spans_file = tmp_path / "child-spans.jsonl"
        env = {**os.environ, ENVIRONMENT_VARIABLE: FaultPoint.BEFORE_TOOL_STAGING.value, "PYTHONPATH": str(TESTS)}
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(TESTS / "traces_child.py"), str(spans_file), url, session.id, str(tmp_path), env=env,
            stdout=asyncio.subprocess.PIPE)
        stdout, _ = await asyncio.wait_for(child.communicate(), CHILD_TIMEOUT_S)
        assert child.returncode == -signal.SIGKILL, stdout.decode()
        lane_state = await session.get(addresses.lane_state("main"), ctx)
        assert lane_state is not None
        assert lane_state.current_operation_id is not None
        meta = await session.get(addresses.operation_meta(lane_state.current_operation_id), ctx)
        assert meta is not None
        trace_id, stored_span_id = ids(meta.traceparent)
        exported = read_spans(spans_file)
        [accept] = [span for span in exported if span["name"] == "accept_run"]
        assert accept["context"] == {"trace_id": f"0x{trace_id}", "span_id": f"0x{stored_span_id}",
                                     "trace_state": "[]"}
        assert "chat faux" in [span["name"] for span in exported]  # the child's reply, before the kill

        for _ in range(ATTACH_ATTEMPTS):  # a killed owner's lock may outlive it briefly; no event says when
            try:
                harness, _ = await attach(session, CrashTools(tmp_path).tools, FauxProvider(script("p")), ctx)
                break
            except SessionOwned:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the killed child's session claim was never released")
        outcome = await harness.lane("main").resume(ctx)
        await harness.close(ctx)

        assert isinstance(outcome, Settled)
        assert outcome.result.outcome == "completed"
        finished = spans.get_finished_spans()
        [agent] = named(finished, "invoke_agent harness")
        assert (agent.attributes or {})["harness.resumed"] is True
        assert {hex_ids(span)[0] for span in finished} == {trace_id}
        assert parent_id(agent) == int(stored_span_id, 16)
        assert named(finished, f"execute_tool {SAFE}"), "the safe lookup runs again, under the resumed span"
        assert all(parent_id(span) == span_id(agent) for span in finished if span is not agent)
    finally:
        await store.close()
