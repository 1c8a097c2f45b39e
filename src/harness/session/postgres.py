"""The PostgreSQL backend: several processes and machines on one database, same schema as SQLite.

Reads and unowned commits borrow a pooled connection. Each ownership claim holds a dedicated
connection with a session-level advisory lock, which the server drops when that connection dies
(the owner's process was killed, or its network went away); the owner's commits run on that
connection, so an owner whose lock died cannot commit. The session's epoch, bumped by every
claimant and checked inside every owner commit, covers the rest.

Statements name tables unqualified: the URL's `search_path` (libpq `options`) picks the schema.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import psycopg
import psycopg.errors
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from harness.context import Context
from harness.errors import HarnessError
from harness.messages import now_ms
from harness.session.backend import (
    SESSION_COLUMNS,
    SESSION_TABLES,
    AppendList,
    BoundsRead,
    Claim,
    CommitResult,
    ConnectionUse,
    DeleteList,
    DeleteValue,
    EntriesRead,
    EntryRow,
    InsertEntry,
    InsertUsage,
    ListRead,
    Read,
    ReadAnswer,
    ScanRead,
    SessionInfo,
    SetValue,
    TrimList,
    UsageRowRaw,
    ValueRead,
    ValueRow,
    Write,
    seq_already_held,
    write_seqs,
)
from harness.session.changes import Change
from harness.session.errors import (
    InvalidWrite,
    OwnershipLost,
    SessionNotFound,
    SessionOwned,
    StoreClosed,
    StoreConnectionLost,
    StoreFull,
    StoreUnavailable,
)
from harness.session.images import StoredImage, check_image, is_image_ref, stored_image
from harness.session.migrations import COPY_NAMESPACES, DataMigration
from harness.session.tokens import TokenInfo, TokenRow, token_row, token_sql

Connection = psycopg.AsyncConnection[TupleRow]

DEFAULT_POOL_MAX = 4
"""The pooled connections a PostgreSQL store opens at most unless told otherwise (`connect(...,
pool_max=)`, `?pool_max=N`): enough for a command or a worker, whose claims hold their own."""
# Serialises schema steps and data migrations between processes opening the same database.
_MIGRATION_LOCK_KEY = int.from_bytes(b"harness", "big")

# Ordered schema steps; a database records the highest version it has applied. Never edit a
# released step: add a new one. Identifiers are COLLATE "C" so that keys sort by code point, as
# on SQLite and in memory, whatever the database's default collation.
SCHEMA: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, (
        """CREATE TABLE sessions (
            id TEXT COLLATE "C" PRIMARY KEY,
            created_at BIGINT NOT NULL,
            parent_session_id TEXT COLLATE "C",
            forked_from_entry_id TEXT COLLATE "C",
            next_seq BIGINT NOT NULL DEFAULT 1,
            owner_epoch BIGINT NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE entries (
            session_id TEXT COLLATE "C" NOT NULL,
            id TEXT COLLATE "C" NOT NULL,
            parent_id TEXT COLLATE "C",
            seq BIGINT NOT NULL,
            timestamp BIGINT NOT NULL,
            type TEXT NOT NULL,
            custom_type TEXT,
            payload TEXT NOT NULL,
            PRIMARY KEY (session_id, id)
        )""",
        "CREATE UNIQUE INDEX entries_by_seq ON entries (session_id, seq)",
        """CREATE TABLE record_values (
            session_id TEXT COLLATE "C" NOT NULL,
            namespace TEXT COLLATE "C" NOT NULL,
            key TEXT COLLATE "C" NOT NULL,
            seq BIGINT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (session_id, namespace, key)
        )""",
        """CREATE TABLE list_items (
            session_id TEXT COLLATE "C" NOT NULL,
            namespace TEXT COLLATE "C" NOT NULL,
            key TEXT COLLATE "C" NOT NULL,
            seq BIGINT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (session_id, namespace, key, seq)
        )""",
        """CREATE TABLE usage_ledger (
            session_id TEXT COLLATE "C" NOT NULL,
            id TEXT COLLATE "C" NOT NULL,
            seq BIGINT NOT NULL,
            entry_id TEXT COLLATE "C",
            adjustment BOOLEAN NOT NULL,
            usage TEXT NOT NULL,
            details TEXT,
            PRIMARY KEY (session_id, id)
        )""",
        "CREATE UNIQUE INDEX usage_by_seq ON usage_ledger (session_id, seq)",
        'CREATE TABLE data_migrations (name TEXT COLLATE "C" PRIMARY KEY, applied_at BIGINT NOT NULL)',
    )),
    # When a session last committed, for listings and "continue the last session"; existing
    # sessions get their newest entry's time.
    (2, (
        "ALTER TABLE sessions ADD COLUMN updated_at BIGINT NOT NULL DEFAULT 0",
        "UPDATE sessions SET updated_at = greatest(created_at, coalesce("
        "(SELECT max(timestamp) FROM entries WHERE entries.session_id = sessions.id), 0))",
    )),
    # The image store (harness.session.images): one row per image, by the SHA-256 of its bytes.
    (3, (
        """CREATE TABLE images (
            ref TEXT COLLATE "C" PRIMARY KEY,
            data BYTEA NOT NULL,
            stored_at BIGINT NOT NULL
        )""",
    )),
    # The bearer tokens of `harness serve` (harness.session.tokens): the secret's hash, never the secret.
    (4, (
        """CREATE TABLE tokens (
            id TEXT COLLATE "C" PRIMARY KEY,
            user_id TEXT COLLATE "C" NOT NULL,
            digest TEXT COLLATE "C" NOT NULL,
            created_at BIGINT NOT NULL,
            revoked_at BIGINT
        )""",
    )),
    # What `harness worker` looks for (open_work): the lanes with a current operation, found
    # through an index that holds only them, and the requests other processes left for owners.
    (5, (
        "CREATE INDEX open_lanes ON record_values (session_id) WHERE namespace = 'harness.lane.state' "
        "AND (value::jsonb ->> 'current_operation_id') IS NOT NULL",
        "CREATE INDEX lane_requests ON record_values (session_id) WHERE namespace = 'harness.lane.request'",
    )),
    # A commit as one statement (`PostgresBackend.commit`): one round trip and, on a connection in
    # autocommit, one transaction, which a refusal rolls back whole.
    #
    # harness_commit_check makes a commit's checks: the shared probe of the session's lock, the
    # session row locked FOR UPDATE, the owner's epoch, then in write order the ids the session
    # already holds and the parents it lacks. `ids` holds the commit's entry and usage ids in
    # write order, `repeated` whether an earlier write of the commit used the id too, and
    # `parents` the parent to look up (NULL when there is none to look up: a usage row, a root
    # entry, a parent inserted earlier in the commit). Each refusal raises its own SQLSTATE
    # (`_REFUSALS`) with the write's index among `ids` (from 0) as its DETAIL. The lookups are
    # LATERAL subqueries with a LIMIT, which the planner cannot turn into joins: they probe the
    # primary keys once per write in the generic plan PL/pgSQL may cache too, where EXISTS
    # became a hash of the whole session.
    #
    # harness_commit runs the checks, moves the session's next seq on by `span` (and sets
    # `updated_at` unless it is NULL), applies the writes in order, write i being `kind[i]` with
    # its fields at index i of the arrays that kind uses (`_write_columns`) and its seq the
    # session's old next seq plus `offset[i]`, notifies `channels` with the session id, and
    # returns the commit's first seq.
    (6, (
        """CREATE FUNCTION harness_commit_check(
            p_session TEXT, p_epoch BIGINT, p_probe_key BIGINT,
            p_ids TEXT[], p_repeated BOOLEAN[], p_parents TEXT[]
        ) RETURNS VOID LANGUAGE plpgsql AS $$
        DECLARE
            stored_epoch BIGINT;
            failing INTEGER;
            id_used BOOLEAN;
        BEGIN
            IF p_probe_key IS NOT NULL AND NOT pg_try_advisory_xact_lock_shared(p_probe_key) THEN
                RAISE EXCEPTION USING ERRCODE = 'JR001',
                    MESSAGE = 'session ' || p_session || ' is owned by another process or harness';
            END IF;
            SELECT owner_epoch INTO stored_epoch FROM sessions WHERE id = p_session FOR UPDATE;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'JR002', MESSAGE = 'no session ' || p_session;
            END IF;
            IF p_epoch IS NOT NULL AND stored_epoch <> p_epoch THEN
                RAISE EXCEPTION USING ERRCODE = 'JR003',
                    MESSAGE = 'session ' || p_session || ' was claimed by another owner';
            END IF;
            SELECT t.i, t.repeated OR used.hit IS NOT NULL INTO failing, id_used
            FROM unnest(p_ids, p_repeated, p_parents) WITH ORDINALITY AS t(id, repeated, parent_id, i)
            LEFT JOIN LATERAL (
                SELECT 1 FROM entries e WHERE e.session_id = p_session AND e.id = t.id
                UNION ALL
                SELECT 1 FROM usage_ledger u WHERE u.session_id = p_session AND u.id = t.id
                LIMIT 1
            ) used(hit) ON true
            LEFT JOIN LATERAL (
                SELECT 1 FROM entries e WHERE e.session_id = p_session AND e.id = t.parent_id LIMIT 1
            ) parent(hit) ON true
            WHERE t.repeated OR used.hit IS NOT NULL OR (t.parent_id IS NOT NULL AND parent.hit IS NULL)
            ORDER BY t.i LIMIT 1;
            IF failing IS NULL THEN
                RETURN;
            ELSIF id_used THEN
                RAISE EXCEPTION USING ERRCODE = 'JR004', DETAIL = (failing - 1)::text,
                    MESSAGE = 'id ' || p_ids[failing] || ' is already used in this session';
            ELSE
                RAISE EXCEPTION USING ERRCODE = 'JR005', DETAIL = (failing - 1)::text,
                    MESSAGE = 'parent ' || p_parents[failing] || ' of entry ' || p_ids[failing] || ' does not exist';
            END IF;
        END
        $$""",
        """CREATE FUNCTION harness_commit(
            p_session TEXT, p_epoch BIGINT, p_probe_key BIGINT,
            p_ids TEXT[], p_repeated BOOLEAN[], p_parents TEXT[],
            p_kind TEXT[], p_offset INTEGER[], p_name TEXT[], p_ref TEXT[], p_type TEXT[], p_custom_type TEXT[],
            p_body TEXT[], p_details TEXT[], p_adjustment BOOLEAN[], p_through BIGINT[],
            p_span BIGINT, p_timestamp BIGINT, p_updated_at BIGINT, p_channels TEXT[]
        ) RETURNS BIGINT LANGUAGE plpgsql AS $$
        DECLARE
            first_seq BIGINT;
        BEGIN
            PERFORM harness_commit_check(p_session, p_epoch, p_probe_key, p_ids, p_repeated, p_parents);
            UPDATE sessions SET next_seq = next_seq + p_span, updated_at = coalesce(p_updated_at, updated_at)
                WHERE id = p_session RETURNING next_seq - p_span INTO first_seq;
            FOR i IN 1 .. cardinality(p_kind) LOOP
                CASE p_kind[i]
                WHEN 'entry' THEN
                    INSERT INTO entries (session_id, id, parent_id, seq, timestamp, type, custom_type, payload)
                    VALUES (p_session, p_name[i], p_ref[i], first_seq + p_offset[i], p_timestamp, p_type[i],
                            p_custom_type[i], p_body[i]);
                WHEN 'usage' THEN
                    INSERT INTO usage_ledger (session_id, id, seq, entry_id, adjustment, usage, details)
                    VALUES (p_session, p_name[i], first_seq + p_offset[i], p_ref[i], p_adjustment[i], p_body[i],
                            p_details[i]);
                WHEN 'set' THEN
                    INSERT INTO record_values (session_id, namespace, key, seq, value)
                    VALUES (p_session, p_name[i], p_ref[i], first_seq + p_offset[i], p_body[i])
                    ON CONFLICT (session_id, namespace, key) DO UPDATE SET seq = excluded.seq, value = excluded.value;
                WHEN 'delete' THEN
                    DELETE FROM record_values WHERE session_id = p_session AND namespace = p_name[i] AND key = p_ref[i];
                WHEN 'append' THEN
                    INSERT INTO list_items (session_id, namespace, key, seq, value)
                    VALUES (p_session, p_name[i], p_ref[i], first_seq + p_offset[i], p_body[i]);
                WHEN 'delete_list' THEN
                    DELETE FROM list_items WHERE session_id = p_session AND namespace = p_name[i] AND key = p_ref[i];
                WHEN 'trim' THEN
                    DELETE FROM list_items WHERE session_id = p_session AND namespace = p_name[i] AND key = p_ref[i]
                        AND seq <= p_through[i];
                END CASE;
            END LOOP;
            PERFORM pg_notify(channel, p_session) FROM unnest(p_channels) AS channel;
            RETURN first_seq;
        END
        $$""",
    )),
)

NOTIFY_PAYLOAD_BYTES = 7_999
"""The longest payload PostgreSQL's NOTIFY takes (its default build), in UTF-8 bytes."""

SPARE_CLAIM_CONNECTIONS = 4
"""Claim connections a backend keeps open after their release, its locks let go of, for its next
claims: opening one starts a PostgreSQL backend process, and a server admitting turns for workers,
like each worker, claimed once per turn (issue 29)."""

LEASE_APPLICATION = "harness-lease"
"""The `application_name` of a claim connection held under a lease (`PostgresBackend.leases`): a
claimant may end such a connection once it has been idle past the lease, and no other."""

_OPEN_WORK = """
SELECT l.session_id, l.key, l.value::jsonb ->> 'current_operation_id', o.value
FROM record_values l
LEFT JOIN record_values o ON o.session_id = l.session_id AND o.namespace = 'harness.op.state'
    AND o.key = l.value::jsonb ->> 'current_operation_id'
WHERE l.namespace = 'harness.lane.state' AND (l.value::jsonb ->> 'current_operation_id') IS NOT NULL
    AND (%(ids)s::text[] IS NULL OR l.session_id = ANY(%(ids)s))
UNION ALL
SELECT r.session_id, r.value::jsonb ->> 'lane', NULL, NULL
FROM record_values r
WHERE r.namespace = 'harness.lane.request' AND (%(ids)s::text[] IS NULL OR r.session_id = ANY(%(ids)s))
"""

# The advisory locks held in this database, by key (a bigint key is classid:objid, objsubid 1),
# and whether every holder is a lease whose connection has been idle past it.
_HELD_LOCKS = """
SELECT (l.classid::bigint << 32) | l.objid::bigint,
       bool_and(a.application_name = %(app)s AND a.state <> 'active'
                AND a.state_change < now() - make_interval(secs => %(lease)s))
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY 1
"""

# Whether a claim holds the advisory lock `classid:objid`: an exclusive lock, where a commit of no
# owner takes a shared one for its transaction.
_LOCK_HELD = """
SELECT EXISTS (SELECT FROM pg_locks l
               WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
                   AND l.classid = %(classid)s AND l.objid = %(objid)s
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
"""

_END_STALE_LEASE = """
SELECT pg_terminate_backend(a.pid)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.classid = %(classid)s AND l.objid = %(objid)s
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND a.application_name = %(app)s AND a.state <> 'active'
    AND a.state_change < now() - make_interval(secs => %(lease)s)
"""

_WALK = """
WITH RECURSIVE path(depth, id, parent_id, seq, timestamp, type, payload) AS (
    SELECT 0, id, parent_id, seq, timestamp, type, payload
    FROM entries WHERE session_id = %(s)s AND id = %(start)s
    UNION ALL
    SELECT path.depth + 1, e.id, e.parent_id, e.seq, e.timestamp, e.type, e.payload
    FROM path JOIN entries e ON e.session_id = %(s)s AND e.id = path.parent_id
    WHERE path.depth + 1 < %(limit)s AND NOT (%(stop)s AND path.type = 'compaction')
)
SELECT id, parent_id, seq, timestamp, type, payload FROM path ORDER BY depth
"""

# The SQLSTATEs of harness_commit_check (schema step 6), a class of their own: the SQL standard
# keeps classes starting 0-4 and A-H, PostgreSQL uses 5x, F0, HV, P0 and XX, and psycopg would
# type an H class as OperationalError, which this module reads as a failing server.
_SESSION_OWNED, _SESSION_NOT_FOUND, _OWNERSHIP_LOST, _ID_USED, _PARENT_MISSING = (
    "JR001", "JR002", "JR003", "JR004", "JR005")
_REFUSALS = frozenset({_SESSION_OWNED, _SESSION_NOT_FOUND, _OWNERSHIP_LOST, _ID_USED, _PARENT_MISSING})

_CHECK = "SELECT harness_commit_check(%s, %s::bigint, %s::bigint, %s::text[], %s::boolean[], %s::text[])"
# The writes' bodies (payloads, values, usage) and usage details go in binary (`%b`): in text an
# array element is escaped one quote at a time, which for JSON was a third of a commit's client
# time. Only the text dumper refuses a NUL before sending, though (in binary the server refuses
# it, after which the checks could no longer be asked first), so a commit whose bodies hold a
# raw NUL, which JSON text never does, is sent in text (`_COMMIT_TEXT`).
_COMMIT, _COMMIT_TEXT = (
    "SELECT harness_commit(%s, %s::bigint, %s::bigint, %s::text[], %s::boolean[], %s::text[], %s::text[], "
    f"%s::integer[], %s::text[], %s::text[], %s::text[], %s::text[], {body}::text[], {body}::text[], "
    "%s::boolean[], %s::bigint[], %s::bigint, %s::bigint, %s::bigint, %s::text[])"
    for body in ("%b", "%s")
)


@dataclass(frozen=True)
class WorkRow:
    """A lane that may have work: its current operation and that operation's state as stored
    (None for a lane named only by a request), and whether its session's lock is held and
    whether every holder is a lease idle past `lease_s`."""

    session_id: str
    lane: str
    operation_id: str | None
    operation_state: str | None
    held: bool
    stale: bool


@dataclass(eq=False)
class PostgresClaim:
    """A claim: `connection` is dedicated to it and holds the advisory lock on `lock_key`.

    `in_use` is held by whatever runs on the connection (a commit, the release, a lease renewal):
    psycopg serializes single statements only, and a statement sent inside a commit's transaction
    block (the crash tests' stop before COMMIT) would join it, or fail it once it is refused."""

    session_id: str
    epoch: int
    connection: Connection
    lock_key: int
    lease: bool = False  # whether the connection is marked as a lease (`LEASE_APPLICATION`)
    in_use: asyncio.Lock = field(default_factory=asyncio.Lock)


class PostgresBackend:
    """Sessions in one PostgreSQL schema, through a small connection pool plus one connection
    per live claim."""

    kind: Literal["postgres"] = "postgres"

    def __init__(self, url: str, pool: AsyncConnectionPool[Connection], schema: str) -> None:
        self.url = url
        self._pool = pool
        self._schema = schema
        self._claims: set[PostgresClaim] = set()
        self._spares: list[tuple[Connection, bool]] = []  # released claim connections, and whether leases
        self._queued: collections.deque[_QueuedRead] = collections.deque()  # reads waiting (`_rows_many`)
        self._drains = max(1, pool.max_size // 2)  # the drain tasks at most; the rest of the pool is for writes
        self._draining = 0
        self._drainers: set[asyncio.Task[None]] = set()
        self._closed = False
        self.leases = False
        """Whether this backend's claims are leases (`LEASE_APPLICATION`): the holder keeps each
        alive with `renew_claims`, and a claimant ends one that went quiet (`end_stale_lease`)."""
        digest = hashlib.blake2b(schema.encode(), digest_size=8).hexdigest()
        self.channel = f"harness_work_{digest}"
        """The LISTEN/NOTIFY channel of this store's work: every release and every posted request
        notifies it with the session id."""
        self.change_channel = f"harness_change_{digest}"
        """The LISTEN/NOTIFY channel of this store's changes: every commit notifies it with the
        session id, inside its transaction (`harness.session.changes`)."""
        self.tagged_channel = f"harness_tagged_{digest}"
        """The LISTEN/NOTIFY channel of the commits that wrote a `tagged` namespace: each notifies
        it too, with `[session id, [namespaces]]` as JSON, inside its transaction."""
        self.tagged: set[str] = set()
        """The namespaces whose writers' commits say so apart (`Store.tag`)."""
        self.images = PostgresImages(self)
        self.tokens = PostgresTokens(self)
        # Test seam for crash tests: awaited inside the commit transaction, before COMMIT.
        self._commit_barrier: Callable[[], Awaitable[None]] | None = None

    @classmethod
    async def open(cls, url: str, context: Context, *, pool_max: int = DEFAULT_POOL_MAX) -> PostgresBackend:
        """Connect to `url` (a libpq URL; its search_path's first schema must exist), apply pending
        schema steps and open a pool of 1 to `pool_max` connections.

        Raises `psycopg.OperationalError` when the database cannot be reached."""
        # A direct connection first: it reports a bad URL or an unreachable server at once, where
        # a pool would retry in the background until its timeout.
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await _migrate_schema(conn)
            row = await (await conn.execute("SELECT current_schema()")).fetchone()
        assert row is not None
        pool = AsyncConnectionPool(
            url, min_size=1, max_size=pool_max, open=False, kwargs={"autocommit": True}
        )
        await pool.open()
        return cls(url, pool, row[0])

    def _lock_key(self, session_id: str) -> int:
        # Advisory locks are database-wide; the schema is part of the key so that stores in
        # different schemas of one database never contend for the same session id.
        digest = hashlib.blake2b(f"{self._schema}\x00{session_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)

    def _lock_ids(self, session_id: str) -> dict[str, int]:
        """The session's lock key as `pg_locks` shows it: `classid` and `objid`, its high and low
        32 bits."""
        unsigned = self._lock_key(session_id) & 0xFFFF_FFFF_FFFF_FFFF
        return {"classid": unsigned >> 32, "objid": unsigned & 0xFFFF_FFFF}

    async def create_session(self, info: SessionInfo, context: Context, writes: Sequence[Write] = ()) -> None:
        """Insert the session row and apply `writes` in one transaction; `InvalidWrite` if the id
        is taken or a write is refused as a commit's would be."""
        sql, params = _commit_statement(info.id, writes, now_ms(), epoch=None, probe_key=None, updated_at=None,
                                        channels=())
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO sessions (id, created_at, parent_session_id, forked_from_entry_id, updated_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                (info.id, info.created_at, info.parent_session_id, info.forked_from_entry_id, info.updated_at),
            )
            if cur.rowcount == 0:
                raise InvalidWrite(f"session {info.id} already exists", session_id=info.id)
            try:
                # One statement for the checks and every write, however many a fork copies.
                await conn.execute(sql, params)
            except psycopg.Error as error:
                refusal = _refusal(error, info.id, writes)
                if refusal is None:
                    raise
                raise refusal from error

    async def get_session(self, session_id: str, context: Context) -> SessionInfo | None:
        rows = await self._rows(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = %s", (session_id,))
        return SessionInfo(*rows[0]) if rows else None

    async def list_sessions(self, context: Context) -> list[SessionInfo]:
        rows = await self._rows(f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY created_at, id", ())
        return [SessionInfo(*r) for r in rows]

    async def delete_session(self, session_id: str, context: Context) -> None:
        """Delete the session's rows in one transaction that holds its advisory lock, so no owner
        (here or in another process) can hold it meanwhile."""
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (self._lock_key(session_id),))
            if not _scalar(await cur.fetchone()):
                raise SessionOwned(f"session {session_id} is owned by another process or harness",
                                   session_id=session_id)
            cur = await conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))
            if cur.rowcount == 0:
                raise SessionNotFound(f"no session {session_id}", session_id=session_id)
            for table in SESSION_TABLES:
                await conn.execute(f"DELETE FROM {table} WHERE session_id = %s", (session_id,))

    async def get_entries(self, session_id: str, ids: Sequence[str], context: Context) -> dict[str, EntryRow]:
        if not ids:
            return {}
        return cast("dict[str, EntryRow]", await self._read(session_id, EntriesRead(tuple(ids)), context))

    async def read_entries(
        self, session_id: str, after_seq: int | None, limit: int, context: Context
    ) -> list[EntryRow]:
        rows = await self._rows(
            "SELECT id, parent_id, seq, timestamp, type, payload FROM entries "
            "WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s",
            (session_id, -1 if after_seq is None else after_seq, limit),
        )
        return [EntryRow(*r) for r in rows]

    async def walk_branch(
        self, session_id: str, start: str, limit: int, stop_at_compaction: bool, context: Context
    ) -> list[EntryRow]:
        params = {"s": session_id, "start": start, "limit": limit, "stop": stop_at_compaction}
        return [EntryRow(*r) for r in await self._rows(_WALK, params)]

    async def get_value(self, session_id: str, namespace: str, key: str, context: Context) -> ValueRow | None:
        return cast("ValueRow | None", await self._read(session_id, ValueRead(namespace, key), context))

    async def scan_values(
        self, session_id: str, namespace: str, key_prefix: str, context: Context
    ) -> list[ValueRow]:
        return cast("list[ValueRow]", await self._read(session_id, ScanRead(namespace, key_prefix), context))

    async def values_across(self, namespace: str, key: str, context: Context) -> dict[str, ValueRow]:
        rows = await self._rows("SELECT session_id, namespace, key, seq, value FROM record_values "
                                "WHERE namespace = %s AND key = %s", (namespace, key))
        return {r[0]: ValueRow(*r[1:]) for r in rows}

    async def read_list(
        self, session_id: str, namespace: str, key: str, after_seq: int | None, limit: int, context: Context
    ) -> list[ValueRow]:
        return cast("list[ValueRow]", await self._read(session_id, ListRead(namespace, key, after_seq, limit), context))

    async def list_bounds(
        self, session_id: str, namespace: str, key: str, context: Context
    ) -> tuple[int, int] | None:
        return cast("tuple[int, int] | None", await self._read(session_id, BoundsRead(namespace, key), context))

    async def read_usage(
        self, session_id: str, after_seq: int | None, limit: int, context: Context
    ) -> list[UsageRowRaw]:
        rows = await self._rows(
            "SELECT id, seq, entry_id, adjustment, usage, details FROM usage_ledger "
            "WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s",
            (session_id, after_seq if after_seq is not None else -1, limit),
        )
        return [UsageRowRaw(*r) for r in rows]

    async def read_many(self, session_id: str, reads: Sequence[Read], context: Context) -> list[ReadAnswer]:
        """One statement (`_read_many_sql`), so one snapshot, for up to `READS_PER_STATEMENT`
        reads; more take a statement per that many, sent together in one pipeline."""
        chunks = [reads[start:start + READS_PER_STATEMENT] for start in range(0, len(reads), READS_PER_STATEMENT)]
        answers: list[ReadAnswer] = []
        for chunk, rows in zip(chunks, await self._rows_many([_read_many_sql(session_id, chunk) for chunk in chunks]),
                               strict=True):
            answers += _answers(chunk, rows)
        return answers

    async def _read(self, session_id: str, read: Read, context: Context) -> ReadAnswer:
        return (await self.read_many(session_id, [read], context))[0]

    async def commit(
        self, session_id: str, writes: Sequence[Write], claim: Claim | None, context: Context
    ) -> CommitResult:
        """Apply `writes` in order as one transaction of one statement and one round trip,
        whatever their number, refused or not (a write holding text PostgreSQL cannot store
        takes a second: the checks alone, whose refusal comes first).

        With `claim`, runs on the claim's own connection: `OwnershipLost` if the claim was
        released, if that connection is gone (its lock died with it; if it died during COMMIT
        itself the outcome is unknown to this process) or the epoch moved on. Without,
        `SessionOwned` while anyone holds a claim. `SessionNotFound` for an unknown session;
        `InvalidWrite` for a duplicate id, a missing parent, or text PostgreSQL cannot hold (NUL,
        lone surrogates) in an id or key."""
        if claim is None:
            async with self._connection() as conn:
                return await self._commit(conn, session_id, writes, None)
        owned = _postgres_claim(claim)
        if owned not in self._claims or owned.session_id != session_id:
            # Released: its connection may be a spare now, or serve another claim.
            raise OwnershipLost(f"session {session_id}: this claim was released", session_id=session_id)
        try:
            async with owned.in_use:
                return await self._commit(owned.connection, session_id, writes, owned)
        except psycopg.Error as error:
            if not owned.connection.closed:
                if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
                    raise driver_error(error) from error
                raise
            raise OwnershipLost(f"session {session_id}: this owner's lock connection is gone",
                                session_id=session_id) from error

    async def _commit(
        self, conn: Connection, session_id: str, writes: Sequence[Write], claim: PostgresClaim | None, *,
        post: bool = False,
    ) -> CommitResult:
        timestamp = now_ms()
        epoch = None if claim is None else claim.epoch
        # A post is made beside an owner by design; any other unowned commit probes the lock,
        # shared, so that unowned commits from several processes do not refuse each other; it
        # still conflicts with an owner's exclusive lock.
        probe_key = self._lock_key(session_id) if claim is None and not post else None
        # Notified inside the transaction, so delivered at its commit: a reader woken by it sees
        # the commit. A post also wakes the workers.
        channels = (self.change_channel, self.channel) if post else (self.change_channel,)
        sql, params = _commit_statement(session_id, writes, timestamp, epoch=epoch, probe_key=probe_key,
                                        updated_at=timestamp, channels=channels)
        tagged = sorted({write.namespace for write in writes if not isinstance(write, InsertEntry | InsertUsage)}
                        & self.tagged) if self.tagged else []
        payload = json.dumps([session_id, tagged], ensure_ascii=False) if tagged else ""
        # In the same statement, so in the same transaction: delivered at its commit. A payload past
        # NOTIFY's limit (a session id of thousands of bytes) is not sent: its readers poll.
        if payload and len(payload.encode()) <= NOTIFY_PAYLOAD_BYTES:
            sql, params = sql + ", pg_notify(%s, %s)", (*params, self.tagged_channel, payload)
        try:
            if self._commit_barrier is None:
                # On a connection in autocommit one statement is one transaction: no BEGIN, no
                # COMMIT, and a refusal leaves the connection idle.
                first = _scalar(await (await conn.execute(sql, params)).fetchone())
            else:
                # The crash tests' stop before COMMIT needs a transaction block to stop in.
                async with conn.transaction():
                    first = _scalar(await (await conn.execute(sql, params)).fetchone())
                    await self._commit_barrier()
        except (psycopg.Error, UnicodeEncodeError) as error:
            refusal = _refusal(error, session_id, writes) if isinstance(error, psycopg.Error) else None
            if refusal is not None:
                raise refusal from error
            if not isinstance(error, psycopg.DataError | UnicodeEncodeError):
                raise
            if isinstance(error, UnicodeEncodeError) or error.sqlstate is None:
                # psycopg could not send a write, so the server made no check. The checks come
                # first in a commit: a refusal of theirs is the commit's error.
                refusal = await _check_alone(conn, session_id, writes, epoch, probe_key)
                if refusal is not None:
                    raise refusal from error
            raise InvalidWrite(f"a write holds text PostgreSQL cannot store: {error}",
                               session_id=session_id) from error
        return CommitResult(write_seqs(first, writes), timestamp)

    async def claim(self, session_id: str, context: Context) -> Claim:
        """Take the session's advisory lock on a dedicated connection (a spare one a release kept,
        else a new one: `SPARE_CLAIM_CONNECTIONS`) and bump its epoch.

        `SessionOwned` if another claim (here or in another process) holds it, or an unowned
        commit is in flight; `SessionNotFound` for an unknown session; `StoreUnavailable` when
        the claim connection cannot be opened or breaks (too many clients, a restart), holding
        nothing."""
        key, lease = self._lock_key(session_id), self.leases
        while True:
            if self._closed:
                raise StoreClosed("the PostgreSQL store is closed")
            spare = await self._spare_connection(lease)
            try:
                conn = spare or await psycopg.AsyncConnection.connect(
                    make_conninfo(self.url, application_name=LEASE_APPLICATION) if lease else self.url,
                    autocommit=True)
                try:
                    if not _scalar(await (await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))).fetchone()):
                        raise SessionOwned(f"session {session_id} is owned by another process or harness",
                                           session_id=session_id)
                    cur = await conn.execute(
                        "UPDATE sessions SET owner_epoch = owner_epoch + 1 WHERE id = %s RETURNING owner_epoch",
                        (session_id,),
                    )
                    row = await cur.fetchone()
                    if row is None:
                        raise SessionNotFound(f"no session {session_id}", session_id=session_id)
                except HarnessError:
                    await self._keep_spare(conn, lease)
                    raise
                except BaseException:
                    await conn.close()
                    raise
            except psycopg.OperationalError as error:
                if spare is not None:
                    continue  # a spare that died meanwhile (a restart, a cut): the next, or a new one
                # Typed, as every other store failure is: a claimant (a worker) backs off from it,
                # where a bare driver error would end its drive task unexplained.
                raise StoreUnavailable(f"cannot claim session {session_id}: {error}", session_id=session_id,
                                       sqlstate=error.sqlstate) from error
            if self._closed:  # closed while this claim was made: nothing may be left holding
                await conn.close()
                raise StoreClosed("the PostgreSQL store is closed")
            claim = PostgresClaim(session_id, row[0], conn, key, lease)
            self._claims.add(claim)
            return claim

    async def _spare_connection(self, lease: bool) -> Connection | None:
        while self._spares:
            conn, spare_lease = self._spares.pop()
            if spare_lease == lease and not conn.closed:
                return conn
            await conn.close()  # marked otherwise (`leases` changed since): not for this claim
        return None

    async def _keep_spare(self, conn: Connection, lease: bool, *, unlocked: bool = False) -> None:
        """Keep a claim connection for the next claim, its locks let go of (unless `unlocked`
        already), or close it."""
        try:
            if (self._closed or conn.closed or len(self._spares) >= SPARE_CLAIM_CONNECTIONS
                    or conn.pgconn.transaction_status != TransactionStatus.IDLE):
                await conn.close()
                return
            if not unlocked:
                await conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            await conn.close()
            return
        self._spares.append((conn, lease))

    def connection_use(self) -> ConnectionUse:
        """The claims held (a connection each) and the read pool's use, from psycopg_pool's stats."""
        stats = self._pool.get_stats()
        return ConnectionUse(claims=len(self._claims), pooled=stats.get("pool_size", 0),
                             idle=stats.get("pool_available", 0), waiting=stats.get("requests_waiting", 0))

    async def release(self, claim: Claim, context: Context) -> None:
        """Unlock the claim's connection and keep it as a spare (`SPARE_CLAIM_CONNECTIONS`) or
        close it; idempotent, and quiet if it already died."""
        owned = _postgres_claim(claim)
        if owned not in self._claims:
            return  # released already: its connection may serve another claim now
        self._claims.discard(owned)
        # Unlock before closing: the server frees a closed connection's locks only once its
        # backend has exited, and a claimant right after this call must find the session free.
        # A connection that already died took its lock with it, so its error is of no interest.
        # The notification tells every listening worker that the session may hold work now.
        # Under `in_use`: closing a connection a renewal is still reading from would leave that
        # socket registered with the event loop, and a connection that reuses its descriptor
        # number would then never be woken.
        async with owned.in_use:
            unlocked = False
            with contextlib.suppress(psycopg.Error):
                if not owned.connection.closed:
                    await owned.connection.execute("SELECT pg_advisory_unlock_all(), pg_notify(%s, %s)",
                                                   (self.channel, owned.session_id))
                    unlocked = True
            if unlocked:
                await self._keep_spare(owned.connection, owned.lease, unlocked=True)
            else:
                await owned.connection.close()

    async def held(self, session_id: str, context: Context) -> bool:
        """Whether a claim holds the session, in this process or another: its advisory lock as
        `pg_locks` shows it, read on a pooled connection, which takes no lock (one read, made once
        more on a lost connection, as `_rows` does). A claim whose process died holds it until the
        server notices the connection gone."""
        [(held,)] = await self._rows(_LOCK_HELD, self._lock_ids(session_id))
        return bool(held)

    async def post(self, session_id: str, writes: Sequence[SetValue], context: Context) -> CommitResult:
        """Commit `writes` beside any owner (no lock probe; the session row's lock orders it with
        the owner's commits) and notify `channel` with the session id in the same transaction."""
        async with self._connection() as conn:
            return await self._commit(conn, session_id, writes, None, post=True)

    async def open_work(self, session_ids: Sequence[str] | None, lease_s: float,
                        context: Context) -> list[WorkRow]:
        """Every lane with a current operation or a posted request, in the sessions named (None:
        all), with its session's lock as `pg_locks` shows it now. Two reads sent together, the
        locks read after the lanes (one pipeline, `_rows_many`), made once more on a lost
        connection: a server's sweep after a cut answers."""
        rows, locks = await self._rows_many([
            (_OPEN_WORK, {"ids": None if session_ids is None else list(session_ids)}),
            (_HELD_LOCKS, {"app": LEASE_APPLICATION, "lease": lease_s})])
        held: dict[int, bool] = {key: stale for key, stale in locks}
        work = []
        for session_id, lane, operation_id, state in rows:
            key = self._lock_key(session_id)
            work.append(WorkRow(session_id, lane, operation_id, state, key in held, held.get(key, False)))
        return work

    async def end_stale_lease(self, session_id: str, lease_s: float, context: Context) -> bool:
        """End the connection holding the session's lock if it is a lease idle for more than
        `lease_s` seconds (its process stopped or hangs); True if one was ended. Its lock goes as
        that backend exits, and its owner can commit nothing more: its connection is gone, and
        the next claim bumps the epoch."""
        params = {**self._lock_ids(session_id), "app": LEASE_APPLICATION, "lease": lease_s}
        async with self._connection() as conn:
            ended = await (await conn.execute(_END_STALE_LEASE, params)).fetchall()
        return any(row[0] for row in ended)

    async def renew_claims(self, context: Context) -> None:
        """Keep every lease of this backend alive: a statement on each claim connection, which
        resets the idle time a claimant measures. A connection in use is skipped: whatever runs
        on it resets that time itself, and waiting for it would delay the other renewals. A
        connection that died is left to its owner's next commit (`OwnershipLost`)."""
        for claim in list(self._claims):
            if claim.in_use.locked():
                continue
            async with claim.in_use:
                with contextlib.suppress(psycopg.Error):
                    if not claim.connection.closed:
                        await claim.connection.execute("SELECT 1")

    def listen(self) -> AsyncIterator[str]:
        """The session ids notified on `channel` (releases, posted requests), from a dedicated
        connection, until the caller stops iterating; `StoreConnectionLost` when the connection
        drops (notifications sent meanwhile are lost: the caller polls to cover them)."""
        return self._listen(self.channel, announce=False)

    async def listen_posts(self) -> AsyncIterator[Change]:
        """The session ids notified on `channel` (releases and posted requests) as `Change`s,
        first `("", None)` once the LISTEN runs, as `listen_changes` does."""
        async for session_id in self._listen(self.channel, announce=True):
            yield session_id, None

    async def listen_changes(self) -> AsyncIterator[Change]:
        """Every commit's `Change`: `(session id, None)` on `change_channel`, and for a commit that
        wrote a `tagged` namespace `(session id, namespaces)` on `tagged_channel` too; first `("",
        None)` once the LISTEN runs: what was committed before it is to be read, not waited for."""
        async for channel, payload in self._listen_on((self.change_channel, self.tagged_channel), announce=True):
            if channel == self.tagged_channel:
                with contextlib.suppress(ValueError, TypeError):  # another version's payload: not ours to read
                    session_id, namespaces = json.loads(payload)
                    yield str(session_id), tuple(str(namespace) for namespace in namespaces)
            else:
                yield payload, None

    async def _listen(self, channel: str, *, announce: bool) -> AsyncIterator[str]:
        async for _, payload in self._listen_on((channel,), announce=announce):
            yield payload

    async def _listen_on(self, channels: Sequence[str], *, announce: bool) -> AsyncIterator[tuple[str, str]]:
        try:
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                for channel in channels:
                    await conn.execute(f'LISTEN "{channel}"')
                if announce:
                    yield "", ""
                async for notify in conn.notifies():
                    yield notify.channel, notify.payload
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            raise driver_error(error) from error

    async def run_data_migration(self, migration: DataMigration, context: Context) -> bool:
        """Unless recorded, rewrite every entry payload `migration` changes, and every copy of
        one a record holds (`COPY_NAMESPACES`), and record it, in one transaction that holds off
        writers meanwhile. True when it ran now; a migration that raises rolls everything back."""
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
            cur = await conn.execute("SELECT 1 FROM data_migrations WHERE name = %s", (migration.name,))
            if await cur.fetchone():
                return False
            # Writers wait, so nothing slips past the scans unmigrated. Every writer (a commit, a
            # post, a session's creation or deletion) locks or writes its session's row before it
            # touches another table: EXCLUSIVE on `sessions` first waits for those under way and
            # holds off the rest, where taking the two SHARE locks alone could deadlock with a
            # commit that set a value and then inserts an entry.
            await conn.execute("LOCK TABLE sessions IN EXCLUSIVE MODE")
            await conn.execute("LOCK TABLE entries, record_values IN SHARE MODE")
            changed: list[tuple[str, str, str]] = []
            async with conn.cursor(name="harness_data_migration") as rows:
                await rows.execute("SELECT session_id, id, payload FROM entries")
                async for session_id, entry_id, payload in rows:
                    new_payload = migration.apply(entry_id, payload)
                    if new_payload is not None:
                        changed.append((new_payload, session_id, entry_id))
            copies: list[tuple[str, str, str, str]] = []
            async with conn.cursor(name="harness_data_migration_copies") as rows:
                await rows.execute("SELECT session_id, namespace, key, value FROM record_values "
                                   "WHERE namespace = ANY(%s)", (list(COPY_NAMESPACES),))
                async for session_id, namespace, key, value in rows:
                    new_value = migration.apply_to_value(namespace, key, value)
                    if new_value is not None:
                        copies.append((new_value, session_id, namespace, key))
            async with conn.cursor() as update:
                await update.executemany(
                    "UPDATE entries SET payload = %s WHERE session_id = %s AND id = %s", changed
                )
                await update.executemany(
                    "UPDATE record_values SET value = %s WHERE session_id = %s AND namespace = %s AND key = %s",
                    copies,
                )
            await conn.execute("INSERT INTO data_migrations (name, applied_at) VALUES (%s, %s)",
                               (migration.name, now_ms()))
        return True

    async def _rows(self, sql: str, params: Sequence[Any] | dict[str, Any]) -> list[TupleRow]:
        """The rows of one read (`_rows_many`)."""
        return (await self._rows_many([(sql, params)]))[0]

    async def _rows_many(self, statements: Sequence[_Statement]) -> _Rows:
        """The rows of each read, in order. Reads wait in one queue, and a few drain tasks
        (`_drain`) each take every read waiting and make them together, in a pipeline on one
        pooled connection: one round trip and one checkout from the pool for however many reads
        came meanwhile, where each read checking out its own connection made the pool's lock a
        convoy under load (issue 29: 100 ms p50 to get a connection, at 500 reads a second). A
        caller cancelled meanwhile gets `CancelledError` at once and its reads are dropped or
        finish unread; the connection goes back to the pool either way (cancelled mid-query,
        psycopg would close it). Reads that find their connection lost are made once more, on
        a connection the pool checked: a read changes nothing, so after a server restart or a
        cut the next call answers."""
        if self._closed:
            raise StoreClosed("the PostgreSQL store is closed")
        loop = asyncio.get_running_loop()
        queued = _QueuedRead(statements, loop.create_future())
        self._queued.append(queued)
        if self._draining < self._drains:
            self._draining += 1
            task = loop.create_task(self._drain())
            self._drainers.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self._drainers.discard)
        return await queued.rows

    async def _drain(self) -> None:
        try:
            while self._queued:
                group: list[_QueuedRead] = []
                size = 0
                while self._queued and size < PIPELINE_STATEMENTS:
                    queued = self._queued.popleft()
                    if not queued.rows.done():  # its caller was cancelled: nothing to read
                        group.append(queued)
                        size += len(queued.statements)
                if group:
                    await self._read_group(group)
        finally:
            self._draining -= 1

    async def _read_group(self, group: list[_QueuedRead]) -> None:
        statements = [statement for queued in group for statement in queued.statements]
        try:
            try:
                rows = await self._pipelined(statements)
            except StoreConnectionLost:
                rows = await self._pipelined(statements)
        except Exception as error:
            if len(group) > 1 and not isinstance(error, StoreConnectionLost | StoreClosed):
                # A statement failed (a typed refusal too: a timeout, a limit), and a pipeline
                # aborts the ones after it: each caller's reads again on their own, so that only
                # the failing one sees the error.
                for queued in group:
                    await self._read_group([queued])
                return
            for queued in group:
                if not queued.rows.done():
                    queued.rows.set_exception(error)
            return
        except BaseException:
            for queued in group:
                if not queued.rows.done():
                    queued.rows.set_exception(StoreClosed("the PostgreSQL store stopped reading"))
            raise
        start = 0
        for queued in group:
            end = start + len(queued.statements)
            if not queued.rows.done():
                queued.rows.set_result(rows[start:end])
            start = end

    async def _pipelined(self, statements: Sequence[_Statement]) -> _Rows:
        async with self._connection() as conn:
            if len(statements) == 1:
                sql, params = statements[0]
                return [await (await conn.execute(sql, params)).fetchall()]
            async with conn.pipeline():
                cursors = [await conn.execute(sql, params) for sql, params in statements]
            return [await cursor.fetchall() for cursor in cursors]

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        """A pooled connection. A broken one makes the pool check every idle connection before
        the error is raised, so after a server restart the next call gets a live connection."""
        if self._closed:
            raise StoreClosed("the PostgreSQL store is closed")
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            typed = driver_error(error)
            if isinstance(typed, StoreConnectionLost) and not self._closed:
                await self._pool.check()
            raise typed from error

    async def close(self) -> None:
        """Close the pool and every claim connection still open (their locks go with them);
        idempotent."""
        self._closed = True
        claims, self._claims = self._claims, set()
        for claim in claims:
            await claim.connection.close()
        spares, self._spares = self._spares, []
        for conn, _ in spares:
            await conn.close()
        await self._pool.close()


