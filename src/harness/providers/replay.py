"""A local HTTP server that answers SDK requests with recorded responses, for tests and benchmarks.

The real `openai` and `anthropic` SDKs talk to it over real HTTP: point their base URL at
`ReplayServer.base_url` (add `/v1` for the OpenAI SDK, whose default base URL includes it). Each
request gets the next queued `ReplayResponse` (status, content type, headers such as
`retry-after`, and a body sent whole or, for event streams, chunk by chunk), and every request is
recorded (method, path, headers, body) for assertions, except a GET of `.../models`: that is
answered with the server's `models` (OpenAI's list; 404 when it has none) and never takes a queued
response, since clients ask it on their own to pick a model. A body can pause at a `Hold` until the test
releases it, which also reports whether the client hung up meanwhile, and a response can end by
dropping the connection mid-body.

    with ReplayServer([ReplayResponse.from_file("stream.sse")]) as server:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="test")
        ...
        assert server.requests[0].json()["stream"] is True

From a shell (for end-to-end tests of the `harness` command): `python -m harness.providers.replay
[--port N] [--repeat] FILE...` serves the files in order (`.sse` as an event stream, `.json` as a
JSON body; `429:FILE` gives that status) and prints its base URL on the first line of stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import socket
import sys
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

_POLL_SECONDS = 0.01  # how often a held response checks whether it was released or the client left


class Hold:
    """A pause in a response body: the server sends what came before, then waits until
    `release()` or until the client disconnects (then `disconnected` is set and the rest is not
    sent). `reached` and `disconnected` are `threading.Event`s; from async code wait on them with
    `asyncio.to_thread(hold.disconnected.wait, seconds)`. Use each Hold in one response only."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.disconnected = threading.Event()
        self._released = threading.Event()

    def release(self) -> None:
        """Let the server send the rest of the body."""
        self._released.set()

    def _wait(self, connection: socket.socket, closing: threading.Event) -> bool:
        """Block the handler thread until released (True) or the client or server goes (False)."""
        self.reached.set()
        while not self._released.wait(_POLL_SECONDS):
            if closing.is_set():
                return False
            if _peer_closed(connection):
                self.disconnected.set()
                return False
        return True


def _peer_closed(connection: socket.socket) -> bool:
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"


