"""The two validation boundaries of operator messages: a request before anything is written, and
a record before it is appended or after it is read (OM-3, OM-7, OM-8, OM-8a).

Both return a `ValidationResult` carrying every named rejection found, in a fixed order. The
record validator and `schema/operator-message.schema.json`, which ships in this package, say the
same thing: the patterns of ids and delivery paths are read from the schema itself, and a record
the validator accepts is checked against the schema with `jsonschema` before it is written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from importlib.resources import files
from typing import Any, Literal, TypeAlias

import jsonschema
from pydantic import BaseModel, ConfigDict

from harness.runtime.requests import MAX_INPUT_BYTES

RejectionCode: TypeAlias = Literal[
    "MISSING_RUNTIME_CONTEXT",
    "OPERATOR_MESSAGE_NOT_AUTHORIZED",
    "UNKNOWN_OPERATOR_MESSAGE_FIELD",
    "INVALID_OPERATOR_MESSAGE_KIND",
    "INVALID_OPERATOR_MESSAGE_SENDER",
    "INVALID_OPERATOR_MESSAGE_CONTEXT",
    "INVALID_OPERATOR_MESSAGE_ORIGIN",
    "INVALID_OPERATOR_MESSAGE_POLICY",
    "INVALID_OPERATOR_MESSAGE_PATH",
    "INVALID_OPERATOR_MESSAGE_VALUE",
    "CONVERSATION_NOT_FOUND",
    "EMPTY_CONTENT",
    "CONTENT_TOO_LARGE",
    "IO_ERROR",
]
"""The named rejections of OM-8, plus `INVALID_OPERATOR_MESSAGE_VALUE`: a field OM-8 gives no code
of its own (`schema_version`, `emission_id`, `emitted_at`) holds a value of the wrong shape, or
the data is not a JSON object at all; and `CONTENT_TOO_LARGE`: content over
`MAX_CONTENT_BYTES` (issue 29)."""

MAX_CONTENT_BYTES = MAX_INPUT_BYTES // 2 - 4096
"""The most an emission's content may take as a JSON string (UTF-8, escapes included). The
conversation message it becomes holds it twice (the text the model reads and its details) and
takes at most `MAX_INPUT_BYTES`, the bound of every input to a conversation; 4 KiB is left for the
rest of that message. Refused before anything is written, where the conversation's own refusal
would come after the note or nothing at all and read as an `IO_ERROR` no retry could mend."""

OperatorMessageKind: TypeAlias = Literal["tend_survey", "recently_concluded"]
"""The only two kinds of operator message (OM-1)."""

OPERATOR_MESSAGE_KINDS: tuple[OperatorMessageKind, ...] = ("tend_survey", "recently_concluded")

SCHEMA_VERSION = 1

POLICY_PAIRS = {"canonical": "reply_copy", "none": "out_of_band_note"}
"""The transcript policy and the delivery policy that go with it (OM-4, OM-8a)."""

REQUEST_FIELDS = frozenset({"kind", "sender", "content", "source_goal_id", "source_run_id", "origin"})

RECORD_FIELDS = frozenset({
    "schema_version", "emission_id", "kind", "sender", "transcript_policy", "delivery_policy", "emitted_at",
    "source_goal_id", "source_run_id", "origin", "conversation_message_id", "delivery_path"})

ORIGIN_FIELDS = frozenset({"kind", "conversation_id", "message_id"})


class Rejection(BaseModel):
    """One reason a request or record was refused: its named `code`, the `field` it concerns
    (None for the whole), and a sentence saying what was wrong."""

    model_config = ConfigDict(frozen=True)

    code: RejectionCode
    field: str | None
    message: str


class ValidationResult(BaseModel):
    """What a validator found: no rejections means the data is valid (OM-3)."""

    model_config = ConfigDict(frozen=True)

    rejections: tuple[Rejection, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.rejections

    @property
    def codes(self) -> tuple[RejectionCode, ...]:
        return tuple(rejection.code for rejection in self.rejections)


@cache
def operator_message_schema() -> dict[str, Any]:
    """The JSON Schema of an operator-message record, as shipped in the package (OM-2)."""
    text = files("harness.garden").joinpath("schema", "operator-message.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _schema_validator() -> jsonschema.Draft202012Validator:
    schema = operator_message_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(record: object) -> list[str]:
    """What the JSON Schema says is wrong with `record`, one message each; empty when it conforms."""
    return [error.message for error in _schema_validator().iter_errors(record)]


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(operator_message_schema()["$defs"][name]["pattern"])


def _matches(name: str, value: object) -> bool:
    # `re.search`, as JSON Schema applies a pattern; the patterns anchor themselves.
    return isinstance(value, str) and _pattern(name).search(value) is not None


def validate_operator_message_request(data: object) -> ValidationResult:
    """Check an emission request `{kind, sender, content, source_goal_id, source_run_id, origin?}`
    before anything is written (OM-3, OM-7, OM-8): only known fields
    (`UNKNOWN_OPERATOR_MESSAGE_FIELD`), one of the two kinds (`INVALID_OPERATOR_MESSAGE_KIND`),
    sender `garden` (`INVALID_OPERATOR_MESSAGE_SENDER`), content that is not blank
    (`EMPTY_CONTENT`) nor over `MAX_CONTENT_BYTES` (`CONTENT_TOO_LARGE`), goal and run ids present
    (`MISSING_RUNTIME_CONTEXT`) and well formed (`INVALID_OPERATOR_MESSAGE_CONTEXT`), and an
    origin, when given, that is a well-formed conversation link (`INVALID_OPERATOR_MESSAGE_ORIGIN`).
    Whether the ids are the current run's, the kind fits the goal and the conversation is open is
    the emitter's to check: they depend on the run, not on the data."""
    if not isinstance(data, Mapping):
        return _result([_reject("INVALID_OPERATOR_MESSAGE_VALUE", None, "a request is a JSON object")])
    found = _unknown_fields(data, REQUEST_FIELDS)
    found += _kind_and_sender(data)
    content = data.get("content")
    if not isinstance(content, str) or not content.strip():
        found.append(_reject("EMPTY_CONTENT", "content", "the content is empty or only whitespace"))
    elif (size := len(json.dumps(content, ensure_ascii=False).encode(errors="surrogatepass"))) > MAX_CONTENT_BYTES:
        found.append(_reject("CONTENT_TOO_LARGE", "content", f"the content takes {size:,} bytes as JSON and the most "
                             f"is {MAX_CONTENT_BYTES:,}: shorten it, or write it to a file and say where"))
    for field in ("source_goal_id", "source_run_id"):
        if field not in data:
            found.append(_reject("MISSING_RUNTIME_CONTEXT", field, f"{field} is missing: no current goal or run"))
        elif not _matches("id", data[field]):
            found.append(_reject("INVALID_OPERATOR_MESSAGE_CONTEXT", field, f"{field} is not an id: {data[field]!r}"))
    if "origin" in data:
        found += _origin(data["origin"])
    return _result(found)