class PostgresImages:
    """Images in the store's `images` table, shared by every process on the database."""

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend

    async def put(self, data: bytes, context: Context) -> str:
        ref = check_image(data)
        async with self._backend._connection() as conn:
            await conn.execute(
                "INSERT INTO images (ref, data, stored_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (ref) DO UPDATE SET stored_at = excluded.stored_at",
                (ref, bytes(data), now_ms()),
            )
        return ref

    async def get(self, ref: str, context: Context) -> StoredImage | None:
        if not is_image_ref(ref):
            return None
        async with self._backend._connection() as conn:
            row = await (await conn.execute("SELECT data FROM images WHERE ref = %s", (ref,))).fetchone()
        return stored_image(ref, bytes(row[0])) if row is not None else None

    async def stored(self, context: Context) -> dict[str, int]:
        async with self._backend._connection() as conn:
            rows = await (await conn.execute("SELECT ref, stored_at FROM images")).fetchall()
        return {ref: stored_at for ref, stored_at in rows}

    async def delete(self, ref: str, stored_by: int, context: Context) -> bool:
        async with self._backend._connection() as conn:
            cur = await conn.execute("DELETE FROM images WHERE ref = %s AND stored_at <= %s", (ref, stored_by))
        return cur.rowcount > 0


_TOKEN_SQL = token_sql("%s")


