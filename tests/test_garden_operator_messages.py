"""Operator messages, one requirement at a time (OM-1 to OM-10): each named rejection refuses a bad
input with nothing written, the record validator and the shipped JSON Schema agree, concurrent
emitters leave only whole lines, and a retry after `IO_ERROR` repeats nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import harness.garden as garden_api
from conversation_helpers import faux_service, transcript
from drive_helpers import within
from garden_helpers import OWNER, conversation, conversations, files_in, in_run, make_garden
from harness.context import Context
from harness.conversation import Conversation, ConversationService
from harness.conversation.garden_messages import garden_message_of
from harness.garden import (
    GARDENER,
    ConversationOrigin,
    Garden,
    GoalType,
    OperatorMessageRejected,
    RunContext,
    RuntimeRoot,
    TendFinished,
    current_run_context,
    emit_recently_concluded,
    emit_tend_survey,
    operator_message_schema,
    operator_message_tools,
    read_operator_message_records,
    running,
    schema_errors,
    validate_operator_message_record,
    validate_operator_message_request,
)
from harness.providers.faux import FauxRequest
from harness.session import Store
from harness.session.ids import new_id

SRC = Path(garden_api.__file__).resolve().parents[2]


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'harness.db'}"


@pytest.fixture
async def service(store: Store) -> Any:
    conversations_service, _ = conversations(store)
    yield conversations_service
    await conversations_service.close_all(Context({}))


@pytest.fixture
async def garden(store: Store, service: ConversationService, tmp_path: Path, ctx: Context) -> Garden:
    return await make_garden(store, service, tmp_path / "root", ctx)


def origin_of(talk: Conversation) -> ConversationOrigin:
    return ConversationOrigin(conversation_id=talk.id, message_id="kickoff")


def written(root: RuntimeRoot) -> list[str]:
    """Every file an emission could have written: under `runs/` and `inbox/`."""
    return sorted(str(path.relative_to(root.path)) for folder in ("runs", "inbox")
                  for path in (root.path / folder).rglob("*") if path.is_file())


async def garden_message_count(talk: Conversation, ctx: Context) -> int:
    return sum(garden_message_of(message) is not None for message in await transcript(talk, ctx))


async def refused(code: str, emit: Any, run: RunContext | None, content: str = "a note") -> OperatorMessageRejected:
    """The error emitting `content` in `run` (None: outside any run) raises, checked to be `code`."""
    with contextlib.ExitStack() as stack:
        if run is not None:
            stack.enter_context(running(run))
        with pytest.raises(OperatorMessageRejected) as caught:
            await emit(content, Context({}))
    assert caught.value.code == code
    return caught.value


# -- OM-1, OM-10: two kinds, from the gardener, and nothing else ---------------------------------------


def test_only_the_two_note_kinds_from_the_garden_are_requests() -> None:
    """OM-1: a third kind or another sender is refused by the request validator."""
    base = {"kind": "tend_survey", "sender": "garden", "content": "x", "source_goal_id": "g", "source_run_id": "r"}
    assert validate_operator_message_request(base).ok
    assert validate_operator_message_request({**base, "kind": "startup_status"}).codes == (
        "INVALID_OPERATOR_MESSAGE_KIND",)
    assert validate_operator_message_request({**base, "sender": "gardener-bot"}).codes == (
        "INVALID_OPERATOR_MESSAGE_SENDER",)


def test_the_gardener_is_offered_exactly_the_two_emitters_and_nothing_general() -> None:
    """OM-1, OM-10: two tools, two public emitters, no general-purpose message helper."""
    assert [tool.name for tool in operator_message_tools()] == ["emit_tend_survey", "emit_recently_concluded"]
    assert sorted(name for name in garden_api.__all__ if name.startswith("emit")) == [
        "emit_recently_concluded", "emit_tend_survey"]


# -- OM-2, OM-6: one validated record per emission, in the run's file ----------------------------------


async def test_each_emission_appends_one_record_line_to_its_runs_file(garden: Garden, ctx: Context) -> None:
    """OM-2, OM-6: a note's record has the fixed fields and delivery_path, and no origin fields."""
    goal, run = await in_run(garden, "tend", ctx)
    with running(run):
        first = await emit_tend_survey("one", ctx)
        second = await emit_tend_survey("two", ctx)
    lines = garden.root.records_file(run.run_id).read_text().splitlines()
    assert [json.loads(line)["emission_id"] for line in lines] == [first.emission_id, second.emission_id]
    assert set(json.loads(lines[0])) == {"schema_version", "emission_id", "kind", "sender", "transcript_policy",
                                         "delivery_policy", "emitted_at", "source_goal_id", "source_run_id",
                                         "delivery_path"}
    assert (first.source_goal_id, first.source_run_id) == (goal.id, run.run_id)
    assert read_operator_message_records(run.run_id, root=garden.root) == [first, second]


