"""The clients of `bench.serve_load`, run in processes of their own: each conversation's sender and
its watchers, over httpx. This module imports httpx alone, so a client process starts in a fraction
of the time the server's modules take to import.

Run by `bench.serve_load` as `python -m bench.serve_load_clients`: it reads a `Clients` as one JSON
line from standard input, connects every watcher and prints `ready` once each has its snapshot,
starts the turns when it reads a `go` line, and prints its figures as one JSON line (`run_clients`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field, fields
from typing import Any

import httpx


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
class Clients:
    """What one client process runs: a sender and `watchers` watchers of each of
    `conversations` on the server at `url`; with `entry_times`, the commit time each watcher
    reads off an `entry_added` (the workers' clock) is kept as the event's commit time."""

    url: str
    conversations: list[str]
    watchers: int
    turns: int
    reconnect_every: int
    entry_times: bool
    # What its run keeps, not sent to it:
    committed_at: dict[tuple[str, int], int] = field(default_factory=dict, init=False)  # (conversation, seq) -> ns
    ended: dict[str, asyncio.Queue[None]] = field(default_factory=dict, init=False)  # conversation -> run ends
    refused_held: int = field(default=0, init=False)  # turns refused as `conversation_held` and sent again

    def spec(self) -> str:
        """What a client process is told: one JSON line of the fields a `Clients` is made with."""
        return json.dumps({each.name: getattr(self, each.name) for each in fields(self) if each.init})


def client_of(url: str) -> httpx.AsyncClient:
    # Plain HTTP on loopback: no certificates to load, which costs the loop about 25 ms per client,
    # 1.3 s of stalled loop when the 50 senders start theirs inside the measured window.
    return httpx.AsyncClient(base_url=url, timeout=60, verify=False)


async def watch(watcher: Watcher, load: Clients, ready: asyncio.Event, *, counts_runs: bool) -> None:
    """Follow the conversation until it has ended `load.turns` runs, dropping the connection every
    `reconnect_every` events and resuming from the last id seen. The watcher that `counts_runs`
    tells its conversation's sender when a run ended; with `entry_times`, every watcher records the
    commit time of each entry it is shown."""
    async with client_of(load.url) as client:
        await _watch(client, watcher, load, ready, counts_runs=counts_runs)


async def _watch(client: httpx.AsyncClient, watcher: Watcher, load: Clients, ready: asyncio.Event, *,
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
                    if load.entry_times and name == "entry_added":
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


async def converse(conversation_id: str, load: Clients) -> None:
    async with client_of(load.url) as client:
        await _converse(client, conversation_id, load)


async def _converse(client: httpx.AsyncClient, conversation_id: str, load: Clients) -> None:
    for turn in range(load.turns):
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
        await load.ended[conversation_id].get()


async def run_clients(load: Clients) -> dict[str, Any]:
    """A client process's part of the load: every watcher connects, `ready` is printed once each
    has its snapshot, the turns start when a `go` line is read, and the figures of its watchers are
    returned (the wall clock, ns, at the start and the end of its turns)."""
    load.ended = {conversation_id: asyncio.Queue() for conversation_id in load.conversations}
    watchers = [Watcher(conversation_id) for conversation_id in load.conversations for _ in range(load.watchers)]
    readiness = [asyncio.Event() for _ in watchers]
    watching = [asyncio.create_task(watch(watcher, load, ready, counts_runs=index % load.watchers == 0))
                for index, (watcher, ready) in enumerate(zip(watchers, readiness, strict=True))]
    await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in readiness)), 60)
    print("ready", flush=True)
    if (await asyncio.to_thread(sys.stdin.readline)).strip() != "go":
        raise SystemExit("the bench went away before the load started")
    started = time.time_ns()
    await asyncio.gather(*(converse(conversation_id, load) for conversation_id in load.conversations))
    await asyncio.wait_for(asyncio.gather(*watching), 120)
    return {"started_ns": started, "ended_ns": time.time_ns(), "refused_held": load.refused_held,
            "committed_at": [[conversation, seq, at] for (conversation, seq), at in load.committed_at.items()],
            "watchers": [{"conversation_id": w.conversation_id, "first_seq": w.first_seq, "durable": w.durable,
                          "received": w.received, "resumes": w.resumes} for w in watchers]}


def main() -> None:
    """Read a `Clients` as one JSON line from standard input, run it (`run_clients`)
    and print its figures as one JSON line."""
    load = Clients(**json.loads(sys.stdin.readline()))
    print(json.dumps(asyncio.run(run_clients(load))), flush=True)


if __name__ == "__main__":
    main()
