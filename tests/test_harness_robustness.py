"""What an adversarial review broke, kept broken-proof: cancellation at the commit boundary,
restarts with queued input, id collisions, aliasing, cycles, misbehaving listeners, bad input
(HA-4, HA-10, HA-12, HA-13, HA-17, HA-21)."""

from __future__ import annotations

import asyncio
import math
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.context import Context
from harness.errors import InvalidInput
from harness.messages import TextContent, UserMessage
from harness.runtime import (
    HarnessEvent,
    InvalidMessage,
    OperationIdTaken,
    PromptRequest,
    WatchOverflow,
)
from harness.session import Claim, CommitResult, SessionMutator, StorageCorruption, Store, Write, addresses, connect
from harness_helpers import RecordingBackend, attach, harness_with_lane, record_events, said
from journal_helpers import CONFIG, append_chain, new_session_with_lane


class CancelAfterCommit(RecordingBackend):
    """Cancels the committing task in the same step as its commit lands, as a caller that gives
    up at the worst moment would."""

    armed = False

    async def commit(self, session_id: str, writes: Sequence[Write], claim: Claim | None,
                     context: Context) -> CommitResult:
        result = await super().commit(session_id, writes, claim, context)
        if self.armed:
            self.armed = False
            self.victim.cancel()
        return result

    victim: asyncio.Task[object]


async def test_a_caller_cancelled_as_its_commit_lands_still_publishes_and_emits(store: Store, ctx: Context) -> None:
    """HA-12, HA-21: the commit stands, so the projection and the events follow it; the caller
    gets its cancellation after the continuation ran."""
    backend = CancelAfterCommit(store.backend)
    harness = await harness_with_lane(Store(backend, store.url), ctx)
    lane = harness.lane("main")
    seen = record_events(harness)

    async def accept() -> object:
        return await lane.accept(PromptRequest(text="landed"), ctx)

    task = asyncio.ensure_future(accept())
    backend.victim, backend.armed = task, True
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)  # let the bus deliver the batch the continuation emitted

    info = await lane.inspect_execution(ctx)
    assert info.current is not None
    assert "run_start" in [e.type for e in seen]
    stored = await harness.session.get(addresses.lane_state("main"), ctx)
    assert stored is not None
    assert stored.current_operation_id == info.current.id


async def test_queued_input_from_an_earlier_attachment_is_carried_by_later_queue_updates(
    store: Store, ctx: Context
) -> None:
    """HA-12, HA-13: a restarted harness knows no queued payloads (HA-3) and still emits the
    complete queues after an append, an abort request or a steer."""
    session = await new_session_with_lane(store, ctx)
    first, _ = await attach(session, ctx)
    await first.lane("main").accept(PromptRequest(text="run"), ctx)
    steer = await first.lane("main").steer(said("earlier steer"), ctx)
    await first.close(ctx)
    second, _ = await attach(session, ctx)
    seen = record_events(second)

    pending = await second.lane("main").append_message(said("while busy"), ctx)
    abort = await second.lane("main").request_abort("user", ctx)

    updates = [e for e in seen if e.type == "queue_update"]
    assert [w.entry_id for w in updates[0].pending_writes] == [pending]
    assert [i.entry_id for i in updates[0].queues.steer] == [steer]
    assert abort.steer == (steer,)


async def test_a_supplied_entry_id_cannot_take_a_queued_entry_id(store: Store, ctx: Context) -> None:
    """HA-17: pre-minted ids of queued entries are taken; supplying one is refused up front."""
    harness = await harness_with_lane(store, ctx)
    other = await harness.create_lane("other", CONFIG, ctx)
    queued = await other.queue_next_run(said("other's next run"), ctx)

    with pytest.raises(OperationIdTaken):
        await harness.lane("main").accept(PromptRequest(text="steal", entry_ids=[queued]), ctx)

    accepted = await other.accept(PromptRequest(text="mine"), ctx)
    assert accepted.entry_ids


