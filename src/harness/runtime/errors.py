"""Errors of the harness layer, each with a stable code; nothing was written when one is raised
before a commit."""

from __future__ import annotations

from harness.errors import HarnessError


class LaneBusy(HarnessError):
    """The lane already has a current operation; nothing was written (HA-18)."""

    code = "lane_busy"


class InvalidMessage(HarnessError, ValueError):
    """The request's messages cannot start a run (empty, or an assistant message); nothing was
    written (HA-17)."""

    code = "invalid_message"


class UnknownSkill(HarnessError):
    code = "unknown_skill"


class UnknownTemplate(HarnessError):
    code = "unknown_template"


class PromptTooLarge(HarnessError):
    """Input too large to accept; it was refused before anything was written. Either it takes more
    than `MAX_INPUT_BYTES`, whatever the model (details: `bytes`, `limit_bytes`), or it cannot fit
    the lane's model's context window even alone (details: `estimated_tokens`, `room_tokens` (the
    window less the reply's reserve and the system prompt), `context_window`, `model`). One code
    for both: either way the sender's remedy is the same, a shorter input."""

    code = "prompt_too_large"


class NoActiveOperation(HarnessError):
    """The call needs an open operation on the lane and there is none; nothing was written."""

    code = "no_active_operation"


class NotARun(HarnessError):
    """A steer or follow-up while the lane's open operation is a compaction or navigation, which
    reads no messages: it is refused rather than accepted and handed back unsent when the
    operation ends; `queue_next_run` keeps it for the next run. Nothing was written."""

    code = "not_a_run"


class OperationIdTaken(HarnessError):
    """A supplied operation or entry id is already used in this session; nothing was written."""

    code = "id_taken"


class HarnessClosed(HarnessError):
    """The harness was closed; the call was refused before it changed anything."""

    code = "harness_closed"


class HarnessFault(HarnessError):
    """The harness stopped after finding state it cannot trust; close it and attach again."""

    code = "harness_fault"


class RebaseRequired(HarnessError):
    """The lane moved to another branch (navigation): fold no further, take a new watch snapshot."""

    code = "rebase_required"


class ListenerReentry(HarnessError):
    """A listener called a harness operation; listeners are passive observers (that call would
    wait for its own delivery, which waits for the listener)."""

    code = "listener_reentry"


class OperationMismatch(HarnessError):
    """`drive` was fenced: the lane's current operation is another one (details: lane,
    expected_operation_id, current_operation_id, last_operation_id)."""

    code = "operation_mismatch"


class NothingToResume(HarnessError):
    """`resume` found no open operation on the lane."""

    code = "nothing_to_resume"


class NothingToCompact(HarnessError):
    """The branch has nothing before its newest messages to summarize; nothing was written."""

    code = "nothing_to_compact"


class WatchOverflow(HarnessError):
    """A watch's reader fell too far behind (`AgentHarnessOptions.watch_buffer_limit` events):
    the watch ended; take a new one (a fresh snapshot) to go on."""

    code = "watch_overflow"


class EventReadOnly(HarnessError, TypeError):
    """A recipient tried to change a delivered event in place. Every listener and watcher of an
    emission receives the same read-only event, so a change would reach all of them (HA-10); copy
    it first (`event.model_copy(deep=True)` gives plain lists and dicts)."""

    code = "event_read_only"


class FollowBehind(HarnessError):
    """A follow's lane event log no longer holds the event it had reached (trimmed past it): the
    follow ended; take a new one (a fresh snapshot) to go on. Details `{lane, event_seq}`."""

    code = "follow_behind"


class SnapshotContended(HarnessError):
    """A lane snapshot read from outside the session's owner kept meeting new events: every
    attempt saw the lane's event log move while it read. Details `{lane, attempts}`."""

    code = "snapshot_contended"
