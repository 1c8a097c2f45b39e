# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""`harness chat` and its sessions, in a pseudo-terminal: a chat left with nothing said leaves no
session, leaving says how to come back, and `-c` continues the most recent session."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pexpect
import pytest

from harness.cli.chat import command_as_invoked
from harness.context import Context
from harness.providers.replay import ReplayServer
from harness.session import SessionInfo, connect
from test_cli_chat import HARNESS, Chat, chats, dirs, server, start, text_reply  # noqa: F401  (chats, dirs and server are fixtures)

PROMPT = "\u203a"
"""The idle prompt: a Ctrl-D sent before it is drawn reaches no reader."""


def listed(store_url: str) -> list[SessionInfo]:
    async def read() -> list[SessionInfo]:
        context = Context()
        store = await connect(store_url, context)
        try:
            return await store.list_sessions(context)
        finally:
            await store.close(context)

    return asyncio.run(read())


def leave_with(chat: Chat, how: str) -> int:
    if how == "ctrl-d":
        return chat.leave()  # sent until the prompt has the terminal
    if how == "/quit":
        chat.send_line("/quit")
    else:  # Ctrl-C twice at the idle prompt
        chat.process.sendcontrol("c")
        chat.process.sendcontrol("c")
    chat.process.expect(pexpect.EOF)
    chat.process.close()
    status = chat.process.exitstatus
    assert status is not None
    return status


@pytest.mark.parametrize("how", ["/quit", "ctrl-d"])
def test_a_chat_left_with_nothing_said_leaves_no_session(chats: list[Chat], dirs: tuple[Path, Path],
                                                         server: ReplayServer, how: str) -> None:
    chat = start(chats, dirs, server)
    chat.send_line("/model openai/gpt-4.1")
    chat.expect("gpt-4.1")
    chat.expect(PROMPT)
    assert listed(chat.store_url) == []  # not even while the chat is open

    assert leave_with(chat, how) == 0

    assert listed(chat.store_url) == []
    assert "continue it with" not in chat.log_path.read_text(encoding="utf-8")


@pytest.mark.parametrize("how", ["/quit", "ctrl-d", "ctrl-c twice"])
def test_leaving_names_the_session_and_how_to_continue_it(chats: list[Chat], dirs: tuple[Path, Path],
                                                          server: ReplayServer, how: str) -> None:
    server.enqueue(text_reply("Noted."))
    chat = start(chats, dirs, server)
    chat.send_line("remember this")
    chat.expect("turn completed")
    session_id = chat.session_id()

    assert leave_with(chat, how) == 0

    log = chat.log_path.read_text(encoding="utf-8")
    harness = command_as_invoked(str(HARNESS), cwd=dirs[1], path=os.environ["PATH"])  # `harness` if on PATH
    assert f"continue it with `{harness} chat {session_id}` (or `{harness} chat -c`" in log
    assert [info.id for info in listed(chat.store_url)] == [session_id]


def test_continue_opens_the_most_recently_updated_session(chats: list[Chat], dirs: tuple[Path, Path],
                                                          server: ReplayServer) -> None:
    server.enqueue(text_reply("First answer."), text_reply("Second answer."), text_reply("Third answer."))
    first = start(chats, dirs, server)
    first.send_line("first topic")
    first.expect("turn completed")
    older = first.session_id()
    assert leave_with(first, "ctrl-d") == 0
    second = start(chats, dirs, server)
    second.send_line("second topic")
    second.expect("turn completed")
    newer = second.session_id()
    assert leave_with(second, "ctrl-d") == 0
    reopened = start(chats, dirs, server, older)  # a turn in the older session makes it the most recent
    reopened.send_line("back to the first")
    reopened.expect("turn completed")
    assert leave_with(reopened, "ctrl-d") == 0

    continued = start(chats, dirs, server, "-c")
    continued.expect(PROMPT)

    assert continued.session_id() == older != newer
    log = continued.log_path.read_text(encoding="utf-8")
    assert "Third answer." in log[log.rindex("harness chat"):]  # the continued session's recent entries
    assert leave_with(continued, "ctrl-d") == 0


def test_a_chat_session_is_given_by_its_name(chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    server.enqueue(text_reply("Named by its prompt."))
    first = start(chats, dirs, server)
    first.send_line("plan the garden")
    first.expect("turn completed")
    session_id = first.session_id()
    assert leave_with(first, "ctrl-d") == 0

    by_name = start(chats, dirs, server, "plan the garden")
    by_name.expect(PROMPT)

    assert by_name.session_id() == session_id
    assert leave_with(by_name, "ctrl-d") == 0


def test_the_first_prompt_saves_the_session_with_what_was_chosen_before_it(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    server.enqueue(text_reply("Answered on 4.1."))
    chat = start(chats, dirs, server)
    draft_id = chat.session_id()
    chat.send_line("/model openai/gpt-4.1")
    chat.expect("gpt-4.1")

    chat.send_line("first words")
    chat.expect("turn completed")

    assert [info.id for info in listed(chat.store_url)] == [draft_id]  # the id the header showed
    assert server.requests[0].json()["model"] == "gpt-4.1"
    assert leave_with(chat, "ctrl-d") == 0


@pytest.mark.parametrize("on_path", [False, True])
def test_the_way_back_names_the_command_as_the_person_ran_it(chats: list[Chat], dirs: tuple[Path, Path],
                                                             server: ReplayServer, monkeypatch: pytest.MonkeyPatch,
                                                             on_path: bool) -> None:
    """Issue 33 item 9: the exit hint said `harness chat ID`, which is not on the PATH of someone
    who followed the README (`.venv/bin/harness`). It names `harness` only when PATH finds this
    program, else the path that was run."""
    monkeypatch.setenv("PATH", f"{HARNESS.parent}:/usr/bin:/bin" if on_path else "/usr/bin:/bin")
    server.enqueue(text_reply("Noted."))
    chat = start(chats, dirs, server)
    chat.send_line("remember this")
    chat.expect("turn completed")
    session_id = chat.session_id()

    assert chat.leave() == 0
    harness = "harness" if on_path else str(HARNESS)
    assert f"continue it with `{harness} chat {session_id}`" in chat.log_path.read_text(encoding="utf-8")


def test_a_command_run_by_its_path_is_named_by_that_path(tmp_path: Path) -> None:
    """Issue 33 item 9: `.venv/bin/harness` typed in the clone stays `.venv/bin/harness`; run
    from elsewhere it is the absolute path; `harness` only when PATH finds the same program."""
    program = tmp_path / ".venv" / "bin" / "harness"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    assert command_as_invoked(".venv/bin/harness", cwd=tmp_path, path="/usr/bin") == ".venv/bin/harness"
    assert command_as_invoked(str(program), cwd=tmp_path, path="/usr/bin") == ".venv/bin/harness"
    assert command_as_invoked("../.venv/bin/harness", cwd=elsewhere, path="/usr/bin") == str(program)
    assert command_as_invoked(".venv/bin/harness", cwd=tmp_path, path=f"/usr/bin:{program.parent}") == "harness"
    assert command_as_invoked("harness", cwd=elsewhere, path="/usr/bin") == "harness"
