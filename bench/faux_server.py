"""`harness serve` on the faux model in a process of its own, for `bench.serve_resources`: its
resident memory and descriptors are then the server's alone.

Run as `python -m bench.faux_server URL MAX_HELD REPLY_BYTES REPLY_SECONDS`: `create_app` over the
store at URL (a PostgreSQL read pool as `harness serve` opens it), holding at most MAX_HELD
conversations, on uvicorn at a free loopback port. Its model answers every turn with REPLY_BYTES of
text in words of 1 KiB, streamed over REPLY_SECONDS. It prints its base URL once it serves and
stops at SIGTERM. Besides the API it answers `GET /bench/server`: the conversations it holds, its
watchers, and the bytes of events they hold unread (`Fanouts.held_bytes`), which no public route tells."""

from __future__ import annotations

import asyncio
import gc
import math
import signal
import sys

from fastapi import Request

from bench.serve_load import MODEL, USER, serving
from harness.cli.serve_commands import SERVE_POOL_MAX
from harness.context import Context
from harness.conversation import ConversationService, ConversationSetup
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry
from harness.providers.faux import FauxPart, FauxReply, delay, reply
from harness.runtime import DriveSettings
from harness.server import LocalUser, ServerOptions, ServerState, create_app
from harness.session import LaneConfig, connect

WORD_BYTES = 1024
"""The size of one streamed delta of the long reply: a few thousand deltas for a reply of MBs."""

CHUNK_WORDS = 64
"""Words streamed between two pauses of the long reply."""


def paced_reply(size: int, seconds: float) -> FauxReply:
    """About `size` bytes of text in words of `WORD_BYTES`, streamed over about `seconds`: a pause
    after every `CHUNK_WORDS` words, as a model's tokens come at its pace, not all at once."""
    words = max(1, size // WORD_BYTES)
    chunks = math.ceil(words / CHUNK_WORDS)
    chunk = "x" * (WORD_BYTES - 1) + " "
    parts: list[FauxPart | str] = []
    for index in range(chunks):
        parts += [chunk * min(CHUNK_WORDS, words - index * CHUNK_WORDS), delay(seconds / chunks)]
    return reply(*parts)


async def main(url: str, max_held: int, reply_bytes: int, reply_s: float) -> None:
    context = Context({"bench": "faux_server"})
    store = await connect(url, context, pool_max=SERVE_POOL_MAX)
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": FauxProvider(lambda _: paced_reply(reply_bytes,
                                                                                                  reply_s))})
    service = ConversationService(store, ConversationSetup(models=registry, drive=DriveSettings(frame_interval_s=0.05)))
    app = create_app(service, LocalUser(USER), options=ServerOptions(max_held=max_held),
                     new_lane=lambda model: LaneConfig(model=model or MODEL))

    @app.get("/bench/server")
    async def server(request: Request) -> dict[str, int]:
        state: ServerState = request.app.state.server
        return {"held": len(state.holds.held), "watchers": state.fanouts.watchers,
                "held_bytes": state.fanouts.held_bytes}

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    gc.freeze()  # as `harness serve` does once started
    try:
        async with serving(app) as base_url:
            print(base_url, flush=True)
            await stop.wait()
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
