"""Issue 17's proof: one API process (`harness serve --workers external`, here in this process under
uvicorn) and two `harness worker` processes on one PostgreSQL store; 20 conversations, each with a
watcher on the API's event stream; the workers are SIGKILLed mid-run twice, a fresh one started
each time. Every run settles exactly once, no never-replay tool call runs twice, and every
watcher's durable events equal the lane's log after its snapshot (no gap, no duplicate), half of
them across a reconnection with `Last-Event-ID`. Runs only with HARNESS_TEST_POSTGRES_URL set."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from harness.context import Context
from harness.conversation import ConversationService
from harness.messages import AssistantMessage, ToolCall, ToolResultMessage
from harness.server import LocalUser, ServerOptions, create_app
from harness.session import Store
from harness.session.work import work_board
from server_helpers import serving
from test_server_external import Watcher, _lane, logged
from test_worker_processes import Notes, Workers, branch, last_result, ledger, ledger_rows, settled, text
from worker_child import holding

pytestmark = pytest.mark.postgres

CONVERSATIONS = 20
PER_WORKER = CONVERSATIONS // 2
"""Each worker's concurrency: two workers hold every conversation at once, half each."""


async def test_twenty_watched_conversations_survive_two_workers_killed_mid_run(
        ledger_store: Store, postgres_schema_url: str, tmp_path: Path, ctx: Context) -> None:
    store, url = ledger_store, postgres_schema_url
    app = create_app(ConversationService(store), LocalUser("ada"), new_lane=_lane,
                     options=ServerOptions(workers="external"))
    workers, notes = Workers(url, tmp_path), Notes(work_board(store))
    try:
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=60) as client, \
                holding(url, tmp_path):
            ids = [(await client.post("/api/conversations", json={})).json()["id"] for _ in range(CONVERSATIONS)]
            watchers = {conversation_id: [Watcher(client, conversation_id)] for conversation_id in ids}
            for conversation_id in ids:
                await watchers[conversation_id][0].until(bool)  # its snapshot came: it misses nothing after
            first = workers.start(concurrency=PER_WORKER)
            second = workers.start(concurrency=PER_WORKER)
            runs = []
            for n, conversation_id in enumerate(ids):
                sent = await client.post(f"/api/conversations/{conversation_id}/messages", json={"text": f"go {n}"})
                assert sent.status_code == 202, sent.text
                runs.append((conversation_id, sent.json()["operation_id"]))

            # Every call is mid-tool, half in each worker: kill one, and a fresh worker answers its calls.
            await notes.until(ledger_rows(url, CONVERSATIONS))
            first.kill()
            workers.start(concurrency=PER_WORKER)
            for conversation_id in ids[::2]:  # half the watchers reconnect from the last id they had
                cut = watchers[conversation_id][0]
                cut.task.cancel()
                last_id = next((event.id for event in reversed(cut.events) if event.id is not None), None)
                watchers[conversation_id].append(Watcher(client, conversation_id, last_event_id=last_id))
            await notes.until(settled_count(store, runs, PER_WORKER, ctx), within_s=30)

            # The other half is still mid-tool in the second worker: kill it too.
            second.kill()
            workers.start(concurrency=PER_WORKER)
            await notes.until(settled(store, runs, ctx), within_s=30)
            for chain in watchers.values():
                await chain[-1].ended()
    finally:
        await notes.close()
        workers.close()

    assert set((await ledger(url)).values()) == {1}
    for conversation_id, operation_id in runs:
        result = await last_result(store, conversation_id, ctx)
        assert result is not None
        assert (result.operation_id, result.outcome) == (operation_id, "completed")
        messages = await branch(store, conversation_id, ctx)
        calls = [block.id for m in messages if isinstance(m, AssistantMessage) for block in m.content
                 if isinstance(block, ToolCall)]
        assert [m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)] == calls
        assert len(calls) == 1
        assert text(messages[-1]) == "done"

        chain = watchers[conversation_id]
        snapshot = chain[0].events[0]
        assert snapshot.name == "snapshot"
        log = await logged(store, conversation_id, int(snapshot.id) if snapshot.id is not None else None, ctx)
        got = [(event.id, event.name) for watcher in chain for event in watcher.durable]
        assert got == log, f"watchers of {conversation_id} saw {got}, the log holds {log}"
        assert [event.name for event in chain[-1].events].count("run_end") == 1
        assert [name for _, name in log].count("run_end") == 1
        assert all(event.name != "snapshot" for watcher in chain[1:] for event in watcher.events)


def settled_count(store: Store, runs: list[tuple[str, str]], at_least: int,
                  ctx: Context) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return sum([await settled(store, [run], ctx)() for run in runs]) >= at_least

    return check
