"""Lane snapshots: the bounded capture a watch performs (HA-7, HA-8, HA-10) and the one client fold
of a snapshot with the events that follow it (`reduce_lane_snapshot`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import JsonValue, TypeAdapter, ValidationError

from harness.context import Context
from harness.messages import AssistantMessage, ToolCall
from harness.providers.protocol import AssistantStreamAccumulator, StreamFrame
from harness.runtime.branch_context import branch_entries
from harness.runtime.errors import RebaseRequired
from harness.runtime.event_log import newest_event_seq
from harness.runtime.events import (
    DeferredHandle,
    EntryAdded,
    Fault,
    HarnessEvent,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    NavigationEnd,
    OperationAbort,
    PendingWrite,
    QueuedItem,
    Queues,
    QueueUpdate,
    RetryScheduled,
    RetryStart,
    RunEnd,
    RunResume,
    RunStart,
    RunSuspend,
    ToolEnd,
    ToolStart,
    ToolUpdate,
    event_lane,
)
from harness.runtime.types import (
    DeferredInfo,
    DrainedQueues,
    LaneSnapshot,
    OperationStatus,
    RetryInfo,
    RunningTool,
    SnapshotOperation,
)
from harness.session import (
    Answer,
    CompactionPayload,
    LaneLastResult,
    LaneState,
    ListItem,
    MessagePayload,
    ReadBatch,
    SessionReader,
    StorageCorruption,
    addresses,
)
from harness.session.records import (
    AssistantEffectPending,
    AssistantRetryWait,
    CancelRequested,
    DeferredEffectPending,
    DeferredSuspended,
    InboxItem,
    OperationMeta,
    OperationState,
    PendingCustom,
    PendingEntry,
    PendingMessage,
    RunTools,
    SummaryRetryWait,
)

_FRAMES = TypeAdapter(list[StreamFrame])
_FRAME_PAGES = 1000


@dataclass
class LanePresentation:
    """Live, not yet durable state of a lane's run: the streaming reply and running tools' latest
    progress, keyed by tool call id. Only execution writes it, with publish-then-emit (HA-14)."""

    streaming_message: AssistantMessage | None = None
    tool_progress: dict[str, JsonValue] = field(default_factory=dict)

    def clone(self) -> LanePresentation:
        return LanePresentation(copy.deepcopy(self.streaming_message), copy.deepcopy(self.tool_progress))


@dataclass(frozen=True)
class LaneView:
    """The projection a capture starts from; every field was published by a committed job."""

    lane: str
    tip_id: str | None
    state: LaneState
    last_result: LaneLastResult | None
    meta: OperationMeta | None
    operation_state: OperationState | None
    status: OperationStatus | None


async def capture_snapshot(
    reader: SessionReader, view: LaneView, live: LanePresentation, context: Context
) -> LaneSnapshot:
    """Read what the snapshot needs beyond the projection, exactly and boundedly (HA-8).

    Raises `StorageCorruption` when a required payload is missing or contradictory (HA-10); absent
    frames and checkpoints just leave the partial out."""
    transcript = await branch_entries(reader, view.tip_id, context)

    control = view.operation_state.control if view.operation_state is not None else None
    drained_ids = (
        [*control.drained_steer, *control.drained_follow_up] if isinstance(control, CancelRequested) else []
    )
    pending = await _read_pending(reader, [item.entry_id for item in view.state.inbox] + drained_ids, context)
    queues, writes = queues_of(view.state.inbox, pending)
    operation = None
    if view.meta is not None and view.operation_state is not None:
        operation = await _capture_operation(reader, view, pending, live, context)
    return LaneSnapshot(
        event_seq=await newest_event_seq(reader, view.lane, context),
        lane=view.lane,
        transcript=tuple(transcript),
        tip_id=view.tip_id,
        last_result=copy.deepcopy(view.last_result),
        operation=operation,
        queues=queues,
        pending_writes=writes,
    )


async def _read_pending(reader: SessionReader, ids: Sequence[str], context: Context) -> dict[str, PendingEntry]:
    found: dict[str, PendingEntry] = {}
    for entry_id in ids:
        value = await reader.get(addresses.pending_entry(entry_id), context)
        if value is None:
            raise StorageCorruption(f"queued entry {entry_id} has no stored payload", entry_id=entry_id)
        found[entry_id] = value
    return found


def queued_item(entry_id: str, pending: PendingEntry) -> QueuedItem:
    if not isinstance(pending, PendingMessage):
        raise StorageCorruption(f"queued entry {entry_id} is not a message", entry_id=entry_id)
    return QueuedItem(entry_id=entry_id, message=pending.message)


def pending_write(entry_id: str, pending: PendingEntry) -> PendingWrite:
    if isinstance(pending, PendingCustom):
        return PendingWrite(entry_id=entry_id, type="custom", custom_type=pending.custom_type, data=pending.data)
    return PendingWrite(entry_id=entry_id, type="message", message=pending.message)


def queues_of(
    inbox: Sequence[InboxItem], pending: Mapping[str, PendingEntry]
) -> tuple[Queues, tuple[PendingWrite, ...]]:
    """The queues and pending writes of an inbox, each in arrival order."""

    def items(kind: str) -> tuple[QueuedItem, ...]:
        return tuple(queued_item(i.entry_id, pending[i.entry_id]) for i in inbox if i.kind == kind)

    writes = tuple(pending_write(i.entry_id, pending[i.entry_id]) for i in inbox if i.kind == "write")
    return Queues(steer=items("steer"), follow_up=items("follow_up"), next_run=items("next_run")), writes


async def _capture_operation(
    reader: SessionReader,
    view: LaneView,
    pending: Mapping[str, PendingEntry],
    live: LanePresentation,
    context: Context,
) -> SnapshotOperation:
    assert view.meta is not None
    assert view.operation_state is not None
    assert view.status is not None
    meta, state = view.meta, view.operation_state
    operation_id = meta.operation_id
    retry = deferred = drained = streaming = None
    running: tuple[RunningTool, ...] = ()
    if isinstance(state.control, CancelRequested):
        drained = DrainedQueues(
            steer=tuple(queued_item(i, pending[i]) for i in state.control.drained_steer),
            follow_up=tuple(queued_item(i, pending[i]) for i in state.control.drained_follow_up),
        )
    match state:
        case AssistantRetryWait():
            retry = RetryInfo(attempt=state.next_attempt, max_attempts=state.generation.max_attempts,
                              next_attempt_at=state.not_before)
        case SummaryRetryWait():
            retry = RetryInfo(attempt=state.next_attempt, max_attempts=state.max_attempts,
                              next_attempt_at=state.not_before)
        case DeferredSuspended():
            deferred = DeferredInfo(handle=await _deferred_handle(reader, state.source_entry_id, context),
                                    poll=state.poll)
        case DeferredEffectPending():
            deferred = DeferredInfo(handle=await _deferred_handle(reader, state.source_entry_id, context),
                                    poll=state.poll)
            streaming = live.streaming_message or await frames_message(reader, operation_id, state, context)
        case AssistantEffectPending():
            streaming = live.streaming_message or await frames_message(reader, operation_id, state, context)
        case RunTools():
            running = await _running_tools(reader, operation_id, state, live, context)
        case _:
            pass
    return SnapshotOperation(
        id=operation_id,
        kind=meta.intent.kind,
        started_at=meta.started_at,
        status=view.status,
        retry=retry,
        deferred=deferred,
        drained=drained,
        streaming_message=streaming,
        running_tools=running,
    )


async def _assistant_entry(reader: SessionReader, entry_id: str, context: Context) -> AssistantMessage:
    entry = await reader.entry(entry_id, context)
    if entry is None or not isinstance(entry.payload, MessagePayload) or entry.payload.message.role != "assistant":
        raise StorageCorruption(f"entry {entry_id} should be an assistant reply and is not", entry_id=entry_id)
    message = entry.payload.message
    assert isinstance(message, AssistantMessage)
    return message


async def _deferred_handle(reader: SessionReader, source_entry_id: str, context: Context) -> DeferredHandle:
    message = await _assistant_entry(reader, source_entry_id, context)
    if message.stop_reason != "deferred" or not message.deferred_id:
        raise StorageCorruption(f"entry {source_entry_id} holds no deferred handle", entry_id=source_entry_id)
    return DeferredHandle(id=message.deferred_id, provider=message.provider, model_id=message.model, api=message.api)


class FrameReader:
    """The streaming reply of one response rebuilt from its persisted frame pages, read on from
    where the last read stopped: the pages only grow while the response is effect-pending, and
    are deleted with the commit that supersedes them."""

    def __init__(self, operation_id: str, state: AssistantEffectPending | DeferredEffectPending) -> None:
        self.operation_id = operation_id
        self.response_entry_id = state.response_entry_id
        self._address = addresses.assistant_frames(operation_id, state.response_entry_id)
        model = state.generation.config.model
        self._accumulator = AssistantStreamAccumulator(api="", provider=model.provider, model=model.model_id)
        self._accumulator.timestamp = 0  # replaced by the persisted start frame's timestamp
        self._after: int | None = None

    @classmethod
    def of(cls, operation_id: str | None, state: OperationState | None) -> FrameReader | None:
        """The reader of the response `state` streams, if it is one that streams."""
        if operation_id is None or not isinstance(state, AssistantEffectPending | DeferredEffectPending):
            return None
        return cls(operation_id, state)

    async def read(self, reader: SessionReader, context: Context) -> AssistantMessage | None:
        """The reply so far if pages were added since the last read (the first read: if any
        exist), else None. Raises `StorageCorruption` for a page that does not decode."""
        batch = reader.batch()
        pages = self.queue(batch)
        await batch.run(context)
        return await self.take(pages.value, reader, context)

    def queue(self, batch: ReadBatch) -> Answer[list[ListItem[dict[str, JsonValue]]]]:
        """Queue the read of the pages added since the last read on `batch`; give what it found
        to `take` once the batch has run."""
        return batch.read_list(self._address, after_seq=self._after, limit=_FRAME_PAGES)

    async def take(self, pages: list[ListItem[dict[str, JsonValue]]], reader: SessionReader,
                   context: Context) -> AssistantMessage | None:
        """`read`, from the pages a batch found (`queue`): reads on while a long reply has more than
        one read's worth."""
        while len(pages) % _FRAME_PAGES == 0 and pages:
            more = await reader.read_list(self._address, context, after_seq=pages[-1].seq, limit=_FRAME_PAGES)
            if not more:
                break
            pages += more
        if not pages:
            return None
        try:
            for page in pages:
                for frame in _FRAMES.validate_python(page.item.get("frames")):
                    self._accumulator.apply(frame)
        except (ValidationError, ValueError) as error:
            raise StorageCorruption(f"frames of response {self.response_entry_id} are unreadable: {error}",
                                    entry_id=self.response_entry_id) from error
        self._after = pages[-1].seq
        return self._accumulator.message("stop")


