"""The AI SDK UI message stream door of `harness serve` (issue 16 item 5): `POST /api/chat` starts a
turn and streams it, `GET /api/chat/{id}/stream` resumes it (204 when idle), `POST
/api/chat/{id}/stop` stops it durably; and the real `ai` client (tests/js) sends, loses its
connection mid-reply (or the server, killed and started again), resumes, and holds one message
with nothing twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from drive_helpers import FAUX, ProbeTool, within
from harness.context import Context
from harness.conversation import GardenMessage
from harness.conversation.service import chat_event_rows
from harness.messages import UserMessage
from harness.providers.faux import FauxReply, delay, failure, reply, tool_call
from harness.providers.replay import Hold, ReplayServer
from harness.runtime import DriveSettings, RetryPolicy
from harness.server import Approvals, PendingApproval
from harness.session import Store, connect
from server_helpers import SERVE_START_S, USER, Served, asgi_client, faux_app, serve_process, serving, sse_until
from test_cli_run import chat_text, openai_env

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


def kinds_of(parts: list[Any]) -> list[str]:
    """The part types, one per run of text deltas."""
    kinds = [p if isinstance(p, str) else p["type"] for p in parts]
    return [kind for i, kind in enumerate(kinds) if kind != "text-delta" or kinds[i - 1] != kind]


def answer_body(conversation_id: str, message_id: str, tool_call_id: str, approval: dict[str, Any]) -> dict[str, Any]:
    """What `addToolApprovalResponse` then `sendMessage()` post: the chat with the assistant
    message last, its tool part answered with `approval`."""
    tool = {"type": "tool-probe", "toolCallId": tool_call_id, "state": "approval-responded", "input": {"key": "a"},
            "approval": approval}
    return {**chat_body(conversation_id), "messageId": message_id, "messages": [
        *chat_body(conversation_id)["messages"],
        {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, tool]}]}


async def asked(approvals: Approvals, conversation_id: str) -> PendingApproval:
    """The conversation's first call waiting for approval, once one waits."""
    changed = asyncio.Event()
    remove = approvals.listen(lambda change: changed.set())
    try:
        while not approvals.pending(conversation_id):
            await within(changed.wait())
            changed.clear()
    finally:
        remove()
    return approvals.pending(conversation_id)[0]


async def test_a_call_waiting_for_approval_pauses_its_stream_and_the_answer_streams_the_rest_of_the_message(
        store: Store, ctx: Context) -> None:
    """Issue 16 item 5: the request follows the call's input and the stream ends there (`finish`,
    `tool-calls`), live and resumed; the assistant message posted back with the answer on its tool
    part runs the call and streams the rest under the same message id: not the text the client
    has, but the call's output, a row written while it waited, and the reply."""
    approvals, probe = Approvals(), ProbeTool(asks_first=True)
    served = faux_app(store, [reply("Checking. ", tool_call("probe", {"key": "a"})), reply("Found it.")],
                      tools=[probe], approvals=approvals)
    conversation_id = await new_conversation(served, ctx)
    async with asgi_client(served.app) as client:
        sent = await client.post("/api/chat", json=chat_body(conversation_id))
        resumed = await client.get(f"/api/chat/{conversation_id}/stream")
        await served.service.record_local_shell(USER, conversation_id, "ls", 0, "notes.txt\n", ctx)
        [pending] = approvals.pending(conversation_id)
        message_id = parts_of(sent.text)[0]["messageId"]
        answered = await client.post("/api/chat", json=answer_body(
            conversation_id, message_id, pending.tool_call_id, {"id": pending.tool_call_id, "approved": True}))
        idle = await client.get(f"/api/chat/{conversation_id}/stream")

    paused = parts_of(sent.text)
    assert kinds_of(paused) == ["start", "start-step", "text-start", "text-delta", "tool-input-start",
                                "tool-input-available", "text-end", "tool-approval-request", "finish-step", "finish",
                                "[DONE]"]
    assert paused[-4] == {"type": "tool-approval-request", "approvalId": pending.tool_call_id,
                          "toolCallId": pending.tool_call_id}
    assert paused[-2] == {"type": "finish", "finishReason": "tool-calls"}
    assert kinds_of(parts_of(resumed.text)) == kinds_of(paused)
    rest = parts_of(answered.text)
    assert answered.status_code == 200
    assert rest[0] == {"type": "start", "messageId": message_id}
    assert [kind for kind in kinds_of(rest) if kind != "data-chat-event"] == [
        "start", "tool-output-available", "finish-step", "start-step", "text-start", "text-delta", "text-end",
        "finish-step", "finish", "[DONE]"]
    assert rest[1] == {"type": "tool-output-available", "toolCallId": pending.tool_call_id, "output": "probe:a"}
    assert [p["data"]["details"]["command"] for p in rest if p != "[DONE]" and p["type"] == "data-chat-event"] == [
        "ls"]
    assert probe.runs == [{"key": "a"}]
    assert idle.status_code == 204