def test_the_schema_ships_in_the_package() -> None:
    """OM-2: `schema/operator-message.schema.json` is package data, loaded from the package."""
    shipped = SRC / "harness" / "garden" / "schema" / "operator-message.schema.json"
    assert json.loads(shipped.read_text()) == operator_message_schema()


async def test_a_failed_reply_copy_leaves_delivery_path_out_and_is_no_error(
        garden: Garden, service: ConversationService, ctx: Context) -> None:
    """OM-6, OM-8: `delivery_path` exactly when a file was written; the conversation holds the message."""
    talk = await conversation(service, ctx)
    _, run = await in_run(garden, "durable", ctx, origin=origin_of(talk))
    (garden.root.reply_dir / "blocked.md").mkdir(parents=True)  # the copy cannot replace a folder
    with running(run):
        record = await emit_recently_concluded("done", ctx, emission_id="blocked")
    assert record.delivery_path is None
    assert record.conversation_message_id is not None
    assert "delivery_path" not in json.loads(garden.root.records_file(run.run_id).read_text())
    assert await garden_message_count(talk, ctx) == 1


# -- OM-3, OM-8, OM-8a: the validators and their named codes -----------------------------------------

GOOD_NOTE: dict[str, Any] = {
    "schema_version": 1, "emission_id": "e1", "kind": "tend_survey", "sender": "garden", "transcript_policy": "none",
    "delivery_policy": "out_of_band_note", "emitted_at": 1, "source_goal_id": "g1", "source_run_id": "r1",
    "delivery_path": "inbox/allotment/notes/e1.md"}
GOOD_REPLY: dict[str, Any] = {
    **{key: value for key, value in GOOD_NOTE.items() if key != "delivery_path"}, "kind": "recently_concluded",
    "transcript_policy": "canonical", "delivery_policy": "reply_copy",
    "origin": {"kind": "conversation", "conversation_id": "c1", "message_id": "m1"},
    "conversation_message_id": "m2", "delivery_path": "inbox/allotment/e1.md"}

