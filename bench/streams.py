"""Where the benchmarks read provider streams: the recorded corpus in `../shared` when it lies
beside the checkout (in development and CI), else the project's own streams in `tests/streams`."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORDED_STREAMS = REPO.parent / "shared" / "fixtures" / "provider-streams"
PROJECT_STREAMS = REPO / "tests" / "streams"


def has_recorded_streams() -> bool:
    """Whether the recorded corpus is there; if not, says on stderr that the project's streams stand in."""
    if RECORDED_STREAMS.is_dir():
        return True
    print(f"note: {RECORDED_STREAMS} is not beside this checkout; measuring the project's own streams in "
          f"{PROJECT_STREAMS} instead (smaller bodies: figures are not comparable with bench/README.md)",
          file=sys.stderr)
    return False
