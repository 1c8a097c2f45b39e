"""PostgreSQL-only behaviour of the journal: the owner's lock lives on its own connection, unowned
commits from several stores coexist, and text the driver or server could mangle round-trips.

Runs only with HARNESS_TEST_POSTGRES_URL set; each test gets a private schema (`postgres_schema_url`).
White-box: it drives `PostgresBackend` itself and reads an attached session's claim.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import psycopg
import pytest

from conftest import POSTGRES_URL
from harness.context import Context
from harness.session import (
    InsertEntry,
    InvalidWrite,
    OwnershipLost,
    Session,
    SessionMutator,
    SessionOwned,
    SessionOwnership,
    SetValue,
    Store,
    StoreUnavailable,
    UnsupportedStoreUrl,
    addresses,
    connect,
    work_board,
)
from harness.session.postgres import PostgresBackend, PostgresClaim
from journal_helpers import append_chain, new_session_with_lane, text_of, user

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

