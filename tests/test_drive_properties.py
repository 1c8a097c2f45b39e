"""Property: random interleavings of prompt, steer, follow-up, abort, tool completion and close
(a controlled crash: the harness closes mid-run and a new one attaches and resumes) never break the
drive's invariants: every run settles exactly once, every tool call is answered once and right
after its reply, no `never` effect repeats, every request is valid for all three wire formats,
and the lane ends idle with a last result (issue 5)."""

from __future__ import annotations

import asyncio
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from conftest import backend_url
from drive_crash_child import (
    CONFIG,
    KEY_SCHEMA,
    NEVER,
    SAFE,
    check_journal,
    drive_settings,
)
from harness.context import Context
from harness.messages import TextContent, UserMessage
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ToolSpec
from harness.providers.faux import FauxReply, FauxRequest, delay, failure, reply, tool_call
from harness.runtime import (
    AgentHarness,
    AgentHarnessOptions,
    AgentTool,
    HarnessClosed,
    HarnessEvent,
    LaneBusy,
    NoActiveOperation,
    PromptRequest,
    RunEnd,
    RunStart,
    Settled,
    ToolOutput,
)
from harness.session import Session, Store, addresses, connect
from harness.session.records import AssistantEffectPending
from request_validators import assert_valid_everywhere

GUARD_S = 10.0  # a guard against a hang, never a wait: reaching it fails the example
QUIET_S = 0.05  # how long `progress` lets the drive run when nothing it could wait for happens

ReplyKind = Literal["text", "never", "safe", "both", "paused", "retry"]
REPLY_KINDS: tuple[ReplyKind, ...] = ("text", "never", "safe", "both", "paused", "retry")
# Repeats weight the draw: a plan mostly lets runs advance and releases what they wait for.
ACTIONS = ("prompt", "steer", "follow up", "abort", "crash", "release", "release", "tick", "tick", "progress",
           "progress")
Action = tuple[str, int]  # (what, a pick: which gate to release, how many loop turns or rounds to let pass)
actions = st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(min_value=0, max_value=7)),
                   max_size=14).map(lambda plan: [("prompt", 0), *plan])
replies = st.lists(st.sampled_from(REPLY_KINDS), max_size=8)


class Died(Exception):
    """What an effect of a closed harness's process sees: it never reports back."""


@dataclass
class Gates:
    """Everything the test holds shut in one attachment (a process): tool runs and paused
    streams, each waiting on its own event until `release`d, or for good once the process dies."""

    blocked: list[str] = field(default_factory=list)
    events: dict[str, asyncio.Event] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    dead: bool = False
    open_all: bool = False

    def gate(self, name: str) -> asyncio.Event:
        event = self.events.setdefault(name, asyncio.Event())
        if self.open_all or self.dead:
            event.set()
        elif not event.is_set():
            self.blocked.append(name)
            self.changed.set()
        return event

    def release(self, pick: int) -> None:
        if self.blocked:
            self.events[self.blocked.pop(pick % len(self.blocked))].set()

    def release_all(self) -> None:
        for name in self.blocked:
            self.events[name].set()
        self.blocked.clear()

    def die(self) -> None:
        self.dead = True
        self.release_all()


@dataclass
class World:
    """The durable session and what outlives every attachment: effects done, replies scripted."""

    session: Session
    script: list[ReplyKind]
    ledger: Counter[str] = field(default_factory=Counter)  # never-tool effects per call id
    lookups: Counter[str] = field(default_factory=Counter)  # safe-tool effects per call id
    requests: int = 0
    accepted: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # every operation a run_start announced
    ended: Counter[str] = field(default_factory=Counter)  # run_end per operation
    reserved: list[str] = field(default_factory=list)  # response ids a close left effect-pending
    fakes: list[FauxProvider] = field(default_factory=list)


@dataclass
class Attachment:
    """One harness on the session, as one process: its gates and its drive tasks."""

    harness: AgentHarness
    gates: Gates
    drives: list[asyncio.Task[object]] = field(default_factory=list)


