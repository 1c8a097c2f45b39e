"""A terminal chat's approval question answered from `harness serve` (issue 30, "approvals from any
process"): the real `harness chat` in a pseudo-terminal asks `allow write?`; an API server on the
same store (through httpx) lists the call and allows it; the chat's question is dismissed with a
line saying who answered, the write runs and the turn ends; a second answer is 409."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.context import Context
from harness.conversation import ConversationService
from harness.home import local_user
from harness.messages import ModelIdentity
from harness.providers.replay import ReplayServer
from harness.server import LocalUser, create_app
from harness.session import LaneConfig, connect
from server_helpers import asgi_client
from test_cli_chat import Chat, chats, dirs, server, start, text_reply, tool_reply  # noqa: F401  (fixtures)

MODEL = ModelIdentity(provider="openai", model_id="gpt-4o")


async def test_the_chats_question_is_answered_from_the_server(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer, ctx: Context) -> None:  # noqa: F811
    work = dirs[1]
    server.enqueue(tool_reply("write", {"path": "notes.txt", "content": "hello\n"}), text_reply("Written."))
    chat = start(chats, dirs, server)
    chat.send_line("write notes")
    chat.expect("allow write? [y/n/a]")
    store = await connect(chat.store_url, ctx)
    app = create_app(ConversationService(store), LocalUser(local_user()),
                     new_lane=lambda model: LaneConfig(model=model or MODEL))
    conversation = chat.session_id()
    approvals = f"/api/conversations/{conversation}/approvals"
    try:
        async with asgi_client(app) as client:
            listed: list[dict[str, Any]] = (await client.get(approvals)).json()
            allowed = await client.post(f"{approvals}/{listed[0]['tool_call_id']}", json={"allow": True})
            chat.expect(f"allowed elsewhere, by {local_user()}")
            chat.expect("Written.")
            again = await client.post(f"{approvals}/{listed[0]['tool_call_id']}", json={"allow": False})
    finally:
        await store.close()

    assert [(call["tool_name"], call["args"]["path"]) for call in listed] == [("write", "notes.txt")]
    assert allowed.status_code == 200, allowed.text
    assert (work / "notes.txt").read_text() == "hello\n"
    assert (again.status_code, again.json()["code"]) == (409, "approval_answered")
    chat.expect_idle()
    assert chat.leave() == 0