class PostgresTokens:
    """Token rows in the store's `tokens` table: a revocation is seen by every process at once."""

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend

    async def insert(self, row: TokenRow, context: Context) -> None:
        info = row.info
        async with self._backend._connection() as conn:
            await conn.execute(_TOKEN_SQL.insert, (info.id, info.user, row.digest, info.created_at))

    async def get(self, token_id: str, context: Context) -> TokenRow | None:
        async with self._backend._connection() as conn:
            return token_row(await (await conn.execute(_TOKEN_SQL.get, (token_id,))).fetchone())

    async def list(self, context: Context) -> list[TokenInfo]:
        async with self._backend._connection() as conn:
            rows = await (await conn.execute(_TOKEN_SQL.list)).fetchall()
        return [TokenInfo(*row) for row in rows]

    async def revoke(self, token_id: str, revoked_at: int, context: Context) -> TokenInfo | None:
        async with self._backend._connection() as conn:
            found = await (await conn.execute(_TOKEN_SQL.revoke, (revoked_at, token_id))).fetchone()
        return TokenInfo(*found) if found is not None else None


def driver_error(error: psycopg.OperationalError | psycopg.InterfaceError) -> HarnessError:
    """The typed error for a failing server or connection: `StoreFull` (out of disk),
    `StoreConnectionLost` (a terminated backend, a restart, a broken pipe) or `StoreUnavailable`."""
    if isinstance(error, psycopg.errors.DiskFull):
        return StoreFull(f"the PostgreSQL server is out of space: {error}")
    if isinstance(error, psycopg.errors.ConnectionException | psycopg.InterfaceError | psycopg.errors.AdminShutdown
                  | psycopg.errors.CrashShutdown) or error.sqlstate is None:
        # No SQLSTATE: libpq lost the connection (closed, reset, "cannot exit pipeline mode").
        return StoreConnectionLost(f"the connection to PostgreSQL was lost: {error}; a commit in flight may "
                                   "or may not have been applied (read the journal to learn which)",
                                   outcome="unknown")
    return StoreUnavailable(f"PostgreSQL cannot serve the call: {error}", sqlstate=error.sqlstate)


