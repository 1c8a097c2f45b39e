"""A bounded load on `harness serve` over loopback: conversations taking turns while several watchers
each follow every one of them over the native SSE watch, dropping their connection now and then and
resuming with `Last-Event-ID`.

Run: `.venv/bin/python -m bench.serve_load [--conversations 20] [--watchers 3] [--turns 5]
[--reconnect-every 40] [--json]`.

The app is `create_app` over a SQLite store in a temporary directory, served by uvicorn on
127.0.0.1 in this process; the model is the faux provider, whose every turn streams a short text,
calls one tool, then answers. The watchers are httpx clients in the same event loop as the server
(two cores: they compete with it, so the latency is an upper bound). It prints:

1. events per second: every SSE event the watchers received (durable and live), over the load's
   wall time, and the durable events committed per second;
2. event latency (p50, p99, ms): from the commit of a durable event (its emission to the
   conversation's listeners, right after the commit) to a watcher reading it off its stream;
3. gaps and duplicates: per watcher, the durable event ids it received against the lane's event
   log after the snapshot it started from (both must be zero), and how often it resumed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
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

from bench.timing import percentile
from harness.context import Context
from harness.conversation import ConversationService, ConversationSetup
from harness.messages import ModelIdentity, TextContent, ToolResultMessage
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ToolSpec
from harness.providers.faux import FauxReply, FauxRequest, reply, tool_call
from harness.runtime import AgentTool, DriveSettings, HarnessEvent, ProgressCallback, RunEnd, ToolOutput
from harness.server import LocalUser, create_app
from harness.session import LaneConfig, connect

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
    durable: list[tuple[int, int]] = field(default_factory=list)  # (event_seq, received at in ns)
    received: int = 0
    resumes: int = 0
    runs_ended: int = 0


@dataclass
class Load:
    conversations: int
    watchers: int
    turns: int
    reconnect_every: int
    committed_at: dict[tuple[str, int], int] = field(default_factory=dict)  # (conversation, seq) -> ns


async def watch(client: httpx.AsyncClient, watcher: Watcher, load: Load, ready: asyncio.Event) -> None:
    """Follow the conversation until it has ended `load.turns` runs, dropping the connection every
    `reconnect_every` events and resuming from the last id seen."""
    last_id: str | None = None
    event_id: str | None
    while watcher.runs_ended < load.turns:
        headers = {"Last-Event-ID": last_id} if last_id is not None else {}
        if last_id is not None:
            watcher.resumes += 1
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
                    watcher.durable.append((int(event_id), now))
                if event_id is not None:
                    last_id = event_id
                watcher.runs_ended += name == "run_end"
                name, event_id, data = "message", None, list[str]()
                if watcher.runs_ended >= load.turns or seen >= load.reconnect_every:
                    break


async def converse(client: httpx.AsyncClient, conversation_id: str, ended: asyncio.Queue[None], turns: int) -> None:
    for turn in range(turns):
        answered = await client.post(f"/api/conversations/{conversation_id}/messages",
                                     json={"text": f"How is the weather? ({turn})"})
        answered.raise_for_status()
        await ended.get()


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """`app` on uvicorn, on a free loopback port in this event loop; yields its base URL."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
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
    with tempfile.TemporaryDirectory() as directory:
        store = await connect(f"sqlite:///{Path(directory) / 'harness.db'}", context)
        registry = ModelRegistry([FAUX_MODEL], providers={"faux": FauxProvider(answer)})
        service = ConversationService(store, ConversationSetup(models=registry, tools=[LOOKUP],
                                                               drive=DriveSettings(frame_interval_s=0.05)))
        app = create_app(service, LocalUser(USER),
                         new_lane=lambda model: LaneConfig(model=model or MODEL, active_tools=["lookup"]))
        try:
            async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(
                    max_connections=None, max_keepalive_connections=None)) as client:
                return await _measure(load, service, client, context)
        finally:
            await store.close()


async def _measure(load: Load, service: ConversationService, client: httpx.AsyncClient,
                   context: Context) -> dict[str, Any]:
    conversations, endings = [], {}
    for _ in range(load.conversations):
        conversation = await service.create(USER, LaneConfig(model=MODEL, active_tools=["lookup"]), context)
        ended: asyncio.Queue[None] = asyncio.Queue()

        def listen(event: HarnessEvent, _: Context, conversation_id: str = conversation.id,
                   ended: asyncio.Queue[None] = ended) -> None:
            if event.event_seq is not None:
                load.committed_at[(conversation_id, event.event_seq)] = time.time_ns()
            if isinstance(event, RunEnd):
                ended.put_nowait(None)

        conversation.harness.add_listener(listen)
        conversations.append(conversation)
        endings[conversation.id] = ended
    watchers = [Watcher(conversation.id) for conversation in conversations for _ in range(load.watchers)]
    readiness = [asyncio.Event() for _ in watchers]
    watching = [asyncio.create_task(watch(client, watcher, load, ready))
                for watcher, ready in zip(watchers, readiness, strict=True)]
    await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in readiness)), 60)

    started = time.perf_counter()
    await asyncio.gather(*(converse(client, c.id, endings[c.id], load.turns) for c in conversations))
    await asyncio.wait_for(asyncio.gather(*watching), 120)
    elapsed = time.perf_counter() - started

    gaps = duplicates = matching = 0
    latencies: list[int] = []
    for conversation in conversations:
        watchers_of = [w for w in watchers if w.conversation_id == conversation.id]
        for watcher in watchers_of:
            log = await conversation.lane.read_events(watcher.first_seq, 10_000, context)
            expected = [event.event_seq for event in log.events]
            got = [seq for seq, _ in watcher.durable]
            gaps += len(set(expected) - set(got))
            duplicates += len(got) - len(set(got))
            matching += got == expected
            latencies += [at - load.committed_at[(conversation.id, seq)] for seq, at in watcher.durable
                          if (conversation.id, seq) in load.committed_at]
    return {
        "conversations": load.conversations, "watchers_each": load.watchers, "turns_each": load.turns,
        "seconds": round(elapsed, 2),
        "events_received": sum(w.received for w in watchers),
        "events_per_second": round(sum(w.received for w in watchers) / elapsed),
        "durable_committed_per_second": round(len(load.committed_at) / elapsed),
        "latency_p50_ms": round(percentile(latencies, 50), 2), "latency_p99_ms": round(percentile(latencies, 99), 2),
        "gaps": gaps, "duplicates": duplicates, "watchers_matching_log": matching, "watchers": len(watchers),
        "resumes": sum(w.resumes for w in watchers),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--watchers", type=int, default=3, help="watchers per conversation")
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation")
    parser.add_argument("--reconnect-every", type=int, default=40, help="events a watcher reads per connection")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    figures = asyncio.run(run(Load(args.conversations, args.watchers, args.turns, args.reconnect_every)))
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{figures['conversations']} conversations x {figures['watchers_each']} watchers, "
          f"{figures['turns_each']} turns each (one tool call per turn), {figures['seconds']} s")
    print(f"events received: {figures['events_received']} ({figures['events_per_second']}/s); durable events "
          f"committed: {figures['durable_committed_per_second']}/s")
    print(f"latency, commit to watcher: p50 {figures['latency_p50_ms']} ms, p99 {figures['latency_p99_ms']} ms")
    print(f"gaps: {figures['gaps']}, duplicates: {figures['duplicates']}, resumes: {figures['resumes']}; "
          f"{figures['watchers_matching_log']} of {figures['watchers']} watchers received exactly the log")


if __name__ == "__main__":
    main()
