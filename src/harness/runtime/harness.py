"""`AgentHarness`: attachment to a session, the lanes, session-wide values, listeners and close."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from harness.context import Context
from harness.runtime.bus import EventBus, Listener
from harness.runtime.drive_types import DriveSettings, RunHooks
from harness.runtime.errors import HarnessClosed, HarnessFault, ListenerReentry
from harness.runtime.events import Fault, HarnessEvent, LaneCreated, ValueUpdate
from harness.runtime.lane import Decision, Lane
from harness.runtime.requests import PromptTemplate, Skill
from harness.runtime.tools import AgentTool
from harness.runtime.types import LaneInfo, OpenOperation
from harness.session import (
    PHASES_OF_KIND,
    CancelRequested,
    CommitResult,
    LaneConfig,
    LaneState,
    OwnershipLost,
    Session,
    SessionMutator,
    SessionOwnership,
    StorageCorruption,
    UnknownEntry,
    UnknownLane,
    addresses,
)

if TYPE_CHECKING:
    from harness.providers.models import ModelRegistry

R = TypeVar("R")


@dataclass(frozen=True)
class AgentHarnessOptions:
    """What a harness runs with. `models` and `tools` are needed only when a step executes, never
    by attachment, acceptance or inspection (HA-16); acceptance reads a model's context window
    from `models` only to refuse input that cannot fit it, when the registry knows the lane's
    model. There is no default telemetry Context: every call takes its own (HA-22, HA-30)."""

    session: Session
    models: ModelRegistry | None = None
    tools: Sequence[AgentTool] = ()
    skills: Sequence[Skill] = ()
    prompt_templates: Sequence[PromptTemplate] = ()
    listeners: Sequence[Listener] = ()
    system_prompt: str | None = None
    drive: DriveSettings = field(default_factory=DriveSettings)
    hooks: RunHooks = field(default_factory=RunHooks)
    watch_buffer_limit: int = 100_000  # events a watch may hold unread before it ends (WatchOverflow)


class AgentHarness:
    """The owner of one attached session (HA-4): its lanes, events and session-wide values."""

    def __init__(self, options: AgentHarnessOptions) -> None:
        self.options = options
        self.session = options.session
        self._skills = {skill.name: skill for skill in options.skills}
        self._templates = {template.name: template for template in options.prompt_templates}
        self._tools = {tool.name: tool for tool in options.tools}
        self._bus = EventBus()
        self._lanes: dict[str, Lane] = {}
        self._ownership: SessionOwnership | None = None
        self._closed = False
        self._faulted = False
        self._persistence_failure: Exception | None = None
        for listener in options.listeners:
            self._bus.add_listener(listener)

    @classmethod
    async def create(cls, options: AgentHarnessOptions, context: Context) -> tuple[AgentHarness, list[OpenOperation]]:
        """Attach to `options.session` and restore every lane's small projection (HA-1 to HA-5).

        Returns the harness and one `OpenOperation` per durable current operation (idle lanes
        omitted). Reads only branch tips, lane configuration, lane state, last results and the
        current operations' meta and state; starts nothing. Raises `SessionOwned` if another
        harness (here or in another process) holds the session, and `StorageCorruption` (after
        releasing it) if the projection is missing or contradictory."""
        harness = cls(options)
        harness._ownership = await options.session.attach(harness, context)
        try:
            await harness._ownership.mutate(harness._restore, context)
        except BaseException:
            await harness._ownership.detach(context)
            raise
        open_operations = []
        for lane in harness._lanes.values():
            meta, state = lane._meta, lane._operation_state
            if meta is not None and state is not None:
                open_operations.append(OpenOperation(
                    lane=lane.name, operation_id=meta.operation_id, kind=meta.intent.kind,
                    started_at=meta.started_at, aborting=isinstance(state.control, CancelRequested),
                ))
        return harness, open_operations

    async def _restore(self, m: SessionMutator) -> None:
        context = m._context
        for name in await m.lanes(context):
            tip = await m.get_record(addresses.branch_tip(name), context)
            config = await m.get(addresses.lane_config(name), context)
            state = await m.get(addresses.lane_state(name), context)
            if tip is None or config is None or state is None:
                raise StorageCorruption(f"lane {name} is missing its configuration or state", lane=name)
            last_result = await m.get(addresses.lane_last_result(name), context)
            meta = operation_state = None
            operation_id = state.current_operation_id
            if operation_id is not None:
                meta = await m.get(addresses.operation_meta(operation_id), context)
                operation_state = await m.get(addresses.operation_state(operation_id), context)
                if meta is None or operation_state is None:
                    raise StorageCorruption(f"operation {operation_id} of lane {name} has no meta or state",
                                            lane=name, operation_id=operation_id)
                if meta.operation_id != operation_id or meta.lane != name:
                    raise StorageCorruption(f"operation {operation_id} does not belong to lane {name}",
                                            lane=name, operation_id=operation_id)
                if operation_state.phase not in PHASES_OF_KIND[meta.intent.kind]:
                    raise StorageCorruption(
                        f"operation {operation_id} is a {meta.intent.kind} in phase {operation_state.phase}",
                        lane=name, operation_id=operation_id)
            self._lanes[name] = Lane(self, name, tip_id=tip.value, config=config, state=state,
                                     last_result=last_result, meta=meta, operation_state=operation_state)

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

    async def create_lane(self, name: str, config: LaneConfig, context: Context, *, at: str | None = None) -> Lane:
        """Create lane `name` starting at entry `at` (None: an empty branch); emits `lane_created`
        in the commit continuation (HA-15). `LaneExists`, `UnknownEntry` on bad input."""
        self._check_usable()
        config = config.model_copy(deep=True)
        lane = Lane(self, name, tip_id=at, config=config, state=LaneState(), last_result=None, meta=None,
                    operation_state=None)

        def on_committed(result: CommitResult) -> Awaitable[None]:
            self._lanes[name] = lane
            return self._bus.emit_batch([LaneCreated(lane=name, config=config, at=at)], context)

        try:
            await self._owner().create_lane(name, config, context, at=at, on_committed=on_committed)
        except OwnershipLost as error:
            self._fault(error.code, error.message, context)
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
            return Decision(None, lambda _: [ValueUpdate(key="session_name", value=name)])

        await self._command(plan, context)

    async def session_name(self, context: Context) -> str | None:
        async def plan(m: SessionMutator) -> Decision[str | None]:
            name: str | None = await m.get(addresses.session_name(), context)
            return Decision(name, lambda _: [])

        return await self._command(plan, context)

    async def set_entry_label(self, entry_id: str, label: str | None, context: Context) -> None:
        """Label entry `entry_id` (None clears it); `UnknownEntry` if it does not exist."""

        async def plan(m: SessionMutator) -> Decision[None]:
            if await m.entry(entry_id, context) is None:
                raise UnknownEntry(f"entry {entry_id} does not exist", entry_id=entry_id)
            if label is None:
                m.delete(addresses.entry_label(entry_id))
            else:
                m.set(addresses.entry_label(entry_id), label)
            return Decision(None, lambda _: [ValueUpdate(key="entry_label", entry_id=entry_id, value=label)])

        await self._command(plan, context)

    async def entry_label(self, entry_id: str, context: Context) -> str | None:
        async def plan(m: SessionMutator) -> Decision[str | None]:
            label: str | None = await m.get(addresses.entry_label(entry_id), context)
            return Decision(label, lambda _: [])

        return await self._command(plan, context)

    @property
    def persistence_failure(self) -> Exception | None:
        """The first commit this harness saw refused, if any; it stays set until the session is
        attached again. A caller that owns an acknowledgement checks it before and after counting
        a write as durable (CE-3)."""
        return self._persistence_failure

    # -- events ---------------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Deliver every event emitted from now on to `listener(event, context)`, off the session
        line; returns its unsubscribe (HA-12, HA-13)."""
        return self._bus.add_listener(listener)

    # -- lifecycle ------------------------------------------------------------------------------

    async def close(self, context: Context) -> None:
        """Let earlier jobs finish, refuse later ones (`HarnessClosed`), end every watch, deliver
        what was emitted and release the session. Idempotent."""
        if self._bus.delivering:
            raise ListenerReentry("a listener must not close the harness; it would wait on itself")
        if self._closed:
            return

        async def mark_closed(m: SessionMutator) -> None:
            self._closed = True

        # Drives stop where they are, as a crash would leave them: the durable phase is resumed by
        # the next attachment. Their effects are cancelled, nothing is settled on the way out.
        drives = [lane._drive for lane in self._lanes.values() if lane._drive is not None]
        for drive in drives:
            drive.halt()
        await asyncio.gather(*(drive.task for drive in drives if drive.task is not None),
                             *(task for drive in drives for task in drive.effect_tasks), return_exceptions=True)
        try:
            if not self._faulted:
                await self._owner().mutate(mark_closed, context)
        finally:
            self._closed = True
            self._bus.end_watches()
            await self._bus.drained()
            await self._owner().detach(context)

    def _owner(self) -> SessionOwnership:
        assert self._ownership is not None, "use AgentHarness.create"
        return self._ownership

    def _check_usable(self) -> None:
        if self._bus.delivering:
            raise ListenerReentry("a listener must not call harness operations; it would wait on itself")
        if self._faulted:
            raise HarnessFault("the harness faulted; close it and attach again")
        if self._closed:
            raise HarnessClosed("the harness is closed")

    async def _command(self, plan: Callable[[SessionMutator], Awaitable[Decision[R]]], context: Context) -> R:
        """Run `plan` as one job on the session line: commit what it staged, then, without
        yielding, its continuation publishes the projection and `emit_batch` binds recipients
        (HA-12). The job returns without awaiting delivery; this call awaits it after release."""
        self._check_usable()
        delivered: list[asyncio.Future[None]] = []

        async def job(m: SessionMutator) -> R:
            self._check_usable()
            decision = await plan(m)
            try:
                result = await m.commit() if m.staged else None
            except Exception as error:
                self._persistence_failure = self._persistence_failure or error
                raise
            events = decision.after(result)
            if events:
                delivered.append(self._bus.emit_batch(events, context))
            return decision.value

        try:
            value = await self._owner().mutate(job, context)
        except OwnershipLost as error:
            self._fault(error.code, error.message, context)
            raise HarnessFault(f"the harness lost its session: {error.message}") from error
        for future in delivered:
            await asyncio.shield(future)
        return value

    def _fault(self, code: str, message: str, context: Context) -> None:
        if self._faulted:
            return
        self._faulted = True
        events: list[HarnessEvent] = [Fault(code=code, message=message)]
        self._bus.emit_batch(events, context)
        self._bus.end_watches(HarnessFault(f"the harness faulted: {message}", code=code))
