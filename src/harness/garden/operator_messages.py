"""Operator messages: the gardener's two kinds of note (`tend_survey`, `recently_concluded`), each
routed by the current goal's origin and recorded once per emission (OM-1 to OM-9).

An emission validates everything first: the run context (`MISSING_RUNTIME_CONTEXT`, the gardener
as caller or `OPERATOR_MESSAGE_NOT_AUTHORIZED`), the request, that the kind fits the current goal
and that an origin conversation exists and is open. Only then does it write, in this order: the
`sender: garden` message in the origin conversation (the canonical record), then the reply copy in
`inbox/<garden>/` or the note in `inbox/<garden>/notes/`, then one validated line in
`runs/<run-id>/operator-messages.jsonl`. Every write carries the emission's id: the conversation
message in its details, the file in its name, the record in `emission_id`; so retrying an
emission that failed with `IO_ERROR` under the same id finishes what is missing and repeats
nothing. Nothing else writes through this path (OM-1, OM-10).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from harness.context import Context
from harness.conversation import (
    JOURNAL_DATA_MIGRATIONS,
    ConversationService,
    Forbidden,
    GardenMessage,
)
from harness.errors import HarnessError
from harness.garden.errors import refusal, rejected
from harness.garden.records import GARDENER, ConversationOrigin, GardenRecord, Goal
from harness.garden.root import NameKind, RuntimeRoot, name_problem, read_lines
from harness.garden.run_context import RunContext, current_run_context
from harness.garden.validation import (
    SCHEMA_VERSION,
    OperatorMessageKind,
    schema_errors,
    validate_operator_message_record,
    validate_operator_message_request,
)
from harness.messages import TextContent, now_ms
from harness.providers import ToolSpec
from harness.runtime import AgentTool, ProgressCallback, ToolOutput
from harness.session import SessionNotFound, connect
from harness.session.ids import new_id

logger = logging.getLogger("harness.garden")


class OperatorMessageRecord(BaseModel):
    """One validated line of a run's `operator-messages.jsonl` (OM-2, OM-6). `delivery_path` is
    relative to the runtime root. `emission_id` is not one of the seed's fields: this module's
    emissions write it, and a record without it (written before, or by another writer) reads
    with None there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1]
    emission_id: str | None = None
    kind: OperatorMessageKind
    sender: Literal["garden"]
    transcript_policy: Literal["canonical", "none"]
    delivery_policy: Literal["reply_copy", "out_of_band_note"]
    emitted_at: int
    source_goal_id: str
    source_run_id: str
    origin: ConversationOrigin | None = None
    conversation_message_id: str | None = None
    delivery_path: str | None = None


async def emit_tend_survey(content: str, context: Context, *, emission_id: str | None = None) -> OperatorMessageRecord:
    """Emit the survey of a tending run: allowed only from the current tend goal's run (OM-7).

    `emission_id` (an id; default a new one) names the emission; after `IO_ERROR` retry with the
    one in the error's details. Returns the record appended (or, on a retry that finds it, the
    record already there). Raises `OperatorMessageRejected` with a named code (OM-8); every code
    but `IO_ERROR` means nothing was written."""
    return await _emit("tend_survey", content, context, emission_id)


async def emit_recently_concluded(content: str, context: Context, *,
                                  emission_id: str | None = None) -> OperatorMessageRecord:
    """Emit the note that a durable goal concluded: allowed only from the run of the current
    durable goal, never a converse or tend one (OM-7). Otherwise as `emit_tend_survey`."""
    return await _emit("recently_concluded", content, context, emission_id)


def read_operator_message_records(run_id: str, *, root: RuntimeRoot) -> list[OperatorMessageRecord]:
    """The records of run `run_id` in `root`, oldest first (OM-9). A line that is torn or fails
    validation is logged and left out, never guessed at. Raises `InvalidInput` for a malformed
    run id, before any path is built from it."""
    records = []
    for line in read_lines(root.records_file(run_id)):
        result = validate_operator_message_record(line)
        if not result.ok:
            logger.error("run %s: an operator-message record that does not validate (%s)", run_id,
                         ", ".join(result.codes))
            continue
        records.append(OperatorMessageRecord.model_validate(line))
    return records


# -- the emission ------------------------------------------------------------------------------------


