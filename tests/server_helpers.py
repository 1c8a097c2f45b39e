"""Builders shared by the server tests: the app over a faux-provider service, a client of it
through ASGI (its lifespan run), the app served by uvicorn on a free loopback port, and `harness
serve` in a process of its own, to be killed and started again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import uvicorn
from fastapi import FastAPI

from conversation_helpers import OffersTool, faux_service
from harness.conversation import AgentRegistry, ConversationService, ConversationSetup
from harness.messages import ModelIdentity
from harness.providers import FauxProvider, Model
from harness.providers.faux import FauxScript
from harness.runtime import DriveSettings, RunHooks
from harness.runtime.event_log import DEFAULT_EVENT_LOG_LIMIT
from harness.server import Approvals, Authenticator, LocalUser, ServerOptions, create_app
from harness.session import LaneConfig, Store
from test_cli_run import environment

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
             event_log_limit: int = DEFAULT_EVENT_LOG_LIMIT, drive: DriveSettings | None = None,
             models: Sequence[Model] = (), projects_file: Path | None = None) -> Served:
    """The app over a faux service answering `script`, with `tools` (their calls waiting for
    `approvals` when given, answered from this app or posted from another) and `agents` to
    delegate to, driven with `drive` (default: no frame interval), its projects listed in
    `projects_file`; every request is `USER` unless `auth` says otherwise."""
    hooks = RunHooks(before_tool=approvals.hook) if approvals is not None else RunHooks()
    setup = ConversationSetup(drive=drive or DriveSettings(frame_interval_s=0), hooks=hooks, agents=agents,
                              event_log_limit=event_log_limit, projects_file=projects_file,
                              on_approval=approvals.changed if approvals is not None else None)
    service, faux = faux_service(store, script, tools=tools, setup=setup, models=models)

    def new_lane(model: ModelIdentity | None) -> LaneConfig:
        return LaneConfig(model=model or FAUX, active_tools=[probe.tool.spec.name for probe in tools])

    app = create_app(service, auth or LocalUser(USER), new_lane=new_lane, approvals=approvals, options=options)
    return Served(app, service, faux)


@asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` through ASGI, with the app's lifespan run around it (start: resume what
    is open; end: close every live conversation), asking for a loopback host as a `--no-auth`
    server requires. Responses are read whole: no streams here."""
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
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


class ReplyText:
    """The streaming reply's text as a client of the native watch holds it: a `snapshot`, a
    `message_start` or a `message_update` carries the reply whole, a `message_delta` what it gained (issue 29, see
    `harness.server.streams`), a `message_end` ends it with the reply whole."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []

    def apply(self, event: SseEvent) -> str | None:
        """The reply's text after `event`; None when `event` does not show the reply's progress."""
        if event.name == "snapshot":
            operation = event.data["operation"]
            reply = operation["streaming_message"] if operation is not None else None
            if reply is None:
                return None
            self.blocks = list(reply["content"])
        elif event.name in ("message_start", "message_update") and event.data["message"]["role"] == "assistant":
            self.blocks = list(event.data["message"]["content"])
        elif event.name == "message_delta":
            for change in event.data["content"]:
                index = change["index"]
                if "block" in change:
                    self.blocks[index:index + 1] = [change["block"]]
                else:
                    key = "text" if self.blocks[index]["type"] == "text" else "thinking"
                    self.blocks[index] = {**self.blocks[index], key: self.blocks[index][key] + change["append"]}
        elif event.name == "message_end" and event.data["message"]["role"] == "assistant":
            self.blocks = []
            return "".join(block["text"] for block in event.data["message"]["content"] if block["type"] == "text")
        else:
            return None
        return "".join(block["text"] for block in self.blocks if block["type"] == "text")


def reply_texts(events: Sequence[SseEvent]) -> list[str]:
    """The streaming reply's text as the client held it after each event of `events` that shows
    its progress (`ReplyText`)."""
    reply = ReplyText()
    return [text for event in events if (text := reply.apply(event)) is not None]


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


SERVE_START_S = 60.0
"""A guard, not a wait: how long `harness serve` may take to import, open its store and listen."""


class ServeProcess:
    """`harness serve --no-auth` in a process of its own, on the SQLite store `home/harness.db` and
    one loopback port across restarts, with HARNESS_HOME `home`, working directory `home` and
    `env` (a model endpoint: `OPENAI_BASE_URL` and `OPENAI_API_KEY` of a replay server).

    `start()` returns once it listens, its lifespan having resumed the runs the store holds open;
    `kill()` SIGKILLs it, as a crash would, and returns once it is gone."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        with socket.socket() as probe:  # a free port, kept by every start
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log: list[str] = []  # what every start printed on stderr, to tell why one failed
        self._process: subprocess.Popen[str] | None = None

    async def start(self) -> None:
        listening = self._launch()
        started = await asyncio.to_thread(listening.wait, SERVE_START_S)
        if not started or self._process is None or self._process.poll() is not None:
            self.kill()
            raise AssertionError("harness serve did not start:\n" + "".join(self.log))

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def _launch(self) -> threading.Event:
        """Start the process; the event is set once it listens, or once it ended."""
        assert self._process is None, "already serving"
        process = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "serve", "--no-auth", "--port", str(self.port),
             "--store", f"sqlite:///{self.home / 'harness.db'}"],
            cwd=self.home, env=environment(self.home, **self.env), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._process = process
        listening = threading.Event()

        def read_stderr() -> None:  # to its end, so the pipe never fills
            assert process.stderr is not None
            with process.stderr as lines:
                for line in lines:
                    self.log.append(line)
                    if "Uvicorn running on" in line:
                        listening.set()
            listening.set()  # it ended

        threading.Thread(target=read_stderr, daemon=True).start()
        return listening


