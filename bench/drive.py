"""What driving a run costs over the bare provider stream, frames written per second, and the
memory an idle lane and an idle harness with 1,000 lanes take.

Run: `.venv/bin/python -m bench.drive [--tokens N] [--rounds N]`.

1. Faux provider streaming N tokens (default 10,000): the bare `provider.stream` loop against a
   whole `Lane.prompt` on a SQLite store (accept, intent, stream with live presentation and frames,
   settlement, terminal commit), as a ratio of medians.
2. A recorded Anthropic reply (without `../shared`, the project's own, with a notice) served over
   real HTTP by the replay server, through the real SDK: the bare adapter stream against a whole
   `Lane.prompt`.
3. Frames: pages persisted per second while the faux reply streams (DriveSettings.frame_interval_s=0,
   the most a reply can ask of the store).
4. Memory (tracemalloc): an attached harness with one idle lane, and with 1,000 idle lanes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

from bench.streams import PROJECT_STREAMS, RECORDED_STREAMS, has_recorded_streams
from harness.context import Context
from harness.messages import ModelIdentity, UserMessage
from harness.providers import FAUX_MODEL, FauxProvider, Model, ModelRegistry, ProviderRequest, StreamOptions
from harness.providers.anthropic_messages import AnthropicMessagesProvider
from harness.providers.faux import reply
from harness.providers.replay import ReplayResponse, ReplayServer
from harness.runtime import AgentHarness, AgentHarnessOptions, DriveSettings, Settled
from harness.session import AppendList, Claim, CommitResult, LaneConfig, Store, Write, connect

ANTHROPIC = Model(id="claude-sonnet-4-5", provider="anthropic", api="anthropic-messages")


class FrameCounter:
    """Counts frame pages committed through a real backend."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.pages = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def commit(self, session_id: str, writes: Sequence[Write], claim: Claim | None,
                     context: Context) -> CommitResult:
        self.pages += sum(isinstance(w, AppendList) for w in writes)
        result: CommitResult = await self.inner.commit(session_id, writes, claim, context)  # type: ignore[attr-defined]
        return result


async def bare(provider: object, model: Model, context: Context) -> int:
    events = 0
    request = ProviderRequest(messages=(UserMessage(content="go"),))
    async for _ in provider.stream(model, request, StreamOptions(), context):  # type: ignore[attr-defined]
        events += 1
    return events


async def driven(store: Store, registry: ModelRegistry, model: ModelIdentity, settings: DriveSettings,
                 context: Context) -> None:
    session = await store.create_session(context)
    await session.create_lane("main", LaneConfig(model=model), context)
    harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session, models=registry, drive=settings),
                                           context)
    outcome = await harness.lane("main").prompt("go", None, context)
    if not isinstance(outcome, Settled) or outcome.result.outcome != "completed":
        raise RuntimeError(f"the benchmark run did not complete: {outcome}")
    await harness.close(context)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def faux_overhead(tokens: int, rounds: int, folder: Path, context: Context) -> tuple[float, float, float]:
    text = "word " * tokens
    faux = FauxProvider(lambda request: reply(text))
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": faux})
    identity = ModelIdentity(provider="faux", model_id="faux")
    store = await connect(f"sqlite:///{folder / 'faux.db'}", context)
    counter = FrameCounter(store.backend)
    counted = Store(counter, store.url)  # type: ignore[arg-type]
    bare_times, driven_times = [], []
    frame_rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        await bare(faux, FAUX_MODEL, context)
        bare_times.append(time.perf_counter() - started)
        counter.pages = 0
        started = time.perf_counter()
        await driven(counted, registry, identity, DriveSettings(frame_interval_s=0), context)
        elapsed = time.perf_counter() - started
        driven_times.append(elapsed)
        frame_rates.append(counter.pages / elapsed)
    await store.close()
    return median_ms(bare_times), median_ms(driven_times), statistics.median(frame_rates)


async def replay_overhead(rounds: int, folder: Path, context: Context) -> tuple[float, float]:
    os.environ["ANTHROPIC_API_KEY"] = "replayed"  # the replay server checks no key; the SDK wants one
    provider = AnthropicMessagesProvider()
    model = ANTHROPIC
    # A reply that ends the turn (no tool calls), so one response serves one whole prompt.
    if has_recorded_streams():
        body = ReplayResponse.from_file(RECORDED_STREAMS / "anthropic-redacted-thinking.sse")
    else:
        body = ReplayResponse.from_file(PROJECT_STREAMS / "anthropic-text.sse")
    store = await connect(f"sqlite:///{folder / 'replay.db'}", context)
    bare_times, driven_times = [], []
    with ReplayServer() as server:
        served = model.model_copy(update={"base_url": server.base_url})
        registry = ModelRegistry([served], providers={"anthropic-messages": provider})
        identity = ModelIdentity(provider=served.provider, model_id=served.id)
        for _ in range(rounds):
            server.enqueue(body, body)
            started = time.perf_counter()
            await bare(provider, served, context)
            bare_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            await driven(store, registry, identity, DriveSettings(), context)
            driven_times.append(time.perf_counter() - started)
    await store.close()
    return median_ms(bare_times), median_ms(driven_times)


async def memory(folder: Path, context: Context) -> tuple[float, float]:
    store = await connect(f"sqlite:///{folder / 'memory.db'}", context)
    config = LaneConfig(model=ModelIdentity(provider="faux", model_id="faux"))
    sizes = []
    for lanes in (1, 1000):
        session = await store.create_session(context)
        for i in range(lanes):
            await session.create_lane(f"lane-{i}", config, context)
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session), context)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        sizes.append(sum(stat.size_diff for stat in after.compare_to(before, "filename")) / 1024)
        await harness.close(context)
    await store.close()
    return sizes[0], sizes[1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    context = Context()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bare_ms, driven_ms, frames = await faux_overhead(args.tokens, args.rounds, folder, context)
        print(f"faux, {args.tokens} tokens   bare {bare_ms:8.1f} ms   driven {driven_ms:8.1f} ms   "
              f"ratio {driven_ms / bare_ms:5.2f}x   frames {frames:8.0f} pages/s")
        bare_ms, driven_ms = await replay_overhead(args.rounds, folder, context)
        print(f"replay, anthropic SDK      bare {bare_ms:8.1f} ms   driven {driven_ms:8.1f} ms   "
              f"ratio {driven_ms / bare_ms:5.2f}x")
        one, thousand = await memory(folder, context)
        print(f"memory: harness with 1 idle lane {one:8.1f} KiB, with 1,000 idle lanes {thousand:8.1f} KiB "
              f"({(thousand - one) / 999:.2f} KiB per lane)")


if __name__ == "__main__":
    asyncio.run(main())
