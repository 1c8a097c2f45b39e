"""A lane of an attached session: acceptance, queues, appends, abort requests, configuration,
inspection and watch. Every method is one job on the session line; a committing job publishes the
projection and emits its events in the commit continuation (HA-12)."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from pydantic import BaseModel, JsonValue, ValidationError

from harness.context import Context
from harness.errors import InvalidInput, ModelUnavailable
from harness.messages import ImageContent, Message, ModelIdentity, ThinkingLevel, now_ms
from harness.runtime.branch_context import estimate_tokens
from harness.runtime.bus import EventBus, Watcher
from harness.runtime.commit import (
    Decision,
    Placement,
    SessionLine,
    payload_of,
    pending_payload,
)
from harness.runtime.errors import (
    HarnessClosed,
    InvalidMessage,
    LaneBusy,
    NoActiveOperation,
    NotARun,
    NothingToCompact,
    NothingToResume,
    OperationIdTaken,
    OperationMismatch,
    PromptTooLarge,
)
from harness.runtime.event_log import Announcement, LaneEventPage, read_lane_events
from harness.runtime.events import (
    CompactionStart,
    ConfigUpdate,
    EventDelivery,
    HarnessEvent,
    NavigationStart,
    OperationAbort,
    RunStart,
)
from harness.runtime.outcomes import DriveOutcome, Settled
from harness.runtime.output import check_output_schema
from harness.runtime.projection import LaneProjection
from harness.runtime.requests import (
    PromptRequest,
    PromptTemplate,
    RunRequest,
    Skill,
    check_input_message,
    check_input_size,
    describe_invalid,
    normalize_request,
    prompt_call,
)
from harness.runtime.settings import DriveSettings, SystemPrompt, lane_system_prompt
from harness.runtime.snapshot import LanePresentation, capture_snapshot, queued_item
from harness.runtime.summary import plan_compaction
from harness.runtime.tracing import admission
from harness.runtime.types import LaneExecutionInfo, LaneInfo, LaneSnapshot
from harness.session import (
    AbortCause,
    AppendRequest,
    CommitResult,
    HolderRequest,
    LaneConfig,
    LaneRequest,
    LaneState,
    SessionMutator,
    StopRequest,
    StorageCorruption,
    UnknownEntry,
    addresses,
)
from harness.session.ids import new_id
from harness.session.records import (
    CancelRequested,
    CompactionIntent,
    InboxItem,
    InboxKind,
    NavigationIntent,
    NavigationReady,
    OperationMeta,
    OperationState,
    PendingCustom,
    PendingEntry,
    PendingMessage,
    RunIntent,
    RunStarting,
    RunTools,
    SummaryPending,
    SummaryTask,
)

if TYPE_CHECKING:
    from harness.providers import ModelRegistry

R = TypeVar("R")

logger = logging.getLogger(__name__)


class RunningDrive(Protocol):
    """A drive of a lane's current operation in this process (HA-6 `running`): the driver the
    harness starts for `Lane.drive`, seen from the lane."""

    @property
    def operation_id(self) -> str: ...

    def join(self, *, wait_for_retry: bool, poll_deferred: bool) -> asyncio.Task[DriveOutcome]:
        """The task of the pass, started on first join; a later join adds its permissions."""
        ...

    def stage_shown(self, m: SessionMutator) -> None:
        """Stage into an abort request's commit what the drive has shown and not persisted yet."""
        ...

    def on_abort(self) -> None:
        """Called in the commit continuation of a durable abort request."""
        ...

    def halt(self) -> Awaitable[object]:
        """Stop now, as a crash would (the harness is closing); await the result to know it ended."""
        ...

    def pause(self) -> None:
        """Return `Paused` at the next step boundary."""
        ...


@dataclass(frozen=True)
class LaneCore:
    """What a lane takes from its harness: the session line and event bus, what acceptance reads
    (skills, templates, and the registry only to refuse input that cannot fit), the drive
    settings, and how to start a drive of an operation."""

    line: SessionLine
    bus: EventBus
    models: ModelRegistry | None
    system_prompt: SystemPrompt
    settings: DriveSettings
    skills: Mapping[str, Skill]
    templates: Mapping[str, PromptTemplate]
    watch_buffer_limit: int
    start_drive: Callable[[Lane, str, Context], RunningDrive]


@dataclass(frozen=True)
class AcceptedRun:
    """An accepted run: durable, in phase `starting`, not yet executing (HA-19)."""

    operation_id: str
    started_at: int
    entry_ids: tuple[str, ...]


@dataclass(frozen=True)
class AbortRequest:
    """The outcome of `request_abort`: `newly_requested` is False when an abort was already
    recorded; `steer` and `follow_up` are the items this request drained from the lane."""

    operation_id: str
    newly_requested: bool
    steer: tuple[str, ...]
    follow_up: tuple[str, ...]


