"""Store: one database of sessions, opened by URL (`memory://`, `sqlite:///PATH`, `postgresql://...`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import parse_qs, urlsplit

from harness.context import Context
from harness.errors import InvalidInput
from harness.messages import now_ms
from harness.session import addresses
from harness.session.addresses import ValueAddress
from harness.session.backend import Backend, ConnectionUse, InsertEntry, SessionInfo, SetValue, Write
from harness.session.changes import ChangeFeed
from harness.session.entries import custom_type_of
from harness.session.errors import (
    SessionNotFound,
    StorageCorruption,
    StoreClosed,
    StoreUnavailable,
    UnknownEntry,
    UnsupportedStoreUrl,
)
from harness.session.ids import new_id
from harness.session.images import ImageStore
from harness.session.memory import MemoryBackend
from harness.session.migrations import DATA_MIGRATIONS, DataMigration
from harness.session.records import LaneState
from harness.session.session import (
    Session,
    check_lane_name,
    decode_value,
    encode,
    storable_address,
    storable_identifier,
)
from harness.session.tokens import Tokens

if TYPE_CHECKING:  # psycopg is imported only by a store that opens PostgreSQL
    from harness.session.postgres import PostgresBackend

_FORK_PAGE = 1000
T = TypeVar("T")


class Store:
    """Sessions in one database. `open_session` returns the same `Session` object for the same id
    while it is in use, so each session has one line per process."""

    def __init__(self, backend: Backend, url: str) -> None:
        self.backend = backend
        self.url = url
        self._open: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        self._closed = False
        postgres = cast("PostgresBackend", backend) if backend.kind == "postgres" else None
        self.changes = ChangeFeed(postgres.listen_changes if postgres is not None else None)
        """Wake-ups when a session may have changed: every commit made through this store wakes
        this process's readers at once; on PostgreSQL every commit of any process notifies them
        too, while on memory and SQLite other processes' commits are seen by polling."""
        self.posts = ChangeFeed(postgres.listen_posts if postgres is not None else None)
        """Wake-ups when a request was posted for a session (`Session.post_request`), for its
        holder: a post made through this store wakes it at once; on PostgreSQL a post (or a
        release) of any process notifies it too, while on memory and SQLite other processes'
        posts are seen by polling. Apart from `changes` so that a holder is not woken, to read
        its requests, by each of its own commits (issue 29)."""

    def tag(self, namespace: str) -> None:
        """Have this store's commits that write `namespace` say so apart, for readers that wait
        for changes of it alone (`ChangeFeed.subscribe(namespace=)`): on PostgreSQL a second
        notification in the commit's transaction; elsewhere every commit of this process wakes
        them anyway. Every process whose commits such a reader must hear tags it (the service of
        conversations tags its approvals)."""
        if self.backend.kind == "postgres":
            cast("PostgresBackend", self.backend).tagged.add(namespace)

    def connection_use(self) -> ConnectionUse:
        """What the store holds open now (`ConnectionUse`), for a server's metrics (issue 29)."""
        return self.backend.connection_use()

    @property
    def images(self) -> ImageStore:
        """The images kept beside this store's sessions, by content (`harness.session.images`)."""
        return self.backend.images

    @property
    def tokens(self) -> Tokens:
        """The bearer tokens of `harness serve`, stored hashed (`harness.session.tokens`)."""
        return Tokens(self.backend.tokens)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"store {self.url} is closed")

    async def create_session(self, context: Context, *, session_id: str | None = None) -> Session:
        """Create an empty session (no lanes yet) and return it. A supplied `session_id` must be
        non-empty text without NUL or lone surrogates (`InvalidInput`, the same on every backend)."""
        self._check_open()
        if session_id is not None and not (session_id and storable_identifier(session_id)):
            raise InvalidInput("a session id must be non-empty text without NUL or lone surrogates",
                               session_id=repr(session_id)[:80])
        created = now_ms()
        info = SessionInfo(id=session_id or new_id(), created_at=created, updated_at=created)
        await self.backend.create_session(info, context)
        return self._session(info)

    async def open_session(self, session_id: str, context: Context) -> Session:
        """The session with this id; `SessionNotFound` if there is none (also for an id no backend
        can store)."""
        self._check_open()
        if not storable_identifier(session_id):
            raise SessionNotFound(f"no session {session_id!r}", session_id=repr(session_id)[:80])
        if (found := self._open.get(session_id)) is not None:
            return found
        return self._session(await self.session_info(session_id, context))

    async def session_info(self, session_id: str, context: Context) -> SessionInfo:
        """The session's row as stored now (its `updated_at` moves with every commit, whatever an
        open `Session` object says); `SessionNotFound` if there is none. One read."""
        self._check_open()
        info = await self.backend.get_session(session_id, context) if storable_identifier(session_id) else None
        if info is None:
            raise SessionNotFound(f"no session {session_id!r}", session_id=repr(session_id)[:80])
        return info

    async def list_sessions(self, context: Context) -> list[SessionInfo]:
        """Every session, oldest first."""
        self._check_open()
        return await self.backend.list_sessions(context)

    async def values_across(self, address: ValueAddress[T], context: Context, *,
                            undecodable: Callable[[str, StorageCorruption], None] | None = None) -> dict[str, T]:
        """The value at `address` in every session that has one, by session id, in one read (a
        conversation list reads every session's owner and name this way). Raises
        `StorageCorruption` when a stored value does not decode, naming its session (details
        `session_id`, `address`), as a session's own read names the address; with
        `undecodable`, that error is passed to it with the session id and the session left out,
        so that one damaged session does not hide the others."""
        self._check_open()
        if not storable_address(address):
            return {}
        rows = await self.backend.values_across(address.namespace, address.key, context)
        where = f"{address.namespace}/{address.key}"
        found: dict[str, T] = {}
        for session_id, row in rows.items():
            try:
                found[session_id] = decode_value(address.adapter, row.value, where)
            except StorageCorruption as error:  # one session's of many: say which
                named = StorageCorruption(f"session {session_id}: {error.message}", session_id=session_id,
                                          **error.details)
                if undecodable is None:
                    raise named from error
                undecodable(session_id, named)
        return found

    async def delete_session(self, session_id: str, context: Context) -> None:
        """Delete the session with everything in it: entries, records (lanes, operations, pending
        entries, frames, tool arguments, checkpoints) and usage rows, in one transaction.

        Raises `SessionOwned` while a harness or any owner holds it, in this process or another
        (nothing is deleted), and `SessionNotFound` if there is none. Sessions forked from it
        keep their copies."""
        self._check_open()
        await self.backend.delete_session(session_id, context)
        self._open.pop(session_id, None)

    async def fork_session(
        self, session_id: str, entry_id: str, context: Context, *, lane: str = "main",
        values: Sequence[tuple[ValueAddress[Any], Any]] = (),
    ) -> Session:
        """A new session holding the branch from the root to `entry_id`, with lane `lane` at that
        entry (its configuration copied when the source has that lane) and idle: no operation
        state, no pending entries; and `(address, value)` for each of `values`, in the same
        transaction (an application's own, e.g. a conversation's owner and project). The new
        session records its source and fork point. Raises `UnknownEntry`, `InvalidInput` for a
        value its address's type refuses; nothing was written then."""
        check_lane_name(lane)
        source = await self.open_session(session_id, context)
        if await source.entry(entry_id, context) is None:
            raise UnknownEntry(f"entry {entry_id} is not in session {session_id}", entry_id=entry_id)
        path = []
        before: str | None = entry_id
        while before is not None:
            page = await source.read_branch(entry_id, context, before=before, limit=_FORK_PAGE)
            path.extend(page.entries)
            before = page.next_before
        labels = dict(await source.scan_values(addresses.entry_label(""), context))
        config = await source.get(addresses.lane_config(lane), context)

        created = now_ms()
        info = SessionInfo(id=new_id(), created_at=created, parent_session_id=session_id,
                           forked_from_entry_id=entry_id, updated_at=created)
        writes: list[Write] = []
        for entry in reversed(path):
            custom_type = custom_type_of(entry.payload)
            payload_text = entry.payload.model_dump_json()
            writes.append(InsertEntry(entry.id, entry.parent_id, entry.type, custom_type, payload_text))
            if entry.id in labels:
                writes.append(_set(addresses.entry_label(entry.id), labels[entry.id]))
        writes.append(_set(addresses.branch_tip(lane), entry_id))
        if config is not None:
            writes.append(_set(addresses.lane_config(lane), config))
            writes.append(_set(addresses.lane_state(lane), LaneState()))
        writes.extend(_set(address, value) for address, value in values)
        await self.backend.create_session(info, context, writes)
        return self._session(info)

    def _session(self, info: SessionInfo) -> Session:
        session = self._open.get(info.id)
        if session is None:
            session = Session(self.backend, info, committed=self.changes.committed, posted=self.posts.committed)
            self._open[info.id] = session
        return session

    async def close(self, context: Context | None = None) -> None:
        """Release every claim still held through this store and close its connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.changes.close()
            await self.posts.close()
            for session in list(self._open.values()):
                await session.detach(context or Context())
        finally:
            await self.backend.close()


POOL_MAX_LIMIT = 1_000
"""The largest `pool_max` a store URL may ask for: past it a typo, not a pool."""


def _pool_max_of(url: str, query: str, default: int) -> tuple[str, int]:
    """`url` without its `pool_max` parameters (libpq refuses unknown ones), and the pool size the
    last of them asks for (`default` without one). The other parameters are kept byte for byte:
    libpq decodes only percent escapes, so re-encoding them could change them."""
    kept: list[str] = []
    asked: str | None = None
    for item in query.split("&") if query else []:
        name, _, value = item.partition("=")
        if name == "pool_max":
            asked = value
        else:
            kept.append(item)
    if asked is None:
        return url, default
    if not asked.isdecimal() or not 1 <= int(asked) <= POOL_MAX_LIMIT:
        raise UnsupportedStoreUrl(f"pool_max is a whole number from 1 to {POOL_MAX_LIMIT}, not {asked!r}", url=url)
    base = url.split("?", 1)[0]
    return (f"{base}?{'&'.join(kept)}" if kept else base), int(asked)


def _set(address: ValueAddress[T], value: T) -> SetValue:
    return SetValue(address.namespace, address.key, encode(address.adapter, value))


async def connect(
    url: str, context: Context, *, data_migrations: Sequence[DataMigration] = DATA_MIGRATIONS,
    pool_max: int | None = None,
) -> Store:
    """Open the store at `url`, apply pending schema migrations and journal data migrations.

    URLs: `memory://`; `sqlite:///relative/path.db` or `sqlite:////absolute/path.db` (optional
    `?synchronous=NORMAL|FULL|EXTRA`, default FULL); `postgresql://user@host:port/db?...` (libpq
    conninfo, plus an optional `pool_max=N`, taken out before libpq sees the URL). A PostgreSQL
    store pools at most N connections for its reads and unowned commits: the URL's `pool_max`,
    else `pool_max`, else `DEFAULT_POOL_MAX` (4; a server whose watches follow other processes'
    work wants more: `harness serve` asks for 16). Raises `UnsupportedStoreUrl` for
    anything else (a `pool_max` that is no whole number from 1 to 1,000 included) and
    `StoreUnavailable` when the database cannot be opened."""
    backend = await _open_backend(url, context, pool_max)
    try:
        for migration in data_migrations:
            await backend.run_data_migration(migration, context)
    except BaseException:
        await backend.close()
        raise
    return Store(backend, url)


async def _open_backend(url: str, context: Context, pool_max: int | None) -> Backend:
    parts = urlsplit(url)
    if parts.fragment:
        raise UnsupportedStoreUrl(f"a store URL has no #fragment: {url!r}", url=url)
    if parts.scheme == "memory":
        if url != "memory://":
            raise UnsupportedStoreUrl(f"the memory store URL is exactly memory://, not {url!r}", url=url)
        return MemoryBackend()
    if parts.scheme == "sqlite":
        from harness.session.sqlite import SqliteBackend

        raw_path = url.split("?", 1)[0].removeprefix("sqlite://")
        if not url.startswith("sqlite:///") or raw_path in ("/", "//"):
            raise UnsupportedStoreUrl(f"a SQLite URL is sqlite:///PATH, not {url!r}", url=url)
        query = parse_qs(parts.query)
        unknown = set(query) - {"synchronous"}
        synchronous = query.get("synchronous", ["FULL"])[-1].upper()
        if unknown or synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise UnsupportedStoreUrl(
                f"a SQLite URL takes only ?synchronous=FULL|NORMAL|EXTRA, not {parts.query!r}", url=url
            )
        return await SqliteBackend.open(Path(raw_path[1:]), synchronous, context)
    if parts.scheme in ("postgresql", "postgres"):
        import psycopg

        from harness.session.postgres import DEFAULT_POOL_MAX, PostgresBackend

        libpq_url, pool_max = _pool_max_of(url, parts.query, DEFAULT_POOL_MAX if pool_max is None else pool_max)
        try:
            return await PostgresBackend.open(libpq_url, context, pool_max=pool_max)
        except psycopg.ProgrammingError as error:
            raise UnsupportedStoreUrl(f"not a PostgreSQL URL libpq accepts: {url!r} ({error})", url=url) from error
        except psycopg.Error as error:
            raise StoreUnavailable(f"cannot open PostgreSQL store: {error}", url=url) from error
    raise UnsupportedStoreUrl(
        f"unsupported store URL {url!r}: use memory://, sqlite:///PATH or postgresql://...", url=url
    )
