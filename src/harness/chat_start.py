"""The first prompt of `harness chat`, drawn before the application loads (issue 33, item 13).

Loading the chat (typer and every command, the journal, the runtime, the conversation service,
prompt_toolkit) takes about a second of CPU, some fifty bare Python starts. So
`harness/__main__.py` draws this prompt first, with the standard library alone, and loads the
chat in a thread meanwhile: what the person types is kept and handed to the chat's own prompt
(`Terminal.give_back`), which replaces this one once the chat is up.

It is drawn as prompt_toolkit draws the chat's prompt, a bold `›`, and says `starting…` (grey)
until something is typed. It takes printable text and Backspace; Enter sends nothing (nothing can
be sent before the conversation is attached), other keys are ignored; Ctrl-C and Ctrl-D leave at
once, without waiting for the load. The terminal's settings are restored on every way out: the
load done or failed, a leaving key, or SIGINT, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import codecs
import os
import select
import signal
import sys
import termios
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

PROMPT = "\x1b[0;1m› \x1b[0m"
PLACEHOLDER = "starting…"
LEAVING = {"\x03": 130, "\x04": 0}
"""The keys that leave at once (Ctrl-C, Ctrl-D), with the exit status each leaves with."""

_ERASE_LINE = b"\r\x1b[K"
_BACKSPACE = ("\x7f", "\x08")
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def typed_while_loading(load: Callable[[], object]) -> str:
    """Run `load` in a thread while the prompt takes what is typed on the terminal (stdin and
    stdout must be one); return the text typed by the time `load` returned, once the prompt is
    erased and the terminal's settings are restored. What `load` raises is raised here then. A
    leaving key exits (`LEAVING`) without waiting for `load`, which runs in a daemon thread."""
    keys, screen = sys.stdin.fileno(), sys.stdout.fileno()
    saved = termios.tcgetattr(keys)
    loaded, done = os.pipe()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            load()
        except BaseException as error:  # raised by the caller's thread, after the prompt
            failure.append(error)
        finally:
            os.write(done, b".")

    def restore() -> None:
        os.write(screen, _ERASE_LINE)
        termios.tcsetattr(keys, termios.TCSANOW, saved)

    def leave_on(signum: int, frame: FrameType | None) -> None:
        restore()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous = {signum: signal.signal(signum, leave_on) for signum in _SIGNALS}
    termios.tcsetattr(keys, termios.TCSANOW, _keys_one_by_one(saved))
    line = _Line(screen)
    try:
        line.draw()
        threading.Thread(target=run, name="harness-chat-load", daemon=True).start()
        while True:
            ready, _, _ = select.select([keys, loaded], [], [])
            if keys in ready and (status := line.take(os.read(keys, 1024))) is not None:
                sys.exit(status)
            if loaded in ready:
                break
    finally:
        restore()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.close(loaded)
        os.close(done)
    if failure:
        raise failure[0]
    return line.text


def _keys_one_by_one(settings: list[Any]) -> list[Any]:
    """`settings` with every key read as it is pressed, not echoed by the terminal, and Ctrl-C,
    Ctrl-D, Ctrl-Z, Ctrl-S read as keys rather than acted on (as prompt_toolkit's raw mode)."""
    changed = list(settings)
    changed[0] &= ~termios.IXON
    changed[3] &= ~(termios.ECHO | termios.ICANON | termios.ISIG | termios.IEXTEN)
    changed[6] = [*changed[6]]
    changed[6][termios.VMIN], changed[6][termios.VTIME] = 1, 0
    return changed


class _Line:
    """The prompt's line: the text typed so far, redrawn on `screen` after each change."""

    def __init__(self, screen: int) -> None:
        self.text = ""
        self._screen = screen
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._escape = ""  # the start of an escape sequence (an arrow key, ...) read so far: ignored

    def take(self, pressed: bytes) -> int | None:
        """Apply the keys `pressed`; return the exit status if one of them leaves."""
        for key in self._decoder.decode(pressed):
            if self._escape:
                self._escape = "" if self._ends_escape(key) else self._escape + key
            elif key == "\x1b":
                self._escape = key
            elif key in LEAVING:
                return LEAVING[key]
            elif key in _BACKSPACE:
                self.text = self.text[:-1]
            elif key.isprintable():
                self.text += key
        self.draw()
        return None

    def _ends_escape(self, key: str) -> bool:
        # ESC [ params final (CSI), ESC O x (SS3), else ESC x (Alt-x).
        if self._escape == "\x1b":
            return key not in "[O"
        return self._escape == "\x1bO" or "@" <= key <= "~"

    def draw(self) -> None:
        """The prompt with the end of the text that fits on one line, else the placeholder (the
        cursor before it, as prompt_toolkit leaves it)."""
        if self.text:
            width = max(os.get_terminal_size(self._screen).columns - 3, 1)
            shown = f"{self.text[-width:]}\x1b[K"
        else:
            shown = f"\x1b[0;90m{PLACEHOLDER}\x1b[0m\x1b[K\x1b[{len(PLACEHOLDER)}D"
        os.write(self._screen, f"\r{PROMPT}{shown}".encode())