@pytest.mark.parametrize(("approval", "status", "code"), [
    ({"id": "no-such-call", "approved": True}, 404, "approval_not_found"),
    ({"id": None, "approved": True}, 400, "invalid_input"),
    ({"approved": "yes"}, 400, "invalid_input"),
])
async def test_an_answer_no_call_waits_for_is_refused_and_answers_nothing(
        store: Store, ctx: Context, approval: dict[str, Any], status: int, code: str) -> None:
    approvals, probe = Approvals(), ProbeTool(asks_first=True)
    served = faux_app(store, [reply(tool_call("probe", {"key": "a"})), reply("never")], tools=[probe],
                      approvals=approvals)
    conversation_id = await new_conversation(served, ctx)
    async with asgi_client(served.app) as client:
        sent = await client.post("/api/chat", json=chat_body(conversation_id))
        [pending] = approvals.pending(conversation_id)
        message_id = parts_of(sent.text)[0]["messageId"]
        body = answer_body(conversation_id, message_id, pending.tool_call_id, {"id": pending.tool_call_id, **approval})
        refused = await client.post("/api/chat", json=body)
        user, assistant = body["messages"]
        silent = {**assistant, "parts": [{"type": "text", "text": "no answer here"}]}
        unanswered = await client.post("/api/chat", json={**body, "messages": [user, silent]})

        assert (refused.status_code, refused.json()["code"]) == (status, code)
        assert (unanswered.status_code, unanswered.json()["code"]) == (400, "invalid_input")
        assert approvals.pending(conversation_id) == [pending]
        assert probe.runs == []
        assert len(served.faux.requests) == 1


async def test_a_call_asked_while_another_runs_pauses_the_stream_only_once_that_one_ended(
        store: Store, ctx: Context) -> None:
    """The client answers with its next request once every call of the step has an output or an
    answer, so a stream pauses only when nothing of its run is running."""
    approvals, probe, write = Approvals(), ProbeTool(), ProbeTool("write", asks_first=True)
    hold = probe.gate("slow")
    served = faux_app(store, [reply(tool_call("probe", {"key": "slow"}), tool_call("write", {"key": "b"}))],
                      tools=[probe, write], approvals=approvals)
    conversation_id = await new_conversation(served, ctx)
    async with asgi_client(served.app) as client:
        sending = asyncio.create_task(client.post("/api/chat", json=chat_body(conversation_id)))
        pending = await asked(approvals, conversation_id)
        hold.set()
        sent = await within(sending)

    parts = parts_of(sent.text)
    assert kinds_of(parts)[-6:] == ["tool-input-available", "tool-approval-request", "tool-output-available",
                                    "finish-step", "finish", "[DONE]"]
    assert (parts[-5]["toolCallId"], parts[-4]["toolCallId"]) == (pending.tool_call_id, parts[3]["toolCallId"])
    assert pending.tool_name == "write"


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


def node() -> str:
    """Node with tests/js's packages installed; the test is skipped on a machine without Node."""
    found = shutil.which("node")
    if found is None:
        pytest.skip("node is not on this machine: the AI SDK client tests need Node 20 or later")
    node_modules(found)
    return found


