"""Watch and event publication: snapshot plus gap-free events, listeners off the session line, the
bounded read set on written durable state, isolation, and the close and fault lifecycle
(HA-7 to HA-15, HA-22, HA-28).

White-box in the tests that say so: they read the bus's watchers, present live state and commit
through the harness's internal session line and `Decision`, which nothing public offers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from pydantic import JsonValue

from harness.context import Context
from harness.messages import (
    AssistantMessage,
    CustomMessage,
    ModelIdentity,
    TextContent,
    ToolCall,
    UserMessage,
    now_ms,
)
from harness.providers import (
    StartEvent,
    TextDeltaEvent,
    TextEndEvent,
    TextStartEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
)
from harness.providers.protocol import StreamFrame
from harness.runtime import (
    AgentHarness,
    DeferredHandle,
    DeferredInfo,
    DrainedQueues,
    EntryAdded,
    EventDelivery,
    HandlerError,
    HarnessClosed,
    HarnessEvent,
    HarnessFault,
    Lane,
    LaneSnapshot,
    LaneWatch,
    MessageUpdate,
    PendingWrite,
    PromptRequest,
    QueuedItem,
    Queues,
    QueueUpdate,
    RetryInfo,
    RunningTool,
    SnapshotOperation,
    reduce_lane_snapshot,
)
from harness.runtime.commit import Decision
from harness.runtime.snapshot import LanePresentation
from harness.session import (
    CompactionPayload,
    CustomPayload,
    LaneLastResult,
    LaneState,
    MessagePayload,
    OperationErrorRecord,
    OwnershipLost,
    Session,
    SessionMutator,
    StorageCorruption,
    Store,
    addresses,
)
from harness.session.records import (
    AssistantEffectPending,
    AssistantRetryWait,
    CancelRequested,
    DeferredEffectPending,
    DeferredSuspended,
    GenerationContext,
    InboxItem,
    OperationMeta,
    OperationState,
    PendingCustom,
    PendingEntry,
    PendingMessage,
    RunIntent,
    RunStarting,
    RunTools,
    ToolBatch,
    ToolCallState,
)
from harness_helpers import RecordingBackend, attach, harness_with_lane, record_events, recording, said
from journal_helpers import CONFIG, append_chain, new_session_with_lane

T = TypeVar("T")

OTHER_MODEL = ModelIdentity(provider="other", model_id="bigger")


# -- helpers ------------------------------------------------------------------------------------


class BlockingListener:
    """A listener that blocks inside delivery of the first event of type `block_on` (any type when
    None) until `release` is set; `entered` is set once it is blocked. Records what it saw."""

    def __init__(self, block_on: str | None = None) -> None:
        self.block_on = block_on
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.seen: list[HarnessEvent] = []

    async def __call__(self, event: HarnessEvent, context: Context) -> None:
        self.seen.append(event)
        if not self.entered.is_set() and self.block_on in (None, event.type):
            self.entered.set()
            await self.release.wait()


def start(call: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Start `call` as a task. Every public call reaches the session line in its task's first step,
    without yielding, so the jobs of calls started one after another run on the line in that order."""
    return asyncio.ensure_future(call)


def fold(snapshot: LaneSnapshot, deliveries: Sequence[EventDelivery]) -> LaneSnapshot:
    for delivery in deliveries:
        snapshot = reduce_lane_snapshot(snapshot, delivery.event)
    return snapshot


async def fresh_snapshot(lane: Lane, ctx: Context) -> LaneSnapshot:
    watch = await lane.watch(ctx)
    watch.close()
    return watch.snapshot


def types_of(deliveries: Sequence[EventDelivery]) -> list[str]:
    return [delivery.event.type for delivery in deliveries]


def watcher_count(harness: AgentHarness) -> int:
    # White-box: nothing public tells whether the bus still buffers for a watcher that failed.
    return len(harness._bus._watchers)


# -- watcher first, publication first (HA-7, HA-13) ---------------------------------------------


async def test_watcher_first_gets_snapshot_before_and_the_complete_batch(store: Store, ctx: Context) -> None:
    """HA-13: a watch registered before a commit shows the state before it, then buffers the
    commit's whole batch, in order, and the fold of both is the state after."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    queued = await lane.queue_next_run(said("queued earlier"), ctx)
    watch = await lane.watch(ctx)

    accepted = await lane.accept(PromptRequest(text="now"), ctx)

    assert watch.snapshot.operation is None
    assert watch.snapshot.transcript == ()
    assert [item.entry_id for item in watch.snapshot.queues.next_run] == [queued]
    deliveries = watch.buffered()
    assert types_of(deliveries) == [
        "run_start",
        "message_start", "message_end", "entry_added",  # the captured next-run message
        "message_start", "message_end", "entry_added",  # the prompt
        "queue_update",
    ]
    folded = fold(watch.snapshot, deliveries)
    assert folded == await fresh_snapshot(lane, ctx)
    assert folded.operation is not None
    assert folded.operation.id == accepted.operation_id
    await harness.close(ctx)


async def test_publication_first_gives_snapshot_after_and_no_old_event(store: Store, ctx: Context) -> None:
    """HA-13: a watch taken after a commit shows its state and replays none of its events, nor any
    earlier lifecycle event."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    accepted = await lane.accept(PromptRequest(text="now"), ctx)
    await lane.steer(said("faster"), ctx)

    watch = await lane.watch(ctx)

    assert watch.buffered() == []
    assert watch.snapshot.operation is not None
    assert watch.snapshot.operation.id == accepted.operation_id
    assert [item.message for item in watch.snapshot.queues.steer] == [said("faster")]
    await harness.close(ctx)


async def test_a_watcher_registered_after_emit_but_before_delivery_receives_nothing_of_that_batch(
    store: Store, ctx: Context
) -> None:
    """HA-13: recipients are bound at `emit_batch`. While a listener still holds the batch's
    delivery, a new watch shows the committed state and buffers nothing of that batch; it does
    get the next one."""
    gate = BlockingListener()
    harness = await harness_with_lane(store, ctx, listeners=[gate])
    lane = harness.lane("main")
    appending = start(lane.append_message(said("first"), ctx))
    await gate.entered.wait()

    watch = await lane.watch(ctx)

    assert [entry.payload for entry in watch.snapshot.transcript] == [MessagePayload(message=said("first"))]
    assert watch.buffered() == []
    assert not appending.done()  # the public call still awaits its delivery
    gate.release.set()
    await appending
    assert watch.buffered() == []
    await lane.append_message(said("second"), ctx)
    assert types_of(watch.buffered()) == ["message_start", "message_end", "entry_added"]
    await harness.close(ctx)