BAD_RECORDS: list[tuple[str, Any]] = [
    ("UNKNOWN_OPERATOR_MESSAGE_FIELD", {**GOOD_NOTE, "content": "a copy"}),
    ("INVALID_OPERATOR_MESSAGE_KIND", {**GOOD_NOTE, "kind": "startup_status"}),
    ("INVALID_OPERATOR_MESSAGE_SENDER", {**GOOD_NOTE, "sender": "person"}),
    ("INVALID_OPERATOR_MESSAGE_CONTEXT", {key: v for key, v in GOOD_NOTE.items() if key != "source_run_id"}),
    ("INVALID_OPERATOR_MESSAGE_CONTEXT", {**GOOD_NOTE, "source_goal_id": "../g"}),
    ("INVALID_OPERATOR_MESSAGE_POLICY", {**GOOD_NOTE, "transcript_policy": "canonical"}),
    ("INVALID_OPERATOR_MESSAGE_POLICY", {**GOOD_REPLY, "delivery_policy": "out_of_band_note"}),
    ("INVALID_OPERATOR_MESSAGE_POLICY", {key: v for key, v in GOOD_NOTE.items() if key != "delivery_policy"}),
    ("INVALID_OPERATOR_MESSAGE_ORIGIN", {key: v for key, v in GOOD_REPLY.items() if key != "origin"}),
    ("INVALID_OPERATOR_MESSAGE_ORIGIN", {key: v for key, v in GOOD_REPLY.items() if key != "conversation_message_id"}),
    ("INVALID_OPERATOR_MESSAGE_ORIGIN", {**GOOD_NOTE, "origin": GOOD_REPLY["origin"]}),
    ("INVALID_OPERATOR_MESSAGE_ORIGIN", {**GOOD_NOTE, "conversation_message_id": "m2"}),
    ("INVALID_OPERATOR_MESSAGE_ORIGIN", {**GOOD_REPLY, "origin": {"kind": "email", "conversation_id": "c1",
                                                                 "message_id": "m1"}}),
    ("INVALID_OPERATOR_MESSAGE_ORIGIN", {**GOOD_REPLY, "origin": {**GOOD_REPLY["origin"], "extra": 1}}),
    ("INVALID_OPERATOR_MESSAGE_PATH", {**GOOD_REPLY, "delivery_path": "inbox/allotment/notes/e1.md"}),
    ("INVALID_OPERATOR_MESSAGE_PATH", {**GOOD_NOTE, "delivery_path": "inbox/allotment/e1.md"}),
    ("INVALID_OPERATOR_MESSAGE_PATH", {**GOOD_NOTE, "delivery_path": "inbox/allotment/notes/../../../etc/x.md"}),
    ("INVALID_OPERATOR_MESSAGE_PATH", {**GOOD_REPLY, "delivery_path": "/tmp/e1.md"}),
    ("INVALID_OPERATOR_MESSAGE_PATH", {key: v for key, v in GOOD_NOTE.items() if key != "delivery_path"}),
    ("INVALID_OPERATOR_MESSAGE_VALUE", {**GOOD_NOTE, "schema_version": 2}),
    ("INVALID_OPERATOR_MESSAGE_VALUE", {**GOOD_NOTE, "emitted_at": "yesterday"}),
    ("INVALID_OPERATOR_MESSAGE_VALUE", {**GOOD_NOTE, "emitted_at": True}),
    ("INVALID_OPERATOR_MESSAGE_VALUE", {**GOOD_NOTE, "emission_id": "e1\n"}),
    ("INVALID_OPERATOR_MESSAGE_VALUE", {**GOOD_NOTE, "emission_id": ""}),
    ("INVALID_OPERATOR_MESSAGE_VALUE", {**GOOD_NOTE, "emission_id": None}),
    ("INVALID_OPERATOR_MESSAGE_VALUE", ["not", "an", "object"]),
]


@pytest.mark.parametrize("record", [
    GOOD_NOTE, GOOD_REPLY, {k: v for k, v in GOOD_REPLY.items() if k != "delivery_path"},
    {**GOOD_NOTE, "emitted_at": 5.0}])
def test_a_valid_record_passes_the_validator_and_the_schema(record: dict[str, Any]) -> None:
    """OM-3, OM-8a: both policy pairs, a reply whose copy failed (no delivery_path)."""
    assert validate_operator_message_record(record).ok
    assert schema_errors(record) == []


SEED_FIELDS = {"schema_version", "kind", "sender", "transcript_policy", "delivery_policy", "emitted_at",
               "source_goal_id", "source_run_id"}
SEED_NOTE = {key: value for key, value in GOOD_NOTE.items() if key != "emission_id"}
SEED_REPLY = {key: value for key, value in GOOD_REPLY.items() if key != "emission_id"}


@pytest.mark.parametrize("record", [
    SEED_NOTE, SEED_REPLY, {key: value for key, value in SEED_REPLY.items() if key != "delivery_path"}])
def test_a_record_with_exactly_the_seeds_fields_validates(record: dict[str, Any]) -> None:
    """OM-6: the seed's fields and no others (a note with its path; a reply with its origin, with
    and without a copy) pass the validator and the shipped schema: `emission_id` is not required."""
    assert set(record) - SEED_FIELDS <= {"origin", "conversation_message_id", "delivery_path"}
    assert validate_operator_message_record(record).ok
    assert schema_errors(record) == []


@pytest.mark.parametrize(("code", "record"), BAD_RECORDS)
def test_a_bad_record_is_refused_by_the_validator_and_the_schema_alike(code: str, record: Any) -> None:
    """OM-3, OM-8, OM-8a: each rejected shape carries its named code, and the schema refuses it too."""
    assert code in validate_operator_message_record(record).codes
    assert schema_errors(record) != []


