"""Attachment, open inventory, ownership and inspection (HA-1 to HA-6, HA-16, HA-22, HA-23, HA-26, HA-30)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import assert_never

import pytest

from harness.context import Context
from harness.errors import Cancelled, ModelUnavailable, ToolsUnavailable
from harness.messages import ModelIdentity, TextContent, ToolResultMessage
from harness.runtime import (
    AgentHarness,
    AgentHarnessOptions,
    CurrentOperationInfo,
    HarnessClosed,
    HarnessEvent,
    OpenOperation,
    OperationStatus,
    PromptRequest,
)
from harness.session import (
    LaneConfig,
    LaneLastResult,
    LaneState,
    OperationErrorRecord,
    SessionMutator,
    SessionOwned,
    StorageCorruption,
    Store,
    addresses,
)
from harness.session.records import (
    AssistantReady,
    CancelRequested,
    CompactionIntent,
    FailureDrain,
    FailureProvenance,
    GenerationContext,
    InboxItem,
    OperationMeta,
    OperationState,
    PendingMessage,
    RunIntent,
    RunStarting,
)
from harness_helpers import attach, recording, said
from journal_helpers import CONFIG, append_chain, new_session_with_lane

TESTS = Path(__file__).resolve().parent
OTHER_MODEL = ModelIdentity(provider="elsewhere", model_id="captured-model")

# What HA-2 lets attachment read, by namespace.
ATTACHMENT_NAMESPACES = {
    "harness.branch.tip", "harness.lane.config", "harness.lane.state", "harness.lane.last_result",
    "harness.op.meta", "harness.op.state",
}


async def write_open_operation(
    store: Store, ctx: Context, *, lane: str = "main", state: OperationState | None = None, kind: str = "run",
    control: CancelRequested | None = None, inbox: list[InboxItem] | None = None,
) -> tuple[str, str]:
    """A session whose lane `lane` has an open operation written directly, as a crashed process
    would leave it; returns (session id, operation id)."""
    session = await new_session_with_lane(store, ctx)
    if lane != "main":
        await session.create_lane(lane, CONFIG, ctx)
    [tip] = await append_chain(session, ["hello"], ctx, lane=lane)
    operation_id = f"op-{lane}"
    intent = RunIntent(prompt_entry_ids=[tip]) if kind == "run" else CompactionIntent()
    phase: OperationState = state if state is not None else RunStarting()
    if control is not None:
        phase = phase.model_copy(update={"control": control})

    async def job(m: SessionMutator) -> None:
        m.set(addresses.operation_meta(operation_id), OperationMeta(
            operation_id=operation_id, lane=lane, source_tip_id=None, started_at=1000, intent=intent))
        m.set(addresses.operation_state(operation_id), phase)
        m.set(addresses.lane_state(lane), LaneState(current_operation_id=operation_id, inbox=inbox or []))

    await session.mutate(job, ctx)
    return session.id, operation_id


async def test_open_inventory_lists_each_open_operation_and_omits_idle_lanes(store: Store, ctx: Context) -> None:
    """HA-1: one OpenOperation per durable current operation; idle lanes are left out."""
    session_id, operation_id = await write_open_operation(store, ctx)
    session = await store.open_session(session_id, ctx)
    await session.create_lane("idle", CONFIG, ctx)

    harness, open_operations = await attach(session, ctx)

    assert open_operations == [OpenOperation(lane="main", operation_id=operation_id, kind="run", started_at=1000)]
    assert {info.name for info in harness.lanes} == {"main", "idle"}
    await harness.close(ctx)


async def test_aborting_comes_only_from_a_durable_cancel_request(store: Store, ctx: Context) -> None:
    """HA-5: `aborting` is True exactly when the operation's control is a durable cancel request."""
    cancel = CancelRequested(cause="user", requested_at=5)
    aborting_id, _ = await write_open_operation(store, ctx, control=cancel)
    running_id, _ = await write_open_operation(store, ctx)

    _, [aborting] = await attach(await store.open_session(aborting_id, ctx), ctx)
    _, [running] = await attach(await store.open_session(running_id, ctx), ctx)

    assert aborting.aborting is True
    assert running.aborting is False


async def test_attachment_reads_only_the_projection(store: Store, ctx: Context) -> None:
    """HA-2, HA-3: attachment reads tips, lane config/state/last result and the current
    operation's meta and state; no transcript, queue payload, frame, argument or checkpoint."""
    session_id, _ = await write_open_operation(
        store, ctx, inbox=[InboxItem(entry_id="queued", kind="steer")]
    )
    session = await store.open_session(session_id, ctx)

    async def queue_payload(m: SessionMutator) -> None:
        m.set(addresses.pending_entry("queued"), PendingMessage(message=said("later")))

    await session.mutate(queue_payload, ctx)
    watched, backend = recording(store)

    await attach(await watched.open_session(session_id, ctx), ctx)

    assert "harness.op.state" in backend.namespaces_read()
    assert backend.namespaces_read() <= ATTACHMENT_NAMESPACES
    assert not [read for read in backend.reads if read[0] in ("entries", "branch", "list")]
    assert backend.commits == []


