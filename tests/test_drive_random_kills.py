"""Random-time SIGKILL campaign: a child process drives two turns with a never-replay and a
replay-safe tool and is killed at a random moment; in a third of the trials the child that
recovers is killed too; then this process recovers what is left. Every invariant of the crash
suite holds every time: each call answered once right after its reply, no never-replay effect
run twice, nothing left open (issue 11, prove it).

Bounded for the suite: `HARNESS_KILL_TRIALS` trials per backend (default 2). `make soak` runs the
long campaign (300 per backend)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from pathlib import Path

import pytest

from conftest import backend_url
from drive_crash_child import CONFIG, NEVER, OPERATIONS_LOG, SAFE, CrashTools, attach, check_journal, effects, script
from harness.context import Context
from harness.providers import FauxProvider
from harness.session import SessionOwned, connect

TESTS = Path(__file__).resolve().parent
TRIALS = int(os.environ.get("HARNESS_KILL_TRIALS", "2"))
CHILD_TIMEOUT_S = 60.0  # a guard against a hang, never a wait for something
KILL_WITHIN_S = 0.6  # two turns take about this long on this machine: kills land in every phase


@pytest.fixture(params=["sqlite", "postgres"])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request, durable=True)


async def run_and_maybe_kill(url: str, session_id: str, workdir: Path, mode: str, kill_after_s: float | None) -> None:
    """Start a child in `mode`; once it is attached, SIGKILL it after `kill_after_s` (None: let it finish)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(TESTS / "drive_crash_child.py"), url, session_id, str(workdir), mode,
        env={**os.environ, "PYTHONPATH": str(TESTS)}, stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        assert await asyncio.wait_for(process.stdout.readline(), CHILD_TIMEOUT_S) == b"ready\n"
        if kill_after_s is not None:
            try:
                await asyncio.wait_for(process.wait(), kill_after_s)  # it may finish first: fine
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):  # it ended as the wait timed out
                    process.kill()
        await asyncio.wait_for(process.wait(), CHILD_TIMEOUT_S)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    assert process.returncode in (0, -9), f"the {mode} child failed with {process.returncode}"


@pytest.mark.parametrize("trial", range(TRIALS))
async def test_a_run_killed_at_a_random_time_recovers_with_every_invariant(
    durable_url: str, tmp_path: Path, ctx: Context, trial: int
) -> None:
    chance = random.Random(f"{durable_url.split(':')[0]}-{trial}-{os.environ.get('HARNESS_KILL_SEED', '')}")
    store = await connect(durable_url, ctx)
    try:
        session = await store.create_session(ctx)
        await session.create_lane("main", CONFIG, ctx)

        await run_and_maybe_kill(durable_url, session.id, tmp_path, "drive", chance.uniform(0, KILL_WITHIN_S))
        if chance.random() < 1 / 3:
            await run_and_maybe_kill(durable_url, session.id, tmp_path, "resume", chance.uniform(0, KILL_WITHIN_S / 2))

        faux = FauxProvider(script("final"))
        for _ in range(200):  # a killed child's PostgreSQL lock goes when the server notices
            try:
                harness, open_operations = await attach(session, CrashTools(tmp_path).tools, faux, ctx)
                break
            except SessionOwned:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the killed child's session claim was never released")
        try:
            for operation in open_operations:
                await asyncio.wait_for(harness.lane(operation.lane).resume(ctx), CHILD_TIMEOUT_S)
            assert (await harness.lane("main").inspect_execution(ctx)).current is None
        finally:
            await harness.close(ctx)

        log = tmp_path / OPERATIONS_LOG
        # A child killed between an acceptance and its `run_start` never logged that operation.
        operations = [*(log.read_text().split() if log.exists() else []),
                      *(operation.operation_id for operation in open_operations)]
        journal = await check_journal(session, "main", ctx, tools=[t.spec for t in CrashTools(tmp_path).tools],
                                      operation_ids=operations)
        ledger, lookup = effects(tmp_path, NEVER), effects(tmp_path, SAFE)
        assert all(runs == 1 for runs in ledger.values()), f"a never-replay tool ran twice: {ledger}"
        on_branch = {call.id for call in journal.calls()}
        assert set(ledger) | set(lookup) <= on_branch, "a tool ran for a call that is not on the branch"
    finally:
        await store.close()