@pytest.mark.parametrize(("code", "change"), [
    ("UNKNOWN_OPERATOR_MESSAGE_FIELD", {"delivery_policy": "reply_copy"}),
    ("INVALID_OPERATOR_MESSAGE_KIND", {"kind": "note"}),
    ("INVALID_OPERATOR_MESSAGE_SENDER", {"sender": "operator"}),
    ("EMPTY_CONTENT", {"content": " \n\t "}),
    ("EMPTY_CONTENT", {"content": 7}),
    ("MISSING_RUNTIME_CONTEXT", {"source_run_id": None}),
    ("INVALID_OPERATOR_MESSAGE_CONTEXT", {"source_goal_id": "a/b"}),
    ("INVALID_OPERATOR_MESSAGE_ORIGIN", {"origin": {"kind": "conversation", "conversation_id": ""}}),
])
def test_a_bad_request_is_refused_with_its_named_code(code: str, change: dict[str, Any]) -> None:
    """OM-3, OM-7, OM-8: the request validator's codes (None removes the field)."""
    request: dict[str, Any] = {"kind": "tend_survey", "sender": "garden", "content": "x", "source_goal_id": "g",
                               "source_run_id": "r", **change}
    request = {key: value for key, value in request.items() if value is not None}
    assert validate_operator_message_request(request).codes == (code,)


# -- OM-7, OM-8: the emitters refuse before any write ---------------------------------------------------


async def test_outside_any_run_the_context_is_missing(garden: Garden, monkeypatch: pytest.MonkeyPatch) -> None:
    """OM-8 MISSING_RUNTIME_CONTEXT: no run context in this process, none in the environment."""
    for name in list(os.environ):
        if name.startswith("HARNESS_GARDEN_"):
            monkeypatch.delenv(name)
    assert current_run_context() is None
    await refused("MISSING_RUNTIME_CONTEXT", emit_tend_survey, None)
    assert written(garden.root) == []


async def test_a_caller_other_than_the_gardener_is_not_authorized(garden: Garden, ctx: Context) -> None:
    """OM-8 OPERATOR_MESSAGE_NOT_AUTHORIZED."""
    _, run = await in_run(garden, "tend", ctx, caller="operator")
    await refused("OPERATOR_MESSAGE_NOT_AUTHORIZED", emit_tend_survey, run)
    assert written(garden.root) == []


async def test_whitespace_only_content_is_empty(garden: Garden, ctx: Context) -> None:
    """OM-7, OM-8 EMPTY_CONTENT."""
    _, run = await in_run(garden, "tend", ctx)
    await refused("EMPTY_CONTENT", emit_tend_survey, run, " \n ")
    assert written(garden.root) == []


async def test_content_the_conversation_could_never_take_is_too_large_before_any_write(
        garden: Garden, service: ConversationService, ctx: Context) -> None:
    """Issue 29: 3 MB of content (6 MB as the garden message that holds it twice, over the 4 MiB
    bound of a conversation's input) is `CONTENT_TOO_LARGE` before anything is written, where it
    was an `IO_ERROR` whose retry could never succeed; content at the bound is delivered whole."""
    talk = await conversation(service, ctx)
    _, run = await in_run(garden, "durable", ctx, origin=origin_of(talk))
    _, note_run = await in_run(garden, "tend", ctx)

    refusal = await refused("CONTENT_TOO_LARGE", emit_recently_concluded, run, "x" * 3_000_000)
    await refused("CONTENT_TOO_LARGE", emit_tend_survey, note_run, "x" * 3_000_000)
    unwritten = written(garden.root)
    with running(run):
        await emit_recently_concluded("y" * (garden_api.MAX_CONTENT_BYTES - 2), ctx)  # 2: the JSON quotes

    assert refusal.details["field"] == "content"
    assert unwritten == []
    assert await garden_message_count(talk, ctx) == 1


@pytest.mark.parametrize(("goal_type", "emit"), [
    ("durable", emit_tend_survey), ("tend", emit_recently_concluded)])
async def test_a_kind_that_does_not_fit_the_goal_type_is_refused(garden: Garden, ctx: Context, goal_type: GoalType,
                                                                 emit: Any) -> None:
    """OM-7, OM-8 INVALID_OPERATOR_MESSAGE_CONTEXT: tend_survey only from a tend goal,
    recently_concluded only from a durable one."""
    _, run = await in_run(garden, goal_type, ctx)
    await refused("INVALID_OPERATOR_MESSAGE_CONTEXT", emit, run)
    assert written(garden.root) == []


