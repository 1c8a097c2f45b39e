"""The resource targets of issue 29 on one `harness serve`: idle watchers, a client that never reads,
and thousands of conversations opened in turn.

Run: `.venv/bin/python -m bench.serve_resources [--watchers 1000] [--reply-bytes 2097152] [--reply-seconds 2]
[--conversations 5000] [--sample-every 500] [--max-held 64] [--store postgresql://...] [--json]`.

The server is `bench.faux_server` (`create_app` over the faux model, uvicorn on loopback) in a
process of its own, on a SQLite file in a temporary directory or, with `--store`, on a fresh schema
of that PostgreSQL server; its resident memory is read from `/proc/PID/status` (VmRSS), its open
descriptors from `/proc/PID/fd`, and on PostgreSQL its connections from `pg_stat_activity` (by the
`application_name` the run gives it). The clients are httpx in this process: one client, so one
pool, whose connections are the server's to count. It prints:

1. **Idle watchers**: the server's RSS with one conversation and no watcher, then with `--watchers`
   of it open over `GET /api/conversations/{id}/events` (each has read its snapshot and reads
   what comes: heartbeats), and the difference per watcher. Target: RSS within 200 MB.
2. **A never-reading client**: replies of `--reply-bytes` streamed over `--reply-seconds`, each
   in a new conversation, after one that raised the allocator's high-water mark: four with nobody
   watching and, between them, three with one client that sent its `GET .../events` on a socket
   with a small receive buffer and never reads it. The server's RSS peak during each, the most
   bytes of events its watchers held unread (`Fanouts.held_bytes`), and whether the server cut
   the client (sampled every 20 ms). Target: the client costs at most its byte bound
   (`ServerOptions.client_buffer_bytes`): its held bytes, and the RSS peak it adds over the mean
   of the replies alone on either side (the median of the three).
3. **Conversations in turn**: `--conversations` created (`POST /api/conversations`) and read
   (`GET` of it and of its `/display`) one after another, the server's descriptors, held
   conversations and PostgreSQL connections sampled every `--sample-every`. Target: flat. A
   server holds at most `--max-held` conversations (each an open SQLite descriptor or a PostgreSQL
   connection, besides the read pool of at most `SERVE_POOL_MAX`, shown apart from
   `/metrics`), so the series rises while it fills up to that, then must rise no more: the verdict
   compares every sample from the first at which it held `--max-held` with that one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.pg_schema import fresh_schema
from harness.server import ServerOptions

RSS_TARGET_BYTES = 200 * 1024 * 1024
"""Issue 29: a server with 1,000 idle watchers stays within this resident memory."""

FLAT_SLACK = 2
"""How far a count may rise past its value once the server held `max_held` and still be flat: a
descriptor or connection opened for one request and not yet closed at the sample."""

PAIRS = 3
"""Replies streamed with a never-reading client, each between two streamed alone: RSS peaks vary by
MiBs between two replies, so the verdict takes the median of the differences."""

SAMPLE_S = 0.02
"""How often the server is sampled during a reply (seconds)."""

SETTLE_S = 0.2
"""How long the server is left alone before its memory is read (seconds)."""

MiB = 1024 * 1024


@dataclass
class Server:
    """The server process, its base URL, a client of it, and how to count its PostgreSQL
    connections (None on SQLite)."""

    process: asyncio.subprocess.Process
    url: str
    client: httpx.AsyncClient
    count_backends: Callable[[], Awaitable[int]] | None

    def rss(self) -> int:
        """Resident memory (bytes), VmRSS."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    async def state(self) -> dict[str, int]:
        """Held conversations, watchers and the bytes of events they hold unread."""
        answer = await self.client.get("/bench/server")
        answer.raise_for_status()
        return dict(answer.json())

    async def metric(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """The samples of metric `name` (a sample name) in the server's `/metrics`, by labels."""
        text = (await self.client.get("/metrics")).text
        return {tuple(sorted(sample.labels.items())): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples
                if sample.name == name}

    async def turns_ended(self) -> float:
        return sum((await self.metric("harness_turns_ended_total")).values())

    async def pooled(self) -> int:
        """The store's read pool's connections (`harness_store_connections{use="pooled"}`)."""
        return int((await self.metric("harness_store_connections"))[(("use", "pooled"),)])

    async def settle(self) -> None:
        """Give the server a moment to finish what the last step left (a reply's last frame, closed
        streams) before its memory is read."""
        await asyncio.sleep(SETTLE_S)


@asynccontextmanager
async def server_process(store: str | None, max_held: int, reply_bytes: int, reply_s: float) -> AsyncIterator[Server]:
    """`bench.faux_server` on a SQLite file in a temporary directory, or on a fresh schema of the
    PostgreSQL server at `store`; stopped (SIGTERM) when the block ends."""
    async with AsyncExitStack() as stack:
        count_backends: Callable[[], Awaitable[int]] | None = None
        if store is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory())
            url = f"sqlite:///{Path(directory) / 'harness.db'}"
        else:
            import psycopg

            application = f"harness_bench_{os.getpid()}"
            url = stack.enter_context(fresh_schema(store, application_name=application))
            monitor = await stack.enter_async_context(await psycopg.AsyncConnection.connect(store, autocommit=True))

            async def count_backends() -> int:
                cursor = await monitor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                               (application,))
                row = await cursor.fetchone()
                assert row is not None
                return int(row[0])

        process = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.faux_server", url, str(max_held),
                                                       str(reply_bytes), str(reply_s), stdout=asyncio.subprocess.PIPE)
        try:
            assert process.stdout is not None
            base_url = (await asyncio.wait_for(process.stdout.readline(), 60)).decode().strip()
            if not base_url:
                raise RuntimeError(f"the server exited before serving ({await process.wait()})")
            # No pool limit: every watcher keeps a connection of its own.
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
            async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits, verify=False) as client:
                yield Server(process, base_url, client, count_backends)
        finally:
            if process.returncode is None:
                process.terminate()
            await process.wait()


