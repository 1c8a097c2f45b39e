"""The durable event id (issue 16 item 3): every durable event carries its lane's sequence number,
written in the commit of its fact; a watch and the log agree with no gap and no duplicate; the log
survives a crash between commit and publication and a restart; it is bounded per lane."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drive_helpers import ProbeTool, Rig, start_rig, within
from harness.context import Context
from harness.providers.faux import FauxToolCall, reply, tool_call
from harness.runtime import (
    AgentHarness,
    AgentHarnessOptions,
    EventDelivery,
    HarnessEvent,
    LaneSnapshot,
    LaneWatch,
    MessageUpdate,
    ToolUpdate,
    read_lane_events,
    reduce_lane_snapshot,
)
from harness.runtime.event_log import DURABLE_EVENT_TYPES
from harness.session import Backend, Claim, CommitResult, Store, StoreConnectionLost, Write, connect
from harness_helpers import RecordingBackend, said

Step = str  # "steer", "follow_up", "abort" or "none": what happens while the first tool call runs


def call(key: str) -> FauxToolCall:
    return tool_call("probe", {"key": key}, id=f"call-{key}")


def durable(deliveries: Sequence[EventDelivery]) -> list[HarnessEvent]:
    return [d.event for d in deliveries if d.event.event_seq is not None]


def fold(snapshot: LaneSnapshot, events: Sequence[HarnessEvent]) -> LaneSnapshot:
    for event in events:
        snapshot = reduce_lane_snapshot(snapshot, event)
    return snapshot


async def read_all(rig: Rig, after_seq: int | None, ctx: Context) -> list[HarnessEvent]:
    """Every logged event after `after_seq`, in pages of three, each page holding its start."""
    events: list[HarnessEvent] = []
    while True:
        page = await rig.lane.read_events(after_seq, 3, ctx)
        assert page.holds
        events += page.events
        if not page.events:
            return events
        after_seq = page.events[-1].event_seq


async def drained(watch: LaneWatch) -> list[EventDelivery]:
    """What the watch buffered (every delivery has been bound once its call returned), then close it."""
    taken = watch.buffered()
    watch.close()
    return taken


async def run_turns(rig: Rig, probe: ProbeTool, steps: Sequence[Step], ctx: Context) -> None:
    """One prompt per step: the model calls the probe (gated), the step happens while it runs."""
    for index, step in enumerate(steps):
        gate = probe.gate(f"{index}")
        task = asyncio.ensure_future(rig.lane.prompt(f"turn {index}", None, ctx))
        await probe.wait_started(f"{index}")
        if step == "steer":
            await rig.lane.steer(said(f"steer {index}"), ctx)
        elif step == "follow_up":
            await rig.lane.follow_up(said(f"follow {index}"), ctx)
        elif step == "abort":
            await rig.lane.request_abort("user", ctx)
        gate.set()
        await within(task)


def script_for(steps: Sequence[Step]) -> list[object]:
    script: list[object] = []
    for index, step in enumerate(steps):
        script.append(reply("Let me look.", call(f"{index}")))
        if step == "abort":
            continue  # the abort ends the turn before the model is asked again
        script.append(f"Answer {index}.")
        if step == "follow_up":
            script.append(f"About that, {index}.")
    return script


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(["steer", "follow_up", "abort", "none"]), min_size=1, max_size=3))
async def test_the_watch_and_the_log_agree_with_no_gap_and_no_duplicate(steps: list[Step], ctx: Context) -> None:
    store = await connect("memory://", ctx)
    probe = ProbeTool()
    rig = await start_rig(store, ctx, script_for(steps), tools=[probe.tool])  # type: ignore[arg-type]
    watch = await rig.lane.watch(ctx)
    assert watch.snapshot.event_seq is None  # nothing logged yet

    await run_turns(rig, probe, steps, ctx)
    deliveries = await drained(watch)

    seen = durable(deliveries)
    seqs = [event.event_seq or 0 for event in seen]
    assert seqs == sorted(set(seqs))  # strictly increasing: no duplicate
    assert {event.type for event in seen} <= DURABLE_EVENT_TYPES
    # Every durable kind that a run emits carries its seq; only presentation goes without.
    unnumbered = {d.event.type for d in deliveries if d.event.event_seq is None}
    assert unnumbered <= {"message_start", "message_update", "tool_update"}
    assert all(isinstance(d.event, MessageUpdate | ToolUpdate) or d.event.type == "message_start"
               for d in deliveries if d.event.event_seq is None)
    # The log holds exactly what the watch saw, in order, as published: no gap.
    assert (await rig.lane.read_events(None, 10_000, ctx)).events == tuple(seen)
    assert await read_all(rig, seqs[0], ctx) == seen[1:]
    # A listener sees the same numbers; a fresh snapshot is current to the last of them.
    assert [e for e in rig.events.events if e.event_seq is not None] == seen
    fresh = await rig.lane.watch(ctx)
    fresh.close()
    assert fresh.snapshot.event_seq == seqs[-1]
    assert fold(watch.snapshot, [d.event for d in deliveries]) == fresh.snapshot
    await rig.harness.close(ctx)
    await store.close()


async def test_a_reconnecting_watcher_resumes_after_its_last_event_without_a_snapshot(
    store: Store, ctx: Context
) -> None:
    probe = ProbeTool()
    rig = await start_rig(store, ctx, script_for(["steer", "none"]), tools=[probe.tool])  # type: ignore[arg-type]
    first = await rig.lane.watch(ctx)
    await run_turns(rig, probe, ["steer"], ctx)
    seen = durable(await drained(first))
    last = seen[len(seen) // 2].event_seq  # the connection dropped here
    assert last is not None

    second = await rig.lane.watch(ctx)
    await run_turns(rig, probe, ["none"], ctx)
    missed = await rig.lane.read_events(last, 10_000, ctx)
    live = durable(await drained(second))

    assert missed.holds
    upto = second.snapshot.event_seq
    assert upto is not None
    replayed = [event for event in missed.events if event.event_seq is not None and event.event_seq <= upto]
    assert replayed == [event for event in seen if event.event_seq is not None and event.event_seq > last]
    assert [*replayed, *live] == list(missed.events)  # the log, then the live events: one story
    await rig.harness.close(ctx)


class CommitThenDrop:
    """A backend whose chosen commit lands and then reports a lost connection: the process never
    learns it committed, so nothing is published, as if it died between commit and publication."""

    def __init__(self, inner: Backend) -> None:
        self.recording = RecordingBackend(inner)
        self.drop_next = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.recording, name)

    async def commit(self, session_id: str, writes: Sequence[Write], claim: Claim | None,
                     context: Context) -> CommitResult:
        result = await self.recording.commit(session_id, writes, claim, context)
        if self.drop_next:
            self.drop_next = False
            raise StoreConnectionLost("the connection dropped after COMMIT")
        return result


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_crash_between_commit_and_publication_loses_no_event_and_a_restart_reads_the_same(
    store_url: str, ctx: Context
) -> None:
    """The log is the truth: a commit whose events were never published still has them logged
    under their ids, and after a restart every event reads back exactly as it was published."""
    store = await connect(store_url, ctx)
    backend = CommitThenDrop(store.backend)
    dropping = Store(backend, store.url)  # type: ignore[arg-type]
    probe = ProbeTool()
    rig = await start_rig(dropping, ctx, script_for(["none"]), tools=[probe.tool])  # type: ignore[arg-type]
    watch = await rig.lane.watch(ctx)
    await run_turns(rig, probe, ["none"], ctx)
    seen = durable(await drained(watch))

    backend.drop_next = True
    with pytest.raises(StoreConnectionLost):
        await rig.lane.queue_next_run(said("lost in flight"), ctx)
    await rig.harness.close(ctx)
    await store.close()

    reopened = await connect(store_url, ctx)
    cold = await reopened.open_session(rig.session.id, ctx)
    page = await read_lane_events(cold, "main", None, 10_000, ctx)
    assert list(page.events[:len(seen)]) == seen  # the same events, the same ids, after a restart
    [unpublished] = page.events[len(seen):]
    assert unpublished.type == "queue_update"
    assert unpublished.event_seq is not None
    assert unpublished.event_seq > (seen[-1].event_seq or 0)
    # A harness attached again continues the numbering after it.
    harness, _ = await AgentHarness.create(AgentHarnessOptions(session=cold), ctx)
    watch = await harness.lane("main").watch(ctx)
    watch.close()
    assert watch.snapshot.event_seq == unpublished.event_seq
    await harness.close(ctx)
    await reopened.close()


async def test_the_log_keeps_the_newest_events_and_says_when_it_no_longer_holds_a_seq(
    store: Store, ctx: Context
) -> None:
    probe = ProbeTool()
    rig = await start_rig(store, ctx, script_for(["none", "none"]), tools=[probe.tool],  # type: ignore[arg-type]
                          event_log_limit=5)
    watch = await rig.lane.watch(ctx)
    await run_turns(rig, probe, ["none", "none"], ctx)
    seen = durable(await drained(watch))

    page = await rig.lane.read_events(None, 100, ctx)
    assert page.events == tuple(seen[-5:])  # trimmed at the settlement, to the newest five
    assert not page.holds  # no seq asked for: a snapshot is the way in
    assert page.newest_seq == seen[-1].event_seq
    assert not (await rig.lane.read_events(seen[0].event_seq, 100, ctx)).holds  # trimmed past it
    kept = await rig.lane.read_events(seen[-5].event_seq, 100, ctx)
    assert kept.holds
    assert kept.events == tuple(seen[-4:])
    newest = await rig.lane.read_events(seen[-1].event_seq, 100, ctx)
    assert newest.holds
    assert newest.events == ()
    assert not (await rig.lane.read_events((seen[-1].event_seq or 0) + 1000, 100, ctx)).holds  # never reached

    assert (await rig.lane.read_events(seen[-5].event_seq, 2, ctx)).events == tuple(seen[-4:-2])  # a page's limit
    await rig.harness.close(ctx)


async def test_the_log_trims_past_a_tenth_over_its_limit_to_its_newest_events_across_a_restart(
    store: Store, ctx: Context
) -> None:
    """A settlement trims a log grown past 1.1 times `event_log_limit` to its newest `limit` events,
    exactly, though one commit's events share a row; a harness attached again counts on from the
    log as the last one left it. Every event keeps its id, and a read from any of them, in the
    middle of a commit's events too, continues with the next."""
    seen: list[HarnessEvent] = []
    session = None
    for _ in range(2):  # a harness, then another attached to the same session
        rig = await start_rig(store, ctx, script_for(["none"] * 3),  # type: ignore[arg-type]
                              tools=[ProbeTool().tool], event_log_limit=20, session=session)
        session = rig.session
        for turn in range(3):
            watch = await rig.lane.watch(ctx)
            await within(rig.lane.prompt(f"turn {turn}", None, ctx))
            seen += durable(await drained(watch))
            kept = (await rig.lane.read_events(None, 100, ctx)).events
            assert kept == tuple(seen[-len(kept):])  # the newest, in order, as published
            assert min(len(seen), 20) <= len(kept) <= 22
        await rig.harness.close(ctx)
    seqs = [event.event_seq or 0 for event in seen]
    assert seqs == sorted(set(seqs))
    assert len(seen) > 40  # trimmed more than once
    cold = await store.open_session(rig.session.id, ctx)
    kept = (await read_lane_events(cold, "main", None, 100, ctx)).events
    for index in range(len(kept)):
        page = await read_lane_events(cold, "main", kept[index].event_seq, 100, ctx)
        assert page.holds
        assert page.events == kept[index + 1:]
        # A page is short only at the log's end, wherever in a row it starts.
        assert (await read_lane_events(cold, "main", kept[index].event_seq, 2, ctx)).events == kept[index + 1:index + 3]
    assert not (await read_lane_events(cold, "main", (kept[0].event_seq or 0) - 1, 100, ctx)).holds


