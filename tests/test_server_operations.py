"""Running `harness serve` as a service (issue 29, Operations): a log line per request, per turn
start and end and per conversation attached and released, JSON lines with `--log-format json`,
the page's URL printed once it listens, `/healthz` and `/readyz` (503 `store_not_ready` when the
store stops answering, on SQLite and PostgreSQL), and Prometheus metrics at `/metrics`; and the
worker's claim, turn and release lines."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from conversation_helpers import faux_service
from drive_helpers import FAUX, within
from harness.cli.config import local_user
from harness.cli.logs import JsonFormatter
from harness.context import Context
from harness.conversation import ConversationSetup
from harness.providers.faux import failure, reply
from harness.runtime import DriveSettings, RetryPolicy, Settled
from harness.server import StoreTokens, observability
from harness.session import LaneConfig, Store, connect
from harness.worker import Worker, WorkerOptions
from server_helpers import USER, asgi_client, faux_app, serving, sse_until
from test_cli_run import environment

MESSAGES = "/api/conversations/{conversation_id}/messages"


class Lines(logging.Handler):
    """The records the `harness` loggers emit at INFO while it is installed; `until` awaits one."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []
        self._added = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self._added.set()

    def of(self, event: str) -> list[logging.LogRecord]:
        return [record for record in self.records if getattr(record, "event", None) == event]

    async def until(self, event: str, match: Callable[[logging.LogRecord], bool] = lambda _: True) -> logging.LogRecord:
        while True:
            found = [record for record in self.of(event) if match(record)]
            if found:
                return found[0]
            self._added.clear()
            await self._added.wait()


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("harness")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
async def store(tmp_path: Path, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(f"sqlite:///{tmp_path}/harness.db", ctx)
    yield opened
    await opened.close()


async def _turn(app: FastAPI, client: httpx.AsyncClient, text: str = "Hello",
                headers: dict[str, str] | None = None) -> tuple[str, str]:
    """A new conversation and a turn in it driven to its end: (conversation id, operation id)."""
    conversation = (await client.post("/api/conversations", json={}, headers=headers)).json()["id"]
    answer = await client.post(f"/api/conversations/{conversation}/messages", json={"text": text}, headers=headers)
    assert answer.status_code == 202
    operation = answer.json()["operation_id"]
    outcome = await within(app.state.server.drives.wait(operation))
    assert isinstance(outcome, Settled)
    return conversation, operation


def _fields(record: logging.LogRecord, *names: str) -> tuple[object, ...]:
    """The fields a log line was given (`extra=`), by name."""
    return tuple(record.__dict__.get(name) for name in names)


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of a `/metrics` answer by (name, labels)."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


async def test_each_request_logs_method_route_template_status_duration_and_user(
        store: Store, ctx: Context, lines: Lines) -> None:
    """Issue 29: one line per request, naming the route's template (not the path with its ids),
    the status, the duration in ms and the token's user; `-` for a request without one."""
    token, _ = await store.tokens.create("ada", ctx)
    served = faux_app(store, ["Hello back."], auth=StoreTokens(store.tokens))
    bearer = {"Authorization": f"Bearer {token}"}
    async with asgi_client(served.app) as client:
        conversation, _ = await _turn(served.app, client, headers=bearer)
        await client.get(f"/api/conversations/{conversation}", headers=bearer)
        await client.get("/api/conversations")

    read, refused = lines.of("request")[-2:]
    assert _fields(read, "method", "route", "status", "user") == (
        "GET", "/api/conversations/{conversation_id}", 200, "ada")
    (duration,) = _fields(read, "duration_ms")
    assert isinstance(duration, float)
    assert duration > 0
    assert read.getMessage().startswith("GET /api/conversations/{conversation_id} 200 ")
    assert _fields(refused, "route", "status", "user") == ("/api/conversations", 401, "-")


async def test_a_turn_logs_its_start_and_its_end_with_conversation_operation_and_outcome(
        store: Store, lines: Lines) -> None:
    """Issue 29: the server's drive of a turn logs `turn_start` and `turn_end` (outcome
    `completed`, `failed` with its error code, `aborted` with its cause)."""
    served = faux_app(store, ["Hello back."])
    async with asgi_client(served.app) as client:
        conversation, operation = await _turn(served.app, client)

    start, end = lines.of("turn_start")[0], lines.of("turn_end")[0]
    assert _fields(start, "conversation_id", "operation_id") == (conversation, operation)
    assert _fields(end, "conversation_id", "operation_id", "outcome") == (conversation, operation, "completed")


async def test_attaching_and_releasing_a_conversation_are_logged(store: Store, lines: Lines) -> None:
    """Issue 29: the server's claim of a conversation (attached: it holds its session's lock)
    and its release each log a line with the conversation id."""
    served = faux_app(store, [])
    async with asgi_client(served.app) as client:
        conversation = (await client.post("/api/conversations", json={})).json()["id"]
        await within(lines.until("claim"))
        await client.post(f"/api/conversations/{conversation}/close")
        released = await within(lines.until("release"))

    assert _fields(lines.of("claim")[0], "conversation_id") == _fields(released, "conversation_id") == (conversation,)


async def test_a_conversation_still_attached_when_the_server_stops_logs_its_release(store: Store,
                                                                                    lines: Lines) -> None:
    """Issue 29: the server's shutdown releases every conversation it holds, and says so."""
    served = faux_app(store, [])
    async with asgi_client(served.app) as client:
        conversation = (await client.post("/api/conversations", json={})).json()["id"]

    assert [_fields(record, "conversation_id") for record in lines.of("release")] == [(conversation,)]


async def test_no_log_line_carries_a_token_or_the_text_of_a_message(store: Store, ctx: Context,
                                                                    lines: Lines) -> None:
    """Issue 29: of everything a turn logs, as JSON lines with every field, nothing is the bearer
    token or what the person or the model wrote."""
    token, _ = await store.tokens.create("ada", ctx)
    served = faux_app(store, ["the model's confidential answer"], auth=StoreTokens(store.tokens))
    async with asgi_client(served.app) as client:
        await _turn(served.app, client, "my confidential prompt", headers={"Authorization": f"Bearer {token}"})

    written = "\n".join(JsonFormatter().format(record) for record in lines.records)
    assert "turn_end" in written
    assert "request" in written
    assert "confidential" not in written
    assert token not in written


async def test_metrics_count_requests_turns_their_duration_and_attached_conversations(
        store: Store, lines: Lines) -> None:
    """Issue 29: `/metrics` (Prometheus text) counts requests by route template and status,
    turns started and ended by outcome with their duration, conversations attached now, and the
    store's claims and pool."""
    served = faux_app(store, ["Hello back."])
    async with asgi_client(served.app) as client:
        conversation, _ = await _turn(served.app, client)
        held = _samples((await client.get("/metrics")).text)
        await client.post(f"/api/conversations/{conversation}/close")
        await within(lines.until("release"))
        after = _samples((await client.get("/metrics")).text)

    posted = frozenset({("method", "POST"), ("route", MESSAGES), ("status", "202")})
    assert after[("harness_http_request_duration_seconds_count", posted)] == 1
    assert after[("harness_turns_started_total", frozenset())] == 1
    assert after[("harness_turns_ended_total", frozenset({("outcome", "completed")}))] == 1
    assert after[("harness_turn_duration_seconds_count", frozenset({("outcome", "completed")}))] == 1
    assert held[("harness_conversations_attached", frozenset())] == 1
    assert after[("harness_conversations_attached", frozenset())] == 0
    claims = ("harness_store_connections", frozenset({("use", "claims")}))
    assert (held[claims], after[claims]) == (1, 0)
    if store.backend.kind == "postgres":  # the read pool holds at least the connection it opened with
        assert after[("harness_store_connections", frozenset({("use", "pooled")}))] >= 1


async def test_open_event_streams_are_counted_by_route(store: Store) -> None:
    """Issue 29: a watcher's open `/events` stream is one of `harness_event_streams_open` for
    its route while it streams."""
    served = faux_app(store, [])
    opened = asyncio.Event()
    async with serving(served.app) as url, httpx.AsyncClient(base_url=url) as client:
        conversation = (await client.post("/api/conversations", json={})).json()["id"]
        watch = asyncio.create_task(sse_until(client, f"/api/conversations/{conversation}/events",
                                              lambda _: False, opened=opened))
        await within(opened.wait())
        watching = _samples((await client.get("/metrics")).text)
        watch.cancel()

    events = frozenset({("route", "/api/conversations/{conversation_id}/events")})
    assert watching[("harness_event_streams_open", events)] == 1


async def test_two_apps_in_one_process_keep_metrics_of_their_own(store: Store) -> None:
    """Issue 29: each app has its own registry: a second app starts (the global registry would
    refuse its metrics' names) and counts none of the first one's requests."""
    first, second = faux_app(store, []), faux_app(store, [])
    async with asgi_client(first.app) as one, asgi_client(second.app) as other:
        await one.get("/healthz")
        counted = _samples((await other.get("/metrics")).text)

    health = frozenset({("method", "GET"), ("route", "/healthz"), ("status", "200")})
    assert ("harness_http_request_duration_seconds_count", health) not in counted


async def test_health_readiness_and_metrics_need_no_token(store: Store) -> None:
    """Issue 29: probes and scrapers carry no token: `/healthz`, `/readyz` and `/metrics`
    answer 200 on a server whose API routes need one."""
    served = faux_app(store, [], auth=StoreTokens(store.tokens))
    async with asgi_client(served.app) as client:
        health, ready, metrics = [await client.get(path) for path in ("/healthz", "/readyz", "/metrics")]
        api = await client.get("/api/conversations")

    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert api.status_code == 401


async def test_the_api_description_covers_the_event_streams_and_every_door(store: Store) -> None:
    """`/openapi.json`, which `/docs` reads, answers: FastAPI cannot tell the status of the event
    streams' own response class by itself, and describing them was a 500 for the whole API."""
    served = faux_app(store, [])
    async with asgi_client(served.app) as client:
        described = await client.get("/openapi.json")

    assert described.status_code == 200
    paths = described.json()["paths"]
    for path in ("/api/conversations/{conversation_id}/events", "/api/feed", "/api/chat",
                 "/threads/{conversation_id}/runs/stream", "/api/gardens"):
        assert path in paths


async def test_readiness_fails_with_a_typed_503_when_the_sqlite_store_is_closed_under_it(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """Issue 29: a store that no longer answers makes `/readyz` 503 `store_not_ready`, its cause
    the store error's code and nothing of where the store is; `/healthz` still answers."""
    served = faux_app(store, [])
    async with asgi_client(served.app) as client:
        await store.close(ctx)
        ready = await client.get("/readyz")
        health = await client.get("/healthz")

    assert ready.status_code == 503
    assert ready.json()["code"] == "store_not_ready"
    assert ready.json()["details"] == {"cause": "store_closed"}
    assert str(tmp_path) not in ready.text
    assert health.status_code == 200


@pytest.mark.postgres
async def test_readiness_fails_while_postgresql_stops_answering_and_recovers_after(
        postgres_schema_url: str, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a PostgreSQL store that stops answering (its sessions table locked by another
    client) makes `/readyz` 503 `store_not_ready` (cause `timeout`) within `READY_TIMEOUT_S`,
    naming no host, port or role; once it answers again, 200."""
    monkeypatch.setattr(observability, "READY_TIMEOUT_S", 0.3)
    opened = await connect(postgres_schema_url, ctx)
    try:
        served = faux_app(opened, [])
        async with asgi_client(served.app) as client, \
                await psycopg.AsyncConnection.connect(postgres_schema_url) as locker:
            await locker.execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")  # held until the rollback
            stopped = await client.get("/readyz")
            await locker.rollback()
            again = await client.get("/readyz")
    finally:
        await opened.close()

    assert stopped.status_code == 503
    assert (stopped.json()["code"], stopped.json()["details"]) == ("store_not_ready", {"cause": "timeout"})
    for where in ("127.0.0.1", "localhost", "5432", "postgres"):
        assert where not in stopped.text
    assert again.status_code == 200


async def test_serve_prints_the_page_url_and_logs_json_lines(tmp_path: Path) -> None:
    """Issue 29: `harness serve --log-format json` writes one JSON object per line on stderr,
    among them the page's URL once it listens (the port it bound) and each request's line."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harness.cli", "serve", "--no-auth", "--port", "0", "--log-format", "json",
        "--store", f"sqlite:///{tmp_path / 'harness.db'}", cwd=tmp_path, env=environment(tmp_path),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    written: list[dict[str, object]] = []

    async def line_until(event: str, route: str | None = None) -> dict[str, object]:
        assert process.stderr is not None
        while True:
            raw = await process.stderr.readline()
            assert raw, "harness serve ended:\n" + "\n".join(map(str, written))
            written.append(json.loads(raw))  # every line is one JSON object
            if written[-1].get("event") == event and route in (None, written[-1].get("route")):
                return written[-1]

    try:
        listening = await within(line_until("listening"), 60)
        url = str(listening["url"])
        async with httpx.AsyncClient(base_url=url) as client:
            page = await client.get("/")
            await client.get("/api/conversations")
        request = await within(line_until("request", "/api/conversations"))
    finally:
        process.send_signal(signal.SIGTERM)
        await within(process.wait(), 30)

    assert url.startswith("http://127.0.0.1:")
    assert not url.endswith(":0/")
    assert listening["message"] == f"Harness serving on {url} (the page), API docs at {url}docs"
    assert page.status_code == 200
    assert (request["status"], request["user"], request["level"]) == (200, local_user(), "INFO")


@pytest.mark.postgres
async def test_a_worker_logs_its_claim_the_turn_and_its_release(postgres_schema_url: str, ctx: Context,
                                                                lines: Lines) -> None:
    """Issue 29: a worker logs claiming a conversation, the turn it drives (start, and end with
    its outcome) and letting go, each with the conversation id (and the operation id)."""
    opened = await connect(postgres_schema_url, ctx)
    try:
        api, _ = faux_service(opened, [])
        conversation = await api.create(USER, LaneConfig(model=FAUX), ctx)
        accepted = await conversation.admit("hello", ctx)
        await api.close(USER, conversation.id, ctx)
        service, _ = faux_service(opened, ["hi"])
        worker = Worker(service, WorkerOptions(poll_s=0.05))
        running = asyncio.get_running_loop().create_task(worker.run(ctx))
        released = await within(lines.until("release"))
        worker.stop()
        await within(running)
    finally:
        await opened.close()

    claimed, started, ended = lines.of("claim")[0], lines.of("turn_start")[0], lines.of("turn_end")[0]
    assert _fields(claimed, "conversation_id") == _fields(released, "conversation_id") == (conversation.id,)
    assert _fields(started, "conversation_id", "operation_id") == (conversation.id, accepted.operation_id)
    assert _fields(ended, "conversation_id", "operation_id", "outcome") == (
        conversation.id, accepted.operation_id, "completed")


@pytest.mark.postgres
async def test_a_worker_says_why_a_turn_waits_for_a_retry_and_when_it_is_due(
        postgres_schema_url: str, ctx: Context, lines: Lines) -> None:
    """Issue 29: a turn whose model failed transiently ends its drive `waiting_retry`, and the
    line says why: the attempt it will make, how long until it is due and the failure, which
    the retry then answers."""
    opened = await connect(postgres_schema_url, ctx)
    try:
        api, _ = faux_service(opened, [])
        conversation = await api.create(USER, LaneConfig(model=FAUX), ctx)
        await conversation.admit("hello", ctx)
        await api.close(USER, conversation.id, ctx)
        setup = ConversationSetup(drive=DriveSettings(frame_interval_s=0, retry=RetryPolicy(base_delay_ms=1_000)))
        service, _ = faux_service(opened, [failure("retryable", "overloaded", status=529), reply("hi")],
                                  setup=setup)
        worker = Worker(service, WorkerOptions(poll_s=0.05))
        running = asyncio.get_running_loop().create_task(worker.run(ctx))
        completed = await within(lines.until("turn_end", lambda record: _fields(record, "outcome") == ("completed",)))
        worker.stop()
        await within(running)
    finally:
        await opened.close()

    waiting = lines.of("turn_end")[0]
    assert _fields(waiting, "outcome") == ("waiting_retry",)
    reason = _fields(waiting, "reason")[0]
    assert isinstance(reason, str)
    assert re.fullmatch(r"attempt 2 in (0\.\d|1\.0) s after: overloaded", reason), reason
    assert waiting.getMessage().endswith(f": waiting_retry ({reason})")
    assert _fields(completed, "reason") == (None,)
