"""Journal benchmark: the harness's commit path and branch scan against the bare database drivers.

The journal is what this project exists for, so its cost is measured against the floor a
developer would get by writing the same rows with the bare driver at the same durability.

1. Commit latency. One realistic commit of five writes, the shape of a step settling: insert an
   assistant message entry, insert its usage row, set the lane's branch tip, set the lane state,
   append a streaming frame (entry and frame payloads ~500 bytes of JSON). It goes through
   `Session.mutate` on SQLite (`sqlite:///PATH`: WAL, synchronous=FULL) and on PostgreSQL, and the
   same five rows go through bare `sqlite3` (WAL, synchronous=FULL, BEGIN IMMEDIATE ... COMMIT in a
   plain synchronous loop, the honest floor) and bare async `psycopg` (one transaction, one round
   trip per statement, and again pipelined as the harness's backend does), into equivalent tables
   in a separate file / schema. The bare side serializes the same JSON with `json.dumps` on every
   commit. All sides run in alternating blocks (the order flips each round) after a warm-up, so
   machine noise lands on every side alike. Reported: p50/p99 latency in ms, commits per second,
   harness/bare ratios, and drift (does a commit get slower as its session grows?).

2. Branch scan. `SessionReader.scan_branch` reads from a tip back to the newest compaction and no
   further (HA-29), so its cost should be O(entries since the compaction), not O(history). A
   session of 100,000 entries and one of 10,000, each with its newest compaction 1,000 entries
   behind the tip (older compactions further back), are scanned alternately; the ratio of their
   median times should be ~1. The same holds for a five-write commit appended to each session
   (its id and parent checks must be index lookups), so that is timed too.

Run: `.venv/bin/python -m bench.journal [--commits N] [--postgres URL]`. PostgreSQL defaults to
`$HARNESS_TEST_POSTGRES_URL` or `postgresql://postgres@127.0.0.1:5432/test`; the run creates private
schemas `harness_bench_<hex>` (harness) and `harness_bench_<hex>_bare` (baseline) and drops them.
If the server is unreachable, or the harness has no PostgreSQL backend yet, only SQLite runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from pydantic import JsonValue

from bench.history import append_history
from bench.timing import BLOCK, Side, alternate, per_second, percentile
from harness.context import Context
from harness.messages import AssistantMessage, Cost, TextContent, Usage, UserMessage
from harness.session import (
    CompactionPayload,
    Entry,
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

LANE = "main"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
SCAN_BATCH = 1_000  # entries per commit while building the scan sessions
SCAN_TAIL = 1_000  # entries newer than the newest compaction
SCAN_ROUNDS = 15
HISTORY_COMMITS = 300  # five-write commits appended to each of the long and short sessions



# ---------------------------------------------------------------------------------------------
# Payloads: one assistant reply settling a step.

REPLY = AssistantMessage(
    content=[TextContent(text="Done: the retry loop now backs off exponentially, capped at 30 s.")],
    api="openai-chat",
    provider="openai",
    model="gpt-4o-mini",
    usage=Usage(input=1834, output=96, total_tokens=1930,
                cost=Cost(input=0.000275, output=0.0000576, total=0.0003326)),
    stop_reason="stop",
    response_id="chatcmpl-9xYzAbCdEfGh",
)
# One persisted page of a streaming reply: stream frames as the runtime writes them.
FRAME: dict[str, JsonValue] = {"frames": [
    {"type": "text_start", "content_index": 0},
    {"type": "text_delta", "content_index": 0, "delta": "Done: the retry loop now backs off"},
]}
QUESTION = UserMessage(content="Please make the retry loop back off exponentially and cap the wait at thirty "
                               "seconds; add a test for the cap and keep the public names as they are.")
CONFIG = LaneConfig.model_validate({"model": {"provider": "openai", "model_id": "gpt-4o-mini"}})


@dataclass(frozen=True)
class BareTexts:
    """The same JSON the harness writes, as plain dicts the bare side re-serializes per commit."""

    entry: dict[str, Any]
    usage: dict[str, Any]
    frame: dict[str, Any]

    @staticmethod
    def build() -> BareTexts:
        return BareTexts(
            entry=json.loads(MessagePayload(message=REPLY).model_dump_json()),
            usage=json.loads(REPLY.usage.model_dump_json()),
            frame=dict(FRAME),
        )


def dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# The harness side: one five-write job through Session.mutate.


class HarnessCommits:
    def __init__(self, session: Session, context: Context) -> None:
        self.session = session
        self.context = context
        self.tip: str | None = None
        self.operation_id = new_id()

    async def commit(self) -> None:
        tip, operation_id = self.tip, self.operation_id

        async def job(m: SessionMutator) -> str:
            entry_id = m.insert_entry(MessagePayload(message=REPLY), parent_id=tip)
            m.insert_usage(REPLY.usage, entry_id=entry_id)
            m.set(addresses.branch_tip(LANE), entry_id)
            m.set(addresses.lane_state(LANE), LaneState(current_operation_id=operation_id))
            m.append(addresses.assistant_frames(operation_id, entry_id), FRAME)
            return entry_id

        self.tip = await self.session.mutate(job, self.context)

    @staticmethod
    async def open(store: Store, context: Context) -> HarnessCommits:
        session = await store.create_session(context)
        await session.create_lane(LANE, CONFIG, context)
        return HarnessCommits(session, context)


# ---------------------------------------------------------------------------------------------
# The bare sides: the same five rows, in tables shaped like the journal's.

BARE_SQLITE_SCHEMA = (
    """CREATE TABLE entries (session_id TEXT NOT NULL, id TEXT NOT NULL, parent_id TEXT,
        seq INTEGER NOT NULL, timestamp INTEGER NOT NULL, type TEXT NOT NULL, custom_type TEXT,
        payload TEXT NOT NULL, PRIMARY KEY (session_id, id))""",
    "CREATE UNIQUE INDEX entries_by_seq ON entries (session_id, seq)",
    """CREATE TABLE record_values (session_id TEXT NOT NULL, namespace TEXT NOT NULL, key TEXT NOT NULL,
        seq INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (session_id, namespace, key))""",
    """CREATE TABLE list_items (session_id TEXT NOT NULL, namespace TEXT NOT NULL, key TEXT NOT NULL,
        seq INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (session_id, namespace, key, seq))""",
    """CREATE TABLE usage_ledger (session_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL,
        entry_id TEXT, adjustment INTEGER NOT NULL, usage TEXT NOT NULL, details TEXT,
        PRIMARY KEY (session_id, id))""",
    "CREATE UNIQUE INDEX usage_by_seq ON usage_ledger (session_id, seq)",
)
# The harness's PostgreSQL tables sort keys by code point (COLLATE "C"); so do these.
BARE_POSTGRES_SCHEMA = tuple(
    statement.replace("INTEGER", "BIGINT").replace("adjustment BIGINT", "adjustment BOOLEAN")
    .replace("TEXT", 'TEXT COLLATE "C"')
    for statement in BARE_SQLITE_SCHEMA
)
_UPSERT = ("INSERT INTO record_values (session_id, namespace, key, seq, value) VALUES ({0}) "
           "ON CONFLICT (session_id, namespace, key) "
           "DO UPDATE SET seq = excluded.seq, value = excluded.value")
_ENTRY = ("INSERT INTO entries (session_id, id, parent_id, seq, timestamp, type, custom_type, payload) "
          "VALUES ({0})")
_USAGE = "INSERT INTO usage_ledger VALUES ({0})"
_FRAME = "INSERT INTO list_items VALUES ({0})"


def _marks(n: int, mark: str) -> str:
    return ", ".join([mark] * n)


@dataclass
class BareRows:
    """Builds the parameters of the five rows of one commit, serializing JSON as an app would."""

    texts: BareTexts
    session_id: str = field(default_factory=new_id)
    operation_id: str = field(default_factory=new_id)
    tip: str | None = None
    seq: int = 1

    def next(self) -> list[tuple[Any, ...]]:
        entry_id, usage_id, seq, now = new_id(), new_id(), self.seq, time.time_ns() // 1_000_000
        state = {"current_operation_id": self.operation_id, "pending_next_run": []}
        rows: list[tuple[Any, ...]] = [
            (self.session_id, entry_id, self.tip, seq, now, "message", None, dumps(self.texts.entry)),
            (self.session_id, usage_id, seq + 1, entry_id, False, dumps(self.texts.usage), None),
            (self.session_id, "harness.branch.tip", LANE, seq + 2, dumps(entry_id)),
            (self.session_id, "harness.lane.state", LANE, seq + 3, dumps(state)),
            (self.session_id, "harness.pending.assistant_frame", f"{self.operation_id}:{entry_id}",
             seq + 4, dumps(self.texts.frame)),
        ]
        self.tip, self.seq = entry_id, seq + 5
        return rows


class BareSqlite:
    def __init__(self, path: Path, texts: BareTexts) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        for statement in BARE_SQLITE_SCHEMA:
            self.db.execute(statement)
        self.rows = BareRows(texts)
        self.sql = [s.format(_marks(n, "?")) for s, n in
                    ((_ENTRY, 8), (_USAGE, 7), (_UPSERT, 5), (_UPSERT, 5), (_FRAME, 5))]

    def commit_sync(self) -> None:
        rows = self.rows.next()
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in zip(self.sql, rows, strict=True):
                db.execute(sql, params)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def commit(self) -> None:
        # No thread hop and no await: the coroutine only wraps the plain synchronous commit.
        self.commit_sync()


class BarePostgres:
    """The five rows in one transaction on an async connection: one round trip per statement,
    or, `pipelined`, all of them sent together (the commit the harness's backend makes)."""

    def __init__(self, connection: psycopg.AsyncConnection[Any], texts: BareTexts, pipelined: bool) -> None:
        self.connection = connection
        self.rows = BareRows(texts)
        self.pipelined = pipelined
        self.sql = [s.format(_marks(n, "%s")) for s, n in
                    ((_ENTRY, 8), (_USAGE, 7), (_UPSERT, 5), (_UPSERT, 5), (_FRAME, 5))]

    @staticmethod
    async def create_schema(url: str) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
            for statement in BARE_POSTGRES_SCHEMA:
                await connection.execute(statement)

    @staticmethod
    async def open(url: str, texts: BareTexts, *, pipelined: bool) -> BarePostgres:
        connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
        return BarePostgres(connection, texts, pipelined)

    async def commit(self) -> None:
        rows = self.rows.next()
        connection = self.connection
        if self.pipelined:
            async with connection.pipeline(), connection.transaction():
                for sql, params in zip(self.sql, rows, strict=True):
                    await connection.execute(sql, params)
        else:
            async with connection.transaction():
                for sql, params in zip(self.sql, rows, strict=True):
                    await connection.execute(sql, params)


# ---------------------------------------------------------------------------------------------
# Measurement.










@dataclass
class Group:
    """A harness side and the bare floors it is compared with, on one backend."""

    harness: Side
    floors: list[Side]

    @property
    def sides(self) -> list[Side]:
        return [self.harness, *self.floors]


def drift(samples: list[int]) -> float:
    """p50 of the last quarter of the timed commits over p50 of the first: ~1 unless the cost of
    a commit grows as the session does (each side's session grows by one entry per commit)."""
    quarter = max(1, len(samples) // 4)
    return percentile(samples[-quarter:], 50) / percentile(samples[:quarter], 50)


def print_commit_table(groups: list[Group]) -> None:
    print(f"{'side':<30}{'p50 ms':>9}{'p99 ms':>9}{'commits/s':>11}{'drift':>8}   harness/this: p50, rate")
    for group in groups:
        harness = group.harness
        for side in group.sides:
            row = (f"{side.name:<30}{percentile(side.samples, 50):>9.3f}{percentile(side.samples, 99):>9.3f}"
                   f"{per_second(side.samples):>11.0f}{drift(side.samples):>7.2f}x")
            if side is not harness:
                p50 = percentile(harness.samples, 50) / percentile(side.samples, 50)
                rate = per_second(side.samples) / per_second(harness.samples)
                row += f"   {p50:>5.2f}x {rate:>5.2f}x"
            print(row)
    print("   drift: p50 of the last quarter of the commits over p50 of the first quarter")


# ---------------------------------------------------------------------------------------------
# Branch scans.


def _compaction() -> CompactionPayload:
    summary = ("The user is hardening a job runner. So far: retries back off exponentially with a cap, "
               "the cap has a test, helper names were clarified, and flaky network tests were isolated. "
               "Open: the scheduler's clock source and the metrics for retry counts. ") * 4
    return CompactionPayload(summary=summary, retained_tail=[QUESTION, REPLY], tokens_before=48_213)


async def build_chain(store: Store, total: int, context: Context) -> tuple[Session, str]:
    """A session with `total` entries in one chain whose newest compaction has SCAN_TAIL entries
    after it (older compactions every 10,000 entries before it). Returns it and its tip."""
    session = await store.create_session(context)
    tip = await append_history(session, LANE, total, newest_compaction_behind=SCAN_TAIL, batch=SCAN_BATCH,
                               turns=[MessagePayload(message=QUESTION), MessagePayload(message=REPLY)],
                               compaction=_compaction(), context=context)
    return session, tip


async def time_scan(session: Session, tip: str, context: Context) -> tuple[int, int]:
    seen: list[Entry] = []
    start = time.perf_counter_ns()
    await session.scan_branch(tip, seen.append, context)
    elapsed = time.perf_counter_ns() - start
    return elapsed, len(seen)


@dataclass
class HistoryResult:
    """Section 2 for one backend: scan and commit times on the long and the short session."""

    label: str
    scan_ms: tuple[float, float]  # median scan_branch, (100k session, 10k session)
    commit_ms: tuple[float, float]  # p50 five-write commit appended to each
    visited: int
    build_s: float


async def bench_history(label: str, url: str, context: Context) -> HistoryResult:
    """Build a 100k and a 10k session, then time scans and five-write commits on each, alternately."""
    store = await connect(url, context)
    try:
        started = time.perf_counter()
        big, big_tip = await build_chain(store, 100_000, context)
        small, small_tip = await build_chain(store, 10_000, context)
        build_s = time.perf_counter() - started
        expected = SCAN_TAIL + 1
        scans: tuple[list[int], list[int]] = ([], [])
        counts: set[int] = set()
        for round_ in range(SCAN_ROUNDS + 1):
            for which in (0, 1) if round_ % 2 else (1, 0):
                session, tip = ((big, big_tip), (small, small_tip))[which]
                elapsed, count = await time_scan(session, tip, context)
                counts.add(count)
                if round_:  # round 0 is the warm-up
                    scans[which].append(elapsed)
        assert counts == {expected}, f"scan visited {counts}, expected {expected}"

        # A commit's checks (id uniqueness, parent exists) must not grow with the session either.
        appenders = [HarnessCommits(big, context), HarnessCommits(small, context)]
        appenders[0].tip, appenders[1].tip = big_tip, small_tip
        sides = [Side("100k", appenders[0].commit), Side("10k", appenders[1].commit)]
        await alternate(sides, HISTORY_COMMITS, warmup=HISTORY_COMMITS // 10)
        return HistoryResult(
            label=label,
            scan_ms=(statistics.median(scans[0]) / 1e6, statistics.median(scans[1]) / 1e6),
            commit_ms=(percentile(sides[0].samples, 50), percentile(sides[1].samples, 50)),
            visited=expected,
            build_s=build_s,
        )
    finally:
        await store.close()


def print_history_table(results: list[HistoryResult]) -> None:
    print(f"{'backend':<10}{'scan 100k ms':>14}{'scan 10k ms':>13}{'ratio':>8}{'visited':>9}"
          f"{'commit 100k ms':>16}{'commit 10k ms':>15}{'ratio':>8}{'build s':>9}")
    for r in results:
        print(f"{r.label:<10}{r.scan_ms[0]:>14.2f}{r.scan_ms[1]:>13.2f}{r.scan_ms[0] / r.scan_ms[1]:>7.2f}x"
              f"{r.visited:>9}{r.commit_ms[0]:>16.3f}{r.commit_ms[1]:>15.3f}"
              f"{r.commit_ms[0] / r.commit_ms[1]:>7.2f}x{r.build_s:>9.1f}")


# ---------------------------------------------------------------------------------------------
# PostgreSQL plumbing.


def with_search_path(url: str, schema: str) -> str:
    option = "options=" + quote(f"-csearch_path={schema}", safe="")
    return f"{url}{'&' if '?' in url else '?'}{option}"


@dataclass
class PostgresTarget:
    url: str
    schema: str

    @property
    def harness_url(self) -> str:
        return with_search_path(self.url, self.schema)

    @property
    def bare_url(self) -> str:
        return with_search_path(self.url, self.schema + "_bare")

    async def create(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as db:
            await db.execute(f'CREATE SCHEMA "{self.schema}"')
            await db.execute(f'CREATE SCHEMA "{self.schema}_bare"')

    async def drop(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as db:
            for schema in (self.schema, self.schema + "_bare"):
                await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    async def settings(self) -> str:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as db:
            values = []
            for name in ("server_version", "synchronous_commit", "fsync", "wal_sync_method"):
                cursor = await db.execute(f"SHOW {name}")
                row = await cursor.fetchone()
                values.append(f"{name}={row[0] if row else '?'}")
            return ", ".join(values)


async def postgres_target(url: str) -> tuple[PostgresTarget | None, str]:
    """A private-schema target, or None and the reason PostgreSQL is left out."""
    try:
        async with await psycopg.AsyncConnection.connect(url, connect_timeout=3):
            pass
    except psycopg.Error as error:
        return None, f"PostgreSQL at {url} is not reachable ({str(error).strip().splitlines()[0]})"
    target = PostgresTarget(url, f"harness_bench_{secrets.token_hex(4)}")
    await target.create()
    return target, await target.settings()


# ---------------------------------------------------------------------------------------------


async def main(commits: int, postgres_url: str) -> None:
    context = Context()
    warmup = max(20, min(200, commits // 10))
    texts = BareTexts.build()
    print(f"journal benchmark: {commits} commits per side after {warmup} warm-up, blocks of {BLOCK}, "
          f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs")
    print(f"five writes per commit; entry payload {len(dumps(texts.entry))} B, frame "
          f"{len(dumps(texts.frame))} B, usage {len(dumps(texts.usage))} B")
    target, note = await postgres_target(postgres_url)
    print(f"postgres: {note}")
    stores: list[Store] = []
    bare_pg: list[BarePostgres] = []
    try:
        with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
            root = Path(tmp)
            store = await connect(f"sqlite:///{root / 'harness.db'}", context)
            stores.append(store)
            harness_commits = await HarnessCommits.open(store, context)
            harness_sqlite = Side("harness sqlite (mutate)", harness_commits.commit)
            bare_sqlite = Side("bare sqlite3", BareSqlite(root / "bare.db", texts).commit)
            groups = [Group(harness_sqlite, [bare_sqlite])]
            if target is not None:
                pg_store = await connect(target.harness_url, context)
                stores.append(pg_store)
                await BarePostgres.create_schema(target.bare_url)
                bare_pg = [await BarePostgres.open(target.bare_url, texts, pipelined=p) for p in (False, True)]
                pg_commits = await HarnessCommits.open(pg_store, context)
                groups.append(Group(Side("harness postgres (mutate)", pg_commits.commit), [
                    Side("bare psycopg (async)", bare_pg[0].commit),
                    Side("bare psycopg (async, pipeline)", bare_pg[1].commit),
                ]))
            started = time.perf_counter()
            await alternate([side for group in groups for side in group.sides], commits, warmup)
            print(f"\n1. five-write commit, durable (sqlite WAL synchronous=FULL; postgres server defaults), "
                  f"{time.perf_counter() - started:.1f} s")
            print_commit_table(groups)

            for opened in stores:
                await opened.close()
            stores.clear()

            print(f"\n2. history behind the tip: scan_branch to the newest compaction ({SCAN_TAIL} entries "
                  f"behind the tip; median of {SCAN_ROUNDS}) and the five-write commit appended to the "
                  f"session (p50 of {HISTORY_COMMITS}), on sessions of 100,000 and 10,000 entries built "
                  f"through Session.mutate, {SCAN_BATCH} entries per commit, default store "
                  "(synchronous=FULL)")
            results = [await bench_history("sqlite", f"sqlite:///{root / 'scan.db'}", context)]
            if target is not None:
                results.append(await bench_history("postgres", target.harness_url, context))
            print_history_table(results)
    finally:
        for opened in stores:
            await opened.close()
        for bare in bare_pg:
            await bare.connection.close()
        if target is not None:
            await target.drop()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--commits", type=int, default=5_000, help="timed commits per side (default 5000)")
    parser.add_argument("--postgres", default=os.environ.get("HARNESS_TEST_POSTGRES_URL", DEFAULT_POSTGRES),
                        help="PostgreSQL URL (default $HARNESS_TEST_POSTGRES_URL or %(default)s)")
    args = parser.parse_args()
    asyncio.run(main(max(1, args.commits), args.postgres))


if __name__ == "__main__":
    cli()
