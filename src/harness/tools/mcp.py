"""Tools from MCP servers, through the official `mcp` SDK: the `.mcp.json` files that declare the
servers, and `McpServers`, which connects to them in the background and offers each server's
tools as `mcp__<server>__<tool>`, replay-safe only where the server says the tool is read-only or
idempotent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from harness.context import Context
from harness.messages import ImageContent, Message, TextContent, UserContent
from harness.providers import ToolSpec
from harness.runtime import AgentTool, Lane, ProgressCallback, ToolOutput
from harness.tools.permissions import InvalidSettings, McpTrust, load_mcp_trust

# The SDK (and anyio, jsonschema, httpx2 with it) is imported by the connection code only: it takes
# over a second of CPU to import, which every chat, run and test process paid with no server declared.
if TYPE_CHECKING:
    import mcp_types
    from mcp import Client
    from mcp.client import Transport
    from mcp.client.session import IncomingMessage

logger = logging.getLogger(__name__)

PROJECT_FILE = ".mcp.json"
"""The project's servers, in the working directory (the file Claude Code and others read)."""
USER_FILE = "mcp.json"
"""The user's servers, in the harness home; a project server of the same name wins."""
MCP_TOOLS = "mcp__*"
"""The active-tools pattern that offers every MCP server's tools (`offered_tools`)."""
TOOL_PREFIX = "mcp__"
CALL_TIMEOUT_S = 60.0
"""How long a tool call may take unless the server's entry says (`timeout`, in seconds)."""
STARTUP_TIMEOUT_S = 30.0
"""How long a server may take to start and list its tools before it counts as failed."""
RESULT_LIMIT_CHARS = 100_000
RETRY_FIRST_S = 2.0
"""How long after an HTTP server failed to connect it may be tried again (at a step boundary);
each failure in a row doubles it, up to `RETRY_MAX_S`."""
RETRY_MAX_S = 60.0
RETRIES = 8
"""How many times in a row an HTTP server that failed to connect is tried again before it is
left failed (a call the model makes to one of its tools still starts it)."""
"""The most text of one result the model reads; the rest is cut, and it is told so."""

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]")
_NAME_LIMIT = 64  # what the providers take as a tool name


class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # other clients' keys are theirs

    timeout: float = Field(default=CALL_TIMEOUT_S, gt=0)


class StdioServer(_Entry):
    """A server the harness starts as a process and talks to over its stdin and stdout. It gets
    a small safe environment (the SDK's: no API keys) plus `env`."""

    type: Literal["stdio"] = "stdio"
    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class HttpServer(_Entry):
    """A server already running, reached over streamable HTTP at `url` with `headers`."""

    type: Literal["http"]
    url: str
    headers: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class McpServerConfig:
    """One server of a `.mcp.json` (`mcpServers.<name>`): how to reach it, or why it cannot be
    used (`problem`, with `transport` None), the file that declared it, and whether the user
    trusts it to start (`trusted`: a project's server the user has not trusted is never started)."""

    name: str
    source: Path
    transport: StdioServer | HttpServer | None
    problem: str | None = None
    trusted: bool = True

    @property
    def where(self) -> str:
        """The command line or URL, for a person."""
        if isinstance(self.transport, StdioServer):
            return " ".join([self.transport.command, *self.transport.args])
        return self.transport.url if self.transport is not None else "?"


def load_mcp_servers(cwd: Path, home: Path, environ: Mapping[str, str] | None = None) -> list[McpServerConfig]:
    """The servers of `cwd/.mcp.json`, then those of `home/mcp.json` not named there, in file
    order. Both use the `mcpServers` format: `{"mcpServers": {"name": {"command": ..., "args":
    [...], "env": {...}}}}` for a process (`"type": "stdio"` may be said), `{"type": "http", "url":
    ..., "headers": {...}}` for a streamable-HTTP server; `timeout` (seconds per tool call) is ours,
    other keys are ignored. `${VAR}` and `${VAR:-default}` in strings are taken from `environ`.

    A project's server (of `cwd/.mcp.json`, which a cloned repository brings) is `trusted` only
    when the user's settings in `home` trust it (`load_mcp_trust`: `enabledMcpjsonServers`,
    `enableAllProjectMcpServers`, or `harness mcp trust NAME`); the user's own are trusted.

    Never raises for what a file says: an unreadable file or a bad entry is a config with its
    `problem`, which `harness mcp list` shows; a missing file declares nothing; unreadable user
    settings trust no project server."""
    env = os.environ if environ is None else environ
    try:
        trust = load_mcp_trust(home)
    except InvalidSettings as error:
        logger.warning("no project MCP server is trusted: %s", error.message)
        trust = McpTrust()
    found: dict[str, McpServerConfig] = {}
    for config in _read_file(cwd / PROJECT_FILE, env):
        found.setdefault(config.name, replace(config, trusted=trust.trusts(config.name)))
    for config in _read_file(home / USER_FILE, env):
        found.setdefault(config.name, config)
    return list(found.values())


