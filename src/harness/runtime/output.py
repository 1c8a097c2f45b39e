"""A run's structured output (issue 32): the shape its final answer must take, checked when the run
would end. An answer that fits is recorded as an `OUTPUT_ENTRY_TYPE` entry in the run's terminal
commit; one that does not (its schema, or the run's `RunHooks.check_output`, which the `Agent`
points at its output type's validators) is sent back to the model with what is wrong (an
`OUTPUT_REJECTED_TYPE` message it reads), up to the run's `output_retries` times, after which the
run fails `output_invalid`. Each of these is a commit of the run, so a run resumed after a crash
asks for the same shape and counts the answers already sent back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import JsonValue

from harness.context import Context
from harness.errors import InvalidInput
from harness.messages import AssistantMessage, CustomMessage, OutputSchema, parse_json_text, text_of
from harness.session import (
    CustomMessagePayload,
    CustomPayload,
    Entry,
    LaneLastResult,
    MessagePayload,
    SessionReader,
)

# jsonschema (with referencing and attrs) loads at the first schema checked, not with the
# runtime: a chat's start never checks one (issue 33, item 13).
if TYPE_CHECKING:
    import jsonschema

OUTPUT_ENTRY_TYPE = "structured_output"
"""The custom entry (the model never reads it) of a run's validated answer:
`{"schema": name, "output": the answer's JSON, "entry_id": the reply it came from}`."""

OUTPUT_REJECTED_TYPE = "output_rejected"
"""The custom message (the model reads it) that sends an answer that did not fit back."""

MAX_ERRORS_SHOWN = 5


def check_output_schema(output: OutputSchema) -> None:
    """Refuse a schema that is not a JSON Schema (Draft 2020-12): `InvalidInput`, nothing written."""
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(output.json_schema)
    except jsonschema.SchemaError as error:
        raise InvalidInput(f"the output schema is not a JSON Schema: {error.message}",
                           path="/".join(str(part) for part in error.path)) from error


@dataclass(frozen=True)
class Accepted:
    """The answer fits: `entry` is the payload recording it."""

    entry: CustomPayload


@dataclass(frozen=True)
class Rejected:
    """The answer does not fit, for `reason`; `feedback` is what the model is sent when it may
    answer again (None: the retries are spent)."""

    reason: str
    feedback: CustomMessage | None


def judge(output: OutputSchema, retries: int, run_entries: Sequence[Entry], reply_id: str | None,
          reply: AssistantMessage | None, check: Callable[[JsonValue], str | None] | None = None
          ) -> Accepted | Rejected:
    """Whether `reply` (entry `reply_id`, the run's final reply; None when it ended without one)
    answers in the shape of `output`: JSON its schema takes, which `check` (the run's
    `RunHooks.check_output`, the output type's own validators) does not refuse either.
    `run_entries` are the branch's entries the run placed, which count the answers sent back
    already, for either reason, against `retries`."""
    reason = _misfit(output, reply)
    complaint = "does not fit the required JSON Schema"
    if isinstance(reason, _Fits):
        answer = output.answer(reason.value)
        refused = check(answer) if check is not None else None
        if refused is None:
            return Accepted(CustomPayload(custom_type=OUTPUT_ENTRY_TYPE, data={
                "schema": output.name, "output": answer, "entry_id": reply_id}))
        reason, complaint = refused, "fits the JSON Schema but not the checks of the answer's type"
    sent_back = sum(1 for entry in run_entries if isinstance(entry.payload, CustomMessagePayload)
                    and entry.payload.message.custom_type == OUTPUT_REJECTED_TYPE)
    if sent_back >= retries:
        return Rejected(reason, None)
    feedback = CustomMessage(custom_type=OUTPUT_REJECTED_TYPE, display=True,
                             content=f"Your answer {complaint}: {reason}. Give the "
                                     f"whole answer again, fixed: JSON only, or a call of the {output.name} "
                                     f"tool where it is offered.",
                             details={"schema": output.name, "attempt": sent_back + 1})
    return Rejected(reason, feedback)


@dataclass(frozen=True)
class _Fits:
    value: JsonValue


def _misfit(output: OutputSchema, reply: AssistantMessage | None) -> str | _Fits:
    """What is wrong with `reply` as an answer, or the value it gives."""
    text = text_of(reply.content).strip() if reply is not None else ""
    if not text:
        return "no answer: the reply has no text"
    try:
        value = parse_json_text(_unfenced(text))
    except ValueError as error:
        return f"the reply is not JSON ({error})"
    import jsonschema
    from jsonschema.exceptions import best_match

    validator = jsonschema.Draft202012Validator(output.json_schema)
    errors = sorted(validator.iter_errors(value), key=lambda error: list(error.absolute_path))
    if not errors:
        return _Fits(value)
    first = best_match(errors)
    shown = [first, *(error for error in errors if error is not first)][:MAX_ERRORS_SHOWN]
    return "; ".join(f"at {_where(error)}: {error.message}" for error in shown)


def _where(error: jsonschema.ValidationError) -> str:
    return "/" + "/".join(str(part) for part in error.absolute_path)


def _unfenced(text: str) -> str:
    """`text` without a Markdown code fence around it, which models add to JSON unasked."""
    if text.startswith("```") and text.endswith("```"):
        body = text[3:-3]
        return body.split("\n", 1)[1] if "\n" in body else body
    return text


def run_entries(entries: Sequence[Entry], prompt_entry_ids: Sequence[str]) -> list[Entry]:
    """The entries of `entries` (a branch, oldest first) from the run's first prompt entry on."""
    for index, entry in enumerate(entries):
        if entry.id in prompt_entry_ids:
            return list(entries[index:])
    return list(entries)  # a compaction since then: what is left of the branch is the run's


def reply_of(entries: Sequence[Entry], reply_id: str | None) -> AssistantMessage | None:
    """The assistant reply of entry `reply_id`, if it is among `entries`."""
    for entry in reversed(entries):
        if entry.id == reply_id and isinstance(entry.payload, MessagePayload) \
                and isinstance(entry.payload.message, AssistantMessage):
            return entry.payload.message
    return None


async def recorded_output(reader: SessionReader, result: LaneLastResult, context: Context) -> RecordedOutput | None:
    """The answer run `result` recorded (its `OUTPUT_ENTRY_TYPE` entry), found by walking from the
    tip it settled at back to its final reply: O(the rows its terminal commit placed). None for a
    run that recorded none (no shape was asked, or it did not complete)."""
    entry_id = result.tip_id
    while entry_id is not None and entry_id != result.final_assistant_entry_id:
        entry = await reader.entry(entry_id, context)
        if entry is None:
            return None
        payload = entry.payload
        if isinstance(payload, CustomPayload) and payload.custom_type == OUTPUT_ENTRY_TYPE \
                and isinstance(payload.data, dict):
            return RecordedOutput(schema=str(payload.data.get("schema")), output=payload.data.get("output"),
                                  entry_id=entry.id)
        entry_id = entry.parent_id
    return None


@dataclass(frozen=True)
class RecordedOutput:
    """A run's validated answer as its journal keeps it: the schema's name, the answer's JSON, and
    the id of the entry recording it."""

    schema: str
    output: JsonValue
    entry_id: str