async def test_first_watch_and_reconnect_take_the_same_bounded_reads(store: Store, ctx: Context) -> None:
    """HA-7: there is no hydrated cache; a reconnect reads exactly what the first watch read and
    sees the same snapshot, and a reconnect after commits equals the first watch folded."""
    session = await new_session_with_lane(store, ctx)
    await append_chain(session, ["old", "summary", "kept"], ctx, compaction_at={1})
    watched, backend = recording(store)
    harness, _ = await attach(await watched.open_session(session.id, ctx), ctx)
    lane = harness.lane("main")
    await lane.queue_next_run(said("later"), ctx)
    backend.reads.clear()

    first = await lane.watch(ctx)
    first_reads, backend.reads[:] = list(backend.reads), []
    second = await lane.watch(ctx)

    assert first_reads
    assert backend.reads == first_reads
    assert second.snapshot == first.snapshot
    await lane.accept(PromptRequest(text="go"), ctx)
    await lane.append_message(said("while busy"), ctx)
    third = await lane.watch(ctx)
    assert fold(first.snapshot, first.buffered()) == third.snapshot
    assert fold(second.snapshot, second.buffered()) == third.snapshot
    await harness.close(ctx)


# -- every committing job publishes in its continuation (HA-12, HA-15) ---------------------------

Commit = Callable[[AgentHarness, Lane, Context], Coroutine[Any, Any, object]]


@dataclass(frozen=True)
class CommitKind:
    busy: bool  # whether the lane has an open operation first
    batch: tuple[str, ...]  # the event types the commit emits to a watcher of the lane
    commit: Commit


async def _label_tip(harness: AgentHarness, lane: Lane, ctx: Context) -> None:
    assert lane.tip_id is not None
    await harness.set_entry_label(lane.tip_id, "bookmark", ctx)


PLACED = ("message_start", "message_end", "entry_added")
COMMITS: dict[str, CommitKind] = {
    "accept": CommitKind(False, ("run_start", *PLACED, *PLACED, "queue_update"),
                         lambda h, lane, c: lane.accept(PromptRequest(text="go"), c)),
    "idle append": CommitKind(False, PLACED, lambda h, lane, c: lane.append_message(said("note"), c)),
    "idle custom append": CommitKind(False, ("entry_added",),
                                     lambda h, lane, c: lane.append_custom("app.state", {"n": 1}, c)),
    "pending append": CommitKind(True, ("queue_update",), lambda h, lane, c: lane.append_message(said("note"), c)),
    "pending custom append": CommitKind(True, ("queue_update",),
                                        lambda h, lane, c: lane.append_custom("app.state", {"n": 1}, c)),
    "queue next run": CommitKind(False, ("queue_update",), lambda h, lane, c: lane.queue_next_run(said("n"), c)),
    "steer": CommitKind(True, ("queue_update",), lambda h, lane, c: lane.steer(said("s"), c)),
    "follow up": CommitKind(True, ("queue_update",), lambda h, lane, c: lane.follow_up(said("f"), c)),
    "request abort": CommitKind(True, ("operation_abort", "queue_update"),
                                lambda h, lane, c: lane.request_abort("user", c)),
    "set model": CommitKind(False, ("config_update",), lambda h, lane, c: lane.set_model(OTHER_MODEL, c)),
    "set thinking level": CommitKind(False, ("config_update",),
                                     lambda h, lane, c: lane.set_thinking_level("high", c)),
    "set active tools": CommitKind(False, ("config_update",),
                                   lambda h, lane, c: lane.set_active_tools(["read", "grep"], c)),
    "set session name": CommitKind(False, ("value_update",), lambda h, lane, c: h.set_session_name("renamed", c)),
    "set entry label": CommitKind(False, ("value_update",), _label_tip),
}


async def _lane_for(kind: CommitKind, store: Store, ctx: Context) -> tuple[AgentHarness, Lane]:
    """A lane with an entry and a queued next-run item; when `kind.busy`, also an open run with a
    queued steer and follow-up."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    await lane.append_message(said("hello"), ctx)
    await lane.queue_next_run(said("queued"), ctx)
    if kind.busy:
        await lane.accept(PromptRequest(text="run"), ctx)
        await lane.steer(said("queued steer"), ctx)
        await lane.follow_up(said("queued follow-up"), ctx)
    return harness, lane


@pytest.mark.parametrize("watch_first", [True, False], ids=["watch first", "commit first"])
@pytest.mark.parametrize("name", list(COMMITS))
async def test_a_commit_racing_a_watch_leaves_no_gap_and_no_duplicate(
    store: Store, ctx: Context, name: str, watch_first: bool
) -> None:
    """HA-12, HA-13, HA-15: every event-producing commit publishes its state and binds its batch
    in its commit continuation. Watch queued first on the line: snapshot-before plus the complete
    batch. Commit queued first: snapshot-after and nothing of it. Either way the fold is the state."""
    kind = COMMITS[name]
    harness, lane = await _lane_for(kind, store, ctx)
    before = await fresh_snapshot(lane, ctx)

    if watch_first:
        watching = start(lane.watch(ctx))
        committing = start(kind.commit(harness, lane, ctx))
    else:
        committing = start(kind.commit(harness, lane, ctx))
        watching = start(lane.watch(ctx))
    watch, _ = await asyncio.gather(watching, committing)

    deliveries = watch.buffered()
    now = await fresh_snapshot(lane, ctx)
    assert tuple(types_of(deliveries)) == (kind.batch if watch_first else ())
    assert watch.snapshot == (before if watch_first else now)
    assert fold(watch.snapshot, deliveries) == now
    await harness.close(ctx)


async def test_a_committing_job_publishes_its_projection_before_the_line_is_released(
    store: Store, ctx: Context
) -> None:
    """HA-12: the next job on the line already sees the committed operation and configuration."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")

    accepted, info = await asyncio.gather(start(lane.accept(PromptRequest(text="go"), ctx)),
                                          start(lane.inspect_execution(ctx)))
    _, configured = await asyncio.gather(start(lane.set_model(OTHER_MODEL, ctx)), start(lane.inspect_execution(ctx)))

    assert info.current is not None
    assert info.current.id == accepted.operation_id
    assert configured.configured_model == OTHER_MODEL
    await harness.close(ctx)


async def test_a_blocked_listener_does_not_hold_the_session_line(store: Store, ctx: Context) -> None:
    """HA-12: the mutation returns without awaiting delivery. While a listener blocks, later
    commits on the line land and are observable; the public calls wait for their delivery."""
    gate = BlockingListener()
    harness = await harness_with_lane(store, ctx, listeners=[gate])
    lane = harness.lane("main")
    appending = start(lane.append_message(said("first"), ctx))
    await gate.entered.wait()

    renaming, reading = start(harness.set_session_name("renamed", ctx)), start(harness.session_name(ctx))
    configuring, inspecting = start(lane.set_model(OTHER_MODEL, ctx)), start(lane.inspect_execution(ctx))

    assert await reading == "renamed"
    assert (await inspecting).configured_model == OTHER_MODEL
    assert [task.done() for task in (appending, renaming, configuring)] == [False, False, False]
    gate.release.set()
    await asyncio.gather(appending, renaming, configuring)
    assert [event.type for event in gate.seen] == [
        "message_start", "message_end", "entry_added", "value_update", "config_update"]
    await harness.close(ctx)