def validate_operator_message_record(data: object) -> ValidationResult:
    """Check one operator-message record, as written or as read back (OM-3, OM-6, OM-8, OM-8a):
    only known fields, `schema_version` 1, `emitted_at` (Unix ms) and, when present, a well-formed
    `emission_id` (`INVALID_OPERATOR_MESSAGE_VALUE`), one of the two kinds, sender `garden`, well-formed
    source goal and run ids (`INVALID_OPERATOR_MESSAGE_CONTEXT`), a policy pair of OM-4
    (`INVALID_OPERATOR_MESSAGE_POLICY`), `origin` and `conversation_message_id` exactly on a
    conversation-backed record (`INVALID_OPERATOR_MESSAGE_ORIGIN`), and a `delivery_path` in the
    surface its policy allows: a file directly in `inbox/<garden>/` for `reply_copy` (optional:
    a failed copy leaves it out), one in `inbox/<garden>/notes/` for `out_of_band_note`
    (required) (`INVALID_OPERATOR_MESSAGE_PATH`). `schema/operator-message.schema.json` accepts
    exactly the records this accepts."""
    if not isinstance(data, Mapping):
        return _result([_reject("INVALID_OPERATOR_MESSAGE_VALUE", None, "a record is a JSON object")])
    found = _unknown_fields(data, RECORD_FIELDS)
    if data.get("schema_version") != SCHEMA_VERSION or isinstance(data.get("schema_version"), bool | float):
        found.append(_reject("INVALID_OPERATOR_MESSAGE_VALUE", "schema_version",
                             f"schema_version is {SCHEMA_VERSION}, not {data.get('schema_version')!r}"))
    # Not a field of the seed's record (OM-6): optional, and refused only when it is malformed.
    if "emission_id" in data and not _matches("id", data["emission_id"]):
        found.append(_reject("INVALID_OPERATOR_MESSAGE_VALUE", "emission_id",
                             f"emission_id is not an id: {data.get('emission_id')!r}"))
    emitted_at = data.get("emitted_at")
    if not _is_whole_number(emitted_at) or not isinstance(emitted_at, int | float) or emitted_at < 0:
        found.append(_reject("INVALID_OPERATOR_MESSAGE_VALUE", "emitted_at",
                             f"emitted_at is Unix milliseconds, not {emitted_at!r}"))
    found += _kind_and_sender(data)
    for field in ("source_goal_id", "source_run_id"):
        if not _matches("id", data.get(field)):
            found.append(_reject("INVALID_OPERATOR_MESSAGE_CONTEXT", field,
                                 f"{field} is not an id: {data.get(field)!r}"))
    transcript, delivery = data.get("transcript_policy"), data.get("delivery_policy")
    if not isinstance(transcript, str) or POLICY_PAIRS.get(transcript) != delivery:
        found.append(_reject("INVALID_OPERATOR_MESSAGE_POLICY", "delivery_policy",
                             f"{transcript!r} with {delivery!r} is not a routing policy: canonical goes with "
                             "reply_copy, none with out_of_band_note"))
        return _result(found)
    backed = transcript == "canonical"
    for field in ("origin", "conversation_message_id"):
        if backed and field not in data:
            found.append(_reject("INVALID_OPERATOR_MESSAGE_ORIGIN", field,
                                 f"a conversation-backed record carries {field}"))
        elif not backed and field in data:
            found.append(_reject("INVALID_OPERATOR_MESSAGE_ORIGIN", field,
                                 f"only a conversation-backed record carries {field}"))
    if backed and "origin" in data:
        found += _origin(data["origin"])
    if backed and "conversation_message_id" in data and not _matches("id", data["conversation_message_id"]):
        found.append(_reject("INVALID_OPERATOR_MESSAGE_ORIGIN", "conversation_message_id",
                             f"conversation_message_id is not an id: {data['conversation_message_id']!r}"))
    surface = "reply_path" if backed else "note_path"
    if "delivery_path" in data or not backed:
        path = data.get("delivery_path")
        if not _matches(surface, path):
            where = "directly in inbox/<garden>/" if backed else "in inbox/<garden>/notes/"
            found.append(_reject("INVALID_OPERATOR_MESSAGE_PATH", "delivery_path",
                                 f"a {delivery} is a .md file {where}, not {path!r}"))
    return _result(found)


