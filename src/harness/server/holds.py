"""Which conversations a server holds, and for how long (issue 29).

A held conversation is attached: its harness lives here and its claim pins a PostgreSQL
connection or a lock on the SQLite file. A server holds one only while a request uses it or a turn
of it is driven here, then `idle_release_s` more, and never more than `max_held` at once, so its
connections and descriptors stay bounded whatever the number of conversations. Reads and watches
need no hold: they read the journal (`ServerState.reader`, `ServerState.watch`).

Every `sweep_s` the server lets go of idle conversations, detaches one whose store failed under it
(`Conversation.broken`), and drives every open turn nobody holds: a dead process's, or its own
after a store fault once the store answers again (`resume_open`). Another process that
would attach an idle one (a second server admitting a turn) asks for it with a `ReleaseRequest`,
and the server lets go of it at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from harness.context import Context
from harness.conversation import Conversation, ConversationService, Forbidden
from harness.errors import HarnessError
from harness.server.drives import Drives
from harness.session import LaneConfig, SessionNotFound, SessionOwned

logger = logging.getLogger(__name__)

IDLE_RELEASE_S = 30.0
"""How long a server keeps a conversation attached after its last request and drive (seconds)."""

MAX_HELD = 64
"""How many conversations a server holds at once, at most."""

SWEEP_S = 5.0
"""How often a server lets go of idle or broken conversations and looks for open turns nobody
drives (seconds): the longest a dead process's turn waits for this server."""


class ServerBusy(HarnessError):
    """The server holds `max_held` conversations, each in use by a request or a running turn: try
    again shortly. Details `{held}`."""

    code = "server_busy"


class ConversationInUse(HarnessError):
    """`POST .../close` or `DELETE` while another request of this server uses the conversation (a
    turn being admitted, a `/fast` switch) or a turn of it is driven here, or any request that
    would use it while a `DELETE` of it runs: nothing was closed, deleted or done; try again once
    that request or turn has ended. Details `{conversation_id}`."""

    code = "conversation_in_use"


