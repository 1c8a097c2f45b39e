"""A bounded load on `harness serve` over loopback: conversations taking turns while several watchers
each follow every one of them over the native SSE watch, dropping their connection now and then and
resuming with `Last-Event-ID`.

Run: `.venv/bin/python -m bench.serve_load [--conversations 20] [--watchers 3] [--turns 5]
[--reconnect-every 40] [--workers N --store postgresql://...] [--json]`.

The app is `create_app` served by uvicorn on 127.0.0.1 in this process; the model is the faux
provider, whose every turn streams a short text, calls one tool, then answers. The clients (each
conversation's sender and its watchers) are httpx clients in `--client-processes` other processes
(`bench.serve_load_clients`, told their conversations on standard input), so the server's
event loop runs the server alone and the latency is the server's, plus what the clients' own loops
add on a shared machine; one client (one connection) per watcher and per conversation's sender.
Two modes:

- `--workers 0` (the default): the server drives every turn itself, on a SQLite store in a
  temporary directory.
- `--workers N`: `harness serve --workers external` on a fresh schema of the PostgreSQL server at
  `--store`, with N worker processes (`bench.faux_worker`) driving, each taking up to
  conversations/N sessions at once, so every mode can run every conversation at the same time;
  the server only accepts, wakes the workers and follows their runs for the watchers.

It prints:

1. runs per second and events per second: the turns settled, and every SSE event the watchers
   received (durable and live), over the load's wall time, and the durable events committed per
   second; and the CPU time the server's process used (all its threads), from the clients' start
   to their end: on a shared machine, steadier than the latency;
2. event latency (p50, p99, ms), commit to watcher: in-process, from a durable event's emission to
   the conversation's listeners (right after its commit) to a watcher reading it off its stream;
   with workers, from the commit timestamp of each `entry_added` (the worker's clock, taken as
   its commit starts; ms) to a watcher reading it, since the commit happens in another process;
   and apart, for the events committed while their connection was open (`live`) and those
   committed before it (`resumed`: read back from the log after a reconnect, so their latency
   holds the time the watcher was away and its resume);
3. gaps and duplicates: per watcher, the durable event ids it received against the lane's event
   log after the snapshot it started from (both must be zero), and how often it resumed;
4. the server's part of a resume (p50, p99, ms): from a request with `Last-Event-ID` reaching the
   app to its first byte of body, apart from the clients' reconnecting and the accept before it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from pydantic import JsonValue
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bench.pg_schema import fresh_schema
from bench.serve_load_clients import Clients
from bench.timing import percentile
from harness.cli.serve_commands import SERVE_POOL_MAX
from harness.context import Context
from harness.conversation import ConversationService, ConversationSetup
from harness.messages import ModelIdentity, TextContent, ToolResultMessage
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ToolSpec
from harness.providers.faux import FauxReply, FauxRequest, reply, tool_call
from harness.runtime import AgentTool, DriveSettings, HarnessEvent, ProgressCallback, ToolOutput, read_lane_events
from harness.server import LocalUser, ServerOptions, create_app
from harness.session import LaneConfig, Store, connect

USER = "bench"
REPO = Path(__file__).resolve().parents[1]
CLIENT_PROCESSES = 2
"""Processes the clients run in by default: with one, its loop (a few hundred streams' parsing)
falls behind the server's on a busy machine and its own delay counts as latency."""
MODEL = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)


def answer(request: FauxRequest) -> FauxReply | str:
    """A turn: some text and a tool call, then, after its result, a short answer."""
    if isinstance(request.request.messages[-1], ToolResultMessage):
        return "The lookup says it is fine. " * 4
    return reply("Let me look that up for you. ", tool_call("lookup", {"key": "weather"}))


async def lookup(tool_call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                 context: Context) -> ToolOutput:
    return ToolOutput(content=[TextContent(text=f"{args.get('key')}: sunny")])


LOOKUP = AgentTool(spec=ToolSpec(name="lookup", description="Look a key up.", parameters={
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}), execute=lookup)


@dataclass
class Load:
    conversations: int
    watchers: int
    turns: int
    reconnect_every: int
    workers: int = 0
    store_url: str | None = None
    client_processes: int = CLIENT_PROCESSES