async def test_attachment_starts_no_callback_effect_or_task(store: Store, ctx: Context) -> None:
    """HA-3: no listener, tool or task runs because of attachment."""
    session_id, _ = await write_open_operation(store, ctx)
    seen: list[HarnessEvent] = []
    before = asyncio.all_tasks()

    await AgentHarness.create(AgentHarnessOptions(
        session=await store.open_session(session_id, ctx),
        listeners=[lambda event, context: seen.append(event)],
    ), ctx)

    assert seen == []
    assert asyncio.all_tasks() == before


@pytest.mark.parametrize("damage", ["no_state", "no_meta", "foreign_lane", "kind_mismatch", "undecodable"])
async def test_corrupt_projection_makes_create_fail_and_releases_the_session(
    store: Store, ctx: Context, damage: str
) -> None:
    """HA-2: missing or contradictory projection fails `create`; the session is not left owned."""
    state = AssistantReady(generation=GenerationContext(step_id="s", trigger_entry_id=None, config=CONFIG))
    session_id, operation_id = await write_open_operation(
        store, ctx, kind="compaction" if damage == "kind_mismatch" else "run",
        state=state if damage == "kind_mismatch" else None,
    )
    session = await store.open_session(session_id, ctx)

    async def corrupt(m: SessionMutator) -> None:
        if damage == "no_state":
            m.delete(addresses.operation_state(operation_id))
        elif damage == "no_meta":
            m.delete(addresses.operation_meta(operation_id))
        elif damage == "foreign_lane":
            meta = await m.get(addresses.operation_meta(operation_id), ctx)
            assert meta is not None
            m.set(addresses.operation_meta(operation_id), meta.model_copy(update={"lane": "other"}))
        elif damage == "undecodable":
            m.set(addresses.value_address("harness.lane.state", "main"), {"current_operation_id": 7})

    await session.mutate(corrupt, ctx)

    with pytest.raises(StorageCorruption):
        await attach(session, ctx)
    await session.mutate(corrupt_nothing, ctx)  # released: direct mutation works again


async def corrupt_nothing(m: SessionMutator) -> None:
    return None


async def test_a_second_harness_on_the_session_is_refused(store: Store, ctx: Context) -> None:
    """HA-4: while attached, a second harness, direct mutation and lane creation are refused."""
    session = await new_session_with_lane(store, ctx)
    harness, _ = await attach(session, ctx)

    with pytest.raises(SessionOwned):
        await attach(session, ctx)
    with pytest.raises(SessionOwned):
        await session.mutate(corrupt_nothing, ctx)
    with pytest.raises(SessionOwned):
        await session.create_lane("side", CONFIG, ctx)

    await harness.close(ctx)
    await session.mutate(corrupt_nothing, ctx)  # closing released it


CHILD = """
import asyncio, sys
from harness.context import Context
from harness.runtime import AgentHarness, AgentHarnessOptions
from harness.session import SessionOwned, connect

async def main(url, session_id):
    ctx = Context()
    store = await connect(url, ctx)
    try:
        await AgentHarness.create(AgentHarnessOptions(session=await store.open_session(session_id, ctx)), ctx)
        print("attached")
    except SessionOwned:
        print("owned")
    finally:
        await store.close(ctx)  # an open PostgreSQL pool can hold the child at exit

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_harness_in_another_process_is_refused(store: Store, ctx: Context) -> None:
    """HA-4: the ownership holds across processes (a lock that dies with its holder)."""
    if store.backend.kind == "memory":
        pytest.skip("a memory store is private to its process")
    session = await new_session_with_lane(store, ctx)
    harness, _ = await attach(session, ctx)

    def other_process() -> str:
        done = subprocess.run([sys.executable, "-c", CHILD, store.url, session.id],
                              capture_output=True, text=True, timeout=180, check=True)
        return done.stdout.strip()

    assert await asyncio.to_thread(other_process) == "owned"
    await harness.close(ctx)
    assert await asyncio.to_thread(other_process) == "attached"


async def test_inspection_shows_configured_and_captured_identities_unresolved(store: Store, ctx: Context) -> None:
    """HA-6, HA-16: configured and captured models are strings that need not resolve; no
    registry is consulted (none is configured here)."""
    captured = LaneConfig(model=OTHER_MODEL)
    state = AssistantReady(generation=GenerationContext(step_id="s", trigger_entry_id=None, config=captured))
    session_id, operation_id = await write_open_operation(store, ctx, state=state)
    harness, _ = await attach(await store.open_session(session_id, ctx), ctx)

    info = await harness.lane("main").inspect_execution(ctx)

    assert info.configured_model == CONFIG.model
    assert info.current == CurrentOperationInfo(id=operation_id, kind="run", started_at=1000, status="open",
                                                captured_model=OTHER_MODEL)


async def test_inspection_reports_aborting_and_the_last_result_without_reading_payloads(
    store: Store, ctx: Context
) -> None:
    """HA-6: a no-write observation from the projection: status `aborting` after a durable
    abort request, the last result when there is one, and no storage read at all."""
    session = await new_session_with_lane(store, ctx)
    last = LaneLastResult(operation_id="before", kind="run", outcome="completed", tip_id=None,
                          started_at=1, ended_at=2)

    async def settled_before(m: SessionMutator) -> None:
        m.set(addresses.lane_last_result("main"), last)

    await session.mutate(settled_before, ctx)
    watched, backend = recording(store)
    harness, _ = await attach(await watched.open_session(session.id, ctx), ctx)
    lane = harness.lane("main")
    accepted = await lane.accept(PromptRequest(text="go"), ctx)
    await lane.request_abort("user", ctx)
    reads, commits = len(backend.reads), len(backend.commits)

    info = await lane.inspect_execution(ctx)

    assert info.current is not None
    assert info.current.status == "aborting"
    assert info.current.id == accepted.operation_id
    assert info.last_result == last
    assert (len(backend.reads), len(backend.commits)) == (reads, commits)


async def test_inspection_runs_on_the_session_line(store: Store, ctx: Context) -> None:
    """HA-6: inspection is a job on the line: issued after an acceptance, it observes it."""
    session = await new_session_with_lane(store, ctx)
    harness, _ = await attach(session, ctx)
    lane = harness.lane("main")

    accepted, info = await asyncio.gather(lane.accept(PromptRequest(text="go"), ctx), lane.inspect_execution(ctx))

    assert info.current is not None
    assert info.current.id == accepted.operation_id


async def test_a_cancelled_invocation_writes_nothing_and_is_not_an_abort(store: Store, ctx: Context) -> None:
    """HA-22: cancelling the call's Context refuses the call; it records no abort request."""
    session = await new_session_with_lane(store, ctx)
    harness, _ = await attach(session, ctx)
    lane = harness.lane("main")
    await lane.accept(PromptRequest(text="go"), ctx)
    cancelled = Context()
    cancelled.cancel("caller left")

    with pytest.raises(Cancelled):
        await lane.request_abort("user", cancelled)

    info = await lane.inspect_execution(ctx)
    assert info.current is not None
    assert info.current.status == "open"


