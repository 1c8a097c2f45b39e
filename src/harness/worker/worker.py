"""`Worker`: claims sessions with work from a PostgreSQL store's work board, drives them, lets go."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from harness.context import Context
from harness.conversation import Conversation, ConversationService
from harness.errors import HarnessError
from harness.messages import now_ms
from harness.runtime import DriveOutcome, Paused, Suspended, WaitingRetry
from harness.runtime.outcomes import ended_as
from harness.session import SessionNotFound, SessionOwned, StoreConnectionLost
from harness.session.work import DEFAULT_LEASE_S, OpenWork, work_board

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs; times in seconds.

    `concurrency`: sessions held and driven at once. `poll_s`: how often the board is read when
    no notification comes (notifications wake the worker at once; the poll covers the ones a
    dropped listening connection lost). `lease_s`: how long a holder's connection may go quiet
    before another worker ends it and takes the session over. `deferred_poll_s`: how often a
    deferred reply is fetched. `backoff_s`: how long a session whose drive failed unexpectedly
    is left alone. `stop_grace_s`: on `stop`, how long the drives in hand may take to reach their
    next step boundary (the streaming reply or tool batch in hand ends first) before they are
    halted as a crash would halt them; either way the next worker resumes them."""

    concurrency: int = 4
    poll_s: float = 1.0
    lease_s: float = DEFAULT_LEASE_S
    deferred_poll_s: float = 5.0
    backoff_s: float = 5.0
    stop_grace_s: float = 30.0


