"""What an operator watches a server by (issue 29, Operations): a log line and metrics per HTTP
request, the turns counted from the service's feed, what it holds read at each scrape, and the routes
`GET /healthz`, `GET /readyz` and `GET /metrics` (Prometheus text, from a registry of the app's
own). None of them logs or counts a token or a message's text."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, cast

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harness.context import Context
from harness.conversation import ConversationService, FeedWatch, Presence, TurnActivity
from harness.errors import HarnessError
from harness.server.state import State
from harness.session import SessionNotFound

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 2.0
"""How long `GET /readyz` waits for the store to answer its read before it answers 503: a store
that stops answering (a paused or partitioned database, a table lock) must not hold the probe
for the prober's whole timeout."""

READY_PROBE_SESSION = "readiness-probe"
"""The session id the readiness read looks up: one indexed read, and no session has this id (the
store answering "no such session" is the store answering)."""

NO_ROUTE = "(static)"
"""The route label of a request no API route matched: the page's files, and paths nothing serves
(404). The raw path would give a label per URL a client invents."""


class StoreNotReady(HarnessError):
    """`GET /readyz`: the store did not answer a trivial read (refused, failed, or took longer
    than `READY_TIMEOUT_S`). Details `{cause}`: the store error's code, or `timeout`; never a
    host, port or role (the store's own message goes to the server's log)."""

    code = "store_not_ready"


class HeldNow(Collector):
    """What the service holds, read at each scrape: `harness_conversations_attached` (its live
    conversations) and `harness_store_connections{use}` (`Store.connection_use`: `claims`, each a
    PostgreSQL connection or a SQLite lock, and on PostgreSQL the read pool's `pooled`, `idle`
    and `waiting`)."""

    def __init__(self, service: ConversationService) -> None:
        self._service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("harness_conversations_attached", "Conversations this process holds now (each "
                                "holds its session's lock: on PostgreSQL, one connection).",
                                value=len(self._service.live_ids))
        use = self._service.store.connection_use()
        family = GaugeMetricFamily("harness_store_connections", "What the store holds open now: claims (held "
                                   "conversations), and the PostgreSQL read pool's size, idle connections and "
                                   "waiting requests.", labels=["use"])
        for name in ("claims", "pooled", "idle", "waiting"):
            family.add_metric([name], getattr(use, name))
        yield family