async def _emit(kind: OperatorMessageKind, content: str, context: Context,
                emission_id: str | None) -> OperatorMessageRecord:
    run = current_run_context()
    if run is None:
        raise rejected("MISSING_RUNTIME_CONTEXT",
                       "no current goal or run: operator messages come from a gardener's run")
    if run.caller != GARDENER:
        raise rejected("OPERATOR_MESSAGE_NOT_AUTHORIZED",
                       f"only the gardener emits operator messages, not {run.caller!r}", caller=run.caller)
    emission = emission_id if emission_id is not None else new_id()
    if (problem := name_problem("emission id", emission)) is not None:
        raise rejected("INVALID_OPERATOR_MESSAGE_VALUE", problem, field="emission_id")
    names: tuple[tuple[NameKind, str], ...] = (("garden name", run.garden), ("goal id", run.goal_id),
                                               ("run id", run.run_id))
    for label, value in names:
        if (problem := name_problem(label, value)) is not None:  # before any path is built from them
            raise rejected("INVALID_OPERATOR_MESSAGE_CONTEXT", f"the run context's {problem}")
    root = RuntimeRoot(run.garden, run.root)
    garden, raw_goal = _read_run_files(root, run)
    request: dict[str, JsonValue] = {"kind": kind, "sender": "garden", "content": content,
                                     "source_goal_id": run.goal_id, "source_run_id": run.run_id}
    if raw_goal.get("origin") is not None:
        request["origin"] = raw_goal["origin"]  # routing follows the goal, never the caller (OM-4)
    checked = validate_operator_message_request(request)
    if not checked.ok:
        raise refusal(checked.rejections[0], emission_id=emission)
    goal = _goal(raw_goal, run)
    _kind_fits(kind, goal)
    async with _conversations(run, goal, context) as service:
        if goal.origin is not None:
            assert service is not None
            await _check_open(service, garden.owner, goal.origin, context)
        # Validated: from here on, writes.
        record: dict[str, JsonValue] = {
            "schema_version": SCHEMA_VERSION, "emission_id": emission, "kind": kind, "sender": "garden",
            "emitted_at": now_ms(), "source_goal_id": run.goal_id, "source_run_id": run.run_id}
        if goal.origin is not None:
            assert service is not None
            message = GardenMessage(garden=root.name, kind=kind, emission_id=emission, goal_id=goal.id,
                                    run_id=run.run_id, text=content)
            try:
                message_id = await service.post_garden_message(garden.owner, goal.origin.conversation_id, message,
                                                               context)
            except HarnessError as error:
                raise rejected("IO_ERROR", f"the message to conversation {goal.origin.conversation_id} was not "
                               f"appended: {error.message}", emission_id=emission, cause=error.code) from error
            record.update(transcript_policy="canonical", delivery_policy="reply_copy",
                          origin=goal.origin.model_dump(mode="json"), conversation_message_id=message_id)
            reply = root.reply_dir / f"{emission}.md"
            try:
                await asyncio.to_thread(root.write_file, reply, _file_text(content))
                record["delivery_path"] = root.relative(reply)
            except OSError as error:  # the conversation holds the message; the copy is a courtesy (OM-8)
                logger.warning("emission %s: no reply copy in %s: %s", emission, root.reply_dir, error)
        else:
            note = root.notes_dir / f"{emission}.md"
            try:
                await asyncio.to_thread(root.write_file, note, _file_text(content))
            except OSError as error:
                raise rejected("IO_ERROR", f"the note was not written: {error}", emission_id=emission) from error
            record.update(transcript_policy="none", delivery_policy="out_of_band_note",
                          delivery_path=root.relative(note))
    _check_record(record)
    try:
        existing = await asyncio.to_thread(root.append_line, root.records_file(run.run_id), record,
                                           already=lambda known: known.get("emission_id") == emission)
    except OSError as error:
        raise rejected("IO_ERROR", f"the record was not appended: {error}", emission_id=emission) from error
    return OperatorMessageRecord.model_validate(existing if existing is not None else record)


def _read_run_files(root: RuntimeRoot, run: RunContext) -> tuple[GardenRecord, dict[str, JsonValue]]:
    """The garden and the raw goal the run context names; a missing or unreadable one is not a
    current goal (`INVALID_OPERATOR_MESSAGE_CONTEXT`)."""
    try:
        garden = GardenRecord.model_validate_json(root.garden_file.read_bytes())
        raw = json.loads(root.goal_file(run.goal_id).read_bytes())
    except (OSError, ValueError, ValidationError) as error:
        raise rejected("INVALID_OPERATOR_MESSAGE_CONTEXT",
                       f"garden {run.garden} has no readable goal {run.goal_id} at {root.path}: {error}") from error
    if not isinstance(raw, dict):
        raise rejected("INVALID_OPERATOR_MESSAGE_CONTEXT", f"goal {run.goal_id} is not a JSON object")
    return garden, raw


