"""The retirement of the error-notice codes `image-refused` and `provider-timeout` (CE-25) on a
journal written as version 1 wrote it, on every backend: the migration removes only those notices,
from placed rows and from the copies of rows not placed yet, runs once and is recorded; afterwards
the vocabulary refuses the codes, to a reader and a writer. The `harness` command applies it when
it opens a store."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue, ValidationError

import harness.conversation
from conftest import backend_url
from conversation_helpers import faux_service
from drive_helpers import FAUX
from harness.context import Context
from harness.conversation import (
    CHAT_EVENT_TYPE,
    JOURNAL_DATA_MIGRATIONS,
    ContextOverflow,
    ConversationService,
    ErrorDetails,
    EventRow,
    ModelSwitchFailed,
    chat_event_of,
    parse_chat_event_details,
)
from harness.conversation.chat_events import chat_event_message
from harness.conversation.migrations import RETIRE_CHAT_ERROR_NOTICES
from harness.messages import CustomMessage, ModelIdentity, UserMessage
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry
from harness.runtime import AgentHarness, AgentHarnessOptions, Settled
from harness.session import (
    CompactionPayload,
    CustomMessagePayload,
    CustomPayload,
    Entry,
    EntryPayload,
    LaneConfig,
    MessagePayload,
    QueueRequest,
    SessionMutator,
    StopRequest,
    Store,
    addresses,
    connect,
)
from harness.session.migrations import DATA_MIGRATIONS
from harness.session.records import PendingCustom, PendingEntry, PendingMessage
from journal_helpers import new_session_with_lane
from test_cli_run import environment

ALICE = "alice"
MAIN_LANE = "main"
RETIRED = ["image-refused", "provider-timeout"]
V1_NOTICE_TEXT = {"image-refused": "The provider refused the image.",
                  "provider-timeout": "The provider did not answer in time."}


# -- version 1, as it wrote rows -------------------------------------------------------------------

def v1_error_event(text: str, notice: dict[str, Any] | None, timestamp: int) -> CustomMessage:
    """An error chat event exactly as version 1's `chat_event_message(ErrorDetails(...))` stored it:
    the details' fields in declaration order, `notice` always present (null without one)."""
    return CustomMessage(custom_type=CHAT_EVENT_TYPE, content=f"[The request failed: {text}]", timestamp=timestamp,
                         details={"kind": "error", "v": 1, "text": text, "notice": notice})


def retired(code: str, timestamp: int) -> CustomMessagePayload:
    return CustomMessagePayload(message=v1_error_event(V1_NOTICE_TEXT[code], {"code": code}, timestamp))


