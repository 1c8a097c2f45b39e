"""`harness serve`: the HTTP API over one conversation service (every conversation door as REST
routes, OpenAPI at `/docs`), its event streams, and the doors real clients speak.

A door module exposes an `APIRouter` that `create_app` includes; its routes take the shared
dependencies: `State` (the `ServerState`), `CurrentUser` (the request's user, 401 without a valid
token) and `RequestContext`."""

from harness.server.app import create_app
from harness.server.approvals import ApprovalChange, ApprovalNotFound, Approvals, PendingApproval
from harness.server.drives import Drives
from harness.server.errors import STATUS_BY_CODE, Unauthorized, error_body, not_found, status_of
from harness.server.langgraph_api import ASSISTANT_ID, ASSISTANT_NAME
from harness.server.langgraph_wire import (
    MULTITASK_STRATEGIES,
    START,
    STREAM_MODES,
    Cursor,
    EntryPlaced,
    InvalidEventId,
    MultitaskStrategyUnknown,
    ReplyDropped,
    RollbackUnsupported,
    RunAccepted,
    RunItem,
    RunSettled,
    RunStream,
    StreamModeUnsupported,
    langchain_message,
    multitask_strategy,
    parse_event_id,
    stream_modes,
)
from harness.server.langgraph_wire import Part as LangGraphPart
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
    "ASSISTANT_ID",
    "ASSISTANT_NAME",
    "CLIENT_BUFFER",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "HEARTBEAT_S",
    "MULTITASK_STRATEGIES",
    "START",
    "STATUS_BY_CODE",
    "STREAM_MODES",
    "ApprovalChange",
    "ApprovalNotFound",
    "Approvals",
    "Authenticator",
    "CurrentUser",
    "Cursor",
    "Drives",
    "EntryPlaced",
    "InvalidEventId",
    "LangGraphPart",
    "LocalUser",
    "MultitaskStrategyUnknown",
    "NewLane",
    "NoAuthNeedsLoopback",
    "PendingApproval",
    "ReplyDropped",
    "RequestContext",
    "RollbackUnsupported",
    "RunAccepted",
    "RunItem",
    "RunSettled",
    "RunStream",
    "ServerOptions",
    "ServerState",
    "State",
    "StoreTokens",
    "StreamModeUnsupported",
    "Unauthorized",
    "create_app",
    "current_user",
    "error_body",
    "is_loopback",
    "langchain_message",
    "multitask_strategy",
    "not_found",
    "parse_event_id",
    "refuse_open_no_auth",
    "request_context",
    "serve",
    "server_state",
    "status_of",
    "stream_modes",
]
