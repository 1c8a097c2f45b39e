"""MCP servers' tools (issue 30): a real server written with the SDK (`mcp_server.py`), reached over
stdio and over streamable HTTP through `McpServers` and the client setup every door uses; its
tools offered as `mcp__test__<tool>`, replayed after a crash only where the server says they are
read-only or idempotent; a server that dies, hangs or is slow to start costs a tool error or
nothing, never a wedged turn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue
from typer.testing import CliRunner

from drive_helpers import within
from harness.cli import app
from harness.context import Context
from harness.conversation import Conversation
from harness.messages import TextContent, ToolResultMessage
from harness.providers import FauxProvider
from harness.providers.faux import FauxScript, delay, reply, tool_call
from harness.runtime import Settled
from harness.session import Store, connect
from harness.tools import ApprovalPolicy, McpServers, PermissionRules, load_mcp_servers
from harness.tools.permissions import load_mcp_trust, parse_rule, trust_mcp_server
from mcp_child import CONFIG, OWNER, mcp_service

TESTS = Path(__file__).resolve().parent
SERVER = TESTS / "mcp_server.py"
CHILD = TESTS / "mcp_child.py"
PROCESS_TIMEOUT_S = 60.0  # a guard against a process that never answers, never a wait


@pytest.fixture
async def store(tmp_path: Path, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(f"sqlite:///{tmp_path / 'harness.db'}", ctx)
    try:
        yield opened
    finally:
        await opened.close()


def stdio_entry(ledger: Path, **more: JsonValue) -> dict[str, JsonValue]:
    return {"command": sys.executable, "args": [str(SERVER), "stdio", str(ledger)], **more}


def project_with(tmp_path: Path, servers: dict[str, Any], *, trusted: bool = True) -> Path:
    """A project directory whose `.mcp.json` declares `servers`, which the user whose harness
    home is `tmp_path` trusts (`harness mcp trust`) unless not `trusted`."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    for name in servers if trusted else ():
        trust_mcp_server(tmp_path, name)
    return project


