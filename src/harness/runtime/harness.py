"""`AgentHarness`: attachment to a session, the lanes, session-wide values, listeners and close."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar, cast

from harness.context import Context
from harness.errors import InvalidInput
from harness.runtime.agent_tool import AgentTool, offered_tools
from harness.runtime.bus import EventBus, Listener
from harness.runtime.commit import Decision, SessionLine
from harness.runtime.drive import DriveEnvironment, OperationDriver
from harness.runtime.errors import HarnessFault, ListenerReentry
from harness.runtime.event_log import DEFAULT_EVENT_LOG_LIMIT
from harness.runtime.events import LaneCreated, ValueUpdate
from harness.runtime.hooks import RunHooks
from harness.runtime.lane import Lane, LaneCore
from harness.runtime.projection import LaneProjection, read_lane_projection
from harness.runtime.requests import PromptTemplate, Skill
from harness.runtime.settings import DriveSettings, SystemPrompt
from harness.runtime.types import LaneInfo, OpenOperation
from harness.session import (
    CommitResult,
    LaneConfig,
    LaneState,
    OwnershipLost,
    Session,
    SessionMutator,
    UnknownEntry,
    UnknownLane,
    addresses,
)
from harness.session.records import CancelRequested

if TYPE_CHECKING:
    from harness.providers import ModelRegistry

R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True)
class AgentHarnessOptions:
    """What a harness runs with. `models` and `tools` are needed only when a step executes, never
    by attachment, acceptance or inspection (HA-16); acceptance reads a model's context window
    from `models` only to refuse input that cannot fit it, when the registry knows the lane's
    model. `system_prompt` may be a function of the lane's name, asked at each request. There is
    no default telemetry Context: every call takes its own (HA-22, HA-30)."""

    session: Session
    models: ModelRegistry | None = None
    tools: Sequence[AgentTool] = ()
    live_tools: Mapping[str, AgentTool] = field(default_factory=dict)
    """Tools by name that join and leave while the harness runs (an MCP server's, as it connects
    or its list changes), beside `tools`, which win on a shared name; read at each step, so a
    change lands at the next one, offered where a lane's active tools name them or a pattern
    matches them (`offered_tools`)."""
    skills: Sequence[Skill] = ()
    prompt_templates: Sequence[PromptTemplate] = ()
    listeners: Sequence[Listener] = ()
    system_prompt: SystemPrompt = None
    drive: DriveSettings = field(default_factory=DriveSettings)
    hooks: RunHooks = field(default_factory=RunHooks)
    watch_buffer_limit: int = 100_000  # events a watch may hold unread before it ends (WatchOverflow)
    event_log_limit: int = DEFAULT_EVENT_LOG_LIMIT  # events a lane's log keeps after a settlement
    agent_name: str = "harness"
    """The agent's name in its runs' OpenTelemetry spans (`invoke_agent {agent_name}`)."""


class AgentHarness:
    """The owner of one attached session (HA-4): its lanes, events and session-wide values."""

    def __init__(self, options: AgentHarnessOptions) -> None:
        self.options = options
        self.session = options.session
        self._bus = EventBus()
        self._line = SessionLine(self._bus, options.event_log_limit)
        self._lanes: dict[str, Lane] = {}
        # A view, not a copy: the live tools' changes show through. ChainMap only reads its later
        # maps, though its stubs ask for mutable ones.
        tools = ChainMap({tool.name: tool for tool in options.tools},
                         cast(MutableMapping[str, AgentTool], options.live_tools))
        self._environment = DriveEnvironment(
            models=options.models, tools=tools,
            system_prompt=options.system_prompt, settings=options.drive, hooks=options.hooks,
            session_id=options.session.id, agent_name=options.agent_name)
        self._core = LaneCore(
            line=self._line, bus=self._bus, models=options.models, system_prompt=options.system_prompt,
            settings=options.drive, skills={skill.name: skill for skill in options.skills},
            templates={template.name: template for template in options.prompt_templates},
            watch_buffer_limit=options.watch_buffer_limit, start_drive=self._start_drive)
        for listener in options.listeners:
            self._bus.add_listener(listener)

    def _start_drive(self, lane: Lane, operation_id: str, context: Context) -> OperationDriver:
        return OperationDriver(lane, operation_id, context, self._environment)

    @classmethod
    async def create(cls, options: AgentHarnessOptions, context: Context) -> tuple[AgentHarness, list[OpenOperation]]:
        """Attach to `options.session` and restore every lane's small projection (HA-1 to HA-5).

        Returns the harness and one `OpenOperation` per durable current operation (idle lanes
        omitted). Reads only branch tips, lane configuration, lane state, last results and the
        current operations' meta and state; starts nothing. Raises `SessionOwned` if another
        harness (here or in another process) holds the session, and `StorageCorruption` (after
        releasing it) if the projection is missing or contradictory."""
        harness = cls(options)
        ownership = harness._line.ownership = await options.session.attach(harness, context)
        try:
            await ownership.mutate(lambda m: harness._restore(m, context), context)
        except BaseException:
            await ownership.detach(context)
            raise
        open_operations = []
        for lane in harness._lanes.values():
            meta, state = lane.projection.meta, lane.projection.operation_state
            if meta is not None and state is not None:
                open_operations.append(OpenOperation(
                    lane=lane.name, operation_id=meta.operation_id, kind=meta.intent.kind,
                    started_at=meta.started_at, aborting=isinstance(state.control, CancelRequested),
                ))
        return harness, open_operations

    async def _restore(self, m: SessionMutator, context: Context) -> None:
        for name in await m.lanes(context):
            self._lanes[name] = Lane(self._core, await read_lane_projection(m, name, context))

    # -- lanes ----------------------------------------------------------------------------------

    def lane(self, name: str) -> Lane:
        """The lane `name`; `UnknownLane` if the session has none of that name."""
        lane = self._lanes.get(name)
        if lane is None:
            raise UnknownLane(f"lane {name} does not exist", lane=name)
        return lane

    @property
    def lanes(self) -> list[LaneInfo]:
        return [lane.info() for lane in self._lanes.values()]

    def offered_tools(self, lane: str) -> list[AgentTool]:
        """The tools the lane's next step would offer: those its active tools name that this
        harness has, a pattern's (`mcp__*`) as present now (`offered_tools`). `UnknownLane` if
        the session has no lane of that name."""
        return offered_tools(self.lane(lane).config.active_tools, self._environment.tools)

    async def create_lane(self, name: str, config: LaneConfig, context: Context, *, at: str | None = None) -> Lane:
        """Create lane `name` starting at entry `at` (None: an empty branch); emits `lane_created`
        in the commit continuation (HA-15). `LaneExists`, `UnknownEntry` on bad input."""
        self._line.check_usable()
        config = config.model_copy(deep=True)
        lane = Lane(self._core, LaneProjection(name, at, config, LaneState()))

        def on_committed(result: CommitResult) -> Awaitable[None]:
            self._lanes[name] = lane
            return self._bus.emit_batch([LaneCreated(lane=name, config=config, at=at)], context)

        try:
            await self._line.owner().create_lane(name, config, context, at=at, on_committed=on_committed)
        except OwnershipLost as error:
            self._line.fault(error.code, error.message, context)
            raise HarnessFault(f"the harness lost its session: {error.message}") from error
        return lane

    # -- session-wide values --------------------------------------------------------------------

    async def set_session_name(self, name: str | None, context: Context) -> None:
        """Name the session (None clears it); emits `value_update`."""

        async def plan(m: SessionMutator) -> Decision[None]:
            if name is None:
                m.delete(addresses.session_name())
            else:
                m.set(addresses.session_name(), name)
            return Decision(None, [ValueUpdate(key="session_name", value=name)])

        await self._line.run(plan, context)

    async def session_name(self, context: Context) -> str | None:
        async def plan(m: SessionMutator) -> Decision[str | None]:
            name: str | None = await m.get(addresses.session_name(), context)
            return Decision(name)

        return await self._line.run(plan, context)

    async def set_entry_label(self, entry_id: str, label: str | None, context: Context) -> None:
        """Label entry `entry_id` (None clears it); `UnknownEntry` if it does not exist."""

        async def plan(m: SessionMutator) -> Decision[None]:
            if await m.entry(entry_id, context) is None:
                raise UnknownEntry(f"entry {entry_id} does not exist", entry_id=entry_id)
            if label is None:
                m.delete(addresses.entry_label(entry_id))
            else:
                m.set(addresses.entry_label(entry_id), label)
            return Decision(None, [ValueUpdate(key="entry_label", entry_id=entry_id, value=label)])

        await self._line.run(plan, context)

    async def entry_label(self, entry_id: str, context: Context) -> str | None:
        async def plan(m: SessionMutator) -> Decision[str | None]:
            label: str | None = await m.get(addresses.entry_label(entry_id), context)
            return Decision(label)

        return await self._line.run(plan, context)

    async def set_value(self, address: addresses.ValueAddress[T], value: T | None, context: Context) -> None:
        """Write an application value of the session (None deletes it) in one commit on the session
        line, which a caller cannot do directly while the harness owns the session (HA-4); emits
        nothing. Raises `InvalidInput` for a reserved `harness.` address: only the harness's own
        calls write those."""
        if address.reserved:
            raise InvalidInput(f"{address.namespace} is reserved for the harness", namespace=address.namespace)

        async def plan(m: SessionMutator) -> Decision[None]:
            if value is None:
                m.delete(address)
            else:
                m.set(address, value)
            return Decision(None)

        await self._line.run(plan, context)

    @property
    def persistence_failure(self) -> Exception | None:
        """The first commit this harness saw refused, if any; it stays set until the session is
        attached again. A caller that owns an acknowledgement checks it before and after counting
        a write as durable (CE-3)."""
        return self._line.persistence_failure

    @property
    def faulted(self) -> bool:
        """Whether the harness stopped for good (it lost its session's ownership): close it and
        attach again."""
        return self._line.faulted

    # -- events ---------------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Deliver every event emitted from now on to `listener(event, context)`, off the session
        line; returns its unsubscribe (HA-12, HA-13)."""
        return self._bus.add_listener(listener)

    # -- lifecycle ------------------------------------------------------------------------------

    async def close(self, context: Context) -> None:
        """Let earlier jobs finish, refuse later ones (`HarnessClosed`), end every watch, deliver
        what was emitted and release the session. Idempotent."""
        line = self._line
        if self._bus.delivering:
            raise ListenerReentry("a listener must not close the harness; it would wait on itself")
        if line.closed:
            return

        async def mark_closed(m: SessionMutator) -> None:
            line.closed = True

        # Drives stop where they are, as a crash would leave them: the durable phase is resumed by
        # the next attachment. Their effects are cancelled, nothing is settled on the way out.
        stopping = [lane.active_drive.halt() for lane in self._lanes.values() if lane.active_drive is not None]
        for stopped in stopping:
            await stopped
        try:
            if not line.faulted:
                await line.owner().mutate(mark_closed, context)
        finally:
            line.closed = True
            self._bus.end_watches()
            await self._bus.drained()
            await line.owner().detach(context)
