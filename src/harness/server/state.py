"""What every route of one server shares (`ServerState`, on `app.state.server`) and the FastAPI
dependencies a door module's routes take: the state, the request's Context and the current user."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Literal, Protocol, TypeVar, cast

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from harness.context import Context
from harness.conversation import MAIN_LANE, Conversation, ConversationService, LaneEvents
from harness.errors import HarnessError
from harness.messages import ImageContent, ModelIdentity, OutputSchema, UserMessage, now_ms
from harness.runtime import AbortRequest, AcceptedRun, RunEnd, follow_lane
from harness.runtime.follow import FOLLOW_POLL_S
from harness.server.approvals import Approvals
from harness.server.drives import Drives
from harness.server.errors import ConversationHeld, ExternalModeUnsupported, Unauthorized
from harness.server.fanout import CLIENT_BUFFER_BYTES, SOURCE_GRACE_S, Fanouts, Subscription
from harness.server.holds import IDLE_RELEASE_S, MAX_HELD, SWEEP_S, Holds
from harness.session import (
    ChangeSubscription,
    LaneConfig,
    ReleaseRequest,
    SessionOwned,
    SessionReader,
    WorkNeedsPostgres,
    addresses,
)
from harness.session.tokens import Tokens

HEARTBEAT_S = 15.0
"""How often a quiet event stream sends a heartbeat comment, so proxies keep it open."""

RELEASE_WAIT_S = 10.0
"""How long a turn waits for a worker that holds the conversation with no run open (it lets go
right after a run settles) to let go of it (external workers), before it is `ConversationHeld`."""

RELEASE_POLL_S = 0.02
"""How often such a turn tries again meanwhile: a release notifies the workers' channel, not the
change feed this server listens to, so a commit wakes it early and otherwise it looks again."""

TOKEN_CHECK_S = 5.0
"""How often a long-lived stream checks that the token it was opened with is still valid: a
revoked token's streams end within this (`Authorization.until_revoked`)."""

CLIENT_BUFFER = 1_000
"""Events the instance feed holds for a client that reads too slowly; past it the stream ends and
the client reconnects, so no run ever waits for a client (a conversation's watch is bounded in
bytes instead: `CLIENT_BUFFER_BYTES`)."""


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


BeforeDrive = Callable[[Conversation, AcceptedRun], Awaitable[None]]
"""What a door writes beside a turn it admitted, on the live conversation, before anything drives
it (the LangGraph door's run record)."""

NewLane = Callable[[ModelIdentity | None], LaneConfig]
"""The main lane's configuration of a new conversation, given the model a request named (None:
the server's default)."""


Workers = Literal["in-process", "external"]
"""Who drives what a server accepts: the server itself (`in-process`, the default), or `harness
worker` processes on the same PostgreSQL store (`external`: the server never drives)."""


