"""The prompt `harness chat` draws before the application loads (issue 33, item 13), in a
pseudo-terminal at 80 columns: what is typed there (printable text, Backspace; Enter and arrows do
nothing) reaches the chat's own prompt, drawn alike, and is sent on Enter; Ctrl-D and Ctrl-C leave
at once; a bad flag is reported on a clean line; the terminal's settings (`stty -g`) are the same
after every way out. Loading waits for a file the test writes (an import hook in the program the
test runs, or the load given to `typed_while_loading`), so what is typed is typed before it ends.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pexpect
import pyte
import pytest

from harness.chat_start import PLACEHOLDER
from harness.providers.replay import ReplayServer
from test_cli_chat import HARNESS, sent_messages, text_reply

TIMEOUT_S = 30
COLUMNS = 80

WAIT = """
import sys, time
from pathlib import Path

LOADED = Path(sys.argv[1])

def wait():
    while not LOADED.exists():
        time.sleep(0.01)
"""

PROMPT_ONLY = WAIT + """
import os
from harness.chat_start import typed_while_loading

print("pid", os.getpid(), flush=True)

def load():
    wait()
    if LOADED.read_text() == "fail":
        raise ValueError("loading failed")

try:
    print("typed:", repr(typed_while_loading(load)))
except ValueError as error:
    print("raised:", error)
"""

HARNESS_HELD = WAIT + """
class HoldTheApplication:  # an import hook: `harness.cli` loads once the file exists
    def find_spec(self, name, path=None, target=None):
        if name == "harness.cli":
            wait()

sys.meta_path.insert(0, HoldTheApplication())
from harness.__main__ import main

sys.argv = ["harness", *sys.argv[2:]]
main()
"""

IN_SHELL = 'echo "before $(stty -g)"; "$@"; echo "status $?"; echo "after $(stty -g)"'
"""Runs its arguments between two prints of the terminal's settings, and prints the exit status."""


class _Feed:
    """pexpect's `logfile_read`: what the command prints, fed to the emulator."""

    def __init__(self, stream: pyte.Stream) -> None:
        self.write, self.flush = stream.feed, lambda: None


class Terminal:
    """`argv` in a pseudo-terminal of 80 columns run by `sh` (`IN_SHELL`), read through pyte."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.screen = pyte.Screen(COLUMNS, 24)
        stream = pyte.Stream(self.screen)
        self.process = pexpect.spawn("sh", ["-c", IN_SHELL, "sh", *argv], cwd=str(cwd), encoding="utf-8",
                                     dimensions=(24, COLUMNS), timeout=TIMEOUT_S,
                                     env={"TERM": "xterm", "PATH": "/usr/bin:/bin", **(env or {})})
        self.process.logfile_read = _Feed(stream)
        self.settings = self.read(r"before (\S+)\r\n")

    pid = 0
    """The process drawing the prompt, when it says (`PROMPT_ONLY`)."""

    def read(self, pattern: str) -> str:
        """Wait for `pattern` to be printed; the text of its group."""
        self.process.expect(pattern)
        match = self.process.match
        assert isinstance(match, re.Match)
        return match.group(1)

    def prompt_line(self) -> list[tuple[str, bool, str]]:
        """The cursor's line as drawn: each character with whether it is bold, and its colour."""
        row = self.screen.buffer[self.screen.cursor.y]
        return [(row[x].data, row[x].bold, row[x].fg) for x in range(COLUMNS)]

    def ended(self) -> int:
        """Wait for the command to end; its exit status, once the terminal's settings are found the
        same as before it."""
        status = int(self.read(r"status (\d+)\r\n"))
        assert self.read(r"after (\S+)\r\n") == self.settings
        self.process.expect(pexpect.EOF)
        return status


def prompt_only(tmp_path: Path) -> tuple[Terminal, Path]:
    loaded = tmp_path / "loaded"
    terminal = Terminal([sys.executable, "-c", PROMPT_ONLY, str(loaded)], tmp_path)
    terminal.pid = int(terminal.read(r"pid (\d+)\r\n"))
    terminal.process.expect_exact(PLACEHOLDER)
    return terminal, loaded


