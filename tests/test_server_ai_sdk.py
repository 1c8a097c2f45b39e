"""The AI SDK UI message stream door of `harness serve` (issue 16 item 5): `POST /api/chat` starts a
turn and streams it, `GET /api/chat/{id}/stream` resumes it (204 when idle), `POST
/api/chat/{id}/stop` stops it durably; and the real `ai` client (tests/js) sends, loses its
connection mid-reply, resumes, and holds one message with nothing twice."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from drive_helpers import FAUX, ProbeTool, within
from harness.context import Context
from harness.conversation import chat_event_rows
from harness.providers.faux import FauxReply, delay, reply, tool_call
from harness.server import Approvals
from harness.session import Store, connect
from harness.tools import Approval
from server_helpers import USER, Served, asgi_client, faux_app, serving

JS = Path(__file__).parent / "js"
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@pytest.fixture
async def store(tmp_path: Path, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(f"sqlite:///{tmp_path}/harness.db", ctx)
    yield opened
    await opened.close()


def parts_of(body: str) -> list[Any]:
    """The `data:` payloads of an SSE body, `[DONE]` as the string."""
    data = [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")]
    return [item if item == "[DONE]" else json.loads(item) for item in data]


async def new_conversation(served: Served, ctx: Context, user: str = USER) -> str:
    conversation = await served.service.create(user, served.app.state.server.new_lane(FAUX), ctx)
    return conversation.id


def chat_body(conversation_id: str, text: str = "hi") -> dict[str, Any]:
    return {"id": conversation_id, "trigger": "submit-message", "messageId": None,
            "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}]}


async def test_a_sent_message_streams_its_turn_as_ui_message_parts(store: Store, ctx: Context) -> None:
    served = faux_app(store, [reply("Hello there.")])
    conversation_id = await new_conversation(served, ctx)
    async with asgi_client(served.app) as client:
        answer = await client.post("/api/chat", json=chat_body(conversation_id))
        idle = await client.get(f"/api/chat/{conversation_id}/stream")

    parts = parts_of(answer.text)
    assert answer.status_code == 200
    assert answer.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert parts[0]["type"] == "start"
    kinds = [p if isinstance(p, str) else p["type"] for p in parts[1:]]
    assert [kind for i, kind in enumerate(kinds) if kind != "text-delta" or kinds[i - 1] != kind] == [
        "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish", "[DONE]"]
    assert "".join(p["delta"] for p in parts if isinstance(p, dict) and p["type"] == "text-delta") == "Hello there."
    assert idle.status_code == 204


async def test_a_stop_ends_the_stream_with_the_interrupted_row_and_abort(store: Store, ctx: Context) -> None:
    release = asyncio.Event()
    pause = delay(release)
    served = faux_app(store, [FauxReply(parts=(*reply("Partial ").parts, pause, *reply("rest").parts))])
    conversation_id = await new_conversation(served, ctx)
    async with asgi_client(served.app) as client:
        sending = asyncio.create_task(client.post("/api/chat", json=chat_body(conversation_id)))
        await within(pause.reached.wait())
        stopped = await client.post(f"/api/chat/{conversation_id}/stop")
        release.set()
        answer = await within(sending)
        again = await client.post(f"/api/chat/{conversation_id}/stop")

    parts = parts_of(answer.text)
    assert stopped.status_code == 202
    assert stopped.json()["requested"] is True
    assert parts[-3]["type"] == "data-chat-event"
    assert parts[-3]["data"]["details"]["kind"] == "interrupted"
    assert parts[-2:] == [{"type": "abort", "reason": "user"}, "[DONE]"]
    assert again.status_code == 409
    assert again.json()["code"] == "no_active_operation"


async def test_another_users_chat_answers_as_a_missing_one_and_starts_nothing(store: Store, ctx: Context) -> None:
    served = faux_app(store, [reply("never")])
    theirs = await new_conversation(served, ctx, user="bob")
    async with asgi_client(served.app) as client:
        sent = await client.post("/api/chat", json=chat_body(theirs))
        missing = await client.post("/api/chat", json=chat_body("no-such-chat"))
        resumed = await client.get(f"/api/chat/{theirs}/stream")
        stopped = await client.post(f"/api/chat/{theirs}/stop")

    assert [r.status_code for r in (sent, missing, resumed, stopped)] == [404] * 4
    assert sent.json() == {**missing.json(), "message": "no conversation " + repr(theirs),
                           "details": {"conversation_id": theirs}}
    assert served.faux.requests == []


@pytest.mark.parametrize("body", [
    {"trigger": "regenerate-message", "messageId": "m1"},
    {"messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": ""}]}]},
    {"messages": []},
])
async def test_a_chat_request_that_cannot_start_a_turn_is_400_and_writes_nothing(
        store: Store, ctx: Context, body: dict[str, Any]) -> None:
    served = faux_app(store, [reply("never")])
    conversation_id = await new_conversation(served, ctx)
    async with asgi_client(served.app) as client:
        answer = await client.post("/api/chat", json={**chat_body(conversation_id), **body})

    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_input"
    assert served.faux.requests == []


async def test_a_call_waiting_for_approval_is_asked_after_its_input_live_and_in_a_resume(
        store: Store, ctx: Context) -> None:
    """Issue 16 item 5: a gated call's `tool-approval-request` (approval id = tool call id) follows
    its `tool-input-available` once, on the stream that sent the turn and on a resume made while it
    waits; the approved call's output follows on both."""
    write = ProbeTool("write")
    approvals, resumed, asked = Approvals(), asyncio.Event(), asyncio.Event()
    served = faux_app(store, [reply(tool_call("write", {"key": "a"}, id="call-w")), reply("Written.")],
                      tools=[write], approvals=approvals)
    served.app.add_middleware(SignalOnResume, resumed=resumed)
    approvals.listen(lambda change: asked.set() if change.answer is None else None)
    conversation_id = await new_conversation(served, ctx)
    async with asgi_client(served.app) as client:
        sending = asyncio.create_task(client.post("/api/chat", json=chat_body(conversation_id)))
        await within(asked.wait())
        resuming = asyncio.create_task(client.get(f"/api/chat/{conversation_id}/stream"))
        await within(resumed.wait())
        approvals.answer(conversation_id, "call-w", Approval(allow=True))
        sent, resumed_answer = await within(asyncio.gather(sending, resuming))

    for body in (sent.text, resumed_answer.text):
        kinds = [(p["type"], p.get("toolCallId")) for p in parts_of(body) if isinstance(p, dict)]
        tool_kinds = [kind for kind, call in kinds if call == "call-w"]
        assert tool_kinds[-3:] == ["tool-input-available", "tool-approval-request", "tool-output-available"]
        assert {"type": "tool-approval-request", "approvalId": "call-w", "toolCallId": "call-w"} in parts_of(body)
    assert write.runs == [{"key": "a"}]