async def test_a_converse_goal_emits_neither_kind(garden: Garden, service: ConversationService, ctx: Context) -> None:
    """OM-7: recently_concluded only from a durable goal that is neither converse nor tend."""
    talk = await conversation(service, ctx)
    _, run = await in_run(garden, "converse", ctx, origin=origin_of(talk))
    for emit in (emit_recently_concluded, emit_tend_survey):
        await refused("INVALID_OPERATOR_MESSAGE_CONTEXT", emit, run)
    assert written(garden.root) == []
    assert await garden_message_count(talk, ctx) == 0


async def test_ids_that_are_not_the_current_runs_are_refused(garden: Garden, ctx: Context) -> None:
    """OM-7: the goal and run ids come from the current run context; a run that is not the goal's
    current one, or a goal type that is not the goal's, is refused."""
    goal, run = await in_run(garden, "tend", ctx)
    await refused("INVALID_OPERATOR_MESSAGE_CONTEXT", emit_tend_survey, RunContext(
        garden=run.garden, root=run.root, goal_id=goal.id, goal_type="tend", run_id=new_id(), caller=GARDENER))
    await refused("INVALID_OPERATOR_MESSAGE_CONTEXT", emit_recently_concluded, RunContext(
        garden=run.garden, root=run.root, goal_id=goal.id, goal_type="durable", run_id=run.run_id, caller=GARDENER))
    await refused("INVALID_OPERATOR_MESSAGE_CONTEXT", emit_tend_survey, RunContext(
        garden=run.garden, root=run.root, goal_id="no-such-goal", goal_type="tend", run_id=run.run_id,
        caller=GARDENER))
    assert written(garden.root) == []


async def test_ids_that_would_leave_the_runtime_root_are_refused_before_any_path(
        garden: Garden, ctx: Context, tmp_path: Path) -> None:
    """Issue 15 item 7: names and ids are checked before a path is built from them."""
    _, run = await in_run(garden, "tend", ctx)
    for bad in ({"run_id": "../../escape"}, {"goal_id": "../goal"}, {"garden": "../other"}):
        values = {"garden": run.garden, "goal_id": run.goal_id, "run_id": run.run_id, **bad}
        await refused("INVALID_OPERATOR_MESSAGE_CONTEXT", emit_tend_survey, RunContext(
            garden=values["garden"], root=run.root, goal_id=values["goal_id"], goal_type="tend",
            run_id=values["run_id"], caller=GARDENER))
    with pytest.raises(OperatorMessageRejected, match="emission id"), running(run):
        await emit_tend_survey("x", ctx, emission_id="../../x")
    assert written(garden.root) == []
    assert not (tmp_path / "escape").exists()
    assert not (garden.root.path / "goal").exists()


async def test_a_missing_origin_conversation_is_not_found(garden: Garden, service: ConversationService,
                                                          ctx: Context) -> None:
    """OM-7, OM-8 CONVERSATION_NOT_FOUND: the goal's conversation was deleted after the goal was given."""
    talk = await conversation(service, ctx)
    _, run = await in_run(garden, "durable", ctx, origin=origin_of(talk))
    await service.close(OWNER, talk.id, ctx)
    await service.store.delete_session(talk.id, ctx)
    await refused("CONVERSATION_NOT_FOUND", emit_recently_concluded, run)
    assert written(garden.root) == []


async def test_an_ended_origin_conversation_is_the_wrong_context(garden: Garden, service: ConversationService,
                                                                 ctx: Context) -> None:
    """OM-7, OM-8 INVALID_OPERATOR_MESSAGE_CONTEXT: the conversation exists but is no longer open."""
    talk = await conversation(service, ctx)
    _, run = await in_run(garden, "durable", ctx, origin=origin_of(talk))
    assert await service.end(OWNER, talk.id, ctx)
    await refused("INVALID_OPERATOR_MESSAGE_CONTEXT", emit_recently_concluded, run)
    assert written(garden.root) == []
    assert await garden_message_count(talk, ctx) == 0


async def test_a_malformed_origin_in_the_goal_is_refused(garden: Garden, service: ConversationService,
                                                         ctx: Context) -> None:
    """OM-4, OM-8 INVALID_OPERATOR_MESSAGE_ORIGIN: routing follows the goal's origin, which must be
    a well-formed conversation link."""
    talk = await conversation(service, ctx)
    goal, run = await in_run(garden, "durable", ctx, origin=origin_of(talk))
    raw = goal.model_dump(mode="json")
    raw["origin"] = {"kind": "conversation", "conversation_id": talk.id}  # its message id lost
    garden.root.write_json(garden.root.goal_file(goal.id), raw)
    await refused("INVALID_OPERATOR_MESSAGE_ORIGIN", emit_recently_concluded, run)
    assert written(garden.root) == []
    assert await garden_message_count(talk, ctx) == 0


