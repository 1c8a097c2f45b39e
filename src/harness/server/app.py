"""`create_app`: the FastAPI application of `harness serve`, over one `ConversationService`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext

from fastapi import FastAPI

from harness.context import Context
from harness.conversation import ConversationService
from harness.errors import InvalidInput
from harness.messages import ModelIdentity
from harness.server import conversations, gardens, langgraph_api, page, streams, ui_stream
from harness.server.approvals import Approvals
from harness.server.errors import install_error_handlers
from harness.server.guards import install_guards
from harness.server.observability import install_observability
from harness.server.state import Authenticator, LocalUser, NewLane, ServerOptions, ServerState
from harness.session import LaneConfig


def create_app(service: ConversationService, auth: Authenticator, *, new_lane: NewLane | None = None,
               approvals: Approvals | None = None, options: ServerOptions | None = None) -> FastAPI:
    """The HTTP API over `service` (OpenAPI at `/docs`), its requests' users told by `auth`.

    On start it resumes every operation the store holds open (a restart loses no turn), and
    holds a conversation only while it is in use, letting go of idle ones and driving open turns
    nobody holds at every sweep (`Holds`); on shutdown it closes every live conversation, which
    halts their drives as a crash would, so the next server finishes them. `new_lane`
    configures a new conversation's main lane (default: the requested model or the registry's
    default, with every shared tool active). Tool calls
    wait for an answer over HTTP when the service's `before_tool` hook is `approvals.hook`. The
    service is the caller's: closing its store is too.

    With `options.workers="external"` (a PostgreSQL store, else `WorkNeedsPostgres`) the server
    never drives: `harness worker` processes do. It resumes nothing on start, keeps no
    conversation attached past a request, wakes the workers by letting go of what it accepted,
    posts steer, follow-up and stop for them, and follows their runs for the event streams, the
    AI SDK door's and the LangGraph door's as the native watch's. `/compact` answers
    `external_mode_unsupported` (501): it drives a summary in the request; a call waiting for
    approval in a worker is listed from the journal and answered by a posted answer.

    Every request is logged and counted, and `/healthz`, `/readyz` and `/metrics` answer without
    a token (`harness.server.observability`, issue 29)."""
    state = ServerState(service, auth, new_lane or _default_lane(service), options or ServerOptions(),
                        approvals or Approvals())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        context = Context({"server": "lifespan"})
        async with metrics.following(service):
            if state.external:  # external workers find what a stopped server left open themselves
                sweeping: AbstractAsyncContextManager[None] = nullcontext()
            else:
                await state.holds.resume_open(context)
                sweeping = state.holds.sweeping(context)
            try:
                async with sweeping:
                    yield
            finally:
                state.drives.cancel_all()
                state.fanouts.close()  # the sources a grace keeps open after their watchers left
                await service.close_all(context)

    app = FastAPI(title="Harness", summary="Durable agent conversations over HTTP.", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)
    install_guards(app, loopback_only=isinstance(auth, LocalUser))  # --no-auth: a loopback Host and Origin only
    app.include_router(conversations.router)
    app.include_router(gardens.router)
    app.include_router(streams.router)
    app.include_router(ui_stream.router)
    app.include_router(langgraph_api.router)
    app.include_router(page.router)  # last: its files are low-priority routes, every API route wins
    metrics = install_observability(app)
    return app


def _default_lane(service: ConversationService) -> NewLane:
    setup = service.setup
    if setup.models is None:
        raise InvalidInput("a server needs the service's model registry, or `new_lane`, to start conversations")
    registry = setup.models

    def new_lane(model: ModelIdentity | None) -> LaneConfig:
        return LaneConfig(model=model or registry.default_identity(), active_tools=[tool.name for tool in setup.tools])

    return new_lane
