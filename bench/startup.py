"""Start-up benchmark: how long `harness` takes before it does anything, next to a bare Python start.

Each command is a new process of this venv's `harness`, timed from its start to its exit (for the
chat: to its prompt, drawn after its start screen, in a pseudo-terminal),
alternated with `python -c pass` of the same interpreter so that a busy machine weighs on both:

1. `harness --version`
2. `harness --help`, as printed from its cache (`harness.__main__.help_cache`) after the first time
3. `harness --help` the first time for this version, source and width: the cache emptied before each
4. `harness chat` to its first prompt, drawn before the chat loads (`harness.chat_start`), and
5. `harness chat` to its own prompt (a new session on the default model, with no key set: the
   embedded one, whose weights are read only at the first turn), then Ctrl-D.

Prints the median seconds of each and its ratio to the bare start (the median of the pairwise
ratios). Goals (issue 33; a benchmark, not a test): `--version` and `--help` within 3x a bare
start, the chat's first prompt within 5x; the first `--help` and the chat's own prompt have none.
Run: `.venv/bin/python -m bench.startup [--runs N]` (default 15).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pexpect

HARNESS = Path(sys.executable).with_name("harness")
CHAT_READY = "/help: commands"  # the start screen's last line
PROMPT = "›"  # drawn after it, once the prompt reads keys
TIMEOUT_S = 120
LEAVE_RETRY_S = 0.5


def bare_start() -> float:
    """Seconds for `python -c pass` from its start to its exit."""
    return timed([sys.executable, "-c", "pass"])


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   timeout=TIMEOUT_S)
    return time.perf_counter() - start


def chat_to_prompt(home: Path, env: dict[str, str], *, first: bool = False) -> float:
    """Seconds from starting `harness chat` until its prompt is ready (`first`: until the prompt
    drawn while it loads takes keys); the chat is then left."""
    start = time.perf_counter()
    chat = pexpect.spawn(str(HARNESS), ["chat"], cwd=str(home), env=env, encoding="utf-8", dimensions=(50, 120),
                         timeout=TIMEOUT_S)
    if not first:
        chat.expect_exact(CHAT_READY)
    chat.expect_exact(PROMPT)
    elapsed = time.perf_counter() - start
    # A Ctrl-D that lands before the prompt has put the terminal in raw mode is read as an empty
    # line by the terminal itself, so it is sent until the chat ends.
    while chat.expect([pexpect.EOF, pexpect.TIMEOUT], timeout=LEAVE_RETRY_S) != 0:
        chat.sendcontrol("d")
    chat.close()
    return elapsed


def first_help(home: Path, env: dict[str, str]) -> float:
    """Seconds for `harness --help` with its cache emptied first (the emptying is not timed)."""
    shutil.rmtree(home / "cache", ignore_errors=True)
    return timed([str(HARNESS), "--help"], env)


def environment(home: Path) -> dict[str, str]:
    """This environment without any provider or store configuration, on a home of its own."""
    kept = {name: value for name, value in os.environ.items()
            if not name.endswith(("_API_KEY", "_BASE_URL")) and name not in ("HARNESS_STORE", "HARNESS_HOME")}
    return {**kept, "HARNESS_HOME": str(home), "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"}


def measure(name: str, command: Callable[[], float], runs: int) -> tuple[str, float, float, float]:
    """`(name, median seconds, median bare seconds, median of the pairwise ratios)`: each run of
    `command` is paired with a bare start just before it, after one warm-up of each."""
    command(), bare_start()
    seconds, bares, ratios = [], [], []
    for _ in range(runs):
        bare = bare_start()
        took = command()
        seconds.append(took)
        bares.append(bare)
        ratios.append(took / bare)
    return name, statistics.median(seconds), statistics.median(bares), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="measured runs per command (default 15)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="harness-startup-") as folder:
        home = Path(folder)
        env = environment(home)
        rows = [
            measure("harness --version", lambda: timed([str(HARNESS), "--version"], env), args.runs),
            measure("harness --help", lambda: timed([str(HARNESS), "--help"], env), args.runs),
            measure("harness --help, first time", lambda: first_help(home, env), args.runs),
            measure("harness chat, first prompt", lambda: chat_to_prompt(home, env, first=True), args.runs),
            measure("harness chat, to its prompt", lambda: chat_to_prompt(home, env), args.runs),
        ]
    goals = {"harness --version": "3x", "harness --help": "3x", "harness chat, first prompt": "5x"}
    print(f"{'command':<30} {'median s':>9} {'bare s':>7} {'ratio':>6} {'goal':>5}")
    for name, seconds, bare, ratio in rows:
        print(f"{name:<30} {seconds:>9.3f} {bare:>7.3f} {ratio:>5.1f}x {goals.get(name, '-'):>5}")


if __name__ == "__main__":
    main()
