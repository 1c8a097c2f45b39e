"""A worker whose drive of a session fails with an unexpected exception (a bug, not a failing store
or a claimant) says so with its traceback, leaves the session alone for `backoff_s` and then
drives it to its end; it neither dies nor claims the session again at once. In-process, on
PostgreSQL (the work board needs it); the fault is injected into `Lane.drive`."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from conversation_helpers import faux_service
from drive_helpers import FAUX, within
from harness.context import Context
from harness.providers.faux import reply
from harness.runtime import Lane
from harness.session import LaneConfig, Store, addresses
from harness.worker import Worker, WorkerOptions

pytestmark = pytest.mark.postgres

BACKOFF_S = 0.3


async def test_an_unexpected_drive_failure_is_logged_backed_off_and_the_run_still_ends(
        ledger_store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    api, _ = faux_service(ledger_store, [])
    conversation = await api.create("ada", LaneConfig(model=FAUX), ctx)
    await api.admit("ada", conversation.id, "hello", ctx)
    await api.close("ada", conversation.id, ctx)
    service, _ = faux_service(ledger_store, [reply("hi there")])
    started: list[float] = []
    ended = asyncio.Event()
    drive = Lane.drive

    async def failing_once(self: Lane, *args: Any, **kwargs: Any) -> Any:
        started.append(time.monotonic())
        if len(started) == 1:
            raise RuntimeError("a bug in the drive")
        outcome = await drive(self, *args, **kwargs)
        ended.set()
        return outcome

    monkeypatch.setattr(Lane, "drive", failing_once)
    worker = Worker(service, WorkerOptions(poll_s=0.05, backoff_s=BACKOFF_S, stop_grace_s=5.0))
    running = asyncio.get_running_loop().create_task(worker.run(ctx))
    with caplog.at_level(logging.ERROR, logger="harness.worker"):
        await within(ended.wait())
        worker.stop()
        await within(running)

    failures = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info is not None]
    assert [str(r.exc_info[1]) for r in failures if r.exc_info] == ["a bug in the drive"]
    assert len(started) == 2
    assert started[1] - started[0] >= BACKOFF_S
    session = await ledger_store.open_session(conversation.id, ctx)
    result = await session.get(addresses.lane_last_result("main"), ctx)
    assert result is not None
    assert result.outcome == "completed"
