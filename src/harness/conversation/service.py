"""`ConversationService`: conversations over a store, each owned by one user, and the one door through
which a person's surface (the terminal chat, later the HTTP API) works with them.

A conversation is a session whose `main` lane talks to the person. Its turn lock is that lane being
idle, whichever process holds the session. Every call names the user and is checked against the
conversation's owner (`Forbidden`, nothing changed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict

from harness.context import Context
from harness.conversation.chat_events import ChatEventDetails, ChatEventView, Renamed, chat_event_of
from harness.conversation.recording import MAIN_LANE, record_chat_event, record_cold_chat_event
from harness.conversation.turn_rows import public_error, replay_interrupted_replies, turn_end_rows
from harness.errors import HarnessError
from harness.messages import Message
from harness.providers import ModelRegistry
from harness.runtime import (
    AgentHarness,
    AgentHarnessOptions,
    AgentTool,
    CompactionEnd,
    DriveSettings,
    EntryAdded,
    HarnessEvent,
    LaneSnapshot,
    LaneWatch,
    Listener,
    OpenOperation,
    RunHooks,
)
from harness.session import (
    CustomMessagePayload,
    Entry,
    LaneConfig,
    Session,
    SessionMutator,
    SessionNotFound,
    Store,
    addresses,
)

OWNER = addresses.value_address("conversation", "owner", str)
"""The user id a conversation belongs to, written when it is created."""


class Forbidden(HarnessError):
    """The conversation belongs to another user; nothing was read or changed."""

    code = "forbidden"


@dataclass(frozen=True)
class ConversationSetup:
    """What every conversation's harness runs with. `hooks` are the door's own (approval, say);
    the service adds the conversation's replay transform and turn-end rows to them."""

    models: ModelRegistry | None = None
    tools: Sequence[AgentTool] = ()
    system_prompt: str | None = None
    drive: DriveSettings = field(default_factory=DriveSettings)
    hooks: RunHooks = field(default_factory=RunHooks)
    listeners: Sequence[Listener] = ()


@dataclass(frozen=True)
class ConversationInfo:
    """One conversation as a listing shows it; times are Unix ms."""

    id: str
    owner: str
    name: str | None
    created_at: int
    updated_at: int


class ChatEventPublished(BaseModel):
    """A chat-event row, published once its append has committed (CE-2, CE-26)."""

    model_config = ConfigDict(frozen=True)

    type: Literal["chat_event"] = "chat_event"
    lane: str
    row: ChatEventView


ConversationEvent = ChatEventPublished | HarnessEvent
"""The conversation's live stream: its chat-event rows and the harness's own events (CE-26)."""


def chat_event_rows(entries: Sequence[Entry]) -> list[ChatEventView]:
    """The chat-event rows among `entries`, as every surface renders them (CE-2)."""
    rows = []
    for entry in entries:
        payload = entry.payload
        if isinstance(payload, CustomMessagePayload) and (details := chat_event_of(payload.message)) is not None:
            rows.append(ChatEventView(id=entry.id, details=details))
    return rows


def conversation_events(event: HarnessEvent) -> list[ConversationEvent]:
    """`event` as the conversation's live stream carries it: an entry that is a chat-event row
    is preceded by its `ChatEventPublished`; any other event is itself alone (CE-2, CE-26). For a
    door that takes the harness's events as a listener rather than a watch."""
    if isinstance(event, EntryAdded) and (row := chat_event_rows([event.entry])):
        return [ChatEventPublished(lane=event.lane, row=row[0]), event]
    return [event]


class ConversationWatch:
    """A conversation's snapshot, then every later event with chat-event rows typed (CE-26)."""

    def __init__(self, watch: LaneWatch) -> None:
        self._watch = watch
        self.snapshot: LaneSnapshot = watch.snapshot
        self.rows = chat_event_rows(watch.snapshot.transcript)

    async def __aiter__(self) -> AsyncIterator[ConversationEvent]:
        async for delivery in self._watch:
            for event in conversation_events(delivery.event):
                yield event

    def close(self) -> None:
        self._watch.close()


