"""The server drives what it accepts: one task of the server process per accepted operation, and on
start a task for every operation a stopped server left open, so a restart loses no turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from harness.context import Context
from harness.conversation import MAIN_LANE, Conversation, ConversationService
from harness.conversation.service import OWNER
from harness.errors import HarnessError
from harness.runtime import DriveOutcome, HarnessClosed
from harness.runtime.outcomes import ended_as
from harness.session import SessionNotFound, StorageCorruption, addresses
from harness.session.work import work_board

logger = logging.getLogger(__name__)


class Drives:
    """The drive tasks of one server: `start` drives an accepted operation to its end in the
    background, `unheld_open` finds the operations the store holds open that nobody drives
    (`Holds.resume_open` starts them), `wait` awaits one. Operation ids map to their
    conversation, so a tool approval can be shown to its owner."""

    def __init__(self, service: ConversationService) -> None:
        self._service = service
        # PostgreSQL tells which lanes have an operation open from an index of only those.
        self._board = work_board(service.store, leases=False) if service.store.backend.kind == "postgres" else None
        self._tasks: dict[str, asyncio.Task[DriveOutcome]] = {}
        self.conversation_of: dict[str, str] = {}
        """The conversation id of each operation this server drives now."""

    def start(self, conversation: Conversation, lane: str, operation_id: str) -> asyncio.Task[DriveOutcome]:
        """Drive `operation_id` of `conversation`'s `lane` in a task of the server (the same task
        while it runs). Cancelling the request that started it does not stop it; a durable abort
        does (`Conversation.stop`)."""
        running = self._tasks.get(operation_id)
        if running is not None:
            return running
        self.conversation_of[operation_id] = conversation.id
        context = Context({"server": "drive", "conversation_id": conversation.id, "operation_id": operation_id})
        task = asyncio.get_running_loop().create_task(conversation.drive(operation_id, context, lane=lane))
        self._tasks[operation_id] = task
        task.add_done_callback(lambda done: self._ended(operation_id, done))
        logger.info("turn %s of conversation %s: driving", operation_id, conversation.id,
                    extra={"event": "turn_start", "conversation_id": conversation.id, "operation_id": operation_id})
        return task

    def _ended(self, operation_id: str, task: asyncio.Task[DriveOutcome]) -> None:
        """Log the drive's end: the turn's outcome and why (a failure's code, an abort's cause),
        `halted` when the server stopped it (it stays open for the next one), `error` otherwise."""
        self._tasks.pop(operation_id, None)
        conversation_id = self.conversation_of.pop(operation_id, None)
        level, error = logging.INFO, (None if task.cancelled() else task.exception())
        if task.cancelled() or isinstance(error, HarnessClosed):
            outcome, reason = "halted", None
        elif error is not None:  # worth an error line: the operation stays open in a phase nobody drives now
            level, outcome = logging.ERROR, "error"
            reason = error.code if isinstance(error, HarnessError) else type(error).__name__
        else:
            outcome, reason = ended_as(task.result())
        logger.log(level, "turn %s of conversation %s: %s%s%s", operation_id, conversation_id, outcome,
                   f" ({reason})" if reason else "", f": {error}" if error is not None else "",
                   extra={"event": "turn_end", "conversation_id": conversation_id, "operation_id": operation_id,
                          "outcome": outcome, "reason": reason})

    async def wait(self, operation_id: str) -> DriveOutcome | None:
        """The outcome of the drive of `operation_id` if this server runs it, else None."""
        task = self._tasks.get(operation_id)
        return await asyncio.shield(task) if task is not None else None

    def driving(self, conversation_id: str) -> bool:
        """Whether this server drives an operation of `conversation_id` now."""
        return conversation_id in self.conversation_of.values()

    async def unheld_open(self, context: Context) -> dict[str, str]:
        """The owner of each conversation with an operation open that is not live here and, as far
        as one read tells, not held elsewhere, by conversation id (`Holds.resume_open`). On
        PostgreSQL from the store's open-work query, which reads only the lanes with an operation
        open and leaves out the sessions another process holds, then each such conversation's
        owner; on SQLite from two reads of every conversation's main lane and owner."""
        store = self._service.store
        if self._board is not None:
            open_ids = {work.session_id for work in await self._board.open_work(context)
                        if work.operation_id is not None and not work.held}
            owners = {}
            for session_id in open_ids - set(self._service.live_ids):
                with contextlib.suppress(SessionNotFound):  # deleted since
                    owner = await self._service.owner_of(session_id, context)
                    if owner is not None:
                        owners[session_id] = owner
            return owners
        lanes = await store.values_across(addresses.lane_state(MAIN_LANE), context, undecodable=_left_for_now)
        open_ids = {session_id for session_id, lane in lanes.items()
                    if lane.current_operation_id is not None and self._service.live(session_id) is None}
        if not open_ids:
            return {}
        owners_across = await store.values_across(OWNER, context, undecodable=_left_for_now)
        return {session_id: owner for session_id in open_ids if (owner := owners_across.get(session_id)) is not None}

    def cancel_all(self) -> None:
        """Stop waiting on every drive (the harnesses' close halts the drives themselves)."""
        for task in list(self._tasks.values()):
            task.cancel()


def _left_for_now(session_id: str, error: StorageCorruption) -> None:
    """A session whose lane or owner no longer decodes is not resumed; the others are."""
    logger.warning("not resuming conversation %s: %s [%s]", session_id, error.message, error.code)