class Worker:
    """Drives the open work of `service`'s PostgreSQL store, `options.concurrency` sessions at a
    time, until `stop`.

    A session is claimed by attaching its conversation (`ConversationService.open`), which takes
    the session's lock and bumps its epoch: a second worker finds it held and skips it, a killed
    worker's lock goes with its connection, and a worker that stopped answering is ended once its
    lease runs out (`WorkBoard.end_stale_lease`), after which it can commit nothing. Requests
    other processes post (steer, follow-up, stop: `Session.post_request`) are taken at claim, on
    their notification and at every poll (`Lane.take_requests`). Raises `WorkNeedsPostgres` for
    any other store."""

    def __init__(self, service: ConversationService, options: WorkerOptions | None = None) -> None:
        self.service = service
        self.options = options or WorkerOptions()
        if self.options.concurrency < 1:
            raise ValueError("a worker drives at least one session at a time")
        self.board = work_board(service.store, lease_s=self.options.lease_s)
        self._held: dict[str, asyncio.Task[None]] = {}
        self._later: dict[str, float] = {}  # session id -> monotonic time before which it is left alone
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()

    @property
    def held(self) -> frozenset[str]:
        """The ids of the sessions this worker holds now."""
        return frozenset(self._held)

    def stop(self) -> None:
        """Ask `run` to return: claim nothing more, pause each drive in hand at its next step
        boundary (`Lane.pause_drive`; within `stop_grace_s`), release every session with its
        operations open for the next worker. Safe from a signal handler on the loop."""
        self._stopping.set()
        self._wake.set()

    async def run(self, context: Context) -> None:
        """Claim and drive until `stop`, then release everything and return."""
        loop = asyncio.get_running_loop()
        listener = loop.create_task(self._listen(context))
        renewer = loop.create_task(self._renew(context))
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                timeout = await self._claim_open(context)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        finally:
            listener.cancel()
            held = list(self._held.values())
            if held:
                await asyncio.wait(held, timeout=self.options.stop_grace_s)
            for task in self._held.values():
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            renewer.cancel()
            await asyncio.gather(listener, renewer, return_exceptions=True)

    # -- claiming ---------------------------------------------------------------------------------

    async def _claim_open(self, context: Context) -> float:
        """Start a drive for each free session with work that is due, up to the concurrency;
        return how long to wait before the next look. The requests of a session held are its
        conversation's to take (`Store.posts` wakes it)."""
        wait = self.options.poll_s
        if len(self._held) >= self.options.concurrency:
            return wait
        try:
            work = await self.board.open_work(context)
        except HarnessError as error:  # the database is away: try again at the next poll
            logger.warning("cannot read the work board: %s", error)
            return wait
        now, clock = now_ms(), time.monotonic()
        for item in _by_session(work):
            if len(self._held) >= self.options.concurrency or self._stopping.is_set():
                break
            session_id = item.session_id
            if session_id in self._held or self._later.get(session_id, 0.0) > clock:
                wait = min(wait, max(self._later.get(session_id, clock) - clock, 0.0))
                continue
            if item.not_before is not None and item.not_before > now:
                wait = min(wait, (item.not_before - now) / 1000)
                continue
            if item.held:
                if item.stale and await self.board.end_stale_lease(session_id, context):
                    logger.warning("ended the quiet holder of session %s; taking it over", session_id)
                    wait = min(wait, 0.05)  # its lock goes as the server ends that backend
                continue
            self._held[session_id] = asyncio.get_running_loop().create_task(self._serve(session_id, context))
        return wait

    async def _serve(self, session_id: str, context: Context) -> None:
        """Hold one session: attach it, take its requests, drive its open operations until none is
        left or one waits (a retry not yet due, a deferred reply), then release it."""
        try:
            conversation = await self._attach(session_id, context)
            if conversation is None:
                return
            try:
                while not self._stopping.is_set():
                    await conversation.take_requests(context)
                    operations = [(lane.name, lane.operation.id) for lane in conversation.lanes()
                                  if lane.operation is not None]
                    if not operations:
                        break
                    outcomes = await self._drive(conversation, operations, context)
                    if self._wait_on(session_id, outcomes) or any(isinstance(o, Paused) for o in outcomes):
                        break
            except Exception as error:
                # Lost to a claimant that took the session over or a failing store (a HarnessError),
                # or a bug, said with its traceback: the durable phase stays for whoever holds it next.
                if isinstance(error, HarnessError):
                    logger.warning("drive of session %s ended: %s", session_id, error)
                else:
                    logger.exception("drive of session %s failed", session_id)
                self._later[session_id] = time.monotonic() + self.options.backoff_s
            finally:
                await self.service.close(conversation.info.owner, session_id, context)
                logger.info("released conversation %s", session_id,
                            extra={"event": "release", "conversation_id": session_id})
        finally:
            self._held.pop(session_id, None)
            self._wake.set()

    async def _drive(self, conversation: Conversation, operations: list[tuple[str, str]],
                     context: Context) -> list[DriveOutcome]:
        """Drive the operations (lane, operation id) to their ends or waits; once the worker is
        stopping, pause each at its next step boundary instead."""
        for _, operation_id in operations:
            logger.info("turn %s of conversation %s: driving", operation_id, conversation.id,
                        extra={"event": "turn_start", "conversation_id": conversation.id,
                               "operation_id": operation_id})
        drives: asyncio.Future[list[DriveOutcome]] = asyncio.gather(*(
            conversation.drive(operation_id, context, lane=lane, wait_for_retry=False, poll_deferred=True)
            for lane, operation_id in operations))
        stopping = asyncio.ensure_future(self._stopping.wait())
        either: list[asyncio.Future[Any]] = [drives, stopping]
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not drives.done():
                for lane, _ in operations:
                    await conversation.pause_drive(context, lane=lane)
            outcomes = await drives
        except asyncio.CancelledError:  # the grace ran out: halted with the harness's close
            drives.cancel()
            raise
        finally:
            stopping.cancel()
        for outcome in outcomes:
            # completed, failed or aborted; else paused, suspended or waiting_retry: still open
            ended, reason = ended_as(outcome)
            logger.info("turn %s of conversation %s: %s%s", outcome.operation_id, conversation.id, ended,
                        f" ({reason})" if reason else "",
                        extra={"event": "turn_end", "conversation_id": conversation.id,
                               "operation_id": outcome.operation_id, "outcome": ended, "reason": reason})
        return outcomes

    async def _attach(self, session_id: str, context: Context) -> Conversation | None:
        try:
            owner = await self.service.owner_of(session_id, context)
            if owner is None:
                # Not a conversation: nothing here knows what its lanes run with.
                logger.warning("session %s has open work but no owner; a worker drives conversations only",
                               session_id)
                self._later[session_id] = math.inf
                return None
            conversation = await self.service.open(owner, session_id, context)
            logger.info("claimed conversation %s", session_id, extra={"event": "claim", "conversation_id": session_id})
        except (SessionOwned, SessionNotFound):
            return None  # another worker was first, or the session is gone
        except HarnessError as error:
            logger.warning("cannot attach session %s: %s", session_id, error)
            self._later[session_id] = time.monotonic() + self.options.backoff_s
            return None
        return conversation

    def _wait_on(self, session_id: str, outcomes: list[DriveOutcome]) -> bool:
        """Whether an outcome waits (a retry not yet due, a deferred reply): then the session is
        let go and left alone until it is due."""
        clock, delay = time.monotonic(), None
        for outcome in outcomes:
            if isinstance(outcome, WaitingRetry):
                due = max(outcome.not_before - now_ms(), 0) / 1000
                delay = due if delay is None else min(delay, due)
            elif isinstance(outcome, Suspended):
                delay = self.options.deferred_poll_s if delay is None else min(delay, self.options.deferred_poll_s)
        if delay is None:
            return False
        self._later[session_id] = clock + delay
        return True

    # -- notifications, leases ----------------------------------------------------------

    async def _listen(self, context: Context) -> None:
        """Wake the claim loop when a session it does not hold is released or gets a request (a
        held one's conversation takes its requests itself). A dropped connection is opened again
        after a poll interval."""
        while True:
            try:
                self._wake.set()  # notifications sent while no connection listened are found by a look
                async for session_id in self.board.listen():
                    if session_id not in self._held:
                        self._wake.set()
            except StoreConnectionLost as error:
                logger.warning("the work board's listening connection dropped: %s", error)
            await asyncio.sleep(self.options.poll_s)

    async def _renew(self, context: Context) -> None:
        while True:
            await self.board.renew(context)
            await asyncio.sleep(self.options.lease_s / 3)


def _by_session(work: list[OpenWork]) -> list[OpenWork]:
    """One item per session, the one due soonest (a session is claimed and driven whole)."""
    first: dict[str, OpenWork] = {}
    for item in work:
        seen = first.get(item.session_id)
        if seen is None or (item.not_before or 0) < (seen.not_before or 0):
            first[item.session_id] = item
    return list(first.values())

