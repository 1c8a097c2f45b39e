"""One conformance suite for the journal, run on memory, SQLite and PostgreSQL.

White-box where it damages stored rows: for the memory backend, which has no SQL, it edits the
backend's sessions in place."""

from __future__ import annotations

import asyncio
import pickle
import random
import signal
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import backend_url
from harness.context import Context
from harness.errors import ContextNotStorable, InvalidInput
from harness.messages import Usage
from harness.session import (
    CommitResult,
    CustomPayload,
    DataMigration,
    Entry,
    InsertEntry,
    InvalidWrite,
    LaneExists,
    LaneState,
    OwnershipLost,
    SessionMutator,
    SessionNotFound,
    SessionOwned,
    SetValue,
    StorageCorruption,
    Store,
    TokenNotFound,
    UnsupportedImage,
    addresses,
    connect,
    list_address,
    value_address,
)
from harness.session.images import MAX_IMAGE_BYTES, image_ref
from harness.session.memory import MemoryBackend
from harness.session.records import InboxItem, PendingCustom
from journal_helpers import (
    CONFIG,
    append_chain,
    assert_owned_only_by,
    child,
    new_session_with_lane,
    read_word,
    text_of,
    user,
)

TESTS = Path(__file__).resolve().parent


async def branch_texts(session: Any, tip: str, ctx: Context) -> list[str]:
    page = await session.read_branch(tip, ctx, limit=10_000)
    return [text_of(e.payload) for e in reversed(page.entries)]


# -- atomicity ---------------------------------------------------------------------------------


async def test_exception_inside_job_commits_nothing(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)

    async def job(m: SessionMutator) -> None:
        tip = m.insert_entry(user("never"), parent_id=None)
        m.set(addresses.branch_tip("main"), tip)
        m.set(addresses.session_name(), "never")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await session.mutate(job, ctx)

    assert await session.get(addresses.branch_tip("main"), ctx) is None
    assert await session.get(addresses.session_name(), ctx) is None
    ids = await append_chain(session, ["after"], ctx)
    assert (await session.entry(ids[0], ctx)) is not None


async def test_rejected_write_rolls_back_the_whole_commit(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)

    async def job(m: SessionMutator) -> None:
        first = m.insert_entry(user("kept?"), parent_id=None)
        m.set(addresses.branch_tip("main"), first)
        m.insert_entry(user("orphan"), parent_id="no-such-entry")

    with pytest.raises(InvalidWrite):
        await session.mutate(job, ctx)
    assert await session.get(addresses.branch_tip("main"), ctx) is None
    assert await session.usage_ledger(ctx) == []


