"""The prompt `harness chat` draws while it loads (issue 33, item 13), in a pseudo-terminal: what is
typed there is handed over once loading ends, Enter sends nothing before then, and Ctrl-D leaves
at once. Loading here is a thread that waits for a file the test writes, so the order is certain."""

from __future__ import annotations

import sys
from pathlib import Path

import pexpect

TIMEOUT_S = 30

PROGRAM = """
import sys, time
from pathlib import Path
from harness.cli.chat_start import typed_while_loading

def load():
    while not Path(sys.argv[1]).exists():
        time.sleep(0.01)
    if Path(sys.argv[1]).read_text() == "fail":
        raise ValueError("loading failed")

try:
    print("typed:", repr(typed_while_loading(load)))
except ValueError as error:
    print("raised:", error)
"""


def start(tmp_path: Path) -> tuple[pexpect.spawn[str], Path]:
    loaded = tmp_path / "loaded"
    prompt = pexpect.spawn(sys.executable, ["-c", PROGRAM, str(loaded)], encoding="utf-8", dimensions=(24, 80),
                           timeout=TIMEOUT_S, env={"TERM": "xterm", "PATH": "/usr/bin:/bin"})
    prompt.expect_exact("›")
    prompt.expect_exact("starting…")
    return prompt, loaded


def test_what_is_typed_while_loading_is_handed_over_and_enter_sends_nothing_before(tmp_path: Path) -> None:
    prompt, loaded = start(tmp_path)
    prompt.send("hello")
    prompt.expect_exact("hello")
    prompt.send("\r")  # before the chat is up: nothing is sent, the line stays
    prompt.send(" again")
    prompt.expect_exact("again")
    loaded.write_text("")

    prompt.expect_exact("typed: 'hello again'")
    prompt.expect(pexpect.EOF)


def test_ctrl_d_leaves_at_once_and_what_loading_raises_comes_after_the_prompt(tmp_path: Path) -> None:
    left, _ = start(tmp_path)
    left.sendcontrol("d")  # loading never ends here: leaving does not wait for it
    left.expect_exact("typed: None")
    left.expect(pexpect.EOF)

    failing, loaded = start(tmp_path)
    loaded.write_text("fail")
    failing.expect_exact("raised: loading failed")
    failing.expect(pexpect.EOF)