async def write_v1_journal(store: Store, ctx: Context) -> tuple[dict[str, str], set[str]]:
    """Two sessions of version-1 rows: error events with each retired notice, with the notices
    that stay, without one; other chat events; look-alikes that are not chat events; a compaction
    whose retained tail copies a retired row. Returns the session id of each entry id, and the
    ids whose payload the migration must change."""
    first = await new_session_with_lane(store, ctx)
    second = await new_session_with_lane(store, ctx)
    kept_notice = ContextOverflow().model_dump(mode="json")
    switch_notice = ModelSwitchFailed(requested=ModelIdentity(provider="openai", model_id="gpt-4o"))
    look_alike = v1_error_event("not a chat event", {"code": "image-refused"}, 7)
    chain: list[tuple[str, EntryPayload]] = [
        ("user", MessagePayload(message=UserMessage(content="describe this image", timestamp=1))),
        ("image-refused", retired("image-refused", 2)),
        ("context-overflow", CustomMessagePayload(
            message=v1_error_event("The conversation no longer fits.", kept_notice, 3))),
        ("model-switch-failed", CustomMessagePayload(
            message=v1_error_event("gpt-4o failed.", switch_notice.model_dump(mode="json"), 4))),
        ("no-notice", CustomMessagePayload(message=v1_error_event("HTTP 500 from the provider", None, 5))),
        ("interrupted", CustomMessagePayload(message=CustomMessage(
            custom_type=CHAT_EVENT_TYPE, content="[The person interrupted the request.]", timestamp=6,
            details={"kind": "interrupted", "v": 1, "cause": "user"}))),
        ("other-custom-type", CustomMessagePayload(
            message=look_alike.model_copy(update={"custom_type": "someone.else"}))),
        ("custom-data", CustomPayload(custom_type=CHAT_EVENT_TYPE, data=look_alike.model_dump(mode="json"))),
        ("provider-timeout", retired("provider-timeout", 8)),
        ("compaction", CompactionPayload(summary="earlier", tokens_before=900, retained_tail=[
            UserMessage(content="kept verbatim", timestamp=9), v1_error_event(
                V1_NOTICE_TEXT["provider-timeout"], {"code": "provider-timeout"}, 10)])),
    ]

    async def write_chain(m: SessionMutator) -> dict[str, str]:
        tip = await m.get(addresses.branch_tip("main"), ctx)
        ids: dict[str, str] = {}
        for name, payload in chain:
            tip = ids[name] = m.insert_entry(payload, parent_id=tip)
        m.set(addresses.branch_tip("main"), tip)
        return ids

    ids = await first.mutate(write_chain, ctx)

    async def write_other(m: SessionMutator) -> str:
        return m.insert_entry(retired("image-refused", 11), parent_id=None)

    other = await second.mutate(write_other, ctx)
    sessions = {entry_id: first.id for entry_id in ids.values()} | {other: second.id}
    return sessions, {ids["image-refused"], ids["provider-timeout"], ids["compaction"], other}


async def every_entry(store: Store, session_ids: set[str], ctx: Context) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for session_id in session_ids:
        session = await store.open_session(session_id, ctx)
        entries |= {entry.id: entry for entry in await session.read_entries(ctx)}
    return entries


async def migrated(store_url: str, store: Store, ctx: Context) -> Store:
    """The store after opening it with every journal data migration. A memory store does not
    outlive its connection, so its backend runs the migration as `connect` would."""
    if store_url == "memory://":
        assert await store.backend.run_data_migration(RETIRE_CHAT_ERROR_NOTICES, ctx)
        return store
    await store.close()
    return await connect(store_url, ctx, data_migrations=JOURNAL_DATA_MIGRATIONS)


def without_notice(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "details": {k: v for k, v in message["details"].items() if k != "notice"}}


# -- the migration ---------------------------------------------------------------------------------

async def test_the_migration_removes_only_retired_notices(store_url: str, store: Store, ctx: Context) -> None:
    """CE-25: every retired notice is gone, in every session and in a compaction's tail; every
    other field of every entry is as stored."""
    sessions, changing = await write_v1_journal(store, ctx)
    before = await every_entry(store, set(sessions.values()), ctx)

    after_store = await migrated(store_url, store, ctx)
    try:
        after = await every_entry(after_store, set(sessions.values()), ctx)
    finally:
        await after_store.close()

    assert after.keys() == before.keys()
    for entry_id, old in before.items():
        new = after[entry_id]
        assert (new.id, new.parent_id, new.seq, new.timestamp) == (old.id, old.parent_id, old.seq, old.timestamp)
        stored = old.payload.model_dump(mode="json")
        if entry_id not in changing:
            assert new.payload == old.payload
        elif stored["type"] == "compaction":
            user_row, error_row = stored["retained_tail"]
            assert new.payload.model_dump(mode="json") == {
                **stored, "retained_tail": [user_row, without_notice(error_row)]}
        else:
            assert new.payload.model_dump(mode="json") == {**stored, "message": without_notice(stored["message"])}
            assert isinstance(new.payload, CustomMessagePayload)
            assert parse_chat_event_details(new.payload.message.details) == ErrorDetails(
                text=stored["message"]["details"]["text"])
            assert new.payload.message.content == stored["message"]["content"]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_migrated_row_keeps_every_other_byte(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest, ctx: Context) -> None:
    """CE-25: the stored JSON text of a migrated row is the version-1 text less its notice; an
    untouched row is not rewritten at all."""
    url = backend_url(kind, tmp_path, request)
    store = await connect(url, ctx)
    sessions, changing = await write_v1_journal(store, ctx)
    await store.close()
    before = raw_payloads(kind, url)

    await (await connect(url, ctx, data_migrations=JOURNAL_DATA_MIGRATIONS)).close()

    after = raw_payloads(kind, url)
    assert after.keys() == before.keys() == sessions.keys()
    for entry_id, text in before.items():
        expected = text
        if entry_id in changing:
            code = "image-refused" if "image-refused" in text else "provider-timeout"
            expected = text.replace(f',"notice":{{"code":"{code}"}}', "")
            assert expected != text
        assert after[entry_id] == expected


