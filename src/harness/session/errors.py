"""Errors of the durable journal, each with a stable code."""

from __future__ import annotations

from harness.errors import HarnessError, InvalidInput


class StorageCorruption(HarnessError):
    """A stored row no longer decodes, or a required reference is missing; names what is broken.

    Never swallowed: a read that meets it raises rather than return a shorter branch."""

    code = "storage_corruption"


class StorageRolledBack(HarnessError):
    """The SQLite database holds fewer commits than it was seen to hold, or is another file than
    the one last written: commits were lost outside Harness (see `commit_mark`). Nothing was
    driven; details name the database and its mark."""

    code = "storage_rolled_back"


class SessionNotFound(HarnessError):
    code = "session_not_found"


class SessionOwned(HarnessError):
    """Another owner (in this process or another) holds the session; nothing was written (HA-4)."""

    code = "session_owned"


class OwnershipLost(HarnessError):
    """This owner's claim on the session was lost (its lock died or another claimant bumped the
    epoch). The commit was refused, except when the connection died during COMMIT itself: then
    its outcome is unknown, and the next owner reads the journal to learn it."""

    code = "ownership_lost"


class InvalidWrite(HarnessError):
    """A staged write breaks a journal rule (duplicate id, unknown parent, second commit, write
    after commit); nothing of the job was written."""

    code = "invalid_write"


class RecordTooLarge(InvalidInput):
    """A write's record (an entry's payload, a value or a list item) would take more than
    `MAX_RECORD_BYTES` as stored; nothing of the job was written (details: `bytes`, `limit_bytes`)."""

    code = "record_too_large"


class LaneExists(HarnessError):
    code = "lane_exists"


class UnknownEntry(HarnessError):
    code = "unknown_entry"


class UnknownLane(HarnessError):
    code = "unknown_lane"


class UnsupportedStoreUrl(HarnessError):
    code = "unsupported_store_url"


class StoreUnavailable(HarnessError):
    """The database could not be opened or used (missing directory, refused connection, bad
    permissions, a read-only or failing disk); nothing was written."""

    code = "store_unavailable"


class StoreFull(HarnessError):
    """The database refused a write for lack of space (a full disk or quota); nothing of the
    write was kept, and everything committed before it is intact."""

    code = "store_full"


class StoreConnectionLost(HarnessError):
    """The connection to the database server broke during the call (a restart, a terminated
    backend, a network failure). A read may simply be retried; a commit's outcome is unknown
    (`details.outcome`): read the journal to learn whether it was applied."""

    code = "store_connection_lost"


class StoreClosed(HarnessError):
    code = "store_closed"


class ReentrantMutation(HarnessError):
    """A job on the session line started another mutation of the same session, which would wait
    on itself forever; refused before it queued."""

    code = "reentrant_mutation"


class WorkNeedsPostgres(HarnessError):
    """Claiming work across processes (`work_board`, `harness worker`) needs a PostgreSQL store:
    its locks die with their connections and its channels wake listeners. Details `{url}`."""

    code = "work_needs_postgres"