async def run_client(script: str, url: str, conversation_id: str, during: Awaitable[None] | None = None) -> Any:
    """Run tests/js/`script` against the server at `url` (awaiting `during` alongside); its printed JSON."""
    client = await asyncio.create_subprocess_exec(node(), str(JS / script), url, conversation_id, cwd=JS,
                                                  stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    (out, err), _ = await within(asyncio.gather(client.communicate(), during or asyncio.sleep(0)), 60)
    assert client.returncode == 0, err.decode()
    return json.loads(out)


async def test_the_ai_sdk_client_resumes_a_dropped_reply_into_one_message_with_nothing_twice(
        store: Store, ctx: Context) -> None:
    """Issue 16 item 5: `DefaultChatTransport` sends, the connection drops mid-reply, `resumeStream()`
    replays the turn from its start: one assistant message, no text twice, the tool row and both
    event rows (one placed before the drop, one after) once, and a resume after the end gets 204."""
    node()
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
        chat = await run_client("resume_chat.mjs", url, conversation_id, turn())
        conversation = await served.service.open(USER, conversation_id, ctx)
        watch = await conversation.watch(ctx)
        watch.close()

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


async def test_the_ai_sdk_client_approves_and_denies_a_waiting_call_and_the_reply_finishes(
        store: Store, ctx: Context) -> None:
    """Issue 16 item 5: a call waiting for approval ends its stream with `tool-approval-request`;
    the real client's `addToolApprovalResponse` with `sendAutomaticallyWhen` posts the assistant
    message with the answer, the server answers the waiting call, and the stream goes on with the
    same message: approved, the tool runs and the reply finishes; denied, it never runs and the
    model reads the person's reason."""
    node()
    probe = ProbeTool(asks_first=True)
    served = faux_app(store, [reply(tool_call("probe", {"key": "a"})), reply("Found it."),
                              reply(tool_call("probe", {"key": "b"})), reply("Understood.")],
                      tools=[probe], approvals=Approvals())
    conversation_id = await new_conversation(served, ctx)

    async with serving(served.app) as url:
        chat = await run_client("approve_chat.mjs", url, conversation_id)

    assert chat["errors"] == []
    approved, denied = chat["approved"], chat["denied"]
    for answered in (approved, denied):
        assert answered["paused"]["status"] == "ready"
        assert answered["paused"]["tool"]["type"] == "tool-probe"
        assert answered["paused"]["tool"]["approval"]["id"] == answered["paused"]["tool"]["toolCallId"]
        assert (answered["finishReason"], answered["status"]) == ("stop", "ready")
    assert probe.runs == [{"key": "a"}]
    messages = chat["messages"]
    assert [(m["role"], m["id"]) for m in messages[1::2]] == [
        ("assistant", approved["paused"]["messageId"]), ("assistant", denied["paused"]["messageId"])]
    first, second = messages[1]["parts"], messages[3]["parts"]
    ran = [p for p in first if p["type"] == "tool-probe"]
    refused = [p for p in second if p["type"] == "tool-probe"]
    assert [(p["state"], p["input"], p["output"]) for p in ran] == [("output-available", {"key": "a"}, "probe:a")]
    assert [(p["state"], p["input"]) for p in refused] == [("output-error", {"key": "b"})]
    assert "not that one" in refused[0]["errorText"]
    assert [p["text"] for p in first + second if p["type"] == "text"] == ["Found it.", "Understood."]
    told = served.faux.requests[-1].request.messages[-1]
    assert "not that one" in str(told)


async def test_the_ai_sdk_client_takes_a_retried_step_a_steer_and_a_garden_message_in_one_message(
        store: Store, ctx: Context) -> None:
    """Issue 16 item 5: `reset-step` (a failed attempt that is retried), `steering-message` and a
    `data-sender-message` are parts ai@7.0.173's chunk schema takes: the retried attempt's text is
    gone, the steer and the garden's message are in the message once, and nothing failed."""
    probe = ProbeTool()
    quick = DriveSettings(frame_interval_s=0, retry=RetryPolicy(base_delay_ms=1))
    served = faux_app(store, [failure("retryable", "overloaded", "Half an ans"),
                              reply("Looking. ", tool_call("probe", {"key": "a"})), reply("Found probe:a.")],
                      tools=[probe], drive=quick)
    conversation_id = await new_conversation(served, ctx)
    gate = probe.gate("a")
    said = GardenMessage(garden="allotment", kind="reply", emission_id="e1", goal_id="g1", run_id="r1",
                         text="The beans are up.")

    async def turn() -> None:
        await probe.wait_started("a")
        conversation = await served.service.open(USER, conversation_id, ctx)
        await conversation.steer(UserMessage(content="and be brief"), ctx)
        await served.service.post_garden_message(USER, conversation_id, said, ctx)
        gate.set()

    async with serving(served.app) as url:
        chat = await run_client("send_chat.mjs", url, conversation_id, turn())

    assert (chat["status"], chat["errors"]) == ("ready", [])
    assert {"reset-step", "steering-message", "data-sender-message"} <= set(chat["sent"])
    parts = chat["messages"][1]["parts"]
    assert [p["type"] for p in parts] == ["step-start", "text", "tool-probe", "steering-message",
                                          "data-sender-message", "step-start", "text"]
    assert [p["text"] for p in parts if p["type"] == "text"] == ["Looking. ", "Found probe:a."]
    steer, garden = parts[3], parts[4]
    assert steer["parts"] == [{"type": "text", "text": "and be brief"}]
    assert garden["data"]["sender"] == "garden"
    assert garden["data"]["text"].endswith("The beans are up.")
    assert garden["id"] == garden["data"]["id"]


async def test_the_ai_sdk_client_resumes_a_reply_a_restart_cut_off_into_the_final_message(tmp_path: Path) -> None:
    """One conversation door, item 4: `harness serve` SIGKILLed mid-reply and started again on the
    same store keeps the cut-off attempt off the branch and asks the step again; the real client,
    whose stream failed with the server, resumes while the new attempt streams and holds one
    assistant message under the run's id (the one it had) whose text is the final reply's, whole
    and once."""
    node_path = node()
    parts = ["The first part of a long answer, ", "then the second part of it, ", "and at last the end."]
    cut, retried = Hold(), Hold()
    with ReplayServer([chat_text(parts[0], cut, "never sent."),
                       chat_text(parts[0], parts[1], retried, parts[2])]) as models:
        async with serve_process(tmp_path, openai_env(models)) as server, \
                httpx.AsyncClient(base_url=server.url, timeout=SERVE_START_S) as http:
            created = await http.post("/api/conversations", json={})
            assert created.status_code == 201, created.text
            conversation_id = created.json()["id"]
            client = await asyncio.create_subprocess_exec(
                node_path, str(JS / "restart_chat.mjs"), server.url, conversation_id, parts[0], cwd=JS,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            assert client.stdin is not None
            assert client.stdout is not None
            try:
                assert await within(client.stdout.readline(), SERVE_START_S) == b"cut\n"
                server.kill()
                await server.start()
                client.stdin.write(b"serving\n")
                await client.stdin.drain()
                assert await within(client.stdout.readline(), SERVE_START_S) == b"resumed\n"
                retried.release()
                out, err = await within(client.communicate(), SERVE_START_S)
            finally:
                if client.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        client.kill()
                    await client.wait()
            assert client.returncode == 0, err.decode()
            [snapshot] = await within(sse_until(http, f"/api/conversations/{conversation_id}/events",
                                                lambda event: event.name == "snapshot"))

    chat = json.loads(out)
    reply_entry = snapshot.data["transcript"][-1]["payload"]["message"]
    final = "".join(block["text"] for block in reply_entry["content"] if block["type"] == "text")
    assert final == "".join(parts)
    assert chat["afterCut"]["status"] == "error"
    assert chat["cut"]["text"] == parts[0]
    user, assistant = chat["messages"]
    assert user["role"] == "user"
    assert assistant["id"] == chat["cut"]["messageId"] == snapshot.data["last_result"]["operation_id"]
    assert [p["text"] for p in assistant["parts"] if p["type"] == "text"] == [final]
    assert chat["status"] == "ready"