async def test_a_harness_attached_with_a_smaller_limit_trims_a_long_log_at_its_first_settlement(ctx: Context) -> None:
    """The trim reads the rows it deletes page by page, however many: a log of 40 turns (some 280
    rows) kept under the default limit is cut to the newest 20 events by the first settlement of
    a harness attached with `event_log_limit=20`."""
    store = await connect("memory://", ctx)
    rig = await start_rig(store, ctx, script_for(["none"] * 41), tools=[ProbeTool().tool])  # type: ignore[arg-type]
    for turn in range(40):
        await within(rig.lane.prompt(f"turn {turn}", None, ctx))
    logged = (await rig.lane.read_events(None, 10_000, ctx)).events
    await rig.harness.close(ctx)

    again = await start_rig(store, ctx, script_for(["none"]), tools=[ProbeTool().tool],  # type: ignore[arg-type]
                            event_log_limit=20, session=rig.session)
    watch = await again.lane.watch(ctx)
    await within(again.lane.prompt("one more", None, ctx))
    seen = [*logged, *durable(await drained(watch))]

    kept = await again.lane.read_events(None, 10_000, ctx)
    assert kept.events == tuple(seen[-20:])
    assert len(logged) > 256  # in a row per commit, seven a turn: more than one page of the trim's reads
    await again.harness.close(ctx)
    await store.close()
