"""The commands of `harness`, registered on the application."""

from __future__ import annotations

import typer

from harness.cli.app import StoreOption, app, run_with_store
from harness.cli.demo import write_demo_conversation
from harness.cli.render import print_branch
from harness.context import Context
from harness.session import Store, addresses


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