async def test_snapshots_inspection_and_getters_never_alias_the_projection(store: Store, ctx: Context) -> None:
    """HA-10: mutating what a call returned, or what a caller passed in, changes nothing later."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    message = UserMessage(content=[TextContent(text="original")], timestamp=0)
    await lane.queue_next_run(message, ctx)
    message.content.append(TextContent(text="injected after queueing"))  # type: ignore[union-attr]
    lane.config.active_tools.append("smuggled")
    config = CONFIG.model_copy(deep=True)
    side = await harness.create_lane("side", config, ctx)
    config.active_tools.append("smuggled")
    await lane.accept(PromptRequest(), ctx)
    watch = await lane.watch(ctx)
    watch.snapshot.transcript[0].payload.message.content.append(TextContent(text="x"))  # type: ignore[union-attr]

    again = await lane.watch(ctx)
    placed = again.snapshot.transcript[0].payload.message  # type: ignore[union-attr]
    assert placed.content == [TextContent(text="original")]
    assert lane.config.active_tools == []
    assert side.config.active_tools == []
    await lane.set_thinking_level("low", ctx)
    stored = await harness.session.get(addresses.lane_config("main"), ctx)
    assert stored is not None
    assert stored.active_tools == []


async def test_a_parent_cycle_is_corruption_not_an_endless_walk(tmp_path: Path, ctx: Context) -> None:
    """HA-8, HA-10: a branch that loops faults the reader instead of holding the line forever."""
    path = tmp_path / "cycle.db"
    store = await connect(f"sqlite:///{path}", ctx)
    session = await new_session_with_lane(store, ctx)
    first, second = await append_chain(session, ["a", "b"], ctx)
    await store.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE entries SET parent_id = ? WHERE id = ?", (second, first))
    store = await connect(f"sqlite:///{path}", ctx)
    session = await store.open_session(session.id, ctx)
    harness, _ = await attach(session, ctx)

    with pytest.raises(StorageCorruption):
        await harness.lane("main").watch(ctx)
    await store.close()


async def test_a_listener_that_raises_cancelled_error_does_not_stop_delivery(store: Store, ctx: Context) -> None:
    """HA-12, HA-13: every listener still gets the batch and the call returns; the failure is
    reported as `handler_error`."""
    harness = await harness_with_lane(store, ctx)

    def hostile(event: HarnessEvent, context: Context) -> None:
        raise asyncio.CancelledError

    harness.add_listener(hostile)
    seen = record_events(harness)

    await harness.lane("main").append_message(said("hello"), ctx)
    await harness.lane("main").append_message(said("again"), ctx)

    assert [e.type for e in seen].count("entry_added") == 2
    assert "handler_error" in [e.type for e in seen]


async def test_a_listener_calling_back_into_the_harness_is_refused_not_deadlocked(
    store: Store, ctx: Context
) -> None:
    """A listener that mutates would wait for its own delivery: it gets `listener_reentry`
    (reported as `handler_error`) and the emitting call returns."""
    harness = await harness_with_lane(store, ctx)
    errors: list[str] = []

    async def reentrant(event: HarnessEvent, context: Context) -> None:
        if event.type == "entry_added":
            try:
                await harness.lane("main").append_message(said("echo"), context)
            except Exception as error:
                errors.append(getattr(error, "code", ""))
                raise

    harness.add_listener(reentrant)

    await asyncio.wait_for(harness.lane("main").append_message(said("hello"), ctx), timeout=30)

    assert errors == ["listener_reentry"]
    await asyncio.wait_for(harness.close(ctx), timeout=30)


async def test_cancelling_attachment_at_any_point_leaves_the_session_free(tmp_path: Path, ctx: Context) -> None:
    """HA-4: ownership lasts until `create` fails, cancellation included, also on SQLite where
    the claim is taken in another thread."""
    store = await connect(f"sqlite:///{tmp_path / 'claims.db'}", ctx)
    session = await new_session_with_lane(store, ctx)
    for steps in range(12):
        task = asyncio.ensure_future(attach(session, ctx))
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        try:
            harness, _ = await task
        except asyncio.CancelledError:
            pass
        else:
            await harness.close(ctx)
        await session.mutate(nothing, ctx)  # free again
    await store.close()


async def nothing(m: SessionMutator) -> None:
    return None


@pytest.mark.parametrize(
    "request_",
    [PromptRequest(messages="hello"), PromptRequest(text="x", operation_id=""),  # type: ignore[arg-type]
     PromptRequest(text="x", operation_id="a\x00b"), PromptRequest(text="x", entry_ids=["y" * 500])],
    ids=["messages-as-text", "empty-operation-id", "nul-in-id", "overlong-entry-id"],
)
async def test_malformed_requests_are_refused_before_the_line(
    store: Store, ctx: Context, request_: PromptRequest
) -> None:
    """HA-17: normalization refuses malformed shapes and ids with a stable code."""
    harness = await harness_with_lane(store, ctx)

    with pytest.raises(InvalidMessage):
        await harness.lane("main").accept(request_, ctx)


@pytest.mark.parametrize("bad", [math.nan, math.inf, {"deep": [math.nan]}])
async def test_custom_data_that_is_not_json_is_invalid_input(store: Store, ctx: Context, bad: object) -> None:
    harness = await harness_with_lane(store, ctx)

    with pytest.raises(InvalidInput):
        await harness.lane("main").append_custom("marker", bad, ctx)  # type: ignore[arg-type]


async def test_a_watch_that_falls_too_far_behind_ends_with_watch_overflow(store: Store, ctx: Context) -> None:
    """A watch nobody reads is bounded: past the limit it ends (its buffer dropped) with
    `watch_overflow`, and the harness goes on; a new watch works."""
    harness = await harness_with_lane(store, ctx, watch_buffer_limit=5)
    lane = harness.lane("main")
    watch = await lane.watch(ctx)

    for i in range(4):  # three events each: more than five
        await lane.append_message(said(f"m{i}"), ctx)

    with pytest.raises(WatchOverflow):
        async for _ in watch:
            pass
    again = await lane.watch(ctx)
    assert len(again.snapshot.transcript) == 4
    assert again.buffered() == []
