"""Tool calls waiting for approval, answered from any process (issue 30): the one way every door's
calls wait. A waiting call is kept in the conversation's journal (`pending_address`), so any
process lists it (`journal_pending`: `harness serve`'s approvals route and page) and answers it,
here at once (`WaitingCalls.answer`) or posted to the holder (`ApprovalAnswerRequest`), while the
door's own asker (the terminal's prompt) may answer too. The first answer wins; the others get
`ApprovalAnswered`. A call stops waiting with its answer kept in its journal copy (`decided`), so
a poster learns whether its answer was the one taken; a stopped run refuses its waiting calls,
and an answer after that changes nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue

from harness.context import Context
from harness.conversation.recording import MAIN_LANE
from harness.errors import HarnessError
from harness.messages import now_ms
from harness.runtime import Approval, ApprovalRequest, AskApproval
from harness.session import SessionReader, ValueAddress, addresses

logger = logging.getLogger(__name__)

STOPPED_BY = "the run's stop"
"""Who refused a call whose run was stopped (or whose process let go of it) while it waited."""

HERE = "the person here"
"""Who answered through the door's own asker (the terminal's prompt of the chat holding it)."""


class ApprovalNotFound(HarnessError):
    """No call of this conversation waits for approval under this tool call id (its run ended, or
    there never was one); nothing changed. Details `{tool_call_id}`."""

    code = "approval_not_found"


class ApprovalAnswered(HarnessError):
    """The call was answered already (the first answer wins) or refused when its run was stopped;
    this answer changed nothing. Details `{tool_call_id, by, allow}`: who gave the answer taken."""

    code = "approval_answered"


class ApprovalDecision(BaseModel):
    """How a waiting call was answered: `allow` (`for_session`: "always"), the refusal's `reason`,
    `by` whom (a user, `HERE` for the door's own asker, or `STOPPED_BY`), the `answer_id` of a
    posted answer, and when (`decided_at`, Unix ms)."""

    model_config = ConfigDict(frozen=True)

    allow: bool
    for_session: bool = False
    reason: str | None = None
    by: str
    answer_id: str | None = None
    decided_at: int

    @property
    def approval(self) -> Approval:
        return Approval(allow=self.allow, for_session=self.for_session, reason=self.reason)


class PendingApproval(BaseModel):
    """A tool call waiting for its conversation's person (`decided` None), or one that waited and
    was answered; `asked_at` is Unix ms."""

    model_config = ConfigDict(frozen=True)

    conversation_id: str
    operation_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, JsonValue]
    summary: str
    asked_at: int
    decided: ApprovalDecision | None = None


APPROVALS_NAMESPACE = "approvals"
"""The namespace of the calls' journal copies (`pending_address`); the store tags it
(`Store.tag`), so a reader of them wakes for their changes alone."""


def pending_address(tool_call_id: str) -> ValueAddress[PendingApproval]:
    """Where the conversation's holder keeps a call while it waits for approval, and its answer
    after; the empty id scans them all."""
    return addresses.value_address(APPROVALS_NAMESPACE, tool_call_id, PendingApproval)


async def journal_approval(journal: SessionReader, tool_call_id: str, context: Context) -> PendingApproval | None:
    """The journal's copy of call `tool_call_id` if it is of the conversation's open run (a copy of
    an ended run, which a holder that died left behind, is None)."""
    state = await journal.get(addresses.lane_state(MAIN_LANE), context)
    kept = await journal.get(pending_address(tool_call_id), context)
    if state is None or kept is None or kept.operation_id != state.current_operation_id:
        return None
    return kept


async def journal_pending(journal: SessionReader, context: Context) -> list[PendingApproval]:
    """The calls the conversation's holder, whichever process it is, keeps waiting in the journal,
    oldest first: those of its open run not yet answered."""
    batch = journal.batch()  # one round trip
    state_read, copies = batch.get(addresses.lane_state(MAIN_LANE)), batch.scan_values(pending_address(""))
    await batch.run(context)
    state = state_read.value
    if state is None or state.current_operation_id is None:
        return []
    waiting = [pending for _, pending in copies.value]
    return sorted((pending for pending in waiting
                   if pending.operation_id == state.current_operation_id and pending.decided is None),
                  key=lambda pending: pending.asked_at)


@dataclass(frozen=True)
class ApprovalChange:
    """Told when a call starts waiting (`answer` None) and when it stops (its answer, or a refusal
    when the run was stopped); `pending` is the call as it started waiting."""

    pending: PendingApproval
    answer: Approval | None


class JournalApprovals:
    """The approval changes of a conversation whose calls wait in another process (a `harness
    worker`, a chat, another server), read from the journal's copies (`pending_address`) of its
    open run: each `changes` says what started waiting and what was answered since the last, each
    call once (a call told waiting has its answer told even after its run ended), so a door that
    follows the run from the journal shows its approvals as they land."""

    def __init__(self, journal: SessionReader) -> None:
        self._journal = journal
        self._told: dict[tuple[str, str], bool] = {}  # (operation, call) -> whether its answer was told
        self._running = False  # whether a run was open at the last look

    async def changes(self, context: Context) -> list[ApprovalChange]:
        """What changed since the last call, oldest first: a call now waiting (`answer` None) and
        a call told waiting that has its answer now. A call answered before it was ever seen
        waiting is not told. Raises the store's errors; nothing is remembered then."""
        # While a run is open (as at the last look), the copies are read with the lane's state:
        # one round trip per look instead of two (issue 29).
        batch = self._journal.batch()
        state_read = batch.get(addresses.lane_state(MAIN_LANE))
        scan = batch.scan_values(pending_address("")) if self._running or False in self._told.values() else None
        await batch.run(context)
        current = state_read.value.current_operation_id if state_read.value is not None else None
        self._running = current is not None
        if current is None and False not in self._told.values():
            return []
        kept_copies = scan.value if scan is not None else await self._journal.scan_values(pending_address(""), context)
        copies = sorted((kept for _, kept in kept_copies
                         if kept.operation_id == current or self._told.get((kept.operation_id, kept.tool_call_id))
                         is False), key=lambda kept: kept.asked_at)
        changes: list[ApprovalChange] = []
        for kept in copies:
            key, told = (kept.operation_id, kept.tool_call_id), self._told.get((kept.operation_id, kept.tool_call_id))
            if kept.decided is None and told is None:
                changes.append(ApprovalChange(kept, None))
                self._told[key] = False
            elif kept.decided is not None and not told:
                if told is False:
                    changes.append(ApprovalChange(kept.model_copy(update={"decided": None}), kept.decided.approval))
                self._told[key] = True
        return changes


@dataclass
class _Waiting:
    pending: PendingApproval
    decided: asyncio.Future[ApprovalDecision]


Keep = Callable[[PendingApproval], Awaitable[None]]
"""Writes a call's journal copy (the conversation's `set_value` of `pending_address`)."""


class WaitingCalls:
    """The calls of one live conversation that wait for approval (`ask`), and their answers: the
    first one given, by whichever door or process, wins. `changed` is told of each call starting
    and stopping to wait, synchronously with the run (a server's streams show them in order)."""

    def __init__(self, conversation_id: str, keep: Keep, changed: Callable[[ApprovalChange], None] | None) -> None:
        self._conversation_id = conversation_id
        self._keep = keep
        self._changed = changed
        self._waiting: dict[str, _Waiting] = {}
        self._decided: dict[str, ApprovalDecision] = {}  # this attachment's answered calls, for conflicts

    def pending(self) -> list[PendingApproval]:
        """The calls waiting for an answer, oldest first (an answered one waits no more)."""
        return [waiting.pending for waiting in self._waiting.values() if not waiting.decided.done()]

    def decided(self, tool_call_id: str) -> ApprovalDecision | None:
        """How call `tool_call_id` was answered while this conversation was live here, if it was."""
        return self._decided.get(tool_call_id)

    async def ask(self, request: ApprovalRequest, context: Context, here: AskApproval | None) -> Approval:
        """Wait for the first answer to `request`: `here`'s (the door's own asker, cancelled when
        another answer comes first), one given through `answer` (a posted one included), or a
        refusal when `context` is cancelled (the run was stopped). The call is kept in the journal
        while it waits and then with its answer (best effort: on a store fault it still waits
        here and is answered from this process)."""
        pending = PendingApproval(conversation_id=self._conversation_id, operation_id=request.operation_id,
                                  tool_call_id=request.tool_call_id, tool_name=request.tool_name, args=request.args,
                                  summary=request.summary, asked_at=now_ms())
        waiting = _Waiting(pending, asyncio.get_running_loop().create_future())
        # Waiting here before it is in the journal: an answer posted by a process that read it
        # there finds it.
        self._waiting[request.tool_call_id] = waiting
        await self._write(pending)
        self._tell(ApprovalChange(pending, None))

        async def asked_here(ask: AskApproval) -> None:
            try:
                approval = await ask(request, context)
            except Exception as error:  # approval fails closed
                approval = Approval(allow=False, reason=f"the approval check failed ({type(error).__name__}: {error})")
            self._decide(waiting, approval, HERE, None)

        async def refused_on_stop() -> None:
            await context.wait_cancelled()
            self._decide(waiting, Approval(allow=False, reason="the run was stopped"), STOPPED_BY, None)

        helpers: list[asyncio.Future[None]] = [asyncio.ensure_future(refused_on_stop())]
        if here is not None:
            helpers.append(asyncio.ensure_future(asked_here(here)))
        try:
            ends: list[asyncio.Future[Any]] = [waiting.decided, *helpers]
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for helper in helpers:
                helper.cancel()  # the prompt nobody needs now is dismissed
            await asyncio.gather(*helpers, return_exceptions=True)
            del self._waiting[request.tool_call_id]
            # Cancelled itself (its harness closing) before any answer: refused, as a stop is.
            self._decide(waiting, Approval(allow=False, reason="the run was stopped"), STOPPED_BY, None)
            decision = waiting.decided.result()
            self._tell(ApprovalChange(pending, decision.approval))
            await self._write(pending.model_copy(update={"decided": decision}))
        return decision.approval

    def answer(self, tool_call_id: str, answer: Approval, by: str, *, answer_id: str | None = None) -> PendingApproval:
        """Answer the waiting call `tool_call_id` as `by` (a user): its run goes on at once. Raises
        `ApprovalAnswered` when it was answered first (or refused on a stop), `ApprovalNotFound`
        when no such call waits here; nothing changed then."""
        waiting = self._waiting.get(tool_call_id)
        if waiting is None or waiting.decided.done():
            decided = self._decided.get(tool_call_id)  # `_decide` kept it there when it answered the call
            if decided is not None:
                raise answered(tool_call_id, decided)
            raise ApprovalNotFound(f"no call {tool_call_id[:80]!r} waits for approval in this conversation",
                                   tool_call_id=tool_call_id[:80])
        self._decide(waiting, answer, by, answer_id)
        return waiting.pending

    def _decide(self, waiting: _Waiting, answer: Approval, by: str, answer_id: str | None) -> None:
        if waiting.decided.done():
            return
        decision = ApprovalDecision(allow=answer.allow, for_session=answer.for_session, reason=answer.reason, by=by,
                                    answer_id=answer_id, decided_at=now_ms())
        self._decided[waiting.pending.tool_call_id] = decision
        waiting.decided.set_result(decision)

    def _tell(self, change: ApprovalChange) -> None:
        if self._changed is not None:
            self._changed(change)

    async def _write(self, pending: PendingApproval) -> None:
        try:
            await self._keep(pending)
        except HarnessError as error:
            logger.warning("approval of call %s of conversation %s not kept in the journal: %s [%s]",
                           pending.tool_call_id, pending.conversation_id, error.message, error.code)


def answered(tool_call_id: str, decided: ApprovalDecision) -> ApprovalAnswered:
    """The conflict of an answer that came after `decided` (HTTP 409)."""
    what = "allowed" if decided.allow else "refused"
    return ApprovalAnswered(f"call {tool_call_id[:80]!r} was {what} already, by {decided.by}: this answer "
                            "changed nothing", tool_call_id=tool_call_id[:80], by=decided.by, allow=decided.allow)