async def test_ids_are_unique_across_entries_and_usage(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    [entry_id] = await append_chain(session, ["one"], ctx)

    async def job(m: SessionMutator) -> None:
        m.insert_usage(Usage(input=1), usage_id=entry_id)

    with pytest.raises(InvalidWrite):
        await session.mutate(job, ctx)
    assert await session.usage_ledger(ctx) == []


# Each case: the inserts of one commit, ("entry", id, parent) or ("usage", id, None), in a session that
# already holds entry `old-entry` and usage row `old-usage`; and the refusal's message and details.
ID_USED = "id {0} is already used in this session"
PARENT_MISSING = "parent {0} of entry {1} does not exist"
REFUSALS: dict[str, tuple[list[tuple[str, str, str | None]], str, dict[str, str]]] = {
    "entry-id-of-an-entry": ([("entry", "old-entry", "old-entry")], ID_USED.format("old-entry"), {"id": "old-entry"}),
    "entry-id-of-a-usage-row": ([("entry", "old-usage", None)], ID_USED.format("old-usage"), {"id": "old-usage"}),
    "usage-id-of-an-entry": ([("usage", "old-entry", None)], ID_USED.format("old-entry"), {"id": "old-entry"}),
    "usage-id-of-a-usage-row": ([("usage", "old-usage", None)], ID_USED.format("old-usage"), {"id": "old-usage"}),
    "missing-parent": ([("entry", "a", "nowhere")], PARENT_MISSING.format("nowhere", "a"),
                       {"id": "a", "parent_id": "nowhere"}),
    "taken-entry-id-before-its-missing-parent": ([("entry", "old-entry", "nowhere")], ID_USED.format("old-entry"),
                                                 {"id": "old-entry"}),
    "taken-usage-id-before-its-missing-parent": ([("entry", "old-usage", "nowhere")], ID_USED.format("old-usage"),
                                                 {"id": "old-usage"}),
    "missing-parent-then-taken-id": ([("entry", "a", "nowhere"), ("entry", "old-entry", None)],
                                     PARENT_MISSING.format("nowhere", "a"), {"id": "a", "parent_id": "nowhere"}),
    "taken-id-then-missing-parent": ([("entry", "old-entry", None), ("entry", "a", "nowhere")],
                                     ID_USED.format("old-entry"), {"id": "old-entry"}),
    "entry-twice": ([("entry", "a", None), ("entry", "a", None)], ID_USED.format("a"), {"id": "a"}),
    "entry-twice-the-second-without-parent": ([("entry", "a", None), ("entry", "a", "nowhere")],
                                              ID_USED.format("a"), {"id": "a"}),
    "entry-then-usage": ([("entry", "a", None), ("usage", "a", None)], ID_USED.format("a"), {"id": "a"}),
    "usage-then-entry": ([("usage", "a", None), ("entry", "a", "old-entry")], ID_USED.format("a"), {"id": "a"}),
    "usage-twice": ([("usage", "a", None), ("usage", "a", None)], ID_USED.format("a"), {"id": "a"}),
    "its-own-parent": ([("entry", "a", "a")], PARENT_MISSING.format("a", "a"), {"id": "a", "parent_id": "a"}),
    "parent-later-in-the-commit": ([("entry", "a", "b"), ("entry", "b", None)], PARENT_MISSING.format("b", "a"),
                                   {"id": "a", "parent_id": "b"}),
    "parent-a-usage-row": ([("entry", "a", "old-usage")], PARENT_MISSING.format("old-usage", "a"),
                           {"id": "a", "parent_id": "old-usage"}),
    "parent-a-usage-row-of-the-commit": ([("usage", "u", None), ("entry", "a", "u")], PARENT_MISSING.format("u", "a"),
                                         {"id": "a", "parent_id": "u"}),
    "taken-id-after-valid-inserts": ([("entry", "a", "old-entry"), ("usage", "u", None), ("entry", "b", "a"),
                                      ("usage", "old-entry", None)], ID_USED.format("old-entry"), {"id": "old-entry"}),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
async def test_a_refused_insert_names_the_first_failing_write_and_writes_nothing(
    store: Store, ctx: Context, case: str
) -> None:
    inserts, message, details = REFUSALS[case]
    session = await new_session_with_lane(store, ctx)

    async def existing(m: SessionMutator) -> CommitResult:
        m.insert_entry(user("old"), parent_id=None, entry_id="old-entry")
        m.insert_usage(Usage(input=1), usage_id="old-usage")
        return await m.commit()

    async def job(m: SessionMutator) -> None:
        for kind, insert_id, parent_id in inserts:
            if kind == "entry":
                m.set(addresses.session_name(), insert_id)
                m.insert_entry(user(insert_id), parent_id=parent_id, entry_id=insert_id)
            else:
                m.insert_usage(Usage(output=1), usage_id=insert_id)

    async def after(m: SessionMutator) -> CommitResult:
        m.set(addresses.session_name(), "after")
        return await m.commit()

    before = await session.mutate(existing, ctx)
    with pytest.raises(InvalidWrite) as refused:
        await session.mutate(job, ctx)
    assert (refused.value.message, refused.value.details) == (message, details)
    assert [e.id for e in await session.read_entries(ctx)] == ["old-entry"]
    assert [r.id for r in await session.usage_ledger(ctx)] == ["old-usage"]
    assert await session.get(addresses.session_name(), ctx) is None
    # The refused commit took no seqs.
    assert (await session.mutate(after, ctx)).seqs == (before.seqs[-1] + 1,)


ORPHAN = InsertEntry("orphan", "nowhere", "message", None, "{}")


async def test_a_commit_to_an_unknown_session_is_session_not_found_before_its_writes_are_checked(
    store: Store, ctx: Context
) -> None:
    backend = store.backend
    with pytest.raises(SessionNotFound) as missing:
        await backend.commit("no-such-session", [ORPHAN], None, ctx)
    assert missing.value.details == {"session_id": "no-such-session"}
    with pytest.raises(SessionNotFound) as missing:
        await backend.commit("no-such-session", [], None, ctx)
    assert missing.value.details == {"session_id": "no-such-session"}
    with pytest.raises(SessionNotFound):
        await backend.post("no-such-session", [SetValue("test.args", "k", "1")], ctx)
    assert await store.list_sessions(ctx) == []


async def test_a_commit_under_a_claim_taken_again_since_is_ownership_lost_and_writes_nothing(
    store: Store, ctx: Context
) -> None:
    session = await new_session_with_lane(store, ctx)
    backend = store.backend
    stale = await backend.claim(session.id, ctx)
    await backend.release(stale, ctx)
    current = await backend.claim(session.id, ctx)
    try:
        before = await backend.commit(session.id, [SetValue("test.args", "k", "1")], current, ctx)
        for writes in ([SetValue("test.args", "k", "2")], [ORPHAN], []):
            with pytest.raises(OwnershipLost) as lost:
                await backend.commit(session.id, writes, stale, ctx)
            assert lost.value.details == {"session_id": session.id}
        after = await backend.commit(session.id, [SetValue("test.args", "k", "3")], current, ctx)
    finally:
        await backend.release(current, ctx)
    assert after.seqs == (before.seqs[0] + 1,)
    assert await session.get(value_address("test.args", "k"), ctx) == 3


async def test_a_job_commits_at_most_once(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)

    async def job(m: SessionMutator) -> None:
        m.set(addresses.session_name(), "a")
        await m.commit()
        with pytest.raises(InvalidWrite):
            m.set(addresses.session_name(), "b")
        with pytest.raises(InvalidWrite):
            await m.commit()

    await session.mutate(job, ctx)
    assert await session.get(addresses.session_name(), ctx) == "a"


async def test_values_across_reads_one_address_of_every_session_that_has_it(store: Store, ctx: Context) -> None:
    """One read gives each session's value at the address, decoded; sessions without it are absent."""
    named = [await new_session_with_lane(store, ctx) for _ in range(3)]
    unnamed = await new_session_with_lane(store, ctx)
    for index, session in enumerate(named):
        async def name(m: SessionMutator, text: str = f"s{index}") -> None:
            m.set(addresses.session_name(), text)

        await session.mutate(name, ctx)

    found = await store.values_across(addresses.session_name(), ctx)

    assert found == {session.id: f"s{index}" for index, session in enumerate(named)}
    assert unnamed.id not in found


async def test_values_across_names_the_session_whose_value_does_not_fit(store: Store, ctx: Context) -> None:
    """A stored value that does not fit its record type is `StorageCorruption` naming the
    address, as a session's own read says it, and the session it is in."""
    fits = await new_session_with_lane(store, ctx)

    async def fine(m: SessionMutator) -> None:
        m.set(addresses.session_name(), "fine")

    await fits.mutate(fine, ctx)
    damaged = await new_session_with_lane(store, ctx)
    name = addresses.session_name()
    await store.backend.commit(damaged.id, [SetValue(name.namespace, name.key, '{"not": "a name"}')], None, ctx)

    with pytest.raises(StorageCorruption) as across:
        await store.values_across(name, ctx)
    with pytest.raises(StorageCorruption) as alone:
        await damaged.get(name, ctx)

    assert across.value.code == "storage_corruption"
    assert across.value.details == {"session_id": damaged.id, **alone.value.details}
    assert damaged.id in across.value.message


# -- the session line --------------------------------------------------------------------------


async def test_fifo_order_under_fifty_concurrent_jobs(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    ran: list[int] = []
    rng = random.Random(7)
    delays = [rng.randint(0, 3) for _ in range(50)]

    def job_for(i: int) -> Any:
        async def job(m: SessionMutator) -> int:
            ran.append(i)
            for _ in range(delays[i]):
                await asyncio.sleep(0)
            m.set(value_address("test.order", str(i)), i)
            result = await m.commit()
            return result.seqs[0]

        return job

    seqs = await asyncio.gather(*(session.mutate(job_for(i), ctx) for i in range(50)))

    assert ran == list(range(50))
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 50


async def test_create_lane_callback_runs_on_the_line_right_after_commit(store: Store, ctx: Context) -> None:
    """HA-15: on_committed runs in the commit continuation, before any later job on the line;
    the awaitable it returns is awaited only after the line is released."""
    session = await store.create_session(ctx)
    order: list[str] = []
    gate, later_ran = asyncio.Event(), asyncio.Event()

    async def blocker(m: SessionMutator) -> None:
        await gate.wait()

    async def delivery() -> None:
        await later_ran.wait()  # would deadlock if awaited while holding the line
        order.append("delivered")

    def on_committed(_: object) -> Any:
        order.append("callback")
        return delivery()

    async def later(m: SessionMutator) -> None:
        order.append("later job")
        later_ran.set()

    blocking = asyncio.create_task(session.mutate(blocker, ctx))
    await asyncio.sleep(0)
    creating = asyncio.create_task(session.create_lane("main", CONFIG, ctx, on_committed=on_committed))
    await asyncio.sleep(0)
    queued = asyncio.create_task(session.mutate(later, ctx))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.wait_for(asyncio.gather(blocking, creating, queued), timeout=10)

    assert order == ["callback", "later job", "delivered"]
    assert await session.get(addresses.lane_state("main"), ctx) == LaneState()
    with pytest.raises(LaneExists):
        await session.create_lane("main", CONFIG, ctx)


# -- scans -------------------------------------------------------------------------------------


async def test_scan_branch_stops_at_the_newest_compaction(store: Store, ctx: Context) -> None:
    """HA-29: the scan visits tip back to the newest compaction, inclusive, and nothing older."""
    session = await new_session_with_lane(store, ctx)
    texts = [f"m{i}" for i in range(30)]
    await append_chain(session, texts, ctx, compaction_at={5, 12, 20})
    tip = await session.get(addresses.branch_tip("main"), ctx)
    assert tip is not None

    seen: list[Entry] = []
    await session.scan_branch(tip, seen.append, ctx)

    assert [text_of(e.payload) for e in seen] == [f"m{i}" for i in range(29, 19, -1)]
    assert seen[-1].type == "compaction"


async def test_scan_branch_reads_nothing_behind_the_compaction(store: Store, ctx: Context) -> None:
    """HA-29: a corrupt entry older than the compaction is never read by the scan, while the
    whole-branch read meets it and raises."""
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, [f"m{i}" for i in range(10)], ctx, compaction_at={6})
    await corrupt_entry(store, session.id, ids[2], ctx)

    seen: list[Entry] = []
    await session.scan_branch(ids[-1], seen.append, ctx)
    assert len(seen) == 4
    with pytest.raises(StorageCorruption):
        await session.read_branch(ids[-1], ctx, limit=100)


async def test_scan_branch_can_stop_early(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, [f"m{i}" for i in range(600)], ctx)
    seen: list[str] = []

    def visit(entry: Entry) -> bool:
        seen.append(entry.id)
        return len(seen) < 3

    await session.scan_branch(ids[-1], visit, ctx)
    assert seen == ids[-1:-4:-1]


async def test_read_branch_pages_through_the_whole_history(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    texts = [f"m{i}" for i in range(25)]
    ids = await append_chain(session, texts, ctx, compaction_at={10})

    collected: list[str] = []
    before: str | None = ids[-1]
    while before is not None:
        page = await session.read_branch(ids[-1], ctx, before=before, limit=7)
        assert len(page.entries) <= 7
        collected.extend(text_of(e.payload) for e in page.entries)
        before = page.next_before

    assert collected == texts[::-1]


# -- payloads ----------------------------------------------------------------------------------


async def test_one_megabyte_payloads_round_trip(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    big = "".join(random.Random(1).choices("abcdefghij\n\"\\é😀", k=1_000_000))
    app_value = value_address("test.big")

    async def job(m: SessionMutator) -> str:
        m.set(app_value, {"blob": big})
        return m.insert_entry(user(big), parent_id=None)

    entry_id = await session.mutate(job, ctx)
    entry = await session.entry(entry_id, ctx)
    assert entry is not None
    assert text_of(entry.payload) == big
    assert await session.get(app_value, ctx) == {"blob": big}


TEXTS = {
    "lone high surrogate": ("a\ud800b", "a\ufffdb"),
    "lone low surrogate": ("\udc00z", "\ufffdz"),
    "NUL": ("before\x00after", "before\x00after"),
    "emoji": ("👩‍💻 ok 🎉", "👩‍💻 ok 🎉"),
    "right to left": ("שלום עולם مرحبا", "שלום עולם مرحبا"),
    "control and quotes": ("tab\tnew\nline \"q\" \\ \x1b[31m", "tab\tnew\nline \"q\" \\ \x1b[31m"),
}


@pytest.mark.parametrize("case", sorted(TEXTS))
async def test_text_round_trips_cleaned_and_identical(store: Store, ctx: Context, case: str) -> None:
    raw, expected = TEXTS[case]
    session = await new_session_with_lane(store, ctx)
    custom = value_address("test.text")
    frames = list_address("test.frames")

    async def job(m: SessionMutator) -> str:
        m.set(custom, {raw: [raw]})
        m.append(frames, raw)
        m.set(addresses.session_name(), raw)
        return m.insert_entry(CustomPayload(custom_type=raw, data={"k": raw}), parent_id=None)

    entry_id = await session.mutate(job, ctx)

    entry = await session.entry(entry_id, ctx)
    assert entry is not None
    assert isinstance(entry.payload, CustomPayload)
    assert entry.payload.custom_type == expected
    assert entry.payload.data == {"k": expected}
    assert await session.get(custom, ctx) == {expected: [expected]}
    assert [i.item for i in await session.read_list(frames, ctx)] == [expected]
    assert await session.get(addresses.session_name(), ctx) == expected


# -- records -----------------------------------------------------------------------------------


# Text a backend might read as syntax: an array literal's quotes, separators, braces and NULL.
AWKWARD_NAMES = ('a,b', '{x}', 'NULL', '"q"', 'back\\slash', ' spaced ', "it's")


async def test_names_that_look_like_syntax_are_kept_as_they_are(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)

    async def job(m: SessionMutator) -> None:
        parent = None
        for name in AWKWARD_NAMES:
            m.set(value_address(f"test.{name}", name), name)
            m.append(list_address("test.list", name), name)
            parent = m.insert_entry(CustomPayload(custom_type=name, data=name), parent_id=parent, entry_id=name)
            m.insert_usage(Usage(input=1), usage_id=f"usage {name}", entry_id=name)

    await session.mutate(job, ctx)

    for name in AWKWARD_NAMES:
        assert await session.get(value_address(f"test.{name}", name), ctx) == name
        assert [i.item for i in await session.read_list(list_address("test.list", name), ctx)] == [name]
        entry = await session.entry(name, ctx)
        assert entry is not None
        assert isinstance(entry.payload, CustomPayload)
        assert entry.payload.custom_type == name
    page = await session.read_branch(AWKWARD_NAMES[-1], ctx)
    assert [e.id for e in reversed(page.entries)] == list(AWKWARD_NAMES)
    assert {row.entry_id for row in await session.usage_ledger(ctx)} == set(AWKWARD_NAMES)


async def test_values_distinguish_null_from_absent_and_lists_keep_order(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    frames = list_address("test.frames", "r1", int)

    async def job(m: SessionMutator) -> None:
        m.set(addresses.branch_tip("empty"), None)
        for i in range(5):
            m.append(frames, i)
        m.set(value_address("test.gone"), 1)
        m.delete(value_address("test.gone"))
        m.delete(value_address("test.never"))

    await session.mutate(job, ctx)

    record = await session.get_record(addresses.branch_tip("empty"), ctx)
    assert record is not None
    assert record.value is None
    assert await session.get_record(addresses.branch_tip("absent"), ctx) is None
    assert await session.get_record(value_address("test.gone"), ctx) is None
    items = await session.read_list(frames, ctx)
    assert [i.item for i in items] == [0, 1, 2, 3, 4]
    later = await session.read_list(frames, ctx, after_seq=items[1].seq, limit=2)
    assert [i.item for i in later] == [2, 3]
    assert await session.lanes(ctx) == ["empty", "main"]

    async def fresh(m: SessionMutator) -> None:
        m.delete_list(frames)
        m.append(frames, 9)

    await session.mutate(fresh, ctx)
    assert [i.item for i in await session.read_list(frames, ctx)] == [9]


async def test_a_batch_of_reads_answers_each_as_the_read_alone_does(store: Store, ctx: Context) -> None:
    """`ReadBatch` (issue 29): every kind of read queued together answers what it answers alone,
    in one go; an address no backend can store finds nothing, unread."""
    session = await new_session_with_lane(store, ctx)
    frames = list_address("test.frames", "r1", int)
    first = await append_chain(session, ["a", "b"], ctx)

    async def job(m: SessionMutator) -> None:
        for i in range(5):
            m.append(frames, i)
        m.set(value_address("test.counts", "one"), 1)
        m.set(value_address("test.counts", "two"), 2)

    await session.mutate(job, ctx)
    batch = session.batch()
    items = batch.read_list(frames, after_seq=None, limit=3)
    bounds = batch.list_bounds(frames)
    none = batch.list_bounds(list_address("test.frames", "r2", int))
    one = batch.get(value_address("test.counts", "one"))
    absent = batch.get(value_address("test.counts", "three"))
    unstorable = batch.get(value_address("test.counts", "lone \ud800"))
    scanned = batch.scan_values(value_address("test.counts", "t"))
    entries = batch.entries([first[0], "missing"])
    with pytest.raises(RuntimeError):
        _ = items.value  # not read yet
    await batch.run(ctx)

    assert [i.item for i in items.value] == [0, 1, 2]
    assert items.value == await session.read_list(frames, ctx, limit=3)
    assert bounds.value is not None
    assert bounds.value == await session.list_bounds(frames, ctx)
    assert none.value is None
    assert one.value == 1
    assert absent.value is None
    assert unstorable.value is None
    assert scanned.value == [("two", 2)]
    assert list(entries.value) == [first[0]]
    assert entries.value[first[0]] == await session.entry(first[0], ctx)
    await batch.run(ctx)  # nothing queued: no read


async def test_a_list_is_trimmed_through_a_seq_in_the_commit_that_appends(store: Store, ctx: Context) -> None:
    # The lane event log's retention: a trim staged with appends deletes the items up to a seq, in
    # the same transaction; bounds name the oldest and newest seq held.
    session = await new_session_with_lane(store, ctx)
    log, other = list_address("test.log", "a", int), list_address("test.log", "b", int)
    assert await session.list_bounds(log, ctx) is None

    async def job(m: SessionMutator) -> None:
        for i in range(5):
            m.append(log, i)
        m.append(other, 100)

    await session.mutate(job, ctx)
    seqs = [i.seq for i in await session.read_list(log, ctx)]

    async def trim(m: SessionMutator) -> None:
        m.append(log, 5)
        m.trim_list(log, seqs[1])

    await session.mutate(trim, ctx)
    items = await session.read_list(log, ctx)
    assert [i.item for i in items] == [2, 3, 4, 5]
    assert await session.list_bounds(log, ctx) == (items[0].seq, items[-1].seq)
    assert [i.item for i in await session.read_list(other, ctx)] == [100]

    async def failing(m: SessionMutator) -> None:
        m.trim_list(log, items[-1].seq)
        m.insert_entry(CustomPayload(custom_type="x", data=1), parent_id="no-such-entry")

    with pytest.raises(InvalidWrite):
        await session.mutate(failing, ctx)
    assert [i.item for i in await session.read_list(log, ctx)] == [2, 3, 4, 5]  # all or nothing

    async def empty(m: SessionMutator) -> None:
        m.trim_list(log, items[-1].seq)

    await session.mutate(empty, ctx)
    assert await session.list_bounds(log, ctx) is None


async def test_a_list_item_with_a_span_takes_that_many_seqs_and_is_numbered_by_the_last(
    store: Store, ctx: Context
) -> None:
    # The lane event log's rows: one item for a commit's events, each event with a seq of its own.
    session = await new_session_with_lane(store, ctx)
    log = list_address("test.log", "a", int)

    async def job(m: SessionMutator) -> CommitResult:
        m.append(log, 1, span=3)
        m.set(value_address("test.value", "k", int), 7)
        m.append(log, 2)
        return await m.commit()

    result = await session.mutate(job, ctx)
    first = result.seqs[0] - 2
    assert result.seqs == (first + 2, first + 3, first + 4)
    items = await session.read_list(log, ctx)
    assert [(i.item, i.seq) for i in items] == [(1, first + 2), (2, first + 4)]
    assert [i.item for i in await session.read_list(log, ctx, after_seq=first)] == [1, 2]  # inside its span
    assert [i.item for i in await session.read_list(log, ctx, after_seq=first + 2)] == [2]

    async def next_commit(m: SessionMutator) -> CommitResult:
        m.append(log, 3)
        return await m.commit()

    assert (await session.mutate(next_commit, ctx)).seqs == (first + 5,)

    async def no_span(m: SessionMutator) -> None:
        m.append(log, 4, span=0)

    with pytest.raises(InvalidWrite):
        await session.mutate(no_span, ctx)


async def test_scan_values_matches_key_prefix_literally(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)

    async def job(m: SessionMutator) -> None:
        for key in ("op1:a", "op1:b", "op1%x", "op10:a", "op2:a"):
            m.set(value_address("test.args", key), key)

    await session.mutate(job, ctx)
    found = await session.scan_values(value_address("test.args", "op1:"), ctx)
    assert found == [("op1:a", "op1:a"), ("op1:b", "op1:b")]
    records = await session.scan_records(value_address("test.args", "op1:"), ctx)
    assert [(key, record) for key, record in records] == [
        (key, await session.get_record(value_address("test.args", key), ctx)) for key in ("op1:a", "op1:b")
    ]


async def test_usage_ledger_keeps_rows_in_commit_order(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    [entry_id] = await append_chain(session, ["reply"], ctx)

    async def job(m: SessionMutator) -> None:
        m.insert_usage(Usage(input=10, output=5, total_tokens=15), entry_id=entry_id)
        m.insert_usage(Usage(output=1), adjustment=True, details={"why": "tool"})

    await session.mutate(job, ctx)
    rows = await session.usage_ledger(ctx)
    assert [(r.usage.total_tokens, r.entry_id, r.adjustment) for r in rows] == [
        (15, entry_id, False), (0, None, True)
    ]
    assert rows[1].details == {"why": "tool"}
    assert rows[0].seq < rows[1].seq


async def test_a_context_is_never_stored(store: Store, ctx: Context) -> None:
    """HA-22: trying to write a Context into the journal fails loudly and writes nothing."""
    session = await new_session_with_lane(store, ctx)

    async def job(m: SessionMutator) -> None:
        m.set(value_address("test.ctx"), {"context": ctx})

    with pytest.raises(ContextNotStorable):
        await session.mutate(job, ctx)
    with pytest.raises(ContextNotStorable):
        pickle.dumps(ctx)
    assert await session.get(value_address("test.ctx"), ctx) is None


# -- corruption --------------------------------------------------------------------------------


async def test_undecodable_entry_raises_storage_corruption_naming_it(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, ["a", "b", "c"], ctx)
    await corrupt_entry(store, session.id, ids[1], ctx)

    with pytest.raises(StorageCorruption) as raised:
        await session.entry(ids[1], ctx)
    assert raised.value.details["entry_id"] == ids[1]

    seen: list[Entry] = []
    with pytest.raises(StorageCorruption):
        await session.scan_branch(ids[2], seen.append, ctx)
    assert [e.id for e in seen] == [ids[2]]


async def test_a_missing_parent_is_corruption_not_a_shorter_branch(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, ["a", "b", "c", "d"], ctx)
    await delete_entry(store, session.id, ids[1], ctx)

    with pytest.raises(StorageCorruption) as raised:
        await session.scan_branch(ids[3], lambda e: None, ctx)
    assert raised.value.details["parent_id"] == ids[1]
    with pytest.raises(StorageCorruption):
        await session.read_branch(ids[3], ctx)


# -- ownership ---------------------------------------------------------------------------------


async def test_attached_session_refuses_everyone_but_its_owner(store: Store, ctx: Context) -> None:
    """HA-4: while attached, direct mutate, create_lane and a second attach are refused."""
    session = await new_session_with_lane(store, ctx)
    ownership = await session.attach("harness-1", ctx)

    with pytest.raises(SessionOwned):
        await append_chain(session, ["direct"], ctx)
    with pytest.raises(SessionOwned):
        await session.create_lane("other", CONFIG, ctx)
    with pytest.raises(SessionOwned):
        await session.attach("harness-2", ctx)

    async def owned(m: SessionMutator) -> None:
        m.set(addresses.session_name(), "by owner")

    await ownership.mutate(owned, ctx)
    await ownership.create_lane("side", CONFIG, ctx)
    await ownership.detach(ctx)

    with pytest.raises(SessionOwned):
        await ownership.mutate(owned, ctx)
    await append_chain(session, ["after detach"], ctx)
    assert await session.get(addresses.session_name(), ctx) == "by owner"
    assert await session.lanes(ctx) == ["main", "side"]


async def test_a_second_store_cannot_claim_or_write_an_owned_session(
    store_url: str, store: Store, ctx: Context
) -> None:
    if store_url == "memory://":
        pytest.skip("a memory store is private to its connection")
    session = await new_session_with_lane(store, ctx)
    ownership = await session.attach("first", ctx)
    other = await connect(store_url, ctx)
    try:
        await assert_owned_only_by(ownership, other, ctx)
    finally:
        await other.close()


async def test_held_says_whether_a_claim_holds_the_session_and_takes_nothing(
    store_url: str, store: Store, ctx: Context
) -> None:
    """HA-4, issue 29: `Session.held` answers from the session's lock, through the owner's store
    and through another on the same database (a memory store is private: the same one then),
    and takes nothing: the owner commits after it was asked, and a claimant attaching while it
    is asked over and over is not refused. (A waiter asked by attaching and detaching: a
    claimant at that moment was refused `SessionOwned`.)"""
    other = store if store_url == "memory://" else await connect(store_url, ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        seen = await other.open_session(session.id, ctx)
        free = [await session.held(ctx), await seen.held(ctx)]
        ownership = await session.attach("owner", ctx)
        owned = [await session.held(ctx), await seen.held(ctx)]

        async def name(m: SessionMutator) -> None:
            m.set(addresses.session_name(), "by owner")

        await ownership.mutate(name, ctx)
        await ownership.detach(ctx)
        asking = [asyncio.ensure_future(seen.held(ctx)) for _ in range(5)]
        claiming = asyncio.ensure_future(seen.attach("claimant", ctx))  # starts after every question
        await asyncio.gather(*asking)
        claim = await claiming
        claimed = await session.held(ctx)
        await claim.detach(ctx)
        released = await seen.held(ctx)
    finally:
        if other is not store:
            await other.close()

    assert free == [False, False]
    assert owned == [True, True]
    assert await session.get(addresses.session_name(), ctx) == "by owner"
    assert claimed
    assert not released


# -- delete and listing ------------------------------------------------------------------------


async def _fill(session: Any, ctx: Context) -> list[str]:
    """Entries, values, a list (as frames are) and a usage row in `session`; returns the entry ids."""
    ids = await append_chain(session, ["a", "b"], ctx)

    async def job(m: SessionMutator) -> None:
        m.set(addresses.session_name(), "doomed")
        m.append(list_address("test.frames", "op"), {"page": 1})
        m.insert_usage(Usage(input=3, output=4), entry_id=ids[-1])

    await session.mutate(job, ctx)
    return ids


async def test_delete_session_removes_everything_it_holds_and_nothing_else(store: Store, ctx: Context) -> None:
    doomed = await new_session_with_lane(store, ctx)
    ids = await _fill(doomed, ctx)
    kept = await new_session_with_lane(store, ctx)
    kept_ids = await _fill(kept, ctx)

    await store.delete_session(doomed.id, ctx)

    assert [info.id for info in await store.list_sessions(ctx)] == [kept.id]
    with pytest.raises(SessionNotFound):
        await store.open_session(doomed.id, ctx)
    # A new session under the same id sees none of the old rows: they are gone, not hidden.
    reborn = await store.create_session(ctx, session_id=doomed.id)
    assert await reborn.read_entries(ctx) == []
    assert await reborn.entry(ids[0], ctx) is None
    assert await reborn.lanes(ctx) == []
    assert await reborn.get(addresses.session_name(), ctx) is None
    assert await reborn.read_list(list_address("test.frames", "op"), ctx) == []
    assert await reborn.usage_ledger(ctx) == []
    assert [e.id for e in await kept.read_entries(ctx)] == kept_ids
    assert await kept.get(addresses.session_name(), ctx) == "doomed"
    assert len(await kept.usage_ledger(ctx)) == 1


async def test_delete_session_is_refused_while_attached(store: Store, ctx: Context) -> None:
    """An attached session is not deleted under its owner: `SessionOwned`, and nothing is gone."""
    session = await new_session_with_lane(store, ctx)
    ids = await _fill(session, ctx)
    ownership = await session.attach("owner", ctx)

    with pytest.raises(SessionOwned):
        await store.delete_session(session.id, ctx)
    await ownership.detach(ctx)

    assert [e.id for e in await session.read_entries(ctx)] == ids
    await store.delete_session(session.id, ctx)
    assert await store.list_sessions(ctx) == []


async def test_delete_session_is_refused_while_another_store_owns_it(store_url: str, store: Store,
                                                                     ctx: Context) -> None:
    if store_url == "memory://":
        pytest.skip("a memory store is private to its connection")
    session = await new_session_with_lane(store, ctx)
    other = await connect(store_url, ctx)
    try:
        ownership = await (await other.open_session(session.id, ctx)).attach("elsewhere", ctx)
        with pytest.raises(SessionOwned):
            await store.delete_session(session.id, ctx)
        await ownership.detach(ctx)
        await store.delete_session(session.id, ctx)
        assert await other.list_sessions(ctx) == []
    finally:
        await other.close()


async def test_delete_of_an_unknown_session_is_session_not_found(store: Store, ctx: Context) -> None:
    with pytest.raises(SessionNotFound):
        await store.delete_session("no-such-session", ctx)


async def test_a_session_keeps_when_it_was_created_and_last_updated(store: Store, ctx: Context) -> None:
    session = await store.create_session(ctx)
    [created] = await store.list_sessions(ctx)
    assert created.updated_at == created.created_at

    async def job(m: SessionMutator) -> CommitResult:
        m.set(addresses.session_name(), "touched")
        return await m.commit()

    commit = await session.mutate(job, ctx)
    [listed] = await store.list_sessions(ctx)
    assert listed.created_at == created.created_at
    assert listed.updated_at == commit.timestamp >= created.created_at


async def test_a_commit_of_nothing_takes_no_seq_and_still_updates_the_session(store: Store, ctx: Context) -> None:
    session = await store.create_session(ctx)

    async def one(m: SessionMutator) -> CommitResult:
        m.set(addresses.session_name(), "one")
        return await m.commit()

    async def nothing(m: SessionMutator) -> CommitResult:
        await asyncio.sleep(0.002)  # a later millisecond than the commit before
        return await m.commit()

    first = await session.mutate(one, ctx)
    empty = await session.mutate(nothing, ctx)
    assert empty.seqs == ()
    assert empty.timestamp > first.timestamp
    assert (await store.list_sessions(ctx))[0].updated_at == empty.timestamp
    assert (await session.mutate(one, ctx)).seqs == (first.seqs[0] + 1,)


# -- fork --------------------------------------------------------------------------------------


async def test_fork_holds_the_branch_to_the_entry_and_nothing_operational(store: Store, ctx: Context) -> None:
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, ["a", "b", "c", "d"], ctx)

    async def operational(m: SessionMutator) -> None:
        m.set(addresses.pending_entry("p1"), PendingCustom(custom_type="x"))
        inbox = [InboxItem(entry_id="p1", kind="next_run")]
        m.set(addresses.lane_state("main"), LaneState(current_operation_id="op1", inbox=inbox))
        m.set(addresses.entry_label(ids[1]), "checkpoint")
        m.set(addresses.entry_label(ids[3]), "not copied")

    await session.mutate(operational, ctx)

    fork = await store.fork_session(session.id, ids[2], ctx)

    assert fork.info.parent_session_id == session.id
    assert fork.info.forked_from_entry_id == ids[2]
    assert await fork.get(addresses.branch_tip("main"), ctx) == ids[2]
    assert await branch_texts(fork, ids[2], ctx) == ["a", "b", "c"]
    assert await fork.get(addresses.lane_config("main"), ctx) == CONFIG
    assert await fork.get(addresses.lane_state("main"), ctx) == LaneState()
    assert await fork.get(addresses.pending_entry("p1"), ctx) is None
    assert await fork.entry(ids[3], ctx) is None
    assert await fork.scan_values(addresses.entry_label(""), ctx) == [(ids[1], "checkpoint")]
    assert {s.id for s in await store.list_sessions(ctx)} == {session.id, fork.id}


async def test_fork_sets_the_values_it_is_given_in_its_one_transaction(store: Store, ctx: Context) -> None:
    """`values`: each `(address, value)` lands in the fork, none in the source; a value its
    address's type refuses is refused before anything is written."""
    session = await new_session_with_lane(store, ctx)
    [entry_id] = await append_chain(session, ["a"], ctx)
    project = value_address("app.settings", "project", dict[str, int])

    fork = await store.fork_session(session.id, entry_id, ctx, values=[(project, {"id": 2})])
    with pytest.raises(InvalidInput):
        await store.fork_session(session.id, entry_id, ctx, values=[(project, {"id": "two"})])

    assert await fork.get(project, ctx) == {"id": 2}
    assert await session.get(project, ctx) is None
    assert {s.id for s in await store.list_sessions(ctx)} == {session.id, fork.id}


# -- data migrations ---------------------------------------------------------------------------


def _rename_custom(payload: dict[str, Any]) -> dict[str, Any] | None:
    if payload.get("type") == "custom" and payload.get("custom_type") == "old":
        return {**payload, "custom_type": "new"}
    return None


async def test_data_migrations_run_once_and_are_recorded(
    store_url: str, store: Store, ctx: Context
) -> None:
    if store_url == "memory://":
        pytest.skip("a memory store does not outlive its connection")
    session = await new_session_with_lane(store, ctx)

    async def job(m: SessionMutator) -> list[str]:
        return [
            m.insert_entry(CustomPayload(custom_type="old", data=1), parent_id=None),
            m.insert_entry(CustomPayload(custom_type="keep", data=2), parent_id=None),
        ]

    old_id, keep_id = await session.mutate(job, ctx)
    await store.close()

    calls: list[str] = []

    def counting(payload: dict[str, Any]) -> dict[str, Any] | None:
        calls.append(payload["type"])
        return _rename_custom(payload)

    migration = DataMigration("rename-old-custom", counting)
    for _ in range(2):
        reopened = await connect(store_url, ctx, data_migrations=[migration])
        await reopened.close()
    assert len(calls) == 2  # two entries, visited by the first connect only

    reopened = await connect(store_url, ctx)
    try:
        migrated = await (await reopened.open_session(session.id, ctx)).entries([old_id, keep_id], ctx)
    finally:
        await reopened.close()
    assert migrated[old_id].payload == CustomPayload(custom_type="new", data=1)
    assert migrated[keep_id].payload == CustomPayload(custom_type="keep", data=2)


async def test_a_data_migration_with_invalid_output_changes_nothing(
    store_url: str, store: Store, ctx: Context
) -> None:
    if store_url == "memory://":
        pytest.skip("a memory store does not outlive its connection")
    session = await new_session_with_lane(store, ctx)
    ids = await append_chain(session, ["kept"], ctx)
    await store.close()

    broken = DataMigration("broken", lambda payload: {"type": "message", "message": "not a message"})
    with pytest.raises(ValueError, match="broken"):
        await connect(store_url, ctx, data_migrations=[broken])

    reopened = await connect(store_url, ctx)
    try:
        entry = await (await reopened.open_session(session.id, ctx)).entry(ids[0], ctx)
    finally:
        await reopened.close()
    assert entry is not None
    assert text_of(entry.payload) == "kept"


# -- processes ---------------------------------------------------------------------------------


DURABLE_BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=DURABLE_BACKENDS)
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request, durable=True)


async def test_sigkill_in_the_middle_of_a_commit_leaves_nothing(durable_url: str, ctx: Context) -> None:
    store = await connect(durable_url, ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        before = await append_chain(session, ["before"], ctx)
        with child(durable_url, session.id, "commit-and-hang") as process:
            assert await asyncio.to_thread(read_word, process) == "in-commit"
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)

        assert await session.get(addresses.branch_tip("main"), ctx) == before[0]
        assert await session.get(addresses.session_name(), ctx) is None
        assert await branch_texts(session, before[0], ctx) == ["before"]
        after = await append_chain(session, ["after"], ctx)
        assert await branch_texts(session, after[0], ctx) == ["before", "after"]
    finally:
        await store.close()


async def test_two_processes_see_each_others_commits(durable_url: str, ctx: Context) -> None:
    store = await connect(durable_url, ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        await append_chain(session, ["from parent"], ctx)
        with child(durable_url, session.id, "append", "from child") as process:
            assert await asyncio.to_thread(read_word, process) == "appended"
        tip = await session.get(addresses.branch_tip("main"), ctx)
        assert tip is not None
        assert await branch_texts(session, tip, ctx) == ["from parent", "from child"]
    finally:
        await store.close()


async def test_two_processes_cannot_both_own_and_a_killed_owner_releases(
    durable_url: str, ctx: Context
) -> None:
    store = await connect(durable_url, ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        with child(durable_url, session.id, "attach-and-hang") as owner:
            assert await asyncio.to_thread(read_word, owner) == "attached"
            with pytest.raises(SessionOwned):
                await session.attach("parent", ctx)
            with pytest.raises(SessionOwned):
                await append_chain(session, ["intruder"], ctx)
            owner.send_signal(signal.SIGKILL)
            owner.wait(timeout=30)

        ownership = await attach_when_released(session, ctx)
        with child(durable_url, session.id, "try-attach") as rival:
            assert await asyncio.to_thread(read_word, rival) == "owned"
        await ownership.detach(ctx)
    finally:
        await store.close()


async def test_held_answers_across_processes(durable_url: str, ctx: Context) -> None:
    """HA-4, issue 29: `Session.held` sees another process's claim (then, once it is killed, none:
    PostgreSQL notices a killed client a moment later), and another process sees this one's."""
    store = await connect(durable_url, ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        with child(durable_url, session.id, "attach-and-hang") as owner:
            assert await asyncio.to_thread(read_word, owner) == "attached"
            held_by_child = await session.held(ctx)
            owner.send_signal(signal.SIGKILL)
            owner.wait(timeout=30)
        ownership = await attach_when_released(session, ctx)
        with child(durable_url, session.id, "held") as asker:
            seen_by_child = await asyncio.to_thread(read_word, asker)
        await ownership.detach(ctx)
        with child(durable_url, session.id, "held") as asker:
            seen_after = await asyncio.to_thread(read_word, asker)
    finally:
        await store.close()

    assert held_by_child
    assert seen_by_child == "held"
    assert seen_after == "free"


async def test_a_session_whose_owner_was_killed_takes_writes_of_no_owner_again(durable_url: str, ctx: Context) -> None:
    """An owner killed before it released leaves its claim behind in the store (on SQLite, an odd
    epoch, which makes a commit of no owner probe the lock); the probe finds the lock gone and
    the commit lands."""
    store = await connect(durable_url, ctx)
    try:
        session = await new_session_with_lane(store, ctx)
        with child(durable_url, session.id, "attach-and-hang") as owner:
            assert await asyncio.to_thread(read_word, owner) == "attached"
            owner.send_signal(signal.SIGKILL)
            owner.wait(timeout=30)

        for _ in range(100):  # PostgreSQL notices a killed client's connection a moment later
            try:
                await append_chain(session, ["after its owner died"], ctx)
                break
            except SessionOwned:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the dead owner's claim kept refusing commits of no owner")
        entries = await session.read_entries(ctx)
        assert text_of(entries[-1].payload) == "after its owner died"
    finally:
        await store.close()


async def attach_when_released(session: Any, ctx: Context) -> Any:
    """PostgreSQL notices a killed client's connection a moment later; retry briefly."""
    for _ in range(100):
        try:
            return await session.attach("parent", ctx)
        except SessionOwned:
            await asyncio.sleep(0.05)
    return await session.attach("parent", ctx)


# -- corruption helpers (they write around the journal on purpose) -------------------------------


async def corrupt_entry(store: Store, session_id: str, entry_id: str, ctx: Context) -> None:
    await _raw_write(store, "UPDATE entries SET payload = '{\"type\": \"message\", \"oops\"' "
                            "WHERE session_id = {s} AND id = {e}", session_id, entry_id)


async def delete_entry(store: Store, session_id: str, entry_id: str, ctx: Context) -> None:
    await _raw_write(store, "DELETE FROM entries WHERE session_id = {s} AND id = {e}", session_id, entry_id)


async def _raw_write(store: Store, template: str, session_id: str, entry_id: str) -> None:
    backend = store.backend
    if isinstance(backend, MemoryBackend):
        entries = backend._sessions[session_id].entries
        if template.startswith("DELETE"):
            del entries[entry_id]
        else:
            entries[entry_id] = replace(entries[entry_id], payload='{"type": "message", "oops"')
        return
    if backend.kind == "sqlite":
        sql = template.replace("{s}", "?").replace("{e}", "?")
        with sqlite3.connect(backend.path) as db:  # type: ignore[attr-defined]
            db.execute(sql, (session_id, entry_id))
        return
    import psycopg

    sql = template.replace("{s}", "%s").replace("{e}", "%s")
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:
        await conn.execute(sql, (session_id, entry_id))


async def test_closing_a_store_releases_its_claims(store_url: str, ctx: Context) -> None:
    if store_url == "memory://":
        pytest.skip("a memory store is private to its connection")
    first = await connect(store_url, ctx)
    session = await new_session_with_lane(first, ctx)
    await session.attach("first", ctx)
    await first.close()

    second = await connect(store_url, ctx)
    try:
        ownership = await (await second.open_session(session.id, ctx)).attach("second", ctx)
        await ownership.detach(ctx)
    finally:
        await second.close()


async def test_read_entries_pages_through_every_entry_in_commit_order(store: Store, ctx: Context) -> None:
    """Off-branch entries too: an abandoned branch is still in the journal and in `read_entries`."""
    session = await new_session_with_lane(store, ctx)
    first = await append_chain(session, ["a", "b", "c"], ctx)

    async def branch_off(m: SessionMutator) -> str:
        return m.insert_entry(user("side"), parent_id=first[0])

    side = await session.mutate(branch_off, ctx)
    pages, after = [], None
    while page := await session.read_entries(ctx, after_seq=after, limit=2):
        pages.append([entry.id for entry in page])
        after = page[-1].seq

    assert [entry_id for page in pages for entry_id in page] == [*first, side]
    assert [len(page) for page in pages] == [2, 2]


# -- the image store (CE-22, CE-24) ----------------------------------------------------------------

PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489")
WEBP = b"RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00/\x00\x00\x00\x10\x07\x10\x11\x11\x88\x88\xfe\x07\x00"


async def test_images_are_kept_once_by_content_and_named_by_sha256(store: Store, ctx: Context) -> None:
    """Two puts of one picture keep one copy under its SHA-256; its media type is read from its
    bytes; a ref that names nothing, or is no ref at all, reads as None."""
    ref = await store.images.put(PNG, ctx)
    assert await store.images.put(PNG, ctx) == ref == image_ref(PNG)
    assert await store.images.put(WEBP, ctx) == image_ref(WEBP)

    assert set(await store.images.stored(ctx)) == {ref, image_ref(WEBP)}
    image = await store.images.get(ref, ctx)
    assert image is not None
    assert (image.mime_type, image.data) == ("image/png", PNG)
    webp = await store.images.get(image_ref(WEBP), ctx)
    assert webp is not None
    assert webp.mime_type == "image/webp"
    for missing in ("0" * 64, "../journal.db", ref.upper(), ""):
        assert await store.images.get(missing, ctx) is None


async def test_bytes_that_are_no_kept_image_are_refused(store: Store, ctx: Context) -> None:
    """Only PNG, JPEG, GIF and WebP, told from their bytes, and at most `MAX_IMAGE_BYTES`."""
    for data in (b"<svg xmlns='http://www.w3.org/2000/svg'/>", b"", b"RIFF\x00\x00\x00\x00WAVE",
                 PNG + bytes(MAX_IMAGE_BYTES)):
        with pytest.raises(UnsupportedImage) as refused:
            await store.images.put(data, ctx)
        assert refused.value.code == "unsupported_image"
    assert await store.images.stored(ctx) == {}


async def test_an_image_stored_again_since_a_cutoff_is_not_deleted(store: Store, ctx: Context) -> None:
    """`delete(ref, stored_by)` deletes only an image last stored at or before `stored_by`."""
    ref = await store.images.put(PNG, ctx)
    stored_at = (await store.images.stored(ctx))[ref]

    assert await store.images.delete(ref, stored_at - 1, ctx) is False
    assert await store.images.delete(ref, stored_at, ctx) is True
    assert await store.images.get(ref, ctx) is None
    assert await store.images.delete(ref, stored_at, ctx) is False


# -- the bearer tokens of harness serve --------------------------------------------------------------


async def test_tokens_are_stored_hashed_and_revoked_for_every_process(store_url: str, store: Store,
                                                                     ctx: Context) -> None:
    """A token lets its user in, shown once and kept only as its secret's hash; a forged secret,
    an unknown id or a malformed text lets nobody in; a revocation holds for a second connection
    to the same store, and a second revocation changes nothing."""
    token, info = await store.tokens.create("alice", ctx)
    secret = token.removeprefix("harness_").partition("_")[2]

    assert await store.tokens.user_of(token, ctx) == "alice"
    assert await store.tokens.user_of(token[:-1] + ("A" if token[-1] != "A" else "B"), ctx) is None
    assert await store.tokens.user_of(f"harness_{info.id}_", ctx) is None
    assert await store.tokens.user_of("harness_not-an-id\x00_x", ctx) is None
    assert await store.tokens.user_of(secret, ctx) is None
    assert [(row.id, row.user, row.revoked_at) for row in await store.tokens.list(ctx)] == [(info.id, "alice", None)]
    assert secret not in repr(await store.tokens.list(ctx))

    other = store if store_url == "memory://" else await connect(store_url, ctx)  # memory:// is one process's
    try:
        revoked = await other.tokens.revoke(info.id, ctx)
        assert revoked.revoked_at is not None
        assert (await other.tokens.revoke(info.id, ctx)).revoked_at == revoked.revoked_at
    finally:
        if other is not store:
            await other.close()
    assert await store.tokens.user_of(token, ctx) is None
    with pytest.raises(TokenNotFound):
        await store.tokens.revoke("0190a0a0-0000-7000-8000-000000000000", ctx)
    with pytest.raises(InvalidInput):
        await store.tokens.create("bad\nuser", ctx)
