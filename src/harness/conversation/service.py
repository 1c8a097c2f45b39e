"""`ConversationService`: conversations over a store, each owned by one user, and the one door through
which a person's surface (the terminal chat, later the HTTP API) works with them.

A conversation is a session whose `main` lane talks to the person. Its turn lock is that lane being
idle, whichever process holds the session. Every call names the user and is checked against the
conversation's owner (`Forbidden`, nothing changed).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict

from harness.context import Context
from harness.conversation.agents import AgentRegistry
from harness.conversation.blocks import (
    message_blocks_at_run_end,
    normalize_tool_blocks,
    referenced_images,
)
from harness.conversation.chat_events import (
    ChatEventDetails,
    ChatEventView,
    CommandOutcome,
    DirectoryMoved,
    Renamed,
    ShellRan,
    chat_event_of,
)
from harness.conversation.command_rows import CommandInvocation, command_failed, command_ran, shell_ran
from harness.conversation.delegation import Delegation, DelegationFinished, DelegationView, delegation_rows
from harness.conversation.display import (
    DISPLAY_PAGE,
    MAX_DISPLAY_PAGE,
    BlocksRow,
    DisplayPage,
    blocks_row,
    display_rows,
)
from harness.conversation.feed import Alert, InstanceFeed, Presence, TurnActivity
from harness.conversation.garden_messages import GardenMessage, garden_message, garden_message_of
from harness.conversation.lifecycle import ENDED_AT, refuse_if_ended
from harness.conversation.project_switch import (
    SwitchedBy,
    project_boundary,
    project_tool,
    refuse_unknown,
    switch_project,
)
from harness.conversation.projects import PROJECT_SELECTION, ExecutionTarget, SwitchableProject, load_projects
from harness.conversation.recording import CONVERSATION_VALUES, MAIN_LANE, record_chat_event
from harness.conversation.settings import MODEL_SWITCH_ACK_S, ConversationSettings, ModelSwitch, WorkMode
from harness.conversation.turn_rows import public_error, replay_interrupted_replies, turn_end_rows
from harness.errors import HarnessError
from harness.messages import ImageContent, Message, ModelIdentity, ThinkingLevel, now_ms
from harness.providers import ModelRegistry
from harness.runtime import (
    DEFAULT_EVENT_LOG_LIMIT,
    AcceptedRun,
    AgentHarness,
    AgentHarnessOptions,
    AgentTool,
    BetweenSteps,
    CompactionEnd,
    DriveOutcome,
    DriveSettings,
    EntryAdded,
    Fault,
    HarnessEvent,
    Lane,
    LaneBusy,
    LaneEventPage,
    LaneFollow,
    LaneSnapshot,
    LaneWatch,
    Listener,
    OpenOperation,
    RunEnd,
    RunHooks,
    RunStart,
    ToolCallRequest,
    ToolOutput,
    ValueUpdate,
    read_lane_events,
)
from harness.session import (
    CustomMessagePayload,
    Entry,
    ImageStore,
    LaneConfig,
    Session,
    SessionMutator,
    SessionNotFound,
    SessionReader,
    Store,
    StoredImage,
    addresses,
    is_image_ref,
)

OWNER = addresses.value_address(CONVERSATION_VALUES.namespace, "owner", str)
"""The user id a conversation belongs to, written when it is created."""


T = TypeVar("T")

RecordNow: TypeAlias = Callable[[CommandOutcome | None], Awaitable[bool]]
"""`record_now(outcome)`: record a running command's row at once (see `ConversationService.run_command`)."""


IMAGE_SWEEP_GRACE_S = 3_600.0
"""How long an image stays after its latest store even when no entry names it: a tool result that
names it may not be committed yet (`ConversationService.sweep_images`)."""


class Forbidden(HarnessError):
    """The conversation belongs to another user; nothing was read or changed. Details:
    `conversation_id`."""

    code = "forbidden"

    @classmethod
    def of(cls, conversation_id: str) -> Forbidden:
        return cls(f"conversation {conversation_id} belongs to another user", conversation_id=conversation_id)