class LaneWatch:
    """A watch of one lane: `snapshot`, then every event committed after it, each with the Context
    of the call that emitted it (HA-7, HA-13). Iterate with `async for`; `close()` stops it. Harness
    close ends iteration; a harness fault raises `HarnessFault` after the buffered events; a reader
    that falls `watch_buffer_limit` events behind gets `WatchOverflow` and must watch again."""

    def __init__(self, snapshot: LaneSnapshot, watcher: Watcher, close: Callable[[Watcher], None]) -> None:
        self.snapshot = snapshot
        self._watcher = watcher
        self._close = close

    def __aiter__(self) -> AsyncIterator[EventDelivery]:
        return self._watcher.deliveries()

    def buffered(self) -> list[EventDelivery]:
        """Take the deliveries already buffered, without waiting for more."""
        return self._watcher.take_buffered()

    def close(self) -> None:
        """Stop watching; buffered deliveries are dropped and iteration ends."""
        self._close(self._watcher)


class Lane:
    """One lane's projection (tip, configuration, state, current operation) and its operations.

    Obtain it from `AgentHarness.lane(name)`; it is valid while the harness is open."""

    def __init__(self, core: LaneCore, projection: LaneProjection) -> None:
        self.core = core
        self.name = projection.name
        self.projection = projection
        self.presentation = LanePresentation()
        self._taking = asyncio.Lock()  # one `take_requests` at a time, so none is applied twice
        self.active_drive: RunningDrive | None = None

    # -- projection ---------------------------------------------------------------------------

    @property
    def tip_id(self) -> str | None:
        return self.projection.tip_id

    @property
    def config(self) -> LaneConfig:
        """A copy of the lane's configured model, thinking level and active tools."""
        return self.projection.config.model_copy(deep=True)

    def info(self) -> LaneInfo:
        return LaneInfo(name=self.name, tip_id=self.projection.tip_id,
                        operation=self.projection.current(self.active_drive is not None))

    # -- the command path ---------------------------------------------------------------------

    def present(self, update: Callable[[LanePresentation], None], events: Sequence[HarnessEvent],
                context: Context) -> asyncio.Future[None]:
        """Publish a live presentation change and emit its events without yielding (HA-14): a
        watch capture either cloned the presentation before (and buffers these events) or after."""
        update(self.presentation)
        return self.core.bus.emit_batch(events, context)

    # -- acceptance (HA-16 to HA-21) ------------------------------------------------------------

    async def accept(self, request: RunRequest, context: Context) -> AcceptedRun:
        """Accept a run atomically into phase `starting`; starts nothing (HA-16 to HA-21).

        Captured next-run entries are placed first, then the request's messages. Raises `LaneBusy`
        if an operation is open, `InvalidMessage` if nothing would be placed or the input is not
        user/custom messages, `UnknownSkill`/`UnknownTemplate`, `OperationIdTaken` for a supplied id
        already in use, `InvalidInput` for an `output` schema that is not a JSON Schema or a
        negative `output_retries`; on any error nothing was written."""
        normalized = normalize_request(request, self.core.skills, self.core.templates)
        output = request.output if isinstance(request, PromptRequest) else None
        retries = request.output_retries if isinstance(request, PromptRequest) and output is not None else 0
        if output is not None:
            check_output_schema(output)
            if retries < 0:
                raise InvalidInput(f"output_retries is at least 0, not {retries}")

        async def plan(m: SessionMutator) -> Decision[AcceptedRun]:
            self._refuse_if_busy()
            self._refuse_if_too_large("prompt", normalized.messages)
            captured = self.projection.state.ids_of("next_run")
            await self.projection.load_inbox(m, context)
            queued = [queued_item(i, self.projection.pending[i]).message for i in captured]
            messages = [*queued, *normalized.messages]
            if not messages:
                raise InvalidMessage("nothing to run: the prompt is empty and no next-run input is queued")
            operation_id = normalized.operation_id or new_id()
            request_ids = list(normalized.entry_ids or [new_id() for _ in normalized.messages])
            if normalized.operation_id is not None or normalized.entry_ids is not None:
                # Only ids a caller supplied can be taken: minted ones are new by construction.
                await self._check_unused(m, operation_id, request_ids, context)
            placement = Placement(self.projection.tip_id)
            for entry_id, message in zip([*captured, *request_ids], messages, strict=True):
                placement.stage(m, entry_id, payload_of(message))
            for entry_id in captured:
                m.delete(addresses.pending_entry(entry_id))
            started_at = now_ms()
            meta = OperationMeta(operation_id=operation_id, lane=self.name, source_tip_id=self.projection.tip_id,
                                 traceparent=traceparent,
                                 started_at=started_at, intent=RunIntent(prompt_entry_ids=request_ids, output=output,
                                                                         output_retries=retries))
            state = LaneState(current_operation_id=operation_id,
                              inbox=[item for item in self.projection.state.inbox if item.kind != "next_run"])
            m.set(addresses.branch_tip(self.name), placement.tip)
            m.set(addresses.operation_meta(operation_id), meta)
            m.set(addresses.operation_state(operation_id), RunStarting())
            m.set(addresses.lane_state(self.name), state)

            events: list[Announcement] = [RunStart(lane=self.name, operation_id=operation_id, kind="run",
                                                   started_at=started_at), *placement.events(self.name)]
            if captured:
                events.append(self.projection.queue_update(state))

            def publish(result: CommitResult | None) -> None:
                self.projection.state, self.projection.meta = state, meta
                self.projection.operation_state = RunStarting()
                placement.publish(self.projection, result)
                for entry_id in captured:
                    del self.projection.pending[entry_id]

            return Decision(AcceptedRun(operation_id, started_at, tuple(request_ids)), events, publish)

        # The run's trace starts here: its context is stored with the run, for every pass that drives it.
        with admission(self.name) as traceparent:
            return await self.core.line.run(plan, context)

    async def _check_unused(self, m: SessionMutator, operation_id: str, entry_ids: Sequence[str],
                            context: Context) -> None:
        last = self.projection.last_result
        if (await m.get_record(addresses.operation_meta(operation_id), context) is not None
                or (last is not None and last.operation_id == operation_id)):
            raise OperationIdTaken(f"operation id {operation_id} is already used", operation_id=operation_id)
        await self._check_unused_entries(m, entry_ids, context)

    async def _check_unused_entries(self, m: SessionMutator, entry_ids: Sequence[str], context: Context) -> None:
        taken = set(await m.entries(entry_ids, context))
        for entry_id in entry_ids:  # a queued entry's pre-minted id is taken too
            if entry_id in self.projection.pending or await m.get_record(addresses.pending_entry(entry_id), context):
                taken.add(entry_id)
        if taken:
            used: list[JsonValue] = [*sorted(taken)]
            raise OperationIdTaken(f"entry ids already used: {', '.join(sorted(taken))}", entry_ids=used)

    # -- appends and queues ---------------------------------------------------------------------

    async def append_message(self, message: Message, context: Context, *, entry_id: str | None = None) -> str:
        """Append `message` to the lane and return its entry id. Idle, it is placed at once;
        while an operation is open it becomes a pending write, placed at the next safe point and
        shown in the snapshot's pending writes (CE-4). Raises `PromptTooLarge` for a message over
        `MAX_INPUT_BYTES`. A supplied `entry_id` makes the append happen once: `OperationIdTaken`
        when an entry or pending entry of that id exists already, and nothing is written."""
        check_input_size([message], "message")
        return await self._append(PendingMessage(message=owned(message)), context, entry_id=entry_id)

    async def append_custom(self, custom_type: str, data: JsonValue, context: Context) -> str:
        """Append application state the model never reads; same placement rules as `append_message`.
        Raises `InvalidInput` for data that is not clean JSON (NaN, infinities, lone surrogates)."""
        try:
            pending = PendingCustom(custom_type=custom_type, data=copy.deepcopy(data))
        except ValidationError as error:
            raise InvalidInput(f"custom entry data is not storable JSON: {error.errors()[0]['msg']}") from error
        return await self._append(pending, context)

    async def _append(self, pending: PendingEntry, context: Context, *, entry_id: str | None = None,
                      posted: str | None = None) -> str:
        """Append `pending`; `posted` is the id of the request taken from another process it
        answers (its entry's id too), deleted in the same commit."""
        supplied, new_entry = entry_id is not None, entry_id or new_id()

        async def plan(m: SessionMutator) -> Decision[str]:
            if posted is not None:
                m.delete(addresses.lane_request(posted))
            if supplied:
                await self._check_unused_entries(m, [new_entry], context)
            return await self._stage_append(m, new_entry, pending, context)

        return await self.core.line.run(plan, context)

    async def _stage_append(self, m: SessionMutator, entry_id: str, pending: PendingEntry,
                            context: Context) -> Decision[str]:
        """Stage `pending` as entry `entry_id`: placed at the tip when idle, else a pending write."""
        if self.projection.state.current_operation_id is not None:
            await self.projection.load_inbox(m, context)
            return self._enqueue(m, entry_id, "write", pending)
        placement = Placement(self.projection.tip_id)
        placement.stage(m, entry_id, pending_payload(pending))
        m.set(addresses.branch_tip(self.name), entry_id)
        return Decision(entry_id, placement.events(self.name),
                        lambda result: placement.publish(self.projection, result))

    def _enqueue(self, m: SessionMutator, entry_id: str, kind: InboxKind, pending: PendingEntry) -> Decision[str]:
        """Store `pending` by its pre-minted id and add it to the inbox; emits `queue_update`."""
        inbox = [*self.projection.state.inbox, InboxItem(entry_id=entry_id, kind=kind)]
        state = self.projection.state.model_copy(update={"inbox": inbox})
        m.set(addresses.pending_entry(entry_id), pending)
        m.set(addresses.lane_state(self.name), state)

        def publish(result: CommitResult | None) -> None:
            self.projection.state = state
            self.projection.pending[entry_id] = pending

        return Decision(entry_id, [self.projection.queue_update(state, {entry_id: pending})], publish)

    async def _queue(self, kind: InboxKind, message: Message, context: Context, *, needs_operation: bool,
                     posted: tuple[str, str] | None = None) -> str:
        """Queue `message` as `kind`. `posted` is `(request_id, operation_id)` of a request taken
        from another process: deleted in the same commit, and queued for the next run instead
        when that operation is no longer the current one."""
        check_input_message(message)
        entry_id = new_id()

        async def plan(m: SessionMutator) -> Decision[str]:
            nonlocal kind, needs_operation
            if posted is not None:
                m.delete(addresses.lane_request(posted[0]))
                if self.projection.state.current_operation_id != posted[1]:
                    kind, needs_operation = "next_run", False
            if needs_operation and self.projection.state.current_operation_id is None:
                raise NoActiveOperation(f"lane {self.name} has no open operation to {kind.replace('_', '-')}",
                                        lane=self.name)
            meta = self.projection.meta
            if needs_operation and meta is not None and meta.intent.kind != "run":
                raise NotARun(f"lane {self.name} is running a {meta.intent.kind}, which reads no messages: "
                              f"queue this for the next run instead", lane=self.name, kind=meta.intent.kind)
            self._refuse_if_too_large(_INPUT_NAMES[kind], [message])
            await self.projection.load_inbox(m, context)
            return self._enqueue(m, entry_id, kind, PendingMessage(message=owned(message)))

        return await self.core.line.run(plan, context)

    async def steer(self, message: Message, context: Context) -> str:
        """Queue `message` for the open run's next boundary (after the current tool batch, before
        the next request); returns its pre-minted entry id. `NoActiveOperation` when idle,
        `NotARun` while a compaction or navigation runs."""
        return await self._queue("steer", message, context, needs_operation=True)

    async def follow_up(self, message: Message, context: Context) -> str:
        """Queue `message` for when the open run would otherwise finish; `NoActiveOperation` when idle,
        `NotARun` while a compaction or navigation runs."""
        return await self._queue("follow_up", message, context, needs_operation=True)

    async def queue_next_run(self, message: Message, context: Context) -> str:
        """Queue `message` for the next accepted run, which places it before its own prompt (HA-18)."""
        return await self._queue("next_run", message, context, needs_operation=False)

    # -- abort ----------------------------------------------------------------------------------

    async def request_abort(self, cause: AbortCause, context: Context, *,
                            during_tool: AbortCause | None = None) -> AbortRequest:
        """Record a durable abort request for the open operation, with its cause (HA-5, CE-7), or
        with `during_tool` instead when one of its tool calls is running as the request commits.

        The lane's steer and follow-up items are drained into the request and kept stored until
        the operation settles. A repeated request changes nothing and says so. Raises
        `NoActiveOperation` when the lane is idle. Cancelling `context` is not an abort (HA-22)."""
        result = await self._abort(cause, context, during_tool=during_tool)
        assert result is not None
        return result

    async def _abort(self, cause: AbortCause, context: Context, *, during_tool: AbortCause | None = None,
                     posted: tuple[str, str] | None = None) -> AbortRequest | None:
        """`request_abort`; with `posted` (`(request_id, operation_id)` of a stop taken from another
        process) the request is deleted in the same commit, and None returned when that operation
        is no longer the current one (it settled: nothing to stop)."""

        async def plan(m: SessionMutator) -> Decision[AbortRequest | None]:
            nonlocal cause
            meta, state = self.projection.meta, self.projection.operation_state
            # Decided here, on the session line: the state is that of every commit before this one.
            if during_tool is not None and isinstance(state, RunTools) and any(
                    call.status == "effect_pending" for call in state.batch.calls):
                cause = during_tool
            if posted is not None:
                m.delete(addresses.lane_request(posted[0]))
                if meta is None or meta.operation_id != posted[1]:
                    return Decision(None)
            if meta is None or state is None:
                raise NoActiveOperation(f"lane {self.name} has no open operation to abort", lane=self.name)
            if isinstance(state.control, CancelRequested):
                return Decision(AbortRequest(meta.operation_id, False, (), ()))
            steer, follow_up = self.projection.state.ids_of("steer"), self.projection.state.ids_of("follow_up")
            await self.projection.load_inbox(m, context)
            control = CancelRequested(cause=cause, requested_at=now_ms(), drained_steer=steer,
                                      drained_follow_up=follow_up)
            new_state = state.model_copy(update={"control": control})
            lane_state = self.projection.state.model_copy(
                update={"inbox": [i for i in self.projection.state.inbox if i.kind not in ("steer", "follow_up")]})
            m.set(addresses.operation_state(meta.operation_id), new_state)
            m.set(addresses.lane_state(self.name), lane_state)
            if self.active_drive is not None:  # what the person saw when they stopped is kept (CE-7)
                self.active_drive.stage_shown(m)

            abort = OperationAbort(
                lane=self.name, operation_id=meta.operation_id, cause=cause,
                steer=tuple(queued_item(i, self.projection.pending[i]) for i in steer),
                follow_up=tuple(queued_item(i, self.projection.pending[i]) for i in follow_up),
            )

            def publish(result: CommitResult | None) -> None:
                self.projection.operation_state, self.projection.state = new_state, lane_state
                if self.active_drive is not None:
                    self.active_drive.on_abort()

            return Decision(AbortRequest(meta.operation_id, True, tuple(steer), tuple(follow_up)),
                            [abort, self.projection.queue_update(lane_state)], publish)

        return await self.core.line.run(plan, context)

    # -- requests from other processes ------------------------------------------------------------

    async def take_requests(self, context: Context, *,
                            on_command: Callable[[HolderRequest], None] | None = None) -> int:
        """Take every request other processes posted for this lane (`Session.post_request`), oldest
        first, each in one commit that also deletes it, and return how many were applied.

        The owner is the only one who may write the lane, so a steer, follow-up or stop from a
        process that does not hold the session reaches the run this way, durably: a request
        taken by nobody (its owner died) is taken by the next owner. A steer or follow-up whose
        run is still current is queued as `steer` or `follow_up` would; one whose run ended
        meanwhile waits for the next run (`queue_next_run`), so the person's message is kept. A
        stop is `request_abort` of its operation, or nothing once that has settled. An append is
        `append_message` under the request's id. A command, a setting change or an approval
        answer is deleted, then handed to `on_command` (the conversation carries it out); without
        `on_command` it is left for an owner that does. A request the lane refuses (`NotARun`
        while a compaction runs, a message too large, an append whose entry exists already) is
        dropped and logged, so that it cannot block the ones after it."""

        unreadable: list[str] = []

        def undecodable(request_id: str, error: StorageCorruption) -> None:
            # A request this version cannot read (a newer one's kind, damaged bytes) must not
            # block every request after it: it is dropped, and said so in the log.
            logger.error("lane %s dropped request %s, which does not decode: %s", self.name, request_id, error)
            unreadable.append(request_id)

        async def read(m: SessionMutator) -> Decision[list[tuple[str, LaneRequest]]]:
            found = await m.scan_records(addresses.lane_request(""), context, undecodable=undecodable)
            # In posting order, which is commit order: ids minted in one millisecond do not sort.
            mine = sorted((record.seq, key, record.value) for key, record in found if record.value.lane == self.name)
            return Decision([(key, request) for _, key, request in mine])

        applied = 0
        async with self._taking:
            for request_id, request in await self.core.line.run(read, context):
                try:
                    if isinstance(request, StopRequest):
                        posted = (request_id, request.operation_id)
                        # A person's stop from elsewhere lands as one here would: during a running tool
                        # call it is `user_during_tool` (CE-7).
                        during: AbortCause | None = "user_during_tool" if request.cause == "user" else None
                        applied += await self._abort(request.cause, context, during_tool=during,
                                                     posted=posted) is not None
                    elif isinstance(request, HolderRequest):
                        if on_command is None:
                            continue
                        await self._drop_request(request_id, context)
                        on_command(request)
                        applied += 1
                    elif isinstance(request, AppendRequest):
                        check_input_size([request.message], "message")
                        await self._append(PendingMessage(message=owned(request.message)), context,
                                           entry_id=request_id, posted=request_id)
                        applied += 1
                    else:
                        await self._queue(request.kind, request.message, context, needs_operation=True,
                                          posted=(request_id, request.operation_id))
                        applied += 1
                except OperationIdTaken:  # an append posted again: its entry is there already
                    logger.info("lane %s: request %s was appended before", self.name, request_id)
                    await self._drop_request(request_id, context)
                except (NotARun, InvalidMessage, PromptTooLarge, InvalidInput) as refused:
                    logger.warning("lane %s dropped request %s: %s", self.name, request_id, refused)
                    await self._drop_request(request_id, context)
            for request_id in unreadable:
                await self._drop_request(request_id, context)
        return applied

    async def _drop_request(self, request_id: str, context: Context) -> None:
        async def plan(m: SessionMutator) -> Decision[None]:
            m.delete(addresses.lane_request(request_id))
            return Decision(None)

        await self.core.line.run(plan, context)

    # -- driving (issue: drive) ---------------------------------------------------------------------

    async def drive(self, expected_operation_id: str, context: Context, *, wait_for_retry: bool = True,
                    poll_deferred: bool = False) -> DriveOutcome:
        """Drive operation `expected_operation_id` until it settles or waits, and return how.

        Fenced: another current operation raises `OperationMismatch`; an operation that already
        settled returns its result. A drive already running here is joined, not repeated.
        `wait_for_retry=False` returns `WaitingRetry` instead of waiting out a retry that is not
        due yet (a due one is made); with `poll_deferred` a deferred reply is fetched once.
        Cancelling `context` stops waiting for the outcome; it does not abort the run (HA-22: use
        `request_abort`)."""
        async def plan(m: SessionMutator) -> Decision[asyncio.Task[DriveOutcome] | Settled]:
            current, last = self.projection.state.current_operation_id, self.projection.last_result
            drive = self.active_drive
            if drive is None or drive.operation_id != expected_operation_id:
                if current != expected_operation_id:
                    if last is not None and last.operation_id == expected_operation_id:
                        return Decision(Settled(operation_id=expected_operation_id, result=owned(last)))
                    raise OperationMismatch(
                        f"operation {expected_operation_id} is not the current operation of lane {self.name}",
                        lane=self.name, expected_operation_id=expected_operation_id, current_operation_id=current,
                        last_operation_id=last.operation_id if last else None)
                drive = self.active_drive = self.core.start_drive(self, expected_operation_id,
                                                                  Context(context.attributes))
                started = drive
                task = drive.join(wait_for_retry=wait_for_retry, poll_deferred=poll_deferred)
                task.add_done_callback(lambda _: self._drive_ended(started))
                return Decision(task)
            return Decision(drive.join(wait_for_retry=wait_for_retry, poll_deferred=poll_deferred))

        claimed = await self.core.line.run(plan, context)
        if isinstance(claimed, Settled):
            return claimed
        waiter = context.cancellation()
        racing: set[asyncio.Future[Any]] = {claimed, waiter}
        try:
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not claimed.done():
            context.raise_if_cancelled()
        if claimed.cancelled():
            raise HarnessClosed("the harness closed while driving; the operation stays open for the next attachment",
                                operation_id=expected_operation_id)
        return owned(claimed.result())

    async def pause_drive(self, context: Context) -> bool:
        """Ask this process's drive of the lane, if one runs, to return `Paused` at its next step
        boundary: after the streaming reply or the tool batch in hand, before the next request
        (a retry's wait ends at once). The operation stays open in its durable phase for the next
        drive, here or in another process; nothing is written. An abort requested meanwhile still
        settles the run aborted. A job on the session line, so a drive started before the call
        is paused too. True when a drive was running."""

        async def plan(m: SessionMutator) -> Decision[bool]:
            if self.active_drive is None:
                return Decision(False)
            self.active_drive.pause()
            return Decision(True)

        return await self.core.line.run(plan, context)

    def _drive_ended(self, drive: RunningDrive) -> None:
        # A done callback, registered before anyone awaits the task: it runs before they resume.
        if self.active_drive is drive:
            self.active_drive = None

    async def resume(self, context: Context) -> DriveOutcome:
        """Continue the lane's current operation from its durable phase (after a crash, a retry
        wait or a deferred reply, which it polls once). `NothingToResume` when the lane is idle."""
        current = self.projection.state.current_operation_id
        if current is None:
            raise NothingToResume(f"lane {self.name} has no operation to resume", lane=self.name)
        return await self.drive(current, context, poll_deferred=True)

    @overload
    async def prompt(self, text: str, images: Sequence[ImageContent] | None, context: Context) -> DriveOutcome: ...

    @overload
    async def prompt(self, text: str, *, images: Sequence[ImageContent] | None = None,
                     context: Context) -> DriveOutcome: ...

    @overload
    async def prompt(self, messages: Message | Sequence[Message], context: Context) -> DriveOutcome: ...

    async def prompt(self, *args: object, **kwargs: object) -> DriveOutcome:
        """Accept a run and drive it: `prompt(text, images, context)` (images may be left out by
        name) or `prompt(messages, context)`, by position or by name (HA-30); any other call is
        `InvalidMessage`, before anything is written."""
        request, context = prompt_call(args, kwargs)
        accepted = await self.accept(request, context)
        return await self.drive(accepted.operation_id, context)

    async def compact(self, context: Context, *, custom_instructions: str | None = None) -> DriveOutcome:
        """Summarize the older part of the lane's branch into a compaction entry, keeping the newest
        messages verbatim, as an operation of its own; returns how it settled. Raises `LaneBusy`
        while another operation is open and `NothingToCompact` when the branch is too short."""
        settings = self.core.settings

        async def plan(m: SessionMutator) -> Decision[str]:
            self._refuse_if_busy()
            entries = (await self.projection.branch_context(m, context)).entries
            # No registry at acceptance (HA-16): refuse only a branch that is nothing but its
            # latest turn; how much is kept depends on the model, decided when it runs.
            if plan_compaction(entries, keep_recent_tokens=0) is None:
                raise NothingToCompact(f"lane {self.name} has nothing old enough to compact", lane=self.name)
            task = SummaryTask(task_id=new_id(), reason="manual", custom_instructions=custom_instructions)
            state = SummaryPending(task=task, config=self.projection.config, result_entry_id=new_id(),
                                   max_attempts=settings.retry.max_retries + 1)
            return self._start_structural(m, CompactionIntent(custom_instructions=custom_instructions), state,
                                          lambda op: CompactionStart(lane=self.name, operation_id=op, reason="manual"))

        operation_id = await self.core.line.run(plan, context)
        return await self.drive(operation_id, context)

    async def navigate(self, target_entry_id: str | None, context: Context, *, summarize: bool = False,
                       label: str | None = None, custom_instructions: str | None = None) -> DriveOutcome:
        """Move the lane's tip to `target_entry_id` (None: an empty branch), as an operation; with
        `summarize`, the branch being left is summarized into a branch-summary entry placed at the
        target first. `label` labels the target. Raises `LaneBusy` and `UnknownEntry`."""
        settings = self.core.settings

        async def plan(m: SessionMutator) -> Decision[str]:
            self._refuse_if_busy()
            if target_entry_id is not None and await m.entry(target_entry_id, context) is None:
                raise UnknownEntry(f"entry {target_entry_id} does not exist", entry_id=target_entry_id)
            intent = NavigationIntent(target_id=target_entry_id, summarize=summarize, label=label,
                                      custom_instructions=custom_instructions)
            state: OperationState = NavigationReady(target_id=target_entry_id, label=label)
            if summarize:
                task = SummaryTask(task_id=new_id(), reason="navigation", custom_instructions=custom_instructions)
                state = SummaryPending(task=task, config=self.projection.config, result_entry_id=new_id(),
                                       max_attempts=settings.retry.max_retries + 1)
            return self._start_structural(
                m, intent, state,
                lambda op: NavigationStart(lane=self.name, operation_id=op, target_id=target_entry_id))

        operation_id = await self.core.line.run(plan, context)
        return await self.drive(operation_id, context)

    def _refuse_if_too_large(self, what: str, messages: Sequence[Message]) -> None:
        """Refuse input that cannot fit the lane's model's context window even alone, next to the
        system prompt and the reply's reserve, by the estimate threshold compaction goes by: no
        compaction could ever make room for it (`PromptTooLarge`). Without a registry that knows
        the model nothing is checked and the step fails in-band (HA-23). Reading the registry here
        departs from HA-16 (acceptance reads no registry), for issue 10's "refuse before storing";
        moving the check to the doors that know the model is open work."""
        registry = self.core.models
        if registry is None or not messages:
            return
        try:
            model = registry.model(self.projection.config.model)
        except ModelUnavailable:
            return
        window = model.context_window
        reserve = self.core.settings.compaction.for_window(window).reserve_tokens
        system = estimate_tokens((), lane_system_prompt(self.core.system_prompt, self.name) or "")
        room, size = window - reserve - system, estimate_tokens(messages)
        if size <= room:
            return
        name = f"{model.provider}/{model.id}"
        system_part = f" and {system:,} for the system prompt" if system else ""
        raise PromptTooLarge(
            f"this {what} is too large: about {size:,} tokens, and model {name} has room for about "
            f"{max(room, 0):,} (its context window is {window:,} tokens, less {reserve:,} kept for the reply"
            f"{system_part}); shorten it or send it in parts",
            estimated_tokens=size, room_tokens=room, context_window=window, model=name)

    def _refuse_if_busy(self) -> None:
        if self.projection.state.current_operation_id is not None:
            raise LaneBusy(f"lane {self.name} is running operation {self.projection.state.current_operation_id}",
                           lane=self.name, operation_id=self.projection.state.current_operation_id)

    def _start_structural(self, m: SessionMutator, intent: CompactionIntent | NavigationIntent,
                          state: OperationState, start: Callable[[str], HarnessEvent]) -> Decision[str]:
        """Stage an accepted compaction or navigation: meta, first phase, lane state."""
        operation_id, started_at = new_id(), now_ms()
        meta = OperationMeta(operation_id=operation_id, lane=self.name, source_tip_id=self.projection.tip_id,
                             started_at=started_at, intent=intent)
        lane_state = self.projection.state.model_copy(update={"current_operation_id": operation_id})
        m.set(addresses.operation_meta(operation_id), meta)
        m.set(addresses.operation_state(operation_id), state)
        m.set(addresses.lane_state(self.name), lane_state)

        def publish(result: CommitResult | None) -> None:
            self.projection.meta, self.projection.operation_state, self.projection.state = meta, state, lane_state

        return Decision(operation_id, [RunStart(lane=self.name, operation_id=operation_id, kind=intent.kind,
                                                started_at=started_at), start(operation_id)], publish)

    # -- configuration --------------------------------------------------------------------------

    async def set_model(self, model: ModelIdentity, context: Context, *, announce: Message | None = None,
                        active_tools: Sequence[str] | None = None) -> None:
        """Configure the model for the lane's next steps; it is resolved only when one executes
        (HA-23). `announce` (a row saying so) is appended in the same commit, placed as
        `append_message` places it, and so are `active_tools` when given (the tools that go with
        the model): the switch, its tools and its row land together or not at all."""
        if announce is not None:
            check_input_size([announce], "message")
        changes: dict[str, object] = {"model": model}
        if active_tools is not None:
            changes["active_tools"] = list(active_tools)
        await self._configure(changes, context, announce=announce)

    async def set_thinking_level(self, level: ThinkingLevel, context: Context) -> None:
        """Configure how hard the lane's model thinks from its next step on.

        Every `ThinkingLevel` is kept as set, even one the lane's model does not take: the model is
        resolved only when a step executes (HA-23) and may be switched after this call, so each step's
        adapter sends the nearest level that step's model takes (`Model.nearest_thinking_level`: `off`
        for a model without reasoning, its highest level for one above it, as `xhigh` is for most).
        A caller that can tell a person (the chat) refuses such a level up front instead. Raises
        `InvalidInput` for a value that is not a `ThinkingLevel`; nothing is written then."""
        await self._configure({"thinking_level": level}, context)

    async def set_active_tools(self, tools: Sequence[str], context: Context) -> None:
        """Set the names of the tools the model may call; unknown names fail the next step in-band (HA-23)."""
        await self._configure({"active_tools": list(tools) if isinstance(tools, list | tuple) else tools}, context)

    async def _configure(self, changes: dict[str, object], context: Context, *,
                         announce: Message | None = None) -> None:
        """Set the config fields `changes` names in one commit, one `ConfigUpdate` each."""
        try:  # bad input is refused before the line (a record's `model_copy` validates)
            config = self.projection.config.model_copy(update=changes)
        except ValidationError as error:
            field = ", ".join(changes)
            raise InvalidInput(f"invalid {field}: {describe_invalid(error)}", field=field) from None

        async def plan(m: SessionMutator) -> Decision[None]:
            previous = self.projection.config
            m.set(addresses.lane_config(self.name), config)
            appended = None if announce is None else await self._stage_append(
                m, new_id(), PendingMessage(message=owned(announce)), context)

            def publish(result: CommitResult | None) -> None:
                self.projection.config = config
                if appended is not None and appended.publish is not None:
                    appended.publish(result)

            updates = [ConfigUpdate.model_validate({
                "lane": self.name, "field": field,
                "previous": _config_value(previous, field), "value": _config_value(config, field),
            }) for field in changes]
            return Decision(None, [*updates, *(appended.events if appended is not None else ())], publish)

        await self.core.line.run(plan, context)

    # -- observation ----------------------------------------------------------------------------

    async def inspect_execution(self, context: Context) -> LaneExecutionInfo:
        """Observe the lane on the session line without writing or reading payloads (HA-6)."""

        async def plan(m: SessionMutator) -> Decision[LaneExecutionInfo]:
            projection = self.projection
            info = LaneExecutionInfo(lane=self.name, tip_id=projection.tip_id, configured_model=projection.config.model,
                                     current=projection.current(self.active_drive is not None),
                                     last_result=owned(projection.last_result))
            return Decision(info)

        return await self.core.line.run(plan, context)

    async def read_events(self, after_seq: int | None, limit: int, context: Context) -> LaneEventPage:
        """The lane's durable events after `after_seq`, at most `limit`, as they were published
        (`read_lane_events`, which also reads a session no harness holds).

        To resume a watcher that saw events up to `after_seq` without a snapshot: `watch`, then
        read pages from `after_seq` until `watch.snapshot.event_seq`; if every page `holds`,
        deliver those events (seq up to the snapshot's), then the watch's own, which follow it;
        otherwise the log no longer reaches back that far: send the snapshot instead."""
        return await read_lane_events(self.core.line.owner().session, self.name, after_seq, limit, context)

    async def watch(self, context: Context) -> LaneWatch:
        """Register a watcher and capture the lane's snapshot in one no-write job (HA-7).

        Events committed after the capture reach the watch; none before it does (HA-13). Raises
        `StorageCorruption` (and registers nothing) when a required payload is missing (HA-10)."""
        bus = self.core.bus

        async def plan(m: SessionMutator) -> Decision[LaneWatch]:
            # Register and clone without yielding: a batch emitted before this point is in the
            # snapshot, one emitted after it is in the buffer (HA-13).
            watcher = bus.add_watcher(self.name, self.core.watch_buffer_limit)
            live = self.presentation.clone()
            try:
                snapshot = await capture_snapshot(m, self.projection.view(self.active_drive is not None), live, context)
            except BaseException:
                bus.remove_watcher(watcher)
                raise
            return Decision(LaneWatch(snapshot, watcher, bus.remove_watcher))

        return await self.core.line.run(plan, context)


_INPUT_NAMES: dict[InboxKind, str] = {"steer": "steer message", "follow_up": "follow-up",
                                     "next_run": "next-run message"}
"""How a refusal names queued input of each kind."""

T = TypeVar("T")


def owned(value: T) -> T:
    """A deep copy: what a caller passes in or gets back never aliases the projection (HA-10).
    A value with nothing in it that can change (scalars, tuples and frozen models all the way
    down, as a settled run's outcome usually is) is handed over as it is: sharing it aliases
    nothing anyone could write to."""
    return value if _unchangeable(value) else copy.deepcopy(value)


def _unchangeable(value: object) -> bool:
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return True
    if isinstance(value, tuple):
        return all(_unchangeable(item) for item in value)
    if isinstance(value, BaseModel) and value.model_config.get("frozen") and not value.__pydantic_private__:
        return all(_unchangeable(item) for item in value.__dict__.values())
    return False


def _config_value(config: LaneConfig, field: str) -> JsonValue:
    if field == "model":
        return config.model.model_dump()
    if field == "thinking_level":
        return config.thinking_level
    return list(config.active_tools)
