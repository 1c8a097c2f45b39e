"""The SQLite backend: the embedded default. One file, WAL, `synchronous=FULL` unless configured.

Every call is one hop to the database's own thread, a whole commit included. Ownership between
processes is an `flock` on a file beside the database (released by the OS when its holder dies)
plus the session's epoch, which the claimant bumps and every owner commit checks.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from harness.context import Context
from harness.messages import now_ms
from harness.session.backend import (
    AppendList,
    Claim,
    CommitResult,
    DeleteList,
    DeleteValue,
    EntryRow,
    InsertEntry,
    InsertUsage,
    SessionInfo,
    SetValue,
    UsageRowRaw,
    ValueRow,
    Write,
)
from harness.session.errors import (
    InvalidWrite,
    OwnershipLost,
    SessionNotFound,
    SessionOwned,
    StorageCorruption,
    StoreClosed,
)
from harness.session.migrations import DataMigration

T = TypeVar("T")

# Ordered schema steps; a database records the highest version it has applied. Never edit a
# released step: add a new one.
SCHEMA: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, (
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            created_at INTEGER NOT NULL,
            parent_session_id TEXT,
            forked_from_entry_id TEXT,
            next_seq INTEGER NOT NULL DEFAULT 1,
            owner_epoch INTEGER NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE entries (
            session_id TEXT NOT NULL,
            id TEXT NOT NULL,
            parent_id TEXT,
            seq INTEGER NOT NULL,
            timestamp INTEGER NOT NULL,
            type TEXT NOT NULL,
            custom_type TEXT,
            payload TEXT NOT NULL,
            PRIMARY KEY (session_id, id)
        )""",
        "CREATE UNIQUE INDEX entries_by_seq ON entries (session_id, seq)",
        """CREATE TABLE record_values (
            session_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            key TEXT NOT NULL,
            seq INTEGER NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (session_id, namespace, key)
        )""",
        """CREATE TABLE list_items (
            session_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            key TEXT NOT NULL,
            seq INTEGER NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (session_id, namespace, key, seq)
        )""",
        """CREATE TABLE usage_ledger (
            session_id TEXT NOT NULL,
            id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            entry_id TEXT,
            adjustment INTEGER NOT NULL,
            usage TEXT NOT NULL,
            details TEXT,
            PRIMARY KEY (session_id, id)
        )""",
        "CREATE UNIQUE INDEX usage_by_seq ON usage_ledger (session_id, seq)",
        "CREATE TABLE data_migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )),
    # When a session last committed, for listings and "continue the last session"; existing
    # sessions get their newest entry's time.
    (2, (
        "ALTER TABLE sessions ADD COLUMN updated_at INTEGER NOT NULL DEFAULT 0",
        "UPDATE sessions SET updated_at = max(created_at, coalesce("
        "(SELECT max(timestamp) FROM entries WHERE entries.session_id = sessions.id), 0))",
    )),
)

_SESSION_TABLES = ("entries", "record_values", "list_items", "usage_ledger")
"""Every table that holds a session's rows besides `sessions` itself."""

_SESSION_COLUMNS = "id, created_at, parent_session_id, forked_from_entry_id, updated_at"
# Payload columns are read as bytes and decoded here: sqlite3 would raise an untyped
# OperationalError on bytes that are not UTF-8, naming neither the entry nor the record.
_ENTRY_COLUMNS = "id, parent_id, seq, timestamp, type, CAST(payload AS BLOB)"
_VALUE_COLUMNS = "namespace, key, seq, CAST(value AS BLOB)"

_WALK = """
WITH RECURSIVE path(depth, id, parent_id, seq, timestamp, type, payload) AS (
    SELECT 0, id, parent_id, seq, timestamp, type, payload FROM entries WHERE session_id = :s AND id = :start
    UNION ALL
    SELECT path.depth + 1, e.id, e.parent_id, e.seq, e.timestamp, e.type, e.payload
    FROM path JOIN entries e ON e.session_id = :s AND e.id = path.parent_id
    WHERE path.depth + 1 < :limit AND NOT (:stop AND path.type = 'compaction')
)
SELECT id, parent_id, seq, timestamp, type, CAST(payload AS BLOB) FROM path ORDER BY depth
"""