_Rows = list[list[TupleRow]]
"""The rows of each of several reads (`PostgresBackend._rows_many`)."""

_Statement = tuple[str, Sequence[Any] | dict[str, Any]]
"""One read's SQL and its parameters."""

READS_PER_STATEMENT = 1_000
"""The reads of a batch one statement makes at most (`PostgresBackend.read_many`): each takes up to
six parameters, and a statement takes at most 65,535."""

PIPELINE_STATEMENTS = 256
"""The reads a drain sends in one pipeline at most (`PostgresBackend._rows_many`)."""


@dataclass(eq=False)
class _QueuedRead:
    statements: Sequence[_Statement]
    rows: asyncio.Future[_Rows]

# Every read of a batch selects the same columns, so a batch is one statement (`_read_many_sql`):
# the read's index, then two texts, two numbers and two texts, NULL where a kind has none.
_VALUES = "SELECT %s, namespace, key, seq, NULL::bigint, value, NULL::text FROM "


def _read_branch(index: int, session_id: str, read: Read) -> tuple[str, Sequence[Any]]:
    """The SQL of one read of a batch, tagged with its index, and its parameters."""
    if isinstance(read, ValueRead):
        return (_VALUES + "record_values WHERE session_id = %s AND namespace = %s AND key = %s",
                (index, session_id, read.namespace, read.key))
    if isinstance(read, ScanRead):
        # starts_with, not LIKE: `%` and `_` in a prefix are literal characters.
        return (_VALUES + "record_values WHERE session_id = %s AND namespace = %s AND starts_with(key, %s)",
                (index, session_id, read.namespace, read.key_prefix))
    if isinstance(read, ListRead):
        return (_VALUES + "list_items WHERE session_id = %s AND namespace = %s AND key = %s AND seq > %s "
                "ORDER BY seq LIMIT %s",
                (index, session_id, read.namespace, read.key, -1 if read.after_seq is None else read.after_seq,
                 read.limit))
    if isinstance(read, BoundsRead):
        return ("SELECT %s, NULL, NULL, min(seq), max(seq), NULL, NULL FROM list_items "
                "WHERE session_id = %s AND namespace = %s AND key = %s", (index, session_id, read.namespace, read.key))
    return ("SELECT %s, id, parent_id, seq, timestamp, type, payload FROM entries WHERE session_id = %s "
            "AND id = ANY(%s)", (index, session_id, list(dict.fromkeys(read.ids))))


