"""Measuring sides against each other in one run: alternation, percentiles, rates."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

BLOCK = 100  # operations per side per round of the alternation

Operation = Callable[[], Awaitable[None]]


@dataclass
class Side:
    """One thing being measured: its name, one operation, and the nanoseconds each run took."""

    name: str
    run: Operation
    samples: list[int] = field(default_factory=list)


async def alternate(sides: list[Side], count: int, warmup: int) -> None:
    """Warm every side up, then run `count` per side in blocks of BLOCK, flipping the order of the
    sides each round so drift and noise fall on all of them alike."""
    for side in sides:
        for _ in range(warmup):
            await side.run()
    done, order = 0, list(sides)
    while done < count:
        block = min(BLOCK, count - done)
        for side in order:
            for _ in range(block):
                start = time.perf_counter_ns()
                await side.run()
                side.samples.append(time.perf_counter_ns() - start)
        done += block
        order.reverse()


def percentile(samples: list[int], p: float) -> float:
    """The `p`th percentile of `samples` (ns), in ms."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index] / 1e6


def per_second(samples: list[int]) -> float:
    return len(samples) / (sum(samples) / 1e9)
