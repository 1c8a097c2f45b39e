"""The in-memory backend: for tests and ephemeral sessions; ownership is process-local."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from harness.context import Context
from harness.messages import now_ms
from harness.session.backend import (
    AppendList,
    Claim,
    CommitResult,
    ConnectionUse,
    DeleteList,
    DeleteValue,
    EntryRow,
    InsertEntry,
    InsertUsage,
    Read,
    ReadAnswer,
    SessionInfo,
    SetValue,
    TrimList,
    UsageRowRaw,
    ValueRow,
    Write,
    read_each,
    write_seqs,
)
from harness.session.errors import InvalidWrite, OwnershipLost, SessionNotFound, SessionOwned, StoreClosed
from harness.session.images import MemoryImages
from harness.session.migrations import DataMigration
from harness.session.tokens import MemoryTokens


@dataclass
class _MemorySession:
    info: SessionInfo
    next_seq: int = 1
    epoch: int = 0
    claimed: bool = False
    entries: dict[str, EntryRow] = field(default_factory=dict)
    usage: dict[str, UsageRowRaw] = field(default_factory=dict)
    values: dict[tuple[str, str], ValueRow] = field(default_factory=dict)
    lists: dict[tuple[str, str], list[ValueRow]] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryClaim:
    session_id: str
    epoch: int


class MemoryBackend:
    """Sessions held in dicts. Commits are validated whole before anything changes."""

    kind: Literal["memory"] = "memory"

    def __init__(self) -> None:
        self._sessions: dict[str, _MemorySession] = {}
        self._applied_migrations: set[str] = set()
        self._closed = False
        self.images = MemoryImages()
        self.tokens = MemoryTokens()

    def _session(self, session_id: str) -> _MemorySession:
        if self._closed:
            raise StoreClosed("the memory store is closed")
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"no session {session_id}", session_id=session_id) from None

    async def create_session(self, info: SessionInfo, context: Context, writes: Sequence[Write] = ()) -> None:
        if self._closed:
            raise StoreClosed("the memory store is closed")
        if info.id in self._sessions:
            raise InvalidWrite(f"session {info.id} already exists", session_id=info.id)
        session = _MemorySession(info)
        _validate(session, writes)
        seqs = write_seqs(1, writes)
        for seq, write in zip(seqs, writes, strict=True):
            _apply(session, write, seq, now_ms())
        session.next_seq = seqs[-1] + 1 if seqs else 1
        self._sessions[info.id] = session

    async def get_session(self, session_id: str, context: Context) -> SessionInfo | None:
        found = self._sessions.get(session_id)
        return found.info if found else None

    async def list_sessions(self, context: Context) -> list[SessionInfo]:
        return sorted((s.info for s in self._sessions.values()), key=lambda i: (i.created_at, i.id))

    async def delete_session(self, session_id: str, context: Context) -> None:
        if self._session(session_id).claimed:
            raise SessionOwned(f"session {session_id} is owned", session_id=session_id)
        del self._sessions[session_id]

    async def get_entries(self, session_id: str, ids: Sequence[str], context: Context) -> dict[str, EntryRow]:
        entries = self._session(session_id).entries
        return {i: entries[i] for i in ids if i in entries}

    async def read_entries(
        self, session_id: str, after_seq: int | None, limit: int, context: Context
    ) -> list[EntryRow]:
        rows = sorted(self._session(session_id).entries.values(), key=lambda row: row.seq)
        return [row for row in rows if after_seq is None or row.seq > after_seq][:limit]

    async def walk_branch(
        self, session_id: str, start: str, limit: int, stop_at_compaction: bool, context: Context
    ) -> list[EntryRow]:
        entries = self._session(session_id).entries
        path: list[EntryRow] = []
        current: str | None = start
        while current is not None and len(path) < limit:
            row = entries.get(current)
            if row is None:
                break
            path.append(row)
            if stop_at_compaction and row.type == "compaction":
                break
            current = row.parent_id
        return path

    async def get_value(self, session_id: str, namespace: str, key: str, context: Context) -> ValueRow | None:
        return self._session(session_id).values.get((namespace, key))

    async def scan_values(
        self, session_id: str, namespace: str, key_prefix: str, context: Context
    ) -> list[ValueRow]:
        values = self._session(session_id).values
        found = [v for (ns, key), v in values.items() if ns == namespace and key.startswith(key_prefix)]
        return sorted(found, key=lambda v: v.key)

    async def values_across(self, namespace: str, key: str, context: Context) -> dict[str, ValueRow]:
        if self._closed:
            raise StoreClosed("the memory store is closed")
        return {session_id: session.values[(namespace, key)] for session_id, session in self._sessions.items()
                if (namespace, key) in session.values}

    async def read_list(
        self, session_id: str, namespace: str, key: str, after_seq: int | None, limit: int, context: Context
    ) -> list[ValueRow]:
        items = self._session(session_id).lists.get((namespace, key), [])
        return [i for i in items if after_seq is None or i.seq > after_seq][:limit]

    async def list_bounds(
        self, session_id: str, namespace: str, key: str, context: Context
    ) -> tuple[int, int] | None:
        items = self._session(session_id).lists.get((namespace, key))
        return (items[0].seq, items[-1].seq) if items else None

    async def read_usage(
        self, session_id: str, after_seq: int | None, limit: int, context: Context
    ) -> list[UsageRowRaw]:
        rows = sorted(self._session(session_id).usage.values(), key=lambda r: r.seq)
        return [r for r in rows if after_seq is None or r.seq > after_seq][:limit]

    async def read_many(self, session_id: str, reads: Sequence[Read], context: Context) -> list[ReadAnswer]:
        return await read_each(self, session_id, reads, context)

    async def commit(
        self, session_id: str, writes: Sequence[Write], claim: Claim | None, context: Context
    ) -> CommitResult:
        session = self._session(session_id)
        if claim is not None and (not session.claimed or session.epoch != claim.epoch):
            raise OwnershipLost(f"session {session_id} is no longer owned by this claim", session_id=session_id)
        if claim is None and session.claimed:
            raise SessionOwned(f"session {session_id} is owned", session_id=session_id)
        return _commit(session, writes)

    async def post(self, session_id: str, writes: Sequence[SetValue], context: Context) -> CommitResult:
        session = self._session(session_id)
        return _commit(session, writes)

    def connection_use(self) -> ConnectionUse:
        """The claims held; a memory store opens no connections."""
        return ConnectionUse(claims=sum(session.claimed for session in self._sessions.values()))

    async def claim(self, session_id: str, context: Context) -> Claim:
        session = self._session(session_id)
        if session.claimed:
            raise SessionOwned(f"session {session_id} is owned", session_id=session_id)
        session.claimed = True
        session.epoch += 1
        return MemoryClaim(session_id, session.epoch)

    async def release(self, claim: Claim, context: Context) -> None:
        session = self._sessions.get(claim.session_id)
        if session is not None and session.epoch == claim.epoch:
            session.claimed = False

    async def held(self, session_id: str, context: Context) -> bool:
        """Whether a claim holds the session: every claim of a memory store is of this process."""
        if self._closed:
            raise StoreClosed("the memory store is closed")
        session = self._sessions.get(session_id)
        return session is not None and session.claimed

    async def run_data_migration(self, migration: DataMigration, context: Context) -> bool:
        if migration.name in self._applied_migrations:
            return False
        changed: list[tuple[_MemorySession, EntryRow, str]] = []
        copies: list[tuple[_MemorySession, ValueRow, str]] = []
        for session in self._sessions.values():
            for row in session.entries.values():
                payload = migration.apply(row.id, row.payload)
                if payload is not None:
                    changed.append((session, row, payload))
            for value_row in session.values.values():
                value = migration.apply_to_value(value_row.namespace, value_row.key, value_row.value)
                if value is not None:
                    copies.append((session, value_row, value))
        for session, row, payload in changed:
            session.entries[row.id] = replace(row, payload=payload)
        for session, value_row, value in copies:
            session.values[(value_row.namespace, value_row.key)] = replace(value_row, value=value)
        self._applied_migrations.add(migration.name)
        return True

    async def close(self) -> None:
        self._closed = True


def _commit(session: _MemorySession, writes: Sequence[Write]) -> CommitResult:
    _validate(session, writes)
    timestamp = now_ms()
    first = session.next_seq
    seqs = write_seqs(first, writes)
    for seq, write in zip(seqs, writes, strict=True):
        _apply(session, write, seq, timestamp)
    session.next_seq = seqs[-1] + 1 if seqs else first
    session.info = replace(session.info, updated_at=timestamp)
    return CommitResult(seqs, timestamp)


def _validate(session: _MemorySession, writes: Sequence[Write]) -> None:
    staged_ids: set[str] = set()
    staged_entries: set[str] = set()
    for write in writes:
        if isinstance(write, InsertEntry | InsertUsage):
            if write.id in session.entries or write.id in session.usage or write.id in staged_ids:
                raise InvalidWrite(f"id {write.id} is already used in this session", id=write.id)
            staged_ids.add(write.id)
        if (
            isinstance(write, InsertEntry)
            and write.parent_id is not None
            and write.parent_id not in session.entries
            and write.parent_id not in staged_entries
        ):
            raise InvalidWrite(f"parent {write.parent_id} of entry {write.id} does not exist",
                               id=write.id, parent_id=write.parent_id)
        if isinstance(write, InsertEntry):
            staged_entries.add(write.id)


def _apply(session: _MemorySession, write: Write, seq: int, timestamp: int) -> None:
    match write:
        case InsertEntry():
            session.entries[write.id] = EntryRow(write.id, write.parent_id, seq, timestamp, write.type, write.payload)
        case InsertUsage():
            session.usage[write.id] = UsageRowRaw(write.id, seq, write.entry_id, write.adjustment, write.usage,
                                                  write.details)
        case SetValue():
            session.values[(write.namespace, write.key)] = ValueRow(write.namespace, write.key, seq, write.value)
        case DeleteValue():
            session.values.pop((write.namespace, write.key), None)
        case AppendList():
            row = ValueRow(write.namespace, write.key, seq, write.value)
            session.lists.setdefault((write.namespace, write.key), []).append(row)
        case DeleteList():
            session.lists.pop((write.namespace, write.key), None)
        case TrimList():
            items = session.lists.get((write.namespace, write.key))
            if items is not None:
                items[:] = [item for item in items if item.seq > write.through_seq]