def _read_many_sql(session_id: str, reads: Sequence[Read]) -> tuple[str, list[Any]]:
    """One statement for every read of a batch (one snapshot, one round trip), each read's rows
    tagged with its index (`_answers`)."""
    branches: list[str] = []
    params: list[Any] = []
    for index, read in enumerate(reads):
        sql, read_params = _read_branch(index, session_id, read)
        branches.append(f"({sql})")
        params.extend(read_params)
    return " UNION ALL ".join(branches), params


def _answers(reads: Sequence[Read], rows: list[TupleRow]) -> list[ReadAnswer]:
    """Each read's answer, from the tagged rows of `_read_many_sql`'s statement."""
    tagged: list[list[TupleRow]] = [[] for _ in reads]
    for row in rows:
        tagged[row[0]].append(row)
    answers: list[ReadAnswer] = []
    for read, found in zip(reads, tagged, strict=True):
        if isinstance(read, ValueRead):
            answers.append(ValueRow(found[0][1], found[0][2], found[0][3], found[0][5]) if found else None)
        elif isinstance(read, ScanRead | ListRead):
            values = [ValueRow(r[1], r[2], r[3], r[5]) for r in found]
            answers.append(sorted(values, key=lambda v: v.key if isinstance(read, ScanRead) else v.seq))
        elif isinstance(read, BoundsRead):
            answers.append(None if not found or found[0][3] is None else (found[0][3], found[0][4]))
        else:
            answers.append({r[1]: EntryRow(*r[1:]) for r in found})
    return answers


