"""A lane of an attached session: acceptance, queues, appends, abort requests, configuration,
inspection and watch. Every method is one job on the session line; a committing job publishes the
projection and emits its events in the commit continuation (HA-12)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from pydantic import JsonValue, ValidationError
from pydantic_core import PydanticSerializationError

from harness.context import Context
from harness.errors import InvalidInput, ModelUnavailable
from harness.messages import CustomMessage, ImageContent, Message, ModelIdentity, now_ms
from harness.runtime.branch_context import branch_entries
from harness.runtime.bus import Watcher
from harness.runtime.drive_types import ResumeOutcome, Settled
from harness.runtime.errors import (
    HarnessClosed,
    InvalidMessage,
    LaneBusy,
    NoActiveOperation,
    NothingToCompact,
    NothingToResume,
    OperationIdTaken,
    OperationMismatch,
    PromptTooLarge,
)
from harness.runtime.events import (
    CompactionStart,
    ConfigUpdate,
    EntryAdded,
    EventDelivery,
    HarnessEvent,
    MessageEnd,
    MessageStart,
    NavigationStart,
    OperationAbort,
    QueueUpdate,
    RunStart,
)
from harness.runtime.requests import (
    PromptRequest,
    RunRequest,
    check_input_message,
    check_input_size,
    describe_invalid,
    normalize_request,
)
from harness.runtime.snapshot import LanePresentation, LaneView, capture_snapshot, queued_item, queues_of
from harness.runtime.summary import estimate_tokens, plan_compaction
from harness.runtime.types import CurrentOperationInfo, LaneExecutionInfo, LaneInfo, LaneSnapshot, OperationStatus
from harness.session import (
    AbortCause,
    CancelRequested,
    CommitResult,
    CustomMessagePayload,
    CustomPayload,
    Entry,
    EntryPayload,
    InboxItem,
    InboxKind,
    LaneConfig,
    LaneLastResult,
    LaneState,
    MessagePayload,
    NavigationReady,
    OperationMeta,
    OperationState,
    PendingCustom,
    PendingEntry,
    PendingMessage,
    RunStarting,
    SessionMutator,
    StorageCorruption,
    SummaryPending,
    SummaryTask,
    UnknownEntry,
    addresses,
    new_id,
)
from harness.session.records import CompactionIntent, NavigationIntent, RunIntent, ThinkingLevel

if TYPE_CHECKING:
    from harness.runtime.drive import RunDriver
    from harness.runtime.harness import AgentHarness

R = TypeVar("R")

AfterCommit = Callable[[CommitResult | None], Sequence[HarnessEvent]]
"""Runs in the commit continuation, without yielding: publish the projection, return the events."""


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


@dataclass
class Decision(Generic[R]):
    """What a lane job decided: the call's return value and its commit continuation."""

    value: R
    after: AfterCommit


