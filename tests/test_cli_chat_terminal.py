# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""What `harness chat` puts on the terminal: outside text shown but never obeyed, Markdown, the
approval question, rows that fit the width, completion, and a shell command that ends with the
chat. The real command in a pseudo-terminal against the local replay server, as in
`test_cli_chat.py`, whose helpers these tests share. White-box in one test, which checks
`cli.terminal_text` on every control character at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli.terminal_text import escape, visible
from harness.conversation import BUILT_IN_COMMANDS
from harness.providers.replay import Hold, ReplayResponse, ReplayServer
from harness.tools.permissions import trust_mcp_server
from terminal_screen import Display
from test_cli_chat import (  # noqa: F401  (chats, dirs and server are fixtures)
    HARNESS,
    TIMEOUT_S,
    WAIT_FOR_GO,
    Chat,
    _chunk,
    _end,
    chats,
    dirs,
    sent_messages,
    server,
    start,
    text_reply,
    tool_reply,
)

MCP_SERVER = Path(__file__).parent / "mcp_server.py"
CLEAR_SCREEN = "\x1b[2J\x1b[H"
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()=>][0-9A-Za-z]?")


def raw_tool_reply(name: str, arguments_text: str) -> ReplayResponse:
    """A streamed reply that is one tool call whose argument text is exactly `arguments_text`."""
    start_call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}
    args = {"index": 0, "function": {"arguments": arguments_text}}
    body = [_chunk({"role": "assistant", "content": None}), _chunk({"tool_calls": [start_call]}),
            _chunk({"tool_calls": [args]})]
    return ReplayResponse.sse(*body, *_end("tool_calls"))


