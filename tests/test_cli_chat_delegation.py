# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""`harness chat` delegating to a background sub-agent (CE-18), in a pseudo-terminal: the chat is
killed while parent and child both stream, and reopened; the child's lane is resumed with the
parent's run, its result reaches the parent once, and the delegation row is shown as it lands and
again from history, worded by the terminal from the finish marker."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from harness.conversation import GENERAL_AGENT
from harness.providers.replay import Hold, ReplayServer
from test_cli_chat import (  # noqa: F401  (chats, dirs and server are fixtures)
    TIMEOUT_S,
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

ROW = "⇢ agent general finished: Count the files"


def wait_for(check: Callable[[], bool], what: str) -> None:
    """Poll `check()` (the replay server's requests, which send this test no event) until it holds."""
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def test_a_background_delegation_killed_with_its_parent_is_resumed_and_shows_its_row(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    server.enqueue(tool_reply("delegate", {"task": "Count the files\nand report", "background": True}),
                   text_reply("Working", " on it", hold=Hold()), text_reply("Working", " on it", hold=Hold()))
    first = start(chats, dirs, server)
    first.send_line("count them in the background")
    first.expect("Started background job")
    wait_for(lambda: len(server.requests) == 3, "the parent and the child both asking")
    session_id = first.session_id()
    first.kill()

    server.enqueue(text_reply("All done."), text_reply("All done."))
    offset = len(printed_since(first, 0))
    reopened = start(chats, dirs, server, session_id, "--resume")
    reopened.expect("✓ turn completed")
    if ROW not in str(reopened.process.before):  # the child may end before its parent's turn or after it
        reopened.expect(ROW)
    systems = [sent_messages(request)[0]["content"] for request in server.requests[3:]]
    assert GENERAL_AGENT.instructions in systems  # the child asked again, as its agent
    assert reopened.leave() == 0
    assert printed_since(reopened, offset).count(ROW) == 1

    offset = len(printed_since(reopened, 0))
    history = start(chats, dirs, server, session_id)
    assert ROW in str(history.process.before)  # the recent entries, above the prompt's help line
    assert len(server.requests) == 5  # nothing asked, nothing delivered again
    assert history.leave() == 0
    assert printed_since(history, offset).count(ROW) == 1