def _goal(raw: dict[str, JsonValue], run: RunContext) -> Goal:
    try:
        goal = Goal.model_validate(raw)
    except ValidationError as error:
        raise rejected("INVALID_OPERATOR_MESSAGE_CONTEXT", f"goal {run.goal_id} does not read: {error}") from error
    if goal.type != run.goal_type or goal.current_run_id != run.run_id:
        raise rejected("INVALID_OPERATOR_MESSAGE_CONTEXT",
                       f"run {run.run_id} of a {run.goal_type} goal is not the current run of goal {goal.id}",
                       goal_type=goal.type, current_run_id=goal.current_run_id)
    return goal


def _kind_fits(kind: OperatorMessageKind, goal: Goal) -> None:
    wanted = "tend" if kind == "tend_survey" else "durable"
    if goal.type != wanted:
        raise rejected("INVALID_OPERATOR_MESSAGE_CONTEXT",
                       f"a {kind} comes from a {wanted} goal; goal {goal.id} is a {goal.type} goal",
                       goal_type=goal.type)


async def _check_open(service: ConversationService, owner: str, origin: ConversationOrigin, context: Context) -> None:
    try:
        is_open = await service.is_open(owner, origin.conversation_id, context)
    except (SessionNotFound, Forbidden) as error:
        raise rejected("CONVERSATION_NOT_FOUND", f"the goal's conversation {origin.conversation_id} does not exist",
                       conversation_id=origin.conversation_id) from error
    if not is_open:
        raise rejected("INVALID_OPERATOR_MESSAGE_CONTEXT", f"the goal's conversation {origin.conversation_id} "
                       "was ended", conversation_id=origin.conversation_id)


@asynccontextmanager
async def _conversations(run: RunContext, goal: Goal, context: Context) -> AsyncIterator[ConversationService | None]:
    """The conversation service an emission for `goal` speaks through: the garden's own in its
    process, else one on the journal the run context names (closed after); None for no origin."""
    if goal.origin is None:
        yield None
        return
    if run.service is not None:
        yield run.service
        return
    if run.store_url is None:
        raise rejected("INVALID_OPERATOR_MESSAGE_CONTEXT", "the run context names no journal for the goal's "
                       "conversation (HARNESS_GARDEN_STORE)")
    store = await connect(run.store_url, context, data_migrations=JOURNAL_DATA_MIGRATIONS)
    try:
        yield ConversationService(store)
    finally:
        await store.close()


def _check_record(record: dict[str, JsonValue]) -> None:
    """A record about to be written passes the validator and the schema; the emitter built it, so
    a refusal here is this module's bug, raised rather than written."""
    result = validate_operator_message_record(record)
    if not result.ok:
        raise refusal(result.rejections[0])
    if errors := schema_errors(record):
        raise AssertionError(f"the validator accepted a record the schema refuses: {errors[0]}")


def _file_text(content: str) -> str:
    return content if content.endswith("\n") else content + "\n"


# -- the gardener's tools ----------------------------------------------------------------------------

class _Emitter(Protocol):
    async def __call__(self, content: str, context: Context, *,
                       emission_id: str | None = None) -> OperatorMessageRecord: ...


_Execute = Callable[[str, dict[str, JsonValue], ProgressCallback, Context], Awaitable[ToolOutput]]

_PARAMETERS: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"content": {"type": "string", "description": "The note, in Markdown."}},
    "required": ["content"],
    "additionalProperties": False,
}


def operator_message_tools() -> list[AgentTool]:
    """`emit_tend_survey` and `emit_recently_concluded` as the gardener's tools. A call's emission
    id is derived from its run and tool call ids, so the same call emitted again (a retry after
    `IO_ERROR`) writes nothing twice; a refusal is the call's error result, with its code."""
    return [
        AgentTool(spec=ToolSpec(name="emit_tend_survey", parameters=_PARAMETERS,
                                description="Leave the survey of this tending run for the garden's operator: what "
                                            "you looked at, what you found, what needs a person."),
                  execute=_tool(emit_tend_survey)),
        AgentTool(spec=ToolSpec(name="emit_recently_concluded", parameters=_PARAMETERS,
                                description="Tell the garden's operator that this goal has concluded, and how."),
                  execute=_tool(emit_recently_concluded)),
    ]


def _tool(emit: _Emitter) -> _Execute:
    async def execute(tool_call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                      context: Context) -> ToolOutput:
        run = current_run_context()
        emission = None
        if run is not None:
            emission = hashlib.sha256(f"{run.run_id}\n{tool_call_id}".encode()).hexdigest()[:32]
        content = args.get("content")
        try:
            record = await emit(content if isinstance(content, str) else "", context, emission_id=emission)
        except HarnessError as error:
            return ToolOutput(content=[TextContent(text=f"refused [{error.code}]: {error.message}")], is_error=True)
        where = record.delivery_path or "the conversation"
        return ToolOutput(content=[TextContent(text=f"{record.kind} written to {where}")],
                          details=record.model_dump(mode="json", exclude_none=True))

    return execute