async def _migrate_schema(conn: Connection) -> None:
    async with conn.transaction():
        # Two processes opening a fresh database at once: the second waits, then sees the steps.
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, "
                           "applied_at BIGINT NOT NULL)")
        cur = await conn.execute("SELECT coalesce(max(version), 0) FROM schema_version")
        current = _scalar(await cur.fetchone())
        for version, statements in SCHEMA:
            if version > current:
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (%s, %s)",
                                   (version, now_ms()))


def _postgres_claim(claim: Claim) -> PostgresClaim:
    if not isinstance(claim, PostgresClaim):
        raise TypeError(f"a PostgreSQL store cannot use a {type(claim).__name__}")
    return claim


def _scalar(row: TupleRow | None) -> Any:
    assert row is not None, "a one-row query returned no row"
    return row[0]


_SEQ_CONSTRAINTS = ("entries_by_seq", "usage_by_seq", "list_items_pkey")
"""The unique keys a write's seq is part of (the schema's names)."""


def _refusal(error: psycopg.Error, session_id: str, writes: Sequence[Write]) -> HarnessError | None:
    """The typed error for a refusal of harness_commit_check, None for any other error."""
    state = error.sqlstate
    if state == _SESSION_OWNED:
        return SessionOwned(f"session {session_id} is owned by another process or harness", session_id=session_id)
    if state == _SESSION_NOT_FOUND:
        return SessionNotFound(f"no session {session_id}", session_id=session_id)
    if state == _OWNERSHIP_LOST:
        return OwnershipLost(f"session {session_id} was claimed by another owner", session_id=session_id)
    if isinstance(error, psycopg.errors.UniqueViolation) and error.diag.constraint_name in _SEQ_CONSTRAINTS:
        # The seq is the last column of each of these keys: "Key (..., seq)=(..., 7) already exists."
        held = re.search(r"(\d+)\) already exists\.?$", error.diag.message_detail or "")
        if held is not None:
            return seq_already_held(session_id, int(held.group(1)))
    if state not in (_ID_USED, _PARENT_MISSING):
        return None
    inserts = [w for w in writes if isinstance(w, InsertEntry | InsertUsage)]
    write = inserts[int(error.diag.message_detail or "")]
    if state == _ID_USED or not isinstance(write, InsertEntry):
        return InvalidWrite(f"id {write.id} is already used in this session", id=write.id)
    return InvalidWrite(f"parent {write.parent_id} of entry {write.id} does not exist",
                        id=write.id, parent_id=write.parent_id)


