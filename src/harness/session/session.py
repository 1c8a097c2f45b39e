"""Session, its reader and its mutator: the typed face of one journal over a backend.

Every mutation runs as a job on the session line (one FIFO per session per process); a job's
staged writes commit as one transaction. Reads bypass the line and see the latest commit.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from pydantic import JsonValue, TypeAdapter
from pydantic_core import PydanticSerializationError

from harness.context import Context, check_context
from harness.errors import ContextNotStorable, InvalidInput
from harness.messages import Usage, clean_json, clean_text
from harness.session import addresses
from harness.session.addresses import ListAddress, ValueAddress
from harness.session.backend import (
    AppendList,
    Backend,
    BoundsRead,
    Claim,
    CommitResult,
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
    ValueRead,
    ValueRow,
    Write,
)
from harness.session.entries import ENTRY_PAYLOAD_ADAPTER, BranchPage, Entry, EntryPayload, custom_type_of
from harness.session.errors import (
    InvalidWrite,
    LaneExists,
    RecordTooLarge,
    ReentrantMutation,
    SessionOwned,
    StorageCorruption,
    UnknownEntry,
)
from harness.session.ids import new_id
from harness.session.records import LaneConfig, LaneRequest, LaneState, UsageRow
from harness.session.round_trip import always_reads_back

T = TypeVar("T")
R = TypeVar("R")

# A scan's first query reads a short page, so one that stops early (a turn back) reads little; each
# next page is four times larger, up to the bound, so a whole branch takes a few queries. A page
# read (`read_branch`) is one query. The bound makes a parent cycle in a damaged file end.
_FIRST_PAGE, _LAST_PAGE = 256, 16_384
_USAGE_ADAPTER: TypeAdapter[Usage] = TypeAdapter(Usage)
_JSON_ADAPTER: TypeAdapter[JsonValue] = TypeAdapter(JsonValue)


@dataclass(frozen=True)
class StoredValue(Generic[T]):
    """A value with the seq of the commit that set it (a stored `None` is not an absent value)."""

    value: T
    seq: int


@dataclass(frozen=True)
class ListItem(Generic[T]):
    item: T
    seq: int


MAX_RECORD_BYTES = 64 * 1024 * 1024
"""The most one record (an entry's payload, a value, a list item) may take as stored (UTF-8 JSON),
on every backend: whatever a writer hands the journal, no reader has to decode more than this at
once. Sixteen times the largest input the runtime accepts, so a compaction's verbatim tail of
recent messages with their images fits; far below what SQLite (1e9 bytes) and PostgreSQL (1 GB)
could store, which no process would read back without ballooning."""


_LONG_DIGITS = 1_000
_LONG_NUMBER = re.compile(rb"[0-9]{%d}" % _LONG_DIGITS)
"""A run of digits long enough to be a number the JSON reader may refuse (it takes 4,300 digits at
most); one inside a string only costs a record its read-back."""


def encode(adapter: TypeAdapter[T], value: T) -> str:
    """Validate (cleaning text) and encode `value` as JSON text; a Context inside fails loudly,
    and a value whose JSON takes more than `MAX_RECORD_BYTES` is refused (`RecordTooLarge`)."""
    if _contains_context(value):
        raise ContextNotStorable("a Context is per-invocation and is never written to the journal (HA-22)")
    # The adapter's core validator and serializer, called directly: the adapter's own methods
    # add a Python frame and their keyword defaults to each of a turn's two dozen records.
    validator, serializer = adapter.validator, adapter.serializer
    read_back = not always_reads_back(adapter)
    try:
        validated = validator.validate_python(value)
        try:
            # No type checks while dumping (they cost more than reading a small record back): a
            # record was validated when it was built, and any other value is read back below.
            encoded = serializer.to_json(validated, warnings=False)
        except PydanticSerializationError:
            # Text that does not clean itself (a lone surrogate in a plain `str`): clean the JSON
            # form and validate it again (lax: a tuple is a list there); rare, so read back too.
            cleaned = clean_json(adapter.dump_python(validated, mode="json", warnings=False))
            encoded = adapter.dump_json(adapter.validate_python(cleaned, strict=False), warnings="error")
            read_back = True
        if len(encoded) > MAX_RECORD_BYTES:
            raise RecordTooLarge(f"the record would take {len(encoded):,} bytes; the journal keeps at most "
                                 f"{MAX_RECORD_BYTES:,} in one", bytes=len(encoded), limit_bytes=MAX_RECORD_BYTES)
        text = encoded.decode()
        if read_back or (len(encoded) > _LONG_DIGITS and _LONG_NUMBER.search(encoded)):
            # A model that is not a `Record` may have been built with `model_construct` or
            # `model_copy(update=...)` and hold anything, and the JSON reader refuses an int of
            # more than 4,300 digits: read the text back as every reader will, so a write never
            # stores what its own reader refuses.
            validator.validate_json(text)
    except RecordTooLarge:
        raise
    except (ValueError, RecursionError) as error:  # pydantic's errors, a depth or an encoding error
        raise InvalidInput(f"value does not fit its record type: {error}") from error
    return text


def _contains_context(value: object) -> bool:
    pending = [value]  # iterative: a hostile depth must not exhaust the interpreter stack
    while pending:
        item = pending.pop()
        if isinstance(item, Context):
            return True
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False


def decode_entry(row: EntryRow) -> Entry:
    """Decode a stored entry row; `StorageCorruption` naming the entry if it no longer decodes."""
    try:
        payload = ENTRY_PAYLOAD_ADAPTER.validate_json(row.payload)
    except ValueError as error:
        raise StorageCorruption(f"entry {row.id} does not decode: {error}", entry_id=row.id) from error
    if payload.type != row.type:
        raise StorageCorruption(f"entry {row.id} is stored as {row.type} but holds {payload.type}",
                                entry_id=row.id)
    return Entry(id=row.id, parent_id=row.parent_id, seq=row.seq, timestamp=row.timestamp, payload=payload)


def decode_value(adapter: TypeAdapter[T], text: str, where: str) -> T:
    try:
        return adapter.validate_json(text)
    except ValueError as error:
        raise StorageCorruption(f"{where} does not decode: {error}", address=where) from error


def check_lane_name(name: str) -> None:
    """`InvalidInput` unless `name` is non-empty text a backend can store."""
    if not name or not storable_identifier(name):
        raise InvalidInput("a lane name must be non-empty text without NUL or lone surrogates", lane=name)


def storable_identifier(identifier: object) -> bool:
    """Whether `identifier` can name a session, entry, lane or record on every backend.

    Identifiers are text columns; PostgreSQL cannot hold NUL or a lone surrogate in one, so no
    backend stores them, and reads of them find nothing."""
    return isinstance(identifier, str) and "\x00" not in identifier and clean_text(identifier) == identifier


_IDENTIFIER_FIELDS: dict[type[Write], tuple[str, ...]] = {
    InsertEntry: ("id", "parent_id"), InsertUsage: ("id", "entry_id"),
    **dict.fromkeys([SetValue, DeleteValue, AppendList, DeleteList, TrimList], ("namespace", "key")),
}
"""The fields of each kind of write that name something, which `_check_identifier` checks."""


def storable_address(address: ValueAddress[Any] | ListAddress[Any]) -> bool:
    """Whether a backend can store what `address` names (`storable_identifier`): reads of one it
    cannot find nothing, without a read."""
    return storable_identifier(address.namespace) and storable_identifier(address.key)


def _check_identifier(name: str, value: str | None) -> None:
    empty = not value and name != "key"  # the key of a namespace's single value is ""
    if value is not None and (empty or not storable_identifier(value)):
        raise InvalidWrite(f"{name} {value!r} must be non-empty text without NUL or lone surrogates",
                           field=name)


def _stored_value(address: ValueAddress[T], row: ValueRow | None) -> StoredValue[T] | None:
    if row is None:
        return None
    return StoredValue(decode_value(address.adapter, row.value, f"{address.namespace}/{address.key}"), row.seq)


def _list_items(address: ListAddress[T], rows: list[ValueRow]) -> list[ListItem[T]]:
    where = f"{address.namespace}/{address.key}"
    return [ListItem(decode_value(address.adapter, r.value, where), r.seq) for r in rows]


def _entries(rows: dict[str, EntryRow]) -> dict[str, Entry]:
    return {i: decode_entry(r) for i, r in rows.items()}


class Answer(Generic[T]):
    """What one read of a `ReadBatch` found: `value`, once the batch has run."""

    def __init__(self, decode: Callable[[ReadAnswer], T] | None = None, *, empty: T | None = None) -> None:
        self._decode = decode
        self._value = empty  # a read of something no backend can store finds nothing, unread
        self._ready = decode is None

    @property
    def value(self) -> T:
        """The answer; `RuntimeError` before the batch has run."""
        if not self._ready:
            raise RuntimeError("a batch's answers are there once it has run")
        return cast(T, self._value)

    def _take(self, raw: ReadAnswer) -> None:
        assert self._decode is not None
        self._value, self._ready = self._decode(raw), True


class ReadBatch:
    """Reads of one session queued together (`SessionReader.batch`) and made at `run` in one go:
    one statement on PostgreSQL (so one snapshot), one hop to SQLite's thread (issue 29). Callers
    may count on no more than reads made one by one in the order queued: each sees at least every
    commit the one before saw. Each queuing method returns an `Answer` whose `value` the run
    fills, decoded as the matching `SessionReader` method decodes it (`StorageCorruption` from
    `run`)."""

    def __init__(self, backend: Backend, session_id: str) -> None:
        self._backend = backend
        self._session_id = session_id
        self._reads: list[tuple[Read, Answer[Any]]] = []

    def get(self, address: ValueAddress[T]) -> Answer[T | None]:
        """`SessionReader.get`."""
        return self._value(address, lambda record: record.value if record else None)

    def get_record(self, address: ValueAddress[T]) -> Answer[StoredValue[T] | None]:
        """`SessionReader.get_record`."""
        return self._value(address, lambda record: record)

    def _value(self, address: ValueAddress[T], pick: Callable[[StoredValue[T] | None], R]) -> Answer[R]:
        if not storable_address(address):
            return Answer(empty=pick(None))
        return self._queue(ValueRead(address.namespace, address.key),
                           lambda raw: pick(_stored_value(address, cast(ValueRow | None, raw))))

    def scan_values(self, address: ValueAddress[T]) -> Answer[list[tuple[str, T]]]:
        """`SessionReader.scan_values`."""
        if not storable_address(address):
            return Answer(empty=[])
        def decode(raw: ReadAnswer) -> list[tuple[str, T]]:
            return [(row.key, decode_value(address.adapter, row.value, f"{row.namespace}/{row.key}"))
                    for row in cast("list[ValueRow]", raw)]
        return self._queue(ScanRead(address.namespace, address.key), decode)

    def read_list(self, address: ListAddress[T], *, after_seq: int | None = None,
                  limit: int = 1000) -> Answer[list[ListItem[T]]]:
        """`SessionReader.read_list`."""
        if not storable_address(address):
            return Answer(empty=[])
        read = ListRead(address.namespace, address.key, after_seq, max(1, min(limit, 10_000)))
        return self._queue(read, lambda raw: _list_items(address, cast(list[ValueRow], raw)))

    def list_bounds(self, address: ListAddress[Any]) -> Answer[tuple[int, int] | None]:
        """`SessionReader.list_bounds`."""
        if not storable_address(address):
            return Answer(empty=None)
        return self._queue(BoundsRead(address.namespace, address.key), lambda raw: cast("tuple[int, int] | None", raw))

    def entries(self, entry_ids: Sequence[str]) -> Answer[dict[str, Entry]]:
        """`SessionReader.entries`."""
        ids = tuple(i for i in entry_ids if storable_identifier(i))
        if not ids:
            return Answer(empty={})
        return self._queue(EntriesRead(ids), lambda raw: _entries(cast("dict[str, EntryRow]", raw)))

    def _queue(self, read: Read, decode: Callable[[ReadAnswer], T]) -> Answer[T]:
        answer = Answer(decode)
        self._reads.append((read, answer))
        return answer

    async def run(self, context: Context) -> None:
        """Make the reads queued since the last run, and fill their answers."""
        queued, self._reads = self._reads, []
        if not queued:
            return
        raws = await self._backend.read_many(self._session_id, [read for read, _ in queued], context)
        for (_, answer), raw in zip(queued, raws, strict=True):
            answer._take(raw)


class SessionReader:
    """Reads of one session's journal. Every read sees the latest fully applied commit; several
    reads are not a snapshot (decide and write inside `Session.mutate` instead)."""

    def __init__(self, backend: Backend, info: SessionInfo) -> None:
        self._backend = backend
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    async def entry(self, entry_id: str, context: Context) -> Entry | None:
        if not storable_identifier(entry_id):
            return None
        rows = await self._backend.get_entries(self.id, [entry_id], context)
        row = rows.get(entry_id)
        return decode_entry(row) if row else None

    async def entries(self, entry_ids: Sequence[str], context: Context) -> dict[str, Entry]:
        """The entries with these ids that exist, keyed by id."""
        rows = await self._backend.get_entries(self.id, [i for i in entry_ids if storable_identifier(i)], context)
        return _entries(rows)

    async def read_entries(
        self, context: Context, *, after_seq: int | None = None, limit: int = 1000
    ) -> list[Entry]:
        """One page of every entry of the session, branch or not, in commit order after
        `after_seq`; `limit` is clamped to 10,000. Continue with the last entry's seq."""
        rows = await self._backend.read_entries(self.id, after_seq, max(1, min(limit, 10_000)), context)
        return [decode_entry(row) for row in rows]

    async def get(self, address: ValueAddress[T], context: Context) -> T | None:
        """The value at `address`, or None when absent (use `get_record` to tell a stored None)."""
        record = await self.get_record(address, context)
        return record.value if record else None

    async def get_record(self, address: ValueAddress[T], context: Context) -> StoredValue[T] | None:
        if not storable_address(address):
            return None
        return _stored_value(address, await self._backend.get_value(self.id, address.namespace, address.key, context))

    async def scan_values(self, address: ValueAddress[T], context: Context) -> list[tuple[str, T]]:
        """Every `(key, value)` in `address.namespace` whose key starts with `address.key`."""
        return [(key, record.value) for key, record in await self.scan_records(address, context)]

    async def scan_records(self, address: ValueAddress[T], context: Context, *,
                           undecodable: Callable[[str, StorageCorruption], None] | None = None
                           ) -> list[tuple[str, StoredValue[T]]]:
        """`scan_values` with each value's seq: the commit that set it, so callers can order by it.
        A value that does not decode raises `StorageCorruption`, or, with `undecodable`, is
        passed to it by key and left out (a record another version wrote, say)."""
        if not storable_address(address):
            return []
        rows = await self._backend.scan_values(self.id, address.namespace, address.key, context)
        found = []
        for r in rows:
            try:
                found.append((r.key, StoredValue(decode_value(address.adapter, r.value, f"{r.namespace}/{r.key}"),
                                                 r.seq)))
            except StorageCorruption as error:
                if undecodable is None:
                    raise
                undecodable(r.key, error)
        return found

    async def lanes(self, context: Context) -> list[str]:
        """Names of the lanes that have a branch tip, ascending."""
        rows = await self._backend.scan_values(self.id, addresses.BRANCH_TIP_NAMESPACE, "", context)
        return [r.key for r in rows]

    async def read_list(
        self, address: ListAddress[T], context: Context, *, after_seq: int | None = None, limit: int = 1000
    ) -> list[ListItem[T]]:
        """One page of list items in commit order after `after_seq`; `limit` is clamped to 10,000."""
        if not storable_address(address):
            return []
        rows = await self._backend.read_list(
            self.id, address.namespace, address.key, after_seq, max(1, min(limit, 10_000)), context
        )
        return _list_items(address, rows)

    def batch(self) -> ReadBatch:
        """Several reads of this session made together (`ReadBatch`): one round trip on
        PostgreSQL, one hop to SQLite's thread, where each read alone costs one."""
        return ReadBatch(self._backend, self.id)

    async def list_bounds(self, address: ListAddress[Any], context: Context) -> tuple[int, int] | None:
        """The seqs of the list's oldest and newest items; None when it holds none."""
        if not storable_address(address):
            return None
        return await self._backend.list_bounds(self.id, address.namespace, address.key, context)

    async def usage_ledger(
        self, context: Context, *, after_seq: int | None = None, limit: int = 1000
    ) -> list[UsageRow]:
        """Usage rows in commit order after `after_seq`."""
        rows = await self._backend.read_usage(self.id, after_seq, max(1, min(limit, 10_000)), context)
        return [
            UsageRow(
                id=r.id,
                seq=r.seq,
                usage=decode_value(_USAGE_ADAPTER, r.usage, f"usage/{r.id}"),
                entry_id=r.entry_id,
                adjustment=r.adjustment,
                details=decode_value(_JSON_ADAPTER, r.details, f"usage/{r.id}") if r.details else None,
            )
            for r in rows
        ]

    async def scan_branch(
        self, tip: str, visit: Callable[[Entry], bool | None], context: Context
    ) -> None:
        """Visit the entries from `tip` towards the root, newest first, stopping after the newest
        compaction entry (HA-29), or early when `visit` returns False.

        Reads nothing older than that compaction, so the cost is O(entries since it), not
        O(history). Raises `StorageCorruption` if an entry on the path is missing or cannot be
        decoded; never stops early silently."""
        async for entry in self._walk(tip, stop_at_compaction=True, limit=None, context=context):
            if visit(entry) is False:
                return

    async def read_branch(
        self, tip: str, context: Context, *, before: str | None = None, limit: int = 200
    ) -> BranchPage:
        """One page of the whole branch ending at `tip`, newest first, past compactions too; for
        displays and exports. Pass the page's `next_before` as `before` for the older page."""
        start = before if before is not None else tip
        page: list[Entry] = []
        async for entry in self._walk(start, stop_at_compaction=False, limit=max(1, limit), context=context):
            page.append(entry)
        next_before = page[-1].parent_id if page else None
        return BranchPage(entries=page, next_before=next_before)

    async def _walk(
        self, start: str, *, stop_at_compaction: bool, limit: int | None, context: Context
    ) -> AsyncIterator[Entry]:
        current: str | None = start
        remaining = limit
        seen: set[str] = set()
        pages = _FIRST_PAGE
        while current is not None and (remaining is None or remaining > 0):
            context.raise_if_cancelled()
            # A page read asks for its whole page at once; a scan starts short and grows.
            page_size = pages if remaining is None else min(remaining, _LAST_PAGE)
            pages = min(pages * 4, _LAST_PAGE)
            rows = await self._backend.walk_branch(self.id, current, page_size, stop_at_compaction, context)
            if not rows and current == start:
                raise UnknownEntry(f"entry {start} does not exist in session {self.id}", entry_id=start)
            if not rows:
                raise StorageCorruption(f"entry {current} on the branch is missing", entry_id=current)
            for row in rows:
                if row.id in seen:  # a parent cycle would otherwise walk forever on the line
                    raise StorageCorruption(f"entry {row.id} is its own ancestor", entry_id=row.id)
                seen.add(row.id)
                yield decode_entry(row)
            last = rows[-1]
            if stop_at_compaction and last.type == "compaction":
                return
            if len(rows) < page_size and last.parent_id is not None:
                raise StorageCorruption(
                    f"entry {last.id} names parent {last.parent_id}, which is missing",
                    entry_id=last.id, parent_id=last.parent_id,
                )
            current = last.parent_id
            if remaining is not None:
                remaining -= len(rows)


class SessionMutator(SessionReader):
    """Stages writes for one job; they commit together, once, in the order staged."""

    def __init__(self, backend: Backend, info: SessionInfo, claim: Claim | None, context: Context) -> None:
        super().__init__(backend, info)
        self._claim = claim
        self._context = context
        self._writes: list[Write] = []
        self._committed: CommitResult | None = None
        self._committing = False
        self._closed = False
        self.cancel_deferred = False

    @property
    def staged(self) -> int:
        return len(self._writes)

    def _stage(self, write: Write) -> None:
        if self._closed or self._committed is not None:
            raise InvalidWrite("this job has already committed or ended; stage writes before commit")
        if self._committing:
            raise InvalidWrite("this job is committing; stage writes before commit")
        for name in _IDENTIFIER_FIELDS[type(write)]:
            _check_identifier(name, getattr(write, name))
        self._writes.append(write)

    def insert_entry(self, payload: EntryPayload, *, parent_id: str | None, entry_id: str | None = None) -> str:
        """Stage a new entry under `parent_id` (None for a root); returns its id (minted if not given)."""
        entry_id = new_id() if entry_id is None else entry_id
        text = encode(ENTRY_PAYLOAD_ADAPTER, payload)
        self._stage(InsertEntry(entry_id, parent_id, payload.type, custom_type_of(payload), text))
        return entry_id

    def set(self, address: ValueAddress[T], value: T) -> None:
        self._stage(SetValue(address.namespace, address.key, encode(address.adapter, value)))

    def delete(self, address: ValueAddress[Any]) -> None:
        """Delete a value; deleting an absent value is a no-op."""
        self._stage(DeleteValue(address.namespace, address.key))

    def append(self, address: ListAddress[T], item: T, *, span: int = 1) -> None:
        """Stage `item` at the end of the list. It takes `span` consecutive seqs (its parts' ids,
        e.g. the events of one commit) and its own seq is the last of them; `InvalidWrite` for a
        span below 1."""
        if span < 1:
            raise InvalidWrite(f"a list item takes at least one seq, not {span}", span=span)
        self._stage(AppendList(address.namespace, address.key, encode(address.adapter, item), span))

    def delete_list(self, address: ListAddress[Any]) -> None:
        self._stage(DeleteList(address.namespace, address.key))

    def trim_list(self, address: ListAddress[Any], through_seq: int) -> None:
        """Delete the list's items whose seq is at most `through_seq` (a range of the list's key,
        so the cost is the items deleted, not the list's length)."""
        self._stage(TrimList(address.namespace, address.key, through_seq))

    def insert_usage(
        self,
        usage: Usage,
        *,
        usage_id: str | None = None,
        entry_id: str | None = None,
        adjustment: bool = False,
        details: JsonValue | None = None,
    ) -> str:
        """Stage a usage ledger row; its id shares the entry id namespace of the session."""
        usage_id = new_id() if usage_id is None else usage_id
        details_text = encode(_JSON_ADAPTER, details) if details is not None else None
        self._stage(InsertUsage(usage_id, entry_id, adjustment, encode(_USAGE_ADAPTER, usage), details_text))
        return usage_id

    async def commit(self) -> CommitResult:
        """Commit the staged writes as one transaction; at most once per job. Code after the
        await is the commit continuation and still runs on the session line."""
        if self._committing or self._closed:
            raise InvalidWrite("a job commits at most once")
        self._committing = True
        writes, self._writes = self._writes, []
        in_flight = asyncio.ensure_future(self._backend.commit(self.id, writes, self._claim, self._context))
        if in_flight.done():  # committed on this thread already: nothing to wait for or shield
            self._committed = in_flight.result()
            return self._committed
        while True:
            try:
                self._committed = await asyncio.shield(in_flight)
                break
            except asyncio.CancelledError:
                if in_flight.cancelled():
                    raise
                # The commit may land: wait for its outcome so the continuation (projection,
                # events) matches the journal, and deliver the cancellation after the job.
                self.cancel_deferred = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
        return self._committed

    def _end(self) -> None:
        self._closed = True
        self._writes = []


Job = Callable[[SessionMutator], Awaitable[R]]

OnCommitted = Callable[[CommitResult], Awaitable[None] | None]


class Session(SessionReader):
    """One durable journal. Mutations run one at a time, in FIFO order, on the session line.

    While attached (`attach`), only the owner's `SessionOwnership` may mutate (HA-4); between
    processes the claim is a lock that dies with its holder plus an epoch every commit checks."""

    def __init__(self, backend: Backend, info: SessionInfo, *, committed: Callable[[str], None] | None = None,
                 posted: Callable[[str], None] | None = None) -> None:
        """`committed(session_id)` is told after each job that committed (the store's change
        feed, so readers in this process wake at once), `posted(session_id)` after each request
        posted (the store's post feed, so its holder in this process takes it at once)."""
        super().__init__(backend, info)
        self._notify_committed = committed
        self._notify_posted = posted
        self._line = asyncio.Lock()
        self._line_task: asyncio.Task[Any] | None = None  # the task running the current job
        self._owner: object | None = None
        self._claim: Claim | None = None

    @property
    def owner(self) -> object | None:
        return self._owner

    async def mutate(self, job: Job[R], context: Context) -> R:
        """Run `job` on the session line and commit what it staged (unless it committed itself).

        An exception in the job commits nothing. Raises `SessionOwned` while a harness (or any
        owner) is attached here or in another process."""
        self._refuse_if_owned()
        return await self._run(job, None, context)

    async def create_lane(
        self,
        name: str,
        config: LaneConfig,
        context: Context,
        *,
        at: str | None = None,
        on_committed: OnCommitted | None = None,
    ) -> None:
        """Create lane `name` with its tip at entry `at` (None: an empty branch) and an idle state.

        `on_committed` runs right after the commit, on the line and without yielding (HA-15); if
        it returns an awaitable, that is awaited after the line is released."""
        self._refuse_if_owned()
        await self._create_lane(name, config, at, on_committed, None, context)

    async def post_request(self, request: LaneRequest, context: Context, *, request_id: str | None = None) -> str:
        """Leave `request` for whoever drives `request.lane`, owned here, in another process or by
        nobody yet, and return its id (`request_id`, else a new one; the same id posted again
        replaces the request, so a retried post is one request): one commit that no owner
        refuses, because the owner takes and deletes the request itself (`Lane.take_requests`)
        and reads nothing else of it. On PostgreSQL the store's listeners are woken in the same
        transaction (`WorkBoard.listen`). Raises `InvalidInput` for a request that does not fit
        its record type and `SessionNotFound` for a session that is gone."""
        request_id = request_id or new_id()
        address = addresses.lane_request(request_id)
        write = SetValue(address.namespace, address.key, encode(address.adapter, request))
        await self._backend.post(self.id, [write], context)
        if self._notify_posted is not None:
            self._notify_posted(self.id)
        return request_id

    async def attach(self, owner: object, context: Context) -> SessionOwnership:
        """Claim the session for `owner` until `detach`; `SessionOwned` if anyone holds it."""
        async with self._line:
            self._refuse_if_owned()
            claiming = asyncio.ensure_future(self._backend.claim(self.id, context))
            try:
                self._claim = await asyncio.shield(claiming)
            except asyncio.CancelledError:
                # The claim may still land in its thread: release it rather than leak it.
                if not claiming.cancelled():
                    try:
                        claim = await claiming
                    except Exception:
                        raise asyncio.CancelledError from None
                    await self._backend.release(claim, context)
                raise
            self._owner = owner
        return SessionOwnership(self, owner)

    async def detach(self, context: Context, *, owner: object | None = None) -> None:
        """Release the claim of `owner`, or of whoever holds it when None (as closing the store
        does for each open session); idempotent, and nothing happens if `owner` does not hold it."""
        async with self._line:
            if self._claim is None or (owner is not None and self._owner is not owner):
                return
            claim, self._claim, self._owner = self._claim, None, None
            await self._backend.release(claim, context)

    async def held(self, context: Context) -> bool:
        """Whether a claim holds the session now (HA-4), as the database's lock shows it: a
        claim of this session (`owner`), of another `Store` of this process and of another
        process all count, so a caller asking about other processes rules out its own first (a
        server its live conversations). It takes nothing and bumps no epoch: a holder goes on
        committing, and a claimant's `attach` at the same moment is not refused for it. A
        moment's answer: a claim may be taken or released right after. False for a session
        that is gone."""
        return await self._backend.held(self.id, context)

    def _refuse_if_owned(self) -> None:
        if self._owner is not None:
            raise SessionOwned(f"session {self.id} is owned by {self._owner!r}", session_id=self.id)

    async def _run(self, job: Job[R], claim: Claim | None, context: Context) -> R:
        if self._line_task is not None and asyncio.current_task() is self._line_task:
            raise ReentrantMutation(
                f"a job on session {self.id} started another mutation of it; that would wait on "
                "itself forever. Stage the writes in the running job instead.", session_id=self.id
            )
        check_context(context)
        context.raise_if_cancelled()
        async with self._line:
            context.raise_if_cancelled()  # cancelled while it waited: run nothing
            mutator = SessionMutator(self._backend, self.info, claim, context)
            self._line_task = asyncio.current_task()
            try:
                result = await job(mutator)
                if mutator.staged and not mutator._committing:
                    await mutator.commit()
            finally:
                self._line_task = None
                mutator._end()
                if mutator._committed is not None and self._notify_committed is not None:
                    self._notify_committed(self.id)
        if mutator.cancel_deferred:
            raise asyncio.CancelledError
        return result

    async def _create_lane(
        self,
        name: str,
        config: LaneConfig,
        at: str | None,
        on_committed: OnCommitted | None,
        claim: Claim | None,
        context: Context,
    ) -> None:
        check_lane_name(name)
        pending: list[Awaitable[None]] = []

        async def job(m: SessionMutator) -> None:
            if await m.get_record(addresses.branch_tip(name), context) is not None:
                raise LaneExists(f"lane {name} already exists", lane=name)
            if at is not None and await m.entry(at, context) is None:
                raise UnknownEntry(f"entry {at} does not exist", entry_id=at)
            m.set(addresses.branch_tip(name), at)
            m.set(addresses.lane_config(name), config)
            m.set(addresses.lane_state(name), LaneState())
            result = await m.commit()
            if on_committed is not None:
                delivery = on_committed(result)
                if inspect.isawaitable(delivery):
                    pending.append(delivery)

        await self._run(job, claim, context)
        for delivery in pending:
            await delivery


class SessionOwnership:
    """The owner's handle on an attached session: the only way to mutate it until `detach`."""

    def __init__(self, session: Session, owner: object) -> None:
        self.session = session
        self.owner = owner

    def _claim(self) -> Claim:
        claim = self.session._claim
        if self.session._owner is not self.owner or claim is None:
            raise SessionOwned(f"session {self.session.id} is not attached to {self.owner!r}",
                               session_id=self.session.id)
        return claim

    async def mutate(self, job: Job[R], context: Context) -> R:
        """`Session.mutate` for the owner; `OwnershipLost` if its claim died meanwhile."""
        return await self.session._run(job, self._claim(), context)

    async def create_lane(
        self,
        name: str,
        config: LaneConfig,
        context: Context,
        *,
        at: str | None = None,
        on_committed: OnCommitted | None = None,
    ) -> None:
        await self.session._create_lane(name, config, at, on_committed, self._claim(), context)

    async def detach(self, context: Context) -> None:
        """Release the claim; idempotent."""
        await self.session.detach(context, owner=self.owner)
