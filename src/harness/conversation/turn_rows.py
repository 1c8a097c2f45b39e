"""The rows a turn's end leaves, and the replay of the replies they follow.

A run that settles aborted records one `interrupted` row, a failed one one `error` row with public
text; both are placed by the harness inside the run's terminal commit (`RunHooks.settlement_messages`),
so they are durable and published before the run's end (CE-7, CE-9). A person's stop before any
output records nothing and discards the turn instead, in that same commit (`RunHooks.discard_turn`).
Replies the provider layer never sends (aborted or errored) are replayed as text when such a row
follows them (CE-8).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from harness.conversation.chat_events import (
    ChatErrorNotice,
    CompactionStopped,
    ContextOverflow,
    ErrorDetails,
    Interrupted,
    chat_event_message,
    chat_event_of,
    logger,
)
from harness.conversation.recording import MAIN_LANE
from harness.messages import AssistantMessage, Message, TextContent
from harness.runtime import OperationEnding
from harness.session import OperationErrorRecord

PUBLIC_TEXT_CHARS = 600
"""How much of a provider's error text a person is shown; the rest stays in the log."""

_SILENT_CAUSES = frozenset({"deleted", "probe", "budget"})
"""Causes that leave no `interrupted` row: a budget stop's row is its `BudgetReached` (`budgets`)."""


def discards_turn(ending: OperationEnding) -> bool:
    """Whether a settling run is discarded (CE-7, CE-14): a person's stop (cause `user`) of a turn
    on `main` before any output. The harness then moves the tip back to just before the person's
    message: it and everything after it leave the branch (they stay in the journal), while the
    rows the turn's admission recorded above it (a `ReasoningChanged` row, a command's row) stay:
    the next admission reads that row as its baseline and does not announce the change again.
    A stop during a tool call (`user_during_tool`) comes after output; other causes keep their row."""
    return ending.lane == MAIN_LANE and ending.discardable and ending.abort_cause == "user"


def turn_end_rows(ending: OperationEnding) -> list[Message]:
    """The chat-event rows a settling run leaves: `interrupted` for an abort (none for the
    `deleted`, `probe` and `budget` causes, nor for a discarded turn), `error` for a failure; nothing for
    anything else (CE-7, CE-9)."""
    if ending.kind != "run" or ending.discarded:
        return []
    if ending.outcome == "aborted" and ending.abort_cause is not None and ending.abort_cause not in _SILENT_CAUSES:
        return [chat_event_message(Interrupted(cause=ending.abort_cause))]
    if ending.outcome == "failed" and ending.error is not None:
        return [chat_event_message(public_error(ending.error))]
    return []


def public_error(error: OperationErrorRecord) -> ErrorDetails:
    """The error row of a failed run: the text a person may see, cleaned of markup and cut to
    `PUBLIC_TEXT_CHARS` (the raw text goes to the log), with a notice when the runtime wrote it."""
    notice: ChatErrorNotice | None = None
    if error.code == "context_overflow":
        notice = ContextOverflow()
    elif error.code == "compaction_stopped" and isinstance(error.details, dict):
        notice = CompactionStopped(failures=int(str(error.details.get("failures", 0))),
                                   last_error=str(error.details.get("last_error", "")))
    text = clean_public_text(error.message)
    if text != error.message:
        logger.info("a failed turn's full error (%s): %s", error.code, error.message)
    return ErrorDetails(text=text, notice=notice)


_TAG = re.compile(r"<[^>]{1,200}>")
_SPACE = re.compile(r"\s+")


def clean_public_text(text: str) -> str:
    """`text` without markup tags and runs of white space, cut to `PUBLIC_TEXT_CHARS`."""
    cleaned = _SPACE.sub(" ", _TAG.sub(" ", text)).strip() or "the request failed"
    return cleaned if len(cleaned) <= PUBLIC_TEXT_CHARS else cleaned[:PUBLIC_TEXT_CHARS - 1] + "…"


def replay_interrupted_replies(messages: Sequence[Message]) -> list[Message]:
    """`messages` with each aborted or errored reply that an `interrupted` or `error` row follows
    replayed as a text-only assistant message (CE-8): the provider layer drops such replies, so
    without this the model would not see what the person saw it say. Its reasoning and unfinished
    tool calls are never replayed; a reply with no text is left out. A pure function of the list,
    so a live and a restored conversation send the same bytes."""
    out: list[Message] = []
    followed = False  # a stopped or failed row comes later in the list
    for message in reversed(messages):
        details = chat_event_of(message)
        if isinstance(details, Interrupted | ErrorDetails):
            followed = True
        elif message.role == "user" or (isinstance(message, AssistantMessage) and message.stop_reason == "stop"):
            followed = False
        if isinstance(message, AssistantMessage) and message.stop_reason in ("aborted", "error") and followed:
            texts = [block for block in message.content if isinstance(block, TextContent) and block.text.strip()]
            if not texts:
                continue
            message = message.model_copy(update={"content": texts, "stop_reason": "stop", "error_message": None})
        out.append(message)
    out.reverse()
    return out