class ResumeTimes:
    """`app`, timing each resume of a watch (a request with `Last-Event-ID`) from reaching the app
    to its first byte of body (`samples`, ns): the server's own part of a resume."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.samples: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not any(name == b"last-event-id" for name, _ in scope["headers"]):
            await self.app(scope, receive, send)
            return
        started, timed = time.perf_counter_ns(), False

        async def first_byte_timed(message: Message) -> None:
            nonlocal timed
            if not timed and message["type"] == "http.response.body":
                timed = True
                self.samples.append(time.perf_counter_ns() - started)
            await send(message)

        await self.app(scope, receive, first_byte_timed)


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """`app` on uvicorn, on a free loopback port in this event loop; yields its base URL."""
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets of that protocol, and without it a
    # response written in two parts waits ~40 ms for the client's delayed ACK (Nagle).
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    # Keep-alive past the slowest turn: a client reusing a connection the server just timed out gets a ReadError.
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_keep_alive=300))
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:  # uvicorn sets a flag, not an event
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        listener.close()


async def run(load: Load) -> dict[str, Any]:
    context = Context({"bench": "serve_load"})
    if load.workers:
        return await _run_with_workers(load, context)
    with tempfile.TemporaryDirectory() as directory:
        store = await connect(f"sqlite:///{Path(directory) / 'harness.db'}", context)
        registry = ModelRegistry([FAUX_MODEL], providers={"faux": FauxProvider(answer)})
        service = ConversationService(store, ConversationSetup(models=registry, tools=[LOOKUP],
                                                               drive=DriveSettings(frame_interval_s=0.05)))
        try:
            return await _serve_and_measure(load, service, ServerOptions(), context)
        finally:
            await store.close()


async def _run_with_workers(load: Load, context: Context) -> dict[str, Any]:
    """The load on an external-workers server over a fresh schema of `load.store_url`, with
    `load.workers` worker processes."""
    assert load.store_url is not None, "--workers needs --store postgresql://..."
    with fresh_schema(load.store_url) as url:
        return await _run_on_schema(load, url, context)


async def _run_on_schema(load: Load, url: str, context: Context) -> dict[str, Any]:
    """The load on an external-workers server over the store at `url`, workers included."""
    store: Store | None = None
    workers: list[asyncio.subprocess.Process] = []
    try:
        store = await connect(url, context, pool_max=SERVE_POOL_MAX)  # as `harness serve` opens it
        concurrency = math.ceil(load.conversations / load.workers)
        for _ in range(load.workers):
            worker = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.faux_worker", url,
                                                          str(concurrency), stdout=asyncio.subprocess.PIPE, cwd=REPO)
            workers.append(worker)
            assert worker.stdout is not None
            assert (await worker.stdout.readline()).strip() == b"ready"
        return await _serve_and_measure(load, ConversationService(store), ServerOptions(workers="external"), context)
    finally:
        for worker in workers:
            worker.terminate()
        await asyncio.gather(*(worker.wait() for worker in workers))
        if store is not None:
            await store.close()


async def _serve_and_measure(load: Load, service: ConversationService, options: ServerOptions,
                             context: Context) -> dict[str, Any]:
    app = ResumeTimes(create_app(service, LocalUser(USER), options=options,
                                 new_lane=lambda model: LaneConfig(model=model or MODEL, active_tools=["lookup"])))
    gc.freeze()  # as `harness serve` does once started
    async with serving(app) as url:
        figures = await _measure(load, service, url, context)
    return {**figures, **{f"resume_server_p{p}_ms": round(percentile(app.samples, p), 2) if app.samples else None
                          for p in (50, 99)}}


async def _measure(load: Load, service: ConversationService, url: str, context: Context) -> dict[str, Any]:
    committed_at: dict[tuple[str, int], int] = {}  # (conversation, seq) -> ns
    conversations = []
    for _ in range(load.conversations):
        conversation = await service.create(USER, LaneConfig(model=MODEL, active_tools=["lookup"]), context)
        if load.workers:
            await service.close(USER, conversation.id, context)  # the workers drive it, not this process
        else:
            def listen(event: HarnessEvent, _: Context, conversation_id: str = conversation.id) -> None:
                if event.event_seq is not None:
                    committed_at[(conversation_id, event.event_seq)] = time.time_ns()

            conversation.listen(listen)
        conversations.append(conversation.id)
    shares = [conversations[index::load.client_processes] for index in range(load.client_processes)]
    cpu_before = time.process_time()
    parts = await _drive_clients([Clients(url, share, load.watchers, load.turns, load.reconnect_every,
                                          entry_times=bool(load.workers)) for share in shares if share])
    cpu = time.process_time() - cpu_before
    elapsed = (max(part["ended_ns"] for part in parts) - min(part["started_ns"] for part in parts)) / 1e9
    watchers = [watcher for part in parts for watcher in part["watchers"]]
    for part in parts:
        for conversation_id, seq, at in part["committed_at"]:
            committed_at.setdefault((conversation_id, seq), at)

    gaps = duplicates = matching = 0
    latencies: dict[str, list[int]] = {"live": [], "resumed": []}
    for watcher in watchers:
        conversation_id = watcher["conversation_id"]
        log = await read_lane_events(await service.store.open_session(conversation_id, context), "main",
                                     watcher["first_seq"], 10_000, context)
        expected = [event.event_seq for event in log.events]
        got = [seq for seq, _, _ in watcher["durable"]]
        gaps += len(set(expected) - set(got))
        duplicates += len(got) - len(set(got))
        matching += got == expected
        for seq, at, connected in watcher["durable"]:
            committed = committed_at.get((conversation_id, seq))
            if committed is not None:
                latencies["live" if committed >= connected else "resumed"].append(at - committed)
    every = latencies["live"] + latencies["resumed"]
    received = sum(watcher["received"] for watcher in watchers)
    return {
        "conversations": load.conversations, "watchers_each": load.watchers, "turns_each": load.turns,
        "workers": load.workers, "client_processes": len(parts), "seconds": round(elapsed, 2),
        "server_cpu_s": round(cpu, 2),
        "runs_per_second": round(load.conversations * load.turns / elapsed, 1),
        "events_received": received, "events_per_second": round(received / elapsed),
        "durable_committed_per_second": round(len(committed_at) / elapsed),
        "latency_p50_ms": round(percentile(every, 50), 2), "latency_p99_ms": round(percentile(every, 99), 2),
        **_latency("live", latencies["live"]), **_latency("resumed", latencies["resumed"]),
        "gaps": gaps, "duplicates": duplicates, "watchers_matching_log": matching, "watchers": len(watchers),
        "resumes": sum(watcher["resumes"] for watcher in watchers),
        "turns_refused_held": sum(part["refused_held"] for part in parts),
    }


async def _drive_clients(shares: list[Clients]) -> list[dict[str, Any]]:
    """Run each share of the clients in a process of its own (`bench.serve_load_clients`), start their turns
    together once every watcher of every share has its snapshot, and return each one's figures."""
    processes = []
    try:
        for share in shares:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.serve_load_clients", cwd=REPO,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            processes.append(process)
            assert process.stdin is not None
            process.stdin.write(share.spec().encode() + b"\n")
        for process in processes:
            assert process.stdout is not None
            if (await asyncio.wait_for(process.stdout.readline(), 90)).strip() != b"ready":
                raise RuntimeError("a client process ended before its watchers were ready (its stderr says why)")
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(b"go\n")
            await process.stdin.drain()
        # Read together: each process's figures fill more than a pipe's buffer.
        outputs = await asyncio.wait_for(asyncio.gather(*(process.stdout.read() for process in processes
                                                          if process.stdout is not None)), 300)
        if not all(outputs):
            raise RuntimeError("a client process ended without its figures (its stderr says why)")
        return [json.loads(output) for output in outputs]
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.wait()


