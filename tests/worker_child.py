"""A `harness worker` process for the worker tests, with a scripted model and a recording tool.

Run as `python worker_child.py URL WORKDIR [CONCURRENCY]`: a `Worker` over a conversation service
whose model is the faux provider (`answer`) and whose one tool, `ledger` (replay `never`),
writes its call id to the store's `ledger` table and then waits while the test holds an advisory
lock (`hold_key`), so a test can kill, stop or steer a run mid-tool. A prompt `stream: X` gets a
reply without a tool call that streams `streaming X, `, then waits on the same lock mid-stream,
so a test can watch a reply streaming from another process. It prints `ready` once it runs and exits 0 after
SIGTERM once it let everything go, printing `released`. Retries are due at once (no backoff) unless
`HARNESS_TEST_WORKER_RETRY_MS` sets the first one's delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import psycopg
from pydantic import JsonValue

from harness.context import Context
from harness.conversation import ConversationService, ConversationSetup
from harness.messages import ModelIdentity, TextContent, ToolResultMessage, UserMessage
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ToolSpec
from harness.providers.faux import FauxReply, FauxRequest, delay, failure, reply, tool_call
from harness.runtime import AgentTool, DriveSettings, RetryPolicy, ToolOutput
from harness.session import LaneConfig, connect
from harness.worker import Worker, WorkerOptions

FAUX = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)
LEDGER = "ledger"
CONFIG = LaneConfig(model=FAUX, active_tools=[LEDGER])
POLL_VARIABLE = "HARNESS_TEST_WORKER_POLL_S"  # a long poll shows that notifications alone wake the worker
RETRY_VARIABLE = "HARNESS_TEST_WORKER_RETRY_MS"  # the first retry's delay (0 unless set)
OPTIONS = WorkerOptions(poll_s=0.5, lease_s=1.5, deferred_poll_s=0.5, backoff_s=0.5, stop_grace_s=10.0)


def answerer(url: str, workdir: Path) -> Callable[[FauxRequest], FauxReply]:
    """The faux model's script. A user message last: a reply and one ledger call (its id unique
    per process and request); a steer after a tool result is echoed; `stream: X` streams and
    waits mid-reply while `hold_key(workdir)` is held; `flaky: X` fails with a retryable error
    the first time this process is asked it, and is then answered `recovered X`; anything else
    gets `done`."""
    failed: set[str] = set()

    def answer(recorded: FauxRequest) -> FauxReply:
        last = recorded.request.messages[-1]
        if isinstance(last, UserMessage):
            text = "".join(block.text for block in last.content if isinstance(block, TextContent)) \
                if not isinstance(last.content, str) else last.content
            if text.startswith("steer:"):
                return reply(f"heard {text}")
            if text.startswith("flaky:"):
                if text not in failed:
                    failed.add(text)
                    return failure("retryable", "overloaded", status=529)
                return reply(f"recovered {text.removeprefix('flaky:').strip()}")
            if text.startswith("stream:"):
                return reply(f"streaming {text.removeprefix('stream:').strip()}, ", delay(released(url, workdir)),
                             "then done")
            return reply("writing", tool_call(LEDGER, {"key": text}, id=f"call-{os.getpid()}-{recorded.number}"))
        assert isinstance(last, ToolResultMessage)
        return reply("done")

    return answer


def released(url: str, workdir: Path) -> asyncio.Event:
    """Set once the test no longer holds `hold_key(workdir)` (taken shared, so the wait is the lock's)."""
    event = asyncio.Event()

    async def wait() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("SELECT pg_advisory_lock_shared(%s)", (hold_key(workdir),))
            await conn.execute("SELECT pg_advisory_unlock_shared(%s)", (hold_key(workdir),))
        event.set()

    waiting = asyncio.get_running_loop().create_task(wait())
    _waiting.add(waiting)
    waiting.add_done_callback(_waiting.discard)
    return event


_waiting: set[asyncio.Task[None]] = set()  # the waits of `released`, kept from the collector


def hold_key(workdir: Path) -> int:
    """The advisory lock a test holds to keep the ledger tool waiting after its effect."""
    return int.from_bytes(hashlib.blake2b(str(workdir).encode(), digest_size=8).digest(), "big", signed=True)


@contextlib.asynccontextmanager
async def holding(url: str, workdir: Path) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """In a test: hold `hold_key(workdir)` (the ledger tool and `stream:` replies wait on it) until
    the returned release is awaited, or the block ends."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (hold_key(workdir),))
        held = True

        async def release() -> None:
            nonlocal held
            if held:
                held = False
                await conn.execute("SELECT pg_advisory_unlock(%s)", (hold_key(workdir),))

        try:
            yield release
        finally:
            await release()


LEDGER_TABLE = "CREATE TABLE IF NOT EXISTS ledger (call_id TEXT NOT NULL, pid INTEGER NOT NULL)"


def ledger_tool(url: str, workdir: Path) -> AgentTool:
    """`ledger` (replay `never`): its effect is a row in the `ledger` table; then it waits while a
    test holds `hold_key(workdir)`, which it takes shared, so the wait is the lock's, not a poll."""

    async def run(tool_call_id: str, args: dict[str, JsonValue],
                  on_update: Callable[[JsonValue, bool], Awaitable[None]], context: Context) -> ToolOutput:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("INSERT INTO ledger (call_id, pid) VALUES (%s, %s)", (tool_call_id, os.getpid()))
            held = asyncio.ensure_future(conn.execute("SELECT pg_advisory_lock_shared(%s)", (hold_key(workdir),)))
            stopped = asyncio.ensure_future(context.wait_cancelled())  # an abort cancels the call's Context
            try:
                await asyncio.wait({held, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # The wait for the lock must have ended (psycopg cancels it on the server) before
                # the connection closes, also when this call is cancelled (a halted drive): a
                # socket closed under a pending read stays registered with the event loop, and
                # the next connection given its descriptor number is never woken.
                stopped.cancel()
                held.cancel()
                await asyncio.gather(held, stopped, return_exceptions=True)
            if held.cancelled():
                return ToolOutput(content=[TextContent(text="stopped")], is_error=True)
            await conn.execute("SELECT pg_advisory_unlock_shared(%s)", (hold_key(workdir),))
        return ToolOutput(content=[TextContent(text=f"written {args.get('key')}")])

    spec = ToolSpec(name=LEDGER, description="Write to the ledger.",
                    parameters={"type": "object", "properties": {"key": {"type": "string"}}})
    return AgentTool(spec=spec, execute=run, replay="never")


async def main(url: str, workdir: Path, concurrency: int) -> None:
    # Three workers share the test's stderr: each line says which one wrote it.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="worker %(process)d %(levelname)s %(name)s: %(message)s")
    context = Context({"process": f"worker-{os.getpid()}"})
    store = await connect(url, context)
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": FauxProvider(answerer(url, workdir))})
    setup = ConversationSetup(models=registry, tools=[ledger_tool(url, workdir)],
                              drive=DriveSettings(frame_interval_s=0.0, retry=RetryPolicy(
                                  base_delay_ms=int(os.environ.get(RETRY_VARIABLE, "0")))))
    poll_s = float(os.environ.get(POLL_VARIABLE, OPTIONS.poll_s))
    worker = Worker(ConversationService(store, setup), replace(OPTIONS, concurrency=concurrency, poll_s=poll_s))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
    print("ready", flush=True)
    try:
        await worker.run(context)
    finally:
        await store.close()
    print("released", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 4))