async def frames_message(
    reader: SessionReader,
    operation_id: str,
    state: AssistantEffectPending | DeferredEffectPending,
    context: Context,
) -> AssistantMessage | None:
    """The streaming reply of `state`'s response as its frames hold it; None when none is stored."""
    return await FrameReader(operation_id, state).read(reader, context)


async def _running_tools(
    reader: SessionReader, operation_id: str, state: RunTools, live: LanePresentation, context: Context
) -> tuple[RunningTool, ...]:
    batch = state.batch
    calls = [call for call in batch.calls if call.status == "effect_pending"]  # outcome-ready is not running (HA-28)
    if not calls:
        return ()
    message = await _assistant_entry(reader, batch.assistant_entry_id, context)
    running = []
    for call in calls:
        block = message.content[call.source_index] if 0 <= call.source_index < len(message.content) else None
        if not isinstance(block, ToolCall):  # HA-11: the index is into the full content list
            raise StorageCorruption(
                f"tool call {call.source_index} of entry {batch.assistant_entry_id} is not a tool call",
                entry_id=batch.assistant_entry_id,
            )
        args = await reader.get(addresses.tool_args(operation_id, batch.turn_id, call.source_index), context)
        if args is None:
            raise StorageCorruption(f"tool call {block.id} is under way but its arguments are not stored",
                                    entry_id=batch.assistant_entry_id)
        partial = live.tool_progress.get(block.id)
        if partial is None:
            partial = await reader.get(addresses.tool_checkpoint(operation_id, call.result_entry_id), context)
        running.append(RunningTool(tool_call_id=block.id, tool_name=block.name, args=args, partial_result=partial))
    return tuple(running)


