"""A `harness worker` on the faux model of `bench.serve_load`, for its `--workers N` mode.

Run as `python -m bench.faux_worker URL CONCURRENCY`: a `Worker` over the PostgreSQL store at URL
whose model answers each turn with a short text and one `lookup` call, then a short answer after
its result. It prints `ready` once it runs and exits 0 at SIGTERM, when it has let everything go. It lowers
its CPU priority as `harness worker` does by default (`WORKER_NICE`)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys

from bench.serve_load import LOOKUP, answer
from harness.cli.worker_commands import WORKER_NICE
from harness.context import Context
from harness.conversation import ConversationService, ConversationSetup
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry
from harness.runtime import DriveSettings
from harness.session import connect
from harness.worker import Worker, WorkerOptions


async def main(url: str, concurrency: int) -> None:
    context = Context({"bench": "faux_worker"})
    os.nice(WORKER_NICE)  # as `harness worker` does by default
    store = await connect(url, context)
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": FauxProvider(answer)})
    setup = ConversationSetup(models=registry, tools=[LOOKUP], drive=DriveSettings(frame_interval_s=0.05))
    worker = Worker(ConversationService(store, setup), WorkerOptions(concurrency=concurrency))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
    gc.freeze()  # as `harness worker` does once started
    print("ready", flush=True)
    try:
        await worker.run(context)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
