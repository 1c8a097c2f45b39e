"""Runs one pip command of `make`'s set-up with its output in a log, saying what takes long.

The first install compiles llama.cpp for the embedded model, minutes of silence under `pip --quiet`
(issue 33, item 1). This runs the command given after `--` (a verbose pip, so the compile's steps
reach us), keeps every line in the log, and prints only: what is about to happen and about how long,
the compile's start, a line at each further tenth of it (or a minute without one) and its end. If
the command fails, the end of the log and where the rest is.

Usage: python scripts/pip_progress.py LOG -- PIP install --verbose ...
Exits with the command's status. Standard library only: it runs before the venv has anything.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

COMPILE_ESTIMATE = "10 to 20 minutes on two cores, longer when they are busy"
# Ninja's "[12/345] Building C object ..." or Make's "[ 12%] Building ...", as the build prints them.
STEP = re.compile(r"^\s*\[\s*(?:(\d+)/(\d+)|(\d+)%)\]")
BUILDING = re.compile(r"Building wheel for ([\w.-]+)")
BUILT = re.compile(r"Created wheel for ([\w.-]+)")
COMPILED = "llama-cpp-python"
QUIET_S = 60.0
TAIL_LINES = 40


def is_compiled(wheel: re.Match[str] | None) -> bool:
    """Whether a BUILDING or BUILT match names llama-cpp-python, however pip spells it."""
    return wheel is not None and wheel.group(1).replace("_", "-").lower() == COMPILED


class Progress:
    """What has been said about the compile, so each tenth is said once; thread-safe."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._started: float | None = None
        self._compiled = False
        self._said_tenths = 0
        self._last_said = time.monotonic()

    def line(self, text: str) -> None:
        """Reads one line of the command's output and says what it means for the compile, if anything."""
        with self._lock:
            # pip names the wheel again when the build finishes: only the first mention starts it.
            if not self._compiled and self._started is None and is_compiled(BUILDING.search(text)):
                self._started = self._last_said = time.monotonic()
                self._say(f"Compiling llama.cpp for the embedded model ({COMPILE_ESTIMATE}; once, then cached)...")
            elif is_compiled(BUILT.search(text)) and self._started is not None:
                self._say(f"llama.cpp compiled in {self._minutes()}.")
                self._started = None
                self._compiled = True
            elif self._started is not None and (step := STEP.match(text)):
                percent = int(step.group(3)) if step.group(3) else 100 * int(step.group(1)) // int(step.group(2))
                if percent // 10 > self._said_tenths:
                    self._said_tenths = percent // 10
                    self._say(f"  llama.cpp: {percent}% compiled ({self._minutes()})")

    def quiet_for(self, seconds: float) -> None:
        """Says the compile is still running if nothing was said for `seconds`."""
        with self._lock:
            if self._started is not None and time.monotonic() - self._last_said >= seconds:
                self._say(f"  still compiling llama.cpp ({self._minutes()})")

    def _minutes(self) -> str:
        assert self._started is not None
        minutes = int(time.monotonic() - self._started) // 60
        return "under a minute" if minutes == 0 else f"{minutes} min"

    def _say(self, text: str) -> None:
        self._last_said = time.monotonic()
        print(text, file=self._out, flush=True)


def run(log_path: Path, command: list[str], out: TextIO) -> int:
    """Runs `command`, its output (stdout and stderr) to `log_path`, and returns its exit status."""
    print("Installing the dependencies into .venv. The first time, pip compiles llama.cpp for the "
          f"embedded model: {COMPILE_ESTIMATE}. The full output goes to {log_path}.", file=out, flush=True)
    progress = Progress(out)
    finished = threading.Event()

    def beat() -> None:
        while not finished.wait(QUIET_S / 4):
            progress.quiet_for(QUIET_S)

    heartbeat = threading.Thread(target=beat, daemon=True)
    heartbeat.start()
    with log_path.open("w") as log, subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
    ) as process:
        assert process.stdout is not None
        for text in process.stdout:
            log.write(text)
            progress.line(text)
        status = process.wait()
    finished.set()
    heartbeat.join()
    if status != 0:
        tail = log_path.read_text().splitlines()[-TAIL_LINES:]
        print("\n".join(tail), file=out)
        print(f"The install failed (exit status {status}); its full output is in {log_path}.", file=out, flush=True)
    return status


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    return run(Path(argv[0]), argv[2:], sys.stdout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