async def test_a_failing_listener_is_reported_as_handler_error_and_the_commit_stands(
    store: Store, ctx: Context
) -> None:
    """HA-12: a listener's exception never reaches the committing caller; it becomes a
    `handler_error` event for the other listeners and watchers."""

    def failing(event: HarnessEvent, context: Context) -> None:
        raise RuntimeError(f"cannot handle {event.type}")

    harness = await harness_with_lane(store, ctx, listeners=[failing])
    lane = harness.lane("main")
    seen = record_events(harness)
    watch = await lane.watch(ctx)

    entry_id = await lane.append_message(said("hello"), ctx)
    await harness.close(ctx)  # delivers what is still queued

    assert lane.tip_id == entry_id
    errors = [event for event in seen if isinstance(event, HandlerError)]
    assert errors == [
        HandlerError(event_type=kind, error=f"RuntimeError: cannot handle {kind}") for kind in PLACED
    ]
    assert [event.type for event in seen if not isinstance(event, HandlerError)] == list(PLACED)
    assert types_of([d async for d in watch]) == [*PLACED, *["handler_error"] * 3]


async def test_value_update_binds_its_recipients_in_the_commit_continuation(store: Store, ctx: Context) -> None:
    """HA-13, HA-15: `set_session_name` binds its recipients when it commits. With delivery held
    up by an earlier batch, a listener or watcher added after the commit but before its
    `value_update` is delivered never receives it; they do get later events."""
    gate = BlockingListener()
    harness = await harness_with_lane(store, ctx, listeners=[gate])
    lane = harness.lane("main")
    appending = start(lane.append_message(said("first"), ctx))
    await gate.entered.wait()
    renaming, reading = start(harness.set_session_name("renamed", ctx)), start(harness.session_name(ctx))
    assert await reading == "renamed"  # committed, and its batch is queued behind the blocked one

    late = record_events(harness)
    watch = await lane.watch(ctx)
    gate.release.set()
    await asyncio.gather(appending, renaming)

    assert late == []
    assert watch.buffered() == []
    assert [event.type for event in gate.seen] == [*PLACED, "value_update"]
    await harness.set_session_name("again", ctx)
    assert [event.type for event in late] == ["value_update"]
    assert types_of(watch.buffered()) == ["value_update"]
    await harness.close(ctx)


async def test_lane_created_binds_its_recipients_in_the_commit_continuation(store: Store, ctx: Context) -> None:
    """HA-15: `lane_created` is emitted in `Session.create_lane`'s commit continuation: once the
    creation committed the lane is published, and a listener added before the (held up) delivery
    of `lane_created` never gets it; `create_lane` returns only after that delivery."""
    gate = BlockingListener()
    harness = await harness_with_lane(store, ctx, listeners=[gate])
    appending = start(harness.lane("main").append_message(said("first"), ctx))
    await gate.entered.wait()
    creating, reading = start(harness.create_lane("side", CONFIG, ctx)), start(harness.session_name(ctx))
    await reading  # the creation's job ran before this one

    late = record_events(harness)
    published = harness.lane("side")
    watch = await published.watch(ctx)
    assert not creating.done()
    gate.release.set()
    _, created = await asyncio.gather(appending, creating)

    assert created is published
    assert late == []
    assert watch.buffered() == []
    assert [event.type for event in gate.seen] == [*PLACED, "lane_created"]
    await created.append_message(said("on side"), ctx)
    assert [event.type for event in late] == list(PLACED)
    await harness.close(ctx)


# -- the bounded read set on written durable state (HA-8, HA-9, HA-11, HA-28) --------------------

OP = "op-1"
TURN = "turn-2"
GENERATION = GenerationContext(step_id="step-1", trigger_entry_id=None, config=CONFIG, max_attempts=5)
EFFECT = AssistantEffectPending(generation=GENERATION, attempt=1, response_entry_id="resp-entry", usage_id="u1")
TOOLS_REPLY = AssistantMessage(
    content=[
        TextContent(text="Let me look."),                                      # 0
        ToolCall(id="call-a", name="read", arguments={"path": "a.txt"}),       # 1 effect_pending
        ToolCall(id="call-b", name="read", arguments={"path": "b.txt"}),       # 2 outcome_ready
        TextContent(text="And search."),                                       # 3
        ToolCall(id="call-c", name="grep", arguments={"pattern": "TODO"}),     # 4 effect_pending
        ToolCall(id="call-d", name="write", arguments={"path": "c.txt"}),      # 5 planned
        ToolCall(id="call-e", name="read", arguments={"path": "e.txt"}),       # 6 completed
    ],
    api="faux", provider="p", model="m", stop_reason="tool_use", timestamp=1,
)
CALLS = [
    ToolCallState(source_index=1, result_entry_id="result-a", status="effect_pending"),
    ToolCallState(source_index=2, result_entry_id="result-b", status="outcome_ready"),
    ToolCallState(source_index=4, result_entry_id="result-c", status="effect_pending"),
    ToolCallState(source_index=5, result_entry_id="result-d", status="planned"),
    ToolCallState(source_index=6, result_entry_id="result-e", status="completed"),
]
DEFERRED_REPLY = AssistantMessage(content=[], api="anthropic-messages", provider="anthropic", model="claude-x",
                                  stop_reason="deferred", deferred_id="deferred-7", timestamp=1)


def frame_page(*frames: StreamFrame) -> dict[str, JsonValue]:
    return {"frames": [frame.model_dump(mode="json") for frame in frames]}


FIRST_PAGE = frame_page(StartEvent(api="faux", provider="p", model="m", response_id="resp-1"),
                        TextStartEvent(content_index=0), TextDeltaEvent(content_index=0, delta="Hel"))
SECOND_PAGE = frame_page(TextDeltaEvent(content_index=0, delta="lo"), TextEndEvent(content_index=0),
                         ToolCallStartEvent(content_index=1, id="call-z", name="read"),
                         ToolCallDeltaEvent(content_index=1, delta='{"path": "z'))

Stage = Callable[[SessionMutator], None]


@dataclass
class Written:
    """A session whose lane `main` has durable state written directly, as another process left it."""

    session: Session
    tip: str  # the lane's branch tip
    compaction: str  # the newest compaction entry (where the transcript starts)
    source: str | None  # the tools-phase or deferred source assistant entry, when one is written