class ImageNotFound(HarnessError):
    """The conversation names no image under this ref, or the image is gone; nothing was read.
    Details: `conversation_id`, `ref`."""

    code = "image_not_found"


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
    fast_model: ModelIdentity | None = None
    """The model `/fast` switches to; None: `/fast` is refused (`NoFastModel`)."""
    fast_thinking_level: ThinkingLevel = "low"
    """The reasoning level `/fast` lowers to (a lower level already set is kept)."""
    tools_for: Callable[[ExecutionTarget], Sequence[AgentTool]] | None = None
    """Tools made for each conversation, given where it runs (the built-in ones, which work in
    its `ExecutionTarget.directory` as each call starts); beside `tools`, which every conversation
    shares."""
    directory: Path | None = None
    """Where the tools run while no project is selected; None: this process's directory."""
    projects_file: Path | None = None
    """The `projects.toml` projects are listed from (read at each listing); None: no projects, and
    no `project` tool."""
    running_jobs: Callable[[str], int] | None = None
    """How many tracked background jobs of a conversation (by id) still run and hold up a project
    switch (CE-20); None: the tools start none."""
    agents: AgentRegistry | None = None
    """The sub-agents the model may delegate to (CE-18): with a registry the harness gets the
    `delegate` and `workflow` tools, offered on a lane whose active tools name them; None: no
    delegation. `DEFAULT_AGENTS` is one general agent on the delegating lane's model and tools."""
    event_log_limit: int = DEFAULT_EVENT_LOG_LIMIT
    """How many durable events each lane's event log keeps after a settlement: a watcher that
    reconnects from an older event id gets a fresh snapshot instead (`AgentHarnessOptions`)."""


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


class MessageBlocksPublished(BaseModel):
    """A reply's blocks, published once their entry has committed; `row.id` is the entry's id,
    the same as the display read's row, so a surface that has both drops the twin (CE-24)."""

    model_config = ConfigDict(frozen=True)

    type: Literal["message_blocks"] = "message_blocks"
    lane: str
    row: BlocksRow


ConversationEvent = ChatEventPublished | MessageBlocksPublished | DelegationFinished | HarnessEvent
"""The conversation's live stream: its chat-event rows, its replies' blocks, its delegation rows
and the harness's own events (CE-18, CE-24, CE-26)."""


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
    is preceded by its `ChatEventPublished`, a `harness.message-blocks` entry by its
    `MessageBlocksPublished`, a subagent result with a finish marker by its `DelegationFinished`;
    any other event is itself alone (CE-2, CE-18, CE-24, CE-26). For a door that takes the
    harness's events as a listener rather than a watch."""
    if isinstance(event, EntryAdded):
        entry = event.entry
        if row := chat_event_rows([entry]):
            return [ChatEventPublished(lane=event.lane, row=row[0]), event]
        if (blocks := blocks_row(entry)) is not None:
            return [MessageBlocksPublished(lane=event.lane, row=blocks), event]
        if delegation := delegation_rows([entry]):
            return [DelegationFinished(lane=event.lane, row=delegation[0]), event]
    return [event]


class LaneEvents:
    """One lane from now on, however it is watched: `snapshot`, then through `async for` every
    `HarnessEvent` after it (durable ones with their `event_seq`, `MessageUpdate`s of the
    streaming reply between them), with `reader` for the session's records and `read_events` for
    the lane's event log. Made from the owner's `Lane.watch` (`of_watch`) or from a follow of a
    lane another process drives (`of_follow`), so a door reads either the same way.

    Iteration ends at `close()`; it raises what the source raises: `WatchOverflow` (a watch whose
    reader fell behind) or `FollowBehind` (a follow whose position left the log), after which the
    reader watches again, and the store's errors."""

    def __init__(self, snapshot: LaneSnapshot, reader: SessionReader, events: AsyncIterator[HarnessEvent],
                 buffered: Callable[[], list[HarnessEvent]], close: Callable[[], None]) -> None:
        self.snapshot = snapshot
        self.reader = reader
        self._events = events
        self._buffered = buffered
        self._close = close

    @classmethod
    def of_watch(cls, watch: LaneWatch, reader: SessionReader) -> LaneEvents:
        """The events of the owner's watch (`Lane.watch`) of a lane of `reader`'s session."""

        async def events() -> AsyncIterator[HarnessEvent]:
            async for delivery in watch:
                yield delivery.event

        return cls(watch.snapshot, reader, events(), lambda: [delivery.event for delivery in watch.buffered()],
                   watch.close)

    @classmethod
    def of_follow(cls, follow: LaneFollow, reader: SessionReader) -> LaneEvents:
        """The events of a follow (`follow_lane`) of a lane of `reader`'s session. A follow
        reads the log as it is iterated, so nothing is ever delivered and unread: `buffered` is
        always empty."""
        return cls(follow.snapshot, reader, aiter(follow), list, follow.close)

    def __aiter__(self) -> AsyncIterator[HarnessEvent]:
        return self._events

    def buffered(self) -> list[HarnessEvent]:
        """Take the events already delivered and not yet read, in order, without waiting (see
        `LaneWatch.buffered`)."""
        return self._buffered()

    async def read_events(self, after_seq: int | None, limit: int, context: Context) -> LaneEventPage:
        """The lane's logged events after `after_seq`, at most `limit` (`read_lane_events`)."""
        return await read_lane_events(self.reader, self.snapshot.lane, after_seq, limit, context)

    def close(self) -> None:
        """Stop: iteration ends at its next step. Idempotent."""
        self._close()


