"""Crash at every fault point, then recover: a child process drives a run on a durable store and
SIGKILLs itself at one `FaultPoint`; a new harness reopens the store, finds the operation open,
resumes it, and the journal holds every tool result once, no repeated `never` effect, no frames,
valid requests for every wire format, and an idle lane with the operation's result (issue 5).
White-box: it names the runtime's `fault_points`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import backend_url
from drive_crash_child import (
    CONFIG,
    NEVER,
    OPERATIONS_LOG,
    SAFE,
    CrashTools,
    attach,
    check_journal,
    effects,
    script,
)
from harness.context import Context
from harness.messages import TextContent, ToolResultMessage
from harness.providers import FauxProvider
from harness.runtime import AgentHarness, OpenOperation, Settled
from harness.runtime.fault_points import ENVIRONMENT_VARIABLE, FaultPoint
from harness.session import SessionOwned, Store, addresses, connect
from harness.session.records import AssistantEffectPending
from request_validators import assert_valid_everywhere

TESTS = Path(__file__).resolve().parent
CHILD_TIMEOUT_S = 60.0  # a guard against a child that never reaches its point, never a wait
ATTACH_ATTEMPTS = 200  # PostgreSQL drops a dead connection's lock when it notices the hang-up


@dataclass(frozen=True)
class Case:
    """What the child leaves at `point`: the operation's kind and durable phase, and how many
    times the child's `ledger` (never) and `lookup` (safe) calls must have run in the end."""

    kind: str
    phase: str
    ledger_runs: int
    lookup_runs: int


CASES: dict[FaultPoint, Case] = {
    # The reply never landed: it is settled as an interrupted attempt and retried by the new
    # process, whose own calls each run once; the child's calls never ran.
    FaultPoint.ASSISTANT_INTENT: Case("run", "assistant_effect_pending", 0, 0),
    FaultPoint.MID_STREAM: Case("run", "assistant_effect_pending", 0, 0),
    FaultPoint.BEFORE_REPLY_SETTLEMENT: Case("run", "assistant_effect_pending", 0, 0),
    # The ledger call was at its intent: it may have happened, so it is answered as interrupted.
    FaultPoint.TOOL_INTENT: Case("run", "tools", 0, 1),
    # The ledger's effect happened beside a staged lookup result: the ledger is answered as
    # interrupted and not run again; the staged lookup result is kept, not run again either.
    FaultPoint.TOOL_EFFECT: Case("run", "tools", 1, 1),
    # Both effects happened, neither result was staged: the ledger is not run again, the lookup is.
    FaultPoint.BEFORE_TOOL_STAGING: Case("run", "tools", 1, 2),
    # Both results landed with the next step's intent: neither call runs again, the reply is asked.
    FaultPoint.NEXT_STEP_INTENT: Case("run", "assistant_effect_pending", 1, 1),
    FaultPoint.SUMMARY_INTENT: Case("compaction", "summary_pending", 2, 2),
    FaultPoint.BEFORE_TERMINAL_SETTLEMENT: Case("run", "checkpoint", 1, 1),
    # The last reply and the run's settlement were one commit, not written: the calls before it
    # are kept, and the reply is asked again.
    FaultPoint.BEFORE_FINAL_REPLY_SETTLEMENT: Case("run", "assistant_effect_pending", 1, 1),
}


@pytest.fixture(params=["sqlite", "postgres"])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request)