def reduce_lane_snapshot(snapshot: LaneSnapshot, event: HarnessEvent) -> LaneSnapshot:
    """Fold one event into a snapshot: the one client fold (HA-9, HA-13).

    A snapshot folded with every event delivered after it equals a fresh snapshot of the same
    state. Events of other lanes and events that change nothing a snapshot shows return it as is.
    Raises `RebaseRequired` on `navigation_end`: the branch changed under the transcript. A
    durable event's `event_seq` becomes the snapshot's."""
    if getattr(event, "lane", snapshot.lane) != snapshot.lane:
        return snapshot
    folded = _fold(snapshot, event)
    if event.event_seq is None or event_lane(event) is None:
        return folded
    return folded.model_copy(update={"event_seq": event.event_seq})


def _fold(snapshot: LaneSnapshot, event: HarnessEvent) -> LaneSnapshot:
    operation = snapshot.operation
    match event:
        case RunStart():
            operation = SnapshotOperation(id=event.operation_id, kind=event.kind, started_at=event.started_at,
                                          status="open")
            return snapshot.model_copy(update={"operation": operation})
        case RunEnd():
            return snapshot.model_copy(update={"operation": None, "last_result": event.result})
        case EntryAdded():
            entry = event.entry
            transcript = (entry,) if isinstance(entry.payload, CompactionPayload) else (*snapshot.transcript, entry)
            return snapshot.model_copy(update={"transcript": transcript, "tip_id": entry.id})
        case QueueUpdate():
            return snapshot.model_copy(update={"queues": event.queues, "pending_writes": event.pending_writes})
        case NavigationEnd():
            raise RebaseRequired(f"lane {snapshot.lane} moved to another branch; take a new snapshot",
                                 lane=snapshot.lane)
        case Fault():
            return snapshot.model_copy(update={"faulted": True})
    if operation is None:
        return snapshot
    match event:
        case OperationAbort():
            drained = DrainedQueues(steer=event.steer, follow_up=event.follow_up)
            operation = operation.model_copy(update={"status": "aborting", "drained": drained})
        case MessageStart() | MessageUpdate() if isinstance(event.message, AssistantMessage):
            operation = operation.model_copy(update={"streaming_message": event.message})
        case MessageEnd() if isinstance(event.message, AssistantMessage):
            operation = operation.model_copy(update={"streaming_message": None})
        case ToolStart():
            tool = RunningTool(tool_call_id=event.tool_call_id, tool_name=event.tool_name, args=event.args)
            operation = operation.model_copy(update={"running_tools": (*operation.running_tools, tool)})
        case ToolUpdate():
            tools = tuple(t.model_copy(update={"partial_result": event.partial_result})
                          if t.tool_call_id == event.tool_call_id else t for t in operation.running_tools)
            operation = operation.model_copy(update={"running_tools": tools})
        case ToolEnd():
            tools = tuple(t for t in operation.running_tools if t.tool_call_id != event.tool_call_id)
            operation = operation.model_copy(update={"running_tools": tools})
        case RetryScheduled():
            retry = RetryInfo(attempt=event.attempt, max_attempts=event.max_attempts, next_attempt_at=event.not_before)
            operation = operation.model_copy(update={"retry": retry})
        case RetryStart():
            operation = operation.model_copy(update={"retry": None})
        case RunSuspend():
            operation = operation.model_copy(update={"deferred": DeferredInfo(handle=event.deferred, poll=event.poll)})
        case RunResume():
            operation = operation.model_copy(update={"deferred": None})
        case _:
            return snapshot
    return snapshot.model_copy(update={"operation": operation})