class Conversation:
    """A live conversation: its attached harness and the lane that talks to the person."""

    def __init__(self, info: ConversationInfo, harness: AgentHarness, open_operations: list[OpenOperation]) -> None:
        self.info = info
        self.harness = harness
        self.lane = harness.lane(MAIN_LANE)
        self.open_operations = open_operations
        self._recording: set[asyncio.Task[bool]] = set()
        harness.add_listener(self._on_event)

    def _on_event(self, event: HarnessEvent, context: Context) -> None:
        # A listener may not call the harness (it runs as events are delivered): the row of a
        # compaction circuit-breaker stop is recorded by a task, as a pending write of the run
        # that goes on without compacting (CE-9).
        if isinstance(event, CompactionEnd) and event.error is not None and event.error.code == "compaction_stopped":
            task = asyncio.get_running_loop().create_task(self.record(public_error(event.error), context))
            self._recording.add(task)
            task.add_done_callback(self._recording.discard)

    async def dispose(self, context: Context) -> None:
        """Finish recording what is under way, then detach the harness (the conversation stays in
        the journal)."""
        if self._recording:
            await asyncio.wait(list(self._recording))
        await self.harness.close(context)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def busy(self) -> bool:
        """The turn lock: held while the person's lane has an operation open."""
        return self.lane.info().operation is not None

    async def record(self, details: ChatEventDetails, context: Context) -> bool:
        """Record a chat event here (see `record_chat_event`)."""
        return await record_chat_event(self.harness, details, context)

    async def watch(self, context: Context) -> ConversationWatch:
        return ConversationWatch(await self.lane.watch(context))