async def test_closed_harness_refuses_calls(store: Store, ctx: Context) -> None:
    """A closed harness refuses every call before it changes anything."""
    session = await new_session_with_lane(store, ctx)
    harness, _ = await attach(session, ctx)
    lane = harness.lane("main")
    await harness.close(ctx)

    with pytest.raises(HarnessClosed):
        await lane.accept(PromptRequest(text="late"), ctx)
    with pytest.raises(HarnessClosed):
        await lane.inspect_execution(ctx)


async def test_configuration_failure_vocabulary_is_representable_and_durable(store: Store, ctx: Context) -> None:
    """HA-23, HA-26: the stable configuration codes and `configuration` provenance survive a
    round trip through the journal; a synthetic tool result carries no details (HA-25)."""
    assert ModelUnavailable("p", "m").code == "model_unavailable"
    assert ModelUnavailable("p", "m").details == {"provider": "p", "model_id": "m"}
    assert ToolsUnavailable(["grep"]).code == "configured_tools_unavailable"
    assert ToolsUnavailable(["grep"]).details == {"tools": ["grep"]}
    error = ModelUnavailable("p", "m")
    drain = FailureDrain(error=OperationErrorRecord(code=error.code, message=error.message, details=error.details),
                         provenance=FailureProvenance(kind="configuration"))
    session_id, operation_id = await write_open_operation(store, ctx, state=drain)
    harness, [_operation] = await attach(await store.open_session(session_id, ctx), ctx)

    async def read(m: SessionMutator) -> object:
        return await m.get(addresses.operation_state(operation_id), ctx)

    await harness.close(ctx)
    assert await (await store.open_session(session_id, ctx)).mutate(read, ctx) == drain
    assert ToolResultMessage(tool_call_id="c", tool_name="missing", content=[TextContent(text="no such tool")],
                             is_error=True).details is None


def describe_status(status: OperationStatus) -> str:
    """HA-30: the status union narrows exhaustively (mypy checks `assert_never`)."""
    if status == "running":
        return "a drive here owns it"
    if status == "open":
        return "durable, no local owner"
    if status == "aborting":
        return "abort requested"
    assert_never(status)


def describe_kind(operation: OpenOperation) -> str:
    kind = operation.kind
    if kind == "run":
        return "run"
    if kind == "compaction":
        return "compaction"
    if kind == "navigation":
        return "navigation"
    assert_never(kind)


def test_public_unions_are_closed_and_options_carry_no_context() -> None:
    """HA-30: closed unions (checked by mypy through the functions above) and no default
    telemetry Context in the harness options."""
    assert [describe_status(s) for s in ("running", "open", "aborting")]
    assert describe_kind(OpenOperation(lane="l", operation_id="o", kind="navigation", started_at=0)) == "navigation"
    fields = AgentHarnessOptions.__dataclass_fields__
    assert not [name for name, field in fields.items() if "Context" in str(field.type)]
