"""What `harness run`, `harness models` and `harness doctor` promise a script: exit codes, the session
id in `--json` output, `--no-tools` and `--resume` on an existing session, model ids outside the
built-in list, servers that speak only Chat Completions, and models that cannot be reached. Real
subprocesses against the replay server, as in test_cli_run.py."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import test_cli_run
from harness.cli.config import RETRY_DELAY_VARIABLE, client_setup, drive_settings, tool_workspace
from harness.conversation import ExecutionTarget
from harness.errors import InvalidInput
from harness.providers import FAUX_MODEL, ModelRegistry
from harness.providers.replay import Hold, ReplayResponse, ReplayServer
from harness.runtime import DriveSettings
from harness.tools import ApprovalPolicy, BackgroundJobs
from test_cli_run import (
    EMBEDDED_TIMEOUT_S,
    TIMEOUT_S,
    chat_text,
    environment,
    harness,
    json_lines,
    openai_env,
    session_of,
)

home, work, server = test_cli_run.home, test_cli_run.work, test_cli_run.server  # the same fixtures


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on: bound and held, not listening, for the test's length, so
    a connection to it is refused and no server of another test (another xdist worker) takes it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port: int = held.getsockname()[1]
        yield port


def readme_models_toml(home: Path, port: int) -> None:
    """The `models.toml` example of docs/models.md, its Ollama moved to a port nothing listens on."""
    (home / "models.toml").write_text(f"""
[providers.ollama]
base_url = "http://127.0.0.1:{port}/v1"
[[providers.ollama.models]]
id = "qwen2.5:7b"
context_window = 32768

[providers.embedded]
[[providers.embedded.models]]
id = "qwen2.5-7b"
path = "/models/qwen2.5-7b-instruct-q4_k_m.gguf"
""")


# -- item 8: declared models do not take over, and say when they cannot be reached ------------------


def test_declaring_providers_keeps_the_default_and_models_says_what_is_missing(home: Path, work: Path,
                                                                                closed_port: int) -> None:
    readme_models_toml(home, closed_port)

    listed = harness(home, work, "models")

    assert listed.returncode == 0, listed.stderr
    rows = {line[2:].split()[0]: line for line in listed.stdout.splitlines() if not line.startswith("#")}
    assert [line for line in rows.values() if line.startswith("*")] == [rows["embedded/smollm2-135m"]]
    assert f"no answer from http://127.0.0.1:{closed_port}/v1" in rows["ollama/qwen2.5:7b"]
    assert "no file at /models/qwen2.5-7b-instruct-q4_k_m.gguf" in rows["embedded/qwen2.5-7b"]
    assert rows["embedded/smollm2-135m"].endswith("ready")


def test_models_toml_default_picks_the_default_model(home: Path, work: Path, server: ReplayServer) -> None:
    (home / "models.toml").write_text(f"""