def raw_payloads(kind: str, url: str) -> dict[str, str]:
    """Every entry's payload column, read past the store."""
    if kind == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///").split("?")[0]) as db:
            return dict(db.execute("SELECT id, payload FROM entries").fetchall())
    import psycopg

    with psycopg.connect(url) as conn:
        return {entry_id: payload for entry_id, payload in conn.execute("SELECT id, payload FROM entries")}


async def test_the_migration_is_recorded_and_runs_once(store_url: str, store: Store, ctx: Context) -> None:
    """CE-25: once recorded, opening the store again leaves even a row written afterwards with a
    retired code as it is (the parser refuses that row, next test)."""
    sessions, _ = await write_v1_journal(store, ctx)
    after_store = await migrated(store_url, store, ctx)
    session = await after_store.open_session(next(iter(sessions.values())), ctx)

    async def bypass_the_writer(m: SessionMutator) -> str:
        return m.insert_entry(retired("provider-timeout", 12), parent_id=None)

    late = await session.mutate(bypass_the_writer, ctx)
    try:
        assert not await after_store.backend.run_data_migration(RETIRE_CHAT_ERROR_NOTICES, ctx)
        if store_url != "memory://":
            await after_store.close()
            after_store = await connect(store_url, ctx, data_migrations=JOURNAL_DATA_MIGRATIONS)
        entry = await (await after_store.open_session(session.id, ctx)).entry(late, ctx)
    finally:
        await after_store.close()

    assert entry is not None
    assert entry.payload == retired("provider-timeout", 12)


# -- the copies of a row not placed yet ------------------------------------------------------------

async def test_an_error_row_pending_when_the_store_is_migrated_is_placed_without_its_notice(
        store_url: str, store: Store, ctx: Context) -> None:
    """CE-25, CE-11: an error row recorded while a turn was open waits as a pending write, a copy no
    entry holds yet; the migration rewrites that copy too, so the row the turn places afterwards
    shows on the conversation's surface with its text, its content for the model kept, no notice."""
    conversations, _ = faux_service(store, [])
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX), ctx)
    await conversations.admit(ALICE, conversation.id, "describe this image", ctx)  # open, not driven yet
    text = V1_NOTICE_TEXT["image-refused"]
    assert await conversations.record(ALICE, conversation.id, ErrorDetails(text=text), ctx)
    await conversations.close_all(ctx)
    session = await store.open_session(conversation.id, ctx)
    state = await session.get(addresses.lane_state(MAIN_LANE), ctx)
    assert state is not None
    [write] = state.ids_of("write")
    stored_by_version_1 = v1_error_event(text, {"code": "image-refused"}, 1)

    async def as_version_1_stored_it(m: SessionMutator) -> None:
        m.set(addresses.pending_entry(write), PendingMessage(message=stored_by_version_1))

    await session.mutate(as_version_1_stored_it, ctx)

    after_store = await migrated(store_url, store, ctx)
    try:
        journal = await after_store.open_session(conversation.id, ctx)
        registry = ModelRegistry([FAUX_MODEL], providers={"faux": FauxProvider(["I cannot see it."])})
        harness, _ = await AgentHarness.create(AgentHarnessOptions(session=journal, models=registry), ctx)
        try:
            outcome = await harness.lane(MAIN_LANE).resume(ctx)  # places the pending write
        finally:
            await harness.close(ctx)
        page = await ConversationService(after_store).read_display(ALICE, conversation.id, ctx)
        placed = await journal.entry(write, ctx)
    finally:
        await after_store.close()

    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    assert [row.details for row in page.rows if isinstance(row, EventRow)] == [ErrorDetails(text=text)]
    assert placed is not None
    assert placed.payload.model_dump(mode="json") == {
        "type": "custom_message", "message": without_notice(stored_by_version_1.model_dump(mode="json"))}


