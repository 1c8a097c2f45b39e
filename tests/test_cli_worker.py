"""`harness worker` as a command: it refuses a store other processes cannot share its work on,
and on PostgreSQL it runs until SIGTERM and then exits cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.cli.worker_commands import WORKER_NICE
from test_cli_run import environment
from test_cli_sessions import harness


def test_a_worker_needs_a_postgresql_store(tmp_path: Path) -> None:
    """A SQLite store has no channel to wake workers and no lease to end: refused with its code."""
    done = harness(tmp_path, "worker", "--store", f"sqlite:///{tmp_path / 'harness.db'}")

    assert done.returncode == 1
    assert "error [work_needs_postgres]" in done.stderr


def test_a_worker_runs_until_sigterm_and_exits_cleanly(postgres_schema_url: str, tmp_path: Path) -> None:
    """Started on PostgreSQL it says so once its stop signals are wired, at a CPU priority lowered
    by `WORKER_NICE` (issue 29: the server and the database answer first); SIGTERM ends it with 0."""
    worker = subprocess.Popen([sys.executable, "-m", "harness.cli", "worker", "--store", postgres_schema_url,
                               "--concurrency", "2"], cwd=tmp_path, env=environment(tmp_path),
                              stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stderr is not None
        assert "driving up to 2 sessions at once" in worker.stderr.readline()
        assert os.getpriority(os.PRIO_PROCESS, worker.pid) == os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        if worker.stderr is not None:
            worker.stderr.close()