class ServerMetrics:
    """The metrics of one app, in a `CollectorRegistry` of its own so that several apps in one
    process (tests, a library embedding two) never share or collide. Times in seconds."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Histogram(
            "harness_http_request_duration_seconds",
            "HTTP requests by method, route template and status: latency to the end of the response (an "
            "event stream's whole life); `_count` is the number of requests.",
            ["method", "route", "status"], registry=self.registry)
        self.streams = Gauge("harness_event_streams_open", "Event streams (text/event-stream responses: "
                             "watchers) open now, by route template.", ["route"], registry=self.registry)
        self.turns_started = Counter("harness_turns_started", "Turns accepted in conversations live in this "
                                     "process.", registry=self.registry)
        self.turns_ended = Counter("harness_turns_ended", "Turns settled in this process, by outcome "
                                   "(completed, failed, aborted).", ["outcome"], registry=self.registry)
        self.turn_duration = Histogram(
            "harness_turn_duration_seconds", "From acceptance to settlement of the turns both seen here, "
            "by outcome.", ["outcome"], registry=self.registry,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640, float("inf")))

    def exposition(self) -> bytes:
        """The metrics in the Prometheus text format (`CONTENT_TYPE_LATEST`)."""
        return generate_latest(self.registry)

    @asynccontextmanager
    async def following(self, service: ConversationService) -> AsyncIterator[None]:
        """Count `service`'s turns from its feed, and log each attach
        (a claim of the conversation's session) and release, while the block runs; its store's
        conversations and connections are read at each scrape (`HeldNow`)."""
        connections = HeldNow(service)
        self.registry.register(connections)
        feed = service.feed.watch()
        task = asyncio.get_running_loop().create_task(self._follow(feed))
        try:
            yield
        finally:
            self.registry.unregister(connections)
            # One turn of the loop first: the follower, woken by what the block published last
            # (the releases of a server's shutdown), reads all of it before the close ends it.
            await asyncio.sleep(0)
            feed.close()
            await task

    async def _follow(self, feed: FeedWatch) -> None:
        accepted: dict[str, float] = {}  # conversation id -> when its open turn was accepted (monotonic)
        async for event in feed:
            conversation_id = event.conversation_id
            if isinstance(event, Presence):
                logger.info("conversation %s %s", conversation_id, "attached" if event.live else "released",
                            extra={"event": "claim" if event.live else "release", "conversation_id": conversation_id})
            elif isinstance(event, TurnActivity) and event.running:
                self.turns_started.inc()
                accepted[conversation_id] = time.monotonic()
            elif isinstance(event, TurnActivity) and event.outcome is not None:
                self.turns_ended.labels(event.outcome).inc()
                # A turn accepted before this process started (resumed) has no start seen here.
                if (started := accepted.pop(conversation_id, None)) is not None:
                    self.turn_duration.labels(event.outcome).observe(time.monotonic() - started)


class ObservedRequests:
    """ASGI middleware: one log line and one `ServerMetrics.requests` observation per HTTP
    request (method, route template, status, duration in ms, user), and the open event streams
    counted while they stream. The user is the one `current_user` found (`scope["state"]`), `-`
    for a route without one. Install it outermost, so refusals by other middleware are seen."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})  # the dict `request.state` writes to, shared with the routes
        started = time.perf_counter()
        status = 500  # an exception no handler answered becomes a 500 outside this middleware
        streaming: str | None = None

        async def observed(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                if _is_event_stream(message.get("headers", ())):
                    streaming = route_of(scope)
                    self.metrics.streams.labels(streaming).inc()
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            if streaming is not None:
                self.metrics.streams.labels(streaming).dec()
            seconds = time.perf_counter() - started
            route, method, user = route_of(scope), scope["method"], state.get("user") or "-"
            self.metrics.requests.labels(method, route, str(status)).observe(seconds)
            logger.info("%s %s %d %.1f ms %s", method, route, status, seconds * 1000, user,
                        extra={"event": "request", "method": method, "route": route, "status": status,
                               "duration_ms": round(seconds * 1000, 3), "user": user})


def route_of(scope: Scope) -> str:
    """The template of the route that matched (`/api/conversations/{conversation_id}`), or
    `NO_ROUTE`: never the raw path, which would carry ids and whatever a client made up."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else NO_ROUTE


def _is_event_stream(headers: object) -> bool:
    return any(name.lower() == b"content-type" and value.startswith(b"text/event-stream")
               for name, value in cast("list[tuple[bytes, bytes]]", headers))


async def server_metrics(request: Request) -> ServerMetrics:  # async: no thread pool hop (state.py)
    return cast(ServerMetrics, request.app.state.metrics)


Metrics = Annotated[ServerMetrics, Depends(server_metrics)]

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up and answers HTTP: 200 `{"status": "ok"}`, always, without a token and
    without touching the store (a liveness probe)."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "`store_not_ready`: the store did not answer"}})
async def readyz(state: State) -> Response:
    """Whether this server can serve: 200 `{"status": "ready"}` once its store answers a trivial
    read within `READY_TIMEOUT_S`, else 503 `store_not_ready` (`{code, message, details:
    {cause}}`), naming no host, port or role. No token needed (a readiness probe)."""
    context = Context({"server": "readyz"})
    try:
        await asyncio.wait_for(state.service.store.open_session(READY_PROBE_SESSION, context), READY_TIMEOUT_S)
    except SessionNotFound:
        pass  # the answer expected: the store answered
    except TimeoutError:
        return _not_ready("timeout", f"the store did not answer a read within {READY_TIMEOUT_S:g} s")
    except HarnessError as error:
        logger.warning("readiness: the store refused a read: [%s] %s", error.code, error.message,
                       extra={"event": "not_ready", "cause": error.code})
        return _not_ready(error.code, f"the store refused a read ({error.code})")
    return JSONResponse({"status": "ready"})


def _not_ready(cause: str, message: str) -> JSONResponse:
    return JSONResponse(StoreNotReady(message, cause=cause).to_json(), status_code=503)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
async def metrics(metrics: Metrics) -> Response:
    """This server's metrics in the Prometheus text format: HTTP requests (count and latency by
    route template and status), open event streams, turns started and ended by outcome, turn
    duration, conversations attached. No token needed: they name no user, conversation or text."""
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def install_observability(app: FastAPI) -> ServerMetrics:
    """Add the request log and metrics (`ObservedRequests`, outermost of the middleware added so
    far) and the operations routes to `app`, and return its metrics; the app's lifespan runs
    `ServerMetrics.following(service)` to count turns and attached conversations."""
    observed = app.state.metrics = ServerMetrics()
    app.add_middleware(ObservedRequests, metrics=observed)
    app.include_router(router)
    return observed