def _read_file(path: Path, environ: Mapping[str, str]) -> list[McpServerConfig]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as error:
        return [McpServerConfig(f"({path.name})", path, None, f"cannot read {path}: {error}")]
    try:
        document = json.loads(text)
    except ValueError as error:
        return [McpServerConfig(f"({path.name})", path, None, f"{path} is not JSON: {error}")]
    servers = document.get("mcpServers") if isinstance(document, dict) else None
    if not isinstance(servers, dict):
        return [McpServerConfig(f"({path.name})", path, None, f"{path} has no mcpServers object")]
    return [_entry(name, path, entry, environ) for name, entry in servers.items()]


def _entry(name: str, path: Path, entry: object, environ: Mapping[str, str]) -> McpServerConfig:
    if not isinstance(entry, dict):
        return McpServerConfig(name, path, None, "the entry is not an object")
    try:
        expanded = _expand(entry, environ)
        kind = expanded.get("type", "stdio" if "command" in expanded else None)
        if kind == "stdio":
            return McpServerConfig(name, path, StdioServer.model_validate(expanded))
        if kind == "http":
            return McpServerConfig(name, path, HttpServer.model_validate(expanded))
    except KeyError as missing:
        return McpServerConfig(name, path, None, f"the environment variable {missing.args[0]} is not set")
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}" for e in error.errors())
        return McpServerConfig(name, path, None, problems)
    return McpServerConfig(name, path, None, f"type {kind!r} is not supported (stdio or http)")


