"""Tool approvals answered over HTTP: the server's `before_tool` hook parks each gated call as a
pending approval until the conversation's owner answers it (or the run is aborted, or the server
stops: the call is then refused, as approval fails closed).

A waiting call is also kept in the conversation's journal (`pending_address`) while it waits, so a
server that does not hold the conversation lists it and posts its answer to the holder
(`ApprovalAnswerRequest`, issue 28)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, JsonValue

from harness.context import Context
from harness.conversation import MAIN_LANE, Conversation
from harness.errors import HarnessError
from harness.messages import now_ms
from harness.runtime import ToolCallRequest
from harness.session import ApprovalAnswerRequest, Session, SessionReader, ValueAddress, addresses
from harness.tools import (
    DENY,
    NEEDS_APPROVAL,
    Approval,
    ApprovalPolicy,
    ApprovalRequest,
    McpServers,
    PermissionRules,
    RuleKeeper,
)

logger = logging.getLogger(__name__)


class ApprovalNotFound(HarnessError):
    """No call of this conversation waits for approval under this tool call id (answered already,
    or its run ended); nothing changed. Details `{tool_call_id}`."""

    code = "approval_not_found"


class PendingApproval(BaseModel):
    """A tool call waiting for its conversation's owner; `asked_at` is Unix ms."""

    model_config = ConfigDict(frozen=True)

    conversation_id: str
    operation_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, JsonValue]
    summary: str
    asked_at: int


def pending_address(tool_call_id: str) -> ValueAddress[PendingApproval]:
    """Where the conversation's holder keeps a call while it waits for approval (issue 28); the
    empty id scans them all."""
    return addresses.value_address("approvals", tool_call_id, PendingApproval)


async def journal_pending(journal: SessionReader, context: Context) -> list[PendingApproval]:
    """The calls the conversation's holder, whichever process it is, keeps waiting in the journal,
    oldest first: those of its open run only, as a holder that died left its copies behind."""
    state = await journal.get(addresses.lane_state(MAIN_LANE), context)
    if state is None or state.current_operation_id is None:
        return []
    waiting: list[PendingApproval] = [pending for _, pending in await journal.scan_values(pending_address(""), context)]
    return sorted((pending for pending in waiting if pending.operation_id == state.current_operation_id),
                  key=lambda pending: pending.asked_at)


@dataclass(frozen=True)
class ApprovalChange:
    """Published when a call starts waiting (`answer` None) and when it stops (its answer, or a
    refusal when the run was aborted or the server stopped)."""

    pending: PendingApproval
    answer: Approval | None


@dataclass
class _Waiting:
    pending: PendingApproval
    answer: asyncio.Future[Approval]


