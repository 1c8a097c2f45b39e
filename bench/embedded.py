"""Embedded model benchmark: how soon the default model answers, and how soon a cancel settles.

Runs SmolLM2-135M in this process through `EmbeddedProvider`, as `harness chat` does (the chat's
system prompt, greedy decoding). Each measured turn starts in a new working directory, which the
system prompt names near its start, so almost nothing of an earlier prompt is reused: every figure
is that of the first turn of a new chat.

1. First text: seconds from the request to the first text delta for "Hello! Who are you?",
   without tools (the default for the tiny model) and with the six built-in tools offered; the
   first run of the process (which also loads the model) apart, then the median of the others.
2. Cancel settle: seconds from `Context.cancel()` to the end of the stream (the worker thread has
   stopped and the model is free again), once per phase: reading a long prompt, generating a
   forced tool call's arguments, generating text, and the first second of a turn with tools.
3. Threads: seconds for an 80-token reply with 1 and with 2 llama.cpp threads (a provider per
   count), first on this machine as it is, then beside one process per CPU that works and waits
   in turns of a few milliseconds (as the processes of a test run on several workers do). It is
   why a reply by default takes every CPU on a quiet machine and 1 thread on a busy one.

Goals (a benchmark, not a test): first text under 2 s for a plain turn, every cancel settled
within 1 s. Run: `.venv/bin/python -m bench.embedded [--runs N]` (default 3 plain turns per side).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness.context import Context
from harness.messages import UserMessage
from harness.providers import (
    EMBEDDED_IDENTITY,
    DoneEvent,
    ErrorEvent,
    Model,
    ModelRegistry,
    Provider,
    ProviderRequest,
    StreamEvent,
    StreamOptions,
    ToolSpec,
)
from harness.providers.embedded import EmbeddedProvider
from harness.tools import Workspace, builtin_tools, system_prompt

FIRST_TEXT_GOAL_S = 2.0
CANCEL_GOAL_S = 1.0
HELLO = "Hello! Who are you?"
GREEDY = StreamOptions(temperature=0.0, seed=42)
TOOLS = tuple(tool.spec for tool in builtin_tools(Workspace(root=Path("/tmp"), output_dir=Path("/tmp"))))
# About 2,000 tokens: reading it takes the model several seconds.
LONG_PROMPT = "Summarize the following notes.\n" + "The harness writes every turn to its journal. " * 220

# A neighbour that works and waits in turns of a few milliseconds, as test processes and servers do.
BURSTS = "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.004: pass\n" \
    "    time.sleep(0.004)\n"

_runs = 0


def request(text: str, tools: tuple[ToolSpec, ...] = ()) -> ProviderRequest:
    """One user turn with the chat's system prompt, in a working directory no earlier turn used."""
    global _runs
    _runs += 1
    workspace = Workspace(root=Path(f"/tmp/bench-embedded-{_runs}"), output_dir=Path("/tmp"))
    return ProviderRequest(system_prompt=system_prompt(workspace), messages=(UserMessage(content=text),), tools=tools)


async def first_text(model: Model, provider: Provider, tools: tuple[ToolSpec, ...]) -> float:
    """Seconds from the request to the first text (or tool call) delta of a Hello turn; the
    stream is then cancelled and drained."""
    context = Context()
    start = time.perf_counter()
    elapsed = float("nan")
    async for event in provider.stream(model, request(HELLO, tools), GREEDY, context):
        if event.type in ("text_delta", "toolcall_start") and not context.cancelled:
            elapsed = time.perf_counter() - start
            context.cancel("measured")
    return elapsed


