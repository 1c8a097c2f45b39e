"""`harness run`, `harness models` and `harness doctor` as a person runs them: real subprocesses on a
SQLite store under a temporary HARNESS_HOME, models served by the replay server from recorded
streams as ordinary OpenAI and Anthropic endpoints, and the embedded model offline."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from rich.console import Console

from conftest import SHARED_FIXTURES, backend_url, needs_shared_fixtures
from harness import __version__ as harness_version
from harness.cli.config import local_user
from harness.cli.run import RunTurn, run_turn
from harness.context import Context
from harness.conversation import ChatEventDetails, ConversationService, ErrorDetails, EventRow, ModelSwitched
from harness.messages import ModelIdentity, TextContent
from harness.providers import ModelRegistry
from harness.providers.faux import FauxProvider
from harness.providers.models import BUILTIN_MODELS
from harness.providers.replay import Hold, ReplayResponse, ReplayServer
from harness.runtime import HarnessEvent, NothingToResume
from harness.runtime.requests import MAX_INPUT_BYTES
from harness.session import connect
from request_validators import problems

STREAMS = SHARED_FIXTURES / "provider-streams"
OPENAI_TOOLS = STREAMS / "openai-chat-tools-parallel.sse"
ANTHROPIC_TOOLS = STREAMS / "anthropic-tools-parallel.sse"
TIMEOUT_S = 120
EMBEDDED_TIMEOUT_S = 400  # a guard, not a wait: a CPU-only run takes 10-40 s when cores are shared
EVENTS: TypeAdapter[HarnessEvent] = TypeAdapter(HarnessEvent)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


def environment(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any provider configuration, plus `extra`."""
    env = {name: value for name, value in os.environ.items()
           if not name.endswith(("_API_KEY", "_BASE_URL")) and name not in ("HARNESS_STORE", "HARNESS_HOME")}
    return {**env, "HARNESS_HOME": str(home), **extra}


def json_lines(stdout: str) -> tuple[dict[str, object], list[HarnessEvent]]:
    """The `--json` output as its session line and the events after it."""
    first, *rest = stdout.splitlines()
    return json.loads(first), [EVENTS.validate_json(line) for line in rest]


def harness(home: Path, work: Path, *args: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT_S,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=work, env=environment(home, **(env or {})),
                          input=stdin, capture_output=True, text=True, timeout=timeout, check=False)


def openai_env(server: ReplayServer) -> dict[str, str]:
    return {"OPENAI_BASE_URL": f"{server.base_url}/v1", "OPENAI_API_KEY": "test"}


def anthropic_env(server: ReplayServer) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "test"}


def session_of_text(stderr: str) -> str:
    """The session id `harness run` prints on stderr."""
    found = re.search(r"session (\S+)", stderr)
    assert found, stderr
    return found.group(1)


def session_of(run: subprocess.CompletedProcess[str]) -> str:
    return session_of_text(run.stderr)


# -- scripted replies (the recorded streams are the real input; these only end a run) -------------


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    chunk = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n"


def chat_text(*pieces: str | Hold) -> ReplayResponse:
    parts: list[str | Hold] = [chat_chunk({"role": "assistant", "content": ""})]
    parts += [chat_chunk({"content": p}) if isinstance(p, str) else p for p in pieces]
    return ReplayResponse.sse(*parts, chat_chunk({}, "stop"), "data: [DONE]\n\n")


def chat_tool_call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> ReplayResponse:
    function = {"name": name, "arguments": json.dumps(arguments)}
    call = {"index": 0, "id": call_id, "type": "function", "function": function}
    return ReplayResponse.sse(chat_chunk({"role": "assistant", "content": None, "tool_calls": [call]}),
                              chat_chunk({}, "tool_calls"), "data: [DONE]\n\n")