async def create_conversation(server: Server) -> str:
    created = await server.client.post("/api/conversations", json={})
    created.raise_for_status()
    return str(created.json()["id"])


async def watch(server: Server, conversation_id: str, ready: asyncio.Event) -> None:
    """Follow the conversation: read its snapshot, set `ready`, then read whatever comes until
    cancelled."""
    async with server.client.stream("GET", f"/api/conversations/{conversation_id}/events") as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line == "event: snapshot":
                ready.set()


async def wait_for_watchers(server: Server, count: int) -> None:
    """Until the server counts `count` watchers (a stream's end reaches it after the client left)."""
    while (await server.state())["watchers"] != count:  # noqa: ASYNC110 - another process's count, polled
        await asyncio.sleep(SAMPLE_S)


async def idle_watchers(server: Server, conversation_id: str, count: int) -> dict[str, Any]:
    await server.settle()
    before = server.rss()
    readiness = [asyncio.Event() for _ in range(count)]
    watching = [asyncio.create_task(watch(server, conversation_id, ready)) for ready in readiness]
    started = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in readiness)), 300)
        opened_s = time.perf_counter() - started
        await wait_for_watchers(server, count)
        await server.settle()
        with_them = server.rss()
        descriptors = server.descriptors()
    finally:
        for task in watching:
            task.cancel()
        await asyncio.gather(*watching, return_exceptions=True)
    await wait_for_watchers(server, 0)
    return {"watchers": count, "open_s": round(opened_s, 2), "rss_before_mib": round(before / MiB, 1),
            "rss_with_watchers_mib": round(with_them / MiB, 1),
            "rss_per_watcher_kib": round((with_them - before) / count / 1024, 1),
            "descriptors_with_watchers": descriptors, "rss_within_target": with_them <= RSS_TARGET_BYTES}


def never_reading_socket(server: Server, conversation_id: str) -> socket.socket:
    """A client that asks for the conversation's events and never reads: a receive buffer of 4 KiB,
    so the server's sends stall as soon as the kernel's buffers are full."""
    address = urlsplit(server.url)
    assert address.hostname is not None
    assert address.port is not None
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect((address.hostname, address.port))
    client.sendall(f"GET /api/conversations/{conversation_id}/events HTTP/1.1\r\nHost: {address.netloc}\r\n"
                   f"Accept: text/event-stream\r\n\r\n".encode())
    return client