@asynccontextmanager
async def serve_process(home: Path, env: dict[str, str]) -> AsyncIterator[ServeProcess]:
    """`ServeProcess(home, env)` started; killed on leaving."""
    served = ServeProcess(home, env)
    await served.start()
    try:
        yield served
    finally:
        served.kill()


class Forwarder:
    """A TCP forwarder on a free loopback port to a PostgreSQL server (`forwarder`): `url` reaches
    the database through it, `refuse` makes it refuse new connections as a database that stops
    taking clients does, and `cut` drops every connection open now, as `pg_terminate_backend` or
    a network fault would, while new ones go through."""

    def __init__(self, url: str, server: asyncio.Server) -> None:
        self.port: int = server.sockets[0].getsockname()[1]
        parts = urlsplit(url)
        credentials, at, _ = parts.netloc.rpartition("@")
        self.url = urlunsplit(parts._replace(netloc=f"{credentials}{at}127.0.0.1:{self.port}"))
        self.server = server
        self.writers: list[asyncio.StreamWriter] = []
        self.piping: list[asyncio.Future[tuple[None, None]]] = []

    def refuse(self) -> None:
        self.server.close()

    def cut(self) -> None:
        writers, self.writers = self.writers, []
        for writer in writers:  # each pipe then reads its end and finishes
            writer.close()


@asynccontextmanager
async def forwarder(url: str) -> AsyncIterator[Forwarder]:
    """A `Forwarder` to the PostgreSQL server of `url`, for the block."""
    upstream_port = urlsplit(url).port or 5432

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def connect_through(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        forwarded.writers.extend([writer, upstream_writer])
        forwarded.piping.append(asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer)))
        await forwarded.piping[-1]

    forwarded = Forwarder(url, await asyncio.start_server(connect_through, "127.0.0.1", 0))
    try:
        yield forwarded
    finally:
        forwarded.server.close()
        forwarded.cut()
        await asyncio.gather(*forwarded.piping, return_exceptions=True)


class StalledClient:
    """A client of `app`'s SSE stream at `path`, spoken to through ASGI directly: it reads the
    response until the snapshot (or the bytes `first`), then stops reading (`send` blocks) until
    `release`; it never disconnects. `body` holds what it read; `run()` is the request,
    `snapshot_sent` set once the snapshot was read (a reader that stopped: the server must not
    wait for it)."""

    def __init__(self, app: FastAPI, path: str, *, first: bytes = b"snapshot") -> None:
        self.app, self.path, self.first = app, path, first
        self.body = bytearray()
        self.snapshot_sent, self._released = asyncio.Event(), asyncio.Event()

    def release(self) -> None:
        self._released.set()

    async def run(self) -> None:
        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the client never disconnects
            return {}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.body":
                self.body.extend(message.get("body", b""))
                if self.first in self.body:
                    self.snapshot_sent.set()
                    await self._released.wait()

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": self.path, "raw_path": b"", "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
                 "app": self.app}
        await self.app(scope, receive, send)
