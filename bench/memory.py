"""What large input and large tool output cost in resident memory (issue 11, item 10).

Run: `.venv/bin/python -m bench.memory [--output-mb N]`.

Each case runs in a fresh Python process, so its peak resident size (Linux's VmHWM) is its own:

1. a prompt just under `MAX_INPUT_BYTES` through `Lane.prompt` on a SQLite store, the faux
   provider answering (a model with a window that fits it, so nothing refuses it);
2. a shell call printing N MB (default 50) as one line, and as lines of four bytes;
3. the read tool paging that one-line output, as the shell's note tells the model to.

It prints the peak resident memory each case added over the process before it, and that as a
multiple of the input or output (the baseline: the bytes handled). Nothing here is a test.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path

from pydantic import JsonValue

from harness.context import Context
from harness.messages import ModelIdentity
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry
from harness.runtime import AgentHarness, AgentHarnessOptions, Settled
from harness.runtime.requests import MAX_INPUT_BYTES
from harness.session import LaneConfig, connect
from harness.tools import Workspace, builtin_tools

CASES = ("prompt", "shell-one-line", "shell-short-lines", "read-one-line")


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


async def _prompt(folder: Path, size: int, context: Context) -> None:
    store = await connect(f"sqlite:///{folder}/bench.db", context)
    session = await store.create_session(context)
    await session.create_lane("main", LaneConfig(model=ModelIdentity(provider="faux", model_id=FAUX_MODEL.id)),
                              context)
    model = FAUX_MODEL.model_copy(update={"context_window": 10 * MAX_INPUT_BYTES})
    registry = ModelRegistry([model], providers={"faux": FauxProvider(["ok"])})
    harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session, models=registry), context)
    outcome = await harness.lane("main").prompt("p" * size, None, context)
    if not isinstance(outcome, Settled) or outcome.result.outcome != "completed":
        raise RuntimeError(f"the benchmark run did not complete: {outcome}")
    await harness.close(context)
    await store.close()


async def _tool(folder: Path, name: str, args: dict[str, JsonValue], context: Context) -> None:
    workspace = Workspace(root=folder, output_dir=folder / "tool-output")
    tool = {tool.name: tool for tool in builtin_tools(workspace)}[name]

    async def ignore(partial: JsonValue, checkpoint: bool) -> None:
        return None

    output = await tool.execute("bench", args, ignore, context)
    if output.is_error:
        raise RuntimeError(f"the benchmark's {name} call failed: {output.content}")


def run_case(case: str, size: int) -> float:
    """Run `case` here and return the peak resident MB it added."""
    context = Context()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        work: Coroutine[None, None, None]
        if case == "prompt":
            work = _prompt(folder, size, context)
        elif case == "read-one-line":
            with (folder / "kept.log").open("wb") as kept:  # a megabyte at a time: not measured
                for _ in range(size // 1_000_000):
                    kept.write(b"a" * 1_000_000)
            work = _tool(folder, "read", {"path": "kept.log"}, context)
        else:
            lines = case == "shell-short-lines"
            command = f"yes abc | head -c {size}" if lines else f"head -c {size} /dev/zero | tr '\\0' a"
            work = _tool(folder, "shell", {"command": command}, context)
        before = _status_mb("VmRSS")
        asyncio.run(work)
        return _status_mb("VmHWM") - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-mb", type=int, default=50, help="the shell output's size in MB")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in a child process
    args = parser.parse_args()
    output = args.output_mb * 1_000_000
    if args.case is not None:
        print(run_case(args.case, MAX_INPUT_BYTES - 1_000 if args.case == "prompt" else output))
        return
    for case in CASES:
        size = MAX_INPUT_BYTES - 1_000 if case == "prompt" else output
        child = subprocess.run([sys.executable, "-m", "bench.memory", "--case", case, "--output-mb",
                                str(args.output_mb)], capture_output=True, text=True, check=True)
        added = float(child.stdout.strip())
        print(f"{case:18s} {size / 1e6:6.1f} MB handled   peak resident +{added:6.1f} MB   "
              f"{added / (size / 1e6):5.2f}x the bytes handled")


if __name__ == "__main__":
    main()