def _expand(value: Any, environ: Mapping[str, str]) -> Any:
    """`value` with `${VAR}` and `${VAR:-default}` replaced in every string; `KeyError(VAR)` for
    a variable that is not set and has no default."""
    if isinstance(value, str):
        def variable(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in environ:
                return environ[name]
            if default is None:
                raise KeyError(name)
            return default
        return _VARIABLE.sub(variable, value)
    if isinstance(value, list):
        return [_expand(item, environ) for item in value]
    if isinstance(value, dict):
        return {key: _expand(item, environ) for key, item in value.items()}
    return value


# -- the servers while the process runs ------------------------------------------------------------


ServerState = Literal["starting", "connected", "failed", "stopped", "untrusted"]


@dataclass(frozen=True)
class McpServerStatus:
    """A server as `harness mcp list` shows it: its state, why it failed or stopped (`problem`),
    its tools (prefixed names) and those it lists that cannot be offered (`refused`, with why)."""

    config: McpServerConfig
    state: ServerState
    problem: str | None
    tools: tuple[AgentTool, ...]
    refused: tuple[str, ...] = ()


class McpServers:
    """The MCP servers of one process, connected in the background, and their tools in `tools`:
    a live mapping by prefixed name (`mcp__<server>__<tool>`) that a `ConversationSetup` passes as
    its `live_tools`, so a server's tools join when it is ready and a list change
    (`notifications/tools/list_changed`, or a 2026-era `subscriptions/listen` event) lands at the
    next step. `at_step_boundary` is a `between_steps` hook that first waits for a list change
    already announced; `on_change` tells whoever asks when a new list is in `tools`. An HTTP
    server that could not be reached (down when the process started, say) is tried again at a
    later step boundary, in the background, `retry_first_s` after it failed and twice as long
    after each failure in a row (at most `RETRY_MAX_S`), `RETRIES` times: once it answers, its
    tools join as a slow server's do.

    A tool is replay-safe (`replay="safe"`) when its annotations say `readOnlyHint` or
    `idempotentHint`, else never replayed: a crash during its call is answered as interrupted,
    its effect unknown (HA-25), and it is not called again. Every tool but a `readOnlyHint` one
    asks first (`AgentTool.asks_first`, which an `ApprovalPolicy` weighs). A server that fails,
    hangs past its `timeout` or answers garbage makes that call's result an error the model
    reads; a call to a server that stopped starts it again first. The server's requests for
    sampling or elicitation are refused (the SDK's answer: not supported), and the client declares neither capability.
    A server whose config is not `trusted` (a project's the user has not trusted) is never
    started and offers no tools.

    `start()` needs a running loop and returns at once; `close()` stops every server."""

    def __init__(self, configs: Sequence[McpServerConfig], *, log_dir: Path | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, retry_first_s: float = RETRY_FIRST_S) -> None:
        self.tools: dict[str, AgentTool] = {}
        self._log_dir = log_dir
        self._startup_timeout_s = startup_timeout_s
        self._retry_first_s = retry_first_s
        self._servers = [_Server(config, self) for config in configs]
        self._listeners: list[Callable[[], None]] = []

    @classmethod
    def from_files(cls, cwd: Path, home: Path) -> McpServers:
        """The servers `load_mcp_servers(cwd, home)` declares, their stderr kept in
        `home/logs/mcp-<server>.log`."""
        return cls(load_mcp_servers(cwd, home), log_dir=home / "logs")

    def start(self) -> None:
        """Start connecting to every usable server, each in a task of its own."""
        for server in self._servers:
            server.start()

    async def ready(self) -> None:
        """Wait until every server started is connected or has failed (each within its startup
        timeout)."""
        await asyncio.gather(*(server.settled() for server in self._servers))

    def statuses(self) -> list[McpServerStatus]:
        return [server.status() for server in self._servers]

    def on_change(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` each time `tools` is rebuilt: when a server connects, and when it has
        read its list again after announcing a change (the list may have come back the same). It
        runs on the loop once the new list is in `tools`, so it may read it;
        a listener that raises is logged and the others still run. Returns the function that stops
        the calls.

        A change notice can arrive after the result of the call that caused it (a 2026-era server
        sends it on its own `subscriptions/listen` stream), so the step after that call may still
        offer the old list; whoever must know when the new one is offered (a status line, a test)
        waits for this call instead of guessing."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def at_step_boundary(self, lane: Lane, context: Context) -> Sequence[Message]:
        """A `between_steps` hook: start again each HTTP server whose retry is due (not waited
        for: its tools join at a step after it answers), and wait for the list refreshes that
        announced changes started, so the next step offers the new lists; it places no message."""
        for server in self._servers:
            server.retry_if_due()
        await asyncio.gather(*(server.refreshed() for server in self._servers))
        return []

    async def close(self) -> None:
        """Stop every server (a process is ended; an HTTP session is closed)."""
        await asyncio.gather(*(server.stop() for server in self._servers))

    def _publish(self) -> None:
        # Rebuilt whole, without an await, so a step never reads half of a change.
        tools: dict[str, AgentTool] = {}
        for server in self._servers:
            for name, tool in server.tools.items():
                tools.setdefault(name, tool)
        self.tools.clear()
        self.tools.update(tools)
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # someone else's hook: the list has changed all the same
                logger.exception("an MCP tool-list listener failed")

    def _errlog(self, name: str) -> contextlib.AbstractContextManager[TextIO]:
        """Where a process server's stderr goes: its log file, else this process's stderr."""
        if self._log_dir is None:
            return contextlib.nullcontext(sys.stderr)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return open(self._log_dir / f"mcp-{_NOT_IN_NAME.sub('_', name)}.log", "a", encoding="utf-8")


@dataclass(eq=False)
class _Server:
    config: McpServerConfig
    owner: McpServers
    state: ServerState = "stopped"
    problem: str | None = None
    tools: dict[str, AgentTool] = field(default_factory=dict)
    refused: tuple[str, ...] = ()
    failures: int = 0
    """Starts in a row that ended before the server answered."""
    _retry_at: float | None = None  # when the loop's clock says a failed HTTP server may be started again
    _client: Client | None = None
    _task: asyncio.Task[None] | None = None
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _refresh: asyncio.Task[None] | None = None

    def start(self) -> None:
        if not self.config.trusted or self.config.transport is None or (self._task is not None
                                                                         and not self._task.done()):
            return
        self.state, self.problem, self._ready = "starting", None, asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"mcp server {self.config.name}")

    async def settled(self) -> None:
        if self._task is not None:
            await self._ready.wait()

    def retry_if_due(self) -> None:
        if self.state == "failed" and self._retry_at is not None \
                and asyncio.get_running_loop().time() >= self._retry_at:
            self._retry_at = None
            self.start()

    async def refreshed(self) -> None:
        if self._refresh is not None:
            await asyncio.wait([self._refresh])

    def status(self) -> McpServerStatus:
        if not self.config.trusted:
            return McpServerStatus(self.config, "untrusted", f"not trusted: `harness mcp trust {self.config.name}` "
                                   "lets it start", ())
        problem = self.config.problem if self.config.transport is None else self.problem
        state: ServerState = "failed" if self.config.transport is None else self.state
        return McpServerStatus(self.config, state, problem, tuple(self.tools.values()), self.refused)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- the connection, in its own task: the SDK's task group lives and ends in it ------------

    async def _run(self) -> None:
        import anyio
        import mcp_types
        from mcp import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                target = self._target(stack)
                with anyio.CancelScope(deadline=anyio.current_time() + self.owner._startup_timeout_s) as startup:
                    async with Client(target, cache=None, message_handler=self._on_message,
                                      client_info=mcp_types.Implementation(name="harness", version=version("harness")),
                                      ) as client:
                        await self._list(client)
                        self._client, self.state, self.failures = client, "connected", 0
                        self._ready.set()
                        startup.deadline = math.inf
                        await self._follow(client)
            if startup.cancelled_caught:
                self.state, self.problem = "failed", f"did not start within {self.owner._startup_timeout_s:g} s"
            elif self.state == "connected":
                self.state, self.problem = "stopped", "the server ended the connection"
        except Exception as error:  # a foreign process or server: any failure is its failure
            self.state, self.problem = ("stopped" if self.state == "connected" else "failed"), _describe(error)
            logger.info("MCP server %s: %s", self.config.name, self.problem)
        finally:
            self._client = None
            if self.state == "failed":
                self._failed()
            self._ready.set()

    def _failed(self) -> None:
        """Count a start that failed, and say when an HTTP server may be tried again, if it may: a
        server running elsewhere may come up later, while a process of ours that could not start
        would fail the same way again."""
        self.failures += 1
        self._retry_at = None
        if isinstance(self.config.transport, HttpServer) and self.failures <= RETRIES:
            backoff = min(self.owner._retry_first_s * 2 ** (self.failures - 1), RETRY_MAX_S)
            self._retry_at = asyncio.get_running_loop().time() + backoff

    def _target(self, stack: contextlib.AsyncExitStack) -> Transport:
        """How the SDK reaches the server; what it needs open meanwhile is closed with `stack`."""
        import httpx2
        from mcp import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        transport = self.config.transport
        if isinstance(transport, StdioServer):
            errlog = stack.enter_context(self.owner._errlog(self.config.name))
            return stdio_client(StdioServerParameters(command=transport.command, args=transport.args,
                                                      env=transport.env or None, cwd=transport.cwd), errlog=errlog)
        assert isinstance(transport, HttpServer)
        # The SDK's own client's timeouts: a server may hold a response stream open for long.
        http = httpx2.AsyncClient(headers=transport.headers, timeout=httpx2.Timeout(30.0, read=300.0))
        stack.push_async_callback(http.aclose)
        return streamable_http_client(transport.url, http_client=http)

    async def _follow(self, client: Client) -> None:
        """Until the connection ends, keep the server telling its tool-list changes: a 2026-era
        server sends them only on a `subscriptions/listen` stream, earlier ones unasked. Either way
        the SDK hands each notice to `_on_message`, which alone refreshes the list (acting on the
        stream's events as well read the list twice per change)."""
        import anyio
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        capabilities = client.server_capabilities.tools
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS and capabilities is not None \
                and capabilities.list_changed:
            async with client.listen(tools_list_changed=True) as changes:
                async for _ in changes:  # drained so its backlog never overflows
                    pass
        else:
            await anyio.sleep_forever()

    async def _on_message(self, message: IncomingMessage) -> None:
        import mcp_types

        if isinstance(message, mcp_types.ToolListChangedNotification) and self._client is not None:
            self._refresh = asyncio.get_running_loop().create_task(self._relist(self._client))

    async def _relist(self, client: Client) -> None:
        import anyio

        try:
            with anyio.fail_after(self.config.transport.timeout if self.config.transport else CALL_TIMEOUT_S):
                await self._list(client)
        except Exception as error:  # the old list stays; calls will tell what is wrong
            logger.info("MCP server %s: the tool list could not be read again: %s", self.config.name,
                        _describe(error))

    async def _list(self, client: Client) -> None:
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        tools: dict[str, AgentTool] = {}
        refused: list[str] = []
        for tool in listed:
            made = self._tool(tool)
            if isinstance(made, str):
                refused.append(f"{tool.name}: {made}")
            elif made.name in tools:
                refused.append(f"{tool.name}: its name {made.name} is taken by another tool of the server")
            else:
                tools[made.name] = made
        self.tools, self.refused = tools, tuple(refused)
        self.owner._publish()

    def _tool(self, tool: mcp_types.Tool) -> AgentTool | str:
        """The tool as the model sees it, or why it cannot be offered."""
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for

        name = f"{TOOL_PREFIX}{_NOT_IN_NAME.sub('_', self.config.name)}__{_NOT_IN_NAME.sub('_', tool.name)}"
        if len(name) > _NAME_LIMIT:
            return f"{name} is longer than {_NAME_LIMIT} characters"
        schema: dict[str, Any] = tool.input_schema
        try:
            validator_for(schema).check_schema(schema)
            spec = ToolSpec(name=name, description=tool.description or tool.title or tool.name,
                            parameters=schema)
        except (SchemaError, ValidationError) as error:
            return f"its input schema is not valid ({str(error).splitlines()[0]})"
        hints = tool.annotations
        read_only = hints is not None and bool(hints.read_only_hint)
        safe = read_only or (hints is not None and bool(hints.idempotent_hint))
        remote = tool.name

        async def execute(call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                          context: Context) -> ToolOutput:
            return await self._call(remote, args, context)

        return AgentTool(spec=spec, execute=execute, replay="safe" if safe else "never", asks_first=not read_only)

    # -- calls, from the drive's tasks --------------------------------------------------------

    async def _call(self, tool: str, args: dict[str, JsonValue], context: Context) -> ToolOutput:
        transport = self.config.transport
        timeout = transport.timeout if transport is not None else CALL_TIMEOUT_S
        if self._client is None:
            self.start()  # stopped or failed: one new start, waited for, before the call (never an untrusted one)
            await self.settled()
        client = self._client
        if client is None:
            return _error(f"MCP server {self.config.name} is not available: {self.problem or 'not started'}",
                          "mcp_server_unavailable")
        call = asyncio.ensure_future(client.call_tool(tool, dict(args), read_timeout_seconds=timeout))
        cancelled = context.cancellation()
        ends: list[asyncio.Future[Any]] = [call, cancelled]
        try:
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
            if not call.done():
                call.cancel()  # the SDK tells the server the request is abandoned
        if call.cancelled():
            return _error(f"the call was cancelled ({context.cancel_reason or 'cancelled'})", "cancelled")
        try:
            result = call.result()
        except Exception as error:  # the server died, hung past the timeout or answered garbage
            import mcp_types
            from mcp import MCPError

            problem = _describe(error)
            if isinstance(error, MCPError) and error.code == mcp_types.CONNECTION_CLOSED:
                # Gone before the connection's task noticed: the next call starts it again.
                await self.stop()
                self.state, self.problem = "stopped", problem
            return _error(f"MCP server {self.config.name} failed the call: {problem}", "mcp_call_failed")
        return _output(result)


def _output(result: mcp_types.CallToolResult) -> ToolOutput:
    """The model's view of a tool result: text and images as they are, other content described,
    the structured content as JSON when nothing else was sent, cut at `RESULT_LIMIT_CHARS`."""
    import mcp_types

    content: list[UserContent] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            content.append(TextContent(text=block.text))
        elif isinstance(block, mcp_types.ImageContent):
            content.append(ImageContent(data=block.data, mime_type=block.mime_type))
        elif isinstance(block, mcp_types.ResourceLink):
            content.append(TextContent(text=f"[resource {block.name}: {block.uri}]"))
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            text = resource.text if isinstance(resource, mcp_types.TextResourceContents) else (
                f"[binary resource {resource.uri} ({resource.mime_type or 'unknown type'})]")
            content.append(TextContent(text=text))
        else:
            content.append(TextContent(text=f"[{block.type} content, not shown]"))
    if not content and result.structured_content is not None:
        content.append(TextContent(text=json.dumps(result.structured_content)))
    return ToolOutput(content=_limited(content), is_error=result.is_error)


def _limited(content: list[UserContent]) -> list[UserContent]:
    left = RESULT_LIMIT_CHARS
    kept: list[UserContent] = []
    for block in content:
        if isinstance(block, TextContent):
            if len(block.text) > left:
                kept.append(TextContent(text=block.text[:left] + f"\n[cut: the result is longer than "
                                                                  f"{RESULT_LIMIT_CHARS} characters]"))
                return kept
            left -= len(block.text)
        kept.append(block)
    return kept


def _error(text: str, code: str) -> ToolOutput:
    return ToolOutput(content=[TextContent(text=text)], details={"code": code}, is_error=True)


def _describe(error: BaseException) -> str:
    if isinstance(error, ExceptionGroup) and len(error.exceptions) == 1:
        return _describe(error.exceptions[0])
    return f"{type(error).__name__}: {str(error) or 'no detail'}"
