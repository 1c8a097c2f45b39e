"""Bad input at the public doors, on every backend: one typed error per kind, and nothing written.

Each case is one an attacker tried; the docstrings say what used to happen."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from drive_helpers import branch, start_rig, within
from harness.context import Context, NotAContext
from harness.errors import HarnessError, InvalidInput
from harness.messages import Cost, ModelIdentity, Record, TextContent, ToolResultMessage, Usage, UserMessage
from harness.runtime import InvalidMessage, Lane, PromptRequest, PromptTooLarge, Settled
from harness.runtime.requests import MAX_INPUT_BYTES
from harness.session import (
    CustomPayload,
    MessagePayload,
    RecordTooLarge,
    SessionMutator,
    SessionNotFound,
    Store,
    value_address,
)
from harness.session.session import MAX_RECORD_BYTES
from harness_helpers import recording, said

BAD_IDS = ["a\ud800", "a\x00b", "", 123]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
async def test_opening_an_id_no_backend_can_store_finds_no_session(store: Store, ctx: Context, bad: Any) -> None:
    """`open_session("a\\ud800")` raised UnicodeEncodeError on SQLite and PostgreSQL, and
    `open_session("a\\x00b")` a psycopg DataError on PostgreSQL."""
    with pytest.raises(SessionNotFound):
        await store.open_session(bad, ctx)


@pytest.mark.parametrize("bad", ["x\x00", "x\udc00"], ids=repr)
async def test_a_session_id_no_backend_can_store_is_refused_on_every_backend(
    store: Store, ctx: Context, bad: str
) -> None:
    """`create_session(session_id="x\\x00")` succeeded on SQLite and failed on PostgreSQL."""
    with pytest.raises(InvalidInput):
        await store.create_session(ctx, session_id=bad)
    assert await store.list_sessions(ctx) == []


def _untyped(value: Any) -> Any:
    return value  # the calls below break the types on purpose, as an untyped caller would


def _forged(record: Any, **fields: Any) -> Any:
    """`record` with `fields` set behind validation's back: `model_copy` and `model_construct`
    validate on a `Record`, so only writing its attributes directly can do this."""
    for name, value in fields.items():
        object.__setattr__(record, name, value)
    return record


UNVALIDATED_MESSAGES: dict[str, Any] = {
    "a forged wrong type": _forged(UserMessage(content="hi"), content=123),
    "a forged bogus block": _forged(UserMessage(content="hi"), content=[_untyped({"type": "x"})]),
    "a forged block inside": UserMessage(content=[_forged(TextContent(text="a"), text=5)]),
    "a dict": {"role": "user", "content": "hi"},
    "a string": "hi",
}

Call = Callable[[Lane, Context], Awaitable[object]]


def _prompt_of(message: Any) -> Call:
    return lambda lane, ctx: lane.prompt(message, ctx)


def _queued(message: Any) -> Call:
    return lambda lane, ctx: lane.queue_next_run(message, ctx)


BAD_CALLS: dict[str, tuple[type[HarnessError], Call]] = {
    "prompt text that is not a string": (InvalidMessage, lambda lane, ctx: _untyped(lane).prompt(123, None, ctx)),
    "prompt images that are not images": (InvalidMessage, lambda lane, ctx: _untyped(lane).prompt("hi", ["x"], ctx)),
    "a context that is not a Context": (NotAContext, lambda lane, ctx: _untyped(lane).prompt("hi", None, object())),
    "no context": (NotAContext, lambda lane, ctx: _untyped(lane).watch(None)),
    "a model given as a string": (InvalidInput, lambda lane, ctx: _untyped(lane).set_model("openai/gpt-4o", ctx)),
    **{f"prompt of {name}": (InvalidMessage, _prompt_of(message)) for name, message in UNVALIDATED_MESSAGES.items()},
    **{f"queued {name}": (InvalidMessage, _queued(message)) for name, message in UNVALIDATED_MESSAGES.items()},
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
async def test_bad_input_at_the_lane_gets_a_typed_error_and_changes_nothing(
    store: Store, ctx: Context, case: str
) -> None:
    """These raised pydantic's ValidationError or AttributeError; a message built with
    `model_copy(update=...)` (which now validates) was even committed, after which every read of the session raised
    StorageCorruption and the lane stayed busy forever."""
    expected, call = BAD_CALLS[case]
    rig = await start_rig(store, ctx, ["fine"])
    try:
        with pytest.raises(expected):
            await call(rig.lane, ctx)
        outcome = await within(rig.lane.prompt("still works", None, ctx))
        assert isinstance(outcome, Settled)
        assert outcome.result.outcome == "completed"
        assert [entry.payload.type for entry in await branch(rig.lane, ctx)] == ["message", "message"]
    finally:
        await rig.harness.close(ctx)


class _Note(BaseModel):
    """An application's own record type: pydantic's `model_construct` skips its validation."""

    text: str
    weight: float


@pytest.mark.parametrize("bad", [_Note.model_construct(text=_untyped(5), weight=1.0), _Note(text="x", weight=math.nan)],
                         ids=["unvalidated", "nan"])
async def test_the_journal_reads_back_an_application_model_and_refuses_what_would_not_read(
        store: Store, ctx: Context, bad: _Note) -> None:
    """The journal's backstop: a write never stores what no reader can decode. A type not built
    only of `Record`s is read back as it is written, so an instance built unchecked, or a NaN
    (written as null), is refused with `InvalidInput` and nothing is written."""
    session = await store.create_session(ctx)
    address = value_address("app.note", "k", _Note)
    with pytest.raises(InvalidInput):
        await session.mutate(lambda m: _set(m, address, bad), ctx)
    assert await session.get(address, ctx) is None


async def _set(m: SessionMutator, address: Any, value: Any) -> None:
    m.set(address, value)


class _Tree(Record):
    """An application's recursive record: its values may nest past the JSON reader's limit."""

    children: list[_Tree] = Field(default_factory=list)


def _nested(depth: int) -> _Tree:
    tree = _Tree()
    for _ in range(depth):
        tree = _Tree(children=[tree])
    return tree


async def test_what_no_reader_could_decode_is_refused_even_from_a_record(store: Store, ctx: Context) -> None:
    """Found by trying to break the skipped read-back: an int of more than 4,300 digits (which
    pydantic writes and its JSON reader refuses) in a tool result's details, and a recursive
    record nested past the reader's depth limit, were written and made the branch unreadable.
    Both are refused with `InvalidInput` now and nothing is written."""
    session = await store.create_session(ctx)
    huge = ToolResultMessage(tool_call_id="c1", tool_name="calc", content=[TextContent(text="ok")],
                             details={"value": math.factorial(2000)})

    async def write(m: SessionMutator) -> None:
        m.insert_entry(MessagePayload(message=huge), parent_id=None)

    with pytest.raises(InvalidInput):
        await session.mutate(write, ctx)
    address = value_address("app.tree", "k", _Tree)
    with pytest.raises(InvalidInput):
        await session.mutate(lambda m: _set(m, address, _nested(150)), ctx)
    assert await session.read_entries(ctx) == []
    assert await session.get(address, ctx) is None


class _Tagged(Record):
    tags: tuple[str, ...]


async def test_a_lone_surrogate_in_a_plain_string_of_a_strict_record_is_cleaned(store: Store, ctx: Context) -> None:
    """Text a record does not clean itself is cleaned from its JSON form and validated again:
    leniently, as a tuple is a list there (strictly, it was refused)."""
    session = await store.create_session(ctx)
    address = value_address("app.tags", "k", _Tagged)
    await session.mutate(lambda m: _set(m, address, _Tagged(tags=("caf\ud800",))), ctx)
    assert await session.get(address, ctx) == _Tagged(tags=("caf\ufffd",))


def test_a_record_is_never_built_unchecked() -> None:
    """`model_construct` and `model_copy(update=...)` validate a `Record` (pydantic's skip it),
    and a subclass's instance is validated again where the record takes one, so the journal can
    write records without reading them back."""
    with pytest.raises(ValidationError):
        UserMessage.model_construct(content=_untyped(123))
    with pytest.raises(ValidationError):
        said("x").model_copy(update={"content": 123})
    with pytest.raises(ValidationError):
        Usage(cost=Cost(input=math.inf))
    assert said("x").model_copy(update={"content": "y"}).content == "y"

    class Loose(TextContent):
        pass

    loose = Loose.model_validate({"text": "a"})
    object.__setattr__(loose, "text", 5)  # a subclass instance, changed behind validation's back
    with pytest.raises(ValidationError):
        UserMessage(content=[loose])


async def test_the_journal_refuses_a_record_over_its_bound(store: Store, ctx: Context) -> None:
    """Issue 11: nothing bounded a record, so a writer could store one no reader decodes without
    ballooning (SQLite took up to 1e9 bytes, PostgreSQL 1 GB). Whoever writes it, a record over
    `MAX_RECORD_BYTES` is refused on every backend and nothing of the job is written."""
    session = await store.create_session(ctx)

    async def write(m: SessionMutator) -> None:
        m.insert_entry(CustomPayload(custom_type="note", data="small"), parent_id=None)
        m.insert_entry(CustomPayload(custom_type="dump", data="x" * MAX_RECORD_BYTES), parent_id=None)

    with pytest.raises(RecordTooLarge) as refused:
        await session.mutate(write, ctx)

    assert refused.value.code == "record_too_large"
    assert refused.value.details["limit_bytes"] == MAX_RECORD_BYTES
    assert await session.read_entries(ctx) == []


# -- input over the byte bound, whatever the model (issue 11, item 10) ------------------------------

HALF = "x" * (MAX_INPUT_BYTES // 2)
UNMEASURED = ModelIdentity(provider="elsewhere", model_id="big-window")
"""A model the registry does not know: no window check applies, only the byte bound."""


def _open_run(lane: Lane, ctx: Context) -> Awaitable[object]:
    return lane.accept(PromptRequest(text="go"), ctx)


OVERSIZED: dict[str, tuple[bool, Call]] = {  # (needs an open run, the call)
    "prompt text": (False, lambda lane, ctx: lane.prompt("x" * (MAX_INPUT_BYTES + 1), None, ctx)),
    # Fewer characters than the bound, more bytes: the bound is what the journal stores, in UTF-8.
    "prompt text over in bytes only": (False, lambda lane, ctx: lane.prompt("é" * (MAX_INPUT_BYTES // 2 + 1), None,
                                                                            ctx)),
    "prompt messages that fit alone, not together": (False, lambda lane, ctx: lane.prompt([said(HALF), said(HALF)],
                                                                                          ctx)),
    "steer": (True, lambda lane, ctx: lane.steer(said(HALF + HALF), ctx)),
    "follow-up": (True, lambda lane, ctx: lane.follow_up(said(HALF + HALF), ctx)),
    "next-run message": (False, lambda lane, ctx: lane.queue_next_run(said(HALF + HALF), ctx)),
    "appended message": (False, lambda lane, ctx: lane.append_message(said(HALF + HALF), ctx)),
}


@pytest.mark.parametrize("case", list(OVERSIZED))
async def test_input_over_the_byte_bound_is_refused_and_nothing_is_written(
    store: Store, ctx: Context, case: str
) -> None:
    """A 10 MB prompt cost 100 to 154 MB of resident memory, and without a registry that knew the
    model's window nothing refused it. Every door now refuses input over `MAX_INPUT_BYTES` with
    `prompt_too_large`, whatever the model, before the lane commits anything."""
    needs_run, call = OVERSIZED[case]
    watched, backend = recording(store)
    rig = await start_rig(watched, ctx, model=UNMEASURED)
    if needs_run:
        await _open_run(rig.lane, ctx)
    commits = len(backend.commits)

    with pytest.raises(PromptTooLarge) as refused:
        await call(rig.lane, ctx)

    error = refused.value
    assert error.code == "prompt_too_large"
    assert error.details["limit_bytes"] == MAX_INPUT_BYTES
    size = error.details["bytes"]
    assert isinstance(size, int)
    assert size > MAX_INPUT_BYTES
    assert f"{size:,} bytes" in error.message
    assert len(backend.commits) == commits
    watch = await rig.lane.watch(ctx)
    watch.close()
    queues = watch.snapshot.queues
    assert (queues.steer, queues.follow_up, queues.next_run, watch.snapshot.pending_writes) == ((), (), (), ())
    await rig.harness.close(ctx)


async def test_input_just_under_the_byte_bound_is_accepted_and_stored_whole(store: Store, ctx: Context) -> None:
    """The bound is the journal's size of the message, not less: a prompt a few bytes under it is
    stored and reads back as sent."""
    rig = await start_rig(store, ctx, model=UNMEASURED)
    text = "x" * (MAX_INPUT_BYTES - 100)  # the message's JSON adds about 50 bytes

    await rig.lane.accept(PromptRequest(text=text), ctx)

    [entry] = await branch(rig.lane, ctx)
    assert isinstance(entry.payload, MessagePayload)
    assert entry.payload.message.content == text
    await rig.harness.close(ctx)