def test_text_typed_before_the_chat_loads_reaches_its_prompt_drawn_alike_and_is_sent_on_enter(
        tmp_path: Path) -> None:
    held = tmp_path / "loaded"
    env = {"HARNESS_HOME": str(tmp_path), "OPENAI_API_KEY": "test-key", "PROMPT_TOOLKIT_NO_CPR": "1"}
    with ReplayServer([text_reply("Hello from the replay.")]) as server:
        chat = Terminal([sys.executable, "-c", HARNESS_HELD, str(held), "chat", "--model", "openai/gpt-4o",
                         "--store", f"sqlite:///{tmp_path / 'harness.db'}"], tmp_path,
                        {**env, "OPENAI_BASE_URL": f"{server.base_url}/v1"})
        chat.process.expect_exact(PLACEHOLDER)
        assert [(data, bold) for data, bold, _ in chat.prompt_line()[:2]] == [("›", True), (" ", True)]
        assert chat.prompt_line()[2][2] != "default"  # the placeholder is grey

        chat.process.send("helo\x7f\x7fllo")  # Backspace
        chat.process.expect_exact("hello\x1b[K")
        chat.process.send("\x1b[D\x1bOA\r!")  # an arrow and Enter do nothing yet
        chat.process.expect_exact("hello!\x1b[K")
        early = chat.prompt_line()
        held.write_text("")

        chat.process.expect_exact("/help: commands")
        chat.process.expect_exact("hello!")
        assert chat.prompt_line() == early
        chat.process.send("\r")
        chat.process.expect_exact("Hello from the replay.")
        chat.process.expect_exact("turn completed")
        assert sent_messages(server.requests[0])[-1] == {"role": "user", "content": "hello!"}
        chat.process.sendcontrol("d")
        assert chat.ended() == 0


@pytest.mark.parametrize(("leave", "status"), [("ctrl-d", 0), ("ctrl-c", 130), ("SIGTERM", 128 + signal.SIGTERM)])
def test_ctrl_d_ctrl_c_and_a_signal_leave_at_once_with_the_terminal_restored(tmp_path: Path, leave: str,
                                                                             status: int) -> None:
    terminal, _ = prompt_only(tmp_path)  # loading never ends here: leaving does not wait for it
    terminal.process.send("typed")
    terminal.process.expect_exact("typed")
    if leave == "SIGTERM":
        os.kill(terminal.pid, signal.SIGTERM)
    else:
        terminal.process.sendcontrol(leave[-1])

    assert terminal.ended() == status
    assert PLACEHOLDER not in "\n".join(terminal.screen.display)


def test_the_typed_text_is_returned_once_loaded(tmp_path: Path) -> None:
    typed, loaded = prompt_only(tmp_path)
    typed.process.send("é ok")
    typed.process.expect_exact("é ok")
    loaded.write_text("")

    typed.process.expect_exact("typed: 'é ok'")
    assert typed.ended() == 0


def test_what_loading_raises_is_raised_after_the_prompt(tmp_path: Path) -> None:
    failing, loaded = prompt_only(tmp_path)
    loaded.write_text("fail")

    failing.process.expect_exact("raised: loading failed")
    assert failing.ended() == 0


def test_a_bad_flag_is_reported_on_a_clean_line_with_the_usage_exit_status(tmp_path: Path) -> None:
    terminal = Terminal([str(HARNESS), "chat", "--no-such-flag"], tmp_path,
                        {"HARNESS_HOME": str(tmp_path), "PATH": os.environ["PATH"]})
    terminal.process.expect_exact(PLACEHOLDER)

    assert terminal.ended() == 2
    shown = "\n".join(line.rstrip() for line in terminal.screen.display)
    assert "No such option: --no-such-flag" in shown
    assert PLACEHOLDER not in shown
    assert "›" not in shown
