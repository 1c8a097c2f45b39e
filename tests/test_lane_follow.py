"""`follow_lane` (issue 17 item 3): a watch of a lane from a store that does not hold its session.

The harness drives through one `Store`; the follow reads through a second one opened on the same
database, as another process would: on SQLite it polls, on PostgreSQL commits notify it. It gets
a snapshot current to its `event_seq`, then the log's events after it, exactly once and in
order, and the streaming reply rebuilt from the persisted frames; a log trimmed past it says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from conftest import backend_url
from drive_helpers import ProbeTool, Rig, start_rig, within
from harness.context import Context
from harness.messages import TextContent
from harness.providers.faux import delay, reply, tool_call
from harness.runtime import (
    FollowBehind,
    HarnessEvent,
    LaneFollow,
    LaneSnapshot,
    MessageUpdate,
    RunEnd,
    follow_lane,
    read_lane_events,
    reduce_lane_snapshot,
)
from harness.session import Store, connect

SHARED = ["sqlite", "postgres"]  # the backends two stores can share


@pytest.fixture(params=SHARED)
async def stores(request: pytest.FixtureRequest, tmp_path: Path, ctx: Context) -> AsyncIterator[tuple[Store, Store]]:
    """The driver's store and the follower's, two connections to one database."""
    url = backend_url(request.param, tmp_path, request)
    driver = await connect(url, ctx)
    follower = await connect(url, ctx)
    try:
        yield driver, follower
    finally:
        await follower.close()
        await driver.close()


def fold(snapshot: LaneSnapshot, events: Sequence[HarnessEvent]) -> LaneSnapshot:
    for event in events:
        snapshot = reduce_lane_snapshot(snapshot, event)
    return snapshot


class Collected:
    """What a follow delivers, read in a task of its own, with a way to wait for a condition."""

    def __init__(self, follow: LaneFollow) -> None:
        self.follow = follow
        self.events: list[HarnessEvent] = []
        self.changed = asyncio.Event()
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for event in self.follow:
            self.events.append(event)
            self.changed.set()

    async def until(self, check: Callable[[list[HarnessEvent]], bool], timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not check(self.events):
                self.changed.clear()
                await self.changed.wait()

    @property
    def durable(self) -> list[HarnessEvent]:
        return [event for event in self.events if event.event_seq is not None]

    async def close(self) -> None:
        self.follow.close()
        await within(self.task)


def ended(count: int) -> Callable[[list[HarnessEvent]], bool]:
    return lambda events: sum(isinstance(event, RunEnd) for event in events) >= count


async def logged_after(rig: Rig, after_seq: int | None, ctx: Context) -> list[HarnessEvent]:
    page = await read_lane_events(rig.session, "main", after_seq, 10_000, ctx)
    return list(page.events)


async def test_a_follow_gets_every_durable_event_after_its_snapshot_once_in_order(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """Two turns with a tool call each, driven through the other store: the follow's events are
    exactly the log's after the snapshot, and folding them into the snapshot gives a fresh one."""
    driver, follower = stores
    probe = ProbeTool()
    rig = await start_rig(driver, ctx, [reply("a", tool_call("probe", {"key": "1"})), "one",
                                        reply("b", tool_call("probe", {"key": "2"})), "two"], tools=[probe.tool])
    await rig.lane.prompt("first", None, ctx)
    follow = await follow_lane(follower, rig.session.id, "main", ctx, poll_s=0.02)
    collected = Collected(follow)

    await rig.lane.prompt("second", None, ctx)
    await collected.until(ended(1))
    await collected.close()

    assert collected.durable == await logged_after(rig, follow.snapshot.event_seq, ctx)
    fresh = await follow_lane(follower, rig.session.id, "main", ctx)
    fresh.close()
    assert fold(follow.snapshot, collected.events) == fresh.snapshot
    assert [entry.id for entry in fresh.snapshot.transcript] == [
        entry.id for entry in (await rig.lane.watch(ctx)).snapshot.transcript]