class Lane:
    """One lane's projection (tip, configuration, state, current operation) and its operations.

    Obtain it from `AgentHarness.lane(name)`; it is valid while the harness is open."""

    def __init__(
        self,
        harness: AgentHarness,
        name: str,
        *,
        tip_id: str | None,
        config: LaneConfig,
        state: LaneState,
        last_result: LaneLastResult | None,
        meta: OperationMeta | None,
        operation_state: OperationState | None,
    ) -> None:
        self._harness = harness
        self.name = name
        self._tip_id = tip_id
        self._config = config
        self._state = state
        self._last_result = last_result
        self._meta = meta
        self._operation_state = operation_state
        self._presentation = LanePresentation()
        self._drive: RunDriver | None = None
        # Payloads of queued entries this process has read or written; the harness owns the
        # session, so nothing else can change them (HA-4). Never filled at attachment (HA-3).
        self._pending: dict[str, PendingEntry] = {}

    # -- projection ---------------------------------------------------------------------------

    @property
    def tip_id(self) -> str | None:
        return self._tip_id

    @property
    def config(self) -> LaneConfig:
        """A copy of the lane's configured model, thinking level and active tools."""
        return self._config.model_copy(deep=True)

    def _status(self) -> OperationStatus | None:
        if self._operation_state is None:
            return None
        if isinstance(self._operation_state.control, CancelRequested):
            return "aborting"
        return "running" if self._drive is not None else "open"

    def _current(self) -> CurrentOperationInfo | None:
        meta, state, status = self._meta, self._operation_state, self._status()
        if meta is None or state is None or status is None:
            return None
        return CurrentOperationInfo(id=meta.operation_id, kind=meta.intent.kind, started_at=meta.started_at,
                                    status=status, captured_model=captured_model(state))

    def info(self) -> LaneInfo:
        return LaneInfo(name=self.name, tip_id=self._tip_id, operation=self._current())

    def _view(self) -> LaneView:
        return LaneView(self.name, self._tip_id, self._state, self._last_result, self._meta,
                        self._operation_state, self._status())

    # -- the command path ---------------------------------------------------------------------

    async def _command(self, plan: Callable[[SessionMutator], Awaitable[Decision[R]]], context: Context) -> R:
        return await self._harness._command(plan, context)

    def _present(self, update: Callable[[LanePresentation], None], events: Sequence[HarnessEvent],
                 context: Context) -> asyncio.Future[None]:
        """Publish a live presentation change and emit its events without yielding (HA-14): a
        watch capture either cloned the presentation before (and buffers these events) or after."""
        update(self._presentation)
        return self._harness._bus.emit_batch(events, context)

    async def _load_pending(self, m: SessionMutator, ids: Sequence[str], context: Context) -> None:
        for entry_id in ids:
            if entry_id not in self._pending:
                value = await m.get(addresses.pending_entry(entry_id), context)
                if value is None:
                    raise StorageCorruption(f"queued entry {entry_id} has no stored payload", entry_id=entry_id)
                self._pending[entry_id] = value

    async def _load_inbox(self, m: SessionMutator, context: Context, extra: Sequence[str] = ()) -> None:
        """Load the payloads of every queued entry (and `extra` ids): `queue_update` carries them all."""
        await self._load_pending(m, [*(item.entry_id for item in self._state.inbox), *extra], context)

    def _queue_update(self) -> QueueUpdate:
        queues, writes = queues_of(self._state.inbox, self._pending)
        return QueueUpdate(lane=self.name, queues=queues, pending_writes=writes)

    # -- acceptance (HA-16 to HA-21) ------------------------------------------------------------

    async def accept(self, request: RunRequest, context: Context) -> AcceptedRun:
        """Accept a run atomically into phase `starting`; starts nothing (HA-16 to HA-21).

        Captured next-run entries are placed first, then the request's messages. Raises `LaneBusy`
        if an operation is open, `InvalidMessage` if nothing would be placed or the input is not
        user/custom messages, `UnknownSkill`/`UnknownTemplate`, `OperationIdTaken` for a supplied id
        already in use; on any error nothing was written."""
        normalized = normalize_request(request, self._harness._skills, self._harness._templates)

        async def plan(m: SessionMutator) -> Decision[AcceptedRun]:
            self._refuse_if_busy()
            self._refuse_if_too_large("prompt", normalized.messages)
            captured = self._state.ids_of("next_run")
            await self._load_inbox(m, context)
            queued = [queued_item(i, self._pending[i]).message for i in captured]
            messages = [*queued, *normalized.messages]
            if not messages:
                raise InvalidMessage("nothing to run: the prompt is empty and no next-run input is queued")
            operation_id = normalized.operation_id or new_id()
            request_ids = list(normalized.entry_ids or [new_id() for _ in normalized.messages])
            await self._check_unused(m, operation_id, request_ids, context)
            placement = Placement(self._tip_id)
            for entry_id, message in zip([*captured, *request_ids], messages, strict=True):
                placement.stage(m, entry_id, payload_of(message))
            for entry_id in captured:
                m.delete(addresses.pending_entry(entry_id))
            started_at = now_ms()
            meta = OperationMeta(operation_id=operation_id, lane=self.name, source_tip_id=self._tip_id,
                                 started_at=started_at, intent=RunIntent(prompt_entry_ids=request_ids))
            state = LaneState(current_operation_id=operation_id,
                              inbox=[item for item in self._state.inbox if item.kind != "next_run"])
            m.set(addresses.branch_tip(self.name), placement.tip)
            m.set(addresses.operation_meta(operation_id), meta)
            m.set(addresses.operation_state(operation_id), RunStarting())
            m.set(addresses.lane_state(self.name), state)

            def after(result: CommitResult | None) -> list[HarnessEvent]:
                self._tip_id, self._state, self._meta = placement.tip, state, meta
                self._operation_state = RunStarting()
                events: list[HarnessEvent] = [RunStart(lane=self.name, operation_id=operation_id, kind="run",
                                                       started_at=started_at)]
                events += placement.events(self.name, result)
                for entry_id in captured:
                    del self._pending[entry_id]
                if captured:
                    events.append(self._queue_update())
                return events

            return Decision(AcceptedRun(operation_id, started_at, tuple(request_ids)), after)

        return await self._command(plan, context)

    async def _check_unused(self, m: SessionMutator, operation_id: str, entry_ids: Sequence[str],
                            context: Context) -> None:
        if (await m.get_record(addresses.operation_meta(operation_id), context) is not None
                or (self._last_result is not None and self._last_result.operation_id == operation_id)):
            raise OperationIdTaken(f"operation id {operation_id} is already used", operation_id=operation_id)
        taken = set(await m.entries(entry_ids, context))
        for entry_id in entry_ids:  # a queued entry's pre-minted id is taken too
            if entry_id in self._pending or await m.get_record(addresses.pending_entry(entry_id), context):
                taken.add(entry_id)
        if taken:
            used: list[JsonValue] = [*sorted(taken)]
            raise OperationIdTaken(f"entry ids already used: {', '.join(sorted(taken))}", entry_ids=used)

    # -- appends and queues ---------------------------------------------------------------------

    async def append_message(self, message: Message, context: Context) -> str:
        """Append `message` to the lane and return its entry id. Idle, it is placed at once;
        while an operation is open it becomes a pending write, placed at the next safe point and
        shown in the snapshot's pending writes (CE-4). Raises `PromptTooLarge` for a message over
        `MAX_INPUT_BYTES`."""
        check_input_size([message], "message")
        return await self._append(PendingMessage(message=owned(message)), context)

    async def append_custom(self, custom_type: str, data: JsonValue, context: Context) -> str:
        """Append application state the model never reads; same placement rules as `append_message`.
        Raises `InvalidInput` for data that is not clean JSON (NaN, infinities, lone surrogates)."""
        try:
            pending = PendingCustom(custom_type=custom_type, data=copy.deepcopy(data))
        except ValidationError as error:
            raise InvalidInput(f"custom entry data is not storable JSON: {error.errors()[0]['msg']}") from error
        return await self._append(pending, context)

    async def _append(self, pending: PendingEntry, context: Context) -> str:
        entry_id = new_id()

        async def plan(m: SessionMutator) -> Decision[str]:
            if self._state.current_operation_id is not None:
                await self._load_inbox(m, context)
                return self._enqueue(m, entry_id, "write", pending)
            placement = Placement(self._tip_id)
            placement.stage(m, entry_id, pending_payload(pending))
            m.set(addresses.branch_tip(self.name), entry_id)

            def after(result: CommitResult | None) -> list[HarnessEvent]:
                self._tip_id = entry_id
                return placement.events(self.name, result)

            return Decision(entry_id, after)

        return await self._command(plan, context)

    def _enqueue(self, m: SessionMutator, entry_id: str, kind: InboxKind, pending: PendingEntry) -> Decision[str]:
        """Store `pending` by its pre-minted id and add it to the inbox; emits `queue_update`."""
        state = self._state.model_copy(update={"inbox": [*self._state.inbox, InboxItem(entry_id=entry_id, kind=kind)]})
        m.set(addresses.pending_entry(entry_id), pending)
        m.set(addresses.lane_state(self.name), state)

        def after(result: CommitResult | None) -> list[HarnessEvent]:
            self._state = state
            self._pending[entry_id] = pending
            return [self._queue_update()]

        return Decision(entry_id, after)

    async def _queue(self, kind: InboxKind, message: Message, context: Context, *, needs_operation: bool) -> str:
        check_input_message(message)
        entry_id = new_id()

        async def plan(m: SessionMutator) -> Decision[str]:
            if needs_operation and self._state.current_operation_id is None:
                raise NoActiveOperation(f"lane {self.name} has no open operation to {kind.replace('_', '-')}",
                                        lane=self.name)
            self._refuse_if_too_large(_INPUT_NAMES[kind], [message])
            await self._load_inbox(m, context)
            return self._enqueue(m, entry_id, kind, PendingMessage(message=owned(message)))

        return await self._command(plan, context)

    async def steer(self, message: Message, context: Context) -> str:
        """Queue `message` for the open run's next boundary (after the current tool batch, before
        the next request); returns its pre-minted entry id. `NoActiveOperation` when idle."""
        return await self._queue("steer", message, context, needs_operation=True)

    async def follow_up(self, message: Message, context: Context) -> str:
        """Queue `message` for when the open run would otherwise finish; `NoActiveOperation` when idle."""
        return await self._queue("follow_up", message, context, needs_operation=True)

    async def queue_next_run(self, message: Message, context: Context) -> str:
        """Queue `message` for the next accepted run, which places it before its own prompt (HA-18)."""
        return await self._queue("next_run", message, context, needs_operation=False)

    # -- abort ----------------------------------------------------------------------------------

    async def request_abort(self, cause: AbortCause, context: Context) -> AbortRequest:
        """Record a durable abort request for the open operation, with its cause (HA-5, CE-7).

        The lane's steer and follow-up items are drained into the request and kept stored until
        the operation settles. A repeated request changes nothing and says so. Raises
        `NoActiveOperation` when the lane is idle. Cancelling `context` is not an abort (HA-22)."""

        async def plan(m: SessionMutator) -> Decision[AbortRequest]:
            meta, state = self._meta, self._operation_state
            if meta is None or state is None:
                raise NoActiveOperation(f"lane {self.name} has no open operation to abort", lane=self.name)
            if isinstance(state.control, CancelRequested):
                return Decision(AbortRequest(meta.operation_id, False, (), ()), lambda _: [])
            steer, follow_up = self._state.ids_of("steer"), self._state.ids_of("follow_up")
            await self._load_inbox(m, context)
            control = CancelRequested(cause=cause, requested_at=now_ms(), drained_steer=steer,
                                      drained_follow_up=follow_up)
            new_state = state.model_copy(update={"control": control})
            lane_state = self._state.model_copy(
                update={"inbox": [i for i in self._state.inbox if i.kind not in ("steer", "follow_up")]})
            m.set(addresses.operation_state(meta.operation_id), new_state)
            m.set(addresses.lane_state(self.name), lane_state)

            def after(result: CommitResult | None) -> list[HarnessEvent]:
                self._operation_state, self._state = new_state, lane_state
                if self._drive is not None:
                    self._drive.on_abort()
                abort = OperationAbort(
                    lane=self.name, operation_id=meta.operation_id, cause=cause,
                    steer=tuple(queued_item(i, self._pending[i]) for i in steer),
                    follow_up=tuple(queued_item(i, self._pending[i]) for i in follow_up),
                )
                return [abort, self._queue_update()]

            return Decision(AbortRequest(meta.operation_id, True, tuple(steer), tuple(follow_up)), after)

        return await self._command(plan, context)

    # -- driving (issue: drive) ---------------------------------------------------------------------

    async def drive(self, expected_operation_id: str, context: Context, *, wait_for_retry: bool = True,
                    poll_deferred: bool = False) -> ResumeOutcome:
        """Drive operation `expected_operation_id` until it settles or waits, and return how.

        Fenced: another current operation raises `OperationMismatch`; an operation that already
        settled returns its result. A drive already running here is joined, not repeated.
        `wait_for_retry=False` returns `WaitingRetry` instead of waiting out a retry; with
        `poll_deferred` a deferred reply is fetched once. Cancelling `context` stops waiting for
        the outcome; it does not abort the run (HA-22: use `request_abort`)."""
        from harness.runtime.drive import RunDriver  # drive builds on this module: import at use

        async def plan(m: SessionMutator) -> Decision[RunDriver | Settled]:
            current = self._state.current_operation_id
            if self._drive is not None and self._drive.operation_id == expected_operation_id:
                driver = self._drive
            elif current == expected_operation_id:
                driver = RunDriver(self, expected_operation_id, Context(context.attributes))
            elif self._last_result is not None and self._last_result.operation_id == expected_operation_id:
                return Decision(Settled(operation_id=expected_operation_id, result=owned(self._last_result)),
                                lambda _: [])
            else:
                raise OperationMismatch(
                    f"operation {expected_operation_id} is not the current operation of lane {self.name}",
                    lane=self.name, expected_operation_id=expected_operation_id, current_operation_id=current,
                    last_operation_id=self._last_result.operation_id if self._last_result else None,
                )
            driver.wait_for_retry = driver.wait_for_retry and wait_for_retry
            driver.poll_permits += int(poll_deferred)
            if driver.task is None:
                self._drive = driver
                driver.task = asyncio.get_running_loop().create_task(driver.run())
            return Decision(driver, lambda _: [])

        claimed = await self._command(plan, context)
        if isinstance(claimed, Settled):
            return claimed
        assert claimed.task is not None
        waiter = asyncio.ensure_future(context.wait_cancelled())
        try:
            await asyncio.wait({claimed.task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not claimed.task.done():
            context.raise_if_cancelled()
        if claimed.task.cancelled():
            raise HarnessClosed("the harness closed while driving; the operation stays open for the next attachment",
                                operation_id=expected_operation_id)
        return owned(claimed.task.result())

    async def resume(self, context: Context) -> ResumeOutcome:
        """Continue the lane's current operation from its durable phase (after a crash, a retry
        wait or a deferred reply, which it polls once). `NothingToResume` when the lane is idle."""
        current = self._state.current_operation_id
        if current is None:
            raise NothingToResume(f"lane {self.name} has no operation to resume", lane=self.name)
        return await self.drive(current, context, poll_deferred=True)

    @overload
    async def prompt(self, text: str, images: Sequence[ImageContent] | None, context: Context) -> ResumeOutcome: ...

    @overload
    async def prompt(self, messages: Message | Sequence[Message], context: Context) -> ResumeOutcome: ...

    async def prompt(self, *args: Any, **kwargs: Any) -> ResumeOutcome:
        """Accept a run and drive it: `prompt(text, images, context)` or `prompt(messages, context)`
        (exactly these two shapes, HA-30)."""
        named = [kwargs.pop(name) for name in ("text", "messages", "images", "context") if name in kwargs]
        args = (*args, *named)
        if kwargs or len(args) not in (2, 3):
            raise InvalidMessage("prompt takes (text, images, context) or (messages, context)")
        context = args[-1]
        if len(args) == 3:
            request = PromptRequest(text=args[0], images=tuple(args[1] or ()))
        else:
            request = PromptRequest(messages=args[0])
        accepted = await self.accept(request, context)
        return await self.drive(accepted.operation_id, context)

    async def compact(self, context: Context, *, custom_instructions: str | None = None) -> ResumeOutcome:
        """Summarize the older part of the lane's branch into a compaction entry, keeping the newest
        messages verbatim, as an operation of its own; returns how it settled. Raises `LaneBusy`
        while another operation is open and `NothingToCompact` when the branch is too short."""
        settings = self._harness.options.drive

        async def plan(m: SessionMutator) -> Decision[str]:
            self._refuse_if_busy()
            entries = await branch_entries(m, self._tip_id, context)
            # No registry at acceptance (HA-16): refuse only a branch that is nothing but its
            # latest turn; how much is kept depends on the model, decided when it runs.
            if plan_compaction(entries, keep_recent_tokens=0) is None:
                raise NothingToCompact(f"lane {self.name} has nothing old enough to compact", lane=self.name)
            task = SummaryTask(task_id=new_id(), reason="manual", custom_instructions=custom_instructions)
            state = SummaryPending(task=task, config=self._config, result_entry_id=new_id(),
                                   max_attempts=settings.retry.max_retries + 1)
            return self._start_structural(m, CompactionIntent(custom_instructions=custom_instructions), state,
                                          lambda op: CompactionStart(lane=self.name, operation_id=op, reason="manual"))

        operation_id = await self._command(plan, context)
        return await self.drive(operation_id, context)

    async def navigate(self, target_entry_id: str | None, context: Context, *, summarize: bool = False,
                       label: str | None = None, custom_instructions: str | None = None) -> ResumeOutcome:
        """Move the lane's tip to `target_entry_id` (None: an empty branch), as an operation; with
        `summarize`, the branch being left is summarized into a branch-summary entry placed at the
        target first. `label` labels the target. Raises `LaneBusy` and `UnknownEntry`."""
        settings = self._harness.options.drive

        async def plan(m: SessionMutator) -> Decision[str]:
            self._refuse_if_busy()
            if target_entry_id is not None and await m.entry(target_entry_id, context) is None:
                raise UnknownEntry(f"entry {target_entry_id} does not exist", entry_id=target_entry_id)
            intent = NavigationIntent(target_id=target_entry_id, summarize=summarize, label=label,
                                      custom_instructions=custom_instructions)
            state: OperationState = NavigationReady(target_id=target_entry_id, label=label)
            if summarize:
                task = SummaryTask(task_id=new_id(), reason="navigation", custom_instructions=custom_instructions)
                state = SummaryPending(task=task, config=self._config, result_entry_id=new_id(),
                                       max_attempts=settings.retry.max_retries + 1)
            return self._start_structural(
                m, intent, state,
                lambda op: NavigationStart(lane=self.name, operation_id=op, target_id=target_entry_id))

        operation_id = await self._command(plan, context)
        return await self.drive(operation_id, context)

    def _refuse_if_too_large(self, what: str, messages: Sequence[Message]) -> None:
        """Refuse input that cannot fit the lane's model's context window even alone, next to the
        system prompt and the reply's reserve, by the estimate threshold compaction goes by: no
        compaction could ever make room for it (`PromptTooLarge`). Without a registry that knows
        the model nothing is checked and the step fails in-band (HA-23). Reading the registry here
        departs from HA-16 (acceptance reads no registry), for issue 10's "refuse before storing";
        moving the check to the doors that know the model is open work."""
        registry = self._harness.options.models
        if registry is None or not messages:
            return
        try:
            model = registry.model(self._config.model)
        except ModelUnavailable:
            return
        window = model.context_window
        reserve = self._harness.options.drive.compaction.for_window(window).reserve_tokens
        system = estimate_tokens((), self._harness.options.system_prompt or "")
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
        if self._state.current_operation_id is not None:
            raise LaneBusy(f"lane {self.name} is running operation {self._state.current_operation_id}",
                           lane=self.name, operation_id=self._state.current_operation_id)

    def _start_structural(self, m: SessionMutator, intent: CompactionIntent | NavigationIntent,
                          state: OperationState, start: Callable[[str], HarnessEvent]) -> Decision[str]:
        """Stage an accepted compaction or navigation: meta, first phase, lane state."""
        operation_id, started_at = new_id(), now_ms()
        meta = OperationMeta(operation_id=operation_id, lane=self.name, source_tip_id=self._tip_id,
                             started_at=started_at, intent=intent)
        lane_state = self._state.model_copy(update={"current_operation_id": operation_id})
        m.set(addresses.operation_meta(operation_id), meta)
        m.set(addresses.operation_state(operation_id), state)
        m.set(addresses.lane_state(self.name), lane_state)

        def after(result: CommitResult | None) -> list[HarnessEvent]:
            self._meta, self._operation_state, self._state = meta, state, lane_state
            return [RunStart(lane=self.name, operation_id=operation_id, kind=intent.kind, started_at=started_at),
                    start(operation_id)]

        return Decision(operation_id, after)

    # -- configuration --------------------------------------------------------------------------

    async def set_model(self, model: ModelIdentity, context: Context) -> None:
        """Configure the model for the lane's next steps; it is resolved only when one executes (HA-23)."""
        await self._configure(self._config.model_copy(update={"model": model}), "model", context)

    async def set_thinking_level(self, level: ThinkingLevel, context: Context) -> None:
        await self._configure(self._config.model_copy(update={"thinking_level": level}), "thinking_level", context)

    async def set_active_tools(self, tools: Sequence[str], context: Context) -> None:
        """Set the names of the tools the model may call; unknown names fail the next step in-band (HA-23)."""
        config = LaneConfig(model=self._config.model, thinking_level=self._config.thinking_level,
                            active_tools=list(tools))
        await self._configure(config, "active_tools", context)

    async def _configure(self, config: LaneConfig, field: str, context: Context) -> None:
        # Refuse bad input before the line: `model_copy(update=...)` validated nothing.
        try:
            LaneConfig.model_validate_json(config.model_dump_json(warnings="error"))
        except (ValidationError, PydanticSerializationError) as error:
            raise InvalidInput(f"invalid {field}: {describe_invalid(error)}", field=field) from None

        async def plan(m: SessionMutator) -> Decision[None]:
            previous = self._config
            m.set(addresses.lane_config(self.name), config)

            def after(result: CommitResult | None) -> list[HarnessEvent]:
                self._config = config
                return [ConfigUpdate.model_validate({
                    "lane": self.name, "field": field,
                    "previous": _config_value(previous, field), "value": _config_value(config, field),
                })]

            return Decision(None, after)

        await self._command(plan, context)

    # -- observation ----------------------------------------------------------------------------

    async def inspect_execution(self, context: Context) -> LaneExecutionInfo:
        """Observe the lane on the session line without writing or reading payloads (HA-6)."""

        async def plan(m: SessionMutator) -> Decision[LaneExecutionInfo]:
            info = LaneExecutionInfo(lane=self.name, tip_id=self._tip_id, configured_model=self._config.model,
                                     current=self._current(), last_result=owned(self._last_result))
            return Decision(info, lambda _: [])

        return await self._command(plan, context)

    async def watch(self, context: Context) -> LaneWatch:
        """Register a watcher and capture the lane's snapshot in one no-write job (HA-7).

        Events committed after the capture reach the watch; none before it does (HA-13). Raises
        `StorageCorruption` (and registers nothing) when a required payload is missing (HA-10)."""
        bus = self._harness._bus

        async def plan(m: SessionMutator) -> Decision[LaneWatch]:
            # Register and clone without yielding: a batch emitted before this point is in the
            # snapshot, one emitted after it is in the buffer (HA-13).
            watcher = bus.add_watcher(self.name, self._harness.options.watch_buffer_limit)
            live = self._presentation.clone()
            try:
                snapshot = await capture_snapshot(m, self._view(), live, context)
            except BaseException:
                bus.remove_watcher(watcher)
                raise
            return Decision(LaneWatch(snapshot, watcher, bus.remove_watcher), lambda _: [])

        return await self._command(plan, context)


_INPUT_NAMES: dict[InboxKind, str] = {"steer": "steer message", "follow_up": "follow-up",
                                     "next_run": "next-run message"}
"""How a refusal names queued input of each kind."""

T = TypeVar("T")


def owned(value: T) -> T:
    """A deep copy: what a caller passes in or gets back never aliases the projection (HA-10)."""
    return copy.deepcopy(value)


def captured_model(state: OperationState) -> ModelIdentity | None:
    """The model identity the current phase captured, if it holds one (HA-6)."""
    generation = getattr(state, "generation", None)
    if generation is not None:
        model: ModelIdentity = generation.config.model
        return model
    batch = getattr(state, "batch", None)
    if batch is not None:
        model = batch.config.model
        return model
    config = getattr(state, "config", None)
    return config.model if isinstance(config, LaneConfig) else None


def payload_of(message: Message) -> EntryPayload:
    if isinstance(message, CustomMessage):
        return CustomMessagePayload(message=message)
    return MessagePayload(message=message)


def pending_payload(pending: PendingEntry) -> EntryPayload:
    """The entry a queued message or custom write becomes when it is placed."""
    if isinstance(pending, PendingMessage):
        return payload_of(pending.message)
    return CustomPayload(custom_type=pending.custom_type, data=pending.data)


@dataclass
class Placement:
    """Entries staged in one commit as a chain from `parent`, each with its index among the
    commit's writes, so its `entry_added` carries its own seq."""

    parent: str | None
    staged: list[tuple[str, EntryPayload, int]] = field(default_factory=list)

    @property
    def tip(self) -> str | None:
        return self.staged[-1][0] if self.staged else self.parent

    def stage(self, m: SessionMutator, entry_id: str, payload: EntryPayload) -> None:
        position = m.staged
        m.insert_entry(payload, parent_id=self.tip, entry_id=entry_id)
        self.staged.append((entry_id, payload, position))

    def events(self, lane: str, result: CommitResult | None) -> list[HarnessEvent]:
        """`message_start`, `message_end` (for messages) and `entry_added` per placed entry."""
        assert result is not None or not self.staged
        events: list[HarnessEvent] = []
        parent = self.parent
        for entry_id, payload, position in self.staged:
            assert result is not None
            entry = Entry(id=entry_id, parent_id=parent, seq=result.seqs[position], timestamp=result.timestamp,
                          payload=payload)
            if isinstance(payload, MessagePayload | CustomMessagePayload):
                events += [MessageStart(lane=lane, message=payload.message),
                           MessageEnd(lane=lane, message=payload.message, entry_id=entry_id)]
            events.append(EntryAdded(lane=lane, entry=entry))
            parent = entry_id
        return events


def _config_value(config: LaneConfig, field: str) -> JsonValue:
    if field == "model":
        return config.model.model_dump()
    if field == "thinking_level":
        return config.thinking_level
    return list(config.active_tools)
