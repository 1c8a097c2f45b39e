"""The session commands of `harness`: `sessions`, `delete` and `abort`."""

from __future__ import annotations

import sys
from typing import Annotated, get_args

import typer

from harness.cli.app import StoreOption, app, run_with_store
from harness.cli.session_refs import SessionArgument, local_time, named_sessions, resolve_session
from harness.cli.terminal_text import visible
from harness.context import Context
from harness.session import AbortCause, Store, addresses


@app.command()
def sessions(store: StoreOption = None) -> None:
    """List the sessions in the store, oldest first. Each shows id, created, last updated, name."""

    async def body(s: Store, context: Context) -> None:
        listed = await named_sessions(s, context)
        if not listed:
            typer.echo("no sessions yet: `harness chat` or `harness run PROMPT` starts one", err=True)
            return
        typer.echo(f"{'SESSION':<36}  {'CREATED':<16}  {'UPDATED':<16}  NAME")
        for info, name in listed:
            when = f"{local_time(info.created_at)}  {local_time(info.updated_at)}"
            typer.echo(f"{info.id:<36}  {when}  {visible(name or '')}".rstrip())

    run_with_store(store, body)


@app.command()
def delete(
    session: SessionArgument,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking (required without a terminal).")]
    = False,
    store: StoreOption = None,
) -> None:
    """Delete a session and its whole journal, for good. Refused while a chat or run holds it.

    A run left open in it is stopped first (cause `deleted`) and settles before the session goes."""
    if not yes and not sys.stdin.isatty():
        raise typer.BadParameter("nobody can be asked without a terminal: pass --yes to delete", param_hint="--yes")

    async def body(s: Store, context: Context) -> int:
        session_id = await resolve_session(s, session, context)
        opened = await s.open_session(session_id, context)
        name = await opened.get(addresses.session_name(), context)
        shown = f"{session_id} ({visible(name)})" if name else session_id
        if not yes and not typer.confirm(f"delete session {shown} and all its entries?", default=False):
            typer.echo("nothing deleted", err=True)
            return 1
        from harness.cli.config import local_user
        from harness.conversation import ConversationService

        conversations, user = ConversationService(s), local_user()
        await conversations.adopt(user, session_id, context)
        await conversations.delete(user, session_id, context)
        typer.echo(f"deleted session {shown}", err=True)
        return 0

    raise typer.Exit(run_with_store(store, body))


@app.command()
def abort(
    session: SessionArgument,
    lane: Annotated[str, typer.Option(metavar="LANE", help="The lane whose open operation to abort.")] = "main",
    cause: Annotated[str, typer.Option(
        metavar="CAUSE", help=f"The abort cause recorded: one of {', '.join(get_args(AbortCause))}.")] = "user",
    store: StoreOption = None,
) -> None:
    """Abort a lane's open operation and settle it as aborted.

    For a run a stopped process left open, or one that cannot go on (a damaged journal, a missing
    model or key): settling needs no model. Says so, and exits 0, when nothing is open."""
    causes: tuple[AbortCause, ...] = get_args(AbortCause)
    chosen = next((known for known in causes if known == cause), None)
    if chosen is None:
        raise typer.BadParameter(f"one of {', '.join(causes)}", param_hint="--cause")
    from harness.cli.config import local_user
    from harness.conversation import ConversationService
    from harness.runtime import NoActiveOperation, Settled

    async def body(s: Store, context: Context) -> None:
        session_id = await resolve_session(s, session, context)
        # Through the conversation service, so the settled run leaves its `interrupted` row (CE-7).
        # No models and no tools: settling an abort answers open tool calls without running
        # them and calls no provider, so a missing key or an unknown model cannot block it.
        conversations, user = ConversationService(s), local_user()
        await conversations.adopt(user, session_id, context)
        conversation = await conversations.open(user, session_id, context)
        try:
            try:
                await conversation.stop(context, lane=lane, cause=chosen)
            except NoActiveOperation:
                typer.echo(f"nothing to abort: lane {lane} of session {session_id} has no open operation")
                return
            outcome = await conversation.resume(context, lane=lane)
        finally:
            await conversation.dispose(context)
        if isinstance(outcome, Settled):
            result = outcome.result
            why = f" ({result.abort_cause})" if result.abort_cause else ""
            typer.echo(f"{result.kind} {result.operation_id} on lane {lane} of session {session_id}: "
                       f"{result.outcome}{why}")
        else:
            typer.echo(f"operation {outcome.operation_id} on lane {lane} of session {session_id} did not settle")

    run_with_store(store, body)