async def test_the_streaming_reply_reaches_the_follow_from_its_frames(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """A reply held mid-stream: the follow shows the text streamed so far (from the frame pages),
    a follow started then has it in its snapshot, and the reply's own events follow it."""
    driver, follower = stores
    gate = asyncio.Event()
    rig = await start_rig(driver, ctx, [reply("streamed so far, ", delay(gate), "and the rest")])
    follow = await follow_lane(follower, rig.session.id, "main", ctx, poll_s=0.02)
    collected = Collected(follow)

    turn = asyncio.ensure_future(rig.lane.prompt("go", None, ctx))
    await collected.until(lambda events: any(
        isinstance(event, MessageUpdate) and _text(event) == "streamed so far, " for event in events))
    late = await follow_lane(follower, rig.session.id, "main", ctx)
    late.close()
    gate.set()
    await within(turn)
    await collected.until(ended(1))
    await collected.close()

    assert late.snapshot.operation is not None
    assert late.snapshot.operation.streaming_message is not None
    assert "".join(block.text for block in late.snapshot.operation.streaming_message.content
                   if isinstance(block, TextContent)) == "streamed so far, "
    updates = [index for index, event in enumerate(collected.events) if isinstance(event, MessageUpdate)]
    reply_end = next(index for index, event in enumerate(collected.events)
                     if event.type == "message_end" and getattr(event.message, "role", "") == "assistant")
    assert updates
    assert max(updates) < reply_end
    assert collected.durable == await logged_after(rig, follow.snapshot.event_seq, ctx)


async def test_snapshots_taken_while_another_store_commits_fold_to_the_final_state(
        stores: tuple[Store, Store], ctx: Context) -> None:
    """Snapshots read while the driver commits (its acceptance, then its reply and settlement as
    the reply's stream is let go): each one, folded with the events its follow delivers, ends
    equal to the final snapshot; a snapshot read across a commit (a transcript from after it, an
    `event_seq` from before) would show an entry twice or miss one."""
    driver, follower = stores
    pauses = [delay(asyncio.Event()) for _ in range(6)]
    rig = await start_rig(driver, ctx, [reply(f"reply {n}, ", pause, "ended") for n, pause in enumerate(pauses)])
    follows: list[Collected] = []

    async def snapshot() -> None:
        follows.append(Collected(await follow_lane(follower, rig.session.id, "main", ctx, poll_s=0.02)))

    for n, pause in enumerate(pauses):
        turn = asyncio.ensure_future(rig.lane.prompt(f"prompt {n}", None, ctx))
        await snapshot()  # overlaps the acceptance
        await within(pause.reached.wait())
        assert pause.until is not None
        pause.until.set()
        await snapshot()  # overlaps the reply's commit and the settlement
        await within(turn)
    final = await follow_lane(follower, rig.session.id, "main", ctx)
    final.close()

    def caught_up(collected: Collected) -> Callable[[list[HarnessEvent]], bool]:
        return lambda events: collected.follow.event_seq == final.snapshot.event_seq

    for collected in follows:
        await collected.until(caught_up(collected))
        await collected.close()
        assert fold(collected.follow.snapshot, collected.events) == final.snapshot


async def test_a_follow_whose_log_was_trimmed_past_it_says_so(stores: tuple[Store, Store], ctx: Context) -> None:
    """A lane that keeps four events after a settlement: a follow that has not read since its
    snapshot, three turns ago, gets `FollowBehind` instead of a gap."""
    driver, follower = stores
    rig = await start_rig(driver, ctx, ["one", "two", "three", "four"], event_log_limit=4)
    await rig.lane.prompt("first", None, ctx)
    follow = await follow_lane(follower, rig.session.id, "main", ctx, poll_s=0.02)
    for text in ("second", "third", "fourth"):
        await rig.lane.prompt(text, None, ctx)

    with pytest.raises(FollowBehind) as raised:
        async for _ in follow:
            pass
    assert raised.value.details["event_seq"] == follow.snapshot.event_seq


@pytest.mark.postgres
async def test_on_postgresql_a_commit_wakes_the_follow_without_a_poll(
        postgres_schema_url: str, ctx: Context) -> None:
    """With a 60 s poll, only the commits' notifications can wake the follow: a turn driven
    through another store reaches it within seconds (bounded loosely: CI's two cores are busy)."""
    driver = await connect(postgres_schema_url, ctx)
    follower = await connect(postgres_schema_url, ctx)
    try:
        rig = await start_rig(driver, ctx, ["hello"])
        follow = await follow_lane(follower, rig.session.id, "main", ctx, poll_s=60)
        collected = Collected(follow)
        with contextlib.suppress(TimeoutError):  # the feed's first read after its LISTEN
            await collected.until(lambda events: False, timeout_s=0.2)
        started = time.monotonic()

        await rig.lane.prompt("hi", None, ctx)
        await collected.until(ended(1), timeout_s=10)

        assert time.monotonic() - started < 10.0
        await collected.close()
    finally:
        await follower.close()
        await driver.close()


def _text(update: MessageUpdate) -> str:
    return "".join(block.text for block in update.message.content if isinstance(block, TextContent))


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_commit_through_the_same_store_wakes_the_follow_without_a_poll(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest, ctx: Context) -> None:
    """Issue 29: a follow in the process that drives (one store object) is woken by each commit at
    once, on every backend: with a 60 s poll, a turn's end reaches it within seconds. (On SQLite
    and memory it used to wait for its poll.)"""
    store = await connect(backend_url(backend, tmp_path, request), ctx)
    try:
        rig = await start_rig(store, ctx, ["hello"])
        collected = Collected(await follow_lane(store, rig.session.id, "main", ctx, poll_s=60))

        await rig.lane.prompt("hi", None, ctx)
        await collected.until(ended(1), timeout_s=10)

        assert collected.durable == await logged_after(rig, collected.follow.snapshot.event_seq, ctx)
        await collected.close()
    finally:
        await store.close()