def _is_whole_number(value: object) -> bool:
    # As JSON Schema's "integer": 5 and 5.0 are, true is not.
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _unknown_fields(data: Mapping[Any, Any], known: frozenset[str]) -> list[Rejection]:
    return [_reject("UNKNOWN_OPERATOR_MESSAGE_FIELD", str(field), f"{field!r} is not a field of an operator message")
            for field in data if field not in known]


def _kind_and_sender(data: Mapping[Any, Any]) -> list[Rejection]:
    found = []
    if data.get("kind") not in OPERATOR_MESSAGE_KINDS:
        found.append(_reject("INVALID_OPERATOR_MESSAGE_KIND", "kind",
                             f"an operator message is a tend_survey or a recently_concluded, not {data.get('kind')!r}"))
    if data.get("sender") != "garden":
        found.append(_reject("INVALID_OPERATOR_MESSAGE_SENDER", "sender",
                             f"an operator message's sender is garden, not {data.get('sender')!r}"))
    return found


def _origin(origin: object) -> list[Rejection]:
    if (not isinstance(origin, Mapping) or set(origin) != ORIGIN_FIELDS or origin.get("kind") != "conversation"
            or not _matches("id", origin.get("conversation_id")) or not _matches("id", origin.get("message_id"))):
        return [_reject("INVALID_OPERATOR_MESSAGE_ORIGIN", "origin",
                        f"an origin is {{kind: conversation, conversation_id, message_id}}, not {origin!r}")]
    return []


def _reject(code: RejectionCode, field: str | None, message: str) -> Rejection:
    return Rejection(code=code, field=field, message=message)


def _result(found: list[Rejection]) -> ValidationResult:
    return ValidationResult(rejections=tuple(found))