async def _check_alone(
    conn: Connection, session_id: str, writes: Sequence[Write], epoch: int | None, probe_key: int | None
) -> HarnessError | None:
    """The refusal harness_commit_check makes of `writes` on its own (`_CHECK`: it writes
    nothing), or None when it makes none or cannot be sent either (an id PostgreSQL cannot hold)."""
    try:
        await conn.execute(_CHECK, _check_params(session_id, writes, epoch, probe_key))
    except psycopg.Error as error:
        return _refusal(error, session_id, writes)
    except UnicodeEncodeError:
        return None
    return None


def _check_params(
    session_id: str, writes: Sequence[Write], epoch: int | None, probe_key: int | None
) -> tuple[Any, ...]:
    """The parameters of harness_commit_check for `writes` (`_CHECK`), with `epoch`, the owner's,
    or None, and `probe_key`, the lock to probe, or None, the arrays as literals (`_array_literal`).
    The checks within the commit are made here: whether an earlier write used the id, whether the
    parent was inserted earlier (then the server need not look it up)."""
    ids: list[str] = []
    repeated: list[bool] = []
    parents: list[str | None] = []
    used: set[str] = set()
    entries: set[str] = set()
    for write in writes:
        if isinstance(write, InsertEntry | InsertUsage):
            ids.append(write.id)
            repeated.append(write.id in used)
            used.add(write.id)
        if isinstance(write, InsertEntry):
            parents.append(None if write.parent_id is None or write.parent_id in entries else write.parent_id)
            entries.add(write.id)
        elif isinstance(write, InsertUsage):
            parents.append(None)
    return session_id, epoch, probe_key, _array_literal(ids), _array_literal(repeated), _array_literal(parents)


