"""PostgreSQL-only behaviour of the journal: the owner's lock lives on its own connection, unowned
commits from several stores coexist, a commit waits for the server once, and text the driver or
server could mangle round-trips.

Runs only with HARNESS_TEST_POSTGRES_URL set; each test gets a private schema (`postgres_schema_url`).
White-box: it drives `PostgresBackend` itself and reads an attached session's claim.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus

from conftest import POSTGRES_URL
from harness.context import Context
from harness.session import (
    AppendList,
    InsertEntry,
    InsertUsage,
    InvalidWrite,
    OwnershipLost,
    Read,
    Session,
    SessionInfo,
    SessionMutator,
    SessionOwned,
    SessionOwnership,
    SetValue,
    Store,
    StoreClosed,
    StoreUnavailable,
    UnsupportedStoreUrl,
    ValueRow,
    Write,
    addresses,
    connect,
)
from harness.session.backend import BoundsRead, EntriesRead, ListRead, ScanRead, ValueRead
from harness.session.postgres import PostgresBackend, PostgresClaim
from harness.session.work import work_board
from journal_helpers import append_chain, new_session_with_lane, text_of, user
from server_helpers import forwarder

pytestmark = pytest.mark.postgres


@pytest.fixture
def store_url(postgres_schema_url: str) -> str:
    """These tests run on PostgreSQL only (conftest's `store` otherwise runs on every backend)."""
    return postgres_schema_url


def backend_of(store: Store) -> PostgresBackend:
    assert isinstance(store.backend, PostgresBackend)
    return store.backend


async def branch_texts(session: Session, ctx: Context) -> list[str]:
    tip = await session.get(addresses.branch_tip("main"), ctx)
    assert tip is not None
    page = await session.read_branch(tip, ctx)
    return [text_of(entry.payload) for entry in reversed(page.entries)]


async def test_owner_whose_lock_connection_was_killed_cannot_commit(
    store: Store, postgres_schema_url: str, ctx: Context
) -> None:
    """The server ends the owner's lock connection: its next commit is refused with
    OwnershipLost, nothing is written, and another store can then claim the session."""
    session = await new_session_with_lane(store, ctx)
    await append_chain(session, ["before"], ctx)
    ownership = await session.attach("owner", ctx)
    claim = session._claim
    assert isinstance(claim, PostgresClaim)
    assert POSTGRES_URL is not None
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (claim.connection.info.backend_pid,))

    async def job(m: SessionMutator) -> None:
        tip = await m.get(addresses.branch_tip("main"), ctx)
        m.set(addresses.branch_tip("main"), m.insert_entry(user("lost"), parent_id=tip))

    with pytest.raises(OwnershipLost):
        await ownership.mutate(job, ctx)

    assert await branch_texts(session, ctx) == ["before"]
    rival = await connect(postgres_schema_url, ctx)
    try:
        rival_session = await rival.open_session(session.id, ctx)
        rival_ownership = await attach_when_released(rival_session, ctx)
        await rival_ownership.detach(ctx)
    finally:
        await rival.close()
    await ownership.detach(ctx)


async def test_a_claim_connection_the_server_refuses_is_a_typed_error(store: Store, ctx: Context) -> None:
    """No claim connection can be opened (here: nothing listens where the store's URL points now,
    as when the server refuses more clients): attaching raises `StoreUnavailable`, a store
    failure a worker backs off from, not a bare driver error, and nothing is held."""
    session = await new_session_with_lane(store, ctx)
    backend = backend_of(store)
    reachable, backend.url = backend.url, "postgresql://postgres@127.0.0.1:1/test"

    with pytest.raises(StoreUnavailable):
        await session.attach("owner", ctx)

    backend.url = reachable
    ownership = await session.attach("owner", ctx)
    await ownership.detach(ctx)


