"""Requests from a process that does not own the session (`Session.post_request`), taken by the
lane's owner (`Lane.take_requests`): a steer, follow-up or stop reaches the run durably, each
request is applied once, and one whose run has ended keeps the person's message for the next run.
On every backend; the cross-process path is in test_worker_processes.py."""

from __future__ import annotations

from harness.context import Context
from harness.messages import Message, UserMessage, now_ms
from harness.runtime import AgentHarness, Lane, PromptRequest
from harness.session import QueueRequest, Session, StopRequest, Store, addresses
from harness.session.records import CancelRequested
from harness_helpers import harness_with_lane


def said(text: str) -> Message:
    return UserMessage(content=text, timestamp=0)


def texts(items: tuple[object, ...]) -> list[str]:
    return [item.message.content for item in items]  # type: ignore[attr-defined]


async def queued(lane: Lane, ctx: Context) -> dict[str, list[str]]:
    watch = await lane.watch(ctx)
    watch.close()
    queues = watch.snapshot.queues
    return {"steer": texts(queues.steer), "follow_up": texts(queues.follow_up), "next_run": texts(queues.next_run)}


async def accepted(store: Store, ctx: Context) -> tuple[AgentHarness, Session, str]:
    harness = await harness_with_lane(store, ctx)
    run = await harness.lane("main").accept(PromptRequest(text="go"), ctx)
    return harness, harness.session, run.operation_id


def queue(kind: str, operation_id: str, text: str) -> QueueRequest:
    return QueueRequest(kind=kind, lane="main", operation_id=operation_id, message=said(text),  # type: ignore[arg-type]
                        requested_at=now_ms())


async def test_a_steer_and_a_follow_up_posted_beside_the_owner_are_queued_for_its_run_once(
        store: Store, ctx: Context) -> None:
    """The owner holds the session, yet the posts commit; taking them queues each for the open run
    in posting order and deletes it, so a second take applies nothing."""
    harness, session, operation_id = await accepted(store, ctx)
    await session.post_request(queue("steer", operation_id, "left"), ctx)
    await session.post_request(queue("steer", operation_id, "right"), ctx)
    await session.post_request(queue("follow_up", operation_id, "then"), ctx)
    lane = harness.lane("main")

    assert await lane.take_requests(ctx) == 3
    assert await lane.take_requests(ctx) == 0

    assert await queued(lane, ctx) == {"steer": ["left", "right"], "follow_up": ["then"], "next_run": []}
    assert await session.scan_values(addresses.lane_request(""), ctx) == []
    await harness.close(ctx)


async def test_a_steer_for_a_run_that_ended_waits_for_the_next_run(store: Store, ctx: Context) -> None:
    """The run the sender saw is no longer current: the message is queued for the next run, not lost."""
    harness, session, _ = await accepted(store, ctx)
    await session.post_request(queue("steer", "an-operation-that-settled", "late"), ctx)

    await harness.lane("main").take_requests(ctx)

    assert await queued(harness.lane("main"), ctx) == {"steer": [], "follow_up": [], "next_run": ["late"]}
    await harness.close(ctx)


async def test_a_stop_aborts_its_own_operation_only(store: Store, ctx: Context) -> None:
    """A stop of a settled operation is dropped; one of the current operation is a durable abort
    request with its cause (HA-5)."""
    harness, session, operation_id = await accepted(store, ctx)
    lane = harness.lane("main")
    await session.post_request(StopRequest(lane="main", operation_id="settled-before", cause="user",
                                           requested_at=now_ms()), ctx)
    assert await lane.take_requests(ctx) == 0
    assert (await lane.inspect_execution(ctx)).current is not None

    await session.post_request(StopRequest(lane="main", operation_id=operation_id, cause="user",
                                           requested_at=now_ms()), ctx)
    assert await lane.take_requests(ctx) == 1

    state = await session.get(addresses.operation_state(operation_id), ctx)
    assert state is not None
    assert isinstance(state.control, CancelRequested)
    assert state.control.cause == "user"
    assert await session.scan_values(addresses.lane_request(""), ctx) == []
    await harness.close(ctx)


async def test_requests_nobody_took_are_taken_by_the_next_owner(store: Store, ctx: Context) -> None:
    """Posted while no one holds the session, a request waits in the journal for whoever attaches."""
    harness, session, operation_id = await accepted(store, ctx)
    await harness.close(ctx)
    await session.post_request(queue("follow_up", operation_id, "later"), ctx)

    reopened, _ = await AgentHarness.create(harness.options, ctx)
    assert await reopened.lane("main").take_requests(ctx) == 1
    assert (await queued(reopened.lane("main"), ctx))["follow_up"] == ["later"]
    await reopened.close(ctx)