def anthropic_event(kind: str, **payload: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n"


def anthropic_text(text: str) -> ReplayResponse:
    message: dict[str, Any] = {
        "id": "msg_x", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}
    return ReplayResponse.sse(
        anthropic_event("message_start", message=message),
        anthropic_event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        anthropic_event("content_block_delta", index=0, delta={"type": "text_delta", "text": text}),
        anthropic_event("content_block_stop", index=0),
        anthropic_event("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None},
                        usage={"output_tokens": 5}),
        anthropic_event("message_stop"),
    )


# -- real recorded streams, end to end ------------------------------------------------------------


@needs_shared_fixtures
def test_run_on_an_openai_endpoint_answers_every_recorded_tool_call(home: Path, work: Path,
                                                                    server: ReplayServer) -> None:
    """The recorded gpt-4o reply calls add and multiply, which are not built-in tools: both get an
    error result, and the next request answers each call before anything else."""
    server.enqueue(ReplayResponse.from_file(OPENAI_TOOLS), chat_text("I cannot add or multiply here."))

    run = harness(home, work, "run", "Add and multiply 2 and 3", "--model", "openai/gpt-4o", env=openai_env(server))

    assert run.returncode == 0, run.stderr
    assert run.stdout == "I cannot add or multiply here.\n"
    assert "← add error" in run.stderr
    assert "← multiply error" in run.stderr
    first, second = (request.json() for request in server.requests)
    assert {tool["function"]["name"] for tool in first["tools"]} == {"read", "write", "edit", "list", "grep", "shell",
                                                                  "jobs", "delegate", "workflow"}
    assert second["messages"][-3]["tool_calls"][0]["id"] == "call_ehIWdjL1abZk1h8FWGLQ0Hie"
    calls = [call["id"] for call in second["messages"][-3]["tool_calls"]]
    answers = second["messages"][-2:]
    assert [answer["role"] for answer in answers] == ["tool", "tool"]
    assert [answer["tool_call_id"] for answer in answers] == calls
    assert all("not available" in json.dumps(answer["content"]) for answer in answers)
    model = ModelRegistry(BUILTIN_MODELS).model(ModelIdentity(provider="openai", model_id="gpt-4o"))
    assert problems("openai-chat", second, model) == []


@needs_shared_fixtures
def test_the_transcript_of_a_run_shows_the_prompt_the_calls_and_the_reply(home: Path, work: Path,
                                                                        server: ReplayServer) -> None:
    server.enqueue(ReplayResponse.from_file(OPENAI_TOOLS), chat_text("Done."))
    run = harness(home, work, "run", "Add and multiply 2 and 3", "--model", "openai/gpt-4o", env=openai_env(server))

    show = harness(home, work, "show", session_of(run))

    assert show.returncode == 0, show.stderr
    lines = [line.strip() for line in show.stdout.splitlines()]
    assert lines[0] == "Add and multiply 2 and 3 · lane main"  # issue 33: the name ran into the lane
    assert lines[1] == "user: Add and multiply 2 and 3"
    assert lines[2] == "assistant (openai/gpt-4o, tool_use)"
    assert lines[3].startswith('→ add {"a": 2, "b": 3}')
    assert lines[4].startswith('→ multiply {"a": 2, "b": 3}')
    assert lines[5].startswith("← add error: Tool 'add' is not available")
    assert lines[6].startswith("← multiply error: Tool 'multiply' is not available")
    assert lines[7:] == ["assistant (openai/gpt-4o, stop)", "Done."]


@needs_shared_fixtures
def test_run_on_an_anthropic_endpoint_answers_every_recorded_tool_call(home: Path, work: Path,
                                                                       server: ReplayServer) -> None:
    server.enqueue(ReplayResponse.from_file(ANTHROPIC_TOOLS), anthropic_text("Those tools are not here."))

    run = harness(home, work, "run", "Add and multiply 2 and 3", "--model", "anthropic/claude-sonnet-4-5",
                  env=anthropic_env(server))

    assert run.returncode == 0, run.stderr
    assert run.stdout == "I'll add and multiply the numbers 2 and 3 for you.\nThose tools are not here.\n"
    first, second = (request.json() for request in server.requests)
    assert [tool["name"] for tool in first["tools"]] == ["read", "write", "edit", "list", "grep", "shell", "jobs",
                                                         "delegate", "workflow"]
    calls = [block["id"] for block in second["messages"][-2]["content"] if block["type"] == "tool_use"]
    answers = second["messages"][-1]["content"]
    assert calls == ["toolu_01UYxUYC2zRPY8wiutnF48eP", "toolu_01VaRx1jpWCvPhi7L4kywAcd"]
    assert [(block["type"], block["tool_use_id"], block["is_error"]) for block in answers] == [
        ("tool_result", calls[0], True), ("tool_result", calls[1], True)]
    model = ModelRegistry(BUILTIN_MODELS).model(ModelIdentity(provider="anthropic", model_id="claude-sonnet-4-5"))
    assert problems("anthropic-messages", second, model) == []


@needs_shared_fixtures
def test_thinking_and_tool_calls_go_to_stderr_and_only_the_reply_to_stdout(home: Path, work: Path,
                                                                          server: ReplayServer) -> None:
    server.enqueue(ReplayResponse.from_file(STREAMS / "anthropic-thinking-tool.sse"), anthropic_text("No tool."))

    run = harness(home, work, "run", "Weather in Florence?", "--model", "anthropic/claude-sonnet-4-5",
                  env=anthropic_env(server))

    assert run.returncode == 0, run.stderr
    assert run.stdout == "No tool.\n"
    status = run.stderr.splitlines()
    assert status[1].startswith("The user is asking for weather information for Florence")
    assert status[1].endswith("to make the function call.")
    assert status[2] == "← weather error Tool 'weather' is not available; it was not run."


# -- output and exit codes ------------------------------------------------------------------------


@needs_shared_fixtures
def test_json_prints_every_event_as_one_parseable_line_and_nothing_else(home: Path, work: Path,
                                                                       server: ReplayServer) -> None:
    server.enqueue(ReplayResponse.from_file(OPENAI_TOOLS), chat_text("Done."))

    run = harness(home, work, "run", "Add and multiply 2 and 3", "--model", "openai/gpt-4o", "--json",
                  env=openai_env(server))

    assert run.returncode == 0, run.stderr
    session_line, events = json_lines(run.stdout)
    assert session_line == {"type": "session", "session_id": session_of(run), "lane": "main"}
    types = [event.type for event in events]
    assert types[0] == "run_start"  # a new conversation has its lane before the harness attaches
    assert types.count("run_start") == 1
    assert types.count("tool_end") == 2
    assert types[-1] == "run_end"
    end = events[-1]
    assert end.type == "run_end"
    assert end.result.outcome == "completed"
    for line in run.stdout.splitlines()[1:]:
        assert json.loads(line) == EVENTS.validate_json(line).model_dump(mode="json")


def test_a_failed_run_exits_1_and_says_why(home: Path, work: Path, server: ReplayServer) -> None:
    error = {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                       "code": "invalid_api_key"}}
    server.enqueue(ReplayResponse.json(error, status=401))

    run = harness(home, work, "run", "hello", "--model", "openai/gpt-4o", env=openai_env(server))

    assert run.returncode == 1
    assert "run failed" in run.stderr
    assert "Incorrect API key" in run.stderr


