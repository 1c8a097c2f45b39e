# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""`harness chat` as a door of the conversation service (issue 13 item 8), in a pseudo-terminal:
a stopped or failed turn's chat-event row is shown as it happens and again from history when the
session is reopened after a kill, worded from its details (never the model's text); the service's
hooks apply to the chat's turns; the toolbar shows what the session spent and how much of the
context window the last request used."""

from __future__ import annotations

import asyncio
from pathlib import Path

from harness.cli.config import local_user
from harness.context import Context
from harness.conversation import ConversationService
from harness.providers.replay import Hold, ReplayResponse, ReplayServer
from harness.session import connect
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
)

MODEL_TEXT = "[The person interrupted the request.]"
"""What the model reads for an `interrupted` row: stored, sent to the model, never shown."""


def owned_by_local_user(store_url: str) -> list[str]:
    """The ids of the local user's conversations in the store."""

    async def read() -> list[str]:
        context = Context()
        store = await connect(store_url, context)
        try:
            return [info.id for info in await ConversationService(store).list(local_user(), context)]
        finally:
            await store.close(context)

    return asyncio.run(read())


def test_an_aborted_turn_shows_interrupted_by_you_live_and_again_after_a_kill(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-7: Ctrl-C leaves one `interrupted` row, shown once as it happens and again in the history
    of the reopened session; the next request replays the cut reply's text before it (CE-8)."""
    hold = Hold()
    server.enqueue(text_reply("Counting: one two three\n", "four five", hold=hold))
    first = start(chats, dirs, server)
    first.send_line("count slowly")
    first.expect("Counting: one two three")
    first.process.sendcontrol("c")
    first.expect("■ interrupted by you")
    first.expect_idle()
    session_id = first.session_id()
    live = printed_since(first, 0)
    first.kill()

    assert hold.disconnected.wait(TIMEOUT_S)
    assert live.count("interrupted by you") == 1
    assert "(reply stopped)" not in live  # the row says it; the chat's old row is gone
    offset = len(live)
    server.enqueue(text_reply("Carrying on."))
    second = start(chats, dirs, server, session_id)
    history = printed_since(second, offset)
    second.send_line("go on")
    second.expect("Carrying on.")
    second.expect("turn completed")

    assert "■ interrupted by you" in history
    assert "the request was aborted" not in history  # the reply's own error text: the row replaces it
    assert MODEL_TEXT not in printed_since(second, 0)
    assert [(m["role"], m["content"]) for m in sent_messages(server.requests[1])[1:]] == [
        ("user", "count slowly"), ("assistant", "Counting: one two three\n"), ("user", MODEL_TEXT),
        ("user", "go on")]
    assert owned_by_local_user(first.store_url) == [session_id]
    assert second.leave() == 0


def test_a_failed_turn_shows_its_public_error_text_live_and_again_after_a_kill(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-9: a refused request leaves one `error` row with the provider's text cleaned of markup,
    shown live as the one row of the failed turn (issue 33, item 6: no `turn failed` row after it)
    and again from history after a kill."""
    refusal = {"error": {"message": "Invalid <b>value</b> for 'messages'", "type": "invalid_request_error"}}
    server.enqueue(ReplayResponse.json(refusal, status=400))
    first = start(chats, dirs, server)
    first.send_line("hello")
    first.expect("✗ Invalid value for 'messages'")
    first.expect_idle()
    session_id = first.session_id()
    live = printed_since(first, 0)
    first.kill()

    assert live.count("Invalid value for 'messages'") == 1
    assert live.count("✗") == 1
    second = start(chats, dirs, server, session_id)
    history = printed_since(second, len(live))
    second.send_line("/model")  # a Ctrl-D sent before the prompt is up is eaten by the tty driver
    second.expect("model: ")

    assert "✗ Invalid value for 'messages'" in history
    assert "The request failed" not in printed_since(second, 0)
    assert second.leave() == 0


def test_the_toolbar_shows_tokens_cost_and_the_context_used_also_after_reopening(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """A reply of 100 input and 20 output tokens, at $1,000 per million, in a 1,000-token window:
    the toolbar says so (the last request sent the 100), and says it again when the session is
    reopened (from the usage ledger and the reply on the branch)."""
    (dirs[0] / "models.toml").write_text(
        '[providers.openai]\n[[providers.openai.models]]\nid = "gpt-4o"\ncontext_window = 1000\n'
        'cost = { input = 1000.0, output = 1000.0, cache_read = 0.0, cache_write = 0.0 }\n')
    server.enqueue(text_reply("Counted."))
    first = start(chats, dirs, server, cursor_reports=True)
    first.expect_reporting("0 tokens · $0.0000")
    first.send_line("count")
    first.expect_reporting("turn completed")
    first.expect_reporting("120 tokens · $0.1200 · last request: 10% of the 1,000-token context window")
    session_id = first.session_id()
    assert first.leave() == 0

    second = start(chats, dirs, server, session_id, cursor_reports=True)
    second.expect_reporting("120 tokens · $0.1200 · last request: 10% of the 1,000-token context window")
    assert second.leave() == 0


def test_mode_shell_and_command_rows_are_shown_and_reach_the_model(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-13, CE-16, CE-17 at the terminal: `/mode plan` leaves the read-only tools and a command
    row; Shift+Tab switches back with a mode row; `!cmd` shows its output and a shell row; the next
    prompt is sent as typed, after the rows, with the tools the mode offers."""
    server.enqueue(text_reply("Noted."))
    chat = start(chats, dirs, server)
    chat.send_line("/mode plan")
    chat.expect("/mode plan: mode plan")
    chat.process.send("\x1b[Z")  # Shift+Tab
    chat.expect("mode: build")
    chat.send_line("/mode plan")
    chat.expect("/mode plan: mode plan")
    chat.send_line("!echo shell-said-this")
    chat.expect("! echo shell-said-this · exit 0")
    chat.expect("shell-said-this")
    chat.send_line("what did the shell say?")
    chat.expect("Noted.")
    chat.expect("turn completed")

    request = server.requests[-1].json()
    assert sorted(tool["function"]["name"] for tool in request["tools"]) == ["grep", "list", "read"]
    messages = request["messages"]
    assert messages[-1] == {"role": "user", "content": "what did the shell say?"}
    assert "shell-said-this" in str(messages[-2]["content"])
    # Rows recorded before anyone spoke moved with the chat's draft into the store.
    assert sum("/mode plan" in str(message["content"]) for message in messages) == 2
    assert chat.leave() == 0
    again = start(chats, dirs, server, "-c")
    assert "only tools that change nothing" in str(again.process.before)  # plan mode: nothing to approve


def test_a_reasoning_level_changed_between_turns_is_announced_once_at_the_next_prompt(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-14 at the terminal: the chat admits its turns through the service, so a level changed
    since the last turn is one row right above the next prompt; cycling away and back says nothing."""
    server.enqueue(text_reply("First."), text_reply("Second."), text_reply("Third."))
    chat = start(chats, dirs, server)
    chat.send_line("/model openai/gpt-5")
    chat.expect("openai/gpt-5")
    chat.send_line("one")
    chat.expect("turn completed")
    chat.send_line("/thinking high")
    chat.expect("thinking level → high")
    chat.send_line("two")
    chat.expect("reasoning: off -> high")
    chat.expect("turn completed")
    chat.send_line("/thinking low")
    chat.expect("thinking level → low")
    chat.send_line("/thinking high")
    chat.expect("thinking level → high")
    chat.send_line("three")
    chat.expect("turn completed")

    assert "reasoning:" not in str(chat.process.before)  # the third turn, after low and back to high
    sent = sent_messages(server.requests[1])
    assert sent[-1] == {"role": "user", "content": "two"}
    assert "reasoning level changed from off to high" in str(sent[-2]["content"])
    assert chat.leave() == 0


def test_cd_is_a_row_the_model_reads_once_someone_has_spoken(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-10, CE-13: /cd before the first message records nothing; after it, one row that the next
    request carries before the prompt."""
    server.enqueue(text_reply("Hello."), text_reply("Moved."))
    (dirs[1] / "first").mkdir()
    (dirs[1] / "second").mkdir()
    chat = start(chats, dirs, server)
    chat.send_line("/cd first")
    chat.expect("working directory: ")
    chat.send_line("hi")
    chat.expect("turn completed")
    chat.send_line("/cd ../second")
    chat.expect("working directory: ")
    chat.send_line("where are we?")
    chat.expect("turn completed")

    first, second = sent_messages(server.requests[0]), sent_messages(server.requests[1])
    assert [m["role"] for m in first] == ["system", "user"]
    moved = second[-2]
    assert moved["role"] == "user"
    assert str(dirs[1] / "second") in str(moved["content"])
    assert chat.leave() == 0