@dataclass(frozen=True)
class ServerOptions:
    """`heartbeat_s`: a quiet stream's heartbeat period; `token_check_s`: how often a stream checks
    its token is still valid; `client_buffer`: events the instance feed holds for a slow client;
    `client_buffer_bytes`: bytes of events a conversation's watch holds for one (`Subscription`);
    `source_grace_s`: how long a watched lane's source stays open after its last watcher left.
    `workers="external"` (PostgreSQL only): accept, answer reads and watches, wake the workers,
    never drive, and keep no conversation attached; watches follow the lanes the workers drive
    (`follow_lane`, reading the journal every `follow_poll_s` seconds when no change notification
    comes). In-process a conversation is held only while in use and `idle_release_s` after, at
    most `max_held` at once, and every `sweep_s` the server lets go of idle ones and drives open
    turns nobody holds (`Holds`)."""

    heartbeat_s: float = HEARTBEAT_S
    token_check_s: float = TOKEN_CHECK_S
    client_buffer: int = CLIENT_BUFFER
    client_buffer_bytes: int = CLIENT_BUFFER_BYTES
    source_grace_s: float = SOURCE_GRACE_S
    workers: Workers = "in-process"
    follow_poll_s: float = FOLLOW_POLL_S
    idle_release_s: float = IDLE_RELEASE_S
    max_held: int = MAX_HELD
    sweep_s: float = SWEEP_S


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
    any call to wait here, and its setup's `on_approval` `approvals.changed` for the streams to
    show them."""
    fanouts: Fanouts = field(default_factory=Fanouts)
    """The watched lanes, each with one source shared by its watchers (`ServerState.watch`)."""
    drives: Drives = field(init=False)
    holds: Holds = field(init=False)
    _token_checks: dict[str | None, tuple[float, asyncio.Future[str | None]]] = field(init=False,
                                                                                    default_factory=dict)

    def __post_init__(self) -> None:
        self.drives = Drives(self.service)
        options = self.options
        self.holds = Holds(self.service, self.drives, idle_release_s=options.idle_release_s,
                           max_held=options.max_held, sweep_s=options.sweep_s)
        if self.external:
            # A request's block holds the conversation and lets it go at its end. A release
            # request it takes meanwhile (its own, posted while a worker held the conversation,
            # goes to whoever attaches next) must not close the conversation under the request:
            # the turn it admits would fail `harness_closed`.
            self.service.on_release_request = None
        self.approvals.conversation_of = self.drives.conversation_of.get
        self.approvals.live = self.service.live
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

    async def token_user(self, token: str | None, context: Context) -> str | None:
        """The user `token` names now, for a stream checking it again (None: revoked, or the store
        cannot tell now): one lookup every `token_check_s / 2` per token, shared by all of its
        streams checking at once or since, so a revocation ends them within about `token_check_s`."""
        now = time.monotonic()
        fresh = self.options.token_check_s / 2
        checked = self._token_checks.get(token)
        if checked is None or now - checked[0] >= fresh:
            for stale in [key for key, (at, _) in self._token_checks.items() if now - at >= fresh]:
                del self._token_checks[stale]
            checked = self._token_checks[token] = (now, asyncio.ensure_future(self._look_up(token, context)))
        return await asyncio.shield(checked[1])

    async def _look_up(self, token: str | None, context: Context) -> str | None:
        try:
            return await self.auth.user_of(token, context)
        except HarnessError:  # revoked (`Unauthorized`), or the store cannot tell now: the client reconnects
            return None

    @asynccontextmanager
    async def conversation(self, user: str, conversation_id: str, context: Context) -> AsyncIterator[Conversation]:
        """`user`'s conversation, live for the request. In-process the server holds it while in use
        and a while after (`Holds.use`; `ServerBusy` past `max_held`); with external workers it
        is closed when the block ends (its release wakes the workers). One another process holds
        (a worker driving it, another server, a chat) is `ConversationHeld`."""
        try:
            if not self.external:
                async with self.holds.use(user, conversation_id, context) as conversation:
                    yield conversation
                return
            conversation = await self.service.open(user, conversation_id, context)
        except SessionOwned as error:
            raise ConversationHeld(f"conversation {conversation_id} is held by another process (a worker, another "
                                   "server or a chat): steer, follow up or stop it, or send once it lets go",
                                   conversation_id=conversation_id) from error
        try:
            yield conversation
        finally:
            await self.service.close(user, conversation_id, context)

    @asynccontextmanager
    async def new_conversation(self, user: str, model: ModelIdentity | None, context: Context, *,
                               name: str | None = None) -> AsyncIterator[Conversation]:
        """A new conversation of `user` on `new_lane(model)`, live for the block and held as
        `conversation` holds one (`ServerBusy` past `max_held`); with external workers it is let
        go when the block ends."""
        if not self.external:
            async with self.holds.use_new(user, self.new_lane(model), context, name=name) as conversation:
                yield conversation
            return
        conversation = await self.service.create(user, self.new_lane(model), context, name=name)
        try:
            yield conversation
        finally:
            await self.service.close(user, conversation.id, context)

    async def reader(self, user: str, conversation_id: str, context: Context) -> SessionReader:
        """`user`'s conversation's journal, to read, whoever holds it: nothing is attached for a
        read. Raises `SessionNotFound` and `Forbidden` (another user's)."""
        await self.service.check_owner(user, conversation_id, context)
        return await self.service.store.open_session(conversation_id, context)

    async def watch(self, user: str, conversation_id: str, context: Context) -> Subscription:
        """The main lane of `user`'s conversation from now on: its snapshot, then every later
        event (a `LaneEvents`); close it when done. The watchers of a lane in this server share
        one source (`Fanouts`, issue 29), each holding at most `client_buffer_bytes` of events it
        has not read, past which it is cut (`WatchOverflow`); a source stays open
        `source_grace_s` after its last watcher left, so a reconnect finds it and resumes from
        its recent events, not the log (`Subscription.read_events`). The source: the live
        lane's watch (HA-7) when the conversation is held here; otherwise, a watch holding
        nothing, a follow of the lane whoever drives it (`follow_lane`, woken by this process's
        commits and the store's change notifications, every `follow_poll_s` without them): the
        same events and ids, the streaming reply from its persisted frames. A live watch ends
        when the server lets go of the conversation (a source in its grace is then closed at
        once); the client resumes from its last event id. Raises
        `SessionNotFound`, `Forbidden` and `StorageCorruption`."""
        await self.service.check_owner(user, conversation_id, context)
        return await self.fanouts.subscribe(conversation_id, MAIN_LANE, lambda: self._lane_source(conversation_id),
                                            self.options.client_buffer_bytes, grace_s=self.options.source_grace_s)

    async def _lane_source(self, conversation_id: str) -> LaneEvents:
        """The main lane's events, the source `watch` shares, read under a Context of its own:
        it outlives the request that opened it."""
        context = Context({"server": "watch", "conversation": conversation_id})
        if not self.external and (live := self.service.live(conversation_id)) is not None and not live.broken:
            return await live.lane_events(context)
        follow = await follow_lane(self.service.store, conversation_id, MAIN_LANE, context,
                                   poll_s=self.options.follow_poll_s)
        try:
            reader = await self.service.store.open_session(conversation_id, context)
        except BaseException:
            follow.close()
            raise
        return LaneEvents.of_follow(follow, reader)

    async def until_settled(self, user: str, conversation_id: str, operation_id: str, context: Context) -> None:
        """Return once run `operation_id` is no longer the main lane's open operation, whoever
        drives it."""
        events = await self.watch(user, conversation_id, context)
        try:
            operation = events.snapshot.operation
            if operation is None or operation.id != operation_id:
                return
            async for event in events:
                if isinstance(event, RunEnd) and event.operation_id == operation_id:
                    return
        finally:
            events.close()

    def drive(self, conversation: Conversation, lane: str, operation_id: str) -> None:
        """Drive an operation accepted during the request: in a task of the server in-process;
        with external workers not here (the conversation's release at the request's end wakes them)."""
        if not self.external:
            self.drives.start(conversation, lane, operation_id)

    async def start_turn(self, user: str, conversation_id: str, text: str, context: Context, *,
                         images: Sequence[ImageContent] = (), before_drive: BeforeDrive | None = None,
                         output: OutputSchema | None = None) -> tuple[Conversation, AcceptedRun]:
        """Admit a prompt in `user`'s conversation (`ConversationService.admit`), await
        `before_drive` on it, and drive it in a task of the server; returns as soon as the run
        is durable; `output` as `Conversation.admit` takes it. With external workers: admit and
        close (the release wakes a worker), never
        drive; `ConversationHeld` while another process holds the conversation with a run open,
        and when one that holds it with none has not let go within `RELEASE_WAIT_S`: it is asked
        to (`ReleaseRequest`: a worker lets go right after a run settles, a server holding it
        idle at once, a chat never). Raises what `admit` raises (`LaneBusy` while a run is open,
        `PromptTooLarge`, `ConversationEnded`, ...)."""
        deadline = time.monotonic() + RELEASE_WAIT_S
        changes: ChangeSubscription | None = None
        try:
            while True:
                try:
                    async with self.conversation(user, conversation_id, context) as conversation:
                        accepted = await conversation.admit(text, context, images=images, output=output)
                        if before_drive is not None:
                            await before_drive(conversation, accepted)
                        self.drive(conversation, MAIN_LANE, accepted.operation_id)
                    return conversation, accepted
                except ConversationHeld:
                    session = await self.service.store.open_session(conversation_id, context)
                    lane = await session.get(addresses.lane_state(MAIN_LANE), context)
                    if (lane is not None and lane.current_operation_id is not None) or time.monotonic() >= deadline:
                        raise
                    if changes is None:
                        changes = self.service.store.changes.subscribe(conversation_id)
                        await session.post_request(ReleaseRequest(lane=MAIN_LANE, requested_at=now_ms()), context)
                    await changes.wait(RELEASE_POLL_S)
        finally:
            if changes is not None:
                changes.close()

    async def stop(self, user: str, conversation_id: str, context: Context, *,
                   operation_id: str | None = None) -> AbortRequest:
        """Record a durable abort (cause `user`) of the conversation's open run (only if it is
        `operation_id`, when given), wherever it is driven (`ConversationService.stop`): the
        drive stops at its next safe point and answers every open tool call. Raises
        `NoActiveOperation` when nothing runs, or another run than `operation_id`."""
        return await self.service.stop(user, conversation_id, context, operation_id=operation_id)

    async def queue(self, user: str, conversation_id: str, kind: Literal["steer", "follow_up"], text: str,
                    context: Context) -> tuple[str | None, str | None]:
        """Steer or follow up the open run wherever it is driven (`ConversationService.queue`);
        returns `(entry_id, request_id)`. Raises `NoActiveOperation` when nothing runs."""
        return await self.service.queue(user, conversation_id, kind, UserMessage(content=text), context)


# The dependencies are `async def` though they await nothing: FastAPI runs a plain `def` one in its
# thread pool, a thread handoff per dependency per request, and under load each of those waits its
# turn for the pool and the GIL (issue 29: a watch's reconnect waited about 0.4 s p50 for them).


async def server_state(request: Request) -> ServerState:
    return cast(ServerState, request.app.state.server)


async def request_context(request: Request) -> Context:
    """A Context per request. A client that goes away does not cancel what it started: a turn is
    durable work, stopped only by a durable abort."""
    return Context({"server": "request", "route": request.url.path})


_bearer = HTTPBearer(auto_error=False, description="A token from `harness token create USER`.")


async def request_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str | None:
    """The request's bearer token, if it sent one."""
    return credentials.credentials if credentials is not None else None


async def current_user(request: Request, state: Annotated[ServerState, Depends(server_state)],
                       context: Annotated[Context, Depends(request_context)],
                       token: Annotated[str | None, Depends(request_token)]) -> str:
    """The user the request's bearer token belongs to; `Unauthorized` (401) without a valid one.
    Kept on `request.state.user` for the request's log line (`ObservedRequests`)."""
    user = await state.auth.user_of(token, context)
    request.state.user = user
    return user


State = Annotated[ServerState, Depends(server_state)]
RequestContext = Annotated[Context, Depends(request_context)]
CurrentUser = Annotated[str, Depends(current_user)]

T = TypeVar("T")


@dataclass(frozen=True)
class Authorization:
    """What let a request in (its user, by its token), to check again while its stream lasts."""

    state: ServerState
    user: str
    token: str | None
    context: Context

    async def until_revoked(self, events: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        """`events`, until the token no longer names the user (revoked, issue 29): checked every
        `token_check_s` by a task of the stream's own, whether the stream is busy or quiet, so a
        revoked token's streams end within about that (`ServerState.token_user`); the client's
        reconnect is then answered 401. Each event passes straight through, in the stream's own
        task: a revocation found while the stream waits for its next event ends that wait (an
        `asyncio.timeout` moved to now), as a client leaving would; one found meanwhile ends the
        stream before its next event. A failed check ends the stream with its error. Closes
        `events` however it ends."""
        checking = asyncio.create_task(self._check_every(self.state.options.token_check_s))
        waiting: asyncio.Timeout | None = None  # the wait for the next event, while the stream waits

        def found(_: asyncio.Task[None]) -> None:
            if checking.cancelled():
                return
            checking.exception()  # a failed check's error is the stream's to raise, not a task's left unread
            if waiting is not None:
                waiting.reschedule(-1)  # in the past: the wait ends at once

        checking.add_done_callback(found)
        try:
            while not checking.done():
                step = asyncio.timeout(None)
                try:
                    async with step:
                        waiting = step
                        item = await anext(events)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if step.expired():  # ended by `found`, not by `events` itself
                        break
                    raise
                finally:
                    waiting = None
                yield item
            if not checking.cancelled() and (fault := checking.exception()) is not None:
                raise fault
        finally:
            checking.cancel()
            await events.aclose()

    async def _check_every(self, every: float) -> None:
        """Return once the token is found revoked, checking it every `every` seconds."""
        while True:
            await asyncio.sleep(every)
            if not await self._valid():
                return

    async def _valid(self) -> bool:
        return await self.state.token_user(self.token, self.context) == self.user


async def current_authorization(state: State, user: CurrentUser, context: RequestContext,
                                token: Annotated[str | None, Depends(request_token)]) -> Authorization:
    return Authorization(state, user, token, context)


CurrentAuthorization = Annotated[Authorization, Depends(current_authorization)]