class SignalOnResume:
    """ASGI middleware setting `resumed` when a resumed stream's response starts (its replay is
    computed by then), so the test lets the paused reply go on only once the client is back."""

    def __init__(self, app: Any, resumed: asyncio.Event) -> None:
        self.app, self.resumed = app, resumed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/stream"):
            await self.app(scope, receive, send)
            return

        async def signalling(message: MutableMapping[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.start" and message["status"] == 200:
                self.resumed.set()

        await self.app(scope, receive, signalling)


def node_modules(node: str) -> None:
    """Install tests/js's locked packages once (`npm ci`); they stay in tests/js/node_modules."""
    if (JS / "node_modules" / "ai" / "package.json").is_file():
        return
    npm = shutil.which("npm") or str(Path(node).with_name("npm"))
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS, check=True, capture_output=True, timeout=300)


async def test_the_ai_sdk_client_resumes_a_dropped_reply_into_one_message_with_nothing_twice(
        store: Store, ctx: Context) -> None:
    """Issue 16 item 5: `DefaultChatTransport` sends, the connection drops mid-reply, `resumeStream()`
    replays the turn from its start: one assistant message, no text twice, the tool row and both
    event rows (one placed before the drop, one after) once, and a resume after the end gets 204."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on this machine: the AI SDK client test needs Node 20 or later")
    node_modules(node)
    probe = ProbeTool()
    release, resumed = asyncio.Event(), asyncio.Event()
    pause = delay(release)
    served = faux_app(store, [
        reply("Let me check. ", tool_call("probe", {"key": "a"})),
        FauxReply(parts=(*reply("First half. ").parts, pause, *reply("second half.").parts)),
    ], tools=[probe])
    served.app.add_middleware(SignalOnResume, resumed=resumed)
    conversation_id = await new_conversation(served, ctx)
    gate = probe.gate("a")

    async def turn() -> None:
        await probe.wait_started("a")
        await served.service.record_local_shell(USER, conversation_id, "ls", 0, "notes.txt\n", ctx)
        gate.set()
        await within(pause.reached.wait())
        await within(resumed.wait())
        await served.service.record_local_shell(USER, conversation_id, "pwd", 0, "/work\n", ctx)
        release.set()

    async with serving(served.app) as url:
        client = await asyncio.create_subprocess_exec(node, str(JS / "resume_chat.mjs"), url, conversation_id,
                                                      cwd=JS, stdout=asyncio.subprocess.PIPE,
                                                      stderr=asyncio.subprocess.PIPE)
        (out, err), _ = await within(asyncio.gather(client.communicate(), turn()), 60)
        conversation = await served.service.open(USER, conversation_id, ctx)
        watch = await conversation.watch(ctx)
        watch.close()

    assert client.returncode == 0, err.decode()
    chat = json.loads(out)
    assert chat["afterDrop"]["status"] == "error"
    assert chat["afterResume"] == {"status": "ready", "errors": chat["afterDrop"]["errors"]}
    user, assistant = chat["messages"]
    assert user["role"] == "user"
    assert assistant["role"] == "assistant"
    assert assistant["id"] == watch.snapshot.last_result.operation_id  # type: ignore[union-attr]
    texts = [p["text"] for p in assistant["parts"] if p["type"] == "text"]
    assert texts == ["Let me check. ", "First half. ", "second half."]  # the script streams two text blocks
    tools = [p for p in assistant["parts"] if p["type"].startswith("tool-")]
    assert [(t["type"], t["state"], t["input"], t["output"]) for t in tools] == [
        ("tool-probe", "output-available", {"key": "a"}, "probe:a")]
    rows = [p for p in assistant["parts"] if p["type"] == "data-chat-event"]
    journal_rows = chat_event_rows(watch.snapshot.transcript)
    assert [row["id"] for row in rows] == [row.id for row in journal_rows]
    assert [row["data"]["details"]["command"] for row in rows] == ["ls", "pwd"]
