"""A bounded load on `harness serve` over loopback: conversations taking turns while several watchers
each follow every one of them over the native SSE watch, dropping their connection now and then and
resuming with `Last-Event-ID`.

Run: `.venv/bin/python -m bench.serve_load [--conversations 20] [--watchers 3] [--turns 5]
[--reconnect-every 40] [--workers N --store postgresql://...] [--json]`.

The app is `create_app` served by uvicorn on 127.0.0.1 in this process; the model is the faux
provider, whose every turn streams a short text, calls one tool, then answers. The watchers are
httpx clients in the same event loop as the server (two cores: they compete with it, so the
latency is an upper bound), one client (one connection) per watcher and per conversation's sender:
one pool shared by hundreds of streams costs the loop O(connections) at every request. Two modes:

- `--workers 0` (the default): the server drives every turn itself, on a SQLite store in a
  temporary directory.
- `--workers N`: `harness serve --workers external` on a fresh schema of the PostgreSQL server at
  `--store`, with N worker processes (`bench.faux_worker`) driving, each taking up to
  conversations/N sessions at once, so every mode can run every conversation at the same time;
  the server only accepts, wakes the workers and follows their runs for the watchers.

It prints:

1. runs per second and events per second: the turns settled, and every SSE event the watchers
   received (durable and live), over the load's wall time, and the durable events committed per
   second;
2. event latency (p50, p99, ms), commit to watcher: in-process, from a durable event's emission to
   the conversation's listeners (right after its commit) to a watcher reading it off its stream;
   with workers, from the commit timestamp of each `entry_added` (the worker's clock, taken as
   its commit starts; ms) to a watcher reading it, since the commit happens in another process;
   and apart, for the events committed while their connection was open (`live`) and those
   committed before it (`resumed`: read back from the log after a reconnect, so their latency
   holds the time the watcher was away and its resume);
3. gaps and duplicates: per watcher, the durable event ids it received against the lane's event
   log after the snapshot it started from (both must be zero), and how often it resumed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from pydantic import JsonValue

from bench.pg_schema import fresh_schema
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
class Watcher:
    """One client following one conversation: the durable ids it got, when, and its resumes."""

    conversation_id: str
    first_seq: int | None = None
    # (event_seq, received at, its connection opened at; ns)
    durable: list[tuple[int, int, int]] = field(default_factory=list)
    received: int = 0
    resumes: int = 0
    runs_ended: int = 0


@dataclass
class Load:
    conversations: int
    watchers: int
    turns: int
    reconnect_every: int
    workers: int = 0
    store_url: str | None = None
    committed_at: dict[tuple[str, int], int] = field(default_factory=dict)  # (conversation, seq) -> ns
    ended: dict[str, asyncio.Queue[None]] = field(default_factory=dict)  # conversation -> one item per run end
    refused_held: int = 0  # turns refused as `conversation_held` and sent again


def client_of(url: str) -> httpx.AsyncClient:
    # Plain HTTP on loopback: no certificates to load, which costs the loop about 25 ms per client,
    # 1.3 s of stalled loop when the 50 senders start theirs inside the measured window.
    return httpx.AsyncClient(base_url=url, timeout=60, verify=False)


async def watch(url: str, watcher: Watcher, load: Load, ready: asyncio.Event, *, counts_runs: bool) -> None:
    """Follow the conversation until it has ended `load.turns` runs, dropping the connection every
    `reconnect_every` events and resuming from the last id seen. The watcher that `counts_runs`
    tells its conversation's turns when a run ended; with workers, every watcher records the
    commit time of each entry it is shown."""
    async with client_of(url) as client:
        await _watch(client, watcher, load, ready, counts_runs=counts_runs)


async def _watch(client: httpx.AsyncClient, watcher: Watcher, load: Load, ready: asyncio.Event, *,
                 counts_runs: bool) -> None:
    last_id: str | None = None
    event_id: str | None
    while watcher.runs_ended < load.turns:
        headers = {"Last-Event-ID": last_id} if last_id is not None else {}
        if last_id is not None:
            watcher.resumes += 1
        connected = time.time_ns()
        async with client.stream("GET", f"/api/conversations/{watcher.conversation_id}/events",
                                 headers=headers) as response:
            response.raise_for_status()
            seen, name, event_id, data = 0, "message", None, list[str]()
            async for line in response.aiter_lines():
                if line:
                    field_name, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if field_name == "event":
                        name = value
                    elif field_name == "id":
                        event_id = value
                    elif field_name == "data":
                        data.append(value)
                    continue
                if not data:
                    continue
                now = time.time_ns()
                watcher.received += 1
                seen += 1
                if name == "snapshot":
                    if json.loads("\n".join(data))["reset"] and last_id is not None:
                        raise AssertionError(f"a watcher of {watcher.conversation_id} was reset at {last_id}")
                    if watcher.first_seq is None and event_id is not None:
                        watcher.first_seq = int(event_id)
                    ready.set()
                elif event_id is not None and "." not in event_id:
                    watcher.durable.append((int(event_id), now, connected))
                    if load.workers and name == "entry_added":
                        committed_ms = json.loads("\n".join(data))["entry"]["timestamp"]
                        load.committed_at.setdefault((watcher.conversation_id, int(event_id)), committed_ms * 1_000_000)
                if event_id is not None:
                    last_id = event_id
                if name == "run_end":
                    watcher.runs_ended += 1
                    if counts_runs:
                        load.ended[watcher.conversation_id].put_nowait(None)
                name, event_id, data = "message", None, list[str]()
                if watcher.runs_ended >= load.turns or seen >= load.reconnect_every:
                    break


async def converse(url: str, conversation_id: str, ended: asyncio.Queue[None], turns: int, load: Load) -> None:
    async with client_of(url) as client:
        await _converse(client, conversation_id, ended, turns, load)


async def _converse(client: httpx.AsyncClient, conversation_id: str, ended: asyncio.Queue[None], turns: int,
                    load: Load) -> None:
    for turn in range(turns):
        while True:
            answered = await client.post(f"/api/conversations/{conversation_id}/messages",
                                         json={"text": f"How is the weather? ({turn})"})
            # With workers, a run's end reaches the watcher before its worker has let the session
            # go: a turn sent in between is refused as held, and a client sends it again.
            if answered.status_code != 409 or answered.json().get("code") != "conversation_held":
                break
            load.refused_held += 1
            await asyncio.sleep(0.05)
        answered.raise_for_status()
        await ended.get()


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
                                                          str(concurrency), stdout=asyncio.subprocess.PIPE)
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
    app = create_app(service, LocalUser(USER), options=options,
                     new_lane=lambda model: LaneConfig(model=model or MODEL, active_tools=["lookup"]))
    async with serving(app) as url:
        return await _measure(load, service, url, context)


async def _measure(load: Load, service: ConversationService, url: str, context: Context) -> dict[str, Any]:
    conversations = []
    for _ in range(load.conversations):
        conversation = await service.create(USER, LaneConfig(model=MODEL, active_tools=["lookup"]), context)
        load.ended[conversation.id] = asyncio.Queue()
        if load.workers:
            await service.close(USER, conversation.id, context)  # the workers drive it, not this process
        else:
            def listen(event: HarnessEvent, _: Context, conversation_id: str = conversation.id) -> None:
                if event.event_seq is not None:
                    load.committed_at[(conversation_id, event.event_seq)] = time.time_ns()

            conversation.listen(listen)
        conversations.append(conversation)
    watchers = [Watcher(conversation.id) for conversation in conversations for _ in range(load.watchers)]
    readiness = [asyncio.Event() for _ in watchers]
    watching = [asyncio.create_task(watch(url, watcher, load, ready, counts_runs=index % load.watchers == 0))
                for index, (watcher, ready) in enumerate(zip(watchers, readiness, strict=True))]
    await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in readiness)), 60)

    started = time.perf_counter()
    await asyncio.gather(*(converse(url, c.id, load.ended[c.id], load.turns, load) for c in conversations))
    await asyncio.wait_for(asyncio.gather(*watching), 120)
    elapsed = time.perf_counter() - started

    gaps = duplicates = matching = 0
    latencies: dict[str, list[int]] = {"live": [], "resumed": []}
    for conversation in conversations:
        watchers_of = [w for w in watchers if w.conversation_id == conversation.id]
        for watcher in watchers_of:
            log = await read_lane_events(await service.store.open_session(conversation.id, context), "main",
                                         watcher.first_seq, 10_000, context)
            expected = [event.event_seq for event in log.events]
            got = [seq for seq, _, _ in watcher.durable]
            gaps += len(set(expected) - set(got))
            duplicates += len(got) - len(set(got))
            matching += got == expected
            for seq, at, connected in watcher.durable:
                committed = load.committed_at.get((conversation.id, seq))
                if committed is not None:
                    latencies["live" if committed >= connected else "resumed"].append(at - committed)
    every = latencies["live"] + latencies["resumed"]
    return {
        "conversations": load.conversations, "watchers_each": load.watchers, "turns_each": load.turns,
        "workers": load.workers, "seconds": round(elapsed, 2),
        "runs_per_second": round(load.conversations * load.turns / elapsed, 1),
        "events_received": sum(w.received for w in watchers),
        "events_per_second": round(sum(w.received for w in watchers) / elapsed),
        "durable_committed_per_second": round(len(load.committed_at) / elapsed),
        "latency_p50_ms": round(percentile(every, 50), 2), "latency_p99_ms": round(percentile(every, 99), 2),
        **_latency("live", latencies["live"]), **_latency("resumed", latencies["resumed"]),
        "gaps": gaps, "duplicates": duplicates, "watchers_matching_log": matching, "watchers": len(watchers),
        "resumes": sum(w.resumes for w in watchers), "turns_refused_held": load.refused_held,
    }


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
    parser.add_argument("--json", action="store_true", help="print each run's figures as one JSON object a line")
    args = parser.parse_args()
    for count in (int(part) for part in args.workers.split(",")):
        if count and not args.store:
            parser.error("--workers needs --store postgresql://...")
        load = Load(args.conversations, args.watchers, args.turns, args.reconnect_every, workers=count,
                    store_url=args.store)
        figures = asyncio.run(run(load))
        if args.json:
            print(json.dumps(figures))
            continue
        driven = f"{count} worker process(es), PostgreSQL" if count else "the server itself, SQLite"
        print(f"{figures['conversations']} conversations x {figures['watchers_each']} watchers, "
              f"{figures['turns_each']} turns each (one tool call per turn), driven by {driven}: "
              f"{figures['seconds']} s, {figures['runs_per_second']} runs/s")
        print(f"  events received: {figures['events_received']} ({figures['events_per_second']}/s); durable events "
              f"committed: {figures['durable_committed_per_second']}/s")
        print(f"  latency, commit to watcher: p50 {figures['latency_p50_ms']} ms, p99 {figures['latency_p99_ms']} ms; "
              f"live: p50 {figures['live_p50_ms']} ms, p99 {figures['live_p99_ms']} ms "
              f"({figures['live_events']} events); resumed: p50 {figures['resumed_p50_ms']} ms, "
              f"p99 {figures['resumed_p99_ms']} ms ({figures['resumed_events']} events)")
        print(f"  gaps: {figures['gaps']}, duplicates: {figures['duplicates']}, resumes: {figures['resumes']}; "
              f"{figures['watchers_matching_log']} of {figures['watchers']} watchers received exactly the log")


if __name__ == "__main__":
    main()
