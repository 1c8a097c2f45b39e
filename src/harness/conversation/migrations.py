"""Journal data migrations of the conversation layer, and the full list a store opener applies
(CE-25).

The session layer runs data migrations but must not know chat events, so it cannot list this
layer's. Its own list (`harness.session.DATA_MIGRATIONS`) stays its own; `JOURNAL_DATA_MIGRATIONS`
appends this layer's after it, and every opener above this layer (the `harness` command's) passes
that list to `connect(url, context, data_migrations=...)`. A store opened with the session's list
alone is not migrated yet, and its rows with retired notices render nothing (CE-5) until an opener
that passes this list opens it; the migration then runs once, recorded by name.
"""

from __future__ import annotations

from typing import Any

from harness.conversation.chat_events import CHAT_EVENT_TYPE, RETIRED_NOTICE_CODES
from harness.session import DataMigration
from harness.session.migrations import DATA_MIGRATIONS


def _without_retired_notice(message: Any) -> dict[str, Any] | None:
    """The stored message JSON without `details.notice`, when it is an error chat event whose
    notice is retired; None for anything else."""
    if not isinstance(message, dict) or message.get("role") != "custom" \
            or message.get("custom_type") != CHAT_EVENT_TYPE:
        return None
    details = message.get("details")
    if not isinstance(details, dict) or details.get("kind") != "error":
        return None
    notice = details.get("notice")
    if not isinstance(notice, dict) or notice.get("code") not in RETIRED_NOTICE_CODES:
        return None
    # Rebuilt in the stored key order, so the row re-encodes to the same bytes less the notice.
    return {**message, "details": {key: value for key, value in details.items() if key != "notice"}}


def _retire_chat_error_notices(payload: dict[str, Any]) -> dict[str, Any] | None:
    if payload.get("type") == "custom_message":
        message = _without_retired_notice(payload.get("message"))
        return None if message is None else {**payload, "message": message}
    # A compaction keeps its retained tail verbatim, chat events included, and context reads
    # replay that copy: it is migrated like the row it was copied from.
    tail = payload.get("retained_tail")
    if payload.get("type") == "compaction" and isinstance(tail, list):
        migrated = [_without_retired_notice(message) for message in tail]
        if all(message is None for message in migrated):
            return None
        kept = [old if new is None else new for old, new in zip(tail, migrated, strict=True)]
        return {**payload, "retained_tail": kept}
    return None


RETIRE_CHAT_ERROR_NOTICES = DataMigration("retire-chat-error-notices", _retire_chat_error_notices)
"""Removes `details.notice` from every error chat event whose notice code is `image-refused` or
`provider-timeout` (`RETIRED_NOTICE_CODES`, notice vocabulary version 1), in every session of the
store, on every copy the journal keeps: placed rows, chat-event copies in compaction tails, and
rows not placed yet (a pending write of an open operation, a queued or posted message), which the
session layer offers in the shape of the entry they become. Nothing else changes: the text, the content
the model reads, ids, parents, seqs, timestamps and every other byte of the payload stay as stored
(CE-25). Afterwards the parser refuses those codes."""

JOURNAL_DATA_MIGRATIONS: tuple[DataMigration, ...] = (*DATA_MIGRATIONS, RETIRE_CHAT_ERROR_NOTICES)
"""Every journal data migration, in the order they run: the session layer's, then this layer's.
Pass it to `harness.session.connect`; append new ones at the end, never reorder or remove one."""
