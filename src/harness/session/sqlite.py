"""The SQLite backend: the embedded default. One file, WAL, `synchronous=FULL` unless configured.

Every call runs on the database's own thread, except a commit while commits are quick: that one
runs on the caller's event loop thread, where it takes less time than the hop to the thread and
back (`SqliteBackend.inline_commit_limit_s`). Ownership between processes is a lock on one byte of
the database file itself, chosen by the session id (released by the OS when its holder dies),
plus the session's epoch, which the claimant bumps and every owner commit checks. The epoch is
odd from a claim to its release: a commit of no owner probes the lock only then (an odd epoch a
dead owner left costs a probe, never a wrong answer). Locking the
file, not a path, means every alias of one database (a symlink, a hard link, a relative path)
shares one lock, and there is no lock folder to lose.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import hashlib
import os
import queue
import sqlite3
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from harness.context import Context
from harness.errors import HarnessError
from harness.messages import now_ms
from harness.session import commit_mark
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
from harness.session.commit_mark import CommitMark
from harness.session.errors import (
    InvalidWrite,
    OwnershipLost,
    SessionNotFound,
    SessionOwned,
    StorageCorruption,
    StoreClosed,
    StoreFull,
    StoreUnavailable,
)
from harness.session.images import FolderImages
from harness.session.migrations import COPY_NAMESPACES, DataMigration
from harness.session.tokens import TokenInfo, TokenRow, token_row, token_sql

T = TypeVar("T")


def _without_rowid(table: str, key: str) -> tuple[str, ...]:
    """The statements that rebuild `table` (session_id, namespace, key, seq, value) as a WITHOUT
    ROWID table with primary key `key`, its rows kept."""
    return (
        f"""CREATE TABLE {table}_rebuilt (
            session_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            key TEXT NOT NULL,
            seq INTEGER NOT NULL,
            value TEXT NOT NULL,
            {key}
        ) WITHOUT ROWID""",
        f"INSERT INTO {table}_rebuilt SELECT session_id, namespace, key, seq, value FROM {table}",
        f"DROP TABLE {table}",
        f"ALTER TABLE {table}_rebuilt RENAME TO {table}",
    )


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
    (3, commit_mark.SCHEMA_STEP),
    # The bearer tokens of `harness serve` (harness.session.tokens): the secret's hash, never the secret.
    (4, (
        """CREATE TABLE tokens (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            digest TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            revoked_at INTEGER
        )""",
    )),
    # Records and list items kept in their primary key's b-tree alone (WITHOUT ROWID): a rowid
    # table beside its key index wrote two pages where one does, on nearly every commit of a turn.
    (5, _without_rowid("record_values", "PRIMARY KEY (session_id, namespace, key)")
        + _without_rowid("list_items", "PRIMARY KEY (session_id, namespace, key, seq)")),
    # The commit mark's progress: the seqs sessions handed out, deleted ones' kept here.
    (6, commit_mark.PROGRESS_STEP),
)

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


def image_folder(database: Path) -> Path:
    """The folder beside the database file that holds its images (`harness.db.images`)."""
    return database.with_name(database.name + ".images")


def driver_error(error: sqlite3.DatabaseError, path: Path) -> HarnessError:
    """The typed error for a failure of the SQLite library: `StoreFull`, `StorageCorruption`
    (a damaged or foreign file) or `StoreUnavailable` (I/O errors, a read-only file, locks)."""
    primary = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
    if primary == sqlite3.SQLITE_FULL:
        return StoreFull(f"the SQLite store {path} is full: {error}", path=str(path))
    if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB) or (primary == 0 and "malformed" in str(error)):
        return StorageCorruption(f"the SQLite store {path} is damaged: {error}", path=str(path))
    return StoreUnavailable(f"the SQLite store {path} cannot be used: {error}", path=str(path))


@dataclass(eq=False)
class SqliteClaim:
    session_id: str
    epoch: int
    lock: _SessionLock


# Open-file-description locks (Linux): owned by one open of the file, not by the process, so two
# harnesses in one process exclude each other, and SQLite's own POSIX locks are never touched.
# Far above SQLite's lock bytes (0x40000000 + 512), one byte per session (a hash collision can
# only refuse a claim, never let two owners in).
_LOCK_BASE = 1 << 62
_LOCK_SPAN = 1 << 48


@functools.lru_cache(maxsize=1024)  # an unowned commit probes the lock: one hash per session, not per commit
def _lock_offset(session_id: str) -> int:
    digest = hashlib.sha256(session_id.encode()).digest()
    return _LOCK_BASE + int.from_bytes(digest[:8], "big") % _LOCK_SPAN


class _LockDescriptors:
    """Descriptors of database files kept open for session locks, per file identity.

    Closing any descriptor of a file drops every POSIX lock the process holds on it, SQLite's
    included, so while a store of this process has the file open, a descriptor opened for a lock
    is never closed: it is unlocked and kept for the next lock on the same file (the pool is as
    large as the most locks held at once). The last store to close the file closes them."""

    def __init__(self) -> None:
        self._free: dict[tuple[int, int], list[int]] = {}
        self._stores: dict[tuple[int, int], int] = {}
        self._mutex = threading.Lock()

    def open_store(self, path: Path) -> tuple[int, int]:
        info = os.stat(path)
        identity = (info.st_dev, info.st_ino)
        with self._mutex:
            self._stores[identity] = self._stores.get(identity, 0) + 1
        return identity

    def close_store(self, identity: tuple[int, int]) -> None:
        """Called after the store's connection is closed and its locks are released."""
        with self._mutex:
            self._stores[identity] -= 1
            if self._stores[identity]:
                return
            del self._stores[identity]
            free = self._free.pop(identity, [])
        for fd in free:
            os.close(fd)

    def take(self, identity: tuple[int, int], path: Path) -> int:
        with self._mutex:
            free = self._free.get(identity)
            if free:
                return free.pop()
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != identity:  # the path now names another file
            os.close(fd)
            raise StoreUnavailable(f"the SQLite store {path} was replaced by another file while open",
                                   path=str(path))
        return fd

    def give_back(self, identity: tuple[int, int], fd: int) -> None:
        with self._mutex:
            self._free.setdefault(identity, []).append(fd)


