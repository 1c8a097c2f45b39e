"""`harness serve`, the HTTP API and its event streams over the store every command uses, and
`harness token`, the bearer tokens its requests carry."""

from __future__ import annotations

import gc
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.app import StoreOption, app, command_group, run_with_store
from harness.cli.commands import permission_rules
from harness.cli.logs import LogFormatOption, configure_logging
from harness.context import Context
from harness.errors import HarnessError
from harness.home import harness_home
from harness.messages import ModelIdentity
from harness.session import LaneConfig, Store, WorkNeedsPostgres
from harness.session.tokens import TokenInfo

token_app = command_group("token", "Bearer tokens for `harness serve`, stored hashed in the store.")

SERVE_POOL_MAX = 16
"""The pooled PostgreSQL connections `harness serve` opens at most (a store URL's `?pool_max=N`
says otherwise): every watch of a run another process drives reads the journal at each of its
commits, and four connections queued those reads by hundreds of milliseconds under twenty
conversations (bench/README.md, serve_load)."""


@app.command("serve")
def serve_command(
    host: Annotated[str | None, typer.Option(
        "--host", metavar="ADDRESS", help="Address to listen on (default 127.0.0.1).", show_default=False)] = None,
    port: Annotated[int | None, typer.Option(
        "--port", metavar="PORT", help="Port to listen on (default 8765).", show_default=False)] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Serve every request as the local user, without "
                                          "tokens (loopback addresses only).")] = False,
    workers: Annotated[str, typer.Option(
        "--workers", metavar="WHO",
        help="Who drives the turns: `in-process` (this server) or `external` (`harness worker` "
        "processes on the same PostgreSQL store; this server only accepts, reads, watches and wakes them). "
        "With external workers a call waiting for approval in a worker is listed and answered over HTTP "
        "(`harness worker --yes` runs every call instead); the AI SDK and LangGraph doors admit for the "
        "workers and stream what they drive; /compact answers 501 external_mode_unsupported.")] = "in-process",
    max_held: Annotated[int | None, typer.Option(
        "--max-held", metavar="N", min=1, show_default=False,
        help="Conversations attached at once, at most (default 64; "
        "each holds a database connection or a lock); one more in use answers 503 server_busy.")] = None,
    idle_release: Annotated[float | None, typer.Option(
        "--idle-release", metavar="SECONDS", min=0.0, show_default=False,
        help="Seconds a conversation stays attached after its "
        "last request or turn (default 30).")] = None,
    log_format: LogFormatOption = "text",
    store: StoreOption = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /docs) and the web page (/). Turns it accepts are driven
    here, and turns a stopped server left open are finished (with `--workers external`: by the
    workers). It prints the page's URL once it listens. A conversation is attached only while
    a request or a turn uses it and `--idle-release` seconds after, at most `--max-held` at once;
    every few seconds the server lets go of idle ones and finishes open turns nobody drives (a
    dead process's, or its own after the store failed and recovered).

    Logs go to stderr: one line per request (method, route, status, duration, user), per turn
    start and end (conversation, operation, outcome), per conversation attached and released.
    GET /healthz (up), GET /readyz (the store answers; else 503 store_not_ready) and GET /metrics
    (Prometheus text: requests, event streams, turns, attached conversations) need no token."""
    # Imported here, not at the top: the server's web stack would add half a second to every
    # other command's start (see `harness.cli.app`).
    from harness.cli.config import client_setup, local_user, new_lane_config, process_tools, tool_workspace
    from harness.conversation import ConversationService
    from harness.providers import ModelRegistry
    from harness.server import (
        DEFAULT_HOST,
        DEFAULT_PORT,
        IDLE_RELEASE_S,
        MAX_HELD,
        Approvals,
        Authenticator,
        LocalUser,
        ServerOptions,
        StoreTokens,
        create_app,
        refuse_open_no_auth,
        serve,
    )

    if workers not in ("in-process", "external"):
        raise typer.BadParameter("in-process or external", param_hint="--workers")
    configure_logging(log_format)
    host = DEFAULT_HOST if host is None else host
    listen_port = DEFAULT_PORT if port is None else port
    if no_auth:
        try:
            refuse_open_no_auth(host)
        except HarnessError as error:
            typer.echo(f"error [{error.code}]: {error.message}", err=True)
            raise typer.Exit(2) from error
    home = harness_home()
    rules = permission_rules(home, Path.cwd(), None, None)  # a bad settings file: a usage error, nothing opened

    async def body(opened: Store, context: Context) -> None:
        registry = ModelRegistry.load(home=home)
        # The MCP servers connect in the background: serving starts at once.
        async with process_tools(Path.cwd(), home) as (jobs, mcp):
            # Write, edit, shell and the MCP tools not marked read-only wait for the owner's answer
            # over HTTP, unless the settings' rules decide.
            approvals = Approvals(rules=rules)
            # The streams show the calls waiting here as they start and stop waiting.
            setup = replace(client_setup(registry, tool_workspace(Path.cwd(), home), home, approvals.hook, jobs,
                                         mcp=mcp), on_approval=approvals.changed)

            def new_lane(model: ModelIdentity | None) -> LaneConfig:
                return new_lane_config(model or registry.default_identity(), home)

            auth: Authenticator = LocalUser(local_user()) if no_auth else StoreTokens(opened.tokens)
            service = ConversationService(opened, setup)
            options = ServerOptions(workers="external" if workers == "external" else "in-process",
                                    max_held=MAX_HELD if max_held is None else max_held,
                                    idle_release_s=IDLE_RELEASE_S if idle_release is None else idle_release)
            try:
                app = create_app(service, auth, new_lane=new_lane, approvals=approvals, options=options)
            except WorkNeedsPostgres as error:  # a usage error, as a bad option is
                typer.echo(f"error [{error.code}]: {error.message}", err=True)
                raise typer.Exit(2) from error
            # Start-up's objects (modules, schemas, routes) leave every later collection: full ones
            # paused the server 160 ms p50 under load (issue 29).
            gc.freeze()
            await serve(app, host, listen_port)

    run_with_store(store, body, pool_max=SERVE_POOL_MAX)


@token_app.command("create")
def token_create(user: Annotated[str, typer.Argument(metavar="USER", help="The user the token lets in.")],
                 store: StoreOption = None) -> None:
    """Create a bearer token for USER and print it, once. Only its hash is stored."""

    async def body(opened: Store, context: Context) -> None:
        token, info = await opened.tokens.create(user, context)
        typer.echo(token)
        typer.echo(f"token {info.id} for {info.user}: shown once, keep it (revoke: harness token revoke {info.id})",
                   err=True)

    run_with_store(store, body)


@token_app.command("list")
def token_list(store: StoreOption = None) -> None:
    """List the tokens: id, user, created, and revoked when it was."""

    async def body(opened: Store, context: Context) -> None:
        for info in await opened.tokens.list(context):
            typer.echo(token_line(info))

    run_with_store(store, body)


@token_app.command("revoke")
def token_revoke(token_id: Annotated[str, typer.Argument(metavar="TOKEN_ID",
                                                         help="The token's id, as `harness token list` shows.")],
                 store: StoreOption = None) -> None:
    """Revoke a token: from the next request on it lets nobody in."""

    async def body(opened: Store, context: Context) -> None:
        typer.echo(token_line(await opened.tokens.revoke(token_id, context)))

    run_with_store(store, body)


def token_line(info: TokenInfo) -> str:
    created = datetime.fromtimestamp(info.created_at / 1000).strftime("%Y-%m-%d %H:%M")
    revoked = "" if info.revoked_at is None else \
        f"  revoked {datetime.fromtimestamp(info.revoked_at / 1000).strftime('%Y-%m-%d %H:%M')}"
    return f"{info.id}  {info.user}  created {created}{revoked}"