async def test_a_note_that_cannot_be_written_is_an_io_error(garden: Garden, ctx: Context) -> None:
    """OM-8 IO_ERROR: the out-of-band note failed, so no record is appended."""
    _, run = await in_run(garden, "tend", ctx)
    garden.root.reply_dir.mkdir(parents=True)
    garden.root.notes_dir.write_text("a file where the notes folder goes")
    await refused("IO_ERROR", emit_tend_survey, run)
    assert not garden.root.records_file(run.run_id).exists()


# -- IO_ERROR, then a retry: nothing twice ---------------------------------------------------------------


async def test_a_retry_after_a_failed_record_append_writes_one_message_and_one_record(
        garden: Garden, service: ConversationService, ctx: Context) -> None:
    """Issue 15 item 4: a failure after the conversation append and before the record append, then
    a retry with the same emission id: one conversation message, one reply copy, one record."""
    talk = await conversation(service, ctx)
    _, run = await in_run(garden, "durable", ctx, origin=origin_of(talk))
    records = garden.root.records_file(run.run_id)
    records.mkdir(parents=True)  # a folder where the records file goes: the append fails
    error = await refused("IO_ERROR", emit_recently_concluded, run, "the heap is turned")
    assert await garden_message_count(talk, ctx) == 1  # the canonical write had landed

    records.rmdir()
    with running(run):
        record = await emit_recently_concluded("the heap is turned", ctx, emission_id=str(error.details["emission_id"]))
        again = await emit_recently_concluded("the heap is turned", ctx, emission_id=record.emission_id)

    assert await garden_message_count(talk, ctx) == 1
    assert len(records.read_text().splitlines()) == 1
    assert again == record
    assert files_in(garden.root.reply_dir) == [f"{record.emission_id}.md"]


# -- concurrent emitters: whole lines only --------------------------------------------------------------

EMISSIONS = 12


async def test_concurrent_emitters_in_one_process_leave_only_whole_valid_lines(garden: Garden, ctx: Context) -> None:
    """OM-2: two emitters as tasks on one run's records file: every line whole and valid."""
    _, run = await in_run(garden, "tend", ctx)

    async def emitter(label: str) -> None:
        with running(run):
            for number in range(EMISSIONS):
                await emit_tend_survey(f"{label} {number}", ctx)

    await within(asyncio.gather(emitter("a"), emitter("b")))
    assert_whole_valid_lines(garden.root.records_file(run.run_id), 2 * EMISSIONS)


async def test_concurrent_emitters_in_two_processes_leave_only_whole_valid_lines(garden: Garden, ctx: Context) -> None:
    """OM-2: two processes, each reading its run context from `HARNESS_GARDEN_*`, append at once."""
    _, run = await in_run(garden, "tend", ctx)
    script = ("import asyncio, sys\nfrom harness.context import Context\nfrom harness.garden import emit_tend_survey\n"
              f"async def main():\n    for n in range({EMISSIONS}):\n"
              "        await emit_tend_survey(f'{sys.argv[1]} {n}', Context({}))\nasyncio.run(main())\n")
    env = {**os.environ, **run.environment(), "PYTHONPATH": str(SRC)}
    children = [await asyncio.create_subprocess_exec(sys.executable, "-c", script, label, env=env)
                for label in ("a", "b")]
    assert [await within(child.wait(), 60) for child in children] == [0, 0]
    assert_whole_valid_lines(garden.root.records_file(run.run_id), 2 * EMISSIONS)


async def test_a_torn_last_line_is_repaired_before_the_next_append(garden: Garden, ctx: Context) -> None:
    """OM-2, OM-9: a crash mid-append leaves a torn line; the next append cuts it off, and the
    reader leaves a torn line out meanwhile."""
    _, run = await in_run(garden, "tend", ctx)
    with running(run):
        first = await emit_tend_survey("one", ctx)
    records = garden.root.records_file(run.run_id)
    with records.open("a") as out:
        out.write('{"schema_version": 1, "emission_')
    assert read_operator_message_records(run.run_id, root=garden.root) == [first]
    with running(run):
        second = await emit_tend_survey("two", ctx)
    assert_whole_valid_lines(records, 2)
    assert read_operator_message_records(run.run_id, root=garden.root) == [first, second]