_DESCRIPTORS = _LockDescriptors()


@dataclass(eq=False)
class _SessionLock:
    identity: tuple[int, int]
    fd: int
    offset: int


def _unlock(lock: _SessionLock) -> None:
    _set_lock(lock.fd, fcntl.F_UNLCK, lock.offset)
    _DESCRIPTORS.give_back(lock.identity, lock.fd)


# struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks), padded to 32 bytes.
_FLOCK = "hhqqixxxx"


def _set_lock(fd: int, kind: int, offset: int) -> bool:
    request = struct.pack(_FLOCK, kind, os.SEEK_SET, offset, 1, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
    except (BlockingIOError, PermissionError):
        return False
    return True


def _owner_locked(fd: int, offset: int) -> bool:
    """Whether another open of the file (of any process, this one's other descriptors included)
    holds an owner's lock, the exclusive one, on byte `offset`: F_OFD_GETLK asks whether a shared
    lock could be placed, and places nothing, so neither the owner nor a claimant notices."""
    request = struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, offset, 1, 0)
    kind: int = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_OFD_GETLK, request))[0]
    return kind != fcntl.F_UNLCK


_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]

BUSY_TIMEOUT_MS = 10_000
"""How long a call on the database thread waits for another connection's write lock."""

INLINE_COMMIT_LIMIT_S = 0.001
"""A commit runs on the event loop's thread while commits take less than this (an exponential
average of the latest few, fsync included): no longer than the harness's own Python per commit
blocks the loop anyway, and less than the hop to the database thread and back costs on a fast disk.
On a slower disk commits run on the database thread, which the loop does not wait for."""

INLINE_COMMIT_WRITES = 64
"""A commit of more writes than this (an import, a large fork) always runs on the database thread."""


class _WouldWait(Exception):
    """A commit on the event loop's thread found the write lock held by another connection: it
    goes to the database thread instead, which waits for it without holding up the loop."""


class _Backlog:
    """How many calls a database thread was handed and has not finished (handed on any event
    loop's thread, a store may serve several, finished on its own), and the lock on the connection
    its calls and a commit on a loop's thread take; kept apart from the thread object, which
    dropping must be able to finalize while a call is queued."""

    __slots__ = ("_mutex", "calls", "connection")

    def __init__(self) -> None:
        self.calls = 0
        self._mutex = threading.Lock()
        self.connection = threading.Lock()

    def handed(self) -> None:
        with self._mutex:
            self.calls += 1

    def finished(self) -> None:
        with self._mutex:
            self.calls -= 1


class _DatabaseThread:
    """The one thread that runs a database's calls, in the order submitted, each answered on the
    event loop that submitted it; `idle` when it has answered every call (a commit may then run
    on the loop's own thread). A one-worker ThreadPoolExecutor did the same through its
    futures, locks and condition variables, about 5% of a loop turn's CPU (bench/README.md).

    As an executor's worker, it ends when its owner is dropped unstopped, and at interpreter exit
    it first runs what was submitted: a commit handed to it still lands."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._backlog = _Backlog()
        # The thread holds the queue and the backlog, not this object, so dropping it runs the finalizer.
        self._thread = threading.Thread(target=_serve, args=(self._calls, self._backlog), name=name, daemon=True)
        self._thread.start()
        self._finish = weakref.finalize(self, _finish, self._calls, self._thread)

    @property
    def connection(self) -> threading.Lock:
        """Held while a call uses the connection: each of the thread's, and a commit on an event
        loop's thread for its length (that one only tries it: the thread never waits on a loop)."""
        return self._backlog.connection

    @property
    def idle(self) -> bool:
        """Every call handed to the thread has finished: none waits its turn before a commit."""
        return self._backlog.calls == 0

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._backlog.handed()
        self._calls.put((loop, future, fn))
        return future

    def stop(self, *, wait: bool) -> None:
        """End the thread once the calls already submitted have run; `wait` joins it."""
        if wait:
            self._finish()  # what dropping it or exiting would do, now and once
        else:
            self._calls.put(None)