async def write_lane(
    store: Store, ctx: Context, *, state: OperationState | None, inbox: Sequence[InboxItem] = (),
    pending: dict[str, PendingEntry] | None = None, source: AssistantMessage | None = None,
    extra: Stage | None = None, last_result: LaneLastResult | None = None,
) -> Written:
    """History with a compaction, then (optionally) an assistant `source` entry as the tip, operation
    `OP` in `state`, the inbox and its pending payloads, and whatever `extra` stages."""
    session = await new_session_with_lane(store, ctx)
    history = await append_chain(session, ["long ago", "summary so far", "question"], ctx, compaction_at={1})

    async def job(m: SessionMutator) -> Written:
        tip = history[-1]
        source_id = None
        if source is not None:
            source_id = tip = m.insert_entry(MessagePayload(message=source), parent_id=tip, entry_id="source")
        m.set(addresses.branch_tip("main"), tip)
        if state is not None:
            m.set(addresses.operation_meta(OP), OperationMeta(
                operation_id=OP, lane="main", source_tip_id=history[1], started_at=1234,
                intent=RunIntent(prompt_entry_ids=[history[-1]])))
            m.set(addresses.operation_state(OP), state)
        m.set(addresses.lane_state("main"), LaneState(current_operation_id=OP if state is not None else None,
                                                      inbox=list(inbox)))
        for entry_id, value in (pending or {}).items():
            m.set(addresses.pending_entry(entry_id), value)
        if last_result is not None:
            m.set(addresses.lane_last_result("main"), last_result)
        if extra is not None:
            extra(m)
        return Written(session, tip, history[1], source_id)

    return await session.mutate(job, ctx)


def tools_state() -> RunTools:
    return RunTools(batch=ToolBatch(assistant_entry_id="source", turn_id=TURN, config=CONFIG, calls=CALLS))


def put_args(m: SessionMutator, turn: str, index: int, args: dict[str, JsonValue]) -> None:
    m.set(addresses.tool_args(OP, turn, index), args)


def put_checkpoint(m: SessionMutator, result_entry_id: str, partial: JsonValue) -> None:
    m.set(addresses.tool_checkpoint(OP, result_entry_id), partial)


def tool_records(m: SessionMutator) -> None:
    """Args of every called tool under the batch's turn, a decoy under another turn, and a
    checkpoint for call-a (and for the outcome-ready call-b, which must not be shown)."""
    put_args(m, TURN, 1, {"path": "a.txt", "effective": True})
    put_args(m, "turn-1", 1, {"path": "decoy"})
    put_args(m, TURN, 2, {"path": "b.txt"})
    put_args(m, TURN, 4, {"pattern": "TODO"})
    put_checkpoint(m, "result-a", {"lines_read": 10})
    put_checkpoint(m, "result-b", {"lines_read": 99})


async def watch_written(store: Store, written: Written, ctx: Context) -> tuple[AgentHarness, LaneWatch]:
    harness, _ = await attach(written.session, ctx)
    return harness, await harness.lane("main").watch(ctx)


def transcript_texts(snapshot: LaneSnapshot) -> list[str]:
    texts = []
    for entry in snapshot.transcript:
        if isinstance(entry.payload, CompactionPayload):
            texts.append(f"compaction: {entry.payload.summary}")
        elif isinstance(entry.payload, MessagePayload) and isinstance(entry.payload.message, UserMessage):
            texts.append(str(entry.payload.message.content))
        else:
            texts.append(entry.payload.type)
    return texts


async def test_tools_phase_shows_effect_pending_calls_with_args_and_checkpoints(store: Store, ctx: Context) -> None:
    """HA-8, HA-9, HA-11, HA-28: running tools are the effect-pending calls, found by their index
    in the full content list, with args read under the batch's turn id and the checkpoint when one
    exists; outcome-ready, planned and completed calls are not running."""
    written = await write_lane(store, ctx, state=tools_state(), source=TOOLS_REPLY, extra=tool_records)

    harness, watch = await watch_written(store, written, ctx)

    assert watch.snapshot.operation == SnapshotOperation(
        id=OP, kind="run", started_at=1234, status="open",
        running_tools=(
            RunningTool(tool_call_id="call-a", tool_name="read", args={"path": "a.txt", "effective": True},
                        partial_result={"lines_read": 10}),
            RunningTool(tool_call_id="call-c", tool_name="grep", args={"pattern": "TODO"}),
        ),
    )
    assert transcript_texts(watch.snapshot) == ["compaction: summary so far", "question", "message"]
    assert watch.snapshot.tip_id == written.tip == "source"
    await harness.close(ctx)


async def test_a_watch_reads_exactly_the_bounded_set(store: Store, ctx: Context) -> None:
    """HA-8: one branch scan from the tip, the exact pending entries of the inbox and of the abort
    drain, the tools-phase entry, args of effect-pending calls and their optional checkpoints;
    nothing else, nothing for the outcome-ready call."""
    inbox = [InboxItem(entry_id="steer-1", kind="steer"), InboxItem(entry_id="write-1", kind="write")]
    pending: dict[str, PendingEntry] = {"steer-1": PendingMessage(message=said("steer")),
                                        "write-1": PendingCustom(custom_type="app", data=None)}
    pending["drained-f"] = PendingMessage(message=said("drained follow-up"))
    aborting = tools_state().model_copy(
        update={"control": CancelRequested(cause="user", requested_at=1, drained_follow_up=["drained-f"])})
    written = await write_lane(store, ctx, state=aborting, source=TOOLS_REPLY, extra=tool_records,
                               inbox=inbox, pending=pending)
    watched, backend = recording(store)
    harness, _ = await attach(await watched.open_session(written.session.id, ctx), ctx)
    backend.reads.clear()

    await harness.lane("main").watch(ctx)

    assert backend.reads == [
        ("branch", "source"),
        ("value", "harness.pending.entry", "steer-1"),
        ("value", "harness.pending.entry", "write-1"),
        ("value", "harness.pending.entry", "drained-f"),
        ("entries", "source"),
        ("value", "harness.op.tool_args", f"{OP}:{TURN}:1"),
        ("value", "harness.pending.tool_output", f"{OP}:result-a"),
        ("value", "harness.op.tool_args", f"{OP}:{TURN}:4"),
        ("value", "harness.pending.tool_output", f"{OP}:result-c"),
    ]
    await harness.close(ctx)


