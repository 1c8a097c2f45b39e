"""What the server refuses of a client before any route runs, and the bounds of the free-form
fields its routes take (issue 29, hostile clients).

- A `--no-auth` server (`LocalUser`) answers only requests whose `Host` is a loopback name or
  address and whose `Origin`, when sent, is too: a page at `evil.example` that a rebinding DNS
  points at 127.0.0.1 reaches the port, but its requests carry its own name, so they are refused
  (403 `host_not_allowed`, `origin_not_allowed`) before they can list, create or run anything.
- No request body takes more than `MAX_REQUEST_BYTES` (413 `request_too_large`): a route never
  parses more than that.
- Free-form fields have bounds (`NAME_CHARS`, `TEXT_CHARS`, `SHELL_COMMAND_CHARS`,
  `METADATA_BYTES`), refused with 400 `invalid_input` naming the field; a prompt's own bound is
  acceptance's (`prompt_too_large`, 413).
"""

from __future__ import annotations

import json
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, Field, JsonValue
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harness.errors import HarnessError
from harness.messages import CleanJsonObject
from harness.server.errors import status_of
from harness.server.listen import is_loopback

MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""The most a request body may take. The largest a route needs is a prompt with its images, which
acceptance bounds at 4 MiB as the journal stores it (`prompt_too_large`); the rest is headroom for
the JSON around it (the AI SDK door's earlier messages)."""

NAME_CHARS = 200
"""A conversation's name, a garden's name as a client gives it."""

TEXT_CHARS = 100_000
"""A goal's text, a typed command line, a compaction's instructions: about 25,000 tokens."""

SHELL_COMMAND_CHARS = 16_384
"""A shell command (`.../shell`): it is one argument of `sh -c`, and Linux takes at most 128 KiB
for one argument: 16,384 characters take at most 64 KiB of UTF-8."""

METADATA_BYTES = 64 * 1024
"""A LangGraph thread's or run's `metadata`, as compact UTF-8 JSON."""


class HostNotAllowed(HarnessError):
    """A `--no-auth` server was asked under a `Host` that is not a loopback name or address (a
    DNS-rebinding page, most likely); nothing ran. Details `{host}`."""

    code = "host_not_allowed"


class OriginNotAllowed(HarnessError):
    """A `--no-auth` server was asked from a page whose `Origin` is not a loopback one; nothing
    ran. Details `{origin}`."""

    code = "origin_not_allowed"


class RequestTooLarge(HarnessError):
    """The request body takes more than `MAX_REQUEST_BYTES`; nothing ran. Details `{limit_bytes}`."""

    code = "request_too_large"


def _loopback_refusal(headers: Headers) -> HarnessError | None:
    host = headers.get("host")
    if host is not None and not is_loopback(urlsplit(f"//{host}").hostname or ""):
        return HostNotAllowed(f"this server serves every request as its local user, so it answers only "
                              f"requests for a loopback host (localhost, 127.0.0.1, [::1]), not {host[:100]!r}",
                              host=host[:100])
    origin = headers.get("origin")
    if origin is not None and not is_loopback(urlsplit(origin).hostname or ""):
        return OriginNotAllowed(f"this server serves every request as its local user, so it answers only pages "
                                f"served from a loopback host, not {origin[:100]!r}", origin=origin[:100])
    return None


class _LoopbackOnly:
    """Refuse (403) a request whose `Host` or `Origin` is not loopback, before it is routed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            refusal = _loopback_refusal(Headers(scope=scope))
            if refusal is not None:
                await JSONResponse(refusal.to_json(), status_code=status_of(refusal))(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _BodyLimit:
    """Refuse (413) a body over `MAX_REQUEST_BYTES`: at once when its `Content-Length` says so,
    else as soon as the bytes read pass it (a chunked body)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > MAX_REQUEST_BYTES:
            refusal = _too_large()
            await JSONResponse(refusal.to_json(), status_code=status_of(refusal))(scope, receive, send)
            return
        received = 0

        async def bounded() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > MAX_REQUEST_BYTES:
                # Raised inside the route's body read, which passes an HTTPException on as it is.
                raise HTTPException(413, _too_large().message)
            return message

        await self.app(scope, bounded, send)


def _too_large() -> RequestTooLarge:
    return RequestTooLarge(f"a request body takes at most {MAX_REQUEST_BYTES:,} bytes "
                           f"({MAX_REQUEST_BYTES // 2**20} MiB)", limit_bytes=MAX_REQUEST_BYTES)


def install_guards(app: FastAPI, *, loopback_only: bool) -> None:
    """Refuse, before routing, bodies over `MAX_REQUEST_BYTES` and, with `loopback_only` (a
    `--no-auth` server), requests for a host or from an origin that is not loopback."""
    app.add_middleware(_BodyLimit)
    if loopback_only:
        app.add_middleware(_LoopbackOnly)  # added last, so it runs first


def _no_nul(command: str) -> str:
    if "\x00" in command:
        raise ValueError("a shell command cannot hold a NUL character")
    return command


def _bounded(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > METADATA_BYTES:
        raise ValueError(f"metadata takes at most {METADATA_BYTES:,} bytes as JSON, not {size:,}")
    return value


ShellCommand = Annotated[str, Field(min_length=1, max_length=SHELL_COMMAND_CHARS), AfterValidator(_no_nul)]
"""A shell command: 1 to `SHELL_COMMAND_CHARS` characters, no NUL (no process can take one)."""

Metadata = Annotated[CleanJsonObject, AfterValidator(_bounded)]
"""A JSON object a client attaches (LangGraph `metadata`): its text cleaned as all text from
outside is (a lone surrogate becomes U+FFFD, so it can be stored), at most `METADATA_BYTES`."""