def _serve(calls: queue.SimpleQueue[_Call | None], backlog: _Backlog) -> None:
    while (call := calls.get()) is not None:
        loop, future, fn = call
        if future.cancelled():  # given up before it started: run nothing, as an executor would
            backlog.finished()
            continue
        with backlog.connection:
            try:
                outcome: tuple[bool, Any] = (True, fn())
            except BaseException as error:
                outcome = (False, error)
        backlog.finished()
        with suppress(RuntimeError):  # the loop has closed: nobody waits for the answer any more
            loop.call_soon_threadsafe(_settle, future, *outcome)


def _finish(calls: queue.SimpleQueue[_Call | None], thread: threading.Thread) -> None:
    """End `thread` after the calls queued before and join it: by `stop`, or by the finalizer when
    the owner is dropped or at exit (before daemon threads stop)."""
    calls.put(None)
    if thread is not threading.current_thread():
        thread.join()


def _abandoned(thread: _DatabaseThread,
               opening: asyncio.Future[tuple[sqlite3.Connection, CommitMark, tuple[int, int]]]) -> None:
    """After an open whose caller was cancelled: close what the thread opened, then end it."""
    if not opening.cancelled() and opening.exception() is None:
        connection, mark, identity = opening.result()

        def close() -> None:
            connection.close()
            mark.close()
            _DESCRIPTORS.close_store(identity)

        thread.submit(close)
    thread.stop(wait=False)


def _settle(future: asyncio.Future[Any], ok: bool, outcome: Any) -> None:
    if future.cancelled():
        return
    if ok:
        future.set_result(outcome)
    elif isinstance(outcome, StopIteration):
        # A future refuses StopIteration (TypeError, leaving it pending and its caller waiting for
        # good); a data migration's function may raise it. As a coroutine's would (PEP 479):
        error = RuntimeError("a call on the database thread raised StopIteration")
        error.__cause__ = outcome
        future.set_exception(error)
    else:
        future.set_exception(outcome)


