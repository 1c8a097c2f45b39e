"""The loopback load of `harness serve`, bounded (bench/serve_load.py at 4 conversations x 2
watchers, each watcher dropping its connection every 15 events, the clients in a process of their
own): every watcher receives exactly its lane's durable event log, no gap and no duplicate, across
its resumes (issue 16, done-when)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_bounded_load_leaves_no_watcher_with_a_gap_or_a_duplicate() -> None:
    run = subprocess.run([sys.executable, "-m", "bench.serve_load", "--conversations", "4", "--watchers", "2",
                          "--turns", "3", "--reconnect-every", "15", "--client-processes", "1", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=False)

    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)
    assert (figures["gaps"], figures["duplicates"]) == (0, 0)
    assert figures["watchers_matching_log"] == figures["watchers"] == 8
    assert figures["resumes"] >= 8  # every watcher resumed from an event id at least once
    assert figures["events_per_second"] > 0