async def test_effect_pending_shows_the_reply_rebuilt_from_its_frame_pages(store: Store, ctx: Context) -> None:
    """HA-8, HA-9: the streaming message is rebuilt from every persisted frame page of the reserved
    response; a call whose argument text is still open keeps it raw."""
    def frames(m: SessionMutator) -> None:
        m.append(addresses.assistant_frames(OP, "resp-entry"), FIRST_PAGE)
        m.append(addresses.assistant_frames(OP, "resp-entry"), SECOND_PAGE)
        m.append(addresses.assistant_frames(OP, "other-response"), frame_page(TextStartEvent(content_index=0)))

    harness, watch = await watch_written(store, await write_lane(store, ctx, state=EFFECT, extra=frames), ctx)

    operation = watch.snapshot.operation
    assert operation is not None
    assert operation.streaming_message is not None
    message = operation.streaming_message
    assert (message.api, message.provider, message.model, message.response_id) == ("faux", "p", "m", "resp-1")
    assert message.content == [TextContent(text="Hello"),
                               ToolCall(id="call-z", name="read", arguments={}, raw_arguments='{"path": "z')]
    assert (operation.retry, operation.deferred, operation.drained, operation.running_tools) == (None, None, None, ())
    await harness.close(ctx)


async def test_a_reply_rebuilt_from_frames_is_the_same_on_every_reconnect(store: Store, ctx: Context) -> None:
    """HA-7, HA-13: a snapshot is a function of the durable and live state, not of the time it was
    taken: with nothing committed in between, a reconnect equals the first snapshot (folded with
    its empty buffer), even when the streaming reply is rebuilt from frame pages."""
    harness, first = await watch_written(store, await write_lane(store, ctx, state=EFFECT, extra=_frames(FIRST_PAGE)),
                                         ctx)
    tick = now_ms()
    while now_ms() == tick:  # let the wall clock move on; no event marks that
        pass

    second = await harness.lane("main").watch(ctx)

    assert first.buffered() == []
    assert second.snapshot == first.snapshot
    await harness.close(ctx)


async def test_a_long_reply_is_rebuilt_from_all_of_its_frame_pages(store: Store, ctx: Context) -> None:
    """HA-8: every page of the reserved response counts, however many a long reply persisted;
    a reconnect must not show a silently truncated reply."""
    pages = 1_200

    def frames(m: SessionMutator) -> None:
        m.append(addresses.assistant_frames(OP, "resp-entry"), FIRST_PAGE)
        page = frame_page(TextDeltaEvent(content_index=0, delta="x"))
        for _ in range(pages):
            m.append(addresses.assistant_frames(OP, "resp-entry"), page)

    harness, watch = await watch_written(store, await write_lane(store, ctx, state=EFFECT, extra=frames), ctx)

    operation = watch.snapshot.operation
    assert operation is not None
    assert operation.streaming_message is not None
    assert operation.streaming_message.content == [TextContent(text="Hel" + "x" * pages)]
    await harness.close(ctx)


async def test_absent_frames_and_checkpoints_just_omit_the_partials(store: Store, ctx: Context) -> None:
    """HA-10: frames and checkpoints are optional; without them there is no streaming message and
    no partial result, and the watch succeeds."""
    def args_only(m: SessionMutator) -> None:
        put_args(m, TURN, 1, {"path": "a.txt"})
        put_args(m, TURN, 4, {"pattern": "TODO"})

    harness, streaming = await watch_written(store, await write_lane(store, ctx, state=EFFECT), ctx)
    tools_harness, tools = await watch_written(
        store, await write_lane(store, ctx, state=tools_state(), source=TOOLS_REPLY, extra=args_only), ctx)

    assert streaming.snapshot.operation is not None
    assert streaming.snapshot.operation.streaming_message is None
    assert tools.snapshot.operation is not None
    assert [tool.partial_result for tool in tools.snapshot.operation.running_tools] == [None, None]
    await harness.close(ctx)
    await tools_harness.close(ctx)


async def test_retry_wait_shows_the_next_attempt_and_its_time(store: Store, ctx: Context) -> None:
    """HA-9: retry {attempt, max_attempts, next_attempt_at} from the durable retry wait."""
    state = AssistantRetryWait(generation=GENERATION, next_attempt=2, not_before=1_700_000_000_000,
                               error_message="overloaded")

    harness, watch = await watch_written(store, await write_lane(store, ctx, state=state), ctx)

    assert watch.snapshot.operation is not None
    assert watch.snapshot.operation.retry == RetryInfo(attempt=2, max_attempts=5, next_attempt_at=1_700_000_000_000)
    assert watch.snapshot.operation.streaming_message is None
    await harness.close(ctx)


async def test_deferred_suspension_shows_the_handle_from_its_source_entry(store: Store, ctx: Context) -> None:
    """HA-8, HA-9, HA-27: deferred {handle, poll}, the handle read from the exact source entry."""
    state = DeferredSuspended(generation=GENERATION, source_entry_id="source", poll=3)

    harness, watch = await watch_written(
        store, await write_lane(store, ctx, state=state, source=DEFERRED_REPLY), ctx)

    assert watch.snapshot.operation is not None
    assert watch.snapshot.operation.deferred == DeferredInfo(
        handle=DeferredHandle(id="deferred-7", provider="anthropic", model_id="claude-x", api="anthropic-messages"),
        poll=3)
    await harness.close(ctx)


async def test_deferred_redemption_shows_the_handle_and_the_streaming_reply(store: Store, ctx: Context) -> None:
    """HA-8, HA-9: a deferred fetch in flight shows both the handle and the frames so far."""
    state = DeferredEffectPending(generation=GENERATION, source_entry_id="source", poll=4,
                                  response_entry_id="resp-entry", usage_id="u1")

    def frames(m: SessionMutator) -> None:
        m.append(addresses.assistant_frames(OP, "resp-entry"), FIRST_PAGE)

    harness, watch = await watch_written(
        store, await write_lane(store, ctx, state=state, source=DEFERRED_REPLY, extra=frames), ctx)

    operation = watch.snapshot.operation
    assert operation is not None
    assert operation.deferred is not None
    assert operation.streaming_message is not None
    assert operation.deferred.poll == 4
    assert operation.streaming_message.content == [TextContent(text="Hel")]
    await harness.close(ctx)


