"""A small real MCP server for the MCP tests, written with the `mcp` SDK's server side (`MCPServer`,
the SDK's FastMCP).

Run as `python mcp_server.py stdio LEDGER` (over its stdin and stdout, as a `.mcp.json` stdio entry
starts it) or `python mcp_server.py http LEDGER [PORT]` (streamable HTTP at `/mcp` on PORT of
127.0.0.1, a free one when not given, printed as the first line of its stdout once it listens).
LEDGER is a file the tools append their effects to, one line per effect.

Its tools: `echo` (read-only) answers at once; `ledger` (no hints: never replayed) appends its key
to LEDGER, and on the ledger's first line kills the process that started the server (SIGKILL:
the harness that called it, over stdio); `die` appends `die` and kills the server itself mid-call;
`hang` appends `hang` and never answers; `grow` adds the tool `fresh` and `shrink` removes it, each
announcing the change.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("test")
LEDGER = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(os.devnull)


def record(line: str) -> int:
    """Append `line` to the ledger; how many lines it has now."""
    with LEDGER.open("a", encoding="utf-8") as ledger:
        ledger.write(line + "\n")
    return len(LEDGER.read_text(encoding="utf-8").splitlines())


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text}"


@server.tool()
def ledger(key: str) -> str:
    """Write the key to the ledger."""
    if record(f"ledger {key}") == 1:
        os.kill(os.getppid(), signal.SIGKILL)
    return f"wrote {key}"


@server.tool()
def die() -> str:
    """Stop the server in the middle of the call."""
    record("die")
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@server.tool()
async def hang() -> str:
    """Never answer."""
    record("hang")
    await asyncio.Event().wait()
    return "unreachable"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool `fresh`."""
    server.add_tool(lambda: "fresh!", name="fresh", description="A tool added while the server runs.",
                    annotations=ToolAnnotations(idempotent_hint=True))
    await ctx.notify_tools_changed()
    return "grown"


@server.tool()
async def shrink(ctx: Context) -> str:
    """Remove the tool `fresh`."""
    server.remove_tool("fresh")
    await ctx.notify_tools_changed()
    return "shrunk"


async def serve_http() -> None:
    listening = socket.socket()
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind(("127.0.0.1", int(sys.argv[3]) if len(sys.argv) > 3 else 0))
    # Listening before the port is told: a client that connects while uvicorn still starts waits
    # in the backlog instead of being refused (and the server counted as failed).
    listening.listen(128)
    print(listening.getsockname()[1], flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[listening])


if __name__ == "__main__":
    if sys.argv[1] == "http":
        asyncio.run(serve_http())
    else:
        server.run()
