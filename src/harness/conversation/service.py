"""`ConversationService`: conversations over a store, each owned by one user, and the one door through
which a person's surface (the terminal chat, later the HTTP API) works with them.

A conversation is a session whose `main` lane talks to the person. Its turn lock is that lane being
idle, whichever process holds the session. Every call names the user and is checked against the
conversation's owner (`Forbidden`, nothing changed).
"""

from __future__ import annotations

import asyncio
import binascii
import logging
from base64 import b64decode
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from harness.context import Context
from harness.conversation.agents import AgentRegistry
from harness.conversation.always import allow_always, allowed_always
from harness.conversation.approvals import (
    APPROVALS_NAMESPACE,
    ApprovalAnswered,
    ApprovalChange,
    ApprovalDecision,
    ApprovalNotFound,
    PendingApproval,
    WaitingCalls,
    answered,
    journal_approval,
    pending_address,
)
from harness.conversation.blocks import (
    message_blocks_at_run_end,
    normalize_tool_blocks,
    referenced_images,
)
from harness.conversation.budgets import BUDGET, Budget, fallback_rows, over_budget, spent
from harness.conversation.chat_events import (
    ChatEventDetails,
    ChatEventView,
    CommandOutcome,
    DirectoryMoved,
    ErrorDetails,
    Renamed,
    ShellRan,
    chat_event_message,
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
from harness.conversation.garden_messages import GardenMessage, garden_message
from harness.conversation.lifecycle import ENDED_AT, refuse_if_ended
from harness.conversation.project_context import ProjectContextPrompt
from harness.conversation.project_switch import (
    ProjectSwitch,
    SwitchedBy,
    project_boundary,
    project_tool,
    refuse_unknown,
    switch_project,
)
from harness.conversation.projects import PROJECT_SELECTION, ExecutionTarget, SwitchableProject, load_projects
from harness.conversation.recording import (
    CONVERSATION_VALUES,
    MAIN_LANE,
    drive_failure_entry_id,
    record_chat_event,
)
from harness.conversation.settings import (
    MODEL_SWITCH_ACK_S,
    TOOLS_CHOSEN,
    ConversationSettings,
    ModelSwitch,
    ModelSwitchRefused,
    ModelTools,
    WorkMode,
    posted_switch_landed,
    same_model,
)
from harness.conversation.turn_rows import (
    clean_public_text,
    discards_turn,
    public_error,
    replay_interrupted_replies,
    turn_end_rows,
)
from harness.errors import HarnessError
from harness.messages import (
    ImageContent,
    Message,
    ModelIdentity,
    OutputSchema,
    ThinkingLevel,
    Usage,
    UserMessage,
    now_ms,
)
from harness.providers import ModelRegistry
from harness.runtime import (
    AbortRequest,
    AcceptedRun,
    AgentHarness,
    AgentHarnessOptions,
    AgentTool,
    Approval,
    ApprovalRequest,
    AskApproval,
    BetweenSteps,
    CompactionEnd,
    CurrentOperationInfo,
    DriveOutcome,
    DriveSettings,
    EntryAdded,
    Fault,
    HarnessClosed,
    HarnessEvent,
    Lane,
    LaneBusy,
    LaneEventPage,
    LaneExecutionInfo,
    LaneFollow,
    LaneInfo,
    LaneSnapshot,
    LaneWatch,
    Listener,
    NoActiveOperation,
    NothingToResume,
    OpenOperation,
    OperationIdTaken,
    OperationMismatch,
    PromptRequest,
    RunEnd,
    RunHooks,
    RunStart,
    SystemPrompt,
    ToolCallRequest,
    ToolOutput,
    ValueUpdate,
    follow_lane,
    read_lane_events,
)
from harness.runtime.event_log import DEFAULT_EVENT_LOG_LIMIT
from harness.runtime.requests import check_input_size
from harness.session import (
    AbortCause,
    AppendRequest,
    ApprovalAnswerRequest,
    ChangeFeed,
    CommandRequest,
    CustomMessagePayload,
    Entry,
    HolderRequest,
    ImageStore,
    LaneConfig,
    MessagePayload,
    OperationErrorRecord,
    QueueRequest,
    ReleaseRequest,
    Session,
    SessionMutator,
    SessionNotFound,
    SessionOwned,
    SessionReader,
    SettingRequest,
    StopRequest,
    StorageCorruption,
    Store,
    StoredImage,
    ValueAddress,
    addresses,
)
from harness.session.ids import new_id
from harness.session.images import image_ref, is_image_ref, sniff_image_type
from harness.session.records import CancelRequested

OWNER = addresses.value_address(CONVERSATION_VALUES.namespace, "owner", str)
"""The user id a conversation belongs to, written when it is created."""


T = TypeVar("T")

PostedRunner = Callable[["Conversation", CommandRequest | SettingRequest | ReleaseRequest, Context],
                       Coroutine[Any, Any, None]]
"""How a conversation runs a command another process posted for it (its service's); an approval
answer it takes itself, at once (`Conversation._answer_posted`)."""

class RecordNow:
    """`record_now(outcome)`: record a running command's row at once, or `record_now.admit_with(...)`
    it in the same commit as the turn the command starts (see `ConversationService.run_command`).
    The row is recorded once, whichever comes first; without an invocation (a program's call)
    there is none."""

    def __init__(self, conversation: Conversation, invocation: CommandInvocation | None, context: Context) -> None:
        self._conversation, self._invocation, self._context = conversation, invocation, context
        self.recorded = invocation is None

    async def __call__(self, outcome: CommandOutcome | None) -> bool:
        """Record the row with `outcome` now; whether the append was accepted (CE-3; True when
        there is nothing to record)."""
        if self.recorded or self._invocation is None:
            return True
        self.recorded = True
        return await self._conversation.record(command_ran(self._invocation, outcome), self._context)

    async def admit_with(self, outcome: CommandOutcome | None, text: str, *,
                         prompt_entry_id: str | None = None) -> AcceptedRun:
        """Admit a turn of `text` (its entry `prompt_entry_id` when given) with the command's row
        (with `outcome`) right above it, in one commit (`Conversation.admit_messages`): a refused
        admission leaves no row claiming the command succeeded, and `run_command` records the
        refusal instead (CE-16)."""
        rows = [] if self.recorded or self._invocation is None else [
            chat_event_message(command_ran(self._invocation, outcome))]
        accepted = await self._conversation.admit_messages(rows, text, self._context, prompt_entry_id=prompt_entry_id)
        self.recorded = True
        return accepted

    async def failed(self, error: HarnessError) -> None:
        """Record the command's failure with the exact text its caller is answered with, unless
        a row is already recorded."""
        if not self.recorded and self._invocation is not None:
            self.recorded = True
            await self._conversation.record(command_failed(self._invocation, error), self._context)


ANSWER_WAIT_S = 10.0
"""How long `ConversationService.answer_approval` waits for another process holding the
conversation to take a posted answer, to tell whether it was the first; after that it is
answered as posted."""

REQUEST_POLL_S = 1.0
"""How often a live conversation looks for requests other processes posted for it when nothing
wakes it sooner (SQLite has no notifications; PostgreSQL's wake it at once)."""

logger = logging.getLogger(__name__)

HOLDER_CHECK_S = 2.0
"""How often a model switch posted to another holder with `wait_for_completion` checks that a
holder still has the conversation (`switch_model`): a dead holder ends the wait within this."""

OWNERS_KEPT = 10_000
"""Conversations whose owner a service remembers, the most recently checked (`check_owner`)."""

IMAGE_SWEEP_GRACE_S = 3_600.0
"""How long an image stays after its latest store even when no entry names it: a tool result that
names it may not be committed yet (`ConversationService.sweep_images`)."""


class UnknownCommand(HarnessError):
    """A typed line names no command the door runs; nothing ran and nothing was recorded."""

    code = "unknown_command"


class BuiltInCommand(Protocol):
    """A typed command (`harness.conversation.commands`): `typed` True when a person typed it
    (its row is recorded, CE-16), False for a program's call."""

    async def __call__(self, service: ConversationService, user: str, conversation: Conversation, args: str | None,
                       context: Context, *, typed: bool = True) -> CommandOutcome: ...


def command_of(line: str, commands: Mapping[str, BuiltInCommand]) -> tuple[BuiltInCommand, str | None]:
    """The command a typed `/name args` line names in `commands`, and its arguments (None when
    none follow). Raises `UnknownCommand`."""
    name, _, args = line.strip().removeprefix("/").partition(" ")
    command = commands.get(name)
    if command is None:
        raise UnknownCommand(f"there is no command /{name}", name=name)
    return command, args.strip() or None


class PostedCommand(BaseModel):
    """A command left for the process that holds the conversation (`CommandRequest`): accepted,
    not run yet; its row (or its failure's) reaches watchers when the holder runs it."""

    model_config = ConfigDict(frozen=True)

    request_id: str


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
    live_tools: Mapping[str, AgentTool] = field(default_factory=dict)
    """Tools by name that join and leave while conversations run (the MCP servers' tools of
    `harness.tools.McpServers`), shared by every conversation, read at each step (the harness's
    `live_tools`); a lane offers them where its active tools name them or a pattern (`mcp__*`)
    matches them."""
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
    commands: Mapping[str, BuiltInCommand] = field(default_factory=dict)
    """The typed commands this service runs for requests other processes post for a
    conversation it holds (`ConversationService.command`); the doors give the built-in ones."""
    event_log_limit: int = DEFAULT_EVENT_LOG_LIMIT
    """How many durable events each lane's event log keeps after a settlement: a watcher that
    reconnects from an older event id gets a fresh snapshot instead (`AgentHarnessOptions`)."""
    project_context_bytes: int | None = None
    """How many bytes of the project's instruction files (`AGENTS.md`, else `CLAUDE.md`, from the
    project's root down to where the tools run) a turn reads into the `main` lane's system prompt,
    at most (`harness.conversation.project_context`; `PROJECT_CONTEXT_BYTES` is the doors'). None:
    no project context is read, and `/context` is refused."""
    model_tools: ModelTools | None = None
    """The tools a conversation has while nobody chose them, by its model: a switch from the tiny
    embedded model to a capable one gives them, and back takes them away; `/tools on` gives
    `default`. None: a switch keeps the tools, and `/tools on` and `auto` are refused."""
    on_approval: Callable[[ApprovalChange], None] | None = None
    """Told, synchronously with the run, when a call of a conversation live here starts waiting
    for approval and when it stops (`Conversation.ask_approval`; the server's streams show
    them); it must not block."""
    budget: Budget = field(default_factory=Budget)
    """The spending caps of every run here, besides each conversation's own (`set_budget`), the
    tighter of the two holding (`harness.conversation.budgets`, issue 32). A door's fallback
    models are `drive.fallback`."""
    agent_name: str = "harness"
    """The agent's name in its runs' OpenTelemetry spans (`invoke_agent {agent_name}`,
    `gen_ai.agent.name`): `Agent(name=...)`'s."""
    shell_environment: Callable[[], Mapping[str, str]] | None = None
    """The environment the person's own shell commands (`run_local_shell`: `!cmd`, a server's
    `POST .../shell`) run in, as the agent's `shell` tool does: the doors give their workspace's
    (`Workspace.environment`, without provider keys, tokens and secrets). None: this process's."""


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
    """A live conversation: the one door through which every surface (the terminal, `harness run`,
    the HTTP doors, the gardener, the workers) acts on it. Its harness, lanes and settings are
    private to this package, so no door can go around the turn lock, admission or the rows the
    conversation layer records. `info` follows its renames.

    Reads are of the `main` lane unless a `lane` is named (a session's other lanes: a delegated
    child's, or one a person opened with `--lane`)."""

    def __init__(self, info: ConversationInfo, settings: ConversationSettings, open_operations: list[OpenOperation],
                 feed: InstanceFeed, posts: ChangeFeed, delegation: Delegation | None = None,
                 run_posted: PostedRunner | None = None,
                 on_approval: Callable[[ApprovalChange], None] | None = None) -> None:
        self.info = info
        self._approvals = WaitingCalls(info.id, self._keep_approval, on_approval)
        self._run_posted = run_posted
        self._last_posted: asyncio.Task[object] | None = None
        self._harness = harness = settings.harness
        self.delegation = delegation
        """The conversation's sub-agents, when its setup has agents (CE-18)."""
        self._lane = harness.lane(MAIN_LANE)
        self.open_operations = open_operations
        """The operations a stopped process left open when this conversation was attached
        (inventory, not scheduling advice: HA-1, HA-5)."""
        self._settings = settings
        self._feed = feed
        self._recording: set[asyncio.Task[object]] = set()
        harness.add_listener(self._on_event)
        self._posted = posts.subscribe(info.id)  # woken by posts only, not by each of its own commits
        self._taking = True
        self._taker = asyncio.get_running_loop().create_task(self._take_posted())
        feed.publish(Presence(conversation_id=info.id, live=True))

    async def _take_posted(self) -> None:
        """Apply what other processes post for this conversation while it is live here: a row, a
        garden's message, a steer or a stop reaches it this way when this process holds it
        (`take_requests`), woken by the store's post feed (`Store.posts`) or every `REQUEST_POLL_S`."""
        context = Context({"conversation_id": self.id, "task": "posted requests"})
        try:
            while self._taking:
                try:
                    await self.take_requests(context)
                except HarnessClosed:
                    return
                except HarnessError as error:  # the store failing: the next look tries again
                    logger.warning("requests posted for conversation %s: %s", self.id, error)
                await self._posted.wait(REQUEST_POLL_S)
        finally:
            self._posted.close()

    async def _stop_taking(self) -> None:
        # No cancel: one landing inside a take, after a command's request was deleted and before
        # it was handed on, would lose the command. The wake-up ends the wait; a take under way
        # finishes.
        self._taking = False
        self._posted.wake()
        await asyncio.wait([self._taker])

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
        the journal). What other processes posted meanwhile is taken once more first, so nothing
        they were told was accepted is left for a next holder."""
        await self._stop_taking()
        try:
            await self.take_requests(context)
        except HarnessError as error:  # the store failing: what was posted waits for the next holder
            logger.warning("requests posted for conversation %s: %s", self.id, error)
        self._settings.dispose()
        if self._recording:
            await asyncio.wait(list(self._recording))
        await self._harness.close(context)
        if self.delegation is not None:
            await self.delegation.close()
        self._feed.publish(Presence(conversation_id=self.id, live=False))

    async def detach_now(self, context: Context) -> None:
        """Detach at once, as a crash would: drives stop where they are and settle nothing more
        here, while a write already on the session line (an abort request) still lands. What is
        open stays open in the journal for the next attachment to finish. For a door leaving in a
        hurry (the terminal's second Ctrl-C); `dispose` is the orderly way."""
        self._taking = False
        self._posted.wake()
        self._taker.cancel()
        self._settings.dispose()  # a model switch waiting for the turn will not apply
        await self._harness.close(context)

    # -- reads ------------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def broken(self) -> bool:
        """Whether this attachment can no longer be trusted: its harness faulted, or its store
        refused a commit (whose outcome it may not know). Detach it (`detach_now`) and attach
        again once the store works: the journal is the truth (issue 29)."""
        return self._harness.faulted or self._harness.persistence_failure is not None

    @property
    def target(self) -> ExecutionTarget:
        """Where this conversation's tools run now (CE-19)."""
        return self._settings.target

    @property
    def mode(self) -> WorkMode:
        """The work mode the conversation is in (CE-13)."""
        return self._settings.mode

    @property
    def waiting_model(self) -> ModelIdentity | None:
        """The model a queued switch will apply once the running turn ends; not active yet (CE-12)."""
        return self._settings.waiting_model

    @property
    def journal(self) -> SessionReader:
        """The conversation's journal, to read (entries, branches, values)."""
        return self._harness.session

    def config(self, lane: str = MAIN_LANE) -> LaneConfig:
        """The lane's configuration as it is now: model, reasoning level, active tools."""
        return self._harness.lane(lane).config

    def offered_tools(self, lane: str = MAIN_LANE) -> list[AgentTool]:
        """The tools the lane's next step would offer (its active tools, an MCP server's as
        present now), each with its `asks_first`."""
        return self._harness.offered_tools(lane)

    def tip_id(self, lane: str = MAIN_LANE) -> str | None:
        """The entry the lane continues from (None: an empty branch)."""
        return self._harness.lane(lane).tip_id

    def operation(self, lane: str = MAIN_LANE) -> CurrentOperationInfo | None:
        """The lane's current operation as this process knows it (None: idle); no read."""
        return self._harness.lane(lane).info().operation

    def lanes(self) -> list[LaneInfo]:
        """Every lane of the conversation's session: `main` and delegated children's."""
        return self._harness.lanes

    async def inspect(self, context: Context, *, lane: str = MAIN_LANE) -> LaneExecutionInfo:
        """The lane's execution, observed without a write (`Lane.inspect_execution`, HA-6)."""
        return await self._harness.lane(lane).inspect_execution(context)

    def listen(self, listener: Listener) -> None:
        """Call `listener` with every event of the conversation's lanes as it is delivered, after
        its commit (HA-12); for the lifetime of this attachment. A listener may not act on the
        conversation from inside the call."""
        self._harness.add_listener(listener)

    async def session_name(self, context: Context) -> str | None:
        return await self._harness.session_name(context)

    async def watch(self, context: Context, *, lane: str = MAIN_LANE) -> ConversationWatch:
        """The lane's snapshot, then every later event, chat-event rows typed (HA-7, CE-26)."""
        return ConversationWatch(await self.lane_events(context, lane=lane))

    async def lane_events(self, context: Context, *, lane: str = MAIN_LANE) -> LaneEvents:
        """The lane's snapshot and later harness events, untyped (`LaneEvents.of_watch`)."""
        return LaneEvents.of_watch(await self._harness.lane(lane).watch(context), self._harness.session)

    # -- turns ------------------------------------------------------------------------------------

    async def admit(self, text: str, context: Context, *, images: Sequence[ImageContent] = (),
                    lane: str = MAIN_LANE, output: OutputSchema | None = None,
                    output_retries: int = 2) -> AcceptedRun:
        """Admit a turn of `text` (and `images`), durable in phase `starting`, without driving it.

        On `main`: under the turn lock, after any queued model switch, with a `ReasoningChanged`
        row right above it when the level changed since the previous turn (CE-14). On another
        lane (a session's own, not the person's): accepted as it is. Raises `InvalidMessage` for
        an empty prompt, `ConversationEnded` once the conversation was ended, `LaneBusy` while an
        operation is open, `PromptTooLarge`, `InvalidInput` for an `output` that is not a JSON
        Schema; nothing was written then. `output` makes the turn's final answer JSON of that shape,
        validated, an answer that does not fit sent back up to `output_retries` times, then the run
        fails `output_invalid`; the answer that fits is an `OUTPUT_ENTRY_TYPE` entry (`output_of`,
        issue 32)."""
        if lane == MAIN_LANE:
            return await self._settings.admit(text, images, context, output=output, output_retries=output_retries)
        request = PromptRequest(text=text, images=images, output=output, output_retries=output_retries)
        return await self._admit_on_side_lane(request, lane, context)

    async def send(self, text: str, context: Context, *, images: Sequence[ImageContent] = ()) -> DriveOutcome:
        """Admit a turn of `text` on `main` (`admit`) and drive it to its end or wait."""
        accepted = await self.admit(text, context, images=images)
        return await self.drive(accepted.operation_id, context)

    async def admit_messages(self, messages: Sequence[Message], text: str, context: Context, *,
                             prompt_entry_id: str | None = None) -> AcceptedRun:
        """Admit a turn on `main` as `admit` does, with `messages` (rows the model reads, e.g. the
        command row of `/goal`) accepted in the same commit right above the prompt: either all of
        them land with the turn or, when admission is refused, none does (CE-16). The prompt's
        entry id is `prompt_entry_id` when given."""
        return await self._settings.admit(text, (), context, above=messages, prompt_entry_id=prompt_entry_id)

    async def admit_next_run(self, context: Context, *, lane: str = MAIN_LANE) -> AcceptedRun:
        """Admit a turn of the messages kept for the next run (typed while a compaction or
        navigation ran), under the turn lock on `main`. Raises `InvalidMessage` when none is
        kept, `ConversationEnded`, `LaneBusy`."""
        if lane == MAIN_LANE:
            return await self._settings.admit_next_run(context)
        return await self._admit_on_side_lane(PromptRequest(), lane, context)

    async def _admit_on_side_lane(self, request: PromptRequest, lane: str, context: Context) -> AcceptedRun:
        # A session's own lane has no person to tell: accepted as it is, unless the conversation ended.
        await refuse_if_ended(self._harness.session, self.id, context)
        return await self._harness.lane(lane).accept(request, context)

    async def drive(self, operation_id: str, context: Context, *, lane: str = MAIN_LANE,
                    wait_for_retry: bool = True, poll_deferred: bool = False) -> DriveOutcome:
        """Drive the lane's operation `operation_id` until it settles or waits (`Lane.drive`).

        A drive that raises after admission (a door's hook failing, a damaged journal; not a
        closed harness, nor a fenced call that changed nothing) leaves one error row on `main`
        with the cleaned text every reader shows, however many drives of the run fail (CE-9); a
        store refusing writes leaves none, the one live-only error."""
        try:
            return await self._harness.lane(lane).drive(operation_id, context, wait_for_retry=wait_for_retry,
                                                         poll_deferred=poll_deferred)
        except (HarnessClosed, OperationMismatch):
            raise
        except HarnessError as error:
            if lane == MAIN_LANE:
                await self._record_drive_failure(operation_id, error, context)
            raise

    async def resume(self, context: Context, *, lane: str = MAIN_LANE) -> DriveOutcome:
        """Finish the lane's open operation, e.g. one a stopped process left, as `drive` does
        (`Lane.resume`). Raises `NothingToResume` when none is open."""
        operation = self._harness.lane(lane).info().operation
        if operation is None:
            raise NothingToResume(f"lane {lane} has no operation to resume", lane=lane)
        return await self.drive(operation.id, context, lane=lane, poll_deferred=True)

    async def _record_drive_failure(self, operation_id: str, error: HarnessError, context: Context) -> None:
        # The row's id is the run's: a drive failing again (each resume) finds it there.
        logger.warning("run %s of conversation %s failed to drive: %s [%s]", operation_id, self.id,
                       error.message, error.code)
        details = public_error(OperationErrorRecord(code=error.code, message=error.message))
        await record_chat_event(self._harness, details, context, entry_id=drive_failure_entry_id(operation_id))

    async def pause_drive(self, context: Context, *, lane: str = MAIN_LANE) -> bool:
        """Stop this process's drive of the lane at its next safe point, leaving the operation open
        for whoever drives it next (`Lane.pause_drive`); a worker handing work back."""
        return await self._harness.lane(lane).pause_drive(context)

    async def steer(self, message: Message, context: Context, *, lane: str = MAIN_LANE) -> str:
        """Queue `message` for the running turn, read after its current tool calls (HA-18);
        returns its entry id. Raises `NoActiveOperation` when nothing runs, `NotARun` during a
        compaction or navigation."""
        return await self._harness.lane(lane).steer(message, context)

    async def follow_up(self, message: Message, context: Context, *, lane: str = MAIN_LANE) -> str:
        """Queue `message` for when the running turn would end; returns its entry id. Raises as `steer`."""
        return await self._harness.lane(lane).follow_up(message, context)

    async def queue_next_run(self, message: Message, context: Context, *, lane: str = MAIN_LANE) -> str:
        """Keep `message` for the next admitted turn (a compaction or navigation runs now)."""
        return await self._harness.lane(lane).queue_next_run(message, context)

    async def stop(self, context: Context, *, lane: str = MAIN_LANE, operation_id: str | None = None,
                   cause: AbortCause = "user") -> AbortRequest:
        """Stop the lane's open operation durably: it settles `aborted` at its next safe point with
        every open tool call answered (CE-7). A person's stop (`cause="user"`) that lands while a
        tool call runs is recorded as `user_during_tool`. Raises `NoActiveOperation` when nothing
        runs, or when `operation_id` is given and is not the open one; nothing is written then."""
        handle = self._harness.lane(lane)
        current = handle.info().operation
        if current is None or (operation_id is not None and current.id != operation_id):
            what = f"no run {operation_id} open" if operation_id is not None else "nothing running"
            raise NoActiveOperation(f"conversation {self.id} has {what}", lane=lane)
        return await handle.request_abort(cause, context, during_tool="user_during_tool" if cause == "user" else None)

    async def take_requests(self, context: Context) -> int:
        """Apply what other processes posted for this conversation's lanes (`Session.post_request`):
        steer, follow-up, stop, rows to append, and commands, each run in a task of its own (as
        the holder's service runs them); returns how many were taken (`Lane.take_requests`)."""
        # One read finds the lanes anything was posted for: a conversation keeps a lane per
        # delegated job, and the taker looks every second.
        unreadable: list[str] = []
        posted = await self._harness.session.scan_records(addresses.lane_request(""), context,
                                                          undecodable=lambda key, _: unreadable.append(key))
        wanted = {record.value.lane for _, record in posted} | ({MAIN_LANE} if unreadable else set())
        on_command = self._on_posted_command if self._run_posted is not None else None
        return sum([await self._harness.lane(info.name).take_requests(context, on_command=on_command)
                    for info in self._harness.lanes if info.name in wanted])

    def _on_posted_command(self, request: HolderRequest) -> None:
        if isinstance(request, ApprovalAnswerRequest):
            # At once, not behind the commands posted before it: one of those (a model switch)
            # may be waiting for this very turn to end.
            self._answer_posted(request)
            return
        run_posted = self._run_posted
        assert run_posted is not None
        context = Context({"conversation_id": self.id, "task": "posted command"})
        before = self._last_posted

        async def in_order() -> None:  # one after another, as the person sent them
            if before is not None:
                await asyncio.wait([before])
            await run_posted(self, request, context)

        task: asyncio.Task[object] = asyncio.get_running_loop().create_task(in_order())
        self._last_posted = task
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def navigate(self, target_entry_id: str | None, context: Context, *, lane: str = MAIN_LANE) -> DriveOutcome:
        """Move the lane's tip back to `target_entry_id` (None: the start), as a navigation."""
        return await self._harness.lane(lane).navigate(target_entry_id, context)

    async def copy_into(self, store: Store, context: Context, *, lane: str = MAIN_LANE) -> str:
        """Write this conversation into `store` under the same id and return it: lane `lane` on its
        configuration, its branch up to the tip (command and mode rows recorded before anyone
        spoke included), the name and the conversation's own values (owner, project, modes). For
        a draft kept in a memory store until it is worth keeping (the terminal's new chat). Raises
        what `Store.create_session` raises for an id `store` already has; nothing is written then."""
        journal, handle = self._harness.session, self._harness.lane(lane)
        name = await self._harness.session_name(context)
        tip = handle.tip_id
        rows = [] if tip is None else (await journal.read_branch(tip, context)).entries
        values = await journal.scan_values(CONVERSATION_VALUES, context)
        session = await store.create_session(context, session_id=self.id)
        await session.create_lane(lane, handle.config, context)

        async def keep(m: SessionMutator) -> None:
            if name is not None:
                m.set(addresses.session_name(), name)
            for key, value in values:
                m.set(addresses.value_address(CONVERSATION_VALUES.namespace, key), value)
            for entry in reversed(rows):
                m.insert_entry(entry.payload, parent_id=entry.parent_id, entry_id=entry.id)
            if rows:
                m.set(addresses.branch_tip(lane), tip)

        await session.mutate(keep, context)
        return session.id

    async def ensure_lane(self, lane: str, config: LaneConfig, context: Context) -> None:
        """Create lane `lane` on `config` unless the session has it (a person's own side lane)."""
        if lane not in {info.name for info in self._harness.lanes}:
            await self._harness.create_lane(lane, config, context)

    # -- settings ---------------------------------------------------------------------------------

    async def switch_model(self, model: ModelIdentity, context: Context, *, wait_for_completion: bool = False,
                           acknowledge_after_s: float = MODEL_SWITCH_ACK_S, recorded_by_command: bool = False,
                           lane: str = MAIN_LANE) -> ModelSwitch:
        """Switch the model under the turn lock, queued behind a running turn (CE-12): the one
        implementation every door uses (`ConversationSettings.switch_model`). Another lane (a
        session's own) is configured at once, with no row: it has no person to tell."""
        if lane == MAIN_LANE:
            return await self._settings.switch_model(model, context, wait_for_completion=wait_for_completion,
                                                     acknowledge_after_s=acknowledge_after_s,
                                                     recorded_by_command=recorded_by_command)
        self._settings.check_model(model)
        await self._harness.lane(lane).set_model(model, context)
        return ModelSwitch(model=model, queued=False)

    async def configured_tools(self, context: Context) -> list[str]:
        """The conversation's tools (in plan mode those build mode gives back, of which the lane
        offers the read-only ones)."""
        return await self._settings.configured_tools(context)

    async def choose_tools(self, tools: Sequence[str] | None, context: Context) -> list[str]:
        """Make `tools` the conversation's tools, which a model switch keeps (None: they follow
        the model again); no row (`ConversationSettings.choose_tools`: a typed `/tools` records
        its command's). Returns the conversation's tools."""
        return await self._settings.choose_tools(tools, context)

    async def set_thinking_level(self, level: ThinkingLevel, context: Context, *, lane: str = MAIN_LANE) -> None:
        """The lane's reasoning level from its next step on; on `main` announced as a row at the
        next turn's admission, against the previous turn's level (CE-14)."""
        await self._harness.lane(lane).set_thinking_level(level, context)

    async def set_value(self, address: ValueAddress[T], value: T | None, context: Context) -> None:
        """Set (None: delete) a session value a door keeps of its own in the conversation (e.g.
        the LangGraph door's thread metadata); the model never reads it."""
        await self._harness.set_value(address, value, context)

    async def record(self, details: ChatEventDetails, context: Context) -> bool:
        """Record a chat event here (see `record_chat_event`)."""
        return await record_chat_event(self._harness, details, context)

    async def allowed_always(self, context: Context) -> tuple[str, ...]:
        """The permission rules the person allowed "always" here, oldest first (issue 30)."""
        return await allowed_always(self._harness.session, context)

    async def allow_always(self, rule: str, context: Context) -> bool:
        """Keep the permission rule `rule` (a tool's name) as allowed "always" here: a row the
        model reads, and a rule that survives a restart (`always.allow_always`, issue 30)."""
        return await allow_always(self._harness, rule, context)

    # -- approvals (issue 30) ----------------------------------------------------------------------

    async def ask_approval(self, request: ApprovalRequest, context: Context, *,
                           here: AskApproval | None = None) -> Approval:
        """Wait for the first answer to tool call `request` of a run of this conversation, from
        anywhere: `here` (the door's own asker, e.g. the terminal's prompt, dismissed when another
        answer comes first), an answer given here (`answer_approval`, the server's route), or
        one another process posted (`ConversationService.answer_approval`); a stop of the run
        refuses it. Meanwhile the call is listed in the journal (`journal_pending`), and after it
        with its answer (`ApprovalDecision`), so every process can list and answer it."""
        return await self._approvals.ask(request, context, here)

    def pending_approvals(self) -> list[PendingApproval]:
        """The calls waiting for approval here, oldest first."""
        return self._approvals.pending()

    def answer_approval(self, tool_call_id: str, answer: Approval, by: str) -> PendingApproval:
        """Answer the call `tool_call_id` waiting here, as `by` (a user); its run goes on at once.
        Raises `ApprovalAnswered` (the first answer wins; a stopped run's calls were refused) and
        `ApprovalNotFound`; nothing changed then."""
        return self._approvals.answer(tool_call_id, answer, by)

    def approval_decision(self, tool_call_id: str) -> ApprovalDecision | None:
        """How call `tool_call_id` was answered while live here (who, what), if it was."""
        return self._approvals.decided(tool_call_id)

    def _answer_posted(self, request: ApprovalAnswerRequest) -> None:
        answer = Approval(allow=request.allow, for_session=request.for_session, reason=request.reason)
        try:
            self._approvals.answer(request.tool_call_id, answer, request.user, answer_id=request.answer_id)
        except (ApprovalNotFound, ApprovalAnswered) as error:  # the poster reads the journal's copy
            logger.info("approval answer posted for conversation %s dropped: %s", self.id, error.message)

    async def _keep_approval(self, pending: PendingApproval) -> None:
        # A context of its own: the run's is cancelled when it is stopped, and the answer must be kept then too.
        context = Context({"conversation_id": self.id, "task": "pending approval"})
        await self._harness.set_value(pending_address(pending.tool_call_id), pending, context)

    @asynccontextmanager
    async def _between_turns(self, context: Context) -> AsyncIterator[ConversationSettings]:
        """The settings, under the turn lock with no turn running: a change made here lands
        between two turns. Raises `LaneBusy` while a turn runs (nothing changed)."""
        async with self._settings.turn_lock:
            if (operation := self.operation()) is not None and operation.status != "open":
                raise LaneBusy(f"conversation {self.id} has a turn running; this waits for it to end",
                               lane=MAIN_LANE, operation_id=operation.id)
            yield self._settings


class ConversationService:
    """Conversations in `store`, each run with `setup` while live in this process."""

    def __init__(self, store: Store, setup: ConversationSetup | None = None) -> None:
        """Raises `InvalidInput` when `setup.agents` names a tool the conversations cannot have."""
        self.store = store
        # A door that follows a conversation another process holds wakes for its approvals alone.
        store.tag(APPROVALS_NAMESPACE)
        self.setup = setup or ConversationSetup()
        if self.setup.agents is not None:
            per_conversation = self.setup.tools_for is not None or self.setup.projects_file is not None
            self.setup.agents.check_tools(None if per_conversation else [tool.name for tool in self.setup.tools])
        self._live: dict[str, Conversation] = {}
        self._owners: dict[str, str] = {}  # by conversation id, the newest checked last (`check_owner`)
        self.on_release_request: Callable[[str], None] | None = None
        """Told (by conversation id, without awaiting) when another process asks to attach a
        conversation held here (`ReleaseRequest`): a server that holds conversations only while
        in use lets go of an idle one (`harness.server.Holds`); None keeps it (issue 29)."""
        self.feed = InstanceFeed()
        """Activity, presence and alerts of this service's conversations; no chat events (CE-26)."""

    # -- conversations ----------------------------------------------------------------------------

    async def create(self, user: str, config: LaneConfig, context: Context, *, name: str | None = None,
                     tools_chosen: bool = False) -> Conversation:
        """A new conversation of `user`, live in this process, its `main` lane on `config`; with
        `tools_chosen` its tools are the person's choice (a door's `--tools`, `--no-tools`), which
        a model switch keeps, else they follow the model (`ConversationSetup.model_tools`)."""
        session = await self.store.create_session(context)

        async def own(m: SessionMutator) -> None:
            m.set(OWNER, user)
            if name is not None:
                m.set(addresses.session_name(), name)
            if tools_chosen:
                m.set(TOOLS_CHOSEN, True)

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

    async def info(self, user: str, conversation_id: str, context: Context) -> ConversationInfo:
        """`user`'s conversation as `list` shows it, read alone: its row and its name, after the
        owner check (`check_owner`), not the whole list. Raises `SessionNotFound`, `Forbidden`
        for another user's."""
        await self.check_owner(user, conversation_id, context)
        stored = await self.store.session_info(conversation_id, context)
        session = await self.store.open_session(conversation_id, context)
        name = await session.get(addresses.session_name(), context)
        return ConversationInfo(id=conversation_id, owner=user, name=name, created_at=stored.created_at,
                                updated_at=stored.updated_at)

    async def list(self, user: str, context: Context) -> list[ConversationInfo]:
        """`user`'s conversations, most recently updated first; three reads, however many
        sessions the store holds. A session whose owner or name no longer decodes is logged and
        left out (its owner) or listed nameless (its name): one damaged session of any user does
        not take every user's list down (issue 29)."""

        def damaged(session_id: str, error: StorageCorruption) -> None:
            logger.warning("conversation list: %s [%s]", error.message, error.code,
                           extra={"conversation_id": session_id})

        owners = await self.store.values_across(OWNER, context, undecodable=damaged)
        names = await self.store.values_across(addresses.session_name(), context, undecodable=damaged)
        infos = [ConversationInfo(id=info.id, owner=user, name=names.get(info.id), created_at=info.created_at,
                                  updated_at=info.updated_at)
                 for info in await self.store.list_sessions(context) if owners.get(info.id) == user]
        return sorted(infos, key=lambda i: i.updated_at, reverse=True)

    def live(self, conversation_id: str) -> Conversation | None:
        """The conversation if it is live in this process (no read, no check of its owner)."""
        return self._live.get(conversation_id)

    def running(self, operation_id: str) -> Conversation | None:
        """The conversation live here one of whose lanes has `operation_id` open (no read): a
        door's approval policy finds a call's conversation this way."""
        for conversation in self._live.values():
            for lane in conversation._harness.lanes:
                if lane.operation is not None and lane.operation.id == operation_id:
                    return conversation
        return None

    async def answer_approval(self, user: str, conversation_id: str, tool_call_id: str, answer: Approval,
                              context: Context) -> tuple[PendingApproval, bool]:
        """Answer the call `tool_call_id` waiting for approval in `user`'s conversation, wherever
        it waits, and return it and whether the answer is only posted yet (issue 30). Live here:
        answered at once. Held by another process (a worker, a chat, another server): posted to
        it (`ApprovalAnswerRequest`), then followed in the journal for up to `ANSWER_WAIT_S` until
        the holder took an answer: this one (answered), or another first (`ApprovalAnswered`);
        still untaken after that, posted. Raises `ApprovalAnswered` when the call was answered
        first or refused by its run's stop, `ApprovalNotFound` when no such call waits, and
        `Forbidden`; nothing changed then."""
        session = await self._owned(user, conversation_id, context)
        if (live := self._live.get(conversation_id)) is not None:
            return live.answer_approval(tool_call_id, answer, user), False
        kept = await session.get(pending_address(tool_call_id), context)
        if kept is not None and kept.decided is not None:  # also once its run has ended
            raise answered(tool_call_id, kept.decided)
        if kept is None or await journal_approval(session, tool_call_id, context) is None:
            raise ApprovalNotFound(f"no call {tool_call_id[:80]!r} waits for approval in this conversation",
                                   tool_call_id=tool_call_id[:80])
        waiting, answer_id = kept, new_id()
        changed = self.store.changes.subscribe(conversation_id)
        try:
            await session.post_request(ApprovalAnswerRequest(
                lane=MAIN_LANE, user=user, tool_call_id=tool_call_id, allow=answer.allow,
                for_session=answer.for_session, reason=answer.reason, answer_id=answer_id, requested_at=now_ms()),
                context)
            deadline = asyncio.get_running_loop().time() + ANSWER_WAIT_S
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                # Read whether or not the run is still open: it may end right after the answer.
                kept = await session.get(pending_address(tool_call_id), context)
                if kept is None or kept.operation_id != waiting.operation_id or kept.decided is not None:
                    break
                await changed.wait(min(left, REQUEST_POLL_S / 4))
        finally:
            changed.close()
        decided = kept.decided if kept is not None and kept.operation_id == waiting.operation_id else None
        if decided is not None and decided.answer_id != answer_id:
            raise answered(tool_call_id, decided)
        return waiting, decided is None

    @property
    def live_ids(self) -> tuple[str, ...]:
        """The ids of the conversations live in this process."""
        return tuple(self._live)

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

    async def drop(self, conversation_id: str, context: Context) -> None:
        """Detach a live conversation at once, as a crash would (`Conversation.detach_now`): for
        one that is `broken`, whose store failed under it. What is open stays open in the
        journal for the next attachment; a store still failing meanwhile is logged (a claim it
        cannot release dies with its connection or lock)."""
        live = self._live.pop(conversation_id, None)
        if live is None:
            return
        try:
            await live.detach_now(context)
        except HarnessError as error:
            logger.warning("conversation %s detached without its store: %s [%s]", conversation_id, error.message,
                           error.code)
        self.feed.publish(Presence(conversation_id=conversation_id, live=False))

    async def record(self, user: str, conversation_id: str, details: ChatEventDetails, context: Context) -> bool:
        """Record a chat event on the conversation wherever it is held: live here; cold, attached
        for the append under its session lock, an operation a dead process left open getting the
        row as a pending write (CE-3, CE-10); held by another process (a chat, a server, a
        worker), posted to that holder, which appends it at its next step boundary (True then:
        the row is durably queued)."""
        session = await self._owned(user, conversation_id, context)
        async with self._settings_or_none(session, user, context) as settings:
            if settings is not None:
                return await record_chat_event(settings.harness, details, context)
        await self._post_append(session, user, chat_event_message(details), context)
        return True

    async def budget(self, user: str, conversation_id: str, context: Context) -> Budget:
        """The conversation's own spending caps (`set_budget`; none set: no cap)."""
        session = await self._owned(user, conversation_id, context)
        return await session.get(BUDGET, context) or Budget()

    async def set_budget(self, user: str, conversation_id: str, budget: Budget, context: Context) -> None:
        """Keep `budget` as the conversation's own spending caps, durably: every process that drives
        it checks them (with its door's, the tighter holding) at each step boundary, the running run
        included; a run they stopped is not resumed, the next one goes on when they allow it
        (issue 32). Raises `SessionOwned` while another process holds the conversation."""
        async with self._settings_of(user, conversation_id, context) as settings:
            await settings.harness.set_value(BUDGET, budget, context)

    async def rename(self, user: str, conversation_id: str, name: str | None, context: Context) -> bool:
        """Name the conversation (None clears it) and record the rename row, live or closed, unless
        nobody has spoken in it yet; the next restore reads both from the journal (CE-10, CE-13,
        CE-15). The result is `record_setting`'s. Held by another process: posted to it
        (`SettingRequest`), which renames as its own door would; True then (durably queued)."""
        session = await self._owned(user, conversation_id, context)
        async with self._settings_or_none(session, user, context) as settings:
            if settings is not None:
                return await _rename(settings, name, context)
        await self._post_setting(session, user, "name", name, context)
        return True

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
        first message (CE-13). The result is whether the row was accepted (CE-3). Held by another
        process: posted to it (`SettingRequest`) as `rename` is; True then."""
        session = await self._owned(user, conversation_id, context)
        async with self._settings_or_none(session, user, context) as settings:
            if settings is not None:
                return await settings.select_mode(mode, context)
        await self._post_setting(session, user, "mode", mode, context)
        return True

    async def switch_model(self, user: str, conversation_id: str, model: ModelIdentity, context: Context, *,
                           wait_for_completion: bool = False,
                           acknowledge_after_s: float = MODEL_SWITCH_ACK_S) -> ModelSwitch:
        """Switch the conversation's model under its turn lock (CE-12).

        Live here: `Conversation.switch_model` (immediate, or queued behind the running turn
        and acknowledged after `acknowledge_after_s`; `ModelSwitchRefused` for a superseded or
        closed wait). Cold: applied under the session lock and always recorded; an operation a
        stopped process left open takes the new model when it is resumed. Held by another
        process: posted to it (`SettingRequest`) and acknowledged `queued`: the holder switches as
        it would for its own door, its row says when, and a failure is a model-switch-failed
        error row; with
        `wait_for_completion`, answered once the lane's model is set, following the journal
        (`posted_switch_landed`: `ModelSwitchRefused` when another pick lands first or the holder
        records the switch's failure, and `holder_stopped` within `HOLDER_CHECK_S` once no
        process holds the conversation and the switch did not apply)."""
        session = await self._owned(user, conversation_id, context)
        live = self._live.get(conversation_id)
        if live is not None:
            return await live.switch_model(model, context, wait_for_completion=wait_for_completion,
                                           acknowledge_after_s=acknowledge_after_s)
        async with self._settings_or_none(session, user, context) as settings:
            if settings is not None:
                async with settings.turn_lock:
                    tools = await settings.apply_model(model, context, always_record=True)
                return ModelSwitch(model=model, queued=False, tools=tools)
        request = SettingRequest(lane=MAIN_LANE, user=user, setting="model", value=model.spec, requested_at=now_ms())
        if not wait_for_completion:
            await session.post_request(request, context)
            return ModelSwitch(model=model, queued=True)
        follow = await follow_lane(self.store, conversation_id, MAIN_LANE, context)  # before: no event missed
        try:
            await session.post_request(request, context)
            await self._posted_switch_lands(session, follow, model, context)
        finally:
            follow.close()
        return ModelSwitch(model=model, queued=False)

    async def _posted_switch_lands(self, session: Session, events: AsyncIterable[HarnessEvent], model: ModelIdentity,
                                   context: Context) -> None:
        """Wait for a switch to `model` posted to the conversation's holder to land
        (`posted_switch_landed`), for as long as a holder has the conversation: every
        `HOLDER_CHECK_S` the session's lock says whether one still does (`Session.held`, which
        takes nothing: a process attaching it meanwhile is not refused). Once none does (it
        stopped, or let go of it), the lane's model as stored says whether the switch applied; if
        not, it is `ModelSwitchRefused` (`holder_stopped`), so a caller never waits for a dead
        holder."""
        landed = asyncio.ensure_future(posted_switch_landed(events, model))
        try:
            while not (await asyncio.wait({landed}, timeout=HOLDER_CHECK_S))[0]:
                # Held here (this process's taker applies it) or elsewhere: wait on.
                if session.id in self._live or await session.held(context):
                    continue
                config = await session.get(addresses.lane_config(MAIN_LANE), context)
                if config is not None and same_model(config.model, model):
                    return
                raise ModelSwitchRefused(
                    f"the switch to {model.spec} did not apply: the process holding the conversation let go of it "
                    "first (it stopped); the switch may still be posted for its next holder, so read the "
                    "conversation's model before picking again", reason="holder_stopped", provider=model.provider,
                    model_id=model.model_id)
            landed.result()
        finally:
            landed.cancel()

    def list_switchable_projects(self, user: str) -> Sequence[SwitchableProject]:
        """The projects `user` may switch a conversation to, read from `setup.projects_file` at
        each call (none without one): the one listing every door shows (CE-21). Raises
        `ProjectsFileInvalid` naming the line and field of a bad file."""
        return load_projects(self.setup.projects_file) if self.setup.projects_file is not None else []

    async def select_project_execution(self, user: str, conversation_id: str, execution_ref: str, context: Context,
                                       *, by: SwitchedBy = "user") -> ProjectSwitch:
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
        switch applied but the store refused its row (CE-3).

        A person's switch of a conversation another process holds is posted to it
        (`SettingRequest`) and answered `queued`: the holder makes it as its own door would, and
        records a refusal as an error row with its text."""
        project = self._project(user, execution_ref)
        session = await self._owned(user, conversation_id, context)
        async with self._settings_or_none(session, user, context) as settings:
            if settings is not None:
                return ProjectSwitch(row=await self._switch_project(settings, project, by, context))
        if by == "agent":  # the model's path runs in the process that drives it, which holds it
            raise SessionOwned(f"conversation {conversation_id} is held by another process", session_id=conversation_id)
        await self._post_setting(session, user, "project", execution_ref, context)
        return ProjectSwitch(row=DirectoryMoved(path=project.path, by=by, project=project.slug), queued=True)

    def _project(self, user: str, execution_ref: str) -> SwitchableProject:
        project = next((row for row in self.list_switchable_projects(user) if row.execution_ref == execution_ref),
                       None)
        if project is None:
            raise refuse_unknown(execution_ref)
        return project

    async def _switch_project(self, settings: ConversationSettings, project: SwitchableProject, by: SwitchedBy,
                              context: Context) -> DirectoryMoved:
        conversation_id = settings.harness.session.id
        running = self.setup.running_jobs(conversation_id) if self.setup.running_jobs is not None else 0
        return await switch_project(settings, project, by, running, context)

    # -- acts from any process: live here, or posted to the process that holds the conversation ---

    async def queue(self, user: str, conversation_id: str, kind: Literal["steer", "follow_up"], message: Message,
                    context: Context) -> tuple[str | None, str | None]:
        """Steer or follow up the conversation's open run wherever it is driven; returns
        `(entry_id, request_id)`. Live here: queued at once (`Conversation.steer`,
        `follow_up`), its entry id. Otherwise posted for whoever drives the run (`QueueRequest`),
        the request's id: the holder queues it at its next look, or the next run takes it if this
        one ended meanwhile. Raises `NoActiveOperation` when nothing runs, `Forbidden`."""
        session = await self._owned(user, conversation_id, context)
        if (live := self._live.get(conversation_id)) is not None:
            queued = live.steer if kind == "steer" else live.follow_up
            return await queued(message, context), None
        operation_id = await _open_run(session, context)
        request = QueueRequest(kind=kind, lane=MAIN_LANE, operation_id=operation_id, message=message,
                               requested_at=now_ms())
        return None, await session.post_request(request, context)

    async def stop(self, user: str, conversation_id: str, context: Context, *,
                   operation_id: str | None = None) -> AbortRequest:
        """Stop the conversation's open run durably (cause `user`), wherever it is driven, only if
        it is `operation_id` when given: live here `Conversation.stop`; otherwise a `StopRequest`
        posted for the holder (drained queues are then not known here). Raises
        `NoActiveOperation` when nothing runs, or another run than `operation_id`; `Forbidden`."""
        session = await self._owned(user, conversation_id, context)
        if (live := self._live.get(conversation_id)) is not None:
            return await live.stop(context, operation_id=operation_id)
        current = await _open_run(session, context)
        if operation_id is not None and operation_id != current:
            raise NoActiveOperation(f"run {operation_id} of conversation {conversation_id} is not open",
                                    lane=MAIN_LANE)
        state = await session.get(addresses.operation_state(current), context)
        already = state is not None and isinstance(state.control, CancelRequested)
        if not already:
            await session.post_request(StopRequest(lane=MAIN_LANE, operation_id=current, cause="user",
                                                   requested_at=now_ms()), context)
        return AbortRequest(operation_id=current, newly_requested=not already, steer=(), follow_up=())

    async def command(self, user: str, conversation_id: str, line: str, context: Context, *,
                      commands: Mapping[str, BuiltInCommand] | None = None,
                      typed: bool = True) -> CommandOutcome | PostedCommand:
        """Run the command typed as `line` (`/name args`) from `commands` (default the setup's)
        on the conversation wherever it is held (CE-16): live here, or attached here for the
        command and let go after, its outcome returned; held by another process, posted to it
        (`CommandRequest`) and `PostedCommand` returned: the holder runs it from its own table
        and records its row, or its failure's. `typed` False runs it as a program's call (no
        command row). Raises `UnknownCommand` (nothing recorded), `Forbidden`, and what the
        command raises when it runs here."""
        table = self.setup.commands if commands is None else commands
        command, args = command_of(line, table)
        session = await self._owned(user, conversation_id, context)
        if (live := self._live.get(conversation_id)) is not None:
            return await command(self, user, live, args, context, typed=typed)
        try:
            opened = await self._attach(session, user, context)
        except SessionOwned:
            request = CommandRequest(lane=MAIN_LANE, user=user, line=line, typed=typed, requested_at=now_ms())
            return PostedCommand(request_id=await session.post_request(request, context))
        try:
            return await command(self, user, opened, args, context, typed=typed)
        finally:
            await self.close(user, conversation_id, context)

    async def _run_posted(self, conversation: Conversation, request: CommandRequest | SettingRequest | ReleaseRequest,
                          context: Context) -> None:
        """Carry out what another process posted, as the poster's user, through this door: a
        command from the setup's table or a setting change (an approval answer is taken by the
        conversation itself, at once). A failure is the command's row (CE-16) and a line in the
        log, never the holder's problem."""
        try:
            if isinstance(request, ReleaseRequest):
                if self.on_release_request is not None:  # a chat, which keeps its conversation, has none
                    self.on_release_request(conversation.id)
                return
            if isinstance(request, SettingRequest):
                # On `conversation` itself: while it is let go it is no longer listed as live here.
                if request.setting == "name":
                    await _rename(conversation._settings, request.value, context)
                elif request.setting == "model":
                    await _switch_posted(conversation, ModelIdentity.parse(request.value or ""), context)
                elif request.setting == "project":
                    await self._select_posted(conversation, request.user, request.value or "", context)
                else:
                    await conversation._settings.select_mode("plan" if request.value == "plan" else "build", context)
                return
            command, args = command_of(request.line, self.setup.commands)
            await command(self, request.user, conversation, args, context, typed=request.typed)
        except HarnessError as error:
            logger.warning("%s posted for conversation %s failed: %s", request.kind, conversation.id, error.message)

    async def _select_posted(self, conversation: Conversation, user: str, execution_ref: str,
                             context: Context) -> None:
        """A project switch another process posted, already answered `queued`: a refusal here is
        an error row with its text, so the person learns it did not apply (issue 28)."""
        try:  # on `conversation` itself: while it is let go it is no longer listed as live here
            await self._switch_project(conversation._settings, self._project(user, execution_ref), "user", context)
        except HarnessError as error:
            text = clean_public_text(f"the switch to project {execution_ref} did not apply: {error.message}")
            await conversation.record(ErrorDetails(text=text), context)
            raise

    async def _post_setting(self, session: Session, user: str, setting: Literal["name", "mode", "project"],
                            value: str | None, context: Context) -> None:
        request = SettingRequest(lane=MAIN_LANE, user=user, setting=setting, value=value, requested_at=now_ms())
        await session.post_request(request, context)

    async def send(self, user: str, conversation_id: str, text: str, context: Context, *,
                   images: Sequence[ImageContent] = ()) -> DriveOutcome:
        """Send a prompt and drive its turn (opening the conversation here if needed): admitted
        under the turn lock after any queued model switch, with a `ReasoningChanged` row above it
        when the reasoning level differs from the previous turn's (CE-14). Raises what
        `ConversationSettings.admit` and `Lane.drive` raise."""
        conversation = await self.open(user, conversation_id, context)
        return await conversation.send(text, context, images=images)

    async def admit(self, user: str, conversation_id: str, text: str, context: Context, *,
                    images: Sequence[ImageContent] = (), output: OutputSchema | None = None,
                    ) -> tuple[Conversation, AcceptedRun]:
        """Admit a prompt as `send` does, without driving it: the live conversation and the
        accepted run, durable in phase `starting`, for a door that drives it in a task of its own
        (the HTTP server answers 202 at once); `output` as `Conversation.admit` takes it. Raises
        what `ConversationSettings.admit` raises."""
        conversation = await self.open(user, conversation_id, context)
        return conversation, await conversation.admit(text, context, images=images, output=output)

    async def run_command(self, user: str, conversation: Conversation, invocation: CommandInvocation | None,
                          run: Callable[[RecordNow], Awaitable[T]], outcome_of: Callable[[T], CommandOutcome | None],
                          context: Context) -> T:
        """Run one command on `user`'s live `conversation` and return what `run` returns (CE-16).

        With an `invocation` (the person typed it) one `CommandRan` row is recorded: after `run`
        returns, with `outcome_of(result)`; or, when `run` raises a `HarnessError`, with that
        error's exact message, and the error is raised on. `run` gets `record_now(outcome)` to
        record the row earlier, so it is durable before the command ends its conversation, and
        `record_now.admit_with(outcome, text)` to admit a turn with the row above it in one
        commit (a goal command's kickoff); the row is recorded once. Without an invocation (a
        program's call) nothing is recorded and `record_now` does nothing. `record_now` says
        whether the append was accepted (True when there is nothing to record); a refusal is
        logged, and the command's own effect stands. Other exceptions are not the caller's answer
        and are raised unrecorded. Raises `Forbidden` before anything runs."""
        if conversation.info.owner != user:
            raise Forbidden.of(conversation.id)
        record_now = RecordNow(conversation, invocation, context)
        try:
            result = await run(record_now)
        except HarnessError as error:
            await record_now.failed(error)
            raise
        await record_now(outcome_of(result))
        return result

    async def delete(self, user: str, conversation_id: str, context: Context) -> None:
        """Delete `user`'s conversation and everything in its journal, for good. A run open in it
        (live here, or left by a stopped process) is first stopped with the cause `deleted`
        and settled here, recording no row (CE-7), so no drive is cut off mid-commit; then the
        conversation is let go and its session deleted in one transaction. Raises `Forbidden`,
        `SessionNotFound`, and `SessionOwned` while another process holds it (nothing deleted)."""
        conversation = await self.open(user, conversation_id, context)
        try:
            if conversation.operation() is not None:
                with suppress(NoActiveOperation):  # it settled meanwhile
                    await conversation.stop(context, cause="deleted")
                with suppress(NothingToResume):
                    await conversation.resume(context)  # joins the drive running here, or drives it to its end
        finally:
            await self.close(user, conversation_id, context)
        await self.store.delete_session(conversation_id, context)
        self._owners.pop(conversation_id, None)

    async def end(self, user: str, conversation_id: str, context: Context) -> bool:
        """End the conversation: from now on it takes no new turn and no garden message
        (`ConversationEnded`); it can still be read, renamed and deleted. Live or cold, like
        `record`. True when this call ended it, False when it already was (nothing written then)."""
        async with self._settings_of(user, conversation_id, context) as settings:
            if await settings.harness.session.get(ENDED_AT, context) is not None:
                return False
            await settings.harness.set_value(ENDED_AT, now_ms(), context)
            return True

    async def check_owner(self, user: str, conversation_id: str, context: Context) -> None:
        """Raise `SessionNotFound` when there is no such conversation, `Forbidden` for another
        user's. Reads the store only for a conversation whose owner it does not remember: an
        owner, once set, never changes, so a watcher reconnecting over and over costs no read
        (issue 29). One deleted by another process still passes here; its reader finds it gone."""
        owner = self._owners.get(conversation_id)
        if owner is None:
            await self._owned(user, conversation_id, context)
        elif owner != user:
            raise Forbidden.of(conversation_id)

    async def is_open(self, user: str, conversation_id: str, context: Context) -> bool:
        """Whether `user`'s conversation takes turns and garden messages, i.e. was not ended.
        Raises `SessionNotFound` when there is no such conversation, `Forbidden` for another
        user's; reads only."""
        session = await self._owned(user, conversation_id, context)
        return await session.get(ENDED_AT, context) is None

    async def post_garden_message(self, user: str, conversation_id: str, message: GardenMessage,
                                  context: Context) -> str:
        """Append a garden's message (sender `garden`) to the conversation's main lane and return
        its entry id: the canonical record of what the garden said there (OM-4). Live here or
        cold, like `record`; held by another process, posted to that holder, which appends it at
        its next step boundary under the same id. The entry's id is `message.emission_id`, so a
        retried emission never appends twice: its id is returned and nothing more is written.
        Never starts a turn (CE-3). Raises `ConversationEnded` for an ended conversation,
        `SessionNotFound`, `Forbidden`; nothing was written then."""
        session = await self._owned(user, conversation_id, context)
        await refuse_if_ended(session, conversation_id, context)
        entry_id, sent = message.emission_id, garden_message(message)
        async with self._settings_or_none(session, user, context) as settings:
            if settings is not None:
                with suppress(OperationIdTaken):  # appended before: the retry is answered with its id
                    await settings.lane.append_message(sent, context, entry_id=entry_id)
                return entry_id
        await self._post_append(session, user, sent, context, request_id=entry_id)
        return entry_id

    async def record_local_shell(self, user: str, conversation_id: str, command: str, exit_code: int | None,
                                 output: str, context: Context) -> bool:
        """Record a shell command the person's terminal ran itself (`!cmd`) as one `ShellRan` row,
        its output cut to its end (`SHELL_OUTPUT_CHARS`); live or cold, like `record` (CE-17).
        Nothing is sent: the person's next message goes as typed, after this row."""
        return await self.record(user, conversation_id, shell_ran(command, exit_code, output), context)

    async def run_local_shell(self, user: str, conversation_id: str, command: str, cwd: Path,
                              context: Context) -> tuple[ShellRan, bool]:
        """`!cmd` for a door that runs it itself: `command` in `cwd` (stdin closed, stdout and
        stderr merged, in the setup's `shell_environment`), then `record_local_shell`. Returns
        its row and whether it was recorded; the door shows the row itself when it was not (CE-17)."""
        environment = self.setup.shell_environment
        process = await asyncio.create_subprocess_shell(command, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT,
                                                        env=dict(environment()) if environment is not None else None)
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

    async def read_prompt_image(self, user: str, conversation_id: str, entry_id: str, index: int,
                                context: Context) -> StoredImage:
        """Image `index` (from 0) of the person's message `entry_id`, with the media type its bytes
        say, so a screen shows what was sent after a reload (the display row counts them). To the
        conversation's owner only: `Forbidden` for another user, `ImageNotFound` when the entry is
        not a person's message of the conversation, has no such image, or holds bytes that are
        not a PNG, JPEG, GIF or WebP image."""
        session = await self._owned(user, conversation_id, context)
        entry = await session.entry(entry_id, context)
        images: list[ImageContent] = []
        if entry is not None and isinstance(entry.payload, MessagePayload) and isinstance(
                message := entry.payload.message, UserMessage) and not isinstance(message.content, str):
            images = [part for part in message.content if isinstance(part, ImageContent)]
        data = b""
        if 0 <= index < len(images):
            with suppress(binascii.Error):  # not base64: no image, as for none
                data = b64decode(images[index].data)
        mime_type = sniff_image_type(data)
        if mime_type is None:
            raise ImageNotFound(f"message {entry_id[:80]!r} of conversation {conversation_id} has no image {index}",
                                conversation_id=conversation_id, ref=f"{entry_id[:80]}/{index}")
        return StoredImage(ref=image_ref(data), mime_type=mime_type, data=data)

    async def usage(self, user: str, conversation_id: str, context: Context) -> Usage:
        """What the conversation has spent (`spent`: its usage ledger summed, tokens and US dollars
        by kind). `Forbidden` for another user's conversation."""
        return await spent(await self._owned(user, conversation_id, context), context)

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
        owner = await self._owner(session, context)
        if owner is None:
            raise SessionNotFound(f"no conversation {conversation_id!r}", session_id=conversation_id)
        if owner != user:
            raise Forbidden.of(conversation_id)
        return session

    async def owner_of(self, conversation_id: str, context: Context) -> str | None:
        """The user a conversation belongs to; None for a session that is not a conversation.
        Raises `SessionNotFound`. Read once per conversation (`OWNERS_KEPT`): an owner never
        changes, so a worker claiming it and then opening it reads it once."""
        return await self._owner(await self.store.open_session(conversation_id, context), context)

    async def _owner(self, session: Session, context: Context) -> str | None:
        """The session's owner, remembered (the newest kept last, the oldest let go past
        `OWNERS_KEPT`) or read; the session was found (`open_session`), so one deleted since is
        found gone by what reads it next."""
        owner = self._owners.pop(session.id, None)
        if owner is None:
            owner = await session.get(OWNER, context)
            if owner is None:
                return None
        self._owners[session.id] = owner
        if len(self._owners) > OWNERS_KEPT:
            del self._owners[next(iter(self._owners))]
        return owner

    async def _post_append(self, session: Session, user: str, message: Message, context: Context, *,
                           request_id: str | None = None) -> str:
        """Post `message` for whoever holds the conversation to append (`AppendRequest`) and
        return its entry id, the request's. Refused as the holder would refuse it
        (`PromptTooLarge`), before anything is posted. The holder may have let go between the
        refused attachment and the post, taking nothing more: then the conversation is attached
        once more here, which places what was posted."""
        check_input_size([message], "message")
        request = AppendRequest(lane=MAIN_LANE, message=message, requested_at=now_ms())
        posted = await session.post_request(request, context, request_id=request_id)
        async with self._settings_or_none(session, user, context):
            pass  # attached: the attachment took the request (`_temporary_settings`); held: the holder will
        return posted

    @asynccontextmanager
    async def _settings_or_none(self, session: Session, user: str, context: Context) -> AsyncIterator[
            ConversationSettings | None]:
        """The live conversation's settings, or a temporary attachment's of a cold one, or None
        when another process (or another attachment here) holds the session."""
        live = self._live.get(session.id)
        if live is not None:
            yield live._settings
            return
        async with AsyncExitStack() as stack:
            try:
                settings = await stack.enter_async_context(self._temporary_settings(session, user, context))
            except SessionOwned:
                settings = None
            yield settings

    @asynccontextmanager
    async def _settings_of(self, user: str, conversation_id: str, context: Context) -> AsyncIterator[
            ConversationSettings]:
        """The settings of the live conversation, or of a temporary attachment of a cold one;
        `SessionOwned` while another process holds it (`_settings_or_none`)."""
        session = await self._owned(user, conversation_id, context)
        async with self._settings_or_none(session, user, context) as settings:
            if settings is None:
                raise SessionOwned(f"conversation {conversation_id} is held by another process",
                                   session_id=conversation_id)
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
            # What other processes posted while another holder had it comes first, in order;
            # commands wait for a holder that runs them.
            await harness.lane(MAIN_LANE).take_requests(context)
            yield await ConversationSettings.read(harness, target, context, model_tools=self.setup.model_tools)
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
            return (await self.select_project_execution(user, session.id, execution_ref, context, by="agent")).row

        system_prompt: SystemPrompt = delegation.system_prompt if delegation is not None else setup.system_prompt
        project = None if setup.project_context_bytes is None else ProjectContextPrompt(setup.project_context_bytes)
        options = AgentHarnessOptions(
            session=session, models=setup.models, tools=self._tools(user, target, delegation),
            live_tools=setup.live_tools,
            system_prompt=project.system_prompt(system_prompt) if project is not None else system_prompt,
            drive=setup.drive, listeners=setup.listeners, event_log_limit=setup.event_log_limit,
            agent_name=setup.agent_name, hooks=conversation_hooks(setup.hooks, session, self.store.images,
                                     project_boundary(session, target, select), budget=setup.budget))
        harness, open_operations = await AgentHarness.create(options, context)
        if delegation is not None:
            try:
                await delegation.start(harness, context)
            except BaseException:
                await harness.close(context)
                raise
        info = ConversationInfo(id=session.id, owner=user, name=await _name(session, context),
                                created_at=session.info.created_at, updated_at=session.info.updated_at)
        settings = await ConversationSettings.read(harness, target, context, model_tools=setup.model_tools,
                                                   project=project)
        conversation = self._live[session.id] = Conversation(info, settings, open_operations, self.feed,
                                                             self.store.posts, delegation, self._run_posted,
                                                             setup.on_approval)
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


