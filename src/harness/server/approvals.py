"""Tool approvals answered over HTTP: the server's `before_tool` hook lets each gated call wait in
its conversation (`Conversation.ask_approval`, the one mechanism every door's calls wait by,
issue 30) until an answer comes from any process, and tells the server's streams when a call
starts and stops waiting. A call waiting in another process (a `harness worker`, a terminal chat,
another server) is listed from the conversation's journal and answered through the service
(`ConversationService.answer_approval`)."""

from __future__ import annotations

from collections.abc import Callable

from harness.context import Context
from harness.conversation import ApprovalChange, Conversation, PendingApproval
from harness.conversation.approvals import journal_pending
from harness.runtime import ToolCallRequest
from harness.session import SessionReader
from harness.tools import ApprovalPolicy, PermissionRules


class Approvals:
    """The approvals of one server and its `before_tool` hook (`Approvals.hook`, an
    `ApprovalPolicy` weighing the permission `rules` and each tool's `asks_first`, issue 30,
    whose calls wait in their conversation for an answer from anywhere). An answer
    `for_session` allows that tool for the rest of the conversation, kept in its journal, as a
    chat's "always" is. `conversation_of` tells which conversation an operation belongs to (the
    server binds it to its drives) and `live` gives the conversation live here (the server binds
    it to its service's); a call of an operation it does not know is refused, since nobody could
    be asked. Give `changed` to the service as its setup's `on_approval`, so that `listen`ers
    (the streams) hear of each call."""

    def __init__(self, *, rules: PermissionRules | None = None) -> None:
        self.hook = ApprovalPolicy(None, rules=rules, conversation_of=self._conversation,
                                   answered_anywhere=True,
                                   unavailable_reason="this server knows no conversation it belongs to")
        self.conversation_of: Callable[[str], str | None] = lambda operation_id: None
        self.live: Callable[[str], Conversation | None] = lambda conversation_id: None
        self._listeners: list[Callable[[ApprovalChange], None]] = []

    def listen(self, listener: Callable[[ApprovalChange], None]) -> Callable[[], None]:
        """Call `listener` on every change (without awaiting: it must not block); returns its remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def changed(self, change: ApprovalChange) -> None:
        """A call of a conversation live here started or stopped waiting (the setup's `on_approval`)."""
        for listener in list(self._listeners):
            listener(change)

    def pending(self, conversation_id: str) -> list[PendingApproval]:
        """The calls of `conversation_id` waiting here for an answer, oldest first (an answered
        call waits no more, even before its run has taken the answer)."""
        live = self.live(conversation_id)
        return live.pending_approvals() if live is not None else []

    async def listed(self, journal: SessionReader, context: Context) -> list[PendingApproval]:
        """The calls of the conversation `journal` holds waiting for an answer, oldest first: those
        waiting here while this server holds it, else those its holder keeps in the journal
        (`journal_pending`)."""
        if self.live(journal.id) is not None:
            return self.pending(journal.id)
        return await journal_pending(journal, context)

    def _conversation(self, request: ToolCallRequest) -> Conversation | None:
        """The conversation live here that a call belongs to: it waits there, and keeps its "always" answers."""
        conversation_id = self.conversation_of(request.operation_id)
        return self.live(conversation_id) if conversation_id is not None else None
