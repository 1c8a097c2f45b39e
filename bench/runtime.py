"""Harness benchmark: acceptance, watch capture and event fan-out, each next to a bare store commit.

The harness adds a session line, a projection, id checks and an event bus on top of the journal.
Each figure here is set beside a bare `Session.mutate` commit measured in the same run, so the
overhead reads as a ratio, not an absolute that depends on the machine.

1. Accept latency. `Lane.accept` of a one-message prompt (each on its own idle lane, since nothing
   settles a run yet) on SQLite (`sqlite:///PATH`: WAL, synchronous=FULL, the default) and on
   PostgreSQL when reachable (and on SQLite with synchronous=NORMAL, to show the harness's own
   cost without the fsync), against a bare `Session.mutate` that makes the same five writes
   (prompt entry, branch tip, operation meta, operation state, lane state) on an unattached
   session of the same store. The sides alternate in blocks after a warm-up. Reported: p50/p99 in
   ms, operations per second, accept/bare ratios.

2. Watch capture. `Lane.watch` on a lane of 100,000 entries whose newest compaction is TAIL
   entries behind the tip, and on one of 1,000 entries with the same tail (both built with large
   direct commits before attaching, in one SQLite file, and on PostgreSQL when reachable). A watch
   scans from the tip to the newest compaction only, so the ratio of the medians should be ~1: the
   capture must not grow with history. Each median is also given as a multiple of the bare commit.

3. Fan-out. 100 watches on one lane, each drained by its own consumer task, while idle appends
   (three events each: message_start, message_end, entry_added) commit 10,000 events on SQLite.
   Reported: events per second until every watcher received every event, deliveries per second,
   the same run with no watcher, and the time per event as a multiple of the bare commit.

Run: `.venv/bin/python -m bench.runtime [--accepts N] [--postgres URL]`. PostgreSQL defaults to
`$HARNESS_TEST_POSTGRES_URL` or `postgresql://postgres@127.0.0.1:5432/test`; the run creates a
private schema `harness_bench_<hex>` and drops it. If the server is unreachable, only SQLite runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg

from bench.history import append_history
from bench.timing import BLOCK, Side, alternate, per_second, percentile
from harness.context import Context
from harness.messages import AssistantMessage, ModelIdentity, TextContent, Usage, UserMessage, now_ms
from harness.runtime import AgentHarness, AgentHarnessOptions, LaneWatch, PromptRequest
from harness.session import (
    CompactionPayload,
    LaneConfig,
    LaneState,
    MessagePayload,
    Session,
    SessionMutator,
    Store,
    addresses,
    connect,
)
from harness.session.ids import new_id
from harness.session.records import OperationMeta, RunIntent, RunStarting

LANE = "main"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
BUILD_BATCH = 5_000  # entries per direct commit while building the history sessions
TAIL = 200  # entries newer than the newest compaction
WATCH_ROUNDS = 41
FAN_WATCHERS = 100
FAN_EVENTS = 10_000
EVENTS_PER_APPEND = 3

CONFIG = LaneConfig(model=ModelIdentity(provider="openai", model_id="gpt-4o-mini"))
PROMPT = UserMessage(content="Please make the retry loop back off exponentially and cap the wait at thirty "
                             "seconds; add a test for the cap and keep the public names as they are.")
REPLY = AssistantMessage(
    content=[TextContent(text="Done: the retry loop now backs off exponentially, capped at 30 s.")],
    api="openai-chat", provider="openai", model="gpt-4o-mini",
    usage=Usage(input=1834, output=96, total_tokens=1930), stop_reason="stop",
)
SUMMARY = CompactionPayload(
    summary=("The user is hardening a job runner. So far: retries back off exponentially with a cap, "
             "the cap has a test, and flaky network tests were isolated. ") * 4,
    retained_tail=[PROMPT, REPLY], tokens_before=48_213,
)



# ---------------------------------------------------------------------------------------------
# Measurement.










# ---------------------------------------------------------------------------------------------
# 1. Acceptance against the bare commit of the same writes.


async def lanes_session(store: Store, count: int, context: Context) -> Session:
    """A session with `count` idle, empty lanes, written directly in a few large commits."""
    session = await store.create_session(context)
    for start in range(0, count, BUILD_BATCH):

        async def job(m: SessionMutator, start: int = start) -> None:
            for index in range(start, min(count, start + BUILD_BATCH)):
                name = f"lane-{index}"
                m.set(addresses.branch_tip(name), None)
                m.set(addresses.lane_config(name), CONFIG)
                m.set(addresses.lane_state(name), LaneState())

        await session.mutate(job, context)
    return session


class Accepts:
    """`Lane.accept` on the next idle lane, each call its own run."""

    def __init__(self, harness: AgentHarness, context: Context) -> None:
        self.lanes = iter([harness.lane(info.name) for info in harness.lanes])
        self.context = context

    async def run(self) -> None:
        await next(self.lanes).accept(PromptRequest(messages=PROMPT), self.context)


class BareCommits:
    """The five writes of an acceptance through `Session.mutate` on an unattached session."""

    def __init__(self, session: Session, context: Context) -> None:
        self.session, self.context = session, context
        self.tip: str | None = None

    async def run(self) -> None:
        tip, operation_id = self.tip, new_id()

        async def job(m: SessionMutator) -> str:
            entry_id = m.insert_entry(MessagePayload(message=PROMPT), parent_id=tip)
            m.set(addresses.branch_tip(LANE), entry_id)
            m.set(addresses.operation_meta(operation_id), OperationMeta(
                operation_id=operation_id, lane=LANE, source_tip_id=tip, started_at=now_ms(),
                intent=RunIntent(prompt_entry_ids=[entry_id])))
            m.set(addresses.operation_state(operation_id), RunStarting())
            m.set(addresses.lane_state(LANE), LaneState(current_operation_id=operation_id))
            return entry_id

        self.tip = await self.session.mutate(job, self.context)


@dataclass
class AcceptResult:
    label: str
    accept: Side
    bare: Side


async def bench_accept(label: str, store: Store, count: int, warmup: int, context: Context) -> AcceptResult:
    session = await lanes_session(store, count + warmup, context)
    harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session), context)
    bare_session = await store.create_session(context)
    await bare_session.create_lane(LANE, CONFIG, context)
    try:
        accept = Side(f"accept {label}", Accepts(harness, context).run)
        bare = Side(f"bare commit {label}", BareCommits(bare_session, context).run)
        await alternate([accept, bare], count, warmup)
        return AcceptResult(label, accept, bare)
    finally:
        await harness.close(context)


def print_accept_table(results: list[AcceptResult]) -> None:
    print(f"{'side':<33}{'p50 ms':>9}{'p99 ms':>9}{'ops/s':>9}   accept/bare: p50, p99")
    for r in results:
        for side in (r.accept, r.bare):
            row = (f"{side.name:<33}{percentile(side.samples, 50):>9.3f}{percentile(side.samples, 99):>9.3f}"
                   f"{per_second(side.samples):>9.0f}")
            if side is r.accept:
                row += (f"   {percentile(r.accept.samples, 50) / percentile(r.bare.samples, 50):>5.2f}x "
                        f"{percentile(r.accept.samples, 99) / percentile(r.bare.samples, 99):>5.2f}x")
            print(row)


# ---------------------------------------------------------------------------------------------
# 2. Watch capture against history.


async def history_session(store: Store, total: int, context: Context) -> Session:
    """A session whose lane `main` holds `total` entries in one chain, the newest compaction TAIL
    entries behind the tip (older ones every 10,000), built in direct commits of BUILD_BATCH."""
    session = await store.create_session(context)
    await session.create_lane(LANE, CONFIG, context)
    await append_history(session, LANE, total, newest_compaction_behind=TAIL, batch=BUILD_BATCH,
                         turns=[MessagePayload(message=PROMPT), MessagePayload(message=REPLY)],
                         compaction=SUMMARY, context=context)
    return session


@dataclass
class WatchResult:
    label: str
    big_ms: float
    small_ms: float
    transcript: int
    bare_ms: float
    build_s: float


async def bench_watch(label: str, store: Store, bare_ms: float, context: Context) -> WatchResult:
    started = time.perf_counter()
    big = await history_session(store, 100_000, context)
    small = await history_session(store, 1_000, context)
    build_s = time.perf_counter() - started
    harnesses = [(await AgentHarness.create(AgentHarnessOptions(session=s), context))[0] for s in (big, small)]
    times: tuple[list[int], list[int]] = ([], [])
    sizes: set[int] = set()
    try:
        for round_ in range(WATCH_ROUNDS + 1):
            for which in (0, 1) if round_ % 2 else (1, 0):
                start = time.perf_counter_ns()
                watch = await harnesses[which].lane(LANE).watch(context)
                elapsed = time.perf_counter_ns() - start
                watch.close()
                sizes.add(len(watch.snapshot.transcript))
                if round_:  # round 0 is the warm-up
                    times[which].append(elapsed)
    finally:
        for harness in harnesses:
            await harness.close(context)
    assert sizes == {TAIL + 1}, f"snapshots held {sizes} entries, expected {TAIL + 1}"
    return WatchResult(label, statistics.median(times[0]) / 1e6, statistics.median(times[1]) / 1e6,
                       TAIL + 1, bare_ms, build_s)


def print_watch_table(results: list[WatchResult]) -> None:
    print(f"{'backend':<10}{'100k ms':>9}{'1k ms':>9}{'100k/1k':>9}{'entries':>9}{'100k/bare':>11}"
          f"{'1k/bare':>9}{'build s':>9}")
    for r in results:
        print(f"{r.label:<10}{r.big_ms:>9.2f}{r.small_ms:>9.2f}{r.big_ms / r.small_ms:>8.2f}x{r.transcript:>9}"
              f"{r.big_ms / r.bare_ms:>10.1f}x{r.small_ms / r.bare_ms:>8.1f}x{r.build_s:>9.1f}")


# ---------------------------------------------------------------------------------------------
# 3. Fan-out of committed events to many watchers.


@dataclass
class FanResult:
    watchers: int
    events: int
    seconds: float
    append_p50_ms: float

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds

    @property
    def deliveries_per_second(self) -> float:
        return self.events * self.watchers / self.seconds


async def bench_fan_out(url: str, watchers: int, context: Context) -> FanResult:
    """Commit FAN_EVENTS events (idle appends) to a lane with `watchers` draining watches; the clock
    stops when the last watcher has received the last event."""
    store = await connect(url, context)
    session = await store.create_session(context)
    await session.create_lane(LANE, CONFIG, context)
    harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session), context)
    lane = harness.lane(LANE)
    appends = -(-FAN_EVENTS // EVENTS_PER_APPEND)
    events = appends * EVENTS_PER_APPEND
    watches = [await lane.watch(context) for _ in range(watchers)]

    async def drain(watch: LaneWatch) -> None:
        received = 0
        async for _ in watch:
            received += 1
            if received == events:
                return

    consumers = [asyncio.ensure_future(drain(watch)) for watch in watches]
    samples: list[int] = []
    try:
        started = time.perf_counter_ns()
        for index in range(appends):
            begin = time.perf_counter_ns()
            await lane.append_message(UserMessage(content=f"note {index}"), context)
            samples.append(time.perf_counter_ns() - begin)
        await asyncio.gather(*consumers)
        seconds = (time.perf_counter_ns() - started) / 1e9
    finally:
        await harness.close(context)
        await store.close()
    return FanResult(watchers, events, seconds, percentile(samples, 50))


def print_fan_table(results: list[FanResult], bare_ms: float) -> None:
    print(f"{'watchers':>8}{'events':>8}{'seconds':>9}{'events/s':>10}{'deliveries/s':>14}{'append p50 ms':>15}"
          f"{'ms/event / bare':>17}")
    for r in results:
        per_event_ms = r.seconds * 1e3 / r.events
        print(f"{r.watchers:>8}{r.events:>8}{r.seconds:>9.2f}{r.events_per_second:>10.0f}"
              f"{r.deliveries_per_second:>14.0f}{r.append_p50_ms:>15.3f}{per_event_ms / bare_ms:>16.2f}x")


# ---------------------------------------------------------------------------------------------
# PostgreSQL plumbing.


def with_search_path(url: str, schema: str) -> str:
    option = "options=" + quote(f"-csearch_path={schema}", safe="")
    return f"{url}{'&' if '?' in url else '?'}{option}"


async def postgres_schema(url: str) -> tuple[str | None, str]:
    """A private schema's URL, or None and the reason PostgreSQL is left out."""
    try:
        async with await psycopg.AsyncConnection.connect(url, connect_timeout=3, autocommit=True) as db:
            schema = f"harness_bench_{secrets.token_hex(4)}"
            await db.execute(f'CREATE SCHEMA "{schema}"')
            cursor = await db.execute("SHOW server_version")
            row = await cursor.fetchone()
    except psycopg.Error as error:
        return None, f"PostgreSQL at {url} is not reachable ({str(error).strip().splitlines()[0]})"
    return schema, f"server_version={row[0] if row else '?'}, server defaults"