async def test_queues_writes_drained_items_and_last_result_are_exact(store: Store, ctx: Context) -> None:
    """HA-8, HA-9: an aborting operation shows its drained steer/follow-up payloads; the lane's
    queues and pending writes come from the exact pending entries, in arrival order; the last
    result and the compaction-bounded transcript are as stored."""
    control = CancelRequested(cause="user", requested_at=9, drained_steer=["drained-s"],
                              drained_follow_up=["drained-f"])
    inbox = [InboxItem(entry_id="write-1", kind="write"), InboxItem(entry_id="next-1", kind="next_run"),
             InboxItem(entry_id="steer-2", kind="steer"), InboxItem(entry_id="write-2", kind="write"),
             InboxItem(entry_id="follow-2", kind="follow_up")]
    custom = CustomMessage(custom_type="chat.event", content="joined", details={"who": "ann"}, timestamp=0)
    pending: dict[str, PendingEntry] = {
        "drained-s": PendingMessage(message=said("drained steer")),
        "drained-f": PendingMessage(message=custom),
        "write-1": PendingCustom(custom_type="app.state", data={"n": [1, 2]}),
        "next-1": PendingMessage(message=said("next run")),
        "steer-2": PendingMessage(message=said("late steer")),
        "write-2": PendingMessage(message=said("late note")),
        "follow-2": PendingMessage(message=said("late follow-up")),
    }
    last = LaneLastResult(operation_id="op-0", kind="run", outcome="failed", tip_id=None, started_at=1, ended_at=2,
                          error=OperationErrorRecord(code="model_unavailable", message="gone",
                                                     details={"provider": "p", "model_id": "m"}))
    written = await write_lane(store, ctx, state=RunStarting(control=control), inbox=inbox, pending=pending,
                               last_result=last)

    harness, watch = await watch_written(store, written, ctx)

    snapshot = watch.snapshot
    assert snapshot.operation == SnapshotOperation(
        id=OP, kind="run", started_at=1234, status="aborting",
        drained=DrainedQueues(steer=(QueuedItem(entry_id="drained-s", message=said("drained steer")),),
                              follow_up=(QueuedItem(entry_id="drained-f", message=custom),)))
    assert snapshot.queues == Queues(
        steer=(QueuedItem(entry_id="steer-2", message=said("late steer")),),
        follow_up=(QueuedItem(entry_id="follow-2", message=said("late follow-up")),),
        next_run=(QueuedItem(entry_id="next-1", message=said("next run")),))
    assert snapshot.pending_writes == (
        PendingWrite(entry_id="write-1", type="custom", custom_type="app.state", data={"n": [1, 2]}),
        PendingWrite(entry_id="write-2", type="message", message=said("late note")))
    assert snapshot.last_result == last
    assert transcript_texts(snapshot) == ["compaction: summary so far", "question"]
    assert snapshot.transcript[0].id == written.compaction
    assert snapshot.faulted is False
    await harness.close(ctx)


def _drop(address: Any) -> Stage:
    def stage(m: SessionMutator) -> None:
        m.delete(address)

    return stage


def _batch_with(call: ToolCallState) -> RunTools:
    return RunTools(batch=ToolBatch(assistant_entry_id="source", turn_id=TURN, config=CONFIG, calls=[call]))


def _then(*stages: Stage) -> Stage:
    def stage(m: SessionMutator) -> None:
        for each in stages:
            each(m)

    return stage




@dataclass(frozen=True)
class Corruption:
    state: OperationState | None
    source: AssistantMessage | None = None
    inbox: tuple[InboxItem, ...] = ()
    pending: tuple[tuple[str, PendingEntry], ...] = ()
    extra: Stage | None = None


def _frames(*pages: dict[str, JsonValue]) -> Stage:
    def stage(m: SessionMutator) -> None:
        for page in pages:
            m.append(addresses.assistant_frames(OP, "resp-entry"), page)

    return stage


def _root_entry(entry_id: str, message: UserMessage) -> Stage:
    def stage(m: SessionMutator) -> None:
        m.insert_entry(MessagePayload(message=message), parent_id=None, entry_id=entry_id)

    return stage


def _tip(entry_id: str) -> Stage:
    def stage(m: SessionMutator) -> None:
        m.set(addresses.branch_tip("main"), entry_id)

    return stage