async def test_unowned_commits_from_two_stores_interleave_without_refusal(
    store: Store, postgres_schema_url: str, ctx: Context
) -> None:
    """Unowned commits take a shared probe lock: concurrent ones from two stores never refuse
    each other, and their seqs stay distinct and increasing."""
    session = await new_session_with_lane(store, ctx)
    other = await connect(postgres_schema_url, ctx)
    try:
        backends = [backend_of(store), backend_of(other)]
        results = await asyncio.gather(*(
            backends[i % 2].commit(session.id, [SetValue("test", f"k{i}", "1"), SetValue("test", "last", "1")],
                                   None, ctx)
            for i in range(40)
        ))
    finally:
        await other.close()
    seqs = sorted(seq for result in results for seq in result.seqs)
    assert len(set(seqs)) == 80
    assert len(await backend_of(store).scan_values(session.id, "test", "k", ctx)) == 40


async def test_renewing_leases_while_the_owner_commits_leaves_every_commit_whole(store: Store, ctx: Context) -> None:
    """A worker renews its leases (`WorkBoard.renew`) on the claim connections while their
    owners commit on them: no renewal may slip into a commit's pipeline, where it would leave the
    connection busy and fail the next commit as a lost connection."""
    board = work_board(store)
    session = await new_session_with_lane(store, ctx)
    ownership = await session.attach("owner", ctx)
    committing = True

    async def renew() -> int:
        rounds = 0
        while committing:
            await board.renew(ctx)
            rounds += 1
        return rounds

    def append(text: str) -> Callable[[SessionMutator], Awaitable[None]]:
        async def job(m: SessionMutator) -> None:
            tip = await m.get(addresses.branch_tip("main"), ctx)
            m.set(addresses.branch_tip("main"), m.insert_entry(user(text), parent_id=tip))

        return job

    renewer = asyncio.ensure_future(renew())
    try:
        for n in range(60):
            await ownership.mutate(append(f"m{n}"), ctx)
    finally:
        committing = False
        rounds = await renewer
        await ownership.detach(ctx)

    assert rounds > 0
    assert await branch_texts(session, ctx) == [f"m{n}" for n in range(60)]


async def test_nul_and_lone_surrogate_escapes_round_trip_exactly(store: Store, ctx: Context) -> None:
    """JSON text holding the escapes \\u0000 and \\ud800 is stored in a text column byte for byte
    (jsonb would reject the first and rewrite the second)."""
    backend = backend_of(store)
    session = await store.create_session(ctx)
    payload = '{"type":"message","message":{"role":"user","content":"a\\u0000b\\ud800c","timestamp":0}}'
    value = '"x\\u0000y\\udfff"'

    await backend.commit(session.id, [InsertEntry("e1", None, "message", None, payload),
                                      SetValue("test", "k", value)], None, ctx)

    assert (await backend.get_entries(session.id, ["e1"], ctx))["e1"].payload == payload
    stored = await backend.get_value(session.id, "test", "k", ctx)
    assert stored is not None
    assert stored.value == value


async def test_nul_in_message_text_round_trips_through_the_journal(store: Store, ctx: Context) -> None:
    """A NUL character inside message text survives a commit and a read."""
    session = await new_session_with_lane(store, ctx)

    await append_chain(session, ["nul\x00inside"], ctx)

    assert await branch_texts(session, ctx) == ["nul\x00inside"]


async def test_key_postgres_cannot_store_is_an_invalid_write(store: Store, ctx: Context) -> None:
    """A NUL in a key (PostgreSQL text cannot hold it) is refused as InvalidWrite, nothing is
    written, and the store keeps working."""
    backend = backend_of(store)
    session = await store.create_session(ctx)

    with pytest.raises(InvalidWrite):
        await backend.commit(session.id, [SetValue("test", "ok", "1"), SetValue("test", "a\x00b", "1")], None, ctx)

    assert await backend.scan_values(session.id, "test", "", ctx) == []
    result = await backend.commit(session.id, [SetValue("test", "ok", "1")], None, ctx)
    assert result.seqs == (1,)