async def drop_schema(url: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as db:
        await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# ---------------------------------------------------------------------------------------------


async def main(accepts: int, postgres_url: str) -> None:
    context = Context()
    warmup = max(20, min(200, accepts // 10))
    print(f"harness benchmark: {accepts} accepts per side after {warmup} warm-up, blocks of {BLOCK}, "
          f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs")
    schema, note = await postgres_schema(postgres_url)
    print(f"postgres: {note}")
    stores: list[tuple[str, Store]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
            stores.append(("sqlite", await connect(f"sqlite:///{Path(tmp) / 'harness.db'}", context)))
            normal = await connect(f"sqlite:///{Path(tmp) / 'normal.db'}?synchronous=NORMAL", context)
            if schema is not None:
                stores.append(("postgres", await connect(with_search_path(postgres_url, schema), context)))

            started = time.perf_counter()
            accepted = [await bench_accept(label, store, accepts, warmup, context)
                        for label, store in [stores[0], ("sqlite NORMAL", normal), *stores[1:]]]
            await normal.close()
            print(f"\n1. accept latency against a bare commit of the same five writes (sqlite WAL, "
                  f"synchronous=FULL unless NORMAL, which shows the cost without the fsync), "
                  f"{time.perf_counter() - started:.1f} s")
            print_accept_table(accepted)
            bare_ms = {r.label: percentile(r.bare.samples, 50) for r in accepted}

            watched = [await bench_watch(label, store, bare_ms[label], context) for label, store in stores]
            print(f"\n2. watch capture (median of {WATCH_ROUNDS}) on 100,000 and 1,000 entries, newest "
                  f"compaction {TAIL} entries behind the tip; built with direct commits of {BUILD_BATCH}")
            print_watch_table(watched)

            for _, store in stores:
                await store.close()
            stores.clear()

            fan_url = f"sqlite:///{Path(tmp) / 'fan.db'}"
            fanned = [await bench_fan_out(fan_url, watchers, context) for watchers in (0, FAN_WATCHERS)]
            print(f"\n3. fan-out: {fanned[0].events} events from idle appends on sqlite (synchronous=FULL), "
                  f"each watcher drained by its own task; 'bare' is the sqlite bare commit p50")
            print_fan_table(fanned, bare_ms["sqlite"])
    finally:
        for _, store in stores:
            await store.close()
        if schema is not None:
            await drop_schema(postgres_url, schema)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--accepts", type=int, default=2_000, help="timed accepts per side (default 2000)")
    parser.add_argument("--postgres", default=os.environ.get("HARNESS_TEST_POSTGRES_URL", DEFAULT_POSTGRES),
                        help="PostgreSQL URL (default $HARNESS_TEST_POSTGRES_URL or %(default)s)")
    args = parser.parse_args()
    asyncio.run(main(max(1, args.accepts), args.postgres))


if __name__ == "__main__":
    cli()