async def run_child(url: str, session_id: str, workdir: Path, point: FaultPoint) -> None:
    """Run the child program against the session, armed to die at `point`; it must die by SIGKILL."""
    env = {**os.environ, ENVIRONMENT_VARIABLE: point.value, "PYTHONPATH": str(TESTS)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(TESTS / "drive_crash_child.py"), url, session_id, str(workdir), env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        stdout, _ = await asyncio.wait_for(process.communicate(), CHILD_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"the child never reached {point} within {CHILD_TIMEOUT_S} s")
    assert process.returncode == -signal.SIGKILL, f"the child was not killed at {point}: {stdout.decode()!r}"


async def reattach(store: Store, session_id: str, workdir: Path, faux: FauxProvider,
                   context: Context) -> tuple[AgentHarness, list[OpenOperation]]:
    """Attach a new harness, as a restarted process would. A killed child's PostgreSQL lock goes
    when the server sees its connection hang up, which no event here announces: retry briefly."""
    session = await store.open_session(session_id, context)
    for _ in range(ATTACH_ATTEMPTS):
        try:
            return await attach(session, CrashTools(workdir).tools, faux, context)
        except SessionOwned:
            await asyncio.sleep(0.05)
    pytest.fail("the killed child's session claim was never released")


@pytest.mark.parametrize("point", list(FaultPoint))
async def test_a_drive_killed_at_a_fault_point_settles_correctly_on_resume(
    point: FaultPoint, durable_url: str, tmp_path: Path, ctx: Context
) -> None:
    """Issue 5, prove it: SIGKILL at `point`, reopen, resume; every invariant holds."""
    case = CASES[point]  # a fault point without a case fails here
    store = await connect(durable_url, ctx)
    try:
        session = await store.create_session(ctx)
        await session.create_lane("main", CONFIG, ctx)

        await run_child(durable_url, session.id, tmp_path, point)

        lane_state = await session.get(addresses.lane_state("main"), ctx)
        assert lane_state is not None
        assert lane_state.current_operation_id is not None
        operation_id = lane_state.current_operation_id
        crashed = await session.get(addresses.operation_state(operation_id), ctx)
        assert crashed is not None
        assert crashed.phase == case.phase
        reserved = [crashed.response_entry_id] if isinstance(crashed, AssistantEffectPending) else []
        if point in (FaultPoint.MID_STREAM, FaultPoint.BEFORE_REPLY_SETTLEMENT):
            assert await session.read_list(addresses.assistant_frames(operation_id, reserved[0]), ctx) != []
        faux = FauxProvider(script("p"))
        harness, open_operations = await reattach(store, session.id, tmp_path, faux, ctx)
        try:
            assert [(o.lane, o.operation_id, o.kind) for o in open_operations] == [("main", operation_id, case.kind)]
            lane = harness.lane("main")

            outcome = await asyncio.wait_for(lane.resume(ctx), CHILD_TIMEOUT_S)

            assert isinstance(outcome, Settled)
            assert (outcome.operation_id, outcome.result.outcome) == (operation_id, "completed")
            execution = await lane.inspect_execution(ctx)
            assert execution.current is None
            assert execution.last_result == outcome.result
            assert await session.get(addresses.lane_last_result("main"), ctx) == outcome.result
            for recorded in faux.requests:  # what the new process actually sent
                assert_valid_everywhere(recorded.request)
        finally:
            await harness.close(ctx)

        operations = [*(tmp_path / OPERATIONS_LOG).read_text().split(), operation_id]
        journal = await check_journal(session, "main", ctx, tools=[t.spec for t in CrashTools(tmp_path).tools],
                                      operation_ids=operations, reserved_ids=reserved)
        ledger, lookup = effects(tmp_path, NEVER), effects(tmp_path, SAFE)
        assert all(runs == 1 for runs in ledger.values()), f"a never tool ran twice: {ledger}"
        on_branch = {call.id for call in journal.calls()}
        assert set(ledger) | set(lookup) <= on_branch, "a tool ran for a call that is not on the branch"
        child_ledger = sum(n for call, n in ledger.items() if call.startswith("call-c-"))
        child_lookup = sum(n for call, n in lookup.items() if call.startswith("call-c-"))
        assert (child_ledger, child_lookup) == (case.ledger_runs, case.lookup_runs)
        if case.phase == "tools":
            ledger_result = next(m for _, m in journal.messages
                                 if isinstance(m, ToolResultMessage) and m.tool_name == NEVER)
            assert ledger_result.is_error
            assert "interrupted" in "".join(b.text for b in ledger_result.content if isinstance(b, TextContent))
    finally:
        await store.close()