async def test_scan_prefix_is_literal_and_keys_sort_by_code_point(store: Store, ctx: Context) -> None:
    """`%` and `_` in a prefix match only themselves; keys come back in code point order,
    whatever the database collation."""
    backend = backend_of(store)
    session = await store.create_session(ctx)
    keys = ["a_1", "a%2", "ab", "a_b", "aé", "aZ", "a_"]
    await backend.commit(session.id, [SetValue("test", key, "1") for key in keys], None, ctx)

    underscore = await backend.scan_values(session.id, "test", "a_", ctx)
    percent = await backend.scan_values(session.id, "test", "a%", ctx)
    everything = await backend.scan_values(session.id, "test", "a", ctx)

    assert [row.key for row in underscore] == ["a_", "a_1", "a_b"]
    assert [row.key for row in percent] == ["a%2"]
    assert [row.key for row in everything] == sorted(keys)


async def test_first_opens_of_a_fresh_schema_race_safely(postgres_schema_url: str, ctx: Context) -> None:
    """Two stores opening an empty schema at once both succeed: schema steps apply once."""
    stores = await asyncio.gather(*(connect(postgres_schema_url, ctx) for _ in range(3)))
    try:
        session = await stores[0].create_session(ctx)
        assert [info.id for info in await stores[2].list_sessions(ctx)] == [session.id]
    finally:
        for opened in stores:
            await opened.close()


async def attach_when_released(session: Session, ctx: Context) -> SessionOwnership:
    """The server frees a terminated connection's locks a moment after the kill; retry briefly."""
    for _ in range(100):
        try:
            return await session.attach("rival", ctx)
        except SessionOwned:
            await asyncio.sleep(0.05)
    return await session.attach("rival", ctx)


async def test_a_version_1_schema_gains_updated_at_from_its_newest_entry(postgres_schema_url: str,
                                                                         ctx: Context) -> None:
    """Schema step 2 adds `sessions.updated_at`; a database written before it gets each session's
    newest entry time (or its creation time when it has none)."""
    from harness.session.postgres import SCHEMA

    async with await psycopg.AsyncConnection.connect(postgres_schema_url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)")
        for statement in dict(SCHEMA)[1]:
            await conn.execute(statement)
        await conn.execute("INSERT INTO schema_version VALUES (1, 0)")
        await conn.execute("INSERT INTO sessions (id, created_at) VALUES ('with-entries', 1000), ('empty', 2000)")
        await conn.execute("INSERT INTO entries VALUES ('with-entries', 'e1', NULL, 1, 5000, 'message', NULL, '{}')")

    store = await connect(postgres_schema_url, ctx)
    try:
        listed = {info.id: (info.created_at, info.updated_at) for info in await store.list_sessions(ctx)}
    finally:
        await store.close()

    assert listed == {"with-entries": (1000, 5000), "empty": (2000, 2000)}


async def test_pool_max_in_the_url_sizes_the_pool_and_libpq_never_sees_it(postgres_schema_url: str,
                                                                            ctx: Context) -> None:
    """`?pool_max=N` is taken out of the URL (libpq refuses unknown parameters), sizes the pool,
    keeps the other parameters (the private schema) as they were, and wins over `pool_max=`."""
    store = await connect(f"{postgres_schema_url}&pool_max=2", ctx, pool_max=7)
    try:
        assert backend_of(store)._pool.max_size == 2
        session = await new_session_with_lane(store, ctx)
        assert [info.id for info in await store.list_sessions(ctx)] == [session.id]  # the private schema
    finally:
        await store.close()
    store = await connect(postgres_schema_url, ctx, pool_max=7)
    try:
        assert backend_of(store)._pool.max_size == 7
    finally:
        await store.close()
    for bad in ("0", "x", "1001", ""):
        with pytest.raises(UnsupportedStoreUrl):
            await connect(f"{postgres_schema_url}&pool_max={bad}", ctx)


