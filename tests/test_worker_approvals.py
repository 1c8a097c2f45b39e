"""A call waiting for approval in a real `harness worker` process is listed and answered over HTTP
(issue 30, "approvals from any process"): the worker keeps the call waiting in the conversation's
journal, an API server on the same PostgreSQL store (`--workers external`, through httpx) lists it
and allows it; the worker takes the posted answer, runs the tool and the turn completes. A
second answer is 409 `approval_answered` and changes nothing. The AI SDK client watching the
turn live gets the call's approval request as it lands, and its answer reaches the worker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.cli.config import new_lane_config
from harness.context import Context
from harness.conversation import ConversationService
from harness.messages import ModelIdentity
from harness.providers.replay import ReplayServer
from harness.server import LocalUser, ServerOptions, create_app
from harness.session import Store, addresses, connect
from server_helpers import asgi_client, serving
from test_cli_run import chat_text, chat_tool_call, environment, openai_env
from test_server_ai_sdk import run_client

pytestmark = pytest.mark.postgres

USER = "ada"
MODEL = ModelIdentity(provider="openai", model_id="gpt-4o")
WAIT_S = 60.0  # a guard against a worker that never answers, never a wait


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


@pytest.fixture
def worker(postgres_schema_url: str, tmp_path: Path, replay: ReplayServer) -> Iterator[Path]:
    """A `harness worker` (without --yes) on the store, its model the replay server; its working
    directory, where its tools write."""
    work = tmp_path / "work"
    work.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "harness.cli", "worker", "--store", postgres_schema_url],
                               cwd=work, env=environment(tmp_path / "home", **openai_env(replay)),
                               stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        assert "driving up to" in process.stderr.readline()
        yield work
    finally:
        process.kill()
        process.wait()
        if process.stderr is not None:
            process.stderr.close()


@pytest.fixture
async def api(store: Store, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """An API server that never drives (`--workers external`), through httpx."""
    async with asgi_client(external_app(store, tmp_path / "home")) as client:
        yield client


def external_app(store: Store, home: Path) -> Any:
    """An API server on `store` that never drives (`--workers external`)."""
    return create_app(ConversationService(store), LocalUser(USER), new_lane=lambda model: new_lane_config(MODEL, home),
                      options=ServerOptions(workers="external"))


@pytest.fixture
async def store(postgres_schema_url: str, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(postgres_schema_url, ctx)
    try:
        yield opened
    finally:
        await opened.close()


async def until(store: Store, conversation: str, check: Any, ctx: Context) -> Any:
    """Wait, woken by the store's notifications, until `check()` gives something."""
    changes = store.changes.subscribe(conversation)
    try:
        async with asyncio.timeout(WAIT_S):
            while not (found := await check()):
                await changes.wait(1.0)
        return found
    finally:
        changes.close()


async def test_a_call_waiting_in_a_worker_is_answered_over_http(
        store: Store, worker: Path, api: httpx.AsyncClient, replay: ReplayServer, tmp_path: Path, ctx: Context) -> None:
    replay.enqueue(chat_tool_call("write", {"path": "notes.txt", "content": "hello\n"}), chat_text("Written."))
    service = ConversationService(store)
    conversation = await service.create(USER, new_lane_config(MODEL, tmp_path / "home"), ctx)
    _, accepted = await service.admit(USER, conversation.id, "write notes", ctx)
    await service.close(USER, conversation.id, ctx)
    approvals = f"/api/conversations/{conversation.id}/approvals"

    async def listed() -> list[dict[str, Any]]:
        return list((await api.get(approvals)).json())

    [waiting] = await until(store, conversation.id, listed, ctx)
    assert not (worker / "notes.txt").exists()
    allowed = await api.post(f"{approvals}/{waiting['tool_call_id']}", json={"allow": True})
    session = await store.open_session(conversation.id, ctx)

    async def settled() -> object:
        return await session.get(addresses.lane_last_result("main"), ctx)

    result = await until(store, conversation.id, settled, ctx)
    again = await api.post(f"{approvals}/{waiting['tool_call_id']}", json={"allow": False})

    assert (waiting["tool_name"], waiting["args"]["path"]) == ("write", "notes.txt")
    assert allowed.status_code == 200, allowed.text
    assert (result.operation_id, result.outcome) == (accepted.operation_id, "completed")
    assert (worker / "notes.txt").read_text() == "hello\n"
    assert (again.status_code, again.json()["code"]) == (409, "approval_answered")
    assert await listed() == []


async def test_the_ai_sdk_client_is_asked_live_for_a_call_waiting_in_a_worker(
        store: Store, worker: Path, replay: ReplayServer, tmp_path: Path, ctx: Context) -> None:
    """The real `ai` client (tests/js/approve_chat.mjs) sends a turn an external-workers API admits
    for the worker; the worker's `write` call waits for approval, and the client's live stream
    gets its `tool-approval-request` as it lands in the journal and pauses there (nothing
    reloaded, nothing listed). `addToolApprovalResponse` answers it through the same door, posted
    to the worker: allowed, the file is written and the reply streams into the same message;
    denied with a reason, nothing is written and the model reads the reason."""
    replay.enqueue(chat_tool_call("write", {"path": "notes.txt", "content": "hello\n"}), chat_text("Written."),
                   chat_tool_call("write", {"path": "other.txt", "content": "no\n"}), chat_text("Left alone."))
    service = ConversationService(store)
    conversation = await service.create(USER, new_lane_config(MODEL, tmp_path / "home"), ctx)
    await service.close(USER, conversation.id, ctx)
    async with serving(external_app(store, tmp_path / "home")) as url:
        chat = await run_client("approve_chat.mjs", url, conversation.id)

    assert chat["errors"] == []
    approved, denied = chat["approved"], chat["denied"]
    for answered in (approved, denied):
        assert answered["paused"]["status"] == "ready"
        assert answered["paused"]["tool"]["type"] == "tool-write"
        assert answered["paused"]["tool"]["approval"]["id"] == answered["paused"]["tool"]["toolCallId"]
        assert (answered["finishReason"], answered["status"]) == ("stop", "ready")
    assert (worker / "notes.txt").read_text() == "hello\n"
    assert not (worker / "other.txt").exists()
    first, second = chat["messages"][1]["parts"], chat["messages"][3]["parts"]
    assert [part["state"] for part in first if part["type"] == "tool-write"] == ["output-available"]
    assert [part["text"] for part in first if part["type"] == "text"] == ["Written."]
    assert [part["state"] for part in second if part["type"] == "tool-write"] == ["output-error"]
    refusal = replay.requests[3].json()["messages"][-1]
    assert (refusal["role"], "not that one" in str(refusal["content"])) == ("tool", True)