def _latency(kind: str, samples: list[int]) -> dict[str, float | None]:
    """`{kind}_events`, `{kind}_p50_ms` and `{kind}_p99_ms` of `samples` (ns); None without any."""
    return {f"{kind}_events": len(samples),
            **{f"{kind}_p{p}_ms": round(percentile(samples, p), 2) if samples else None for p in (50, 99)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--watchers", type=int, default=3, help="watchers per conversation")
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation")
    parser.add_argument("--reconnect-every", type=int, default=40, help="events a watcher reads per connection")
    parser.add_argument("--workers", default="0", help="worker processes, or a comma list of counts run in "
                        "turn (e.g. 1,2,4); 0: the server drives, on SQLite")
    parser.add_argument("--store", help="the PostgreSQL server for --workers (a fresh schema is made and dropped)")
    parser.add_argument("--client-processes", type=int, default=CLIENT_PROCESSES,
                        help="processes the clients are spread over (whole conversations each)")
    parser.add_argument("--json", action="store_true", help="print each run's figures as one JSON object a line")
    args = parser.parse_args()
    for count in (int(part) for part in args.workers.split(",")):
        if count and not args.store:
            parser.error("--workers needs --store postgresql://...")
        load = Load(args.conversations, args.watchers, args.turns, args.reconnect_every, workers=count,
                    store_url=args.store, client_processes=args.client_processes)
        figures = asyncio.run(run(load))
        if args.json:
            print(json.dumps(figures))
            continue
        driven = f"{count} worker process(es), PostgreSQL" if count else "the server itself, SQLite"
        print(f"{figures['conversations']} conversations x {figures['watchers_each']} watchers, "
              f"{figures['turns_each']} turns each (one tool call per turn), driven by {driven}, clients in "
              f"{figures['client_processes']} process(es): {figures['seconds']} s, "
              f"{figures['runs_per_second']} runs/s; the server's process used {figures['server_cpu_s']} s of CPU")
        print(f"  events received: {figures['events_received']} ({figures['events_per_second']}/s); durable events "
              f"committed: {figures['durable_committed_per_second']}/s")
        print(f"  latency, commit to watcher: p50 {figures['latency_p50_ms']} ms, p99 {figures['latency_p99_ms']} ms; "
              f"live: p50 {figures['live_p50_ms']} ms, p99 {figures['live_p99_ms']} ms "
              f"({figures['live_events']} events); resumed: p50 {figures['resumed_p50_ms']} ms, "
              f"p99 {figures['resumed_p99_ms']} ms ({figures['resumed_events']} events)")
        print(f"  gaps: {figures['gaps']}, duplicates: {figures['duplicates']}, resumes: {figures['resumes']}; "
              f"{figures['watchers_matching_log']} of {figures['watchers']} watchers received exactly the log")
        print(f"  a resume in the server, request to first byte: p50 {figures['resume_server_p50_ms']} ms, "
              f"p99 {figures['resume_server_p99_ms']} ms")


if __name__ == "__main__":
    main()