class Holds:
    """The conversations one server holds (`use`), let go when idle (`sweep`)."""

    def __init__(self, service: ConversationService, drives: Drives, *, idle_release_s: float = IDLE_RELEASE_S,
                 max_held: int = MAX_HELD, sweep_s: float = SWEEP_S) -> None:
        self._service = service
        self._drives = drives
        self._idle_release_s = idle_release_s
        self._max_held = max_held
        self._sweep_s = sweep_s
        self._users: dict[str, int] = {}  # requests using each conversation now
        self._alone: set[str] = set()  # conversations a request uses alone (a delete): refused to the others
        self._last_used: dict[str, float] = {}
        self._room = asyncio.Lock()
        self._letting_go: set[asyncio.Task[None]] = set()
        service.on_release_request = self.release_requested

    def release_requested(self, conversation_id: str) -> None:
        """Another process would attach `conversation_id` (`ReleaseRequest`): let go of it now if
        it is idle, in a task of its own (the request is taken by the conversation, which cannot
        close itself from inside)."""
        if self.busy(conversation_id):
            return
        task = asyncio.get_running_loop().create_task(
            self._let_go(conversation_id, Context({"conversation_id": conversation_id, "task": "release"})))
        self._letting_go.add(task)
        task.add_done_callback(self._letting_go.discard)

    @property
    def held(self) -> tuple[str, ...]:
        """The ids of the conversations held now."""
        return self._service.live_ids

    def busy(self, conversation_id: str) -> bool:
        """Whether a request uses the conversation or a turn of it is driven here."""
        return conversation_id in self._users or self._drives.driving(conversation_id)

    @asynccontextmanager
    async def use(self, user: str, conversation_id: str, context: Context, *,
                  alone: bool = False) -> AsyncIterator[Conversation]:
        """`user`'s conversation, attached for the block (`ConversationService.open`), counted as
        in use until it ends; `alone`, no other request may use it meanwhile. One whose store
        failed under it is attached again first. Raises `ConversationInUse` while a request uses
        it alone (a delete), `ServerBusy` when holding it would pass `max_held`, and what `open` raises."""
        if conversation_id in self._alone:
            raise ConversationInUse(f"conversation {conversation_id} is being deleted by another request; try again "
                                    "once that has ended", conversation_id=conversation_id)
        if alone:
            self._alone.add(conversation_id)
        self._users[conversation_id] = self._users.get(conversation_id, 0) + 1  # no sweep lets it go now
        try:
            live = self._service.live(conversation_id)
            if live is not None and live.broken:
                await self._service.drop(conversation_id, context)
                live = None
            if live is None:
                async with self._room:
                    await self._make_room(conversation_id, context)
                    conversation = await self._service.open(user, conversation_id, context)
            elif live.info.owner != user:  # the owner check, with nothing to read
                raise Forbidden.of(conversation_id)
            else:
                conversation = live
            yield conversation
        finally:
            if alone:
                self._alone.discard(conversation_id)
            self._done(conversation_id)

    @asynccontextmanager
    async def use_new(self, user: str, config: LaneConfig, context: Context, *,
                      name: str | None = None) -> AsyncIterator[Conversation]:
        """A new conversation of `user` (`ConversationService.create`), held as `use` holds one.
        Raises `ServerBusy` as `use` does, before anything is created."""
        async with self._room:
            await self._make_room(None, context)
            conversation = await self._service.create(user, config, context, name=name)
            self._users[conversation.id] = self._users.get(conversation.id, 0) + 1
        try:
            yield conversation
        finally:
            self._done(conversation.id)

    def _done(self, conversation_id: str) -> None:
        left = self._users.pop(conversation_id) - 1
        if left:
            self._users[conversation_id] = left
        if self._service.live(conversation_id) is not None:  # not an id that failed to open
            self._last_used[conversation_id] = time.monotonic()

    async def _make_room(self, wanted: str | None, context: Context) -> None:
        held = [conversation_id for conversation_id in self.held if conversation_id != wanted]
        if len(held) < self._max_held:
            return
        idle = sorted((conversation_id for conversation_id in held if not self.busy(conversation_id)),
                      key=lambda conversation_id: self._last_used.get(conversation_id, 0.0))
        for conversation_id in idle[:len(held) - self._max_held + 1]:
            await self._let_go(conversation_id, context)
        if len([conversation_id for conversation_id in self.held if conversation_id != wanted]) >= self._max_held:
            raise ServerBusy(f"this server holds {self._max_held} conversations, each in use: try again shortly",
                             held=self._max_held)

    async def close(self, user: str, conversation_id: str, context: Context) -> None:
        """Let go of `user`'s conversation now (`ConversationService.close`): nothing of it is
        lost. Raises `ConversationInUse` while a request uses it or a turn of it is driven here,
        closing nothing, and what `close` raises (`Forbidden`)."""
        self._let_go_of(conversation_id, "close")
        await self._service.close(user, conversation_id, context)

    async def delete(self, user: str, conversation_id: str, context: Context) -> None:
        """Delete `user`'s conversation for good (`ConversationService.delete`), held here or not,
        in use alone (`use`) while it is opened, stopped, let go of and deleted: a request that
        would use it meanwhile (attach it again under the delete, admit a turn it cuts off) is
        refused `ConversationInUse`, and no sweep lets go of it. Raises `ConversationInUse` as
        `close` does, deleting nothing, and what `use` and `delete` raise."""
        self._let_go_of(conversation_id, "delete")
        async with self.use(user, conversation_id, context, alone=True):
            await self._service.delete(user, conversation_id, context)

    def _let_go_of(self, conversation_id: str, action: str) -> None:
        """Forget the conversation's idle time before `action` lets go of it; raises
        `ConversationInUse` while it is `busy`."""
        if self.busy(conversation_id):
            raise ConversationInUse(f"conversation {conversation_id} is in use by a request or a turn; {action} it "
                                    "once that has ended (stop a turn first)", conversation_id=conversation_id)
        self._last_used.pop(conversation_id, None)

    async def sweep(self, context: Context) -> None:
        """Once: let go of every conversation idle for `idle_release_s`, detach every broken one
        no request uses, then drive the open turns nobody holds (`resume_open`)."""
        now = time.monotonic()
        for conversation_id in self.held:
            live = self._service.live(conversation_id)
            if live is None:
                continue
            if self._drives.driving(conversation_id):
                self._last_used[conversation_id] = now  # idle from the drive's end on
            elif live.broken and conversation_id not in self._users:
                logger.warning("conversation %s: its store failed under it; attaching it again", conversation_id)
                self._last_used.pop(conversation_id, None)
                await self._service.drop(conversation_id, context)
            elif not self.busy(conversation_id) and now - self._last_used.setdefault(
                    conversation_id, now) >= self._idle_release_s:
                await self._let_go(conversation_id, context)
        await self.resume_open(context)

    async def resume_open(self, context: Context) -> list[str]:
        """Start a drive for every open operation of every conversation with one that no process
        holds (a stopped server's or worker's, or one this server let go after its store failed,
        `Drives.unheld_open`), and return their operation ids: on start and at every sweep. Each
        is attached through `use`, as a request's is: one a delete uses alone is left, holding it
        counts against `max_held`, and it is let go once idle after its drives. A conversation
        another process holds (`SessionOwned`), deleted meanwhile, in use, beyond `max_held` or
        unreadable now is left for the next sweep."""
        started = []
        for conversation_id, owner in (await self._drives.unheld_open(context)).items():
            try:
                async with self.use(owner, conversation_id, context) as conversation:
                    for operation in conversation.open_operations:
                        self._drives.start(conversation, operation.lane, operation.operation_id)
                        started.append(operation.operation_id)
            except (SessionOwned, SessionNotFound, ConversationInUse) as error:
                logger.debug("not resuming conversation %s: %s", conversation_id, error)
            except HarnessError as error:  # the store failing still, or the server full: the next sweep
                logger.warning("not resuming conversation %s now: %s [%s]", conversation_id, error.message, error.code)
        return started

    async def run(self, context: Context) -> None:
        """`sweep` every `sweep_s` until cancelled; a sweep the store fails is logged and the next
        one tries again."""
        while True:
            await asyncio.sleep(self._sweep_s)
            try:
                await self.sweep(context)
            except HarnessError as error:
                logger.warning("the server's sweep of its conversations failed: %s [%s]", error.message, error.code)

    @asynccontextmanager
    async def sweeping(self, context: Context) -> AsyncIterator[None]:
        """`run` in a task for the block."""
        task = asyncio.get_running_loop().create_task(self.run(context))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _let_go(self, conversation_id: str, context: Context) -> None:
        live = self._service.live(conversation_id)
        if live is None or self.busy(conversation_id):
            return
        self._last_used.pop(conversation_id, None)
        try:
            await self._service.close(live.info.owner, conversation_id, context)
        except HarnessError as error:  # its store failing: let go of it as a crash would
            logger.warning("conversation %s: closing it failed (%s); detaching it", conversation_id, error.message)
            await self._service.drop(conversation_id, context)