class ConversationWatch:
    """A conversation's snapshot, then every later event, with chat-event rows and replies'
    blocks typed (CE-24, CE-26), from a lane's events (`LaneEvents`): the owner's watch or a
    follow of the lane another process drives."""

    def __init__(self, events: LaneEvents) -> None:
        self.events = events
        self._deliveries = aiter(events)
        self._ready: deque[ConversationEvent] = deque()  # events of a delivery not yet read
        self.snapshot: LaneSnapshot = events.snapshot
        self.rows = chat_event_rows(events.snapshot.transcript)
        self.delegations: list[DelegationView] = delegation_rows(events.snapshot.transcript)

    def __aiter__(self) -> ConversationWatch:
        return self

    async def __anext__(self) -> ConversationEvent:
        while not self._ready:
            self._ready.extend(conversation_events(await anext(self._deliveries)))
        return self._ready.popleft()

    def buffered(self) -> list[ConversationEvent]:
        """Take the events already delivered and not yet read, in order, without waiting. Events
        reach a watch as they are committed, so a reader that merges the watch with a source told
        synchronously by the run (the server's approvals) reads these first and keeps the order
        in which things happened."""
        for event in self.events.buffered():
            self._ready.extend(conversation_events(event))
        taken = list(self._ready)
        self._ready.clear()
        return taken

    def close(self) -> None:
        self.events.close()


class Conversation:
    """A live conversation: its attached harness and the lane that talks to the person. `info`
    follows its renames."""

    def __init__(self, info: ConversationInfo, settings: ConversationSettings, open_operations: list[OpenOperation],
                 feed: InstanceFeed, delegation: Delegation | None = None) -> None:
        self.info = info
        self.harness = harness = settings.harness
        self.delegation = delegation
        """The conversation's sub-agents, when its setup has agents (CE-18)."""
        self.lane = harness.lane(MAIN_LANE)
        self.open_operations = open_operations
        self.settings = settings
        self._feed = feed
        self._recording: set[asyncio.Task[bool]] = set()
        harness.add_listener(self._on_event)
        feed.publish(Presence(conversation_id=info.id, live=True))

    def _on_event(self, event: HarnessEvent, context: Context) -> None:
        # A listener may not call the harness (it runs as events are delivered): the row of a
        # compaction circuit-breaker stop is recorded by a task, as a pending write of the run
        # that goes on without compacting (CE-9).
        if isinstance(event, CompactionEnd) and event.error is not None and event.error.code == "compaction_stopped":
            task = asyncio.get_running_loop().create_task(self.record(public_error(event.error), context))
            self._recording.add(task)
            task.add_done_callback(self._recording.discard)
        elif isinstance(event, RunStart) and event.lane == MAIN_LANE and event.kind == "run":
            self._feed.publish(TurnActivity(conversation_id=self.id, running=True))
        elif isinstance(event, RunEnd) and event.lane == MAIN_LANE and event.result.kind == "run":
            result = event.result
            error_text = public_error(result.error).text if result.outcome == "failed" and result.error else None
            self._feed.publish(TurnActivity(conversation_id=self.id, running=False, outcome=result.outcome,
                                            error_text=error_text))
        elif isinstance(event, Fault):
            self._feed.publish(Alert(conversation_id=self.id, code=event.code, message=event.message))
        elif isinstance(event, ValueUpdate) and event.key == "session_name":
            # Every rename (the service's, a command's, a door naming its session) is this event.
            self.info = replace(self.info, name=event.value)

    async def dispose(self, context: Context) -> None:
        """Finish recording what is under way, then detach the harness (the conversation stays in
        the journal)."""
        self.settings.dispose()
        if self._recording:
            await asyncio.wait(list(self._recording))
        await self.harness.close(context)
        if self.delegation is not None:
            await self.delegation.close()
        self._feed.publish(Presence(conversation_id=self.id, live=False))

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def target(self) -> ExecutionTarget:
        """Where this conversation's tools run now (CE-19)."""
        return self.settings.target

    async def record(self, details: ChatEventDetails, context: Context) -> bool:
        """Record a chat event here (see `record_chat_event`)."""
        return await record_chat_event(self.harness, details, context)

    async def watch(self, context: Context) -> ConversationWatch:
        return ConversationWatch(LaneEvents.of_watch(await self.lane.watch(context), self.harness.session))


