"""What every route of one server shares (`ServerState`, on `app.state.server`) and the FastAPI
dependencies a door module's routes take: the state, the request's Context and the current user."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Protocol, cast

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from harness.context import Context
from harness.conversation import Conversation, ConversationService
from harness.messages import ImageContent, ModelIdentity
from harness.runtime import AbortRequest, AcceptedRun
from harness.server.approvals import Approvals
from harness.server.drives import Drives
from harness.server.errors import Unauthorized
from harness.session import LaneConfig, Tokens

HEARTBEAT_S = 15.0
"""How often a quiet event stream sends a heartbeat comment, so proxies keep it open."""

CLIENT_BUFFER = 1_000
"""Events an event stream holds for a client that reads too slowly; past it the stream ends and
the client reconnects, so no run ever waits for a client."""


class Authenticator(Protocol):
    """Who a request is: the user a bearer token belongs to; `Unauthorized` for none or a bad one."""

    async def user_of(self, token: str | None, context: Context) -> str: ...


@dataclass(frozen=True)
class LocalUser:
    """`--no-auth`: every request is `user`, with or without a token (a loopback server only)."""

    user: str

    async def user_of(self, token: str | None, context: Context) -> str:
        return self.user


@dataclass(frozen=True)
class StoreTokens:
    """Bearer tokens from the store (`harness token create USER`): each request's token is looked
    up and its secret compared with the stored hash, so a revocation holds from the next request."""

    tokens: Tokens

    async def user_of(self, token: str | None, context: Context) -> str:
        user = await self.tokens.user_of(token, context) if token else None
        if user is None:
            raise Unauthorized("a valid bearer token is needed: `Authorization: Bearer TOKEN`, from "
                               "`harness token create USER`" if token is None else "this bearer token is not valid")
        return user


NewLane = Callable[[ModelIdentity | None], LaneConfig]
"""The main lane's configuration of a new conversation, given the model a request named (None:
the server's default)."""


@dataclass(frozen=True)
class ServerOptions:
    heartbeat_s: float = HEARTBEAT_S
    client_buffer: int = CLIENT_BUFFER


@dataclass
class ServerState:
    """One server's conversations (`service`, one for the whole server), who its requests are
    (`auth`), the tasks that drive what it accepts (`drives`), and how new conversations start."""

    service: ConversationService
    auth: Authenticator
    new_lane: NewLane
    options: ServerOptions = field(default_factory=ServerOptions)
    approvals: Approvals = field(default_factory=Approvals)
    """The pending tool approvals; the service's `before_tool` hook must be `approvals.hook` for
    any call to wait here."""
    drives: Drives = field(init=False)

    def __post_init__(self) -> None:
        self.drives = Drives(self.service)
        self.approvals.conversation_of = self.drives.conversation_of.get

    async def start_turn(self, user: str, conversation_id: str, text: str, context: Context, *,
                         images: Sequence[ImageContent] = ()) -> tuple[Conversation, AcceptedRun]:
        """Admit a prompt in `user`'s conversation (`ConversationService.admit`) and drive it in a
        task of the server; returns as soon as the run is durable. Raises what `admit` raises
        (`LaneBusy` while a run is open, `PromptTooLarge`, `ConversationEnded`, ...)."""
        conversation, accepted = await self.service.admit(user, conversation_id, text, context, images=images)
        self.drives.start(conversation, conversation.lane.name, accepted.operation_id)
        return conversation, accepted

    async def stop(self, user: str, conversation_id: str, context: Context) -> AbortRequest:
        """Record a durable abort (cause `user`) of the conversation's open run, wherever it is
        driven: the drive stops at its next safe point and answers every open tool call.
        Raises `NoActiveOperation` when nothing runs."""
        conversation = await self.service.open(user, conversation_id, context)
        return await conversation.lane.request_abort("user", context)


def server_state(request: Request) -> ServerState:
    return cast(ServerState, request.app.state.server)


def request_context(request: Request) -> Context:
    """A Context per request. A client that goes away does not cancel what it started: a turn is
    durable work, stopped only by a durable abort."""
    return Context({"server": "request", "route": request.url.path})


_bearer = HTTPBearer(auto_error=False, description="A token from `harness token create USER`.")


async def current_user(state: Annotated[ServerState, Depends(server_state)],
                       context: Annotated[Context, Depends(request_context)],
                       credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str:
    """The user the request's bearer token belongs to; `Unauthorized` (401) without a valid one."""
    token = credentials.credentials if credentials is not None else None
    return await state.auth.user_of(token, context)


State = Annotated[ServerState, Depends(server_state)]
RequestContext = Annotated[Context, Depends(request_context)]
CurrentUser = Annotated[str, Depends(current_user)]
