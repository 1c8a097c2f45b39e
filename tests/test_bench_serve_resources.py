"""The resource bench of `harness serve`, bounded (bench/serve_resources.py at 10 idle watchers, a
256 KiB reply and 9 conversations in turn on a server holding at most 2): it runs, prints its
figures, and the server keeps its bounds: the descriptors stay flat once it holds its most
conversations, and a never-reading client's held bytes stay within the byte bound (issue 29,
Targets)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_bounded_run_prints_its_figures_and_the_server_keeps_its_bounds() -> None:
    run = subprocess.run([sys.executable, "-m", "bench.serve_resources", "--watchers", "10", "--reply-bytes",
                          "262144", "--reply-seconds", "0.1", "--conversations", "9", "--sample-every", "3",
                          "--max-held", "2", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=False)

    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)
    assert figures["idle"]["watchers"] == 10
    assert figures["idle"]["rss_with_watchers_mib"] > 0
    assert figures["never_reading"]["held_within_bound"]
    samples = figures["in_turn"]["samples"]
    assert [sample["conversations"] for sample in samples] == [0, 3, 6, 9]
    assert max(sample["held"] for sample in samples) == 2
    assert figures["in_turn"]["descriptors_flat"]
