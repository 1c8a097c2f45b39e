# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""The conversation commands at the terminal (issue 13 items 5 and 8), in a pseudo-terminal:
`/fast` on the model `models.toml` names, `/restart` from the journal, `/model` typed during a turn
as the queued switch, `!cmd`'s output on its row (CE-12, CE-16, CE-17), and the lane a new
conversation talks on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pexpect

from harness.context import Context
from harness.providers.replay import Hold, ReplayServer
from harness.session import connect
from test_cli_chat import (  # noqa: F401  (chats, dirs and server are fixtures)
    HARNESS,
    TIMEOUT_S,
    Chat,
    chats,
    dirs,
    printed_since,
    sent_messages,
    server,
    start,
    text_reply,
)


def test_fast_switches_to_the_configured_fast_model_and_back_and_without_one_is_refused(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-16, CE-17: `/fast` is the conversation's `fast` command on `models.toml`'s `fast` model;
    with none configured it answers with the `no_fast_model` row and changes nothing."""
    unconfigured = start(chats, dirs, server)
    unconfigured.send_line("/fast")
    unconfigured.expect("/fast: failed: no fast model is configured for this conversation")
    unconfigured.expect('fast = "provider/id"')
    assert unconfigured.leave() == 0

    (dirs[0] / "models.toml").write_text('fast = "openai/gpt-4o-mini"\n')
    server.enqueue(text_reply("Quick."), text_reply("Thorough."))
    chat = start(chats, dirs, server)
    chat.send_line("/fast")
    chat.expect("/fast: fast mode on: openai/gpt-4o-mini, reasoning off")
    chat.send_line("quick one")
    chat.expect("turn completed")
    chat.send_line("/fast")
    chat.expect("/fast: fast mode off: openai/gpt-4o, reasoning off")
    chat.send_line("thorough one")
    chat.expect("turn completed")

    assert [request.json()["model"] for request in server.requests] == ["gpt-4o-mini", "gpt-4o"]
    assert chat.leave() == 0


def test_restart_writes_its_row_and_the_chat_goes_on_in_the_same_session(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-17: `/restart` reopens the conversation from the journal after its row is written; the
    next prompt continues the same session, with the row and the turn before it."""
    server.enqueue(text_reply("Hello."), text_reply("Still here."))
    chat = start(chats, dirs, server)
    chat.send_line("hello")
    chat.expect("turn completed")
    session_id = chat.session_id()
    chat.send_line("/restart")
    chat.expect("/restart: restarted from the journal")
    chat.send_line("are you there?")
    chat.expect("Still here.")
    chat.expect("turn completed")

    sent = sent_messages(server.requests[1])
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user", "user"]
    assert "restarted from its journal" in str(sent[-2]["content"])
    assert sent[-1] == {"role": "user", "content": "are you there?"}
    assert chat.leave() == 0
    assert chat.session_id() == session_id


def test_model_typed_during_a_turn_is_queued_acknowledged_and_lands_before_the_next_turn(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-12 at the terminal: the running turn ends on its model; the switch is acknowledged as
    queued after the delay, its row shows when it completes, and the next turn runs on it. Typed
    at an idle prompt, `/model` switches at once (its command row)."""
    hold = Hold()
    server.enqueue(text_reply("Working ", "on it.", hold=hold), text_reply("Switched."), text_reply("Back."))
    chat = start(chats, dirs, server)
    chat.send_line("a long one")
    chat.expect("Working")
    chat.send_line("/model openai/gpt-4.1")
    chat.expect("model openai/gpt-4.1 queued: the next turn starts on it")

    assert "model: openai/gpt-4o -> openai/gpt-4.1" not in printed_since(chat, 0)
    hold.release()
    chat.expect("model: openai/gpt-4o -> openai/gpt-4.1")
    chat.send_line("next")
    chat.expect("Switched.")
    chat.expect("turn completed")
    chat.send_line("/model openai/gpt-4o")
    chat.expect("/model openai/gpt-4o: model openai/gpt-4o")
    chat.send_line("and back")
    chat.expect("Back.")
    chat.expect("turn completed")

    assert [request.json()["model"] for request in server.requests] == ["gpt-4o", "gpt-4.1", "gpt-4o"]
    assert "The person switched the model to openai/gpt-4.1" in str(sent_messages(server.requests[1]))
    assert chat.leave() == 0


def test_a_shell_commands_output_is_shown_once_on_its_row_live_and_again_after_reopening(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-17: `!cmd`'s output shows once, as the lines of its shell row, which is what the model
    reads; the reopened session shows the same row."""
    server.enqueue(text_reply("Seen."))
    chat = start(chats, dirs, server)
    chat.send_line("!printf 'shell-%s\\n' one two")
    chat.expect("! printf 'shell-%s\\n' one two · exit 0")
    chat.expect("shell-two")
    chat.send_line("what did it print?")
    chat.expect("turn completed")
    live = printed_since(chat, 0)
    assert chat.leave() == 0

    assert (live.count("shell-one"), live.count("shell-two")) == (1, 1)
    offset = len(printed_since(chat, 0))
    again = start(chats, dirs, server, "-c")
    history = printed_since(again, offset)
    assert "shell-one" in history
    assert "shell-two" in history
    assert again.leave() == 0


def test_a_new_chat_on_a_lane_other_than_main_is_a_usage_error_that_writes_nothing(
        dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """A conversation talks to its person on lane `main`: `--lane` names a lane of an existing session."""
    home, work = dirs
    store_url = f"sqlite:///{home / 'harness.db'}"
    env = {**os.environ, "HARNESS_HOME": str(home), "OPENAI_BASE_URL": f"{server.base_url}/v1",
           "OPENAI_API_KEY": "test-key", "TERM": "xterm"}
    chat = pexpect.spawn(str(HARNESS), ["chat", "--model", "openai/gpt-4o", "--lane", "side", "--store", store_url],
                         cwd=str(work), env=env, encoding="utf-8", dimensions=(50, 200), timeout=TIMEOUT_S)
    chat.expect_exact("a new session talks on lane main; lane side can only be chosen in an existing session")
    chat.expect(pexpect.EOF)
    chat.close()

    assert chat.exitstatus == 2
    assert asyncio.run(sessions_in(store_url)) == []


async def sessions_in(store_url: str) -> list[str]:
    context = Context()
    store = await connect(store_url, context)
    try:
        return [info.id for info in await store.list_sessions(context)]
    finally:
        await store.close(context)
