"""Running the app: uvicorn on a host and port, and the rule that only a loopback server may go
without authentication."""

from __future__ import annotations

import ipaddress
import logging
import socket

import uvicorn
from fastapi import FastAPI

from harness.errors import HarnessError

logger = logging.getLogger(__name__)

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
    server finishes them). Once it listens it logs where: `Harness serving on URL (the page), API
    docs at URLdocs`, the port the one bound (`port=0`: a free one).

    Logging is the caller's to configure (`harness serve --log-format`): uvicorn's records go to
    the `uvicorn` loggers as they are, and its access log is off, since the app logs one line per
    request itself (`harness.server.observability`)."""
    config = uvicorn.Config(app, host=host, port=port, log_config=None, log_level="info", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=STREAM_GRACE_S)
    await _Server(config).serve()


class _Server(uvicorn.Server):
    """uvicorn's server, saying where the page is once it listens (uvicorn's own line names the
    address only). A startup that fails exits inside `super().startup`, saying why."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        bound_port = self.servers[0].sockets[0].getsockname()[1]
        host = self.config.host
        url = f"http://{f'[{host}]' if ':' in host else host}:{bound_port}/"
        logger.info("Harness serving on %s (the page), API docs at %sdocs", url, url,
                    extra={"event": "listening", "url": url})