@asynccontextmanager
async def http_server(ledger: Path, port: int = 0) -> AsyncIterator[str]:
    """`mcp_server.py` serving streamable HTTP in a process of its own (on `port`, a free one if
    0); its endpoint's URL."""
    process = await asyncio.create_subprocess_exec(sys.executable, str(SERVER), "http", str(ledger), str(port),
                                                   stdout=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        port = int(await within(process.stdout.readline(), PROCESS_TIMEOUT_S))
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        with contextlib.suppress(ProcessLookupError):  # a test's `die` may have ended it
            process.kill()
        await process.wait()


@asynccontextmanager
async def connected(project: Path, home: Path) -> AsyncIterator[McpServers]:
    servers = McpServers.from_files(project, home)
    servers.start()
    try:
        await within(servers.ready(), PROCESS_TIMEOUT_S)
        yield servers
    finally:
        await servers.close()


async def turn(store: Store, servers: McpServers, script: FauxScript, home: Path, ctx: Context, *,
               approval: ApprovalPolicy | None = None) -> tuple[Conversation, FauxProvider, Settled]:
    """One turn of a new conversation offered `servers`' tools, on the faux model playing `script`
    (every call allowed unless `approval` says otherwise)."""
    service, faux = mcp_service(store, servers, script, home, approval)
    conversation = await service.create(OWNER, CONFIG, ctx)
    outcome = await within(conversation.send("go", ctx), PROCESS_TIMEOUT_S)
    assert isinstance(outcome, Settled), outcome
    await service.close_all(ctx)
    return conversation, faux, outcome


def tool_result(faux: FauxProvider, request: int) -> ToolResultMessage:
    """The tool result the `request`th request (from 0) ends with."""
    message = faux.requests[request].request.messages[-1]
    assert isinstance(message, ToolResultMessage), message
    return message


def text(message: ToolResultMessage) -> str:
    return "".join(block.text for block in message.content if isinstance(block, TextContent))


@asynccontextmanager
async def server_entry(kind: str, ledger: Path) -> AsyncIterator[dict[str, JsonValue]]:
    """The `.mcp.json` entry of `mcp_server.py` reached over `kind`."""
    if kind == "stdio":
        yield stdio_entry(ledger)
        return
    async with http_server(ledger) as url:
        yield {"type": "http", "url": url}


@pytest.mark.parametrize("kind", ["stdio", "http"])
async def test_the_model_calls_a_server_tool_and_reads_its_result(kind: str, store: Store, tmp_path: Path,
                                                                  ctx: Context) -> None:
    """The model is offered the server's tools under their prefixed names; its call reaches the
    server, and the result is in the next request."""
    ledger = tmp_path / "ledger.log"
    async with server_entry(kind, ledger) as entry, connected(project_with(tmp_path, {"test": entry}),
                                                                tmp_path) as servers:
        _, faux, _ = await turn(store, servers, [reply(tool_call("mcp__test__echo", {"text": "hi"})), "said"],
                                tmp_path, ctx)

    offered = {tool.name for tool in faux.requests[0].request.tools}
    assert {"mcp__test__echo", "mcp__test__ledger", "mcp__test__hang"} <= offered
    assert text(tool_result(faux, 1)) == "echo: hi"
    assert not tool_result(faux, 1).is_error


@pytest.mark.parametrize("kind", ["stdio", "http"])
async def test_a_tool_list_change_during_a_turn_lands_at_the_next_step(kind: str, store: Store, tmp_path: Path,
                                                                       ctx: Context) -> None:
    """Issue 30 item 1: the server's `grow` adds `fresh` and announces it on its listen stream, which
    may arrive after `grow`'s result; the first step after the new list arrived offers `fresh`, and
    the model's call reaches it. `shrink` removes it: the first step after that list arrived no
    longer offers it. The model's replies wait for `on_change`, never a sleep."""
    async with server_entry(kind, tmp_path / "ledger.log") as entry, \
            connected(project_with(tmp_path, {"test": entry}), tmp_path) as servers:
        grown, shrunk = asyncio.Event(), asyncio.Event()

        def changed() -> None:
            if "mcp__test__fresh" in servers.tools:
                grown.set()
            elif grown.is_set():
                shrunk.set()

        servers.on_change(changed)
        script: FauxScript = [reply(tool_call("mcp__test__grow")),
                              reply(delay(grown), tool_call("mcp__test__echo", {"text": "after grow"})),
                              reply(tool_call("mcp__test__fresh")),
                              reply(tool_call("mcp__test__shrink")),
                              reply(delay(shrunk), tool_call("mcp__test__echo", {"text": "after shrink"})),
                              "done"]
        _, faux, outcome = await turn(store, servers, script, tmp_path, ctx)

    offered = [{tool.name for tool in record.request.tools} for record in faux.requests]
    assert outcome.result.outcome == "completed"
    assert len(offered) == 6
    assert "mcp__test__fresh" not in offered[0]
    assert "mcp__test__fresh" in offered[2]  # the step after the list with it arrived (in 1 if it came early)
    assert text(tool_result(faux, 3)) == "fresh!"
    assert "mcp__test__fresh" not in offered[5]  # the step after the list without it arrived
    assert {"mcp__test__echo", "mcp__test__grow", "mcp__test__shrink"} <= offered[5]


async def test_an_http_server_down_at_the_start_is_tried_again_at_a_step_boundary(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """Issue 30: an HTTP server nobody listens for yet fails to connect and offers nothing; once
    it is up, a step boundary starts it again (its backoff is 0 s here) without waiting for it,
    its tools join, and the model's call reaches it."""
    with socket.socket() as probe:  # a port nobody listens on, until the server takes it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    project = project_with(tmp_path, {"test": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"}})
    servers = McpServers(load_mcp_servers(project, tmp_path), retry_first_s=0)
    servers.start()
    try:
        await within(servers.ready(), PROCESS_TIMEOUT_S)
        [down] = servers.statuses()
        joined = asyncio.Event()
        servers.on_change(lambda: joined.set() if "mcp__test__echo" in servers.tools else None)
        async with http_server(tmp_path / "ledger.log", port):
            script: FauxScript = [reply(tool_call("mcp__test__echo", {"text": "too early"})),
                                  reply(delay(joined), tool_call("mcp__test__echo", {"text": "hi"})), "said"]
            _, faux, outcome = await turn(store, servers, script, tmp_path, ctx)
            [up] = servers.statuses()
    finally:
        await servers.close()

    assert (down.state, down.tools) == ("failed", ())
    assert outcome.result.outcome == "completed"
    assert tool_result(faux, 1).is_error  # no such tool while it was down
    assert "mcp__test__echo" in {tool.name for tool in faux.requests[2].request.tools}
    assert text(tool_result(faux, 2)) == "echo: hi"
    assert up.state == "connected"


async def test_replay_safety_and_asking_first_are_what_the_annotations_say(tmp_path: Path) -> None:
    """A read-only (`echo`) or idempotent (`fresh`, once added) tool is replay-safe; one with no
    hints (`ledger`) is never replayed. Only the read-only one runs without asking first
    (`AgentTool.asks_first`, issue 30)."""
    async with connected(project_with(tmp_path, {"test": stdio_entry(tmp_path / "ledger.log")}),
                         tmp_path) as servers:
        declared = {tool.name: (tool.replay, tool.asks_first) for tool in servers.tools.values()}

    assert declared["mcp__test__echo"] == ("safe", False)
    assert declared["mcp__test__ledger"] == ("never", True)
    assert declared["mcp__test__die"] == ("never", True)


@pytest.mark.parametrize(("rules", "ledger_runs"), [([], False), (["mcp__test__*"], True),
                                                    (["mcp__test__ledger"], True), (["mcp__other__*"], False)])
async def test_a_tool_not_marked_read_only_asks_first_unless_a_rule_allows_it(
        rules: list[str], ledger_runs: bool, store: Store, tmp_path: Path, ctx: Context) -> None:
    """`ledger` (no hints) asks before it runs, as write and shell do: with nobody to ask it is
    refused, and its server never sees the call; `echo` (read-only) runs; an allow rule naming the
    tool or its server's pattern lets `ledger` run."""
    ledger = tmp_path / "ledger.log"
    ledger.write_text("first\n")  # the tool kills its caller on the ledger's first line only
    allowed = PermissionRules([parse_rule(text, "allow", "test", tmp_path) for text in rules])
    async with connected(project_with(tmp_path, {"test": stdio_entry(ledger)}), tmp_path) as servers:
        approval = ApprovalPolicy(None, rules=allowed)
        script: FauxScript = [reply(tool_call("mcp__test__echo", {"text": "hi"}),
                                    tool_call("mcp__test__ledger", {"key": "k"})), "done"]
        _, faux, _ = await turn(store, servers, script, tmp_path, ctx, approval=approval)

    results = faux.requests[1].request.messages[-2:]
    assert [(message.tool_name, message.is_error) for message in results if isinstance(message, ToolResultMessage)] \
        == [("mcp__test__echo", False), ("mcp__test__ledger", not ledger_runs)]
    assert ("ledger k" in ledger.read_text()) is ledger_runs


async def test_a_crash_during_a_never_replay_call_is_answered_as_interrupted_and_not_repeated(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """The harness process is SIGKILLed while the server runs its `ledger` call; the next process
    resumes the run: the call is answered as interrupted, effect unknown, and the server never
    sees it again."""
    ledger = tmp_path / "ledger.log"
    project = project_with(tmp_path, {"test": stdio_entry(ledger)})
    store_url = f"sqlite:///{tmp_path / 'harness.db'}"
    child = await asyncio.create_subprocess_exec(sys.executable, str(CHILD), store_url, str(project), str(tmp_path),
                                                 stdout=asyncio.subprocess.PIPE)
    output, _ = await within(child.communicate(), PROCESS_TIMEOUT_S)
    assert child.returncode == -signal.SIGKILL, "the child was not killed during the call"
    conversation_id = output.decode().strip()

    async with connected(project, tmp_path) as servers:
        service, faux = mcp_service(store, servers, ["after the crash"], tmp_path)
        conversation = await service.open(OWNER, conversation_id, ctx)
        [operation] = conversation.open_operations
        outcome = await within(conversation.drive(operation.operation_id, ctx), PROCESS_TIMEOUT_S)
        await service.close_all(ctx)

    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    assert ledger.read_text().splitlines() == ["ledger k1"]
    assert text(tool_result(faux, 0)).startswith("The tool was interrupted before it reported a result")


@pytest.mark.parametrize(("kind", "next_call"), [
    ("stdio", "echo: again"),  # a process of ours: the next call starts it again
    ("http", "MCP server test is not available"),  # running elsewhere: nobody starts it, the call says so
])
async def test_a_server_killed_mid_call_settles_the_turn_with_a_tool_error(kind: str, next_call: str, store: Store,
                                                                         tmp_path: Path, ctx: Context) -> None:
    """The server dies during the call: the model reads an error result and the turn goes on to
    its end; the next call is answered too."""
    ledger = tmp_path / "ledger.log"
    async with server_entry(kind, ledger) as entry, connected(project_with(tmp_path, {"test": entry}),
                                                                tmp_path) as servers:
        script: FauxScript = [reply(tool_call("mcp__test__die")),
                              reply(tool_call("mcp__test__echo", {"text": "again"})), "over"]
        _, faux, outcome = await turn(store, servers, script, tmp_path, ctx)

    assert outcome.result.outcome == "completed"
    died = tool_result(faux, 1)
    assert died.is_error
    assert text(died).startswith("MCP server test failed the call")
    assert text(tool_result(faux, 2)).startswith(next_call)
    assert ledger.read_text().splitlines() == ["die"]


async def test_a_hanging_server_is_a_tool_error_after_its_timeout(store: Store, tmp_path: Path, ctx: Context) -> None:
    """A call the server never answers ends at the entry's `timeout` as an error the model reads."""
    project = project_with(tmp_path, {"test": stdio_entry(tmp_path / "ledger.log", timeout=0.5)})
    async with connected(project, tmp_path) as servers:
        _, faux, outcome = await turn(store, servers, [reply(tool_call("mcp__test__hang")), "gave up"], tmp_path, ctx)

    assert outcome.result.outcome == "completed"
    assert tool_result(faux, 1).is_error
    assert "timed out" in text(tool_result(faux, 1))


async def test_a_server_slow_to_start_holds_up_nothing(store: Store, tmp_path: Path, ctx: Context) -> None:
    """A server that has not answered yet offers no tools and blocks no turn; it stays `starting`."""
    silent = {"command": sys.executable, "args": ["-c", "import time; time.sleep(600)"]}
    servers = McpServers.from_files(project_with(tmp_path, {"silent": silent}), tmp_path)
    servers.start()
    try:
        _, faux, outcome = await turn(store, servers, ["no tools yet"], tmp_path, ctx)
        [status] = servers.statuses()
    finally:
        await servers.close()

    assert outcome.result.outcome == "completed"
    assert faux.requests[0].request.tools == ()
    assert status.state == "starting"


def test_a_project_server_starts_only_once_the_user_trusts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cloned repository's `.mcp.json` runs no command by itself: `harness mcp list` shows its
    server as not trusted and never starts it, until `harness mcp trust NAME` puts the name in
    the user's settings (`enabledMcpjsonServers`, Claude Code's key), other keys kept."""
    started = tmp_path / "started"
    entry = {"command": "sh", "args": ["-c", f'touch "{started}"; exec "$0" "$@"', sys.executable, str(SERVER),
                                       "stdio", str(tmp_path / "ledger.log")]}
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"permissions": {"allow": ["read"]}}))
    monkeypatch.chdir(project_with(tmp_path, {"repo": entry}, trusted=False))
    monkeypatch.setenv("HARNESS_HOME", str(home))
    runner = CliRunner()

    before = runner.invoke(app, ["mcp", "list"])
    assert not started.exists()
    trusted = runner.invoke(app, ["mcp", "trust", "repo"])
    after = runner.invoke(app, ["mcp", "list"])

    assert (before.exit_code, trusted.exit_code, after.exit_code) == (0, 0, 0), (before.output, after.output)
    assert before.stdout.startswith("repo  not trusted  not trusted: `harness mcp trust repo` lets it start")
    assert "mcp__repo__echo" not in before.stdout
    assert after.stdout.startswith("repo  connected")
    assert "mcp__repo__echo" in after.stdout
    assert started.exists()
    assert json.loads((home / "settings.json").read_text()) == {"permissions": {"allow": ["read"]},
                                                                "enabledMcpjsonServers": ["repo"]}


def test_trust_is_read_from_the_users_settings_never_the_projects(tmp_path: Path) -> None:
    """`enableAllProjectMcpServers` trusts every project server; a project's own settings cannot
    vouch for its servers; the user's own servers need no trust."""
    project = project_with(tmp_path, {"a": {"command": "a"}}, trusted=False)
    (project / ".harness").mkdir()
    (project / ".harness" / "settings.json").write_text(json.dumps({"enableAllProjectMcpServers": True}))
    home = tmp_path / "home"
    home.mkdir()
    (home / "mcp.json").write_text(json.dumps({"mcpServers": {"mine": {"command": "mine"}}}))

    untrusted = {config.name: config.trusted for config in load_mcp_servers(project, home)}
    (home / "settings.toml").write_text("enableAllProjectMcpServers = true\n")
    trusted = {config.name: config.trusted for config in load_mcp_servers(project, home)}

    assert untrusted == {"a": False, "mine": True}
    assert trusted == {"a": True, "mine": True}
    assert load_mcp_trust(home).all


def test_project_servers_win_and_variables_are_expanded(tmp_path: Path) -> None:
    """`.mcp.json` of the project, then `mcp.json` of the home; `${VAR}` and `${VAR:-default}`
    expanded; a bad entry is reported, not raised."""
    project = project_with(tmp_path, {"both": {"command": "${TOOL}", "args": ["${MODE:-fast}"]},
                                      "web": {"type": "http", "url": "${URL}"},
                                      "odd": {"type": "sse", "url": "http://x"}})
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"both": {"command": "user"},
                                                                  "mine": {"command": "mine"}}}))

    found = {config.name: config for config in load_mcp_servers(project, tmp_path, {"TOOL": "run-it"})}

    assert list(found) == ["both", "web", "odd", "mine"]
    assert found["both"].where == "run-it fast"
    assert found["web"].problem == "the environment variable URL is not set"
    assert found["odd"].problem == "type 'sse' is not supported (stdio or http)"
    assert found["mine"].source == tmp_path / "mcp.json"
