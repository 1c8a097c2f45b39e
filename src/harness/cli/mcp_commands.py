"""`harness mcp list`: the MCP servers of `.mcp.json` (the project's) and `$HARNESS_HOME/mcp.json`
(the user's), each started and asked for its tools; and the same check for `harness doctor`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.app import command_group
from harness.home import harness_home

if TYPE_CHECKING:
    from harness.cli.config import Check
    from harness.tools import McpServerStatus

mcp_app = command_group("mcp", "MCP servers whose tools the model is offered (.mcp.json).")


@mcp_app.command("list")
def list_servers() -> None:
    """Start each MCP server and show its state and tools. The servers of ./.mcp.json and
    $HARNESS_HOME/mcp.json (a project server wins on a shared name) are each waited for until it
    answers or fails (30 s at most); the tools shown are the ones the model is offered, each
    replay-safe (read-only or idempotent, run again after a crash) or never replayed. A server of
    ./.mcp.json you have not trusted (`harness mcp trust NAME`) is listed as not trusted and not
    started. Exit status 1 when a server failed."""
    statuses = asyncio.run(server_statuses(Path.cwd(), harness_home()))
    if not statuses:
        typer.echo("no MCP servers: declare them in ./.mcp.json or $HARNESS_HOME/mcp.json (mcpServers)")
    for status in statuses:
        typer.echo(_line(status))
        for tool in status.tools:
            typer.echo(f"    {tool.name}  {'replay-safe' if tool.replay == 'safe' else 'never replayed'}")
        for refused in status.refused:
            typer.echo(f"    not offered: {refused}")
    raise typer.Exit(1 if any(status.state == "failed" for status in statuses) else 0)


@mcp_app.command("trust")
def trust_server(name: Annotated[str, typer.Argument(metavar="NAME",
                                                     help="The server's name in ./.mcp.json.")]) -> None:
    """Let the server NAME of a project's .mcp.json start. A cloned repository's file could
    otherwise run any command on your machine: NAME is added to enabledMcpjsonServers in
    $HARNESS_HOME/settings.json, so a server of that name is trusted in every project, as
    Claude Code's setting is. enableAllProjectMcpServers = true there trusts them all."""
    from harness.errors import HarnessError
    from harness.tools import load_mcp_servers
    from harness.tools.permissions import trust_mcp_server

    home = harness_home()
    try:
        path = trust_mcp_server(home, name)
    except HarnessError as error:
        typer.echo(f"error [{error.code}]: {error.message}", err=True)
        raise typer.Exit(2) from error
    declared = any(config.name == name for config in load_mcp_servers(Path.cwd(), home))
    typer.echo(f"trusted MCP server {name} ({path})" + ("" if declared else "; ./.mcp.json does not declare it"))


async def server_statuses(cwd: Path, home: Path) -> list[McpServerStatus]:
    """Each server of `cwd` and `home` (`McpServers.from_files`), once it answered or failed."""
    from harness.tools import McpServers

    servers = McpServers.from_files(cwd, home)
    servers.start()
    try:
        await servers.ready()
        return servers.statuses()
    finally:
        await servers.close()


async def check_mcp_servers(cwd: Path, home: Path) -> list[Check]:
    """One `harness doctor` line per MCP server: `ok` when it answered with its tools, `warn` when
    it is not trusted (and so not started), `fail` when its entry is unusable or it did not
    start; none when no server is declared."""
    from harness.cli.config import Check

    return [Check(f"mcp server {status.config.name}",
                  "ok" if status.state == "connected" else "warn" if status.state == "untrusted" else "fail",
                  _detail(status)) for status in await server_statuses(cwd, home)]


def _line(status: McpServerStatus) -> str:
    state = "not trusted" if status.state == "untrusted" else status.state
    return f"{status.config.name}  {state}  {_detail(status)}"


def _detail(status: McpServerStatus) -> str:
    where = f"{status.config.where} (from {status.config.source})"
    if status.state == "connected":
        return f"{len(status.tools)} tools; {where}"
    return f"{status.problem or 'not started'}; {where}"
