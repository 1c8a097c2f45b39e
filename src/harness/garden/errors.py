"""Why an operator message was refused: one error per named rejection, each with the rejection's
code as its stable `code` (OM-8)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import JsonValue

from harness.errors import HarnessError
from harness.garden.validation import Rejection, RejectionCode


class OperatorMessageRejected(HarnessError):
    """An emission was refused; `details` hold `{field, ...}`. Every rejection but `IO_ERROR`
    comes before any write, so nothing was written; after `IO_ERROR` some writes may have landed,
    and retrying with the same `details.emission_id` completes them without repeating any."""

    code: ClassVar[str] = "operator_message_rejected"


class MissingRuntimeContext(OperatorMessageRejected):
    """No current goal or run: the code runs outside a gardener's run."""

    code = "MISSING_RUNTIME_CONTEXT"


class OperatorMessageNotAuthorized(OperatorMessageRejected):
    """The caller of the run context is not the gardener."""

    code = "OPERATOR_MESSAGE_NOT_AUTHORIZED"


class UnknownOperatorMessageField(OperatorMessageRejected):
    """The request or record has a field operator messages do not have."""

    code = "UNKNOWN_OPERATOR_MESSAGE_FIELD"


class InvalidOperatorMessageKind(OperatorMessageRejected):
    """The kind is neither `tend_survey` nor `recently_concluded`."""

    code = "INVALID_OPERATOR_MESSAGE_KIND"


class InvalidOperatorMessageSender(OperatorMessageRejected):
    """The sender is not `garden`."""

    code = "INVALID_OPERATOR_MESSAGE_SENDER"


class InvalidOperatorMessageContext(OperatorMessageRejected):
    """The kind does not fit the current goal's type, the ids are not the current run's, or the
    origin conversation was ended."""

    code = "INVALID_OPERATOR_MESSAGE_CONTEXT"


class InvalidOperatorMessageOrigin(OperatorMessageRejected):
    """The origin linkage is malformed."""

    code = "INVALID_OPERATOR_MESSAGE_ORIGIN"


class InvalidOperatorMessagePolicy(OperatorMessageRejected):
    """A record's transcript and delivery policies are not a pair of OM-4."""

    code = "INVALID_OPERATOR_MESSAGE_POLICY"


class InvalidOperatorMessagePath(OperatorMessageRejected):
    """A record's `delivery_path` is outside the surface its policy allows."""

    code = "INVALID_OPERATOR_MESSAGE_PATH"


class InvalidOperatorMessageValue(OperatorMessageRejected):
    """A field OM-8 names no code for holds a value of the wrong shape."""

    code = "INVALID_OPERATOR_MESSAGE_VALUE"


class ConversationNotFound(OperatorMessageRejected):
    """The goal's origin conversation does not exist (or is not the garden owner's)."""

    code = "CONVERSATION_NOT_FOUND"


class EmptyContent(OperatorMessageRejected):
    """The content is empty or only whitespace."""

    code = "EMPTY_CONTENT"


class ContentTooLarge(OperatorMessageRejected):
    """The content takes more than `MAX_CONTENT_BYTES` as JSON; nothing was written."""

    code = "CONTENT_TOO_LARGE"


class OperatorMessageIOError(OperatorMessageRejected):
    """Writing the conversation message, the note or the record failed; retry with the same
    `emission_id`."""

    code = "IO_ERROR"


_BY_CODE: dict[str, type[OperatorMessageRejected]] = {
    cls.code: cls for cls in OperatorMessageRejected.__subclasses__()}


def rejected(code: RejectionCode, message: str, **details: JsonValue) -> OperatorMessageRejected:
    """The error of rejection `code`."""
    return _BY_CODE[code](message, **details)


def refusal(rejection: Rejection, **details: JsonValue) -> OperatorMessageRejected:
    """The error of a validator's `rejection`."""
    return rejected(rejection.code, rejection.message, field=rejection.field, **details)