async def long_reply(server: Server, conversation_id: str) -> dict[str, int]:
    """Post a turn to the conversation and sample the server until it ended: its RSS before and at its peak, the most
    bytes its watchers held unread (bytes), and the fewest watchers it had."""
    await server.settle()
    rss_before, ended = server.rss(), await server.turns_ended()
    posted = await server.client.post(f"/api/conversations/{conversation_id}/messages", json={"text": "Tell me."})
    posted.raise_for_status()
    rss_peak = held_peak = 0
    fewest_watchers = (await server.state())["watchers"]
    while True:
        rss_peak = max(rss_peak, server.rss())
        state = await server.state()
        held_peak, fewest_watchers = max(held_peak, state["held_bytes"]), min(fewest_watchers, state["watchers"])
        if await server.turns_ended() > ended:
            break
        await asyncio.sleep(SAMPLE_S)
    return {"rss_before": rss_before, "rss_peak": rss_peak, "held_peak": held_peak, "fewest_watchers": fewest_watchers}


async def never_reading_client(server: Server, bound: int) -> dict[str, Any]:
    # Each reply in a new conversation: a later turn of one would carry the earlier replies. A first
    # reply raises the allocator's high-water mark, so the measured ones start from the same.
    await long_reply(server, await create_conversation(server))
    alone, with_slow = [await long_reply(server, await create_conversation(server))], []
    for _ in range(PAIRS):
        conversation_id = await create_conversation(server)
        slow = never_reading_socket(server, conversation_id)
        try:
            await wait_for_watchers(server, 1)
            with_slow.append(await long_reply(server, conversation_id))
        finally:
            slow.close()
        await wait_for_watchers(server, 0)
        alone.append(await long_reply(server, await create_conversation(server)))
    # The RSS peak rises from reply to reply (each held conversation keeps its reply): a reply with
    # the client is compared with the mean of the replies alone on either side of it.
    extras = sorted(slow["rss_peak"] - (before["rss_peak"] + after["rss_peak"]) / 2
                    for before, slow, after in zip(alone, with_slow, alone[1:], strict=False))
    extra = extras[len(extras) // 2]
    held = max(slow["held_peak"] for slow in with_slow)
    return {"byte_bound_mib": round(bound / MiB, 2),
            "alone_rss_peaks_mib": [round(reply["rss_peak"] / MiB, 1) for reply in alone],
            "slow_rss_peaks_mib": [round(reply["rss_peak"] / MiB, 1) for reply in with_slow],
            "slow_rss_over_alone_mib": round(extra / MiB, 1),
            "slow_held_peak_mib": round(held / MiB, 2),
            "slow_cut": all(reply["fewest_watchers"] == 0 for reply in with_slow),
            "held_within_bound": held <= bound, "rss_within_bound": extra <= bound}


async def conversations_in_turn(server: Server, count: int, every: int, max_held: int) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []

    async def sample(opened: int) -> None:
        samples.append({"conversations": opened, "seconds": round(time.perf_counter() - started, 1),
                        "descriptors": server.descriptors(),
                        "held": (await server.state())["held"],
                        "connections": await server.count_backends() if server.count_backends else None,
                        "pooled": await server.pooled() if server.count_backends else None})

    started = time.perf_counter()
    await sample(0)
    for opened in range(1, count + 1):
        conversation_id = await create_conversation(server)
        for path in (f"/api/conversations/{conversation_id}", f"/api/conversations/{conversation_id}/display"):
            (await server.client.get(path)).raise_for_status()
        if opened % every == 0:
            await sample(opened)
    elapsed = time.perf_counter() - started
    full = [s for s in samples if s["held"] == max_held]
    return {"conversations": count, "seconds": round(elapsed, 1), "samples": samples,
            "descriptors_flat": _flat(full, "descriptors"),
            "connections_flat": _flat(full, "connections") if server.count_backends else None}


def _flat(samples: list[dict[str, Any]], name: str) -> bool | None:
    """Whether `name` never rose past FLAT_SLACK over its first value in `samples`; None without
    any sample (the server never held `max_held`)."""
    values = [value for value in (s[name] for s in samples) if value is not None]
    return max(values) - values[0] <= FLAT_SLACK if values else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with server_process(args.store, args.max_held, args.reply_bytes, args.reply_seconds) as server:
        return {"store": "postgresql" if args.store else "sqlite", "max_held": args.max_held,
                "load_average": os.getloadavg()[0],
                "idle": await idle_watchers(server, await create_conversation(server), args.watchers),
                "never_reading": await never_reading_client(server, ServerOptions().client_buffer_bytes),
                "in_turn": await conversations_in_turn(server, args.conversations, args.sample_every,
                                                       args.max_held)}


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "not measured"}[met]


