"""Tool approvals answered over HTTP: the server's `before_tool` hook lets each gated call wait in
its conversation (`Conversation.ask_approval`, the one mechanism every door's calls wait by,
issue 30) until an answer comes from any process, and tells the server's streams when a call
starts and stops waiting. A call waiting in another process (a `harness worker`, a terminal chat,
another server) is listed from the conversation's journal and answered through the service
(`ConversationService.answer_approval`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from harness.context import Context
from harness.conversation import ApprovalChange, Conversation, PendingApproval
from harness.conversation.approvals import APPROVALS_NAMESPACE, JournalApprovals, journal_pending
from harness.errors import HarnessError
from harness.runtime import ToolCallRequest
from harness.session import ChangeFeed, SessionReader
from harness.tools import ApprovalPolicy, PermissionRules

logger = logging.getLogger(__name__)


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
        self._elsewhere: dict[str, _ElsewhereReader] = {}  # by conversation id

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

    @property
    def readers(self) -> int:
        """How many journal readers of approvals waiting elsewhere run now: one per conversation
        followed, whatever its number of watchers (`follow_elsewhere`)."""
        return len(self._elsewhere)

    async def follow_elsewhere(self, journal: SessionReader, changes: ChangeFeed, poll_s: float,
                               changed: Callable[[ApprovalChange], None]) -> None:
        """Tell `changed` of the calls of the conversation `journal` holds that wait in, or are
        answered by, whichever other process holds it (a `harness worker`, a chat, another
        server): first those waiting now, then each change from now on. The watchers of one
        conversation share one reader in this server (issue 29), started with the first and
        stopped after the last: it reads the journal's copies (`JournalApprovals`) at each change
        of it (`changes`' notifications, else every `poll_s`), nothing while this server holds
        the conversation, whose calls `listen`ers hear of live. Runs until cancelled; a store that
        cannot tell now is read again at the next wake, and any other failure of the reader is
        raised to every watcher of it."""
        reader = self._elsewhere.get(journal.id)
        if reader is None:
            reader = self._elsewhere[journal.id] = _ElsewhereReader(self, journal, changes, poll_s)
            reader.task.add_done_callback(lambda _: self._ended(journal.id, reader))
        for pending in list(reader.waiting.values()):
            changed(ApprovalChange(pending, None))
        reader.listeners.append(changed)
        try:
            await asyncio.wait({reader.task})  # a watcher cancelled here leaves the reader running
            reader.task.result()
        finally:
            reader.listeners.remove(changed)
            if not reader.listeners:
                reader.task.cancel()
                self._ended(journal.id, reader)

    def _ended(self, conversation_id: str, reader: _ElsewhereReader) -> None:
        if self._elsewhere.get(conversation_id) is reader:
            del self._elsewhere[conversation_id]

    def _conversation(self, request: ToolCallRequest) -> Conversation | None:
        """The conversation live here that a call belongs to: it waits there, and keeps its "always" answers."""
        conversation_id = self.conversation_of(request.operation_id)
        return self.live(conversation_id) if conversation_id is not None else None


class _ElsewhereReader:
    """The one reader of a conversation's approvals waiting elsewhere that its watchers in this
    server share (`Approvals.follow_elsewhere`): it tells each change to every `listeners`, and
    keeps the calls told waiting and not yet answered (`waiting`) for a watcher that joins."""

    def __init__(self, approvals: Approvals, journal: SessionReader, changes: ChangeFeed, poll_s: float) -> None:
        self.listeners: list[Callable[[ApprovalChange], None]] = []
        self.waiting: dict[tuple[str, str], PendingApproval] = {}  # by (operation, call), oldest first
        self._approvals = approvals
        self._journal = journal
        self.task = asyncio.get_running_loop().create_task(self._read(changes, poll_s))

    async def _read(self, changes: ChangeFeed, poll_s: float) -> None:
        journal = self._journal
        context = Context({"server": "approvals elsewhere", "conversation": journal.id})
        told = JournalApprovals(journal)
        wakes = changes.subscribe(journal.id, namespace=APPROVALS_NAMESPACE)  # its copies' commits alone
        try:
            while True:
                if self._approvals.live(journal.id) is None:
                    try:
                        for change in await told.changes(context):
                            self._tell(change)
                    except HarnessError as error:
                        logger.warning("approvals of conversation %s not read: %s [%s]", journal.id,
                                       error.message, error.code)
                await wakes.wait(poll_s)
        finally:
            wakes.close()

    def _tell(self, change: ApprovalChange) -> None:
        key = (change.pending.operation_id, change.pending.tool_call_id)
        if change.answer is None:
            self.waiting[key] = change.pending
        else:
            self.waiting.pop(key, None)
        for listener in list(self.listeners):
            listener(change)
