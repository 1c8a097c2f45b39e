"""What every route of one server shares (`ServerState`, on `app.state.server`) and the FastAPI
dependencies a door module's routes take: the state, the request's Context and the current user."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Literal, Protocol, cast

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from harness.context import Context
from harness.conversation import MAIN_LANE, Conversation, ConversationService
from harness.messages import ImageContent, ModelIdentity, UserMessage, now_ms
from harness.runtime import FOLLOW_POLL_S, AbortRequest, AcceptedRun, NoActiveOperation
from harness.server.approvals import Approvals
from harness.server.drives import Drives
from harness.server.errors import ConversationHeld, ExternalModeUnsupported, Unauthorized
from harness.session import (
    CancelRequested,
    LaneConfig,
    QueueRequest,
    Session,
    SessionOwned,
    StopRequest,
    Tokens,
    WorkNeedsPostgres,
    addresses,
)

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


Workers = Literal["in-process", "external"]
"""Who drives what a server accepts: the server itself (`in-process`, the default), or `harness
worker` processes on the same PostgreSQL store (`external`: the server never drives)."""


@dataclass(frozen=True)
class ServerOptions:
    """`heartbeat_s`: a quiet stream's heartbeat period; `client_buffer`: events a stream holds
    for a slow client. `workers="external"` (PostgreSQL only): accept, answer reads and watches,
    wake the workers, never drive, and keep no conversation attached; watches follow the lanes
    the workers drive (`follow_lane`, reading the journal every `follow_poll_s` seconds when no
    change notification comes)."""

    heartbeat_s: float = HEARTBEAT_S
    client_buffer: int = CLIENT_BUFFER
    workers: Workers = "in-process"
    follow_poll_s: float = FOLLOW_POLL_S


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
        if self.external and self.service.store.backend.kind != "postgres":
            raise WorkNeedsPostgres(f"--workers external needs a postgresql:// store, not {self.service.store.url!r}: "
                                    "workers claim work through its locks and channels",
                                    url=self.service.store.url)

    @property
    def external(self) -> bool:
        """Whether `harness worker` processes drive what this server accepts (`--workers external`)."""
        return self.options.workers == "external"

    def refuse_if_external(self, route: str) -> None:
        """`ExternalModeUnsupported` for a route external mode does not offer."""
        if self.external:
            raise ExternalModeUnsupported(f"{route} is not offered by a server whose workers are external",
                                          route=route)

    @asynccontextmanager
    async def conversation(self, user: str, conversation_id: str, context: Context) -> AsyncIterator[Conversation]:
        """`user`'s conversation, live for the request. In-process it stays live in the server
        afterwards, as `ConversationService.open` leaves it; with external workers it is closed
        when the block ends (its release wakes the workers), and one another process holds (a
        worker driving it) is `ConversationHeld`."""
        if not self.external:
            yield await self.service.open(user, conversation_id, context)
            return
        try:
            conversation = await self.service.open(user, conversation_id, context)
        except SessionOwned as error:
            raise ConversationHeld(f"conversation {conversation_id} is held by another process (a worker driving "
                                   "its run): steer, follow up or stop it, or send once the run has ended",
                                   conversation_id=conversation_id) from error
        try:
            yield conversation
        finally:
            await self.service.close(user, conversation_id, context)

    def drive(self, conversation: Conversation, lane: str, operation_id: str) -> None:
        """Drive an operation accepted during the request: in a task of the server in-process;
        with external workers not here (the conversation's release at the request's end wakes them)."""
        if not self.external:
            self.drives.start(conversation, lane, operation_id)

    async def start_turn(self, user: str, conversation_id: str, text: str, context: Context, *,
                         images: Sequence[ImageContent] = ()) -> tuple[Conversation, AcceptedRun]:
        """Admit a prompt in `user`'s conversation (`ConversationService.admit`) and drive it in a
        task of the server; returns as soon as the run is durable. With external workers: admit
        and close (the release wakes a worker), never drive; `ConversationHeld` while a worker
        holds the conversation. Raises what `admit` raises (`LaneBusy` while a run is open,
        `PromptTooLarge`, `ConversationEnded`, ...)."""
        async with self.conversation(user, conversation_id, context) as conversation:
            accepted = await conversation.settings.admit(text, images, context)
            self.drive(conversation, conversation.lane.name, accepted.operation_id)
        return conversation, accepted

    async def stop(self, user: str, conversation_id: str, context: Context) -> AbortRequest:
        """Record a durable abort (cause `user`) of the conversation's open run, wherever it is
        driven: the drive stops at its next safe point and answers every open tool call. With
        external workers the abort is posted for the worker (`Session.post_request`); drained
        queues are then not known here. Raises `NoActiveOperation` when nothing runs."""
        if not self.external:
            conversation = await self.service.open(user, conversation_id, context)
            return await conversation.lane.request_abort("user", context)
        session, operation_id = await self._open_run(user, conversation_id, context)
        state = await session.get(addresses.operation_state(operation_id), context)
        already = state is not None and isinstance(state.control, CancelRequested)
        if not already:
            await session.post_request(StopRequest(lane=MAIN_LANE, operation_id=operation_id, cause="user",
                                                   requested_at=now_ms()), context)
        return AbortRequest(operation_id=operation_id, newly_requested=not already, steer=(), follow_up=())

    async def queue(self, user: str, conversation_id: str, kind: Literal["steer", "follow_up"], text: str,
                    context: Context) -> tuple[str | None, str | None]:
        """Steer or follow up the open run; returns `(entry_id, request_id)`: in-process the
        queued entry's id (`Lane.steer`, `Lane.follow_up`); with external workers the id of the
        request posted for the worker, which mints the entry's id when it takes it. Raises
        `NoActiveOperation` when nothing runs."""
        message = UserMessage(content=text)
        if not self.external:
            lane = (await self.service.open(user, conversation_id, context)).lane
            queued = lane.steer if kind == "steer" else lane.follow_up
            return await queued(message, context), None
        session, operation_id = await self._open_run(user, conversation_id, context)
        request = QueueRequest(kind=kind, lane=MAIN_LANE, operation_id=operation_id, message=message,
                               requested_at=now_ms())
        return None, await session.post_request(request, context)

    async def _open_run(self, user: str, conversation_id: str, context: Context) -> tuple[Session, str]:
        """The conversation's session, read cold, and its main lane's current operation."""
        await self.service.is_open(user, conversation_id, context)  # the owner check
        session = await self.service.store.open_session(conversation_id, context)
        state = await session.get(addresses.lane_state(MAIN_LANE), context)
        if state is None or state.current_operation_id is None:
            raise NoActiveOperation(f"conversation {conversation_id} has no run open", lane=MAIN_LANE)
        return session, state.current_operation_id


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
