"""The commands of `harness`, registered on the application."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.app import StoreOption, app, run_with_store
from harness.cli.demo import write_demo_conversation
from harness.cli.render import print_branch
from harness.context import Context
from harness.imports import ImportReport, import_claude_code_session, import_pi_session
from harness.session import Store, addresses

import_app = typer.Typer(
    name="import",
    help="Read another agent's session file into a new session; prints the new session id.",
    no_args_is_help=True,
)
app.add_typer(import_app)

ImportFile = Annotated[Path, typer.Argument(help="The session file (JSONL) to import.")]


@app.command()
def demo(store: StoreOption = None) -> None:
    """Write a small conversation journal into the store and print its branch."""

    async def body(s: Store, context: Context) -> None:
        session = await write_demo_conversation(s, context)
        typer.echo(f"session {session.id}")
        await print_branch(session, "main", context)

    run_with_store(store, body)


@app.command()
def sessions(store: StoreOption = None) -> None:
    """List the sessions in the store, oldest first."""

    async def body(s: Store, context: Context) -> None:
        for info in await s.list_sessions(context):
            session = await s.open_session(info.id, context)
            name = await session.get(addresses.session_name(), context) or ""
            typer.echo(f"{info.id}  {name}")

    run_with_store(store, body)


@app.command()
def show(session_id: str, lane: str = "main", store: StoreOption = None) -> None:
    """Print a session's branch readably, oldest first."""

    async def body(s: Store, context: Context) -> None:
        session = await s.open_session(session_id, context)
        await print_branch(session, lane, context)

    run_with_store(store, body)


@import_app.command("pi")
def import_pi(file: ImportFile, store: StoreOption = None) -> None:
    """Import a pi coding-agent session file (format v1, v2 or v3)."""
    _import(store, lambda s, context: import_pi_session(s, file, context))


@import_app.command("claude-code")
def import_claude_code(file: ImportFile, store: StoreOption = None) -> None:
    """Import a Claude Code session transcript."""
    _import(store, lambda s, context: import_claude_code_session(s, file, context))


def _import(store: str | None, run: Callable[[Store, Context], Awaitable[ImportReport]]) -> None:
    """Run one import: the new session id on stdout (for scripts), what was read on stderr."""

    async def body(s: Store, context: Context) -> None:
        report = await run(s, context)
        typer.echo(report.session_id)
        unanswered = f" ({report.unanswered_tool_calls} unanswered)" if report.unanswered_tool_calls else ""
        typer.echo(f"imported {report.source_format}: {report.messages} messages, {report.tool_calls} tool "
                   f"calls{unanswered}, {report.compactions} compactions, {report.entries} entries", err=True)
        if report.skipped:
            skipped = ", ".join(f"{count} {kind}" for kind, count in report.skipped.items())
            typer.echo(f"skipped: {skipped}", err=True)
        for warning in report.warnings:
            typer.echo(f"warning: {warning}", err=True)

    run_with_store(store, body)
