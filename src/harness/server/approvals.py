"""Tool approvals answered over HTTP: the server's `before_tool` hook parks each gated call as a
pending approval until the conversation's owner answers it (or the run is aborted, or the server
stops: the call is then refused, as approval fails closed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, JsonValue

from harness.context import Context
from harness.errors import HarnessError
from harness.messages import now_ms
from harness.tools import DENY, NEEDS_APPROVAL, Approval, ApprovalPolicy, ApprovalRequest


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
    `ApprovalPolicy` over the tools in `gated`). An answer `for_session` allows that tool for the
    rest of the conversation, not the whole server. `conversation_of` tells which conversation an
    operation belongs to (the server binds it to its drives); a call of an operation it does not
    know is refused, since nobody could be asked."""

    def __init__(self, *, gated: frozenset[str] = NEEDS_APPROVAL) -> None:
        self.hook = ApprovalPolicy(self._ask, gated=gated,
                                   unavailable_reason="this server knows no conversation it belongs to")
        self.conversation_of: Callable[[str], str | None] = lambda operation_id: None
        self._waiting: dict[str, _Waiting] = {}
        self._allowed: dict[str, set[str]] = {}
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
        if answer.allow and answer.for_session:
            self._allowed.setdefault(conversation_id, set()).add(waiting.pending.tool_name)
        # The policy's own for-session memory would be the whole server's: it gets a plain allow.
        waiting.answer.set_result(Approval(allow=answer.allow, reason=answer.reason))
        return waiting.pending

    async def _ask(self, request: ApprovalRequest, context: Context) -> Approval:
        conversation_id = self.conversation_of(request.operation_id)
        if conversation_id is None:
            return Approval(allow=False, reason="nobody can be asked: the server does not drive this run")
        if request.tool_name in self._allowed.get(conversation_id, set()):
            return Approval(allow=True)
        pending = PendingApproval(conversation_id=conversation_id, operation_id=request.operation_id,
                                  tool_call_id=request.tool_call_id, tool_name=request.tool_name,
                                  args=request.args, summary=request.summary, asked_at=now_ms())
        waiting = _Waiting(pending, asyncio.get_running_loop().create_future())
        self._waiting[request.tool_call_id] = waiting
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

    def _publish(self, change: ApprovalChange) -> None:
        for listener in list(self._listeners):
            listener(change)