@dataclass(frozen=True)
class ReplayResponse:
    """One scripted answer. `body` parts are sent in order (each part flushed as it is sent);
    an event stream, a body with a `Hold`, or `end="drop"` is sent with chunked transfer
    encoding, anything else with a Content-Length. `end="drop"` closes the connection without
    finishing the body, as a dropped connection would."""

    status: int = 200
    content_type: str = "application/json"
    body: tuple[bytes | Hold, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    end: Literal["complete", "drop"] = "complete"

    @staticmethod
    def sse(
        *parts: str | bytes | Hold,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        end: Literal["complete", "drop"] = "complete",
    ) -> ReplayResponse:
        """An event stream whose body is `parts` (SSE text, sent as written)."""
        body = tuple(part.encode() if isinstance(part, str) else part for part in parts)
        return ReplayResponse(status, SSE_CONTENT_TYPE, body, dict(headers or {}), end)

    @staticmethod
    def json(body: object, *, status: int = 200, headers: Mapping[str, str] | None = None) -> ReplayResponse:
        """A JSON response; `body` is a JSON value, or JSON text/bytes sent as they are."""
        if isinstance(body, str | bytes):
            data = body.encode() if isinstance(body, str) else body
        else:
            data = json.dumps(body).encode()
        return ReplayResponse(status, "application/json", (data,), dict(headers or {}))

    @staticmethod
    def from_file(path: str | Path, *, status: int = 200, headers: Mapping[str, str] | None = None) -> ReplayResponse:
        """A recorded body: `.sse` files as an event stream, others as JSON."""
        path = Path(path)
        data = path.read_bytes()
        if path.suffix == ".sse":
            return ReplayResponse.sse(data, status=status, headers=headers)
        return ReplayResponse.json(data, status=status, headers=headers)

    @property
    def chunked(self) -> bool:
        streamed = self.content_type.startswith("text/event-stream") or self.end == "drop"
        return streamed or any(isinstance(part, Hold) for part in self.body)


@dataclass(frozen=True)
class RecordedRequest:
    """A request as the server received it; header names are lower case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


class ReplayServer:
    """Serves queued `ReplayResponse`s to whoever connects, in order, on 127.0.0.1.

    With `repeat`, the script starts over when it runs out (benchmarks, CLI runs); otherwise a
    request with nothing queued gets HTTP 500 with a JSON error saying so. `models` are the model
    ids a GET of `.../models` lists (None: that GET gets 404). Thread-safe: the
    server runs in its own threads, so async tests can use it from any event loop. Use as a
    context manager, or `start()` and `close()`.
    """

    def __init__(
        self, responses: Iterable[ReplayResponse] = (), *, repeat: bool = False, host: str = "127.0.0.1", port: int = 0,
        models: Iterable[str] | None = None,
    ) -> None:
        self._models = None if models is None else list(models)
        self._script = list(responses)
        self._queue: deque[ReplayResponse] = deque(self._script)
        self._repeat = repeat
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self._closing = threading.Event()
        self._httpd = _HTTPServer((host, port), _Handler, self)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT`, with no path and no trailing slash."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    def enqueue(self, *responses: ReplayResponse) -> None:
        """Queue answers for the next requests."""
        with self._lock:
            self._queue.extend(responses)
            if self._repeat:
                self._script.extend(responses)

    def reset(self) -> None:
        """Forget recorded requests and queued answers."""
        with self._lock:
            self._requests.clear()
            self._queue.clear()
            self._script.clear()

    def start(self) -> ReplayServer:
        """Start serving in a background thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="replay-server", daemon=True
            )
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (the command-line entry)."""
        self._httpd.serve_forever(poll_interval=0.05)

    def close(self) -> None:
        """Stop serving, release held responses and hang up on open connections; idempotent."""
        self._closing.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread = None
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already gone
                connection.shutdown(socket.SHUT_RDWR)
        self._httpd.server_close()

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _next(self, request: RecordedRequest) -> ReplayResponse:
        with self._lock:
            self._requests.append(request)
            if not self._queue and self._repeat:
                self._queue.extend(self._script)
            if self._queue:
                return self._queue.popleft()
        message = f"replay server: no response queued for {request.method} {request.path}"
        return ReplayResponse.json({"error": {"message": message, "type": "replay_queue_empty"}}, status=500)

    def _answer(self, handler: _Handler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in handler.headers.items()}
        if handler.command == "GET" and handler.path.rstrip("/").endswith("/models"):
            response = self._model_list()
        else:
            response = self._next(RecordedRequest(handler.command, handler.path, headers, body))
        try:
            self._send(handler, response)
        except OSError:
            handler.close_connection = True  # the client went away mid-answer

    def _model_list(self) -> ReplayResponse:
        if self._models is None:
            return ReplayResponse.json({"error": {"message": "replay server: no model list", "type": "not_found"}},
                                       status=404)
        return ReplayResponse.json({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": 0, "owned_by": "replay"} for model_id in self._models]})

    def _send(self, handler: _Handler, response: ReplayResponse) -> None:
        handler.send_response(response.status)
        handler.send_header("Content-Type", response.content_type)
        for name, value in response.headers.items():
            handler.send_header(name, value)
        chunked = response.chunked
        if chunked:
            handler.send_header("Transfer-Encoding", "chunked")
        else:
            size = sum(len(part) for part in response.body if isinstance(part, bytes))
            handler.send_header("Content-Length", str(size))
        handler.end_headers()
        out = handler.wfile
        for part in response.body:
            if isinstance(part, Hold):
                if not part._wait(handler.connection, self._closing):
                    handler.close_connection = True
                    return
            elif part:
                out.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                out.flush()
        if response.end == "drop":
            handler.close_connection = True  # the server closes the socket with the body unfinished
        elif chunked:
            out.write(b"0\r\n\r\n")
            out.flush()

    def _track(self, connection: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[_Handler], replay: ReplayServer) -> None:
        self.replay = replay
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client hanging up is routine here
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' connection pools expect
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # Headers and body parts are separate small writes; with Nagle's algorithm each would wait
        # for the client's delayed ACK (40 ms), which no real server's stream does.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.replay._track(self.connection, True)

    def finish(self) -> None:
        self.server.replay._track(self.connection, False)
        super().finish()

    def do_POST(self) -> None:
        self.server.replay._answer(self)

    do_GET = do_PUT = do_PATCH = do_DELETE = do_POST

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read `requests`, not a log


def _response_for(argument: str) -> ReplayResponse:
    status, separator, path = argument.partition(":")
    if separator and status.isdigit() and len(status) == 3:
        return ReplayResponse.from_file(path, status=int(status))
    return ReplayResponse.from_file(argument)


def main(argv: list[str] | None = None) -> None:
    """`python -m harness.providers.replay [--port N] [--repeat] FILE...`: serve recorded bodies."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.providers.replay",
        description="Serve recorded provider responses in order; print the base URL on the first line.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="a .sse or .json body; STATUS:FILE sets the status")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    parser.add_argument("--repeat", action="store_true", help="start over when the files run out")
    args = parser.parse_args(argv)
    server = ReplayServer([_response_for(argument) for argument in args.files], repeat=args.repeat, port=args.port)
    print(server.base_url, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