async def test_every_copy_a_record_holds_is_migrated_and_nothing_else(
        store_url: str, store: Store, ctx: Context) -> None:
    """CE-25: a retired notice goes from each copy of a row that a record holds before the row is
    placed (a pending entry, the message of a posted queue request), keeping every other byte;
    other pending entries, look-alikes and requests stay as stored."""
    session = await new_session_with_lane(store, ctx)
    retired_row = v1_error_event(V1_NOTICE_TEXT["provider-timeout"], {"code": "provider-timeout"}, 1)
    look_alike = v1_error_event("not a chat event", {"code": "image-refused"}, 2)
    pending: dict[str, PendingEntry] = {
        "retired": PendingMessage(message=retired_row),
        "user": PendingMessage(message=UserMessage(content="kept verbatim", timestamp=3)),
        "other-custom-type": PendingMessage(message=look_alike.model_copy(update={"custom_type": "someone.else"})),
        "custom-data": PendingCustom(custom_type=CHAT_EVENT_TYPE, data=look_alike.model_dump(mode="json")),
    }

    async def queue(m: SessionMutator) -> None:
        for key, value in pending.items():
            m.set(addresses.pending_entry(key), value)

    await session.mutate(queue, ctx)
    steer = QueueRequest(kind="steer", lane=MAIN_LANE, operation_id="op", message=retired_row, requested_at=4)
    stop = StopRequest(lane=MAIN_LANE, operation_id="op", cause="user", requested_at=5)
    request_ids = [await session.post_request(request, ctx) for request in (steer, stop)]
    before = raw_values(store_url)

    after_store = await migrated(store_url, store, ctx)
    try:
        reopened = await after_store.open_session(session.id, ctx)
        after: dict[str, JsonValue] = {}
        for key in pending:
            value = await reopened.get(addresses.pending_entry(key), ctx)
            after[key] = None if value is None else value.model_dump(mode="json")
        requests: list[JsonValue] = []
        for request_id in request_ids:
            request = await reopened.get(addresses.lane_request(request_id), ctx)
            requests.append(None if request is None else request.model_dump(mode="json"))
    finally:
        await after_store.close()

    migrated_row = without_notice(retired_row.model_dump(mode="json"))
    assert after == {**{key: value.model_dump(mode="json") for key, value in pending.items()},
                     "retired": {"type": "message", "message": migrated_row}}
    assert requests == [{**steer.model_dump(mode="json"), "message": migrated_row}, stop.model_dump(mode="json")]
    if before:  # a SQL store: the stored text is the version-1 text less the notice
        notice = ',"notice":{"code":"provider-timeout"}'
        changed = {("harness.pending.entry", "retired"), ("harness.lane.request", request_ids[0])}
        assert raw_values(store_url) == {
            address: text.replace(notice, "") if address in changed else text for address, text in before.items()}
        assert all(notice in before[address] for address in changed)


