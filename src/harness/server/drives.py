"""The server drives what it accepts: one task of the server process per accepted operation, and on
start a task for every operation a stopped server left open, so a restart loses no turn."""

from __future__ import annotations

import asyncio
import logging

from harness.context import Context
from harness.conversation import MAIN_LANE, OWNER, Conversation, ConversationService
from harness.errors import HarnessError
from harness.runtime import DriveOutcome, HarnessClosed, Settled
from harness.session import SessionNotFound, SessionOwned, addresses

logger = logging.getLogger(__name__)


class Drives:
    """The drive tasks of one server: `start` drives an accepted operation to its end in the
    background, `resume_open` starts one for each operation the store holds open, `wait` awaits
    one. Operation ids map to their conversation, so a tool approval can be shown to its owner."""

    def __init__(self, service: ConversationService) -> None:
        self._service = service
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

    async def resume_open(self, context: Context) -> list[str]:
        """Start a drive for every open operation of every conversation in the store whose main
        lane has one, and return their operation ids. A conversation another process holds
        (`SessionOwned`) or deleted meanwhile is skipped and logged."""
        started = []
        for info in await self._service.store.list_sessions(context):
            try:
                session = await self._service.store.open_session(info.id, context)
                owner = await session.get(OWNER, context)
                state = await session.get(addresses.lane_state(MAIN_LANE), context)
                if owner is None or state is None or state.current_operation_id is None:
                    continue
                conversation = await self._service.open(owner, info.id, context)
            except (SessionOwned, SessionNotFound) as error:
                logger.warning("not resuming conversation %s: %s", info.id, error)
                continue
            for operation in conversation.open_operations:
                self.start(conversation, operation.lane, operation.operation_id)
                started.append(operation.operation_id)
        return started

    def cancel_all(self) -> None:
        """Stop waiting on every drive (the harnesses' close halts the drives themselves)."""
        for task in list(self._tasks.values()):
            task.cancel()


def ended_as(outcome: DriveOutcome) -> tuple[str, str | None]:
    """A drive's outcome for a log line: (`completed`, `failed` or `aborted` for a settled turn,
    else the outcome's kind: `paused`, `suspended`, `waiting_retry`; and why: a failure's error
    code, an abort's cause, else None)."""
    if not isinstance(outcome, Settled):
        return outcome.kind, None
    result = outcome.result
    return result.outcome, result.error.code if result.error is not None else result.abort_cause