def harness(chat: Chat, server: ReplayServer, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `harness ARGS` (not in a terminal) on the chat's store, home and replay server."""
    env = {**os.environ, "HARNESS_HOME": str(chat.log_path.parent), "OPENAI_BASE_URL": f"{server.base_url}/v1",
           "OPENAI_API_KEY": "test-key", "COLUMNS": "200"}
    env.pop("HARNESS_STORE", None)
    return subprocess.run([str(HARNESS), *args], env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)


def screen_text(chat: Chat) -> str:
    """What the chat printed so far, without the terminal's own escape sequences."""
    chat.log.flush()
    return ANSI.sub("", chat.log_path.read_text(encoding="utf-8"))


def test_control_sequences_from_the_model_and_tools_are_shown_not_obeyed(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """A reply and a tool output that would clear the screen show their escape sequences as ␛
    instead, live, when the session is reopened, in `harness show` and in `harness run`; rich
    markup in a reply stays literal."""
    reply = f"Reply {CLEAR_SCREEN}with [bold]markup[/bold] inside."
    server.enqueue(tool_reply("shell", {"command": "printf 'tool \\033[2J says hi\\n'"}), text_reply(reply))
    chat = start(chats, dirs, server, "--yes")

    chat.send_line("go")
    chat.expect("tool ␛[2J says hi")
    chat.expect("Reply ␛[2J␛[Hwith [bold]markup[/bold] inside.")
    chat.expect("turn completed")
    session_id = chat.session_id()
    assert chat.leave() == 0
    before = len(screen_text(chat))
    again = start(chats, dirs, server, session_id)  # shows the session's last entries
    assert "Reply ␛[2J␛[Hwith [bold]markup[/bold] inside." in screen_text(again)[before:]
    assert again.leave() == 0
    shown = harness(chat, server, "show", session_id, "--store", chat.store_url)
    server.enqueue(text_reply(reply))
    ran = harness(chat, server, "run", "--model", "openai/gpt-4o", "--store", chat.store_url, "again")

    assert "\x1b[2J" not in chat.log_path.read_text(encoding="utf-8")
    assert "Reply ␛[2J␛[Hwith [bold]markup[/bold] inside." in shown.stdout
    assert "tool ␛[2J says hi" in shown.stdout
    assert ran.returncode == 0
    assert ran.stdout.strip() == "Reply ␛[2J␛[Hwith [bold]markup[/bold] inside."


def test_a_reply_is_rendered_as_markdown_with_code_highlighted(chats: list[Chat], dirs: tuple[Path, Path],
                                                               server: ReplayServer) -> None:
    """Emphasis, inline code and fenced code blocks are rendered, not shown as their markers;
    HTML in a reply stays visible text."""
    server.enqueue(text_reply("Some **bold** words and <div> tags.\n\n```python\ndef answer():\n",
                              "    return 42\n```\nDone."))
    chat = start(chats, dirs, server)

    chat.send_line("show me markdown")
    chat.expect("Done.")
    chat.expect("turn completed")

    log = chat.log_path.read_text(encoding="utf-8")
    text = screen_text(chat)
    assert "Some bold words and <div> tags." in text
    assert "**" not in text
    assert "```" not in text
    assert re.search(r"\x1b\[[0-9;]*mdef\x1b", log), "the code block is highlighted"
    assert "return 42" in text
    assert chat.leave() == 0


def test_approval_takes_one_key_and_shows_what_would_change(chats: list[Chat], dirs: tuple[Path, Path],
                                                            server: ReplayServer) -> None:
    """An edit shows its diff and `a` (no Enter) allows edits for the rest of the conversation, which
    the chat then says; a write of a new file shows its content and `y` allows it once."""
    (dirs[1] / "notes.txt").write_text("alpha\nbeta\n")
    server.enqueue(tool_reply("edit", {"path": "notes.txt", "old_text": "beta", "new_text": "gamma"}),
                   tool_reply("edit", {"path": "notes.txt", "old_text": "alpha", "new_text": "delta"}, "call_2"),
                   tool_reply("write", {"path": "new.txt", "content": "one line"}, "call_3"),
                   text_reply("All done."))
    chat = start(chats, dirs, server)

    chat.send_line("edit the notes")
    chat.expect("-beta")
    chat.expect("+gamma")
    chat.expect("allow edit? [y/n/a]")
    chat.process.send("a")
    chat.expect("edit runs without asking for the rest of this conversation")
    chat.expect("shell, write ask first; edit allowed")
    chat.expect("→ edit notes.txt")  # the second edit runs without a question
    chat.expect("(new file, 1 line)")
    chat.expect("one line")
    chat.expect("allow write? [y/n/a]")
    chat.process.send("y")
    chat.expect("Created new.txt: 8 bytes, 1 line")
    chat.expect("All done.")
    chat.expect("turn completed")

    assert (dirs[1] / "notes.txt").read_text() == "delta\ngamma\n"
    assert (dirs[1] / "new.txt").read_text() == "one line"
    assert screen_text(chat).count("edit notes.txt needs approval") == 1
    assert "1 lines" not in screen_text(chat)
    assert chat.leave() == 0


def test_a_call_refused_before_it_runs_shows_the_arguments_sent(chats: list[Chat], dirs: tuple[Path, Path],
                                                               server: ReplayServer) -> None:
    """A call whose arguments are not JSON is answered with an error without running: the chat
    shows its call row with the argument text, and `harness show` prints that text, not `{}`."""
    server.enqueue(raw_tool_reply("write", '{"path": "a.txt", oops'), text_reply("Sorry about that."))
    chat = start(chats, dirs, server, "--yes")

    chat.send_line("write it")
    chat.expect('→ write {"path": "a.txt", oops')
    chat.expect("it was not run")
    chat.expect("turn completed")
    session_id = chat.session_id()
    assert chat.leave() == 0
    shown = harness(chat, server, "show", session_id, "--store", chat.store_url)

    assert '→ write {"path": "a.txt", oops' in shown.stdout
    assert "write {}" not in shown.stdout


def test_rows_and_the_toolbar_wrap_at_words_in_a_narrow_terminal(chats: list[Chat], dirs: tuple[Path, Path],
                                                                 server: ReplayServer) -> None:
    """At 70 columns the header and /help wrap between words within the width, and the
    approval hint under the prompt wraps instead of being cut. /help says a conversation command
    in the words of the command table every door reads."""
    server.enqueue(tool_reply("write", {"path": "x.txt", "content": "x"}))
    chat = start(chats, dirs, server, columns=70, cursor_reports=True)

    chat.send_line("/help")
    chat.expect_reporting("Ctrl-D leaves.")
    text = screen_text(chat)
    help_text = text[text.index("/help  "):text.index("Ctrl-D leaves.") + len("Ctrl-D leaves.")]
    header = text[:text.index("/help: commands")]
    for line in (*header.splitlines(), *help_text.splitlines()):
        assert len(line) <= 70, line
    joined = " ".join(line.strip() for line in help_text.splitlines())
    assert "Ctrl-C aborts a turn, twice leaves at once; Ctrl-D leaves." in joined
    assert f"{BUILT_IN_COMMANDS['compact'].usage} {BUILT_IN_COMMANDS['compact'].summary}" in " ".join(joined.split())
    chat.send_line("write x")
    chat.expect_reporting("allow write?")
    chat.expect_reporting("abort the turn")  # the end of the hint, on its second line
    chat.process.send("n")
    chat.expect_reporting("declined")
    chat.process.sendcontrol("c")
    chat.expect_reporting("interrupted by you")


def test_tab_completes_a_command_and_thinking_needs_a_model_that_thinks(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """Tab lists the slash commands a prefix starts, each with its one-line summary, and picks
    one; `/thinking high` on a model without thinking is refused with the level it takes, and the
    level stays off."""
    chat = start(chats, dirs, server)

    chat.process.send("/re")
    chat.process.send("\t")  # /rename, /restart and /resume start so: the menu shows what each does
    chat.expect("name the conversation")
    chat.expect("reopen the conversation from its journal")
    chat.expect("finish the lane's open operation")
    chat.process.send("\t")  # the first of them
    chat.expect("ame")  # what Tab added
    chat.send_line(" by tab")
    chat.expect("/rename by tab: named by tab")
    chat.send_line("/thinking high")
    chat.expect("openai/gpt-4o does not think: its only thinking level is off")
    chat.send_line("/thinking")
    chat.expect("(levels on openai/gpt-4o: off)")
    assert "thinking: off" in screen_text(chat)
    assert chat.leave() == 0


def test_version_and_short_help(chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """`harness --version` prints the installed version; `-h` is help, for commands too."""
    version = subprocess.run([str(HARNESS), "--version"], capture_output=True, text=True, timeout=TIMEOUT_S,
                             check=False)
    short = subprocess.run([str(HARNESS), "-h"], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    chat_help = subprocess.run([str(HARNESS), "chat", "-h"], capture_output=True, text=True, timeout=TIMEOUT_S,
                               check=False)

    assert re.fullmatch(r"harness \d+\.\d+\.\d+\S*\n", version.stdout)
    assert "--version" in short.stdout
    assert "--resume" in chat_help.stdout


def test_the_start_names_the_project_mcp_servers_not_trusted_and_asks_nothing(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """The servers of a project's `.mcp.json` the person has not trusted are not started (a cloned
    repository's file runs nothing by itself): the chat says so in one line at its start, naming
    them and the command that trusts one, and asks nothing, so the first line typed is the prompt.
    A trusted server is not named, and once all are trusted there is no such line."""
    home, work = dirs
    started = work / "started"
    untrusted = {"command": "sh", "args": ["-c", f'touch "{started}"']}
    trusted = {"command": sys.executable, "args": [str(MCP_SERVER), "stdio", str(work / "ledger.log")]}
    (work / ".mcp.json").write_text(json.dumps({"mcpServers": {"repo": untrusted, "docs": untrusted,
                                                               "ledger": trusted}}))
    trust_mcp_server(home, "ledger")
    server.enqueue(text_reply("Hello."))
    chat = start(chats, dirs, server)

    chat.send_line("hi")
    chat.expect("Hello.")
    assert chat.leave() == 0
    first = screen_text(chat)
    ran_untrusted = started.exists()
    trust_mcp_server(home, "repo")
    trust_mcp_server(home, "docs")
    again = start(chats, dirs, server)
    assert again.leave() == 0

    [line] = [line for line in first.splitlines() if ".mcp.json" in line]
    assert line.startswith("./.mcp.json's MCP servers repo, docs are not started until you trust them: `")
    assert line.rstrip().endswith(" mcp trust NAME`")
    assert sent_messages(server.requests[0])[-1] == {"role": "user", "content": "hi"}
    assert not ran_untrusted
    assert ".mcp.json" not in screen_text(again)[len(first):]


def test_text_that_arrives_after_ctrl_c_is_not_shown(chats: list[Chat], dirs: tuple[Path, Path],
                                                    server: ReplayServer) -> None:
    """Once Ctrl-C has asked for the abort (the stream is hung up), later text of the reply is
    not printed."""
    hold = Hold()
    server.enqueue(text_reply("Counting: one\n", *[f"late{i} " for i in range(200)], hold=hold))
    chat = start(chats, dirs, server)

    chat.send_line("count")
    chat.expect("Counting: one")
    chat.process.sendcontrol("c")
    assert hold.disconnected.wait(TIMEOUT_S)
    hold.release()
    chat.expect("■ interrupted by you")
    chat.expect_idle()

    assert "late" not in screen_text(chat)
    assert chat.leave() == 0


def lines_after(lines: list[str], first: str, count: int) -> list[str]:
    """The `count` lines on screen after the line `first`."""
    at = lines.index(first) + 1
    return lines[at:at + count]


def test_ctrl_c_a_rename_and_a_mode_switch_each_print_one_row(chats: list[Chat], dirs: tuple[Path, Path],
                                                              server: ReplayServer) -> None:
    """Issue 33 item 6: one Ctrl-C printed four rows (^C: aborting, aborting (user), interrupted,
    turn aborted), /rename and /mode two each. Now each prints one: the interrupted row, the
    command's row."""
    hold = Hold()
    server.enqueue(text_reply("Counting: one\n", "two", hold=hold))
    chat = start(chats, dirs, server)
    display = Display(chat)

    chat.send_line("/rename counting")
    display.wait_for("/rename counting: named counting")
    chat.send_line("/mode plan")
    display.wait_for("/mode plan: mode plan (read-only tools)")
    chat.send_line("count")
    display.wait_for("Counting: one")
    chat.process.sendcontrol("c")
    display.wait_for("■ interrupted by you")
    hold.release()
    chat.send_line("/help")  # a row after the abort, so a late row of the abort would show before it
    display.wait_for("› /help")

    lines = display.lines()
    assert lines_after(lines, "› /rename counting", 2) == ["/rename counting: named counting", "› /mode plan"]
    assert lines_after(lines, "› /mode plan", 2) == ["/mode plan: mode plan (read-only tools)", "› count"]
    assert lines_after(lines, "Counting: one", 2) == ["■ interrupted by you", "› /help"]
    assert chat.leave() == 0


def test_a_steer_and_a_follow_up_typed_mid_sentence_show_once_and_leave_the_reply_whole(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """Issue 33: a steer (Enter) and a follow-up (Alt-Enter) typed while a reply streamed were
    echoed inside it, mid-sentence, with a "queued as" row each, and the steer was printed again
    once sent. Each waits above the prompt until the model reads it, and is then printed once,
    where it is read; a command's rows wait under the reply until it ends; the reply reads whole."""
    hold = Hold()
    server.enqueue(text_reply("The sea is a", " mirror that reflects our souls.", hold=hold),
                   text_reply("Goodbye, mountains."))
    chat = start(chats, dirs, server)
    display = Display(chat)

    chat.send_line("write about the sea")
    display.wait_for("The sea is a")
    chat.send_line("/rename seas")  # its echo waits under the reply until it ends
    display.wait_for("› /rename seas")
    chat.send_line("make it about mountains instead")
    chat.process.send("then say goodbye\x1b\r")  # Alt-Enter
    waiting = display.wait_for("follow-up queued (read when the run would end): then say goodbye")
    hold.release()
    display.wait_for("turn completed")

    assert "steer queued (read after the current step): make it about mountains instead" in waiting
    lines = [line for line in display.lines() if line]
    reply = lines.index("The sea is a mirror that reflects our souls.")
    assert lines[reply + 1:reply + 6] == ["› /rename seas", "/rename seas: named seas",
                                          "› make it about mountains instead (steer sent)",
                                          "› then say goodbye (follow-up sent)", "Goodbye, mountains."]
    assert sum("mountains instead" in line for line in lines) == 1
    assert sum("say goodbye" in line for line in lines) == 1
    assert [message["content"] for message in sent_messages(server.requests[1])[-2:]] == [
        "make it about mountains instead", "then say goodbye"]  # the reply had no calls: both are read now
    assert chat.leave() == 0


SPINNER = "[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]"
"""A frame of the working line's spinner (rich's `dots`)."""


def working_line(phase: str) -> re.Pattern[str]:
    """The working line of a turn in `phase` (a pattern), with its elapsed time, on one line."""
    return re.compile(f"{SPINNER} {phase} · \\d+ s")


@pytest.mark.parametrize("columns", [50, 80, 120])
def test_a_spinner_says_what_the_turn_is_doing_and_for_how_long(chats: list[Chat], dirs: tuple[Path, Path],
                                                               server: ReplayServer, columns: int) -> None:
    """Issue 33 item 2: before its first token a turn showed nothing but the `steer›` prompt for
    seconds. A spinner above the prompt says what the turn does, waiting for the model or
    running a tool, and for how long, on one line at any width; it goes when the turn ends."""
    hold = Hold()
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "shell", "arguments": ""}}
    args = {"index": 0, "function": {"arguments": json.dumps({"command": f"{WAIT_FOR_GO}; echo released"})}}
    server.enqueue(ReplayResponse.sse(_chunk({"role": "assistant", "content": None}), hold,
                                      _chunk({"tool_calls": [call]}), _chunk({"tool_calls": [args]}),
                                      *_end("tool_calls")),
                   text_reply("Done."))
    chat = start(chats, dirs, server, "--yes", columns=columns)
    display = Display(chat)

    chat.send_line("run it")
    assert hold.reached.wait(TIMEOUT_S)
    waiting = display.wait_for(lambda lines: any(re.fullmatch(f"{SPINNER} waiting for the model · [1-9][0-9]* s",
                                                              line) for line in lines))  # the time counts
    hold.release()
    running = display.wait_for(lambda lines: any(working_line("running shell: .*").fullmatch(line)
                                                 for line in lines))
    (dirs[1] / "go").touch()
    display.wait_for("turn completed")
    idle = display.wait_for(lambda lines: not any(re.match(SPINNER, line) for line in lines))

    assert waiting[waiting.index("› run it") + 1:][0].startswith(tuple("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"))
    assert [line for line in running if working_line("running shell: .*").fullmatch(line)] != []
    assert all(len(line) <= columns for line in running)
    assert "Done." in idle
    assert chat.leave() == 0


def status_lines(lines: list[str]) -> list[str]:
    """The non-blank lines under the prompt's last line (`›` idle, `steer›` in a turn): the status line."""
    prompt = max(at for at, line in enumerate(lines) if line.startswith(("›", "steer›")))
    return [line for line in lines[prompt + 1:] if line]


@pytest.mark.parametrize("columns", [50, 80, 120])
def test_the_status_line_stays_on_one_line_at_any_width(chats: list[Chat], dirs: tuple[Path, Path],
                                                       server: ReplayServer, columns: int) -> None:
    """Issue 33 item 7: the status line under the prompt wrapped to 2 lines at 120 columns, 3 at
    80 and 5 at 50. It is one line, idle and during a turn, keeping what matters most: the
    share of the window and what asks for approval idle (the mode from 80 columns on), Ctrl-C
    in a turn."""
    hold = Hold()
    server.enqueue(text_reply("First answer."), text_reply("Second", " answer.", hold=hold))
    chat = start(chats, dirs, server, columns=columns, cursor_reports=True)
    display = Display(chat)

    chat.send_line("one")
    display.wait_for("turn completed")
    idle = display.wait_for(lambda lines: "Ctrl-C: abort" not in " ".join(lines) and "% of the" in lines[-1])
    chat.send_line("two")
    busy = display.wait_for(lambda lines: "Ctrl-C: abort" in lines[-1] and "Second" in " ".join(lines))
    hold.release()
    display.wait_for("Second answer.")

    assert len(status_lines(idle)) == 1
    assert "edit, shell, write ask first" in idle[-1]
    assert ("build mode" in idle[-1]) == (columns >= 80)
    assert len(status_lines(busy)) == 1
    assert all(len(line) < columns for line in (idle[-1], busy[-1]))
    assert chat.leave() == 0


PASTED_LINES = [f"{n:03d} INFO request served in {n % 7 + 1} ms by worker {n % 3}" for n in range(200)]


def bracketed_paste(lines: list[str]) -> str:
    """What a terminal in bracketed-paste mode sends when `lines` are pasted (Return between lines)."""
    return "\x1b[200~" + "\r".join(lines) + "\r\x1b[201~"


PLACEHOLDER = re.compile(r"\[pasted 200 lines · ~[0-9,]+ tokens · ([0-9]+)% of the window\]")


def test_a_paste_of_many_lines_shows_as_one_line_and_is_sent_whole(chats: list[Chat], dirs: tuple[Path, Path],
                                                                   server: ReplayServer) -> None:
    """Issue 33 item 4: a paste of 200 lines landed as 200 input lines. It shows as one
    placeholder with its size and share of the window, on the input line and in the echo of
    the sent line, and the model receives the text typed around it with the whole paste."""
    server.enqueue(text_reply("Read it."))
    chat = start(chats, dirs, server, columns=80)
    display = Display(chat)

    chat.process.send("summarise this: ")
    chat.process.send(bracketed_paste(PASTED_LINES))
    pasted = display.wait_for(lambda lines: any(PLACEHOLDER.search(line) for line in lines))
    chat.process.send(" thanks\r")
    display.wait_for("turn completed")

    assert [line for line in pasted if line.startswith("›")] != []
    assert all(PLACEHOLDER.fullmatch(line.removeprefix("› summarise this: ")) for line in pasted
               if line.startswith("›"))
    shown = display.lines()
    assert [line for line in shown if "INFO request served" in line] == []
    echo = [line for line in shown if PLACEHOLDER.search(line)]
    assert len(echo) == 1
    assert re.fullmatch(f"› summarise this: {PLACEHOLDER.pattern} thanks", echo[0])
    assert "this paste is" not in " ".join(shown)  # 2% of gpt-4o's window: no warning
    sent = sent_messages(server.requests[-1])[-1]
    assert sent == {"role": "user", "content": "summarise this: " + "\n".join(PASTED_LINES) + " thanks"}
    assert chat.leave() == 0


def test_a_paste_that_would_take_most_of_the_window_is_warned_about(chats: list[Chat], dirs: tuple[Path, Path],
                                                                    server: ReplayServer) -> None:
    """Issue 33 item 4: a paste that filled the default model's 4,096-token window was sent
    without a word. On a window that small the placeholder says the share, and one row warns."""
    (dirs[0] / "models.toml").write_text('[providers.openai]\n[[providers.openai.models]]\n'
                                         'id = "gpt-4o"\ncontext_window = 4096\n')
    chat = start(chats, dirs, server, columns=80)
    display = Display(chat)

    chat.process.send(bracketed_paste(PASTED_LINES))
    lines = display.wait_for(lambda lines: any(PLACEHOLDER.search(line) for line in lines)
                             and any("4,096-token window" in line for line in lines))

    share = next(int(found.group(1)) for line in lines if (found := PLACEHOLDER.search(line)))
    assert share > 50
    assert [line for line in lines if "window" in line and not PLACEHOLDER.search(line)] == [
        f"this paste is {share}% of the 4,096-token window; sending it may compact the chat"]
    chat.process.sendcontrol("c")  # clears the input line
    assert chat.leave() == 0


SENTENCE = ("the harness respected every request while its workers kept the journal whole and nothing that "
            "was written could be lost between one step and the next one")
WORDS = SENTENCE.split()


def reply_paragraph(lines: list[str], after: str) -> str:
    """The screen lines of the reply after the line `after`, up to what ends it (a blank line,
    the working line, the prompt or the outcome row), joined by spaces; empty before `after` shows."""
    paragraph: list[str] = []
    for line in lines[lines.index(after) + 1:] if after in lines else []:
        if not line or re.match(SPINNER, line) or line.startswith(("›", "steer›", "✓")):
            break
        paragraph.append(line)
    return " ".join(paragraph)


def test_a_resize_mid_reply_prints_the_transcript_again_at_the_new_width(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """Issue 33 item 3: resizing the terminal mid-reply garbled the transcript for good: words
    split across lines, a partial line printed twice. A paragraph that streams while the
    terminal goes from 120 columns to 50 and back is on screen whole each time, wrapped at
    words to the width of now, once, and so is everything above it."""
    first, second, third = (" ".join(WORDS * 2), " ".join(WORDS[:20]), " ".join(WORDS[20:]))
    holds = Hold(), Hold()
    server.enqueue(ReplayResponse.sse(_chunk({"role": "assistant", "content": ""}), _chunk({"content": first}),
                                      holds[0], _chunk({"content": " " + second}), holds[1],
                                      _chunk({"content": " " + third + ".\n\nDone."}), *_end("stop")))
    chat = start(chats, dirs, server, columns=120)
    display = Display(chat)

    chat.send_line("go")
    assert holds[0].reached.wait(TIMEOUT_S)
    wide = display.wait_for(lambda lines: reply_paragraph(lines, "› go") == first)
    display.resize(50)
    narrow = display.wait_for(lambda lines: reply_paragraph(lines, "› go") == first)
    holds[0].release()
    assert holds[1].reached.wait(TIMEOUT_S)
    display.wait_for(lambda lines: reply_paragraph(lines, "› go") == f"{first} {second}")
    display.resize(120)
    wide_again = display.wait_for(lambda lines: reply_paragraph(lines, "› go") == f"{first} {second}"
                                  and max(map(len, lines)) > 50)
    holds[1].release()
    display.wait_for("turn completed")
    done = display.lines()

    assert max(map(len, wide)) > 50
    assert max(map(len, narrow)) <= 50
    assert any(chat.session_id() in line for line in narrow)  # the header, wrapped again at words, not cut
    assert reply_paragraph(done, "› go") == f"{first} {second} {third}."
    assert "Done." in done
    assert [line for line in (*narrow, *wide_again, *done) if line.startswith("› go")] == ["› go"] * 3
    assert len([line for line in done if line.startswith("harness chat · session")]) == 1
    assert chat.leave() == 0


def long_conversation(chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer,
                      *then: ReplayResponse) -> Chat:
    """A chat after four turns long enough to compact (two answers hold more than the 20,000
    tokens a compaction keeps), with the replies `then` queued after them."""
    long_answer = "word " * 12_000
    server.enqueue(text_reply(long_answer), text_reply("Second."), text_reply(long_answer), text_reply("Fourth."),
                   *then)
    chat = start(chats, dirs, server)
    for question in ("one", "two", "three", "four"):
        chat.send_line(question)
        chat.expect("turn completed")
    return chat


def test_manual_compaction_shows_one_completion_row(chats: list[Chat], dirs: tuple[Path, Path],
                                                   server: ReplayServer) -> None:
    """/compact ends with one row saying it completed, not two."""
    chat = long_conversation(chats, dirs, server, text_reply("A summary of everything."))

    chat.send_line("/compact")
    chat.expect("compaction completed")
    chat.send_line("/help")
    chat.expect("this list")

    assert screen_text(chat).count("compaction completed") == 1
    assert chat.leave() == 0


def test_a_line_typed_during_a_compaction_is_sent_when_it_ends(chats: list[Chat], dirs: tuple[Path, Path],
                                                              server: ReplayServer) -> None:
    """Issue 12: a line typed while /compact ran was queued as a steer and handed back unsent
    ("not sent: ...") when it ended. It is kept for the next run, which starts when it ends."""
    hold = Hold()
    chat = long_conversation(chats, dirs, server, text_reply("A summary", " of everything.", hold=hold),
                             text_reply("About the queued line."))

    chat.send_line("/compact")
    chat.expect("compacting the context")
    chat.send_line("what did we decide?")
    chat.expect("queued: sent when the compaction ends")
    hold.release()
    chat.expect("compaction completed")
    chat.expect("About the queued line.")
    chat.expect("turn completed")

    assert "not sent" not in screen_text(chat)
    assert sent_messages(server.requests[-1])[-1] == {"role": "user", "content": "what did we decide?"}
    assert chat.leave() == 0


def _gone(pid: int) -> bool:
    """Whether process `pid` has exited (a zombie waiting for its reaper counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_a_shell_command_ends_when_the_chat_is_killed(chats: list[Chat], dirs: tuple[Path, Path],
                                                      server: ReplayServer) -> None:
    """kill -9 of the chat while the shell tool runs `sleep 300` ends the sleep too."""
    server.enqueue(tool_reply("shell", {"command": "sleep 300 & echo $! > sleep.pid; wait"}))
    chat = start(chats, dirs, server, "--yes")
    chat.send_line("sleep a while")
    chat.expect("→ shell: sleep 300")
    pid_file = dirs[1] / "sleep.pid"
    deadline = time.monotonic() + TIMEOUT_S
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.02)
    pid = int(pid_file.read_text())
    try:
        chat.kill()
        deadline = time.monotonic() + TIMEOUT_S
        while not _gone(pid):
            assert time.monotonic() < deadline, "the command outlived the chat"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_every_control_character_is_made_visible() -> None:
    """C0 and C1 controls, DEL and bidirectional overrides become visible symbols; newlines,
    tabs and printable text are kept, and a CRLF line end becomes a newline."""
    text = "a\x1b[31mb\x07\x08c\x7f\x9b2J\u202edef\tg\r\nh\ri\n"

    shown = visible(text)

    assert shown == "a␛[31mb␇␈c␡<U+009B>2J<U+202E>def\tg\nh␍i\n"
    assert escape("[bold]x[/bold]\x1b") == "\\[bold]x\\[/bold]␛"