class SqliteBackend:
    """Sessions in one SQLite file, driven from one dedicated thread; quick commits run on the
    event loop's thread (`inline_commit_limit_s`)."""

    kind: Literal["sqlite"] = "sqlite"

    def __init__(self, path: Path, thread: _DatabaseThread, connection: sqlite3.Connection, mark: CommitMark,
                 identity: tuple[int, int]) -> None:
        self.path = path
        self.images = FolderImages(image_folder(path))
        self.tokens = SqliteTokens(self)
        self._thread = thread
        self._db = connection
        self._mark = mark
        # The database file's (device, inode): what its locks are keyed on; None once closed.
        self._identity: tuple[int, int] | None = identity
        self._closed = False
        self._claims: set[SqliteClaim] = set()  # released by close(), whoever forgot to detach
        # Test seam for crash tests: called inside the commit transaction, before COMMIT.
        self._commit_barrier: Callable[[], None] | None = None
        self.inline_commit_limit_s = INLINE_COMMIT_LIMIT_S
        """Commits run on the event loop's thread while they take less than this on average
        (`INLINE_COMMIT_LIMIT_S`); 0 runs every commit on the database thread."""
        self._commit_s = 0.0  # the average commit's time, fsync included: quick until shown otherwise
        self._busy_timeout_ms = BUSY_TIMEOUT_MS  # the connection's, as the last call set it

    @classmethod
    async def open(cls, path: Path, synchronous: str, context: Context) -> SqliteBackend:
        """Open (creating if needed) the database at `path` and apply pending schema steps.

        Raises `StoreUnavailable` (no such folder, no permission, a failing disk), `StoreFull`, or
        `StorageCorruption` for a file that is damaged or not a database."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreUnavailable(f"cannot open SQLite store {path}: {error}", path=str(path)) from error
        thread = _DatabaseThread(f"harness-sqlite:{path.name}")

        def connect() -> sqlite3.Connection:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous}")
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            _migrate_schema(db)
            return db

        def connect_and_register() -> tuple[sqlite3.Connection, CommitMark, tuple[int, int]]:
            db = connect()
            try:
                mark = CommitMark.check_and_open(path, db)
            except BaseException:
                db.close()
                raise
            try:
                return db, mark, _DESCRIPTORS.open_store(path)
            except BaseException:
                mark.close()
                db.close()
                raise

        opening = thread.submit(connect_and_register)
        try:
            connection, mark, identity = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The thread goes on opening the file: what it opens is closed once it has.
            opening.add_done_callback(functools.partial(_abandoned, thread))
            raise
        except BaseException as error:
            thread.stop(wait=False)
            if isinstance(error, sqlite3.DatabaseError):
                raise driver_error(error, path) from error
            if isinstance(error, OSError):
                raise StoreUnavailable(f"cannot open SQLite store {path}: {error}", path=str(path)) from error
            raise
        return cls(path, thread, connection, mark, identity)

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._submit(fn)

    def _submit(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run `fn` on the database thread; the thread's future, awaited by `_call` or handed out."""
        if self._closed:
            raise StoreClosed(f"the SQLite store {self.path} is closed")
        return self._thread.submit(lambda: self._guarded(fn, BUSY_TIMEOUT_MS))

    def _submit_commit(self, fn: Callable[[sqlite3.Connection], CommitResult], writes: int
                       ) -> asyncio.Future[CommitResult]:
        """Run commit `fn` of `writes` writes on the event loop's thread when it can be quick (the
        database thread is idle, commits have been quick, the commit is small) and the write lock
        is free, else on the database thread; either way its time feeds the average."""

        def timed(db: sqlite3.Connection) -> CommitResult:
            started = time.perf_counter()
            result = fn(db)
            self._time_commit(started)
            return result

        if (self._closed or not self._thread.idle or writes > INLINE_COMMIT_WRITES
                or self._commit_s >= self.inline_commit_limit_s
                or not self._thread.connection.acquire(blocking=False)):  # another loop's call has it
            return self._submit(timed)
        future: asyncio.Future[CommitResult] = asyncio.get_running_loop().create_future()
        try:
            started = time.perf_counter()
            future.set_result(self._guarded(fn, 0))
            self._time_commit(started)
        except _WouldWait:
            return self._submit(timed)
        except Exception as error:
            _settle(future, False, error)
        finally:
            self._thread.connection.release()
        return future

    def _time_commit(self, started: float) -> None:
        # Written on whichever thread runs the commit: never both at once, as a commit runs on
        # the loop's thread only while the database thread is idle.
        self._commit_s += (time.perf_counter() - started - self._commit_s) / 4

    def _guarded(self, fn: Callable[[sqlite3.Connection], T], busy_timeout_ms: int) -> T:
        """`fn` on the connection, waiting at most `busy_timeout_ms` for another connection's
        write lock (0: `_WouldWait` at once), its driver errors as typed ones."""
        # Checked on the thread too: a call queued behind close() must not meet a closed db.
        if self._closed:
            raise StoreClosed(f"the SQLite store {self.path} is closed")
        db = self._db
        if self._busy_timeout_ms != busy_timeout_ms:
            db.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
            self._busy_timeout_ms = busy_timeout_ms
        try:
            return fn(db)
        except sqlite3.OperationalError as error:
            if busy_timeout_ms == 0 and error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY:
                raise _WouldWait from error  # it wrote nothing: its transaction rolled back
            # Payloads are decoded by name (`_text`); this is damage in an id or key column.
            if not str(error).startswith("Could not decode to UTF-8"):
                raise driver_error(error, self.path) from error
            raise StorageCorruption(f"the SQLite store {self.path} holds a damaged row: {error}",
                                    path=str(self.path)) from error
        except (sqlite3.IntegrityError, sqlite3.ProgrammingError):
            raise  # a broken rule of ours, not a failing store
        except sqlite3.DatabaseError as error:
            raise driver_error(error, self.path) from error

    async def create_session(self, info: SessionInfo, context: Context, writes: Sequence[Write] = ()) -> None:
        seqs = write_seqs(1, writes)

        def run(db: sqlite3.Connection) -> None:
            with _counted_transaction(db, self._mark):
                try:
                    db.execute(
                        "INSERT INTO sessions (id, created_at, parent_session_id, forked_from_entry_id, next_seq, "
                        "updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                        (info.id, info.created_at, info.parent_session_id, info.forked_from_entry_id,
                         (seqs[-1] if seqs else 0) + 1, info.updated_at),
                    )
                except sqlite3.IntegrityError:
                    raise InvalidWrite(f"session {info.id} already exists", session_id=info.id) from None
                timestamp = now_ms()
                for seq, write in zip(seqs, writes, strict=True):
                    _apply(db, info.id, write, seq, timestamp)
                if self._commit_barrier is not None:
                    self._commit_barrier()

        await self._call(run)

    async def get_session(self, session_id: str, context: Context) -> SessionInfo | None:
        def run(db: sqlite3.Connection) -> SessionInfo | None:
            row = db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
            return SessionInfo(*row) if row else None

        return await self._call(run)

    async def list_sessions(self, context: Context) -> list[SessionInfo]:
        def run(db: sqlite3.Connection) -> list[SessionInfo]:
            rows = db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY created_at, id").fetchall()
            return [SessionInfo(*r) for r in rows]

        return await self._call(run)

    async def delete_session(self, session_id: str, context: Context) -> None:
        def run(db: sqlite3.Connection) -> None:
            lock = self._lock(session_id, shared=False)
            try:
                with _counted_transaction(db, self._mark):
                    db.execute(commit_mark.RETIRE, (session_id,))  # its seqs stay counted
                    if db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
                        raise SessionNotFound(f"no session {session_id}", session_id=session_id)
                    for table in SESSION_TABLES:
                        db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
            finally:
                _unlock(lock)

        await self._call(run)

    async def get_entries(self, session_id: str, ids: Sequence[str], context: Context) -> dict[str, EntryRow]:
        return cast("dict[str, EntryRow]", await self._call(_reader(session_id, EntriesRead(tuple(ids)))))

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
        return cast("ValueRow | None", await self._call(_reader(session_id, ValueRead(namespace, key))))

    async def scan_values(
        self, session_id: str, namespace: str, key_prefix: str, context: Context
    ) -> list[ValueRow]:
        return cast("list[ValueRow]", await self._call(_reader(session_id, ScanRead(namespace, key_prefix))))

    async def values_across(self, namespace: str, key: str, context: Context) -> dict[str, ValueRow]:
        def run(db: sqlite3.Connection) -> dict[str, ValueRow]:
            rows = db.execute(f"SELECT session_id, {_VALUE_COLUMNS} FROM record_values WHERE namespace = ? AND key = ?",
                              (namespace, key))
            return {r[0]: _value_row(r[1:]) for r in rows}

        return await self._call(run)

    async def read_list(
        self, session_id: str, namespace: str, key: str, after_seq: int | None, limit: int, context: Context
    ) -> list[ValueRow]:
        return cast("list[ValueRow]",
                    await self._call(_reader(session_id, ListRead(namespace, key, after_seq, limit))))

    async def list_bounds(
        self, session_id: str, namespace: str, key: str, context: Context
    ) -> tuple[int, int] | None:
        return cast("tuple[int, int] | None", await self._call(_reader(session_id, BoundsRead(namespace, key))))

    async def read_many(self, session_id: str, reads: Sequence[Read], context: Context) -> list[ReadAnswer]:
        readers = [_reader(session_id, read) for read in reads]
        return await self._call(lambda db: [read(db) for read in readers])

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

    def commit(
        self, session_id: str, writes: Sequence[Write], claim: Claim | None, context: Context
    ) -> asyncio.Future[CommitResult]:
        return self._submit_commit(lambda db: self._commit(db, session_id, writes, claim, probe=claim is None),
                                   len(writes))

    def post(self, session_id: str, writes: Sequence[SetValue], context: Context) -> asyncio.Future[CommitResult]:
        # No lock probe: an owner's commits and this one are serialised by SQLite's write lock.
        return self._submit_commit(lambda db: self._commit(db, session_id, writes, None, probe=False), len(writes))

    def _commit(
        self, db: sqlite3.Connection, session_id: str, writes: Sequence[Write], claim: Claim | None, *, probe: bool
    ) -> CommitResult:
        with _Transaction(db):
            # Read here and written below, two statements: one UPDATE ... RETURNING measured more
            # work per commit than this SELECT (SQLite buffers a RETURNING row in a temporary table).
            row = db.execute("SELECT next_seq, owner_epoch FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise SessionNotFound(f"no session {session_id}", session_id=session_id)
            first, epoch = row
            if probe and epoch % 2:
                # Claimed and not released (or its owner died): `SessionOwned` while an owner lives.
                # Read inside the write transaction, an even epoch means no claim commits before
                # this one does, and a claim made after the probe commits after it too.
                _unlock(self._lock(session_id, shared=True))
            before = self._mark.progress(db)  # before this commit's writes change it
            if claim is not None and claim.epoch != epoch:
                raise OwnershipLost(f"session {session_id} was claimed by another owner", session_id=session_id)
            timestamp = now_ms()
            seqs = write_seqs(first, writes)
            for seq, write in zip(seqs, writes, strict=True):
                try:
                    _apply(db, session_id, write, seq, timestamp)
                except sqlite3.IntegrityError as error:
                    if not str(error).endswith(".seq"):
                        raise
                    raise seq_already_held(session_id, seq) from error
            after = seqs[-1] + 1 if seqs else first
            db.execute("UPDATE sessions SET next_seq = ?, updated_at = ? WHERE id = ?", (after, timestamp, session_id))
            progress = before + after - first
            if self._commit_barrier is not None:
                self._commit_barrier()
        self._mark.landed(progress)
        return CommitResult(seqs, timestamp)

    def _lock(self, session_id: str, *, shared: bool) -> _SessionLock:
        # An owner holds the lock exclusively; unowned writers share it for one commit, so they
        # exclude an owner without excluding each other.
        identity = self._identity
        assert identity is not None  # every call checks for a closed store first
        fd = _DESCRIPTORS.take(identity, self.path)
        lock = _SessionLock(identity, fd, _lock_offset(session_id))
        if not _set_lock(fd, fcntl.F_RDLCK if shared else fcntl.F_WRLCK, lock.offset):
            _DESCRIPTORS.give_back(identity, fd)
            raise SessionOwned(f"session {session_id} is owned by another process or harness",
                               session_id=session_id)
        return lock

    async def claim(self, session_id: str, context: Context) -> Claim:
        def run(db: sqlite3.Connection) -> SqliteClaim:
            lock = self._lock(session_id, shared=False)
            try:
                with _counted_transaction(db, self._mark):
                    row = db.execute(
                        # The next odd epoch: odd while claimed (see the module's docstring).
                        "UPDATE sessions SET owner_epoch = owner_epoch + 1 + owner_epoch % 2 WHERE id = ? "
                        "RETURNING owner_epoch",
                        (session_id,),
                    ).fetchone()
                    if row is None:
                        raise SessionNotFound(f"no session {session_id}", session_id=session_id)
            except BaseException:
                _unlock(lock)
                raise
            claim = SqliteClaim(session_id, row[0], lock)
            self._claims.add(claim)
            return claim

        return await self._call(run)

    def connection_use(self) -> ConnectionUse:
        """The claims held, each a lock on the file; reads share the backend's one connection."""
        return ConnectionUse(claims=len(self._claims))

    async def release(self, claim: Claim, context: Context) -> None:
        assert isinstance(claim, SqliteClaim)

        def run(db: sqlite3.Connection) -> None:
            if claim not in self._claims:
                return
            self._claims.remove(claim)
            try:
                # Even again, so commits of no owner skip the probe; best effort: left odd (a full
                # disk, a lock held elsewhere), they only go on probing.
                with suppress(sqlite3.DatabaseError), _Transaction(db):
                    db.execute("UPDATE sessions SET owner_epoch = owner_epoch + 1 WHERE id = ? AND owner_epoch = ?",
                               (claim.session_id, claim.epoch))
            finally:
                _unlock(claim.lock)

        await self._call(run)

    async def held(self, session_id: str, context: Context) -> bool:
        """Whether a claim holds the session, in this process or another: its lock byte tested
        from a lock descriptor that holds nothing (`_owner_locked`). A hash collision of two
        sessions' bytes can make it True for a session nobody holds, never False for a held one."""
        def run(db: sqlite3.Connection) -> bool:
            identity = self._identity
            assert identity is not None  # `_call` checks for a closed store first
            fd = _DESCRIPTORS.take(identity, self.path)
            try:
                return _owner_locked(fd, _lock_offset(session_id))
            finally:
                _DESCRIPTORS.give_back(identity, fd)

        return await self._call(run)

    async def run_data_migration(self, migration: DataMigration, context: Context) -> bool:
        def run(db: sqlite3.Connection) -> bool:
            with _counted_transaction(db, self._mark):
                if db.execute("SELECT 1 FROM data_migrations WHERE name = ?", (migration.name,)).fetchone():
                    return False
                changed = []
                for session_id, entry_id, raw in db.execute(
                    "SELECT session_id, id, CAST(payload AS BLOB) FROM entries"
                ):
                    try:
                        stored = _text(raw, f"entry {entry_id}", entry_id=entry_id)
                    except StorageCorruption:
                        continue  # damaged bytes are left as they are (see DataMigration.apply)
                    new_payload = migration.apply(entry_id, stored)
                    if new_payload is not None:
                        changed.append((new_payload, session_id, entry_id))
                db.executemany("UPDATE entries SET payload = ? WHERE session_id = ? AND id = ?", changed)
                # The copies records hold of entries not placed yet, in the same transaction (CE-25).
                copies = []
                marks = ", ".join("?" * len(COPY_NAMESPACES))
                for session_id, namespace, key, raw in db.execute(
                    "SELECT session_id, namespace, key, CAST(value AS BLOB) FROM record_values "
                    f"WHERE namespace IN ({marks})", COPY_NAMESPACES,
                ):
                    try:
                        stored = _text(raw, f"record {namespace}/{key}", namespace=namespace, key=key)
                    except StorageCorruption:
                        continue
                    new_value = migration.apply_to_value(namespace, key, stored)
                    if new_value is not None:
                        copies.append((new_value, session_id, namespace, key))
                db.executemany("UPDATE record_values SET value = ? WHERE session_id = ? AND namespace = ? AND key = ?",
                               copies)
                db.execute("INSERT INTO data_migrations (name, applied_at) VALUES (?, ?)",
                           (migration.name, now_ms()))
            return True

        return await self._call(run)

    async def close(self) -> None:
        """Release every claim still held, close the connection and stop the thread; idempotent."""

        def run(db: sqlite3.Connection) -> None:
            for claim in self._claims:
                _unlock(claim.lock)
            self._claims.clear()
            db.close()
            self._mark.close()
            self._closed = True

        if self._closed:
            return
        try:
            # Shielded: a close that is cancelled while it waits its turn still closes.
            await asyncio.shield(self._submit(run))
        finally:
            self._thread.stop(wait=True)
            self._closed = True
            if self._identity is not None:  # once, even if two closes raced
                identity, self._identity = self._identity, None
                _DESCRIPTORS.close_store(identity)


def _migrate_schema(db: sqlite3.Connection) -> None:
    with _Transaction(db):
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


def _reader(session_id: str, read: Read) -> Callable[[sqlite3.Connection], ReadAnswer]:
    """One read of a session, to run on the database's thread."""
    if isinstance(read, ValueRead):
        def value(db: sqlite3.Connection) -> ValueRow | None:
            row = db.execute(f"SELECT {_VALUE_COLUMNS} FROM record_values WHERE session_id = ? AND namespace = ? "
                             "AND key = ?", (session_id, read.namespace, read.key)).fetchone()
            return _value_row(row) if row else None
        return value
    if isinstance(read, ScanRead):
        prefix = read.key_prefix
        return lambda db: [_value_row(r) for r in db.execute(
            f"SELECT {_VALUE_COLUMNS} FROM record_values "
            "WHERE session_id = ? AND namespace = ? AND substr(key, 1, ?) = ? ORDER BY key",
            (session_id, read.namespace, len(prefix), prefix))]
    if isinstance(read, ListRead):
        after = -1 if read.after_seq is None else read.after_seq
        return lambda db: [_value_row(r) for r in db.execute(
            f"SELECT {_VALUE_COLUMNS} FROM list_items "
            "WHERE session_id = ? AND namespace = ? AND key = ? AND seq > ? ORDER BY seq LIMIT ?",
            (session_id, read.namespace, read.key, after, read.limit))]
    if isinstance(read, BoundsRead):
        def bounds(db: sqlite3.Connection) -> tuple[int, int] | None:
            row = db.execute("SELECT min(seq), max(seq) FROM list_items WHERE session_id = ? AND namespace = ? "
                             "AND key = ?", (session_id, read.namespace, read.key)).fetchone()
            return None if row[0] is None else (row[0], row[1])
        return bounds
    wanted = list(dict.fromkeys(read.ids))

    def entries(db: sqlite3.Connection) -> dict[str, EntryRow]:
        found: dict[str, EntryRow] = {}
        for start in range(0, len(wanted), 500):
            chunk = wanted[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for r in db.execute(f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE session_id = ? AND id IN ({marks})",
                                (session_id, *chunk)):
                found[r[0]] = _entry_row(r)
        return found
    return entries


@contextmanager
def _counted_transaction(db: sqlite3.Connection, mark: CommitMark) -> Iterator[None]:
    """`_Transaction` that reads the store's progress once its statements ran and, once
    committed, writes it to the mark."""
    with _Transaction(db):
        yield
        progress = mark.counted(db)
    mark.landed(progress)


class _Transaction:
    """One write transaction: BEGIN IMMEDIATE (so the seq read and the writes cannot interleave
    with another writer's), COMMIT on leaving, ROLLBACK on any exception, also one raised as
    BEGIN or COMMIT returns (a signal's, on the event loop's thread) or a COMMIT that failed: the
    connection is never left inside a transaction. A class, not a generator: it is on every
    commit's path."""

    __slots__ = ("_db",)

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._roll_back()
            raise

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        if kind is not None:
            self._roll_back()
            return
        try:
            self._db.execute("COMMIT")
        except BaseException:
            self._roll_back()
            raise

    def _roll_back(self) -> None:
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")


# An insert makes its own checks, in one statement: an id the other table holds (its own table's
# is its primary key) or a missing parent nulls the seq, which the column refuses; only then do
# `_refusal`'s queries say which it was. (An INSERT ... SELECT ... WHERE reads the table it writes,
# so SQLite copies its row through a temporary table: slower than the id check, parent check and
# insert it would replace.)
_INSERT_ENTRY = (
    "INSERT INTO entries (session_id, id, parent_id, seq, timestamp, type, custom_type, payload) VALUES (?1, ?2, ?3, "
    "CASE WHEN NOT EXISTS (SELECT 1 FROM usage_ledger WHERE session_id = ?1 AND id = ?2) "
    "AND (?3 IS NULL OR EXISTS (SELECT 1 FROM entries WHERE session_id = ?1 AND id = ?3)) THEN ?4 END, ?5, ?6, ?7, ?8)"
)
_INSERT_USAGE = (
    "INSERT INTO usage_ledger (session_id, id, seq, entry_id, adjustment, usage, details) VALUES (?1, ?2, "
    "CASE WHEN NOT EXISTS (SELECT 1 FROM entries WHERE session_id = ?1 AND id = ?2) THEN ?3 END, ?4, ?5, ?6, ?7)"
)


def _refusal(
    db: sqlite3.Connection, session_id: str, write: InsertEntry | InsertUsage, error: sqlite3.IntegrityError
) -> InvalidWrite | None:
    """The `InvalidWrite` for an insert its statement (`_INSERT_ENTRY`, `_INSERT_USAGE`) refused
    with `error`: its id taken, else its parent missing. None for any other broken constraint."""
    taken = error.sqlite_errorcode == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY  # a row of its own table has the id
    guard = f"NOT NULL constraint failed: {'entries' if isinstance(write, InsertEntry) else 'usage_ledger'}.seq"
    if not taken and (error.sqlite_errorcode != sqlite3.SQLITE_CONSTRAINT_NOTNULL or str(error) != guard):
        return None
    if taken or db.execute(
        "SELECT 1 FROM entries WHERE session_id = ?1 AND id = ?2 "
        "UNION ALL SELECT 1 FROM usage_ledger WHERE session_id = ?1 AND id = ?2",
        (session_id, write.id),
    ).fetchone():
        return InvalidWrite(f"id {write.id} is already used in this session", id=write.id)
    if isinstance(write, InsertEntry) and write.parent_id is not None and not db.execute(
        "SELECT 1 FROM entries WHERE session_id = ? AND id = ?", (session_id, write.parent_id)
    ).fetchone():
        return InvalidWrite(f"parent {write.parent_id} of entry {write.id} does not exist",
                            id=write.id, parent_id=write.parent_id)
    return None


def _insert(
    db: sqlite3.Connection, session_id: str, write: InsertEntry | InsertUsage, sql: str, params: tuple[Any, ...]
) -> None:
    """Run `write`'s insert `sql`; `InvalidWrite` if its id is taken or its parent is missing."""
    try:
        db.execute(sql, params)
    except sqlite3.IntegrityError as error:
        refusal = _refusal(db, session_id, write, error)
        if refusal is None:
            raise
        raise refusal from None


def _apply(db: sqlite3.Connection, session_id: str, write: Write, seq: int, timestamp: int) -> None:
    match write:
        case InsertEntry():
            _insert(db, session_id, write, _INSERT_ENTRY, (session_id, write.id, write.parent_id, seq, timestamp,
                                                           write.type, write.custom_type, write.payload))
        case InsertUsage():
            _insert(db, session_id, write, _INSERT_USAGE, (session_id, write.id, seq, write.entry_id,
                                                           int(write.adjustment), write.usage, write.details))
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
        case TrimList():
            # A range of the primary key: deleted without a scan.
            db.execute("DELETE FROM list_items WHERE session_id = ? AND namespace = ? AND key = ? AND seq <= ?",
                       (session_id, write.namespace, write.key, write.through_seq))


_TOKEN_SQL = token_sql("?")


class SqliteTokens:
    """Token rows in the database's `tokens` table, on its thread like every other statement."""

    def __init__(self, backend: SqliteBackend) -> None:
        self._backend = backend

    async def insert(self, row: TokenRow, context: Context) -> None:
        info = row.info
        await self._backend._call(lambda db: db.execute(_TOKEN_SQL.insert, (info.id, info.user, row.digest,
                                                                            info.created_at)))

    async def get(self, token_id: str, context: Context) -> TokenRow | None:
        return await self._backend._call(lambda db: token_row(db.execute(_TOKEN_SQL.get, (token_id,)).fetchone()))

    async def list(self, context: Context) -> list[TokenInfo]:
        return await self._backend._call(lambda db: [TokenInfo(*row) for row in db.execute(_TOKEN_SQL.list)])

    async def revoke(self, token_id: str, revoked_at: int, context: Context) -> TokenInfo | None:
        def run(db: sqlite3.Connection) -> TokenInfo | None:
            found = db.execute(_TOKEN_SQL.revoke, (revoked_at, token_id)).fetchone()
            return TokenInfo(*found) if found is not None else None

        return await self._backend._call(run)
