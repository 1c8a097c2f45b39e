"""Builders shared by the server tests: the app over a faux-provider service, a client of it
through ASGI (its lifespan run), and the app served by uvicorn on a free loopback port."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from conversation_helpers import OffersTool, faux_service
from harness.conversation import AgentRegistry, ConversationService, ConversationSetup
from harness.messages import ModelIdentity
from harness.providers import FauxProvider
from harness.providers.faux import FauxScript
from harness.runtime import DEFAULT_EVENT_LOG_LIMIT, DriveSettings, RunHooks
from harness.server import Approvals, Authenticator, LocalUser, ServerOptions, create_app
from harness.session import LaneConfig, Store

USER = "alice"
FAUX = ModelIdentity(provider="faux", model_id="faux")


@dataclass(frozen=True)
class Served:
    app: FastAPI
    service: ConversationService
    faux: FauxProvider


def faux_app(store: Store, script: FauxScript = (), *, auth: Authenticator | None = None,
             tools: Sequence[OffersTool] = (), approvals: Approvals | None = None,
             options: ServerOptions | None = None, agents: AgentRegistry | None = None,
             event_log_limit: int = DEFAULT_EVENT_LOG_LIMIT) -> Served:
    """The app over a faux service answering `script`, with `tools` (their calls waiting for
    `approvals` when given) and `agents` to delegate to; every request is `USER` unless `auth`
    says otherwise."""
    hooks = RunHooks(before_tool=approvals.hook) if approvals is not None else RunHooks()
    setup = ConversationSetup(drive=DriveSettings(frame_interval_s=0), hooks=hooks, agents=agents,
                              event_log_limit=event_log_limit)
    service, faux = faux_service(store, script, tools=tools, setup=setup)

    def new_lane(model: ModelIdentity | None) -> LaneConfig:
        return LaneConfig(model=model or FAUX, active_tools=[probe.tool.spec.name for probe in tools])

    app = create_app(service, auth or LocalUser(USER), new_lane=new_lane, approvals=approvals, options=options)
    return Served(app, service, faux)


@asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` through ASGI, with the app's lifespan run around it (start: resume what
    is open; end: close every live conversation). Responses are read whole: no streams here."""
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://harness.test") as client:
        yield client


async def sse_events(client: httpx.AsyncClient, path: str, count: int, *, opened: asyncio.Event | None = None,
                     headers: dict[str, str] | None = None) -> list[tuple[str, Any]]:
    """The first `count` events of the SSE stream at `path`, as (event name, parsed data);
    comments are skipped, but the first line read sets `opened`. Returns early if the stream ends."""
    events: list[tuple[str, Any]] = []
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        name, data = "message", []
        async for line in response.aiter_lines():
            if opened is not None:
                opened.set()
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                events.append((name, json.loads("\n".join(data))))
                name, data = "message", []
                if len(events) == count:
                    break
    return events


@dataclass(frozen=True)
class SseEvent:
    """One event of an SSE stream: its name, its own `id:` (None when it has none) and its data."""

    name: str
    id: str | None
    data: Any


async def sse_until(client: httpx.AsyncClient, path: str, until: Callable[[SseEvent], bool], *,
                    last_event_id: str | None = None, opened: asyncio.Event | None = None) -> list[SseEvent]:
    """The events of the SSE stream at `path` (sent with `Last-Event-ID` when given) up to and
    including the first `until` accepts; then the connection is dropped. The first event read sets
    `opened`. Returns early if the stream ends."""
    events: list[SseEvent] = []
    event_id: str | None
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else None
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        name, event_id, data = "message", None, list[str]()
        async for line in response.aiter_lines():
            if not line:
                if data:
                    events.append(SseEvent(name, event_id, json.loads("\n".join(data))))
                    if opened is not None:
                        opened.set()
                    if until(events[-1]):
                        break
                name, event_id, data = "message", None, list[str]()
                continue
            field, _, value = line.partition(":")  # a comment (": heartbeat") has no field: skipped
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "id":
                event_id = value
            elif field == "data":
                data.append(value)
    return events


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """`app` served by uvicorn in this event loop on a free loopback port; yields its base URL.
    Leaving stops the server (its lifespan's shutdown included), cutting streams still open (a
    browser's watch) at once rather than after `STREAM_GRACE_S`."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=0))
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        while not server.started:  # uvicorn sets a flag, not an event: poll it
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        listener.close()
