"""`harness mcp list`: the MCP servers of `.mcp.json` (the project's) and `$HARNESS_HOME/mcp.json`
(the user's), each started and asked for its tools; and the same check for `harness doctor`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from harness.cli.app import app
from harness.home import harness_home

if TYPE_CHECKING:
    from harness.cli.config import Check
    from harness.tools import McpServerStatus

mcp_app = typer.Typer(name="mcp", help="MCP servers whose tools the model is offered (.mcp.json).",
                      no_args_is_help=True)
app.add_typer(mcp_app)


@mcp_app.command("list")
def list_servers() -> None:
    """Start each MCP server of ./.mcp.json and $HARNESS_HOME/mcp.json (a project server wins on a
    shared name), wait until it answers or fails (30 s at most), and show its state and the tools
    the model is offered, each replay-safe (read-only or idempotent, run again after a crash) or
    never replayed. Exit status 1 when a server failed."""
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
    """One `harness doctor` line per MCP server: `ok` when it answered with its tools, `fail`
    when its entry is unusable or it did not start; none when no server is declared."""
    from harness.cli.config import Check

    return [Check(f"mcp server {status.config.name}", "ok" if status.state == "connected" else "fail",
                  _detail(status)) for status in await server_statuses(cwd, home)]


def _line(status: McpServerStatus) -> str:
    return f"{status.config.name}  {status.state}  {_detail(status)}"


def _detail(status: McpServerStatus) -> str:
    where = f"{status.config.where} (from {status.config.source})"
    if status.state == "connected":
        return f"{len(status.tools)} tools; {where}"
    return f"{status.problem or 'not started'}; {where}"
