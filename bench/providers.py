"""Provider benchmark: what the adapters cost on top of the SDKs they are built on.

An adapter turns an SDK's stream into protocol events, folds them into the reply, and watches the
caller's Context. The floor is what any user of the SDK pays anyway: sending the same request and
iterating the raw SDK stream. Both sides read the same recorded bodies (the real streams in
`shared/fixtures/provider-streams`; without that folder, the project's own streams in
`tests/streams`, with a notice), served over real HTTP by the replay server, one separate
process per body (`python -m harness.providers.replay --repeat`), so serving costs this process
nothing and each side sees the same server.

1. Adapter against raw SDK, per recorded body: p50 and p90 wall time of one whole stream (request
   to last item), the adapter/raw ratio of the p50s, and events per second through the protocol
   (events the adapter yields, over its time). Sides alternate in blocks, order flipping every
   round, after a warm-up.
2. Parsing alone: the SDK's already-parsed stream items through the adapter's parser and the
   reply fold, with no HTTP: microseconds per item and events per second. This is the part of
   section 1's difference the adapter itself spends.

White-box: it measures the adapters' own request builders and stream parsers, which
`harness.providers` does not offer.

Run: `.venv/bin/python -m bench.providers [--streams N]` (default 300 streams per side per body).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import openai

from bench.streams import PROJECT_STREAMS, RECORDED_STREAMS, has_recorded_streams
from harness.context import Context
from harness.messages import UserMessage
from harness.providers import (
    ApiName,
    Model,
    Provider,
    ProviderRequest,
    StreamOptions,
    anthropic_messages,
    openai_chat,
    openai_responses,
)
from harness.providers.streaming import Reply, StreamParser

BLOCK = 20  # streams per side per round of the alternation
REQUEST = ProviderRequest(messages=(UserMessage(content="Add and multiply 2 and 3."),))
OPTIONS = StreamOptions(api_key="bench-key")
PARSE_ROUNDS = 2_000


@dataclass(frozen=True)
class Adapter:
    """One wire format: its provider, request builder, parser, and how to open the raw SDK stream."""

    api: ApiName
    provider: Callable[[], Provider]
    build: Callable[[Model, ProviderRequest, StreamOptions], dict[str, Any]]
    parser: Callable[[Model], StreamParser[Any]]
    path: str  # what the SDK's base URL needs after the server's

    def raw_stream(self, base_url: str) -> Callable[[dict[str, Any]], Awaitable[Any]]:
        """The bare SDK call a user of the SDK would make, on a client configured like ours."""
        if self.api == "anthropic-messages":
            messages = anthropic.AsyncAnthropic(base_url=base_url, api_key="bench-key", max_retries=0).messages
            return lambda params: messages.create(**params)
        client = openai.AsyncOpenAI(base_url=base_url + self.path, api_key="bench-key", max_retries=0)
        if self.api == "openai-responses":
            return lambda params: client.responses.create(**params)
        return lambda params: client.chat.completions.create(**params)


CHAT = Adapter("openai-chat", openai_chat.OpenAIChatProvider, openai_chat.build_request_params,
               openai_chat.ChatStreamParser, "/v1")
RESPONSES = Adapter("openai-responses", openai_responses.OpenAIResponsesProvider,
                    openai_responses.build_request_params, openai_responses.ResponsesStreamParser, "/v1")
MESSAGES = Adapter("anthropic-messages", anthropic_messages.AnthropicMessagesProvider,
                   anthropic_messages.build_request_params, anthropic_messages.MessagesStreamParser, "")

RECORDED_BODIES = [  # recorded streams that finish normally
    ("openai-chat-tools-parallel", CHAT),
    ("openrouter-chat-reasoning-tools-parallel", CHAT),
    ("openai-responses-commentary-reasoning-tool", RESPONSES),
    ("openai-responses-reasoning-summary-tool", RESPONSES),
    ("anthropic-tools-parallel", MESSAGES),
    ("anthropic-thinking-tool", MESSAGES),
]
PROJECT_BODIES = [  # the project's streams of the same kinds
    ("openai-chat-tools-parallel", CHAT),
    ("openai-chat-reasoning", CHAT),
    ("openai-responses-tools-parallel", RESPONSES),
    ("openai-responses-reasoning-summary", RESPONSES),
    ("anthropic-tools-parallel", MESSAGES),
    ("anthropic-thinking-signature", MESSAGES),
]


@dataclass
class Side:
    name: str
    run: Callable[[], Awaitable[int]]  # one whole stream; returns how many items or events it saw
    samples: list[int] = field(default_factory=list)  # nanoseconds per stream
    count: int = 0


@dataclass
class Case:
    stem: str
    adapter: Adapter
    base_url: str
    raw: Side
    ours: Side


def start_server(body: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.providers.replay", "--repeat", str(body)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


def make_case(stem: str, adapter: Adapter, base_url: str) -> Case:
    model = Model(id="bench-model", provider="bench", api=adapter.api, base_url=base_url + adapter.path,
                  reasoning=True)
    params = adapter.build(model, REQUEST, OPTIONS)
    params.pop("extra_headers", None)
    open_raw = adapter.raw_stream(base_url)
    provider = adapter.provider()

    async def raw() -> int:
        items = 0
        stream = await open_raw(params)
        async for _ in stream:
            items += 1
        return items

    async def ours() -> int:
        events = 0
        async for event in provider.stream(model, REQUEST, OPTIONS, Context()):
            events += 1
            if event.type == "error":
                raise RuntimeError(f"{stem}: {event.error.message}")
        return events

    return Case(stem, adapter, base_url, Side("raw SDK", raw), Side("adapter", ours))


async def alternate(cases: list[Case], streams: int, warmup: int) -> None:
    sides = [side for case in cases for side in (case.raw, case.ours)]
    for side in sides:
        for _ in range(warmup):
            side.count = await side.run()
    done = 0
    while done < streams:
        block = min(BLOCK, streams - done)
        for side in sides:
            for _ in range(block):
                start = time.perf_counter_ns()
                await side.run()
                side.samples.append(time.perf_counter_ns() - start)
        done += block
        sides.reverse()


def ms(samples: list[int], quantile: int) -> float:
    """The `quantile`th percentile of `samples` (ns), in milliseconds."""
    return statistics.quantiles(samples, n=100, method="inclusive")[quantile - 1] / 1e6


def print_streams(cases: list[Case]) -> None:
    print(f"{'body':<44}{'api':<20}{'items':>6}{'events':>7}{'raw p50':>9}{'p90':>7}"
          f"{'adapter p50':>13}{'p90':>7}{'adapter/raw':>13}{'events/s':>10}")
    ratios = []
    for case in cases:
        raw, ours = case.raw, case.ours
        ratio = ms(ours.samples, 50) / ms(raw.samples, 50)
        ratios.append(ratio)
        rate = ours.count * len(ours.samples) / (sum(ours.samples) / 1e9)
        print(f"{case.stem:<44}{case.adapter.api:<20}{raw.count:>6}{ours.count:>7}{ms(raw.samples, 50):>9.2f}"
              f"{ms(raw.samples, 90):>7.2f}{ms(ours.samples, 50):>13.2f}{ms(ours.samples, 90):>7.2f}"
              f"{ratio:>12.2f}x{rate:>10,.0f}")
    print(f"   times in ms per whole stream; geometric mean adapter/raw: {statistics.geometric_mean(ratios):.2f}x")


async def parse_only(case: Case) -> tuple[int, int, float]:
    """Items, events, and nanoseconds per pass of the raw SDK items through parser and fold."""
    model = Model(id="bench-model", provider="bench", api=case.adapter.api)
    params = case.adapter.build(model, REQUEST, OPTIONS)
    params.pop("extra_headers", None)
    stream = await case.adapter.raw_stream(case.base_url)(params)
    items = [item async for item in stream]
    events = 0
    start = time.perf_counter_ns()
    for _ in range(PARSE_ROUNDS):
        parser, reply = case.adapter.parser(model), Reply(model)
        reply.start()
        events = 1
        for item in items:
            for frame in parser.feed(item):
                reply.emit(frame)
                events += 1
        frames, outcome = parser.finish()
        for frame in frames:
            reply.emit(frame)
        reply.end(outcome)
        events += len(frames) + 1
    return len(items), events, (time.perf_counter_ns() - start) / PARSE_ROUNDS


async def main(streams: int) -> None:
    warmup = max(5, streams // 10)
    print(f"provider benchmark: {streams} streams per side per body after {warmup} warm-up, blocks of {BLOCK}, "
          f"python {sys.version.split()[0]}, openai {openai.__version__}, anthropic {anthropic.__version__}, "
          f"{os.cpu_count()} CPUs")
    recorded = has_recorded_streams()
    folder, bodies = (RECORDED_STREAMS, RECORDED_BODIES) if recorded else (PROJECT_STREAMS, PROJECT_BODIES)
    servers = [start_server(folder / f"{stem}.sse") for stem, _ in bodies]
    try:
        cases = [make_case(stem, adapter, url) for (stem, adapter), (_, url) in zip(bodies, servers, strict=True)]
        started = time.perf_counter()
        await alternate(cases, streams, warmup)
        print(f"\n1. one whole stream over HTTP from the replay server (a process per body), "
              f"{time.perf_counter() - started:.1f} s")
        print_streams(cases)

        print(f"\n2. parsing alone: the SDK's parsed items through the parser and the reply fold, "
              f"{PARSE_ROUNDS} passes per body")
        print(f"{'body':<44}{'items':>6}{'events':>7}{'us/item':>9}{'events/s':>12}")
        for case in cases:
            items, events, nanoseconds = await parse_only(case)
            print(f"{case.stem:<44}{items:>6}{events:>7}{nanoseconds / items / 1e3:>9.2f}"
                  f"{events / (nanoseconds / 1e9):>12,.0f}")
    finally:
        for process, _ in servers:
            process.terminate()
            process.wait(timeout=10)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=300, help="timed streams per side per body (default 300)")
    args = parser.parse_args()
    asyncio.run(main(max(10, args.streams)))


if __name__ == "__main__":
    cli()
