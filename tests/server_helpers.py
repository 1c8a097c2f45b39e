"""Builders shared by the server tests: the app over a faux-provider service, a client of it
through ASGI (its lifespan run), and the app served by uvicorn on a free loopback port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI

from conversation_helpers import OffersTool, faux_service
from harness.conversation import ConversationService, ConversationSetup
from harness.providers import FauxProvider
from harness.providers.faux import FauxScript
from harness.server import Authenticator, LocalUser, ServerOptions, create_app
from harness.session import Store

USER = "alice"


@dataclass(frozen=True)
class Served:
    app: FastAPI
    service: ConversationService
    faux: FauxProvider


def faux_app(store: Store, script: FauxScript = (), *, auth: Authenticator | None = None,
             tools: Sequence[OffersTool] = (), setup: ConversationSetup | None = None,
             options: ServerOptions | None = None) -> Served:
    """The app over a faux service answering `script` with `tools`; every request is `USER` unless
    `auth` says."""
    service, faux = faux_service(store, script, tools=tools, setup=setup)
    return Served(create_app(service, auth or LocalUser(USER), options=options), service, faux)


@asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` through ASGI, with the app's lifespan run around it (start: resume what
    is open; end: close every live conversation). Responses are read whole: no streams here."""
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://harness.test") as client:
        yield client


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """`app` served by uvicorn in this event loop on a free loopback port; yields its base URL.
    Leaving stops the server (its lifespan's shutdown included)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
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
