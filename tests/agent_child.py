"""The crash test's child: `python agent_child.py` runs one `harness.Agent` turn in the journal
under $HARNESS_HOME, on `openai/gpt-4o` (the test's replay server, from OPENAI_BASE_URL) with the
two tools below, and SIGKILLs itself inside the first tool call it makes, after the call's
effect: what a crash in the middle of a tool looks like to the journal.

Shared with the test, which continues the conversation with the same tools: `lookup` (a read,
`replay="safe"`) and `ledger` (a write, the default never-replay), each appending a line to
`calls.log` in `$AGENT_CHILD_WORKDIR` per run, so the test counts how often each ran; with
`AGENT_CHILD_DIE=1` the first call kills the process.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from harness import Agent, tool

CALLS = "calls.log"


def calls(workdir: Path) -> list[str]:
    """The tools' runs so far, oldest first."""
    log = workdir / CALLS
    return log.read_text().splitlines() if log.exists() else []


def _called(name: str) -> None:
    log = Path(os.environ["AGENT_CHILD_WORKDIR"]) / CALLS
    first = not log.exists()
    with log.open("a") as file:
        file.write(f"{name}\n")
    if first and os.environ.get("AGENT_CHILD_DIE") == "1":
        os.kill(os.getpid(), signal.SIGKILL)


@tool(replay="safe")
def lookup(key: str) -> str:
    """Read a value.

    Args:
        key: Which value.
    """
    _called("lookup")
    return f"value of {key}"


@tool
def ledger(amount: int) -> str:
    """Book an amount.

    Args:
        amount: Cents to book.
    """
    _called("ledger")
    return f"booked {amount}"


if __name__ == "__main__":
    Agent("openai/gpt-4o", tools=[lookup, ledger]).run_sync("Do the thing.")
    print("the tool call never killed this process")