async def cancel_settle(
    model: Model, provider: Provider, turn: ProviderRequest, options: StreamOptions,
    cancel_when: Callable[[StreamEvent, float], bool], after_s: float | None = None,
) -> tuple[float, str]:
    """Seconds from the cancel to the stream's end, and how the stream ended. The cancel comes at
    the first event `cancel_when(event, seconds since the request)` accepts, or `after_s` seconds
    into the request."""
    context = Context()
    start = time.perf_counter()
    cancelled_at: float | None = None
    last: StreamEvent | None = None

    def cancel() -> None:
        nonlocal cancelled_at
        if cancelled_at is None:
            cancelled_at = time.perf_counter()
            context.cancel("benchmark")

    timer = asyncio.get_running_loop().call_later(after_s, cancel) if after_s is not None else None
    async for event in provider.stream(model, turn, options, context):
        last = event
        if cancel_when(event, time.perf_counter() - start):
            cancel()
    end = time.perf_counter()
    if timer is not None:
        timer.cancel()
    ended = last.message.stop_reason if isinstance(last, (DoneEvent, ErrorEvent)) else "without an end event"
    return (float("nan") if cancelled_at is None else end - cancelled_at), ended


async def reply_seconds(model: Model, threads: int) -> float:
    """Seconds for an 80-token greedy reply (prompt included) on `threads` llama.cpp threads."""
    provider = EmbeddedProvider(n_threads=threads)
    options = GREEDY.model_copy(update={"max_tokens": 80})
    start = time.perf_counter()
    async for _ in provider.stream(model, request("Write a long story about a dragon."), options, Context()):
        pass
    return time.perf_counter() - start


async def threads_side_by_side(model: Model, runs: int) -> None:
    for label, busy in (("as the machine is", 0), ("beside bursty work", os.cpu_count() or 1)):
        neighbours = [await asyncio.create_subprocess_exec(sys.executable, "-c", BURSTS) for _ in range(busy)]
        try:
            medians = {threads: statistics.median([await reply_seconds(model, threads) for _ in range(runs)])
                       for threads in (1, 2)}
        finally:
            for neighbour in neighbours:
                neighbour.kill()
                await neighbour.wait()
        print(f"   {label:<20} 1 thread {medians[1]:6.2f} s, 2 threads {medians[2]:6.2f} s "
              f"({medians[2] / medians[1]:.1f}x)")


def verdict(value: float, goal: float) -> str:
    return "meets the goal" if value <= goal else "misses the goal"


async def main(runs: int) -> None:
    model, provider = ModelRegistry().resolve(EMBEDDED_IDENTITY)
    print(f"embedded model {model.id}: {model.name}")
    print(f"\n1. First text for {HELLO!r} (goal: under {FIRST_TEXT_GOAL_S:.0f} s without tools)")
    for label, tools in (("no tools", ()), ("6 built-in tools", TOOLS)):
        samples = [await first_text(model, provider, tools) for _ in range(runs + (1 if label == "no tools" else 0))]
        cold = samples.pop(0) if label == "no tools" else None
        line = f"   {label:<17} median {statistics.median(samples):6.2f} s over {len(samples)} turns"
        if cold is not None:
            line += f" (first of the process, with loading: {cold:.2f} s)"
        print(line + (f"  {verdict(statistics.median(samples), FIRST_TEXT_GOAL_S)}" if not tools else ""))

    print(f"\n2. Cancel settle: cancel to end of stream (goal: within {CANCEL_GOAL_S:.0f} s in every phase)")
    write = GREEDY.model_copy(update={"tool_choice": "write"})
    phases: list[tuple[str, ProviderRequest, StreamOptions, Callable[[StreamEvent, float], bool], float | None]] = [
        ("reading a 2,000-token prompt", request(LONG_PROMPT), GREEDY, lambda e, t: False, 0.5),
        ("forced tool call's arguments", request("Write a poem about the sea to sea.txt.", TOOLS), write,
         lambda e, t: e.type == "toolcall_delta", None),
        ("text generation", request("Write a long story about a dragon."), GREEDY,
         lambda e, t: e.type == "text_delta", None),
        ("1 s into a turn with tools", request(HELLO, TOOLS), GREEDY, lambda e, t: False, 1.0),
    ]
    for label, turn, options, cancel_when, after_s in phases:
        settle, ended = await cancel_settle(model, provider, turn, options, cancel_when, after_s)
        print(f"   {label:<30} {settle:6.2f} s, ended {ended}  {verdict(settle, CANCEL_GOAL_S)}")

    print("\n3. Threads: an 80-token reply, median seconds (the default leaves one CPU free)")
    await threads_side_by_side(model, runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="plain turns measured per side (default 3)")
    asyncio.run(main(parser.parse_args().runs))