def report(figures: dict[str, Any]) -> None:
    idle, slow, in_turn = figures["idle"], figures["never_reading"], figures["in_turn"]
    print(f"harness serve in its own process on {figures['store']}, max_held {figures['max_held']} "
          f"(load average {figures['load_average']:.1f})")
    print(f"1. {idle['watchers']} idle watchers of one conversation (opened in {idle['open_s']} s): RSS "
          f"{idle['rss_before_mib']} MiB before, {idle['rss_with_watchers_mib']} MiB with them, "
          f"{idle['rss_per_watcher_kib']} KiB per watcher; {idle['descriptors_with_watchers']} descriptors")
    print(f"2. replies streamed alone and, between them, {PAIRS} with a never-reading client: RSS peaks "
          f"{', '.join(map(str, slow['alone_rss_peaks_mib']))} MiB alone, "
          f"{', '.join(map(str, slow['slow_rss_peaks_mib']))} MiB with it ({slow['slow_rss_over_alone_mib']} MiB "
          f"more, median); its watchers held at most {slow['slow_held_peak_mib']} MiB unread, the client "
          f"{'was cut' if slow['slow_cut'] else 'was not always cut'}; byte bound {slow['byte_bound_mib']} MiB")
    print(f"3. {in_turn['conversations']} conversations created and read in turn in {in_turn['seconds']} s:")
    print("   conversations  seconds  descriptors  held  connections  of them pooled")
    for sample in in_turn["samples"]:
        connections, pooled = ("-" if sample[name] is None else sample[name] for name in ("connections", "pooled"))
        print(f"   {sample['conversations']:>13}  {sample['seconds']:>7}  {sample['descriptors']:>11}  "
              f"{sample['held']:>4}  {connections:>11}  {pooled:>14}")
    print("targets (issue 29)")
    verdicts = [(f"RSS with {idle['watchers']} idle watchers within 200 MB", idle["rss_within_target"]),
                ("a never-reading client's held bytes within its bound", slow["held_within_bound"]),
                ("a never-reading client's RSS within its bound", slow["rss_within_bound"]),
                (f"descriptors flat over {in_turn['conversations']} conversations", in_turn["descriptors_flat"])]
    if figures["store"] == "postgresql":
        verdicts.append((f"connections flat over {in_turn['conversations']} conversations",
                         in_turn["connections_flat"]))
    for target, met in verdicts:
        print(f"   {target:<60}{_verdict(met)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--watchers", type=int, default=1000, help="idle watchers of one conversation")
    parser.add_argument("--reply-bytes", type=int, default=2 * MiB, help="the long reply's size")
    parser.add_argument("--reply-seconds", type=float, default=2.0, help="how long the long reply streams")
    parser.add_argument("--conversations", type=int, default=5000, help="conversations opened in turn")
    parser.add_argument("--sample-every", type=int, default=500, help="conversations between two samples")
    parser.add_argument("--max-held", type=int, default=ServerOptions().max_held,
                        help="conversations the server holds at most")
    parser.add_argument("--store", help="a PostgreSQL server (a fresh schema is made and dropped); default: SQLite")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    if args.json:
        print(json.dumps(figures))
    else:
        report(figures)


if __name__ == "__main__":
    main()