default = "box/small"
[providers.box]
preset = "vllm"
base_url = "{server.base_url}/v1"
[[providers.box.models]]
id = "small"
""")
    listed = harness(home, work, "models")  # its GET of the server is answered from the empty queue
    server.enqueue(chat_text("From the box."))
    run = harness(home, work, "run", "hello")

    starred = [line for line in listed.stdout.splitlines() if line.startswith("*")]
    assert [line.split()[1:] for line in starred] == [["box/small", "openai-chat", "128,000", "ready"]]
    assert run.returncode == 0, run.stderr
    assert run.stdout == "From the box.\n"


def test_doctor_fails_on_a_declared_model_that_cannot_be_used(home: Path, work: Path, closed_port: int) -> None:
    readme_models_toml(home, closed_port)

    checked = harness(home, work, "doctor", timeout=EMBEDDED_TIMEOUT_S)

    assert checked.returncode == 1, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert any(line.startswith("ok    default model: embedded/smollm2-135m") for line in lines), lines
    assert any(line.startswith("fail  model ollama/qwen2.5:7b") and f"127.0.0.1:{closed_port}" in line
               for line in lines)
    assert any(line.startswith("fail  model embedded/qwen2.5-7b") and "no file at /models/" in line
               for line in lines)


def test_a_server_nobody_answers_fails_the_run_naming_its_url_once_per_attempt(home: Path, work: Path,
                                                                               closed_port: int) -> None:
    readme_models_toml(home, closed_port)

    # The attempts, not the backoff between them (1 s, 2 s, 4 s by default), are what is tested.
    run = harness(home, work, "run", "--model", "ollama/qwen2.5:7b", "hello", env={RETRY_DELAY_VARIABLE: "0"})

    assert run.returncode == 1
    url = f"http://127.0.0.1:{closed_port}/v1/chat/completions"
    mentions = [line for line in run.stderr.splitlines() if url in line]
    assert [line.split(":")[0] for line in mentions] == [
        "retrying (attempt 2 of 4)", "retrying (attempt 3 of 4)", "retrying (attempt 4 of 4)",
        "run failed [assistant_error]"]
    assert all(f"cannot connect to {url}" in line for line in mentions)


def test_the_retry_delay_comes_from_the_environment_in_whole_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert drive_settings().retry == DriveSettings().retry
    monkeypatch.setenv(RETRY_DELAY_VARIABLE, "250")
    assert drive_settings().retry == replace(DriveSettings().retry, base_delay_ms=250)
    monkeypatch.setenv(RETRY_DELAY_VARIABLE, "soon")
    with pytest.raises(InvalidInput, match=RETRY_DELAY_VARIABLE):
        drive_settings()


def test_a_clients_approval_hook_decides_only_the_calls_its_policy_would_ask_about(tmp_path: Path) -> None:
    # The others start with the reply that made them, one commit fewer (issue 12).
    approval = ApprovalPolicy(None)
    setup = client_setup(ModelRegistry([FAUX_MODEL]), tool_workspace(tmp_path, tmp_path), tmp_path, approval,
                         BackgroundJobs())
    decides = setup.hooks.before_tool_applies
    assert setup.hooks.before_tool is approval
    assert decides is not None
    assert setup.tools_for is not None
    tools = {tool.name: tool for tool in setup.tools_for(ExecutionTarget("c-1", None, tmp_path))}
    assert [name for name, tool in tools.items() if decides(tool)] == ["write", "edit", "shell"]
    approval.allow_for_session("shell")
    assert not decides(tools["shell"])


def test_a_missing_weights_file_is_refused_before_anything_is_written(home: Path, work: Path,
                                                                      closed_port: int) -> None:
    readme_models_toml(home, closed_port)

    run = harness(home, work, "run", "--model", "embedded/qwen2.5-7b", "hello")

    assert run.returncode == 1
    assert "model_unavailable" in run.stderr
    assert "no file at /models/qwen2.5-7b-instruct-q4_k_m.gguf" in run.stderr
    assert harness(home, work, "sessions").stdout == ""


# -- item 10: the contract with scripts ------------------------------------------------------------


def test_json_output_starts_with_the_session_id(home: Path, work: Path, server: ReplayServer) -> None:
    server.enqueue(chat_text("Done."))

    run = harness(home, work, "run", "--json", "hi", "--model", "openai/gpt-4o", env=openai_env(server))

    assert run.returncode == 0, run.stderr
    first, events = json_lines(run.stdout)
    assert first == {"type": "session", "session_id": session_of(run), "lane": "main"}
    assert events[0].type == "run_start"  # a new conversation has its lane before the harness attaches
    assert events[-1].type == "run_end"


def test_an_aborted_run_exits_4_not_the_usage_error_status(home: Path, work: Path, server: ReplayServer) -> None:
    hold = Hold()
    server.enqueue(chat_text("one, ", hold, "two."))
    process = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "count", "--model", "openai/gpt-4o"],
                               cwd=work, env=environment(home, **openai_env(server)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert hold.reached.wait(TIMEOUT_S), "the request never reached the hold"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        hold.release()
        if process.poll() is None:
            process.kill()
    usage = harness(home, work, "run", "--no-such-option", "hi")

    assert process.returncode == 4, stderr
    assert "run aborted (user)" in stderr
    assert usage.returncode == 2
    assert "4 aborted" in harness(home, work, "run", "--help").stdout


def test_no_tools_on_a_session_with_tools_is_a_usage_error_and_writes_nothing(home: Path, work: Path,
                                                                              server: ReplayServer) -> None:
    server.enqueue(chat_text("With tools."))
    first = harness(home, work, "run", "hi", "--model", "openai/gpt-4o", env=openai_env(server))
    before = harness(home, work, "export", session_of(first)).stdout

    refused = harness(home, work, "run", "--no-tools", "--session", session_of(first), "again",
                      env=openai_env(server))

    assert refused.returncode == 2
    assert "already has tools" in refused.stderr
    assert len(server.requests) == 1
    assert harness(home, work, "export", session_of(first)).stdout == before


def test_no_tools_on_a_session_without_tools_keeps_it_without(home: Path, work: Path, server: ReplayServer) -> None:
    server.enqueue(chat_text("Plain."), chat_text("Still plain."))
    first = harness(home, work, "run", "--no-tools", "hi", "--model", "openai/gpt-4o", env=openai_env(server))

    second = harness(home, work, "run", "--no-tools", "--session", session_of(first), "again",
                     env=openai_env(server))

    assert second.returncode == 0, second.stderr
    assert "tools" not in server.requests[1].json()


def test_a_run_left_open_is_named_with_resume_and_resume_finishes_it(home: Path, work: Path,
                                                                    server: ReplayServer) -> None:
    hold = Hold()
    server.enqueue(chat_text("Cut ", hold, "off."))
    process = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "first", "--model", "openai/gpt-4o"],
                               cwd=work, env=environment(home, **openai_env(server)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert hold.reached.wait(TIMEOUT_S), "the request never reached the hold"
        process.kill()  # the run stays open in the journal
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        hold.release()
    session = session_of(subprocess.CompletedProcess([], 0, "", stderr))

    busy = harness(home, work, "run", "--session", session, "second", env=openai_env(server))
    server.enqueue(chat_text("First answer."), chat_text("Second answer."))
    resumed = harness(home, work, "run", "--session", session, "--resume", "second", env=openai_env(server))

    assert busy.returncode == 1
    assert "lane_busy" in busy.stderr
    assert f"harness run --session {session} --resume" in busy.stderr
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "First answer.\nSecond answer.\n"
    last = [(m["role"], m["content"]) for m in server.requests[-1].json()["messages"] if m["role"] != "system"]
    assert last == [("user", "first"), ("assistant", "First answer."), ("user", "second")]


def test_resume_needs_a_session_and_an_open_operation_or_a_prompt(home: Path, work: Path,
                                                                  server: ReplayServer) -> None:
    server.enqueue(chat_text("Done."))
    first = harness(home, work, "run", "hi", "--model", "openai/gpt-4o", env=openai_env(server))

    no_session = harness(home, work, "run", "--resume")
    nothing = harness(home, work, "run", "--session", session_of(first), "--resume", env=openai_env(server))

    assert no_session.returncode == 2
    assert "--resume needs --session" in no_session.stderr
    assert nothing.returncode == 1
    assert "nothing_to_resume" in nothing.stderr


def test_an_unlisted_openai_model_runs_with_default_limits(home: Path, work: Path, server: ReplayServer) -> None:
    server.enqueue(chat_text("Hello from a new model."))

    run = harness(home, work, "run", "hi", "--model", "openai/gpt-9-preview", env=openai_env(server))
    unknown = harness(home, work, "run", "hi", "--model", "nowhere/some-model")

    assert run.returncode == 0, run.stderr
    assert run.stdout == "Hello from a new model.\n"
    assert "openai/gpt-9-preview is not a listed model: using default limits" in run.stderr
    assert server.requests[0].json()["model"] == "gpt-9-preview"
    assert unknown.returncode == 1
    assert "model_unavailable" in unknown.stderr
    assert "[providers.nowhere]" in unknown.stderr


def test_with_openai_base_url_the_default_model_speaks_chat_completions(home: Path, work: Path,
                                                                       server: ReplayServer) -> None:
    server.enqueue(chat_text("Chat only here."))

    run = harness(home, work, "run", "hi", env=openai_env(server))

    assert run.returncode == 0, run.stderr
    assert run.stdout == "Chat only here.\n"
    assert [request.path for request in server.requests] == ["/v1/chat/completions"]


def test_a_server_without_the_responses_api_is_named_as_such(home: Path, work: Path, server: ReplayServer) -> None:
    (home / "models.toml").write_text('[providers.openai]\napi = "openai-responses"\n')
    not_found = {"error": {"message": "Not Found", "type": "not_found_error"}}
    server.enqueue(chat_text("A chat stream, on any path."), ReplayResponse.json(not_found, status=404))

    chat_stream = harness(home, work, "run", "hi", "--model", "openai/gpt-5", env=openai_env(server))
    missing = harness(home, work, "run", "hi", "--model", "openai/gpt-5", env=openai_env(server))

    assert [request.path for request in server.requests] == ["/v1/responses", "/v1/responses"]
    for run in (chat_stream, missing):
        assert run.returncode == 1
        assert "this server does not offer the Responses API" in run.stderr
        assert 'api = "openai-chat"' in run.stderr
    assert "404" in missing.stderr