def raw_values(store_url: str) -> dict[tuple[str, str], str]:
    """Every record value's stored text by (namespace, key), read past the store; none in memory."""
    if store_url.startswith("sqlite:"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///").split("?")[0]) as db:
            return {(namespace, key): value
                    for namespace, key, value in db.execute("SELECT namespace, key, value FROM record_values")}
    if store_url == "memory://":
        return {}
    import psycopg

    with psycopg.connect(store_url) as conn:
        return {(namespace, key): value
                for namespace, key, value in conn.execute("SELECT namespace, key, value FROM record_values")}


# -- the vocabulary after it -----------------------------------------------------------------------

@pytest.mark.parametrize("code", RETIRED)
async def test_a_stored_retired_code_no_longer_parses(
        code: str, store_url: str, store: Store, ctx: Context, caplog: pytest.LogCaptureFixture) -> None:
    """CE-25, CE-5: a row that still carries a retired code after the migration (written past the
    writer) renders nothing, and the refusal is logged."""
    after_store = await migrated(store_url, store, ctx)
    try:
        session = await new_session_with_lane(after_store, ctx)

        async def bypass_the_writer(m: SessionMutator) -> str:
            return m.insert_entry(retired(code, 13), parent_id=None)

        entry = await session.entry(await session.mutate(bypass_the_writer, ctx), ctx)
    finally:
        await after_store.close()
    assert entry is not None
    assert isinstance(entry.payload, CustomMessagePayload)

    with caplog.at_level(logging.ERROR, logger="harness.conversation"):
        assert chat_event_of(entry.payload.message) is None
    assert [r.levelno for r in caplog.records] == [logging.ERROR]


@pytest.mark.parametrize("code", RETIRED)
def test_a_writer_cannot_construct_a_retired_notice(code: str) -> None:
    """CE-25: the notice types of the retired codes are gone, and the details refuse the codes."""
    with pytest.raises(ValidationError):
        ErrorDetails.model_validate({"text": V1_NOTICE_TEXT[code], "notice": {"code": code}})
    assert not {"ImageRefused", "ProviderTimeout"} & set(harness.conversation.__all__)


def test_the_notices_that_stay_still_parse() -> None:
    """CE-5: the codes version 2 keeps read and write as before."""
    for notice in (ContextOverflow(), ModelSwitchFailed(requested=ModelIdentity(provider="p", model_id="m"))):
        details = ErrorDetails(text="failed", notice=notice)
        assert parse_chat_event_details(chat_event_message(details).details) == details


def test_the_journal_list_appends_to_the_sessions() -> None:
    """CE-25: the session layer's own migrations run first, in their order; this layer's after."""
    assert JOURNAL_DATA_MIGRATIONS[:len(DATA_MIGRATIONS)] == DATA_MIGRATIONS
    assert JOURNAL_DATA_MIGRATIONS[len(DATA_MIGRATIONS):] == (RETIRE_CHAT_ERROR_NOTICES,)
    assert RETIRE_CHAT_ERROR_NOTICES.name == "retire-chat-error-notices"


# -- the command -----------------------------------------------------------------------------------

async def test_the_harness_command_applies_it_when_it_opens_a_store(tmp_path: Path, ctx: Context) -> None:
    """CE-25: `harness sessions` on a version-1 SQLite journal migrates it and records the name."""
    path = tmp_path / "journal.db"
    store = await connect(f"sqlite:///{path}", ctx)
    sessions, changing = await write_v1_journal(store, ctx)
    await store.close()

    listing = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "harness.cli", "sessions", "--store", f"sqlite:///{path}"],
        cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, timeout=60, check=False,
        stdin=subprocess.DEVNULL)

    assert listing.returncode == 0, listing.stderr
    with sqlite3.connect(path) as db:
        recorded = [name for (name,) in db.execute("SELECT name FROM data_migrations")]
        payloads = dict(db.execute("SELECT id, payload FROM entries").fetchall())
    assert recorded == ["retire-chat-error-notices"]
    assert len(payloads) == len(sessions)
    still_retired = {i for i, text in payloads.items() if any(f'"code":"{code}"' in text for code in RETIRED)}
    # Only the look-alikes that are not chat events keep the codes.
    assert still_retired == {i for i, text in payloads.items() if "not a chat event" in text}
    assert len(still_retired) == 2
    assert not still_retired & changing