class ConversationService:
    """Conversations in `store`, each run with `setup` while live in this process."""

    def __init__(self, store: Store, setup: ConversationSetup | None = None) -> None:
        self.store = store
        self.setup = setup or ConversationSetup()
        self._live: dict[str, Conversation] = {}

    # -- conversations ----------------------------------------------------------------------------

    async def create(self, user: str, config: LaneConfig, context: Context, *, name: str | None = None) -> Conversation:
        """A new conversation of `user`, live in this process, its `main` lane on `config`."""
        session = await self.store.create_session(context)

        async def own(m: SessionMutator) -> None:
            m.set(OWNER, user)
            if name is not None:
                m.set(addresses.session_name(), name)

        await session.mutate(own, context)
        await session.create_lane(MAIN_LANE, config, context)
        return await self._attach(session, user, context)

    async def adopt(self, user: str, conversation_id: str, context: Context) -> bool:
        """Make a session that has no owner `user`'s conversation; True when this call did.

        A session without an owner was made before conversations had owners, imported, forked or
        saved by a door that writes none; a door whose person owns the whole store (the terminal's
        local account) adopts it before `open`. The owner is read and written in one job on the
        session line, so of two adopters one wins and the other gets `Forbidden` (the owner is
        then recorded once). Owned by `user` already: False, nothing written; by another user:
        `Forbidden`. Raises `SessionNotFound` for no such session, `SessionOwned` while another
        harness holds it."""
        session = await self.store.open_session(conversation_id, context)

        async def claim(m: SessionMutator) -> str | None:
            owner = await m.get(OWNER, context)
            if owner is None:
                m.set(OWNER, user)
            return owner

        owner = await session.mutate(claim, context)
        if owner is not None and owner != user:
            raise Forbidden(f"conversation {conversation_id} belongs to another user", conversation_id=conversation_id)
        return owner is None

    async def list(self, user: str, context: Context) -> list[ConversationInfo]:
        """`user`'s conversations, most recently updated first."""
        infos = []
        for info in await self.store.list_sessions(context):
            session = await self.store.open_session(info.id, context)
            if await session.get(OWNER, context) == user:
                infos.append(ConversationInfo(id=info.id, owner=user, name=await _name(session, context),
                                              created_at=info.created_at, updated_at=info.updated_at))
        return sorted(infos, key=lambda i: i.updated_at, reverse=True)

    async def open(self, user: str, conversation_id: str, context: Context) -> Conversation:
        """`user`'s conversation, live in this process (the same object while it is)."""
        session = await self._owned(user, conversation_id, context)
        live = self._live.get(conversation_id)
        return live if live is not None else await self._attach(session, user, context)

    async def close(self, user: str, conversation_id: str, context: Context) -> None:
        """Dispose the live conversation: its harness detaches; nothing of it is lost, and `open`
        restores it from the journal."""
        await self._owned(user, conversation_id, context)
        live = self._live.pop(conversation_id, None)
        if live is not None:
            await live.dispose(context)

    async def record(self, user: str, conversation_id: str, details: ChatEventDetails, context: Context) -> bool:
        """Record a chat event on the conversation, live here or cold (CE-3, CE-10)."""
        session = await self._owned(user, conversation_id, context)
        live = self._live.get(conversation_id)
        if live is not None:
            return await live.record(details, context)
        return await record_cold_chat_event(session, details, context)

    async def rename(self, user: str, conversation_id: str, name: str | None, context: Context) -> bool:
        """Name the conversation (None clears it) and record the rename row, live or closed; the
        next restore reads both from the journal (CE-10, CE-15)."""
        session = await self._owned(user, conversation_id, context)
        live = self._live.get(conversation_id)
        if live is not None:
            await live.harness.set_session_name(name, context)
            return await live.record(Renamed(name=name), context)
        harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session), context)
        try:
            await harness.set_session_name(name, context)
            return await record_chat_event(harness, Renamed(name=name), context)
        finally:
            await harness.close(context)

    async def close_all(self, context: Context) -> None:
        """Dispose every live conversation of this service."""
        for conversation_id in list(self._live):
            live = self._live.pop(conversation_id)
            await live.dispose(context)

    # -- internals --------------------------------------------------------------------------------

    async def _owned(self, user: str, conversation_id: str, context: Context) -> Session:
        session = await self.store.open_session(conversation_id, context)
        owner = await session.get(OWNER, context)
        if owner is None:
            raise SessionNotFound(f"no conversation {conversation_id!r}", session_id=conversation_id)
        if owner != user:
            raise Forbidden(f"conversation {conversation_id} belongs to another user", conversation_id=conversation_id)
        return session

    async def _attach(self, session: Session, user: str, context: Context) -> Conversation:
        setup = self.setup
        options = AgentHarnessOptions(
            session=session, models=setup.models, tools=setup.tools, system_prompt=setup.system_prompt,
            drive=setup.drive, hooks=conversation_hooks(setup.hooks), listeners=setup.listeners)
        harness, open_operations = await AgentHarness.create(options, context)
        info = ConversationInfo(id=session.id, owner=user, name=await _name(session, context),
                                created_at=session.info.created_at, updated_at=session.info.updated_at)
        conversation = self._live[session.id] = Conversation(info, harness, open_operations)
        return conversation


async def _name(session: Session, context: Context) -> str | None:
    name = await session.get(addresses.session_name(), context)
    return name


def conversation_hooks(hooks: RunHooks) -> RunHooks:
    """`hooks` with the conversation's own: interrupted replies replayed before the door's
    transform (CE-8) and the turn-end rows placed in the terminal commit (CE-7, CE-9)."""
    door_transform = hooks.transform_context

    async def transform(messages: list[Message], context: Context) -> list[Message]:
        replayed = replay_interrupted_replies(messages)
        return await door_transform(replayed, context) if door_transform is not None else replayed

    return replace(hooks, transform_context=transform, settlement_messages=turn_end_rows)