class ConversationService:
    """Conversations in `store`, each run with `setup` while live in this process."""

    def __init__(self, store: Store, setup: ConversationSetup | None = None) -> None:
        """Raises `InvalidInput` when `setup.agents` names a tool the conversations cannot have."""
        self.store = store
        self.setup = setup or ConversationSetup()
        if self.setup.agents is not None:
            per_conversation = self.setup.tools_for is not None or self.setup.projects_file is not None
            self.setup.agents.check_tools(None if per_conversation else [tool.name for tool in self.setup.tools])
        self._live: dict[str, Conversation] = {}
        self.feed = InstanceFeed()
        """Activity, presence and alerts of this service's conversations; no chat events (CE-26)."""

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
            raise Forbidden.of(conversation_id)
        return owner is None

    async def list(self, user: str, context: Context) -> list[ConversationInfo]:
        """`user`'s conversations, most recently updated first; three reads, however many
        sessions the store holds."""
        owners = await self.store.values_across(OWNER, context)
        names = await self.store.values_across(addresses.session_name(), context)
        infos = [ConversationInfo(id=info.id, owner=user, name=names.get(info.id), created_at=info.created_at,
                                  updated_at=info.updated_at)
                 for info in await self.store.list_sessions(context) if owners.get(info.id) == user]
        return sorted(infos, key=lambda i: i.updated_at, reverse=True)

    async def open(self, user: str, conversation_id: str, context: Context) -> Conversation:
        """`user`'s conversation, live in this process (the same object while it is)."""
        session = await self._owned(user, conversation_id, context)
        live = self._live.get(conversation_id)
        return live if live is not None else await self._attach(session, user, context)

    async def close(self, user: str, conversation_id: str, context: Context) -> None:
        """Dispose the live conversation: its harness detaches; nothing of it is lost, and `open`
        restores it from the journal. A live one's owner is known here, so its disposal (and the
        release of its claim) reads nothing from the store that could fail first."""
        live = self._live.get(conversation_id)
        if live is None:
            await self._owned(user, conversation_id, context)
            return
        if live.info.owner != user:
            raise Forbidden.of(conversation_id)
        del self._live[conversation_id]
        await live.dispose(context)

    async def record(self, user: str, conversation_id: str, details: ChatEventDetails, context: Context) -> bool:
        """Record a chat event on the conversation, live here or cold: a closed one is attached
        for the append, under its session lock (`SessionOwned` while another process holds it),
        and an operation a dead process left open gets the row as a pending write (CE-3, CE-10)."""
        async with self._settings_of(user, conversation_id, context) as settings:
            return await record_chat_event(settings.harness, details, context)

    async def rename(self, user: str, conversation_id: str, name: str | None, context: Context) -> bool:
        """Name the conversation (None clears it) and record the rename row, live or closed, unless
        nobody has spoken in it yet; the next restore reads both from the journal (CE-10, CE-13,
        CE-15). The result is `record_setting`'s."""
        async with self._settings_of(user, conversation_id, context) as settings:
            await settings.harness.set_session_name(name, context)
            return await settings.record_setting(Renamed(name=name), context)

    async def record_setting(self, user: str, conversation_id: str, details: ChatEventDetails,
                             context: Context) -> bool:
        """Record a setting change the door applied (e.g. a `DirectoryMoved` after `/cd`), live or
        cold: nothing for a setting kind while nobody has spoken in the conversation (True then),
        else as `record` (CE-10, CE-13)."""
        async with self._settings_of(user, conversation_id, context) as settings:
            return await settings.record_setting(details, context)

    async def select_mode(self, user: str, conversation_id: str, mode: WorkMode, context: Context) -> bool:
        """Switch the conversation to work mode `mode` (`build`: the tools it was configured with;
        `plan`: the read-only ones among them) and record `ModeSelected` at once, even before the
        first message (CE-13). The result is whether the row was accepted (CE-3)."""
        async with self._settings_of(user, conversation_id, context) as settings:
            return await settings.select_mode(mode, context)

    async def switch_model(self, user: str, conversation_id: str, model: ModelIdentity, context: Context, *,
                           wait_for_completion: bool = False,
                           acknowledge_after_s: float = MODEL_SWITCH_ACK_S) -> ModelSwitch:
        """Switch the conversation's model under its turn lock (CE-12).

        Live here: `ConversationSettings.switch_model` (immediate, or queued behind the running turn
        and acknowledged after `acknowledge_after_s`; `ModelSwitchRefused` for a superseded or
        closed wait). Cold: applied under the session lock and always recorded, or `LaneBusy`
        when a stopped process left a turn open, which nobody here would end (resume it first)."""
        session = await self._owned(user, conversation_id, context)
        live = self._live.get(conversation_id)
        if live is not None:
            return await live.settings.switch_model(model, context, wait_for_completion=wait_for_completion,
                                                    acknowledge_after_s=acknowledge_after_s)
        async with self._temporary_settings(session, user, context) as settings:
            if (operation := settings.lane.info().operation) is not None:
                raise LaneBusy(f"conversation {conversation_id} has a turn open; resume or abort it first",
                               lane=MAIN_LANE, operation_id=operation.id)
            async with settings.turn_lock:
                await settings.apply_model(model, context, always_record=True)
        return ModelSwitch(model=model, queued=False)

    def list_switchable_projects(self, user: str) -> Sequence[SwitchableProject]:
        """The projects `user` may switch a conversation to, read from `setup.projects_file` at
        each call (none without one): the one listing every door shows (CE-21). Raises
        `ProjectsFileInvalid` naming the line and field of a bad file."""
        return load_projects(self.setup.projects_file) if self.setup.projects_file is not None else []

    async def select_project_execution(self, user: str, conversation_id: str, execution_ref: str, context: Context,
                                       *, by: SwitchedBy = "user") -> DirectoryMoved:
        """Switch the conversation, live here or cold, to the listed project `execution_ref` names:
        its tools run in that project's directory from now on, and the selection is stored, so
        a reopened conversation runs there too (CE-19 to CE-21). The door's own directory is not
        touched.

        A person's switch (`by="user"`, every door) records a `DirectoryMoved` row with user
        wording (nothing while nobody has spoken, CE-13) and returns its details. `by="agent"` is
        the model's between-step path: the row, by the agent, is returned for the next request
        and not recorded. Raises `ProjectSwitchRefused`, before anything is stored, for an
        unknown ref, while a turn runs (not for the agent's path), while another lane of the
        conversation or a tracked background job of it still runs, or when the directory cannot
        be entered; `ProjectsFileInvalid` for a bad projects file; `SettingNotRecorded` when the
        switch applied but the store refused its row (CE-3)."""
        project = next((row for row in self.list_switchable_projects(user) if row.execution_ref == execution_ref),
                       None)
        if project is None:
            raise refuse_unknown(execution_ref)
        running = self.setup.running_jobs(conversation_id) if self.setup.running_jobs is not None else 0
        async with self._settings_of(user, conversation_id, context) as settings:
            return await switch_project(settings, project, by, running, context)

    async def send(self, user: str, conversation_id: str, text: str, context: Context, *,
                   images: Sequence[ImageContent] = ()) -> DriveOutcome:
        """Send a prompt and drive its turn (opening the conversation here if needed): admitted
        under the turn lock after any queued model switch, with a `ReasoningChanged` row above it
        when the reasoning level differs from the previous turn's (CE-14). Raises what
        `ConversationSettings.admit` and `Lane.drive` raise."""
        conversation, accepted = await self.admit(user, conversation_id, text, context, images=images)
        return await conversation.lane.drive(accepted.operation_id, context)

    async def admit(self, user: str, conversation_id: str, text: str, context: Context, *,
                    images: Sequence[ImageContent] = ()) -> tuple[Conversation, AcceptedRun]:
        """Admit a prompt as `send` does, without driving it: the live conversation and the
        accepted run, durable in phase `starting`, for a door that drives it in a task of its own
        (the HTTP server answers 202 at once). Raises what `ConversationSettings.admit` raises."""
        conversation = await self.open(user, conversation_id, context)
        return conversation, await conversation.settings.admit(text, images, context)

    async def run_command(self, user: str, conversation: Conversation, invocation: CommandInvocation | None,
                          run: Callable[[RecordNow], Awaitable[T]], outcome_of: Callable[[T], CommandOutcome | None],
                          context: Context) -> T:
        """Run one command on `user`'s live `conversation` and return what `run` returns (CE-16).

        With an `invocation` (the person typed it) one `CommandRan` row is recorded: after `run`
        returns, with `outcome_of(result)`; or, when `run` raises a `HarnessError`, with that
        error's exact message, and the error is raised on. `run` gets `record_now(outcome)` to
        record the row earlier, so it can sit above a turn the command starts or be durable before
        the command ends its conversation; the row is recorded once. Without an invocation (a
        program's call) nothing is recorded and `record_now` does nothing. `record_now` says
        whether the append was accepted (True when there is nothing to record); a refusal is
        logged, and the command's own effect stands. Other exceptions are not the caller's answer
        and are raised unrecorded. Raises `Forbidden` before anything runs."""
        if conversation.info.owner != user:
            raise Forbidden.of(conversation.id)
        recorded = False

        async def record_now(outcome: CommandOutcome | None) -> bool:
            nonlocal recorded
            if invocation is None or recorded:
                return True
            recorded = True
            return await conversation.record(command_ran(invocation, outcome), context)

        try:
            result = await run(record_now)
        except HarnessError as error:
            if invocation is not None and not recorded:
                recorded = True
                await conversation.record(command_failed(invocation, error), context)
            raise
        await record_now(outcome_of(result))
        return result

    async def end(self, user: str, conversation_id: str, context: Context) -> bool:
        """End the conversation: from now on it takes no new turn and no garden message
        (`ConversationEnded`); it can still be read, renamed and deleted. Live or cold, like
        `record`. True when this call ended it, False when it already was (nothing written then)."""
        async with self._settings_of(user, conversation_id, context) as settings:
            if await settings.harness.session.get(ENDED_AT, context) is not None:
                return False
            await settings.harness.set_value(ENDED_AT, now_ms(), context)
            return True

    async def is_open(self, user: str, conversation_id: str, context: Context) -> bool:
        """Whether `user`'s conversation takes turns and garden messages, i.e. was not ended.
        Raises `SessionNotFound` when there is no such conversation, `Forbidden` for another
        user's; reads only."""
        session = await self._owned(user, conversation_id, context)
        return await session.get(ENDED_AT, context) is None

    async def post_garden_message(self, user: str, conversation_id: str, message: GardenMessage,
                                  context: Context) -> str:
        """Append a garden's message (sender `garden`) to the conversation's main lane, live or
        cold like `record`, and return its entry id: the canonical record of what the garden said
        there (OM-4). Idempotent by `message.emission_id`: when the branch or the pending writes
        already hold a garden message of that emission, its id is returned and nothing is written,
        so a retried emission never appends twice. Never starts a turn (CE-3). Raises
        `ConversationEnded` for an ended conversation, `SessionOwned` while another process holds
        it, `SessionNotFound`, `Forbidden`; nothing was written then."""
        async with self._settings_of(user, conversation_id, context) as settings:
            harness = settings.harness
            await refuse_if_ended(harness.session, conversation_id, context)
            lane = harness.lane(MAIN_LANE)
            watch = await lane.watch(context)
            watch.close()
            placed = [(entry.id, entry.payload.message) for entry in watch.snapshot.transcript
                      if isinstance(entry.payload, CustomMessagePayload)]
            pending = [(write.entry_id, write.message) for write in watch.snapshot.pending_writes]
            for entry_id, sent in [*placed, *pending]:
                if (known := garden_message_of(sent)) is not None and known.emission_id == message.emission_id:
                    return entry_id
            return await lane.append_message(garden_message(message), context)

    async def record_local_shell(self, user: str, conversation_id: str, command: str, exit_code: int | None,
                                 output: str, context: Context) -> bool:
        """Record a shell command the person's terminal ran itself (`!cmd`) as one `ShellRan` row,
        its output cut to its end (`SHELL_OUTPUT_CHARS`); live or cold, like `record` (CE-17).
        Nothing is sent: the person's next message goes as typed, after this row."""
        return await self.record(user, conversation_id, shell_ran(command, exit_code, output), context)

    async def run_local_shell(self, user: str, conversation_id: str, command: str, cwd: Path,
                              context: Context) -> tuple[ShellRan, bool]:
        """`!cmd` for a door that runs it itself: `command` in `cwd` (stdin closed, stdout and
        stderr merged), then `record_local_shell`. Returns its row and whether it was recorded;
        the door shows the row itself when it was not (CE-17)."""
        process = await asyncio.create_subprocess_shell(command, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
        output, _ = await process.communicate()
        text = output.decode("utf-8", errors="replace")
        recorded = await self.record_local_shell(user, conversation_id, command, process.returncode, text, context)
        return shell_ran(command, process.returncode, text), recorded

    # -- display reads and images (CE-24) ----------------------------------------------------------

    async def read_display(self, user: str, conversation_id: str, context: Context, *, before: str | None = None,
                           limit: int = DISPLAY_PAGE) -> DisplayPage:
        """One page of the conversation's rows for a person's surface, newest page first (CE-24):
        the `limit` entries (at most `MAX_DISPLAY_PAGE`) of the main lane's branch before entry
        `before` (None: up to its tip), shaped by `display_rows` and listed oldest first. Pass the
        page's `next_before` for the older page. The only read that shows message blocks. Raises
        `Forbidden` for another user's conversation, `UnknownEntry` for a `before` not in it."""
        session = await self._owned(user, conversation_id, context)
        tip = await session.get(addresses.branch_tip(MAIN_LANE), context)
        if tip is None:
            return DisplayPage(rows=[], next_before=None)
        page = await session.read_branch(tip, context, before=before, limit=max(1, min(limit, MAX_DISPLAY_PAGE)))
        return DisplayPage(rows=display_rows(page.entries[::-1]), next_before=page.next_before)

    async def read_image(self, user: str, conversation_id: str, ref: str, context: Context) -> StoredImage:
        """The image `ref` of a block in `user`'s conversation, with its sniffed media type
        (CE-24). Served to the conversation's owner only: `Forbidden` for another user, and
        `ImageNotFound` when no entry of the conversation names the ref (another conversation's
        image included) or the image is gone. Reads the conversation's whole journal to check."""
        session = await self._owned(user, conversation_id, context)
        image = None
        if is_image_ref(ref) and ref in await referenced_images(session, context):
            image = await self.store.images.get(ref, context)
        if image is None:
            raise ImageNotFound(f"conversation {conversation_id} has no image {ref[:80]!r}",
                                conversation_id=conversation_id, ref=ref[:80])
        return image

    async def sweep_images(self, context: Context, *, older_than_s: float = IMAGE_SWEEP_GRACE_S) -> tuple[str, ...]:
        """Delete the images no session of the store names and that were last stored more than
        `older_than_s` seconds ago; return their refs (CE-24). Every image an entry or a pending
        entry of any session names is kept, whoever owns it. Reads every session's whole
        journal. An image stored again while the sweep runs is kept; a fork or an import made
        while it runs, of a session deleted meanwhile, may lose its pictures."""
        stored_by = now_ms() - int(older_than_s * 1000)
        unnamed = {ref for ref, stored_at in (await self.store.images.stored(context)).items()
                   if stored_at <= stored_by}
        for info in await self.store.list_sessions(context):
            if not unnamed:
                break
            try:
                session = await self.store.open_session(info.id, context)
            except SessionNotFound:
                continue  # deleted since the listing
            unnamed -= await referenced_images(session, context)
        return tuple([ref for ref in sorted(unnamed) if await self.store.images.delete(ref, stored_by, context)])

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
            raise Forbidden.of(conversation_id)
        return session

    @asynccontextmanager
    async def _settings_of(self, user: str, conversation_id: str, context: Context) -> AsyncIterator[
            ConversationSettings]:
        """The settings of the live conversation, or of a temporary attachment of a cold one."""
        session = await self._owned(user, conversation_id, context)
        live = self._live.get(conversation_id)
        if live is not None:
            yield live.settings
            return
        async with self._temporary_settings(session, user, context) as settings:
            yield settings

    @asynccontextmanager
    async def _temporary_settings(self, session: Session, user: str, context: Context
                                  ) -> AsyncIterator[ConversationSettings]:
        # Attaching takes the session lock (`SessionOwned` while another process holds it), so a
        # cold change is made under it, as CE-10 asks; the harness runs nothing and is closed after.
        target = await self._target(session, context)
        harness, _ = await AgentHarness.create(AgentHarnessOptions(
            session=session, models=self.setup.models, tools=self._tools(user, target, self._delegation())),
            context)
        try:
            yield await ConversationSettings.read(harness, target, context)
        finally:
            await harness.close(context)

    def _delegation(self) -> Delegation | None:
        agents = self.setup.agents
        return Delegation(agents, self.setup.system_prompt) if agents is not None else None

    async def _attach(self, session: Session, user: str, context: Context) -> Conversation:
        setup = self.setup
        target = await self._target(session, context)
        delegation = self._delegation()

        async def select(execution_ref: str, context: Context) -> DirectoryMoved:
            return await self.select_project_execution(user, session.id, execution_ref, context, by="agent")

        options = AgentHarnessOptions(
            session=session, models=setup.models, tools=self._tools(user, target, delegation),
            system_prompt=delegation.system_prompt if delegation is not None else setup.system_prompt,
            drive=setup.drive, listeners=setup.listeners, event_log_limit=setup.event_log_limit,
            hooks=conversation_hooks(setup.hooks, session, self.store.images,
                                     project_boundary(session, target, select)))
        harness, open_operations = await AgentHarness.create(options, context)
        if delegation is not None:
            try:
                await delegation.start(harness, context)
            except BaseException:
                await harness.close(context)
                raise
        info = ConversationInfo(id=session.id, owner=user, name=await _name(session, context),
                                created_at=session.info.created_at, updated_at=session.info.updated_at)
        settings = await ConversationSettings.read(harness, target, context)
        conversation = self._live[session.id] = Conversation(info, settings, open_operations, self.feed, delegation)
        return conversation

    async def _target(self, session: Session, context: Context) -> ExecutionTarget:
        return ExecutionTarget(session.id, await session.get(PROJECT_SELECTION, context), self.setup.directory)

    def _tools(self, user: str, target: ExecutionTarget, delegation: Delegation | None) -> Sequence[AgentTool]:
        """A conversation's tools: the shared ones, those made for where it runs, the model's
        `project` tool when projects are configured, and the delegation tools when agents are."""
        setup = self.setup
        tools = [*setup.tools, *(setup.tools_for(target) if setup.tools_for is not None else ())]
        if setup.projects_file is not None:
            tools.append(project_tool(lambda: self.list_switchable_projects(user), target))
        return [*tools, *(delegation.tools if delegation is not None else ())]


async def _name(session: Session, context: Context) -> str | None:
    name = await session.get(addresses.session_name(), context)
    return name


def conversation_hooks(hooks: RunHooks, session: SessionReader, images: ImageStore,
                       boundary: BetweenSteps | None = None) -> RunHooks:
    """`hooks` (the door's) with the conversation's own, for a harness on `session`: interrupted
    replies replayed before the door's transform (CE-8); tool results' blocks normalized into
    `images` after the door's `after_tool` (CE-22); the `boundary` between steps (the model's
    project switch, CE-19) before the door's; the reply's blocks appended at run end before the
    door's `before_run_end` (CE-23); and the turn-end rows placed in the terminal commit (CE-7,
    CE-9)."""
    door_transform, door_after_tool, door_run_end = hooks.transform_context, hooks.after_tool, hooks.before_run_end
    door_between = hooks.between_steps
    blocks_at_run_end = message_blocks_at_run_end(session)

    async def transform(messages: list[Message], context: Context) -> list[Message]:
        replayed = replay_interrupted_replies(messages)
        return await door_transform(replayed, context) if door_transform is not None else replayed

    async def after_tool(request: ToolCallRequest, output: ToolOutput, context: Context) -> ToolOutput:
        if door_after_tool is not None:
            output = await door_after_tool(request, output, context) or output
        return await normalize_tool_blocks(output, images, context)

    async def between_steps(lane: Lane, context: Context) -> Sequence[Message]:
        placed = list(await boundary(lane, context)) if boundary is not None else []
        return [*placed, *(await door_between(lane, context))] if door_between is not None else placed

    async def before_run_end(lane: Lane, context: Context) -> None:
        await blocks_at_run_end(lane, context)
        if door_run_end is not None:
            await door_run_end(lane, context)

    return replace(hooks, transform_context=transform, after_tool=after_tool, before_run_end=before_run_end,
                   between_steps=between_steps, settlement_messages=turn_end_rows)