def assert_whole_valid_lines(path: Path, count: int) -> None:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.decode().splitlines()
    assert len(lines) == count
    for line in lines:
        record = json.loads(line)
        assert validate_operator_message_record(record).ok
        assert schema_errors(record) == []
    assert len({json.loads(line)["emission_id"] for line in lines}) == count


# -- OM-9: records, not the inbox ----------------------------------------------------------------------


def test_a_record_line_that_does_not_validate_is_left_out(tmp_path: Path) -> None:
    """OM-9: the reader loads validated records only."""
    root = RuntimeRoot("allotment", tmp_path)
    root.append_line(root.records_file("r1"), GOOD_NOTE)
    root.append_line(root.records_file("r1"), {**GOOD_NOTE, "emission_id": "e2", "sender": "person"})
    assert [record.emission_id for record in read_operator_message_records("r1", root=root)] == ["e1"]
    with pytest.raises(ValueError, match="run id"):
        read_operator_message_records("../r1", root=root)


async def test_an_old_record_without_an_emission_id_is_read_and_observed(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """OM-6, OM-9: a survey record holding only the seed's fields, written during a tend run, is
    loaded by the reader (no emission id) and is the note the driver's tend-finished observes."""
    def survey_as_an_older_writer(request: FauxRequest) -> str:
        run = current_run_context()
        assert run is not None
        root = RuntimeRoot(run.garden, run.root)
        root.append_line(root.records_file(run.run_id), {
            **SEED_NOTE, "source_goal_id": run.goal_id, "source_run_id": run.run_id,
            "delivery_path": "inbox/allotment/notes/older.md"})
        return "Surveyed."

    service, _ = faux_service(store, survey_as_an_older_writer)
    garden = await make_garden(store, service, tmp_path / "root", ctx)
    goal = await garden.add_goal("tend", "Look at the beds.", ctx)
    try:
        event = await within(garden.pursue(goal.id, ctx))
    finally:
        await garden.close(ctx)
        await service.close_all(ctx)

    assert isinstance(event, TendFinished)
    [record] = read_operator_message_records(event.run_id, root=garden.root)
    assert (record.emission_id, record.kind, record.source_run_id) == (None, "tend_survey", event.run_id)
    assert (event.operator_note_written, event.operator_note_path) == (True, "inbox/allotment/notes/older.md")


async def test_a_retry_beside_an_old_record_without_an_emission_id_appends_once(garden: Garden, ctx: Context) -> None:
    """OM-6: a record lacking `emission_id` is no emission's record: an emission appends its own
    beside it, and its retry finds that one and appends nothing."""
    _, run = await in_run(garden, "tend", ctx)
    records = garden.root.records_file(run.run_id)
    older = {**SEED_NOTE, "source_goal_id": run.goal_id, "source_run_id": run.run_id}
    garden.root.append_line(records, older)
    with running(run):
        first = await emit_tend_survey("one", ctx, emission_id="e9")
        again = await emit_tend_survey("one", ctx, emission_id="e9")

    assert again == first
    assert [json.loads(line).get("emission_id") for line in records.read_text().splitlines()] == [None, "e9"]
    assert [record.emission_id for record in read_operator_message_records(run.run_id, root=garden.root)] == [
        None, "e9"]


def test_the_subprocess_environment_carries_the_run_context(tmp_path: Path) -> None:
    """Issue 15 item 3: `HARNESS_GARDEN_*` is how a subprocess reads the run context."""
    run = RunContext(garden="allotment", root=tmp_path, goal_id="g1", goal_type="tend", run_id="r1",
                     caller=GARDENER)
    found = subprocess.run(
        [sys.executable, "-c", "from harness.garden import current_run_context as c; r = c(); "
                               "print(r.garden, r.goal_id, r.goal_type, r.run_id, r.caller)"],
        env={**os.environ, **run.environment(), "PYTHONPATH": str(SRC)}, capture_output=True, text=True, check=True)
    assert found.stdout.split() == ["allotment", "g1", "tend", "r1", GARDENER]
    assert current_run_context({**run.environment(), "HARNESS_GARDEN_RUN_ID": ""}) is None