class WireRelay:
    """A TCP relay between a store and its server that counts round trips on the wire: each time
    the client sends after the server last did (or first), the client waits for a reply once."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._last = "server"
        self._tasks: set[asyncio.Task[None]] = set()
        self.round_trips = 0

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, side: str) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if side == "client" and self._last == "server":
                    self.round_trips += 1
                self._last = side
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self._target)
        for task in (asyncio.ensure_future(self.relay(client_reader, server_writer, "client")),
                     asyncio.ensure_future(self.relay(server_reader, client_writer, "server"))):
            self._tasks.add(task)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[int]:
        """Listen on a free local port (yielded) until the block ends, then drop every connection."""
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        try:
            yield server.sockets[0].getsockname()[1]
        finally:
            server.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    async def count(self, call: Awaitable[object]) -> int:
        """The round trips `call` makes, on every connection through the relay."""
        before = self.round_trips
        await call
        return self.round_trips - before


@pytest.fixture
async def relayed(postgres_schema_url: str, ctx: Context) -> AsyncIterator[tuple[PostgresBackend, WireRelay]]:
    """A backend whose connections (pooled and claim) all go through a `WireRelay`."""
    params = conninfo_to_dict(postgres_schema_url)
    host = str(params.get("host") or "")
    if not host or host.startswith("/"):
        pytest.skip("the round-trip relay needs a TCP server address in HARNESS_TEST_POSTGRES_URL")
    relay = WireRelay(host, int(params.get("port") or 5432))
    async with relay.running() as port:
        backend = await PostgresBackend.open(make_conninfo(postgres_schema_url, host="127.0.0.1", port=port), ctx,
                                             pool_max=1)
        try:
            yield backend, relay
        finally:
            await backend.close()


def entry(entry_id: str, parent_id: str | None = None) -> InsertEntry:
    return InsertEntry(entry_id, parent_id, "custom", "test", '{"type":"custom","custom_type":"test","data":1}')


async def test_a_commit_is_one_round_trip(relayed: tuple[PostgresBackend, WireRelay], ctx: Context) -> None:
    """Issue 12: an owner's commit, an unowned one, a post and a refused commit each wait for the
    server once, however many writes they hold: checks, writes, session row and notification
    are one statement, and so one transaction. Counted once psycopg has prepared the statement
    on the connection, which it does the sixth time it runs it, with a round trip of its own."""
    backend, relay = relayed
    await backend.create_session(SessionInfo("s", 1), ctx)
    claim = await backend.claim("s", ctx)

    def owned(n: int) -> list[Write]:
        return [entry(f"a{n}"), SetValue("test", "k", str(n)), entry(f"b{n}", f"a{n}"),
                InsertUsage(f"u{n}", f"b{n}", False, "{}", None)]

    async def refused() -> None:
        with pytest.raises(InvalidWrite):
            await backend.commit("s", [entry("a0")], claim, ctx)

    for n in range(6):
        await backend.commit("s", owned(n), claim, ctx)
    owner_trips = [await relay.count(backend.commit("s", owned(n), claim, ctx)) for n in range(6, 9)]
    refused_trips = await relay.count(refused())
    await backend.release(claim, ctx)
    for n in range(6):
        await backend.commit("s", [entry(f"c{n}", f"a{n}"), SetValue("test", "k", str(n))], None, ctx)
        await backend.post("s", [SetValue("test", "request", str(n))], ctx)
    unowned_trips = await relay.count(backend.commit("s", [entry("c6", "a6"), SetValue("test", "k", "6")], None, ctx))
    post_trips = await relay.count(backend.post("s", [SetValue("test", "request", "6")], ctx))

    assert (owner_trips, refused_trips, unowned_trips, post_trips) == ([1, 1, 1], 1, 1, 1)
    seqs = [row.seq for row in await backend.read_entries("s", None, 100, ctx)]
    assert seqs[:4] == [1, 3, 5, 7]  # a0, b0, then a1 after b0's usage row, ...
    last = await backend.commit("s", [SetValue("test", "k", "last")], None, ctx)
    assert last.seqs == (9 * 4 + 7 * 2 + 7 + 1,)


async def test_a_batch_of_reads_is_one_round_trip(relayed: tuple[PostgresBackend, WireRelay], ctx: Context) -> None:
    """Issue 29: `read_many` (a follow's look: its log page, bounds, floor, lane and operation
    state, frames) is one statement, so one round trip, however many reads it holds; reads of
    several callers at once share one pipeline (one checkout from the pool)."""
    backend, relay = relayed
    await backend.create_session(SessionInfo("s", 1), ctx)
    await backend.commit("s", [entry("a"), SetValue("test", "k", "1"), SetValue("test", "l", "2"),
                               AppendList("test", "log", "10"), AppendList("test", "log", "11")], None, ctx)
    reads: list[Read] = [ListRead("test", "log", None, 10), BoundsRead("test", "log"), ValueRead("test", "k"),
                         ValueRead("test", "absent"), ScanRead("test", ""), EntriesRead(("a", "b")),
                         BoundsRead("test", "none")]
    for _ in range(6):  # psycopg prepares a statement the sixth time, with a round trip of its own
        answers = await backend.read_many("s", reads, ctx)
    trips = await relay.count(backend.read_many("s", reads, ctx))
    together = await relay.count(asyncio.gather(*(backend.read_many("s", reads, ctx) for _ in range(4))))

    assert (trips, together) == (1, 1)
    log, bounds, k, absent, scanned, entries, none = answers
    assert isinstance(log, list)
    assert [row.value for row in log] == ["10", "11"]
    assert bounds == (log[0].seq, log[1].seq)
    assert isinstance(k, ValueRow)
    assert k.value == "1"
    assert absent is None
    assert none is None
    assert isinstance(scanned, list)
    assert [(row.key, row.value) for row in scanned] == [("k", "1"), ("l", "2")]
    assert isinstance(entries, dict)
    assert list(entries) == ["a"]


async def test_reads_queued_together_answer_after_a_cut_and_beside_a_cancelled_caller(
        postgres_schema_url: str, ctx: Context) -> None:
    """Issue 29: reads queued together (one pipeline per drain) whose connection was cut are made
    once more on a connection the pool checked, and each caller gets its own answer; a caller
    cancelled meanwhile gets `CancelledError` and the others are not disturbed."""
    async with forwarder(postgres_schema_url) as forwarded:
        backend = await PostgresBackend.open(forwarded.url, ctx, pool_max=2)
        try:
            await backend.create_session(SessionInfo("s", 1), ctx)
            await backend.commit("s", [SetValue("test", f"k{n}", str(n)) for n in range(20)], None, ctx)
            forwarded.cut()  # every pooled connection is dropped; new ones go through
            reads = [asyncio.ensure_future(backend.get_value("s", "test", f"k{n}", ctx)) for n in range(20)]
            reads[3].cancel()
            done = await asyncio.gather(*reads, return_exceptions=True)
            answered = await backend.read_many("s", [ValueRead("test", "k7"), ValueRead("test", "k8")], ctx)
        finally:
            await backend.close()

    assert isinstance(done[3], asyncio.CancelledError)
    assert [row.value if isinstance(row, ValueRow) else row for n, row in enumerate(done) if n != 3] == [
        str(n) for n in range(20) if n != 3]
    assert [row.value if isinstance(row, ValueRow) else row for row in answered] == ["7", "8"]


async def test_a_reader_of_a_tagged_namespace_wakes_for_its_commits_alone(
        store: Store, postgres_schema_url: str, ctx: Context) -> None:
    """Issue 29: a commit that writes a namespace its writer's store tags (`Store.tag`: the
    conversations' approval copies) wakes the readers of that namespace (`subscribe(namespace=)`);
    any other commit wakes only the readers of every change. One listening connection delivers
    both in order, so once the plain reader woke for a commit, the tagged one would have too."""
    writer = await connect(postgres_schema_url, ctx)
    try:
        writer.tag("approvals")
        session = await new_session_with_lane(store, ctx)
        every, tagged = store.changes.subscribe(session.id), store.changes.subscribe(session.id, namespace="approvals")
        assert await every.wait(30)  # the feed listens (its first wake-up says so)
        await tagged.wait(0)

        await writer.backend.commit(session.id, [SetValue("other", "k", "1")], None, ctx)
        assert await every.wait(30)
        assert not await tagged.wait(0)
        await writer.backend.commit(session.id, [SetValue("approvals", "call", "1")], None, ctx)
        assert await tagged.wait(30)
        assert await every.wait(30)
        every.close()
        tagged.close()
    finally:
        await writer.close()


async def test_a_read_refused_in_a_pipeline_fails_alone_and_a_huge_batch_is_split(store: Store, ctx: Context) -> None:
    """Issue 29, found by an adversarial run: a read PostgreSQL refuses with a typed error (a limit,
    a timeout) fails only its caller, not the reads queued in its pipeline; a batch of more reads
    than one statement's parameters allow is made in several statements, not refused as a lost
    connection with every read beside it."""
    backend = backend_of(store)
    await backend.create_session(SessionInfo("s", 1), ctx)
    await backend.commit("s", [SetValue("ns", "k", "v")], None, ctx)
    good = [asyncio.ensure_future(backend.get_value("s", "ns", "k", ctx)) for _ in range(3)]
    refused = asyncio.ensure_future(backend._rows("SELECT array_fill(1, ARRAY[2000000000])", ()))
    huge = asyncio.ensure_future(backend.read_many("s", [ValueRead("ns", "k")] * 17_000, ctx))
    done = await asyncio.gather(*good, refused, huge, return_exceptions=True)

    assert [row.value if isinstance(row, ValueRow) else row for row in done[:3]] == ["v", "v", "v"]
    assert isinstance(done[3], StoreUnavailable)
    assert isinstance(done[4], list)
    assert len(done[4]) == 17_000
    assert {row.value if isinstance(row, ValueRow) else None for row in done[4]} == {"v"}


async def test_a_released_claim_commits_nothing_and_a_closed_store_claims_nothing(
        store: Store, ctx: Context) -> None:
    """Issue 29, found by an adversarial run: a commit with a claim released since is refused
    `OwnershipLost` (its connection is a spare now, or another claim's) and changes nothing; a
    claim on a closed store is `StoreClosed` and leaves no lock held."""
    backend = backend_of(store)
    await backend.create_session(SessionInfo("s", 1), ctx)
    claim = await backend.claim("s", ctx)
    await backend.release(claim, ctx)
    other = await backend.claim("s", ctx)  # on the released claim's connection
    await backend.release(other, ctx)

    with pytest.raises(OwnershipLost):
        await backend.commit("s", [SetValue("ns", "k", "stale")], claim, ctx)
    assert await backend.get_value("s", "ns", "k", ctx) is None
    await store.close()
    with pytest.raises(StoreClosed):
        await backend.claim("s", ctx)


async def test_a_tagged_commit_of_a_session_with_a_long_id_is_applied(store: Store, ctx: Context) -> None:
    """Issue 29, found by an adversarial run: the tagged notification's payload is UTF-8, and one
    past NOTIFY's limit is left out (its readers poll) rather than failing the commit."""
    store.tag("approvals")
    backend = backend_of(store)
    for session_id in ("日" * 1_500, "日" * 2_600):  # 4,500 and 7,800 bytes: the JSON payload fits, then not
        await backend.create_session(SessionInfo(session_id, 1), ctx)
        await backend.commit(session_id, [SetValue("approvals", "call", "1")], None, ctx)
        assert (await backend.get_value(session_id, "approvals", "call", ctx) or ValueRow("", "", 0, "")).value == "1"


def connection_pid(claim: object) -> int:
    assert isinstance(claim, PostgresClaim)
    return claim.connection.info.backend_pid


async def test_a_released_claim_connection_serves_the_next_claim(store: Store, ctx: Context) -> None:
    """Issue 29: a release keeps its connection, its lock let go of, for the next claim (a new one
    starts a server process); a second release of the same claim changes nothing, and a spare
    the server ended meanwhile is replaced by a new connection."""
    backend = backend_of(store)
    for session_id in ("a", "b"):
        await backend.create_session(SessionInfo(session_id, 1), ctx)
    first = await backend.claim("a", ctx)
    pid = connection_pid(first)
    await backend.release(first, ctx)
    second = await backend.claim("b", ctx)
    assert connection_pid(second) == pid
    await backend.release(first, ctx)  # released already: must not let go of "b"
    with pytest.raises(SessionOwned):
        await backend.claim("b", ctx)
    assert await backend.held("b", ctx)
    assert not await backend.held("a", ctx)
    await backend.release(second, ctx)

    assert POSTGRES_URL is not None
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    third = await backend.claim("a", ctx)
    assert connection_pid(third) != pid
    await backend.release(third, ctx)


async def test_a_refused_commit_names_its_first_failing_write_and_leaves_the_connection_idle(
    store: Store, ctx: Context
) -> None:
    """The server's checks refuse in write order, as every backend does: here an id the session
    already holds (write 1) before a repeated id (write 2), a parent missing from the session,
    and text PostgreSQL cannot hold in a write after a refused one. After each refusal nothing is
    written and the owner's connection is idle again: the next commit goes through."""
    backend = backend_of(store)
    session = await store.create_session(ctx)
    claim = await backend.claim(session.id, ctx)
    assert isinstance(claim, PostgresClaim)
    for n in range(5):
        await backend.commit(session.id, [entry(f"e{n}"), SetValue("test", "k", str(n))], claim, ctx)
    refused: list[tuple[list[Write], dict[str, object]]] = [
        ([entry("x"), entry("e0"), entry("x")], {"id": "e0"}),
        ([entry("y"), InsertUsage("y", None, False, "{}", None)], {"id": "y"}),
        ([entry("z", "e1"), entry("w", "missing")], {"id": "w", "parent_id": "missing"}),
        ([entry("v", "later"), entry("later")], {"id": "v", "parent_id": "later"}),
        ([entry("e2"), SetValue("test", "a\x00b", "1")], {"id": "e2"}),
        ([SetValue("test", "ok", "1"), SetValue("test", "a\x00b", "1")], {"session_id": session.id}),
    ]

    for n, (writes, details) in enumerate(refused):
        with pytest.raises(InvalidWrite) as raised:
            await backend.commit(session.id, writes, claim, ctx)
        assert raised.value.details == details
        assert claim.connection.info.transaction_status == TransactionStatus.IDLE
        await backend.commit(session.id, [entry(f"after{n}"), SetValue("test", "k", "after")], claim, ctx)

    entries = [row.id for row in await backend.read_entries(session.id, None, 20, ctx)]
    assert entries == [f"e{n}" for n in range(5)] + [f"after{n}" for n in range(len(refused))]
    assert await backend.get_value(session.id, "test", "ok", ctx) is None
    await backend.release(claim, ctx)


async def test_refusals_around_the_statement_being_prepared_leave_it_usable(store: Store, ctx: Context) -> None:
    """psycopg prepares a statement the sixth time it runs it; refused commits before and at
    that run (here the commit statement's second and sixth runs) leave the connection and the
    statement usable, and the next commit goes through. (A commit sent as several pipelined
    statements broke this: psycopg counted a statement prepared when it sent the Parse, which
    the server skipped after the refusal.)"""
    backend = backend_of(store)
    session = await store.create_session(ctx)
    claim = await backend.claim(session.id, ctx)
    await backend.commit(session.id, [entry("taken")], claim, ctx)
    with pytest.raises(InvalidWrite):
        await backend.commit(session.id, [entry("taken")], claim, ctx)
    for n in range(3):
        await backend.commit(session.id, [entry(f"e{n}")], claim, ctx)

    with pytest.raises(InvalidWrite):
        await backend.commit(session.id, [entry("taken")], claim, ctx)
    await backend.commit(session.id, [entry("next")], claim, ctx)

    assert [row.id for row in await backend.read_entries(session.id, None, 10, ctx)] == [
        "taken", "e0", "e1", "e2", "next"]
    await backend.release(claim, ctx)