def test_ctrl_c_requests_a_durable_abort_and_exits_4_once_settled(home: Path, work: Path,
                                                                 server: ReplayServer) -> None:
    hold = Hold()
    server.enqueue(chat_text("Counting: one, ", hold, "two."))
    process = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "count", "--model", "openai/gpt-4o",
                                "--json"], cwd=work, env=environment(home, **openai_env(server)),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert hold.reached.wait(TIMEOUT_S), "the request never reached the hold"

        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        hold.release()
        if process.poll() is None:
            process.kill()

    assert process.returncode == 4, stderr
    events = [EVENTS.validate_json(line) for line in stdout.splitlines()[1:]]
    aborts = [event for event in events if event.type == "operation_abort"]
    assert len(aborts) == 1
    assert aborts[0].cause == "user"
    end = events[-1]
    assert end.type == "run_end"
    assert end.result.outcome == "aborted"
    assert end.result.abort_cause == "user"


def start_run(home: Path, work: Path, server: ReplayServer, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "run", *args, "--model", "openai/gpt-4o", "--json"],
                            cwd=work, env=environment(home, **openai_env(server)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def read_until(process: subprocess.Popen[str], event_type: str) -> list[str]:
    """The JSON lines `process` prints up to and including the first event of `event_type`."""
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if json.loads(line)["type"] == event_type:
            return lines
    raise AssertionError(f"the run ended without {event_type}")


def test_ctrl_c_during_a_shell_call_kills_it_and_settles_aborted(home: Path, work: Path,
                                                                 server: ReplayServer) -> None:
    server.enqueue(chat_tool_call("shell", {"command": "echo started; sleep 30"}))
    process = start_run(home, work, server, "wait", "--yes")
    try:
        before = read_until(process, "tool_update")  # the command is running and has printed

        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()

    assert process.returncode == 4, stderr
    events = [EVENTS.validate_json(line) for line in [*before[1:], *stdout.splitlines()]]
    ends = [event for event in events if event.type == "tool_end"]
    assert len(ends) == 1
    assert ends[0].result.is_error
    assert "cancelled" in "".join(b.text for b in ends[0].result.content if isinstance(b, TextContent))
    assert events[-1].type == "run_end"


def test_a_second_ctrl_c_leaves_at_once_and_the_run_stays_open(home: Path, work: Path,
                                                                server: ReplayServer) -> None:
    """The command ignores SIGTERM, so the abort waits out the kill grace; the second Ctrl-C does not."""
    server.enqueue(chat_tool_call("shell", {"command": "trap '' TERM; echo started; sleep 30"}))
    process = start_run(home, work, server, "wait", "--yes")
    try:
        read_until(process, "tool_update")
        process.send_signal(signal.SIGINT)
        read_until(process, "operation_abort")

        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()

    assert process.returncode == 130, stderr
    assert "stays open" in stderr
    exported = harness(home, work, "export", session_of_text(stderr))
    assert "has an open operation" in exported.stderr


def test_without_yes_a_write_is_refused_and_with_yes_it_runs(home: Path, work: Path, server: ReplayServer) -> None:
    write = {"path": "notes.txt", "content": "hello\n"}
    server.enqueue(chat_tool_call("write", write), chat_text("Could not."),
                   chat_tool_call("write", write), chat_text("Written."))

    refused = harness(home, work, "run", "write notes", "--model", "openai/gpt-4o", env=openai_env(server))
    refused_answer = server.requests[1].json()["messages"][-1]
    assert not (work / "notes.txt").exists()
    allowed = harness(home, work, "run", "write notes", "--model", "openai/gpt-4o", "--yes", env=openai_env(server))

    assert refused.returncode == 0, refused.stderr
    assert "needs approval" in refused_answer["content"]
    assert "--yes" in refused_answer["content"]
    assert allowed.returncode == 0, allowed.stderr
    assert (work / "notes.txt").read_text() == "hello\n"
    assert "← write ok" in allowed.stderr


def test_session_continues_a_conversation(home: Path, work: Path, server: ReplayServer) -> None:
    server.enqueue(chat_text("First answer."), chat_text("Second answer."))
    first = harness(home, work, "run", "first question", "--model", "openai/gpt-4o", env=openai_env(server))

    second = harness(home, work, "run", "second question", "--session", session_of(first), env=openai_env(server))

    assert second.returncode == 0, second.stderr
    assert session_of(second) == session_of(first)
    sent = [(m["role"], m["content"]) for m in server.requests[1].json()["messages"] if m["role"] != "system"]
    assert sent == [("user", "first question"), ("assistant", "First answer."), ("user", "second question")]


def conversation_rows(home: Path, session_id: str) -> list[ChatEventDetails]:
    """The chat-event rows on the conversation's branch, read from the home's store."""

    async def read() -> list[ChatEventDetails]:
        context = Context()
        store = await connect(f"sqlite:///{home / 'harness.db'}", context)
        try:
            page = await ConversationService(store).read_display(local_user(), session_id, context)
            return [row.details for row in page.rows if isinstance(row, EventRow)]
        finally:
            await store.close(context)

    return asyncio.run(read())


def test_run_goes_through_the_conversation_door(home: Path, work: Path, server: ReplayServer) -> None:
    """`harness run` acts as every door does: `--model` on an existing conversation is a recorded
    switch (CE-12), a failed turn prints the stored row's cleaned text, not the provider's raw body
    (CE-9), and an ended conversation takes no run (it used to accept one and call the model)."""
    server.enqueue(chat_text("First answer."),
                   ReplayResponse(400, "text/html", (b"<html><body><h1>400 Bad Request</h1></body></html>",)))
    first = harness(home, work, "run", "first question", "--model", "openai/gpt-4o", env=openai_env(server))
    session_id = session_of(first)

    failed = harness(home, work, "run", "again", "--session", session_id, "--model", "openai/gpt-4.1",
                     env=openai_env(server))

    assert failed.returncode == 1
    assert "<h1>" not in failed.stderr
    rows = conversation_rows(home, session_id)
    assert rows[0] == ModelSwitched(previous=ModelIdentity(provider="openai", model_id="gpt-4o"),
                                    model=ModelIdentity(provider="openai", model_id="gpt-4.1"))
    assert isinstance(rows[-1], ErrorDetails)
    assert f"run failed [assistant_error]: {rows[-1].text}" in failed.stderr

    async def end() -> None:
        context = Context()
        store = await connect(f"sqlite:///{home / 'harness.db'}", context)
        try:
            assert await ConversationService(store).end(local_user(), session_id, context) is True
        finally:
            await store.close(context)

    asyncio.run(end())
    ended = harness(home, work, "run", "are you there?", "--session", session_id, env=openai_env(server))

    assert ended.returncode == 1
    assert "conversation_ended" in ended.stderr
    assert len(server.requests) == 2


def test_no_tools_gives_a_new_lane_no_tools(home: Path, work: Path, server: ReplayServer) -> None:
    server.enqueue(chat_text("Plain answer."))

    run = harness(home, work, "run", "--no-tools", "question", "--model", "openai/gpt-4o", env=openai_env(server))

    assert run.returncode == 0, run.stderr
    assert "tools" not in server.requests[0].json()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_run_and_show_use_the_store_given_with_store(home: Path, work: Path, server: ReplayServer, tmp_path: Path,
                                                     request: pytest.FixtureRequest, kind: str) -> None:
    url = backend_url(kind, tmp_path, request, durable=True)
    server.enqueue(chat_text("Stored elsewhere."))

    run = harness(home, work, "run", "where?", "--model", "openai/gpt-4o", "--store", url, env=openai_env(server))
    show = harness(home, work, "show", session_of(run), "--store", url)

    assert run.returncode == 0, run.stderr
    assert show.stdout.splitlines()[-1] == "Stored elsewhere."
    assert not (home / "harness.db").exists()


def test_usage_errors_exit_as_typer_does(home: Path, work: Path) -> None:
    no_prompt = harness(home, work, "run")
    bad_model = harness(home, work, "run", "hi", "--model", "gpt-4o")

    assert no_prompt.returncode == 2
    assert bad_model.returncode == 2
    assert "provider/id" in bad_model.stderr


def test_a_lane_other_than_main_needs_an_existing_session(home: Path, work: Path, server: ReplayServer) -> None:
    """A conversation talks on lane `main`: `--lane` on a new session is a usage error that writes
    nothing (it made `main` and the lane asked for); on an existing session it makes that lane."""
    refused = harness(home, work, "run", "hi", "--lane", "side", "--model", "openai/gpt-4o", env=openai_env(server))
    nothing = harness(home, work, "sessions")
    server.enqueue(chat_text("On main."), chat_text("On the side."))
    first = harness(home, work, "run", "hi", "--model", "openai/gpt-4o", env=openai_env(server))
    side = harness(home, work, "run", "hi", "--session", session_of(first), "--lane", "side", env=openai_env(server))

    assert refused.returncode == 2
    assert "a new session talks on lane main; lane side can only be chosen in an existing session" in refused.stderr
    assert nothing.stdout == ""
    assert side.returncode == 0, side.stderr
    assert "On the side." in side.stdout


def test_a_model_that_cannot_run_is_refused_before_anything_is_written(home: Path, work: Path) -> None:
    unknown = harness(home, work, "run", "hi", "--model", "nowhere/no-such-model")
    keyless = harness(home, work, "run", "hi", "--model", "openai/gpt-4o")
    sessions = harness(home, work, "sessions")

    assert unknown.returncode == 1
    assert "model_unavailable" in unknown.stderr
    assert keyless.returncode == 1
    assert "missing_api_key" in keyless.stderr
    assert "OPENAI_API_KEY" in keyless.stderr
    assert sessions.stdout == ""


def test_a_prompt_on_stdin_over_the_input_bound_is_refused_without_reading_it_all(home: Path, work: Path) -> None:
    """Issue 11: `run -` read stdin whole before anything could refuse it. It reads one character
    past `MAX_INPUT_BYTES` and no further, and the run is refused with `prompt_too_large`."""
    refused = harness(home, work, "run", "-", stdin="a" * (3 * MAX_INPUT_BYTES))

    assert refused.returncode == 1
    assert f"error [prompt_too_large]: this prompt takes at least {MAX_INPUT_BYTES + 1:,} bytes" in refused.stderr


def test_the_embedded_model_answers_offline(home: Path, work: Path) -> None:
    """No key and no network configured: the default is the embedded model (as `make run` uses
    it when no terminal is attached: one question, no tools)."""
    run = harness(home, work, "run", "--no-tools", "What is the capital of France? Answer in one sentence.",
                  timeout=EMBEDDED_TIMEOUT_S)

    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    show = harness(home, work, "show", session_of(run))
    assert "assistant (embedded/smollm2-135m" in show.stdout


async def test_the_no_tools_hint_names_runs_flag_and_only_when_a_turn_starts(home: Path, work: Path) -> None:
    """Issue 33: `run` on the tiny embedded model told the person to type `/tools on`, the chat's
    command, and said so before `--resume` found nothing to resume. It names `--tools`, once a turn
    starts. In process, the embedded model's api served by the faux provider (no weights run)."""
    context = Context()
    store = await connect("memory://", context)
    registry = ModelRegistry(providers={"embedded": FauxProvider(["Hello."])})
    said, resumed = io.StringIO(), io.StringIO()

    code = await run_turn(store, RunTurn(prompt="hi", cwd=work, home=home), registry, context, out=io.StringIO(),
                          status=Console(file=said, width=200))
    [session_id] = re.findall(r"session (\S+)", said.getvalue())
    with pytest.raises(NothingToResume):
        await run_turn(store, RunTurn(prompt=None, cwd=work, home=home, session_id=session_id, resume=True),
                       registry, context, out=io.StringIO(), status=Console(file=resumed, width=200))

    assert code == 0
    assert ("the tiny embedded model is offered no tools: --tools gives them, and so does a switch to a real model "
            "(--model)") in said.getvalue()
    assert "offered no tools" not in resumed.getvalue()


# -- models and doctor ------------------------------------------------------------------------------


def test_models_lists_identity_api_window_and_missing_keys(home: Path, work: Path, server: ReplayServer) -> None:
    (home / "models.toml").write_text('[providers.groq]\n[[providers.groq.models]]\nid = "llama-3.3-70b"\n')

    listed = harness(home, work, "models", env={"OPENAI_API_KEY": "set", "OPENAI_BASE_URL": f"{server.base_url}/v1"})

    assert listed.returncode == 0, listed.stderr
    rows = {line[2:].split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert rows["groq/llama-3.3-70b"].split()[1:] == ["openai-chat", "128,000", "missing", "GROQ_API_KEY"]
    assert rows["anthropic/claude-sonnet-4-5"].split()[-2:] == ["missing", "ANTHROPIC_API_KEY"]
    assert rows["openai/gpt-4o"].split()[-2:] == ["key", "OPENAI_API_KEY"]
    assert rows["embedded/smollm2-135m"].split()[1:] == ["embedded", "4,096", "ready"]
    assert [line for line in listed.stdout.splitlines() if line.startswith("*")] == [rows["openai/gpt-5"]]


# -- any OpenAI-compatible server, in one step ------------------------------------------------------


@pytest.fixture
def local_server() -> Iterator[ReplayServer]:
    """An OpenAI-compatible server as a local one is: it lists its models and takes no key."""
    with ReplayServer(models=["stub-small", "stub-large"]) as replay:
        yield replay


def test_openai_base_url_alone_runs_on_the_model_its_server_lists(home: Path, work: Path,
                                                                 local_server: ReplayServer) -> None:
    """Issue 33: with only OPENAI_BASE_URL set the run goes to that server, on the first model it
    lists, with no key; the journal names that model, not the embedded one or openai/gpt-5."""
    local_server.enqueue(chat_text("Hello from the stub."))

    run = harness(home, work, "run", "--no-tools", "hi", env={"OPENAI_BASE_URL": f"{local_server.base_url}/v1"})

    assert run.returncode == 0, run.stderr
    assert run.stdout == "Hello from the stub.\n"
    (request,) = local_server.requests
    assert (request.path, request.json()["model"]) == ("/v1/chat/completions", "stub-small")
    show = harness(home, work, "show", session_of(run))
    assert "assistant (openai/stub-small" in show.stdout


def test_a_model_the_server_serves_is_named_with_openai_and_needs_no_key(home: Path, work: Path,
                                                                         local_server: ReplayServer) -> None:
    """`--model openai/NAME` takes any name: it is sent as is, without a key, with default limits."""
    local_server.enqueue(chat_text("Large."))

    run = harness(home, work, "run", "--no-tools", "hi", "--model", "openai/any-name",
                  env={"OPENAI_BASE_URL": f"{local_server.base_url}/v1"})

    assert run.returncode == 0, run.stderr
    assert [request.json()["model"] for request in local_server.requests] == ["any-name"]
    assert "openai/any-name is not a listed model: using default limits" in run.stderr


def test_a_key_that_is_set_is_sent_to_the_server(home: Path, work: Path, local_server: ReplayServer) -> None:
    local_server.enqueue(chat_text("Keyed."))

    run = harness(home, work, "run", "--no-tools", "hi",
                  env={"OPENAI_BASE_URL": f"{local_server.base_url}/v1", "OPENAI_API_KEY": "sk-local"})

    assert run.returncode == 0, run.stderr
    (request,) = local_server.requests
    assert request.headers["authorization"] == "Bearer sk-local"
    assert request.json()["model"] == "stub-small"


def test_models_lists_what_the_server_serves_with_its_default(home: Path, work: Path,
                                                              local_server: ReplayServer) -> None:
    url = f"{local_server.base_url}/v1"

    listed = harness(home, work, "models", env={"OPENAI_BASE_URL": url})

    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    served = lines.index(f"# served at {url} (2 models)")
    assert lines[served + 1:served + 3] == ["* openai/stub-small", "  openai/stub-large"]
    assert not [line for line in lines[:served] if line.startswith("*")]


def test_openai_base_url_with_no_server_is_refused_not_replaced(home: Path, work: Path) -> None:
    """A server that is not there is said so; the run does not quietly fall back to the embedded model."""
    with ReplayServer() as gone:
        url = f"{gone.base_url}/v1"

    run = harness(home, work, "run", "hi", env={"OPENAI_BASE_URL": url})
    sessions = harness(home, work, "sessions")

    assert run.returncode == 1
    assert "model_unavailable" in run.stderr
    assert url in run.stderr
    assert "--model openai/NAME" in run.stderr
    assert sessions.stdout == ""


def test_models_refuses_a_broken_models_file(home: Path, work: Path) -> None:
    (home / "models.toml").write_text("[providers.nowhere]\n")

    listed = harness(home, work, "models")

    assert listed.returncode == 1
    assert "models_file_invalid" in listed.stderr


def test_doctor_checks_store_models_and_embedded_model(home: Path, work: Path) -> None:
    checked = harness(home, work, "doctor", timeout=EMBEDDED_TIMEOUT_S)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    names = [line.split(":")[0].split(None, 1)[1] for line in lines]
    assert names == ["store", "store write", "models.toml", "api keys", "default model", "embedded runtime",
                     "embedded weights", "embedded generation"]
    assert all(not line.startswith("fail") for line in lines)
    again = harness(home, work, "doctor", timeout=EMBEDDED_TIMEOUT_S)
    assert again.returncode == 0
    assert harness(home, work, "sessions").stdout == ""  # the scratch session is deleted again


def test_doctor_exits_non_zero_on_a_failed_check(home: Path, work: Path) -> None:
    (home / "models.toml").write_text("not toml [")

    checked = harness(home, work, "doctor")

    assert checked.returncode == 1
    assert any(line.startswith("fail  models.toml") for line in checked.stdout.splitlines())


def test_the_chat_and_run_start_without_the_sdks_of_what_they_may_never_call() -> None:
    """Issue 33: the provider SDKs load at a model's first request and the MCP SDK at a server's
    first connection; each took around a second of every chat's and run's start (and every test's).
    Gardens load at the first `/goal`, httpx where `harness models` and `doctor` ask servers, and
    jsonschema (with referencing and attrs, about 0.1 s) at the first tool call or output schema
    checked."""
    sdks = {"openai", "anthropic", "llama_cpp", "mcp", "harness.garden", "httpx", "jsonschema"}
    probe = (f"import sys, harness.cli.chat, harness.cli.chat_commands, harness.cli.run; "
             f"print(sorted({sdks!r} & set(sys.modules)))")

    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)

    assert loaded.stdout.strip() == "[]"


def test_version_is_answered_before_the_application_loads() -> None:
    """Issue 33: `harness --version` imports neither typer nor pydantic nor any command, so it
    starts in about two bare Python starts rather than thirty."""
    probe = ("import sys; sys.argv = ['harness', '--version']; from harness.__main__ import main; main(); "
             "print(sorted({'typer', 'click', 'pydantic', 'harness.cli'} & set(sys.modules)))")

    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)

    assert shown.stdout == f"harness {harness_version}\n[]\n"


def test_a_command_starts_without_what_only_other_commands_run() -> None:
    """Every test and every user pays each command's start-up: registering the commands imports
    none of what they run, so only `harness serve` loads FastAPI and uvicorn, only the chat
    prompt_toolkit, a command that lists sessions no runtime, tools, gardens or importers, and none
    the provider SDKs (issue 33: the openai SDK alone took 0.9 s of every start)."""
    heavy = {"fastapi", "uvicorn", "starlette", "prompt_toolkit", "httpx", "harness.conversation", "harness.runtime",
             "harness.tools", "harness.garden", "harness.imports", "harness.worker", "harness.server",
             "openai", "anthropic", "llama_cpp", "mcp"}
    probe = f"import sys, harness.cli; print(sorted({heavy!r} & set(sys.modules)))"

    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)

    assert loaded.stdout.strip() == "[]"