def _commit_statement(
    session_id: str, writes: Sequence[Write], timestamp: int, *, epoch: int | None, probe_key: int | None,
    updated_at: int | None, channels: Sequence[str],
) -> tuple[str, tuple[Any, ...]]:
    """The harness_commit statement for `writes` (`_COMMIT`, or `_COMMIT_TEXT` when a body holds a
    NUL) and its parameters: the checks' (`_check_params`), the writes as columns
    (`_write_columns`), the seqs they take, `timestamp` for entries, `updated_at` for the session
    row (None: left as it is) and the `channels` to notify."""
    columns, span = _write_columns(writes)
    bodies = (*columns[6], *columns[7])
    sql = _COMMIT_TEXT if any(text is not None and "\x00" in text for text in bodies) else _COMMIT
    before, after = ([_array_literal(column) for column in part] for part in (columns[:6], columns[8:]))
    return sql, (*_check_params(session_id, writes, epoch, probe_key), *before, columns[6], columns[7], *after,
                 span, timestamp, updated_at, _array_literal(channels))


def _array_literal(values: Sequence[str | int | bool | None]) -> str:
    """`values` as a PostgreSQL array literal for a `%s::type[]` parameter: NULL, `t`/`f`, an
    integer, or text quoted with its quotes and backslashes escaped (identifiers hold no NUL).
    psycopg dumps a list one element at a time in Python, about 80 us a commit for a commit's
    fourteen small arrays; its bodies stay lists, sent in binary (`_COMMIT`)."""
    return "{" + ",".join(
        "NULL" if value is None
        else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' if isinstance(value, str)
        else ("t" if value else "f") if isinstance(value, bool)
        else str(value)
        for value in values
    ) + "}"


def _write_columns(writes: Sequence[Write]) -> tuple[tuple[list[Any], ...], int]:
    """`writes` as the arrays harness_commit reads, one element per write (None where its kind has
    no such field): kind, offset of its seq from the commit's first, name (an entry's or usage
    row's id, a record's namespace), ref (an entry's parent, a usage row's entry, a record's key),
    type, custom_type, body (payload, usage or value), details, adjustment, through (a trim's
    last seq); and the number of seqs the writes take."""
    columns: tuple[list[Any], ...] = tuple([] for _ in range(10))

    def add(kind: str, offset: int, name: str, ref: str | None, body: str | None = None, *,
            type_: str | None = None, custom_type: str | None = None, details: str | None = None,
            adjustment: bool | None = None, through: int | None = None) -> None:
        for column, value in zip(columns, (kind, offset, name, ref, type_, custom_type, body, details,
                                           adjustment, through), strict=True):
            column.append(value)

    # Each write's seq counted from the commit's first: the same numbering every backend uses.
    offsets = write_seqs(0, writes)
    for offset, write in zip(offsets, writes, strict=True):
        match write:
            case InsertEntry():
                # custom_type is a lookup copy of what the payload holds and is never read back;
                # text cannot hold NUL, so the copy gets U+FFFD there while the payload keeps it.
                custom_type = write.custom_type.replace("\x00", "\ufffd") if write.custom_type is not None else None
                add("entry", offset, write.id, write.parent_id, write.payload, type_=write.type,
                    custom_type=custom_type)
            case InsertUsage():
                add("usage", offset, write.id, write.entry_id, write.usage, details=write.details,
                    adjustment=write.adjustment)
            case SetValue():
                add("set", offset, write.namespace, write.key, write.value)
            case DeleteValue():
                add("delete", offset, write.namespace, write.key)
            case AppendList():
                add("append", offset, write.namespace, write.key, write.value)
            case DeleteList():
                add("delete_list", offset, write.namespace, write.key)
            case TrimList():
                add("trim", offset, write.namespace, write.key, through=write.through_seq)
    return columns, offsets[-1] + 1 if offsets else 0