CORRUPTIONS: dict[str, Corruption] = {
    "queued entry without payload": Corruption(None, inbox=(InboxItem(entry_id="steer-1", kind="next_run"),)),
    "queued entry that is not a message": Corruption(
        RunStarting(), inbox=(InboxItem(entry_id="steer-1", kind="steer"),),
        pending=(("steer-1", PendingCustom(custom_type="app", data=None)),)),
    "drained steer without payload": Corruption(
        RunStarting(control=CancelRequested(cause="user", requested_at=1, drained_steer=["gone"]))),
    "branch tip names a missing entry": Corruption(None, extra=_tip("no-such-entry")),
    "tools entry missing": Corruption(tools_state(), extra=tool_records),
    "tools entry is not an assistant reply": Corruption(
        tools_state(), extra=_then(tool_records, _root_entry("source", said("not a reply")))),
    "effect-pending call without args": Corruption(
        tools_state(), source=TOOLS_REPLY, extra=_then(tool_records, _drop(addresses.tool_args(OP, TURN, 4)))),
    "source index at a text block": Corruption(
        _batch_with(ToolCallState(source_index=3, result_entry_id="r", status="effect_pending")),
        source=TOOLS_REPLY, extra=lambda m: put_args(m, TURN, 3, {"x": 1})),
    "source index as a tool-call ordinal": Corruption(
        _batch_with(ToolCallState(source_index=0, result_entry_id="r", status="effect_pending")),
        source=TOOLS_REPLY, extra=lambda m: put_args(m, TURN, 0, {"x": 1})),
    "source index past the content": Corruption(
        _batch_with(ToolCallState(source_index=7, result_entry_id="r", status="effect_pending")),
        source=TOOLS_REPLY, extra=lambda m: put_args(m, TURN, 7, {"x": 1})),
    "deferred source missing": Corruption(DeferredSuspended(generation=GENERATION, source_entry_id="source")),
    "deferred source not deferred": Corruption(
        DeferredSuspended(generation=GENERATION, source_entry_id="source"), source=TOOLS_REPLY),
    "frame page without frames": Corruption(EFFECT, extra=_frames(FIRST_PAGE, {"pages": []})),
    "frame of an unknown type": Corruption(EFFECT, extra=_frames({"frames": [{"type": "bogus"}]})),
    "frame for a block never started": Corruption(
        EFFECT, extra=_frames(frame_page(TextDeltaEvent(content_index=0, delta="x")))),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
async def test_a_missing_or_contradictory_required_payload_faults_the_watch(
    store: Store, ctx: Context, name: str
) -> None:
    """HA-3, HA-10, HA-11: attachment reads none of it and succeeds; the watch raises
    `StorageCorruption` and leaves no watcher behind; the harness and other lanes go on."""
    case = CORRUPTIONS[name]
    written = await write_lane(store, ctx, state=case.state, source=case.source, inbox=case.inbox,
                               pending=dict(case.pending), extra=case.extra)
    await written.session.create_lane("side", CONFIG, ctx)
    harness, _ = await attach(written.session, ctx)
    lane = harness.lane("main")

    with pytest.raises(StorageCorruption):
        await lane.watch(ctx)

    assert watcher_count(harness) == 0
    await lane.set_model(OTHER_MODEL, ctx)  # a later commit still lands and buffers nowhere
    assert watcher_count(harness) == 0
    side = await harness.lane("side").watch(ctx)
    await harness.set_session_name("still usable", ctx)
    assert types_of(side.buffered()) == ["value_update"]
    with pytest.raises(StorageCorruption):
        await lane.watch(ctx)  # nothing was cached: a reconnect reads again and fails again
    await harness.close(ctx)


# -- live presentation during a capture (HA-14) --------------------------------------------------


class GatedBackend(RecordingBackend):
    """A recording backend that can hold branch scans until released, to act mid-capture."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.scanning = asyncio.Event()
        self.proceed: asyncio.Event | None = None

    async def walk_branch(
        self, session_id: str, start: str, limit: int, stop_at_compaction: bool, context: Context
    ) -> Any:
        if self.proceed is not None:
            self.scanning.set()
            await self.proceed.wait()
        return await super().walk_branch(session_id, start, limit, stop_at_compaction, context)


async def _gated_effect_pending(store: Store, ctx: Context) -> tuple[AgentHarness, GatedBackend]:
    written = await write_lane(store, ctx, state=EFFECT, extra=_frames(FIRST_PAGE))
    backend = GatedBackend(store.backend)
    gated = Store(backend, store.url)
    harness, _ = await attach(await gated.open_session(written.session.id, ctx), ctx)
    return harness, backend


def _streaming(text: str) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)], api="faux", provider="p", model="m",
                            stop_reason="stop", timestamp=5)


def _show(message: AssistantMessage) -> Callable[[LanePresentation], None]:
    def update(presentation: LanePresentation) -> None:
        presentation.streaming_message = message

    return update


async def test_a_live_update_during_capture_is_only_a_buffered_event_after_the_clone(
    store: Store, ctx: Context
) -> None:
    """HA-14: a live presentation update published while a watch awaits its durable reads is not
    in the snapshot (cloned before it) and arrives as the first buffered event; folded, it wins.

    Uses `Lane._present`, the internal publish-then-emit hook execution will use: no public call
    produces live presentation before drive exists."""
    harness, backend = await _gated_effect_pending(store, ctx)
    lane = harness.lane("main")
    backend.proceed = asyncio.Event()
    watching = start(lane.watch(ctx))
    await backend.scanning.wait()

    live = _streaming("Hello, wor")
    live_context = Context({"emitter": "drive"})
    await lane.present(_show(live), [MessageUpdate(lane="main", message=live)], live_context)
    backend.proceed.set()
    watch = await watching

    assert watch.snapshot.operation is not None
    assert watch.snapshot.operation.streaming_message is not None
    assert watch.snapshot.operation.streaming_message.content == [TextContent(text="Hel")]  # from the frames
    [delivery] = watch.buffered()
    assert delivery.event == MessageUpdate(lane="main", message=live)
    assert delivery.context is live_context
    folded = fold(watch.snapshot, [delivery])
    assert folded.operation is not None
    assert folded.operation.streaming_message == live
    assert (await fresh_snapshot(lane, ctx)) == folded  # publication first: the live state, no event
    await harness.close(ctx)


async def test_a_frame_commit_queues_behind_the_capture(store: Store, ctx: Context) -> None:
    """HA-14: a frame page commit is a lane job: started while a watch captures, it lands after
    the capture's reads, so the snapshot holds the frames before it and the watch buffers its event.

    Uses the harness's internal session line (the path drive will use to commit frames) and
    `Decision`; no public call commits frames before drive exists."""
    harness, backend = await _gated_effect_pending(store, ctx)
    lane = harness.lane("main")
    page = frame_page(TextDeltaEvent(content_index=0, delta="lo"))
    update = MessageUpdate(lane="main", message=_streaming("Hello"))

    async def commit_frames(m: SessionMutator) -> Decision[None]:
        m.append(addresses.assistant_frames(OP, "resp-entry"), page)
        return Decision(None, [update])

    backend.proceed = asyncio.Event()
    watching = start(lane.watch(ctx))
    await backend.scanning.wait()
    committing = start(harness._line.run(commit_frames, ctx))
    backend.proceed.set()
    watch, _ = await asyncio.gather(watching, committing)

    assert watch.snapshot.operation is not None
    assert watch.snapshot.operation.streaming_message is not None
    assert watch.snapshot.operation.streaming_message.content == [TextContent(text="Hel")]
    assert [delivery.event for delivery in watch.buffered()] == [update]
    backend.proceed = None
    later = await fresh_snapshot(lane, ctx)
    assert later.operation is not None
    assert later.operation.streaming_message is not None
    assert later.operation.streaming_message.content == [TextContent(text="Hello")]
    await harness.close(ctx)


# -- isolation and the emitting Context (HA-10, HA-22) -------------------------------------------


async def test_mutating_a_snapshot_changes_no_later_snapshot(store: Store, ctx: Context) -> None:
    """HA-10: a snapshot's payloads are copies: mutating the dicts and lists inside its transcript,
    pending writes and running tools leaves later snapshots as they were."""
    written = await write_lane(store, ctx, state=tools_state(), source=TOOLS_REPLY, extra=tool_records,
                               inbox=[InboxItem(entry_id="write-1", kind="write")],
                               pending={"write-1": PendingCustom(custom_type="app", data={"n": [1]})})
    harness, watch = await watch_written(store, written, ctx)
    lane = harness.lane("main")
    before = watch.snapshot.model_copy(deep=True)
    snapshot = watch.snapshot
    assert snapshot.operation is not None
    write_data = snapshot.pending_writes[0].data
    args, partial = snapshot.operation.running_tools[0].args, snapshot.operation.running_tools[0].partial_result
    source = snapshot.transcript[-1].payload
    assert isinstance(write_data, dict)
    assert isinstance(write_data["n"], list)
    assert isinstance(args, dict)
    assert isinstance(partial, dict)
    assert isinstance(source, MessagePayload)
    assert isinstance(source.message, AssistantMessage)

    write_data["n"].append(2)
    args["path"] = "elsewhere"
    partial["lines_read"] = -1
    source.message.content.clear()

    assert await fresh_snapshot(lane, ctx) == before
    await harness.close(ctx)


async def test_mutating_a_snapshot_last_result_changes_no_later_snapshot(store: Store, ctx: Context) -> None:
    """HA-10: the last result in a snapshot is a copy too: mutating its error details changes
    neither a later snapshot nor what inspection reports."""
    last = LaneLastResult(operation_id="op-0", kind="run", outcome="failed", tip_id=None, started_at=1, ended_at=2,
                          error=OperationErrorRecord(code="tool_failed", message="boom", details={"tries": [1]}))
    harness, watch = await watch_written(store, await write_lane(store, ctx, state=None, last_result=last), ctx)
    lane = harness.lane("main")
    assert watch.snapshot.last_result is not None
    assert watch.snapshot.last_result.error is not None
    details = watch.snapshot.last_result.error.details
    assert isinstance(details, dict)
    assert isinstance(details["tries"], list)

    details["tries"].append(2)

    later = await fresh_snapshot(lane, ctx)
    assert later.last_result == last
    assert (await lane.inspect_execution(ctx)).last_result == last
    await harness.close(ctx)


async def test_mutating_a_delivered_event_reaches_no_other_recipient_or_state(store: Store, ctx: Context) -> None:
    """HA-10: each listener and watcher gets its own copy of every event; a recipient that mutates
    the payload changes nothing another recipient, a later snapshot or the harness sees."""

    def vandal(event: HarnessEvent, context: Context) -> None:
        if isinstance(event, EntryAdded) and isinstance(event.entry.payload, CustomPayload):
            data = event.entry.payload.data
            assert isinstance(data, dict)
            assert isinstance(data["n"], list)
            data["n"].append("vandalised")
        if isinstance(event, QueueUpdate):
            for write in event.pending_writes:
                if isinstance(write.data, dict):
                    write.data["n"] = "vandalised"
            if event.queues.steer:
                message = event.queues.steer[0].message
                assert isinstance(message, CustomMessage)
                assert isinstance(message.details, dict)
                message.details["who"] = "vandal"

    harness = await harness_with_lane(store, ctx, listeners=[vandal])
    lane = harness.lane("main")
    seen = record_events(harness)
    first_watch, second_watch = await lane.watch(ctx), await lane.watch(ctx)

    await lane.append_custom("app.state", {"n": [1]}, ctx)
    await lane.accept(PromptRequest(text="go"), ctx)
    await lane.append_custom("app.state", {"n": [2]}, ctx)
    await lane.steer(CustomMessage(custom_type="chat", content="hi", details={"who": "ann"}, timestamp=0), ctx)
    await harness.set_session_name("named", ctx)  # one more delivery after the vandalised ones

    now = await fresh_snapshot(lane, ctx)
    assert now.transcript[0].payload == CustomPayload(custom_type="app.state", data={"n": [1]})
    assert now.pending_writes[0].data == {"n": [2]}
    steer = now.queues.steer[0].message
    assert isinstance(steer, CustomMessage)
    assert steer.details == {"who": "ann"}
    for watch in (first_watch, second_watch):
        assert fold(watch.snapshot, watch.buffered()) == now
    recorded = [event for event in seen if isinstance(event, QueueUpdate)]
    assert recorded[-1].pending_writes[0].data == {"n": [2]}
    assert recorded[-1].queues == now.queues
    await harness.close(ctx)


async def test_a_caller_mutating_its_message_after_queueing_changes_nothing_later(
    store: Store, ctx: Context
) -> None:
    """HA-10: what a lane holds is a copy of the caller's input: a caller that mutates its message
    after `steer` returned changes neither later events nor the snapshot they fold into."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    await lane.accept(PromptRequest(text="go"), ctx)
    watch = await lane.watch(ctx)
    message = CustomMessage(custom_type="chat", content="hi", details={"who": "ann"}, timestamp=0)
    await lane.steer(message, ctx)

    assert isinstance(message.details, dict)
    message.details["who"] = "someone else"
    await lane.follow_up(said("then this"), ctx)  # its queue_update lists the steer item again

    now = await fresh_snapshot(lane, ctx)
    steer = now.queues.steer[0].message
    assert isinstance(steer, CustomMessage)
    assert steer.details == {"who": "ann"}
    assert fold(watch.snapshot, watch.buffered()) == now
    await harness.close(ctx)


async def test_buffered_events_keep_the_exact_emitting_context(store: Store, ctx: Context) -> None:
    """HA-22: every buffered delivery carries the very Context object of the call that emitted
    it; listeners get the same object."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    contexts: list[Context] = []
    harness.add_listener(lambda event, context: contexts.append(context))
    watch = await lane.watch(ctx)
    appending, naming = Context({"call": "append"}), Context({"call": "name"})

    await lane.append_message(said("hello"), appending)
    await harness.set_session_name("named", naming)

    deliveries = watch.buffered()
    assert [d.context for d in deliveries] == [appending] * 3 + [naming]
    assert all(d.context is c for d, c in zip(deliveries, [appending] * 3 + [naming], strict=True))
    assert all(a is b for a, b in zip(contexts, [appending] * 3 + [naming], strict=True))
    await harness.close(ctx)


# -- close and fault (HA-10) ---------------------------------------------------------------------


async def test_close_ends_watch_iteration_after_the_buffered_events(store: Store, ctx: Context) -> None:
    """HA-10: harness close ends every watch the way it ends the bus: buffered events first, then
    iteration stops; a waiting consumer is woken; later calls are refused."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    waiting, buffered = await lane.watch(ctx), await lane.watch(ctx)

    async def consume(watch: LaneWatch) -> list[str]:
        return [delivery.event.type async for delivery in watch]

    consumer = start(consume(waiting))
    await lane.append_message(said("hello"), ctx)
    await harness.close(ctx)

    assert await consumer == list(PLACED)
    assert await consume(buffered) == list(PLACED)
    with pytest.raises(HarnessClosed):
        await lane.watch(ctx)


async def test_closing_a_watch_stops_it(store: Store, ctx: Context) -> None:
    """HA-10: `LaneWatch.close` ends its iteration and unsubscribes it; other watches go on."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    closing, other = await lane.watch(ctx), await lane.watch(ctx)
    consumed: list[str] = []
    started = asyncio.Event()

    async def consume() -> None:
        started.set()
        async for delivery in closing:
            consumed.append(delivery.event.type)

    consumer = start(consume())
    await started.wait()
    closing.close()
    await consumer
    await lane.append_message(said("after"), ctx)

    assert consumed == []
    assert closing.buffered() == []
    assert types_of(other.buffered()) == list(PLACED)
    await harness.close(ctx)


async def test_a_fault_ends_watches_with_harness_fault_after_the_fault_event(store: Store, ctx: Context) -> None:
    """HA-10: when the harness faults (here: the backend reports the session claim lost on a
    commit), every watch delivers what it buffered and the `fault` event, then raises
    `HarnessFault`; listeners get `fault` too; later calls are refused."""
    watched, backend = recording(store)
    session = await watched.create_session(ctx)
    await session.create_lane("main", CONFIG, ctx)
    harness, _ = await attach(session, ctx)
    lane = harness.lane("main")
    seen = record_events(harness)
    watch = await lane.watch(ctx)
    await lane.append_message(said("before"), ctx)
    failing = Context({"call": "failing"})
    backend.fail_next_commit = OwnershipLost("the claim on the session was lost")

    with pytest.raises(HarnessFault):
        await lane.append_message(said("lost"), failing)

    deliveries: list[EventDelivery] = []

    async def drain() -> None:
        async for delivery in watch:
            deliveries.append(delivery)

    with pytest.raises(HarnessFault):
        await drain()
    assert types_of(deliveries) == [*PLACED, "fault"]
    assert deliveries[-1].context is failing
    with pytest.raises(HarnessFault):
        await lane.watch(ctx)
    await harness.close(ctx)
    assert [event.type for event in seen] == [*PLACED, "fault"]
    assert fold(watch.snapshot, deliveries).faulted is True