@dataclass(eq=False)
class SqliteClaim:
    session_id: str
    epoch: int
    lock_fd: int


class SqliteBackend:
    """Sessions in one SQLite file, driven from one dedicated thread."""

    kind: Literal["sqlite"] = "sqlite"

    def __init__(self, path: Path, executor: ThreadPoolExecutor, connection: sqlite3.Connection) -> None:
        self.path = path
        self._executor = executor
        self._db = connection
        self._lock_dir = path.with_name(path.name + ".locks")
        self._closed = False
        self._claims: set[SqliteClaim] = set()  # released by close(), whoever forgot to detach
        # Test seam for crash tests: called inside the commit transaction, before COMMIT.
        self._commit_barrier: Callable[[], None] | None = None

    @classmethod
    async def open(cls, path: Path, synchronous: str, context: Context) -> SqliteBackend:
        """Open (creating if needed) the database at `path` and apply pending schema steps."""
        path.parent.mkdir(parents=True, exist_ok=True)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"harness-sqlite:{path.name}")

        def connect() -> sqlite3.Connection:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous}")
            db.execute("PRAGMA busy_timeout=10000")
            _migrate_schema(db)
            return db

        loop = asyncio.get_running_loop()
        try:
            connection = await loop.run_in_executor(executor, connect)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        backend = cls(path, executor, connection)
        backend._lock_dir.mkdir(exist_ok=True)
        return backend

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def guarded(db: sqlite3.Connection) -> T:
            # Checked on the thread too: a call queued behind close() must not meet a closed db.
            if self._closed:
                raise StoreClosed(f"the SQLite store {self.path} is closed")
            try:
                return fn(db)
            except sqlite3.OperationalError as error:
                # Payloads are decoded by name (`_text`); this is damage in an id or key column.
                if not str(error).startswith("Could not decode to UTF-8"):
                    raise
                raise StorageCorruption(f"the SQLite store {self.path} holds a damaged row: {error}",
                                        path=str(self.path)) from error

        if self._closed:
            raise StoreClosed(f"the SQLite store {self.path} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, guarded, self._db)

    async def create_session(self, info: SessionInfo, context: Context, writes: Sequence[Write] = ()) -> None:
        def run(db: sqlite3.Connection) -> None:
            with _transaction(db):
                try:
                    db.execute(
                        "INSERT INTO sessions (id, created_at, parent_session_id, forked_from_entry_id, next_seq, "
                        "updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                        (info.id, info.created_at, info.parent_session_id, info.forked_from_entry_id,
                         len(writes) + 1, info.updated_at),
                    )
                except sqlite3.IntegrityError:
                    raise InvalidWrite(f"session {info.id} already exists", session_id=info.id) from None
                timestamp = now_ms()
                for seq, write in enumerate(writes, start=1):
                    _apply(db, info.id, write, seq, timestamp)
                if self._commit_barrier is not None:
                    self._commit_barrier()

        await self._call(run)

    async def get_session(self, session_id: str, context: Context) -> SessionInfo | None:
        def run(db: sqlite3.Connection) -> SessionInfo | None:
            row = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
            return SessionInfo(*row) if row else None

        return await self._call(run)

    async def list_sessions(self, context: Context) -> list[SessionInfo]:
        def run(db: sqlite3.Connection) -> list[SessionInfo]:
            rows = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY created_at, id").fetchall()
            return [SessionInfo(*r) for r in rows]

        return await self._call(run)

    async def delete_session(self, session_id: str, context: Context) -> None:
        def run(db: sqlite3.Connection) -> None:
            fd = self._lock(session_id, fcntl.LOCK_EX)
            try:
                with _transaction(db):
                    if db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
                        raise SessionNotFound(f"no session {session_id}", session_id=session_id)
                    for table in _SESSION_TABLES:
                        db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
                # Unlinked while held: a claimant that opened the old file finds no session row.
                self._lock_path(session_id).unlink(missing_ok=True)
            finally:
                os.close(fd)

        await self._call(run)

    async def get_entries(self, session_id: str, ids: Sequence[str], context: Context) -> dict[str, EntryRow]:
        wanted = list(dict.fromkeys(ids))

        def run(db: sqlite3.Connection) -> dict[str, EntryRow]:
            found: dict[str, EntryRow] = {}
            for start in range(0, len(wanted), 500):
                chunk = wanted[start:start + 500]
                marks = ",".join("?" * len(chunk))
                for r in db.execute(
                    f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE session_id = ? AND id IN ({marks})",
                    (session_id, *chunk),
                ):
                    found[r[0]] = _entry_row(r)
            return found

        return await self._call(run)

    async def read_entries(
        self, session_id: str, after_seq: int | None, limit: int, context: Context
    ) -> list[EntryRow]:
        params = (session_id, -1 if after_seq is None else after_seq, limit)
        return await self._call(lambda db: [_entry_row(r) for r in db.execute(
            f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?", params)])

    async def walk_branch(
        self, session_id: str, start: str, limit: int, stop_at_compaction: bool, context: Context
    ) -> list[EntryRow]:
        params = {"s": session_id, "start": start, "limit": limit, "stop": int(stop_at_compaction)}
        return await self._call(lambda db: [_entry_row(r) for r in db.execute(_WALK, params)])

    async def get_value(self, session_id: str, namespace: str, key: str, context: Context) -> ValueRow | None:
        def run(db: sqlite3.Connection) -> ValueRow | None:
            row = db.execute(
                f"SELECT {_VALUE_COLUMNS} FROM record_values WHERE session_id = ? AND namespace = ? AND key = ?",
                (session_id, namespace, key),
            ).fetchone()
            return _value_row(row) if row else None

        return await self._call(run)

    async def scan_values(
        self, session_id: str, namespace: str, key_prefix: str, context: Context
    ) -> list[ValueRow]:
        def run(db: sqlite3.Connection) -> list[ValueRow]:
            rows = db.execute(
                f"SELECT {_VALUE_COLUMNS} FROM record_values "
                "WHERE session_id = ? AND namespace = ? AND substr(key, 1, ?) = ? ORDER BY key",
                (session_id, namespace, len(key_prefix), key_prefix),
            )
            return [_value_row(r) for r in rows]

        return await self._call(run)

    async def read_list(
        self, session_id: str, namespace: str, key: str, after_seq: int | None, limit: int, context: Context
    ) -> list[ValueRow]:
        def run(db: sqlite3.Connection) -> list[ValueRow]:
            rows = db.execute(
                f"SELECT {_VALUE_COLUMNS} FROM list_items "
                "WHERE session_id = ? AND namespace = ? AND key = ? AND seq > ? ORDER BY seq LIMIT ?",
                (session_id, namespace, key, after_seq if after_seq is not None else -1, limit),
            )
            return [_value_row(r) for r in rows]

        return await self._call(run)

    async def read_usage(
        self, session_id: str, after_seq: int | None, limit: int, context: Context
    ) -> list[UsageRowRaw]:
        def run(db: sqlite3.Connection) -> list[UsageRowRaw]:
            rows = db.execute(
                "SELECT id, seq, entry_id, adjustment, CAST(usage AS BLOB), CAST(details AS BLOB) FROM usage_ledger "
                "WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (session_id, after_seq if after_seq is not None else -1, limit),
            )
            return [
                UsageRowRaw(r[0], r[1], r[2], bool(r[3]), _text(r[4], f"usage row {r[0]}", usage_id=r[0]),
                            None if r[5] is None else _text(r[5], f"usage row {r[0]}", usage_id=r[0]))
                for r in rows
            ]

        return await self._call(run)

    async def commit(
        self, session_id: str, writes: Sequence[Write], claim: Claim | None, context: Context
    ) -> CommitResult:
        def run(db: sqlite3.Connection) -> CommitResult:
            probe = None if claim is not None else self._lock(session_id, fcntl.LOCK_SH)
            try:
                return self._commit(db, session_id, writes, claim)
            finally:
                if probe is not None:
                    os.close(probe)

        return await self._call(run)

    def _commit(
        self, db: sqlite3.Connection, session_id: str, writes: Sequence[Write], claim: Claim | None
    ) -> CommitResult:
        with _transaction(db):
            row = db.execute("SELECT next_seq, owner_epoch FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise SessionNotFound(f"no session {session_id}", session_id=session_id)
            first, epoch = row
            if claim is not None and claim.epoch != epoch:
                raise OwnershipLost(f"session {session_id} was claimed by another owner", session_id=session_id)
            timestamp = now_ms()
            for seq, write in enumerate(writes, start=first):
                _apply(db, session_id, write, seq, timestamp)
            db.execute("UPDATE sessions SET next_seq = ?, updated_at = ? WHERE id = ?",
                       (first + len(writes), timestamp, session_id))
            if self._commit_barrier is not None:
                self._commit_barrier()
        return CommitResult(tuple(range(first, first + len(writes))), timestamp)

    def _lock_path(self, session_id: str) -> Path:
        return self._lock_dir / (hashlib.sha256(session_id.encode()).hexdigest()[:32] + ".lock")

    def _try_lock(self, session_id: str, mode: int) -> int | None:
        fd = os.open(self._lock_path(session_id), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def _lock(self, session_id: str, mode: int) -> int:
        # An owner holds the lock exclusively; unowned writers share it for one commit, so they
        # exclude an owner without excluding each other.
        fd = self._try_lock(session_id, mode)
        if fd is None:
            raise SessionOwned(f"session {session_id} is owned by another process or harness",
                               session_id=session_id)
        return fd

    async def claim(self, session_id: str, context: Context) -> Claim:
        def run(db: sqlite3.Connection) -> SqliteClaim:
            fd = self._lock(session_id, fcntl.LOCK_EX)
            try:
                with _transaction(db):
                    row = db.execute(
                        "UPDATE sessions SET owner_epoch = owner_epoch + 1 WHERE id = ? RETURNING owner_epoch",
                        (session_id,),
                    ).fetchone()
                    if row is None:
                        raise SessionNotFound(f"no session {session_id}", session_id=session_id)
            except BaseException:
                os.close(fd)
                raise
            claim = SqliteClaim(session_id, row[0], fd)
            self._claims.add(claim)
            return claim

        return await self._call(run)

    async def release(self, claim: Claim, context: Context) -> None:
        assert isinstance(claim, SqliteClaim)

        def run(db: sqlite3.Connection) -> None:
            if claim in self._claims:
                self._claims.remove(claim)
                os.close(claim.lock_fd)

        await self._call(run)

    async def run_data_migration(self, migration: DataMigration, context: Context) -> bool:
        def run(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                if db.execute("SELECT 1 FROM data_migrations WHERE name = ?", (migration.name,)).fetchone():
                    return False
                changed = []
                for session_id, entry_id, raw in db.execute(
                    "SELECT session_id, id, CAST(payload AS BLOB) FROM entries"
                ):
                    new_payload = migration.apply(entry_id, _text(raw, f"entry {entry_id}", entry_id=entry_id))
                    if new_payload is not None:
                        changed.append((new_payload, session_id, entry_id))
                db.executemany("UPDATE entries SET payload = ? WHERE session_id = ? AND id = ?", changed)
                db.execute("INSERT INTO data_migrations (name, applied_at) VALUES (?, ?)",
                           (migration.name, now_ms()))
            return True

        return await self._call(run)

    async def close(self) -> None:
        """Release every claim still held, close the connection and stop the thread; idempotent."""

        def run(db: sqlite3.Connection) -> None:
            for claim in self._claims:
                os.close(claim.lock_fd)
            self._claims.clear()
            db.close()
            self._closed = True

        if self._closed:
            return
        try:
            await self._call(run)
        finally:
            self._closed = True
            self._executor.shutdown(wait=True)


def _migrate_schema(db: sqlite3.Connection) -> None:
    with _transaction(db):
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER)")
        current = db.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        for version, statements in SCHEMA:
            if version > current:
                for statement in statements:
                    db.execute(statement)
                db.execute("INSERT INTO schema_version VALUES (?, ?)", (version, now_ms()))


def _text(raw: bytes, what: str, **details: str) -> str:
    """A payload column's bytes as text; `StorageCorruption` naming `what` if they are not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise StorageCorruption(f"{what} holds bytes that are not UTF-8 text ({error.reason} at byte "
                                f"{error.start})", **details) from error


def _entry_row(row: tuple[Any, ...]) -> EntryRow:
    entry_id = row[0]
    return EntryRow(entry_id, row[1], row[2], row[3], row[4], _text(row[5], f"entry {entry_id}", entry_id=entry_id))


def _value_row(row: tuple[Any, ...]) -> ValueRow:
    address = f"{row[0]}/{row[1]}"
    return ValueRow(row[0], row[1], row[2], _text(row[3], f"record {address}", address=address))


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: BEGIN IMMEDIATE (so the seq read and the writes cannot interleave
    with another writer's), COMMIT on leaving, ROLLBACK on any exception."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _check_new_id(db: sqlite3.Connection, session_id: str, new_id: str) -> None:
    if db.execute(
        "SELECT 1 FROM entries WHERE session_id = ?1 AND id = ?2 "
        "UNION ALL SELECT 1 FROM usage_ledger WHERE session_id = ?1 AND id = ?2",
        (session_id, new_id),
    ).fetchone():
        raise InvalidWrite(f"id {new_id} is already used in this session", id=new_id)


def _apply(db: sqlite3.Connection, session_id: str, write: Write, seq: int, timestamp: int) -> None:
    params: tuple[Any, ...]
    match write:
        case InsertEntry():
            _check_new_id(db, session_id, write.id)
            if write.parent_id is not None and not db.execute(
                "SELECT 1 FROM entries WHERE session_id = ? AND id = ?", (session_id, write.parent_id)
            ).fetchone():
                raise InvalidWrite(f"parent {write.parent_id} of entry {write.id} does not exist",
                                   id=write.id, parent_id=write.parent_id)
            db.execute(
                "INSERT INTO entries (session_id, id, parent_id, seq, timestamp, type, custom_type, payload) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, write.id, write.parent_id, seq, timestamp, write.type, write.custom_type,
                 write.payload),
            )
        case InsertUsage():
            _check_new_id(db, session_id, write.id)
            params = (session_id, write.id, seq, write.entry_id, int(write.adjustment), write.usage, write.details)
            db.execute("INSERT INTO usage_ledger VALUES (?, ?, ?, ?, ?, ?, ?)", params)
        case SetValue():
            db.execute(
                "INSERT INTO record_values (session_id, namespace, key, seq, value) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (session_id, namespace, key) DO UPDATE SET seq = excluded.seq, value = excluded.value",
                (session_id, write.namespace, write.key, seq, write.value),
            )
        case DeleteValue():
            db.execute("DELETE FROM record_values WHERE session_id = ? AND namespace = ? AND key = ?",
                       (session_id, write.namespace, write.key))
        case AppendList():
            db.execute("INSERT INTO list_items VALUES (?, ?, ?, ?, ?)",
                       (session_id, write.namespace, write.key, seq, write.value))
        case DeleteList():
            db.execute("DELETE FROM list_items WHERE session_id = ? AND namespace = ? AND key = ?",
                       (session_id, write.namespace, write.key))
