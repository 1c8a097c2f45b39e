"""`harness serve`: the HTTP API and its event streams over the store every command uses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.app import StoreOption, app, run_with_store
from harness.cli.config import client_setup, local_user, new_lane_config, tool_workspace
from harness.context import Context
from harness.conversation import ConversationService
from harness.errors import HarnessError
from harness.home import harness_home
from harness.messages import ModelIdentity
from harness.providers import ModelRegistry
from harness.server import DEFAULT_HOST, DEFAULT_PORT, LocalUser, create_app, refuse_open_no_auth, serve
from harness.session import LaneConfig, Store
from harness.tools import ApprovalPolicy, BackgroundJobs


class NoTokenStore(HarnessError):
    """Tokens are not stored yet: serve with `--no-auth`."""

    code = "no_token_store"


@app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = DEFAULT_PORT,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Serve every request as the local user, without "
                                          "tokens (loopback addresses only).")] = False,
    store: StoreOption = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /docs) on the store; turns it accepts are driven here, and
    turns a stopped server left open are finished."""
    try:
        if not no_auth:
            raise NoTokenStore("this version serves with --no-auth only (on a loopback address)")
        refuse_open_no_auth(host)
    except HarnessError as error:
        typer.echo(f"error [{error.code}]: {error.message}", err=True)
        raise typer.Exit(2) from error
    home = harness_home()

    async def body(opened: Store, context: Context) -> None:
        registry = ModelRegistry.load(home=home)
        jobs = BackgroundJobs()
        # Nobody answers approvals yet: the gated tools fail closed.
        setup = client_setup(registry, tool_workspace(Path.cwd(), home), home, ApprovalPolicy(None), jobs)

        def new_lane(model: ModelIdentity | None) -> LaneConfig:
            return new_lane_config(model or registry.default_identity(), home)

        service = ConversationService(opened, setup)
        try:
            await serve(create_app(service, LocalUser(local_user()), new_lane=new_lane), host, port)
        finally:
            await jobs.close()

    run_with_store(store, body)