async def _switch_posted(conversation: Conversation, model: ModelIdentity, context: Context) -> None:
    """A switch another process posted, already acknowledged to its caller: its failure here is
    recorded as one would be after an acknowledgement (CE-12), unless the switch it waited for
    recorded it already (a queued one) or a later pick superseded it."""
    try:
        await conversation.switch_model(model, context)
    except ModelSwitchRefused:
        raise
    except HarnessError as error:
        await conversation._settings.record_switch_failure(model, error, context)
        raise


async def _rename(settings: ConversationSettings, name: str | None, context: Context) -> bool:
    await settings.harness.set_session_name(name, context)
    return await settings.record_setting(Renamed(name=name), context)


async def _open_run(session: Session, context: Context) -> str:
    """The id of the conversation's open run, read cold; `NoActiveOperation` when none is."""
    state = await session.get(addresses.lane_state(MAIN_LANE), context)
    if state is None or state.current_operation_id is None:
        raise NoActiveOperation(f"conversation {session.id} has no run open", lane=MAIN_LANE)
    return state.current_operation_id


async def _name(session: Session, context: Context) -> str | None:
    name = await session.get(addresses.session_name(), context)
    return name


def conversation_hooks(hooks: RunHooks, session: SessionReader, images: ImageStore,
                       boundary: BetweenSteps | None = None, *, budget: Budget | None = None) -> RunHooks:
    """`hooks` (the door's) with the conversation's own, for a harness on `session`: interrupted
    replies replayed before the door's transform (CE-8); tool results' blocks normalized into
    `images` after the door's `after_tool` (CE-22); the `boundary` between steps (the model's
    project switch, CE-19) before the door's; the reply's blocks appended at run end before the
    door's `before_run_end` (CE-23); the turn-end rows placed in the terminal commit (CE-7,
    CE-9); the spending caps, `budget` (the door's) and the conversation's own, checked before
    each step; and a fallback model's row (issue 32)."""
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
                   between_steps=between_steps, discard_turn=discards_turn, settlement_messages=turn_end_rows,
                   over_budget=over_budget(session, budget or Budget()), fallback_messages=fallback_rows)
