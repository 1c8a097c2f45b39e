"""Property: a watch's snapshot folded with every event buffered after it equals a fresh snapshot,
whatever commits race it (HA-7, HA-9, HA-12, HA-13, HA-15)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.context import Context
from harness.messages import ModelIdentity
from harness.runtime import (
    AgentHarness,
    LaneBusy,
    LaneWatch,
    NoActiveOperation,
    PromptRequest,
    reduce_lane_snapshot,
)
from harness.session import Store
from harness_helpers import attach, said
from journal_helpers import CONFIG, append_chain, new_session_with_lane

ACTIONS = (
    "accept", "append", "append custom", "queue next run", "steer", "follow up", "request abort",
    "set model", "set thinking level", "set active tools", "set session name", "set entry label",
    "create lane", "watch",
)
MODELS = (ModelIdentity(provider="p", model_id="m"), ModelIdentity(provider="other", model_id="bigger"))

Action = tuple[str, int]  # (what, which lane: an index into the lanes that exist when the step starts)
action = st.tuples(st.sampled_from(ACTIONS), st.integers(min_value=0, max_value=3))
plans = st.lists(st.lists(action, min_size=1, max_size=4), min_size=1, max_size=8)
histories = st.tuples(st.integers(min_value=0, max_value=5), st.none() | st.integers(min_value=0, max_value=4))


@dataclass
class Run:
    harness: AgentHarness
    lanes: list[str]
    watches: list[LaneWatch] = field(default_factory=list)
    count: int = 0

    def next(self) -> int:
        self.count += 1
        return self.count


async def perform(run: Run, what: str, lane_names: list[str], pick: int, ctx: Context) -> None:
    """One public call; refusals of the lane's current state (busy, idle) are legal outcomes."""
    harness, n = run.harness, run.next()
    lane = harness.lane(lane_names[pick % len(lane_names)])
    try:
        match what:
            case "accept":
                await lane.accept(PromptRequest(text=f"prompt {n}"), ctx)
            case "append":
                await lane.append_message(said(f"note {n}"), ctx)
            case "append custom":
                await lane.append_custom("app.state", {"n": n, "list": [n]}, ctx)
            case "queue next run":
                await lane.queue_next_run(said(f"next {n}"), ctx)
            case "steer":
                await lane.steer(said(f"steer {n}"), ctx)
            case "follow up":
                await lane.follow_up(said(f"follow-up {n}"), ctx)
            case "request abort":
                await lane.request_abort("user", ctx)
            case "set model":
                await lane.set_model(MODELS[n % 2], ctx)
            case "set thinking level":
                await lane.set_thinking_level("high" if n % 2 else "off", ctx)
            case "set active tools":
                await lane.set_active_tools([f"tool-{n}"], ctx)
            case "set session name":
                await harness.set_session_name(f"session {n}", ctx)
            case "set entry label":
                if lane.tip_id is not None:
                    await harness.set_entry_label(lane.tip_id, f"label {n}", ctx)
            case "create lane":
                name = f"lane-{n}"
                await harness.create_lane(name, CONFIG, ctx, at=harness.lane("main").tip_id)
                run.lanes.append(name)
            case "watch":
                run.watches.append(await lane.watch(ctx))
    except (LaneBusy, NoActiveOperation):
        pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories, plan=plans)
async def test_a_snapshot_folded_with_its_events_equals_a_fresh_snapshot(
    store: Store, ctx: Context, history: tuple[int, int | None], plan: list[list[Action]]
) -> None:
    """HA-7, HA-13: for watches interleaved with (and racing) commits of every kind, on a history
    that may start at a compaction, `reduce_lane_snapshot` over each watch's snapshot and the
    events buffered after it equals a fresh snapshot of its lane once nothing runs."""
    length, compaction = history
    session = await new_session_with_lane(store, ctx)
    if length:
        at = {compaction} if compaction is not None and compaction < length else set()
        await append_chain(session, [f"before {i}" for i in range(length)], ctx, compaction_at=at)
    harness, _ = await attach(session, ctx)
    run = Run(harness, ["main"])
    run.watches.append(await harness.lane("main").watch(ctx))

    for step in plan:
        lane_names = list(run.lanes)
        await asyncio.gather(*(perform(run, what, lane_names, pick, ctx) for what, pick in step))

    for watch in run.watches:
        fresh = await harness.lane(watch.snapshot.lane).watch(ctx)
        folded = watch.snapshot
        for delivery in watch.buffered():
            assert delivery.event.type != "handler_error"
            folded = reduce_lane_snapshot(folded, delivery.event)
        assert folded == fresh.snapshot
        fresh.close()
    if compaction is not None and compaction < length:
        first = (await harness.lane("main").watch(ctx)).snapshot.transcript[0]
        assert first.payload.type == "compaction"
    await harness.close(ctx)
