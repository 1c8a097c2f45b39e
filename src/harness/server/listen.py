"""Running the app: uvicorn on a host and port, and the rule that only a loopback server may go
without authentication."""

from __future__ import annotations

import ipaddress

import uvicorn
from fastapi import FastAPI

from harness.errors import HarnessError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
STREAM_GRACE_S = 3
"""How long a stopping server lets open responses finish before it cuts them. Event streams never
finish by themselves, so without a bound a watching browser tab would keep the server up; a cut
client reconnects to the next server and resumes (`Last-Event-ID`, `resumeStream()`)."""


class NoAuthNeedsLoopback(HarnessError):
    """`--no-auth` was asked for on a host other machines can reach; nothing was started.
    Details `{host}`."""

    code = "no_auth_needs_loopback"


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only: `localhost` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_open_no_auth(host: str) -> None:
    """Raise `NoAuthNeedsLoopback` unless `host` is loopback: without tokens, anyone who can reach
    the port would be the local user."""
    if not is_loopback(host):
        raise NoAuthNeedsLoopback(f"--no-auth serves every request as the local user, so it listens on a loopback "
                                  f"address only (127.0.0.1, ::1 or localhost), not {host!r}; create a token "
                                  f"with `harness token create USER` instead", host=host)


async def serve(app: FastAPI, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve `app` with uvicorn until interrupted (Ctrl-C or SIGTERM end it cleanly: open event
    streams are cut after `STREAM_GRACE_S`, then the app's shutdown halts its drives so the next
    server finishes them)."""
    config = uvicorn.Config(app, host=host, port=port, log_level="info", lifespan="on",
                            timeout_graceful_shutdown=STREAM_GRACE_S)
    await uvicorn.Server(config).serve()
