"""`harness serve`: the HTTP API over one conversation service (every conversation door as REST
routes, OpenAPI at `/docs`), its event streams, and the doors real clients speak.

A door module exposes an `APIRouter` that `create_app` includes; its routes take the shared
dependencies: `State` (the `ServerState`), `CurrentUser` (the request's user, 401 without a valid
token) and `RequestContext`."""

from harness.server.app import create_app
from harness.server.drives import Drives
from harness.server.errors import STATUS_BY_CODE, Unauthorized, error_body, not_found, status_of
from harness.server.listen import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    NoAuthNeedsLoopback,
    is_loopback,
    refuse_open_no_auth,
    serve,
)
from harness.server.state import (
    CLIENT_BUFFER,
    HEARTBEAT_S,
    Authenticator,
    CurrentUser,
    LocalUser,
    NewLane,
    RequestContext,
    ServerOptions,
    ServerState,
    State,
    StoreTokens,
    current_user,
    request_context,
    server_state,
)

__all__ = [
    "CLIENT_BUFFER",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "HEARTBEAT_S",
    "STATUS_BY_CODE",
    "Authenticator",
    "CurrentUser",
    "Drives",
    "LocalUser",
    "NewLane",
    "NoAuthNeedsLoopback",
    "RequestContext",
    "ServerOptions",
    "ServerState",
    "State",
    "StoreTokens",
    "Unauthorized",
    "create_app",
    "current_user",
    "error_body",
    "is_loopback",
    "not_found",
    "refuse_open_no_auth",
    "request_context",
    "serve",
    "server_state",
    "status_of",
]