class Approvals:
    """The pending approvals of one server, and its `before_tool` hook (`Approvals.hook`, an
    `ApprovalPolicy` over the tools in `gated` and `mcp`'s weighing the permission `rules`, issue 30). An
    answer `for_session` allows that tool for the rest of the conversation, not the whole server:
    it is kept in the conversation's journal, as a chat's "always" is. `conversation_of` tells
    which conversation an operation belongs to (the server binds it to its drives); a call of an
    operation it does not know is refused, since nobody could be asked. `live` gives the
    conversation live here (the server binds it to its service's), in whose journal a waiting
    call is kept."""

    def __init__(self, *, gated: frozenset[str] = NEEDS_APPROVAL, rules: PermissionRules | None = None,
                 mcp: McpServers | None = None) -> None:
        self.hook = ApprovalPolicy(self._ask, gated=gated, rules=rules, mcp=mcp, conversation_of=self._rule_keeper,
                                   unavailable_reason="this server knows no conversation it belongs to")
        self.conversation_of: Callable[[str], str | None] = lambda operation_id: None
        self.live: Callable[[str], Conversation | None] = lambda conversation_id: None
        self._waiting: dict[str, _Waiting] = {}
        self._listeners: list[Callable[[ApprovalChange], None]] = []

    def listen(self, listener: Callable[[ApprovalChange], None]) -> Callable[[], None]:
        """Call `listener` on every change (without awaiting: it must not block); returns its remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def pending(self, conversation_id: str) -> list[PendingApproval]:
        """The calls of `conversation_id` waiting for an answer, oldest first (an answered call
        waits no more, even before its run has taken the answer)."""
        return [waiting.pending for waiting in self._waiting.values()
                if waiting.pending.conversation_id == conversation_id and not waiting.answer.done()]

    def answer(self, conversation_id: str, tool_call_id: str, answer: Approval) -> PendingApproval:
        """Answer the waiting call `tool_call_id` of `conversation_id`: the run goes on at once.
        Raises `ApprovalNotFound` when no such call waits there."""
        waiting = self._waiting.get(tool_call_id)
        if waiting is None or waiting.pending.conversation_id != conversation_id or waiting.answer.done():
            raise ApprovalNotFound(f"no call {tool_call_id[:80]!r} waits for approval in this conversation",
                                   tool_call_id=tool_call_id[:80])
        waiting.answer.set_result(answer)
        return waiting.pending

    async def listed(self, journal: SessionReader, context: Context) -> list[PendingApproval]:
        """The calls of the conversation `journal` holds waiting for an answer, oldest first: this
        server's own while it holds the conversation, else those its holder keeps in the journal
        (`journal_pending`, issue 28)."""
        if self.live(journal.id) is not None:
            return self.pending(journal.id)
        return await journal_pending(journal, context)

    async def answer_anywhere(self, session: Session, user: str, tool_call_id: str, answer: Approval,
                              context: Context) -> tuple[PendingApproval, bool]:
        """Answer the waiting call `tool_call_id` of the conversation `session` holds, as `user`,
        and return it and whether the answer was posted: a call waiting here is answered at once
        (`answer`); one the journal shows waiting in another process gets the answer posted to
        that holder, which hands it to the call when it takes it (`answer_posted`, issue 28).
        Raises `ApprovalNotFound` when no such call waits in either."""
        waiting = self._waiting.get(tool_call_id)
        if waiting is not None or self.live(session.id) is not None:
            return self.answer(session.id, tool_call_id, answer), False
        found = [pending for pending in await journal_pending(session, context) if pending.tool_call_id == tool_call_id]
        if not found:
            raise ApprovalNotFound(f"no call {tool_call_id[:80]!r} waits for approval in this conversation",
                                   tool_call_id=tool_call_id[:80])
        await session.post_request(ApprovalAnswerRequest(lane=MAIN_LANE, user=user, tool_call_id=tool_call_id,
                                                         allow=answer.allow, for_session=answer.for_session,
                                                         reason=answer.reason, requested_at=now_ms()), context)
        return found[0], True

    def answer_posted(self, conversation_id: str, request: ApprovalAnswerRequest) -> None:
        """Answer a call waiting here with what another process posted (the service's
        `ConversationSetup.answer_approval`); a call that waits no more (answered here first, or
        its run ended) is left alone, with a log line."""
        try:
            self.answer(conversation_id, request.tool_call_id,
                        Approval(allow=request.allow, for_session=request.for_session, reason=request.reason))
        except ApprovalNotFound:
            logger.info("approval answer posted for call %s of conversation %s dropped: it waits no more",
                        request.tool_call_id, conversation_id)

    async def _ask(self, request: ApprovalRequest, context: Context) -> Approval:
        conversation_id = self.conversation_of(request.operation_id)
        if conversation_id is None:
            return Approval(allow=False, reason="nobody can be asked: the server does not drive this run")
        pending = PendingApproval(conversation_id=conversation_id, operation_id=request.operation_id,
                                  tool_call_id=request.tool_call_id, tool_name=request.tool_name,
                                  args=request.args, summary=request.summary, asked_at=now_ms())
        waiting = _Waiting(pending, asyncio.get_running_loop().create_future())
        # Waiting here before it is in the journal: an answer posted by a process that read it
        # there finds it.
        self._waiting[request.tool_call_id] = waiting
        await self._keep(pending, pending)
        self._publish(ApprovalChange(pending, None))

        async def refuse_on_cancel() -> None:
            await context.wait_cancelled()  # the run was aborted or halted: fail closed
            if not waiting.answer.done():
                waiting.answer.set_result(DENY)

        watcher = asyncio.ensure_future(refuse_on_cancel())
        try:
            return await waiting.answer
        finally:
            watcher.cancel()
            del self._waiting[request.tool_call_id]
            self._publish(ApprovalChange(pending, waiting.answer.result() if waiting.answer.done() else DENY))
            await self._keep(pending, None)

    def _rule_keeper(self, request: ToolCallRequest) -> RuleKeeper | None:
        """The conversation live here that a call belongs to, which keeps its "always" answers."""
        conversation_id = self.conversation_of(request.operation_id)
        return self.live(conversation_id) if conversation_id is not None else None

    async def _keep(self, pending: PendingApproval, value: PendingApproval | None) -> None:
        """Write (None: delete) the journal's copy of a waiting call, best effort: on a store fault
        the call still waits here and is answered from this server, and a copy left behind is
        not listed once its run has ended (`journal_pending`)."""
        conversation = self.live(pending.conversation_id)
        if conversation is None:
            return
        # A context of its own: the run's is cancelled when the run is aborted, and the copy must go then too.
        context = Context({"conversation_id": pending.conversation_id, "task": "pending approval"})
        try:
            await conversation.set_value(pending_address(pending.tool_call_id), value, context)
        except HarnessError as error:
            logger.warning("approval of call %s of conversation %s %s the journal: %s [%s]", pending.tool_call_id,
                           pending.conversation_id, "not kept in" if value is not None else "left in",
                           error.message, error.code)

    def _publish(self, change: ApprovalChange) -> None:
        for listener in list(self._listeners):
            listener(change)