def tools(world: World, gates: Gates) -> list[AgentTool]:
    def tool(name: str, effects: Counter[str], replay: Literal["never", "safe"]) -> AgentTool:
        async def execute(tool_call_id: str, args: dict[str, JsonValue],
                          on_update: Callable[[JsonValue, bool], Awaitable[None]], context: Context) -> ToolOutput:
            effects[tool_call_id] += 1
            released = asyncio.ensure_future(gates.gate(f"tool {tool_call_id}").wait())
            cancelled = asyncio.ensure_future(context.wait_cancelled())
            try:
                await asyncio.wait({released, cancelled}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                released.cancel()
                cancelled.cancel()
            if gates.dead:
                raise Died(tool_call_id)  # its harness is closed: nothing it returns could land
            if context.cancelled:
                return ToolOutput(content=[TextContent(text="cancelled")], is_error=True)
            return ToolOutput(content=[TextContent(text=f"{name} {args.get('key')}")])

        spec = ToolSpec(name=name, description=f"the {name} tool", parameters=KEY_SCHEMA)
        return AgentTool(spec=spec, execute=execute, replay=replay)

    return [tool(NEVER, world.ledger, "never"), tool(SAFE, world.lookups, "safe")]


def model(world: World, gates: Gates) -> Callable[[FauxRequest], FauxReply]:
    """Replies in the order `world.script` says, then text: the runs end."""

    def answer(recorded: FauxRequest) -> FauxReply:
        world.requests += 1
        n = world.requests
        kind = world.script[n - 1] if n <= len(world.script) else "text"
        never = tool_call(NEVER, {"key": f"k{n}"}, id=f"call-{n}-0")
        safe = tool_call(SAFE, {"key": f"k{n}"}, id=f"call-{n}-1")
        match kind:
            case "text":
                return reply(f"answer {n}")
            case "never":
                return reply(f"writing {n}", never)
            case "safe":
                return reply(safe)
            case "both":
                return reply(never, safe)
            case "paused":
                return reply(f"slow {n} ", delay(gates.gate(f"stream {n}")), "then calls", never, safe)
            case "retry":
                return failure("retryable", "overloaded", f"partial {n}", status=429)

    return answer


async def attach(world: World, context: Context) -> Attachment:
    gates = Gates()
    faux = FauxProvider(model(world, gates))
    world.fakes.append(faux)

    def listen(event: HarnessEvent, _: Context) -> None:
        if isinstance(event, RunStart):
            world.started.append(event.operation_id)
        elif isinstance(event, RunEnd):
            world.ended[event.operation_id] += 1

    options = AgentHarnessOptions(
        session=world.session, models=ModelRegistry([FAUX_MODEL], providers={"faux": faux}),
        tools=tools(world, gates), drive=drive_settings(), listeners=[listen],
    )
    harness, open_operations = await AgentHarness.create(options, context)
    attachment = Attachment(harness, gates)
    if open_operations:
        attachment.drives.append(asyncio.ensure_future(harness.lane("main").resume(context)))
    return attachment


async def progress(attachment: Attachment, rounds: int) -> None:
    """Let the drive run: until it settles, a gate shuts or `QUIET_S` passes without either."""
    for _ in range(rounds + 1):
        live = [task for task in attachment.drives if not task.done()]
        if not live:
            return
        attachment.gates.changed.clear()
        shut = asyncio.ensure_future(attachment.gates.changed.wait())
        try:
            await asyncio.wait({*live, shut}, timeout=QUIET_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            shut.cancel()


async def crash(world: World, attachment: Attachment, context: Context) -> Attachment:
    """Close the harness mid-run (its effects die with it) and attach a new one, which resumes."""
    await attachment.harness.close(context)
    attachment.gates.die()
    state = await world.session.get(addresses.lane_state("main"), context)
    if state is not None and state.current_operation_id is not None:
        phase = await world.session.get(addresses.operation_state(state.current_operation_id), context)
        if isinstance(phase, AssistantEffectPending):
            world.reserved.append(phase.response_entry_id)
    return await attach(world, context)


async def perform(world: World, attachment: Attachment, what: str, pick: int, context: Context) -> Attachment:
    """One public call; refusals of the lane's current state (busy, idle) are legal outcomes."""
    lane = attachment.harness.lane("main")
    said = UserMessage(content=f"{what} {len(world.started)}:{pick}")
    try:
        match what:
            case "prompt":
                accepted = await lane.accept(PromptRequest(messages=[said]), context)
                world.accepted.append(accepted.operation_id)
                attachment.drives.append(asyncio.ensure_future(lane.drive(accepted.operation_id, context)))
            case "steer":
                await lane.steer(said, context)
            case "follow up":
                await lane.follow_up(said, context)
            case "abort":
                await lane.request_abort("user", context)
            case "release":
                attachment.gates.release(pick)
            case "crash":
                return await crash(world, attachment, context)
            case "tick":  # a few turns of the event loop: lands the next call between two steps of the drive
                for _ in range(3 * pick):
                    await asyncio.sleep(0)
            case "progress":
                await progress(attachment, pick % 4)
    except (LaneBusy, NoActiveOperation):
        pass
    return attachment


async def finish(world: World, attachment: Attachment, context: Context) -> None:
    """Open every gate and drive until the lane is idle."""
    attachment.gates.open_all = True
    attachment.gates.release_all()
    lane = attachment.harness.lane("main")
    for _ in range(5):
        live = [task for task in attachment.drives if not task.done()]
        if live:
            await asyncio.wait_for(asyncio.wait(live), GUARD_S)
        if (await lane.inspect_execution(context)).current is None:
            return
        attachment.drives.append(asyncio.ensure_future(lane.resume(context)))
    raise AssertionError("the lane never went idle")


@pytest.fixture(params=["memory", "sqlite"])
async def drive_store(request: pytest.FixtureRequest, tmp_path: Path, ctx: Context) -> AsyncIterator[Store]:
    store = await connect(backend_url(request.param, tmp_path, request), ctx)
    try:
        yield store
    finally:
        await store.close()


# Interleavings that broke the drive, each deterministic on at least one backend (the scheduling
# differs between the in-process memory store and SQLite's worker thread):
# an abort lands after a tool-use reply streamed, before it is settled (memory);
@example(plan=[("prompt", 0), ("follow up", 0), ("tick", 6), ("abort", 0)], script=["never"])
# an abort lands just after the reply's text block started (memory);
@example(plan=[("prompt", 0), ("tick", 2), ("steer", 0), ("abort", 0)], script=[])
# a steer queued after the abort request, before the run settles (SQLite);
@example(plan=[("prompt", 0), ("steer", 0), ("abort", 0), ("steer", 0)], script=[])
# an abort that drains steers lands between the run's last checkpoint and its settlement (memory);
@example(plan=[("prompt", 0), ("steer", 0), ("prompt", 0), ("steer", 0), ("prompt", 0), ("prompt", 0), ("steer", 0),
               ("prompt", 0), ("steer", 0), ("abort", 0)], script=[])
# a close while the first call (never) runs and the second's result is staged, then a resume (both).
@example(plan=[("prompt", 0), ("progress", 0), ("steer", 0), ("release", 1), ("crash", 0)], script=["both"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=actions, script=replies)
async def test_interleaved_prompts_steers_aborts_and_crashes_keep_the_drive_invariants(
    drive_store: Store, ctx: Context, plan: list[Action], script: list[ReplyKind]
) -> None:
    """Issue 5, prove it: whatever the interleaving, every run settles once, every call has one
    result right after its reply, no `never` effect repeats, every request sent or built is valid
    for the three wire formats, and the lane ends idle with the last run's result."""
    session = await drive_store.create_session(ctx)
    await session.create_lane("main", CONFIG, ctx)
    world = World(session, script)
    attachments = [await attach(world, ctx)]

    for what, pick in plan:
        current = await perform(world, attachments[-1], what, pick, ctx)
        if current is not attachments[-1]:
            attachments.append(current)
    await finish(world, attachments[-1], ctx)

    for attachment in attachments:
        for task in attachment.drives:
            await asyncio.wait_for(asyncio.wait({task}), GUARD_S)
            error = task.exception()
            if attachment is attachments[-1] or error is None:
                assert error is None, "a drive failed:\n" + "".join(traceback.format_exception(error))
                assert isinstance(task.result(), Settled)
            else:  # a closed harness's drive stops at its next commit
                assert isinstance(error, HarnessClosed), f"a closed harness's drive failed: {error!r}"
    lane = attachments[-1].harness.lane("main")
    execution = await lane.inspect_execution(ctx)
    assert execution.current is None
    if world.accepted:
        assert execution.last_result is not None
        assert execution.last_result.operation_id == world.accepted[-1]
    assert world.ended == Counter(set(world.started)), "an operation did not settle exactly once"
    for faux in world.fakes:
        for recorded in faux.requests:
            assert_valid_everywhere(recorded.request)
    await attachments[-1].harness.close(ctx)

    specs = [tool.spec for tool in tools(world, Gates())]
    journal = await check_journal(session, "main", ctx, tools=specs, operation_ids=world.started,
                                  reserved_ids=world.reserved)
    assert all(runs == 1 for runs in world.ledger.values()), f"a never tool ran twice: {world.ledger}"
    assert set(world.ledger) | set(world.lookups) <= {call.id for call in journal.calls()}
