# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""Tools follow the model at the terminal (issue 30, item 5): a chat begun on the tiny embedded
model, which has no tools, gets them when `/model` switches it to a real one, and its toolbar stops
saying "no tools"; `/tools` lists and chooses them."""

from __future__ import annotations

from pathlib import Path

from harness.providers.replay import ReplayServer
from terminal_screen import Display
from test_cli_chat import (  # noqa: F401  (chats, dirs and server are fixtures)
    Chat,
    chats,
    dirs,
    printed_since,
    sent_messages,
    server,
    start,
    text_reply,
    tool_reply,
)


def test_a_chat_begun_on_the_embedded_model_calls_a_tool_after_model_and_tools_chooses_them(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """The session `make run` creates: "no tools" on the embedded model; `/model openai/gpt-4o`
    gives the default tools (its row says which, the toolbar shows their approvals), and the
    model's `list` call runs instead of being "not available". `/tools` lists them, `/tools off`
    takes them away and a switch back and forth keeps that choice."""
    (dirs[1] / "notes.txt").write_text("x")
    server.enqueue(tool_reply("list", {"path": "."}), text_reply("Listed."), text_reply("Plain."))
    chat = start(chats, dirs, server, "--model", "embedded/smollm2-135m", api_key=True, cursor_reports=True)
    chat.expect_reporting("· no tools")

    chat.send_line("/model openai/gpt-4o")
    chat.expect_reporting("/model openai/gpt-4o: model openai/gpt-4o · tools: read, write, edit, list")
    chat.expect_reporting("edit, shell, write ask first")
    chat.send_line("what is here?")
    chat.expect_reporting("← list")
    chat.expect_reporting("Listed.")
    chat.expect_reporting("turn completed")

    chat.send_line("/tools")
    chat.expect_reporting("/tools: tools: read, write, edit, list")
    chat.expect_reporting("(the model's)")
    chat.send_line("/tools off")
    chat.expect_reporting("/tools off: tools: none (your choice, kept across model switches)")
    chat.send_line("/model embedded/smollm2-135m")
    chat.expect_reporting("/model embedded/smollm2-135m: model embedded/smollm2-135m\x1b")
    chat.send_line("/model openai/gpt-4o")
    chat.expect_reporting("/model openai/gpt-4o: model openai/gpt-4o\x1b")
    chat.send_line("anything?")
    chat.expect_reporting("Plain.")
    chat.expect_reporting("turn completed")

    assert "not available" not in printed_since(chat, 0)
    assert [tool["function"]["name"] for tool in server.requests[0].json()["tools"]][:4] == [
        "read", "write", "edit", "list"]
    assert "notes.txt" in str(sent_messages(server.requests[1])[-1]["content"])
    assert "tools" not in server.requests[2].json()
    assert chat.leave() == 0


def test_the_cost_stays_on_the_status_line_when_tools_are_turned_on(chats: list[Chat], dirs: tuple[Path, Path],
                                                                   server: ReplayServer) -> None:
    """Issue 33: at 80 columns "$0.0000" left the status line after `/tools on`: what asks for
    approval grew longer, and the cost was dropped before the key hints. What the session spent
    outlasts the keys /help lists."""
    chat = start(chats, dirs, server, "--model", "embedded/smollm2-135m", columns=80, cursor_reports=True)
    display = Display(chat)
    before = display.wait_for(lambda lines: "no tools" in lines[-1])

    chat.send_line("/tools on")
    after = display.wait_for(lambda lines: "ask first" in lines[-1])

    assert "0 tokens · $0.0000 · " in before[-1]
    assert "0 tokens · $0.0000 · " in after[-1]
    assert chat.leave() == 0
