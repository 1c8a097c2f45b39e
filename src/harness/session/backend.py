"""What a storage backend offers the session layer: raw rows of JSON text, one commit per call.

Backends store payloads as JSON text (never as a JSON column type: PostgreSQL's jsonb rejects the
NUL character, which is data here). Decoding and typing happen above, in `harness.session.session`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from harness.context import Context
from harness.session.errors import StorageCorruption
from harness.session.images import ImageStore
from harness.session.migrations import DataMigration
from harness.session.tokens import TokenTable


@dataclass(frozen=True)
class SessionInfo:
    """A session's identity and provenance: where it was forked from, if anywhere. Times are Unix
    ms; `updated_at` is when the session last committed (its creation until then)."""

    id: str
    created_at: int
    parent_session_id: str | None = None
    forked_from_entry_id: str | None = None
    updated_at: int = 0


SESSION_TABLES = ("entries", "record_values", "list_items", "usage_ledger")
"""The SQL backends' tables that hold a session's rows besides `sessions` itself."""

SESSION_COLUMNS = "id, created_at, parent_session_id, forked_from_entry_id, updated_at"
"""The `sessions` columns that make a `SessionInfo`, in its field order."""


@dataclass(frozen=True)
class EntryRow:
    id: str
    parent_id: str | None
    seq: int
    timestamp: int
    type: str
    payload: str


@dataclass(frozen=True)
class ValueRow:
    namespace: str
    key: str
    seq: int
    value: str


@dataclass(frozen=True)
class UsageRowRaw:
    id: str
    seq: int
    entry_id: str | None
    adjustment: bool
    usage: str
    details: str | None


@dataclass(frozen=True)
class InsertEntry:
    id: str
    parent_id: str | None
    type: str
    custom_type: str | None
    payload: str


@dataclass(frozen=True)
class InsertUsage:
    id: str
    entry_id: str | None
    adjustment: bool
    usage: str
    details: str | None


@dataclass(frozen=True)
class SetValue:
    namespace: str
    key: str
    value: str


@dataclass(frozen=True)
class DeleteValue:
    namespace: str
    key: str


@dataclass(frozen=True)
class AppendList:
    """Append an item that takes `span` consecutive seqs, its own being the last of them: an item
    that stands for several numbered parts (a batch of a lane's events, each with its own id)."""

    namespace: str
    key: str
    value: str
    span: int = 1


@dataclass(frozen=True)
class DeleteList:
    namespace: str
    key: str


@dataclass(frozen=True)
class TrimList:
    """Delete a list's items whose seq is at most `through_seq`."""

    namespace: str
    key: str
    through_seq: int


Write = InsertEntry | InsertUsage | SetValue | DeleteValue | AppendList | DeleteList | TrimList


@dataclass(frozen=True)
class ValueRead:
    """`Backend.read_many`'s `get_value`: the answer is a `ValueRow` or None."""

    namespace: str
    key: str


@dataclass(frozen=True)
class ScanRead:
    """`Backend.read_many`'s `scan_values`: the answer is a list of `ValueRow`s, keys ascending."""

    namespace: str
    key_prefix: str


@dataclass(frozen=True)
class ListRead:
    """`Backend.read_many`'s `read_list`: the answer is a list of `ValueRow`s, seqs ascending."""

    namespace: str
    key: str
    after_seq: int | None
    limit: int


@dataclass(frozen=True)
class BoundsRead:
    """`Backend.read_many`'s `list_bounds`: the answer is `(oldest, newest)` seqs or None."""

    namespace: str
    key: str


@dataclass(frozen=True)
class EntriesRead:
    """`Backend.read_many`'s `get_entries`: the answer is a dict of `EntryRow`s by id."""

    ids: tuple[str, ...]


Read = ValueRead | ScanRead | ListRead | BoundsRead | EntriesRead
ReadAnswer = ValueRow | list[ValueRow] | tuple[int, int] | dict[str, EntryRow] | None
"""What one `Read` answers, by its kind (each kind's docstring says which)."""


async def read_each(backend: Backend, session_id: str, reads: Sequence[Read], context: Context) -> list[ReadAnswer]:
    """`Backend.read_many` made of the backend's single reads, one after another: for a backend
    whose reads cost no round trip (memory), or a wrapper that sees each read."""
    answers: list[ReadAnswer] = []
    for read in reads:
        if isinstance(read, ValueRead):
            answers.append(await backend.get_value(session_id, read.namespace, read.key, context))
        elif isinstance(read, ScanRead):
            answers.append(await backend.scan_values(session_id, read.namespace, read.key_prefix, context))
        elif isinstance(read, ListRead):
            answers.append(await backend.read_list(session_id, read.namespace, read.key, read.after_seq, read.limit,
                                                   context))
        elif isinstance(read, BoundsRead):
            answers.append(await backend.list_bounds(session_id, read.namespace, read.key, context))
        else:
            answers.append(await backend.get_entries(session_id, read.ids, context))
    return answers


@dataclass(frozen=True)
class CommitResult:
    """`seqs[i]` is the seq of write i (strictly increasing, session-wide); `timestamp` in Unix ms."""

    seqs: tuple[int, ...]
    timestamp: int


def write_seqs(first: int, writes: Sequence[Write]) -> tuple[int, ...]:
    """The seq of each write of a commit whose first seq is `first`: one seq per write, an
    `AppendList` the last of its `span`. The session's next seq follows the last of them."""
    seqs: list[int] = []
    seq = first - 1
    for write in writes:
        seq += write.span if isinstance(write, AppendList) else 1
        seqs.append(seq)
    return tuple(seqs)


def seq_already_held(session_id: str, seq: int) -> StorageCorruption:
    """The error for a commit whose write takes seq `seq`, which a stored row already holds: every
    seq a commit takes is past the session's counter, so the counter was moved back outside the
    journal (a hand edit, a restored table). Nothing of the commit lands."""
    return StorageCorruption(f"session {session_id}: seq {seq} is already held by a stored row, so its seq "
                             "counter is behind its rows: the database was changed outside the journal",
                             session_id=session_id, seq=seq)


class Claim(Protocol):
    """A live ownership claim: the process lock plus the epoch it bumped."""

    @property
    def session_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...


@dataclass(frozen=True)
class ConnectionUse:
    """What a store holds open now: `claims`, the sessions it owns (each a PostgreSQL connection
    of its own, or a lock on the SQLite file), and on PostgreSQL its read pool's `pooled`
    connections, how many of them are `idle`, and `waiting`, the requests waiting for one."""

    claims: int
    pooled: int = 0
    idle: int = 0
    waiting: int = 0


class Backend(Protocol):
    """One database holding many sessions. Every method is one round trip (SQLite: one hop to
    its thread, or a quick commit on the caller's); `commit` is one transaction, all or nothing."""

    @property
    def kind(self) -> Literal["memory", "sqlite", "postgres"]: ...

    @property
    def images(self) -> ImageStore:
        """The store's images, kept beside its sessions (see `harness.session.images`)."""
        ...

    @property
    def tokens(self) -> TokenTable:
        """The store's bearer-token rows (see `harness.session.tokens`)."""
        ...

    async def create_session(self, info: SessionInfo, context: Context, writes: Sequence[Write] = ()) -> None:
        """Create the session and apply `writes` to it, in one transaction (a fork is never half
        made); `InvalidWrite` if the id is taken."""
        ...

    async def get_session(self, session_id: str, context: Context) -> SessionInfo | None: ...

    async def list_sessions(self, context: Context) -> list[SessionInfo]: ...

    async def delete_session(self, session_id: str, context: Context) -> None:
        """Delete the session and all it holds (entries, records, list items such as frames, usage
        rows) in one transaction. `SessionOwned` while an owner holds it (nothing is deleted),
        `SessionNotFound` if there is no such session."""
        ...

    async def get_entries(self, session_id: str, ids: Sequence[str], context: Context) -> dict[str, EntryRow]:
        ...

    async def read_entries(
        self, session_id: str, after_seq: int | None, limit: int, context: Context
    ) -> list[EntryRow]:
        """Every entry of the session in seq order after `after_seq` (exclusive), at most `limit`:
        off-branch ones too (exports, audits)."""
        ...

    async def walk_branch(
        self, session_id: str, start: str, limit: int, stop_at_compaction: bool, context: Context
    ) -> list[EntryRow]:
        """Entries from `start` towards the root, newest first, at most `limit`; with
        `stop_at_compaction` the walk ends after the first compaction entry it includes."""
        ...

    async def get_value(self, session_id: str, namespace: str, key: str, context: Context) -> ValueRow | None:
        ...

    async def scan_values(
        self, session_id: str, namespace: str, key_prefix: str, context: Context
    ) -> list[ValueRow]:
        """Values in `namespace` whose key starts with `key_prefix`, keys ascending."""
        ...

    async def values_across(self, namespace: str, key: str, context: Context) -> dict[str, ValueRow]:
        """The value at (`namespace`, `key`) of every session that has one, by session id: one
        query, where reading each session would be two per session."""
        ...

    async def read_list(
        self, session_id: str, namespace: str, key: str, after_seq: int | None, limit: int, context: Context
    ) -> list[ValueRow]:
        """List items in seq order after `after_seq` (exclusive), at most `limit`."""
        ...

    async def list_bounds(
        self, session_id: str, namespace: str, key: str, context: Context
    ) -> tuple[int, int] | None:
        """The seqs of a list's oldest and newest items; None when it holds none."""
        ...

    async def read_usage(
        self, session_id: str, after_seq: int | None, limit: int, context: Context
    ) -> list[UsageRowRaw]: ...

    async def read_many(self, session_id: str, reads: Sequence[Read], context: Context) -> list[ReadAnswer]:
        """The answers of `reads`, in their order, made together: one statement on PostgreSQL
        (one snapshot), one hop to SQLite's thread. Each read sees at least every commit the read
        before it saw, so a reader that orders its reads as it would one by one keeps its
        reasoning (issue 29: a lane's follow read its log, bounds, floor and state in seven round
        trips per commit)."""
        ...

    def commit(
        self, session_id: str, writes: Sequence[Write], claim: Claim | None, context: Context
    ) -> Awaitable[CommitResult]:
        """Apply `writes` in order as one transaction. With `claim`, the claim's epoch must still
        be current (else `OwnershipLost`); without, no live owner may hold the session (else
        `SessionOwned`). Checks id uniqueness and parent existence (`InvalidWrite`).

        An awaitable rather than a coroutine: a backend that runs on a thread hands back that
        thread's future, which saves a task and a loop step on every commit."""
        ...

    def post(self, session_id: str, writes: Sequence[SetValue], context: Context) -> Awaitable[CommitResult]:
        """Set values in one transaction whether or not an owner holds the session: requests from
        other processes, which the owner takes and deletes itself (`Session.post_request`).
        `SessionNotFound` for an unknown session."""
        ...

    async def claim(self, session_id: str, context: Context) -> Claim:
        """Take the session's process lock and bump its epoch; `SessionOwned` if held."""
        ...

    async def release(self, claim: Claim, context: Context) -> None: ...

    async def held(self, session_id: str, context: Context) -> bool:
        """Whether a claim holds the session now, as its lock shows it: taking nothing and
        bumping no epoch (`SessionReader.held`). False for an unknown session."""
        ...

    def connection_use(self) -> ConnectionUse:
        """What this backend holds open now (`ConnectionUse`), for a server's metrics (issue 29)."""
        ...

    async def run_data_migration(self, migration: DataMigration, context: Context) -> bool:
        """In one transaction: unless `migration.name` is recorded, rewrite every entry payload it
        changes (`DataMigration.apply`) and every record value in `COPY_NAMESPACES` it changes
        (`DataMigration.apply_to_value`), and record it. True when it ran now."""
        ...

    async def close(self) -> None: ...
