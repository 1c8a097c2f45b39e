"""What a person sees of a chat in a pseudo-terminal: pyte's VT emulator fed with everything the
chat prints, resized when the test resizes the terminal, answering the chat's cursor position
requests as a terminal does. The screen tests read lines from it instead of matching the raw
output, which holds every redraw of the prompt."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pexpect
import pyte

from test_cli_chat import TIMEOUT_S, Chat

HISTORY_LINES = 100_000


class _Tee:
    """pexpect's `logfile_read`: the chat's log, and the emulator."""

    def __init__(self, chat: Chat, stream: pyte.Stream) -> None:
        self._chat, self._stream = chat, stream

    def write(self, text: str) -> None:
        self._chat.log.write(text)
        self._stream.feed(text)

    def flush(self) -> None:
        self._chat.log.flush()


class _Screen(pyte.HistoryScreen):
    """The emulator's screen, with its scrollback; it answers a cursor position request to the chat."""

    def __init__(self, chat: Chat, columns: int, lines: int) -> None:
        super().__init__(columns, lines, history=HISTORY_LINES)
        self._chat = chat

    def write_process_input(self, data: str) -> None:
        self._chat.process.send(data)


class Display:
    """The terminal `chat` runs in, from now on reading what it prints through the emulator (what
    it printed before is fed first). Use `wait_for` rather than `chat.expect` once it exists:
    what one reads the other does not see."""

    def __init__(self, chat: Chat) -> None:
        lines, columns = chat.process.getwinsize()
        self.chat = chat
        self.screen = _Screen(chat, columns, lines)
        self._stream = pyte.Stream(self.screen)
        chat.log.flush()
        with chat.log_path.open(encoding="utf-8", newline="") as printed:
            self._stream.feed(printed.read())
        chat.process.logfile_read = _Tee(chat, self._stream)

    @property
    def columns(self) -> int:
        return int(self.screen.columns)

    def lines(self) -> list[str]:
        """The screen's lines, after those scrolled off it, trailing blanks removed from each."""
        rows = [*self.screen.history.top, *(self.screen.buffer[y] for y in range(self.screen.lines))]
        return [_text(row, self.screen.columns).rstrip() for row in rows]

    def visible(self) -> list[str]:
        """The lines on the screen now."""
        return [line.rstrip() for line in self.screen.display]

    def read(self) -> None:
        """Take what the chat printed meanwhile (waiting a moment for it)."""
        with contextlib.suppress(pexpect.TIMEOUT):
            self.chat.process.read_nonblocking(65536, timeout=0.05)

    def wait_for(self, seen: str | Callable[[list[str]], bool], timeout: float = TIMEOUT_S) -> list[str]:
        """Read until the screen holds the text `seen` on one line (or `seen(visible lines)` is
        true); returns the visible lines."""
        deadline = time.monotonic() + timeout
        test = seen if callable(seen) else lambda lines: any(seen in line for line in lines)
        while not test(lines := self.visible()):
            assert time.monotonic() < deadline, f"not on screen: {seen!r}\n" + "\n".join(lines)
            self.read()
        return lines

    def resize(self, columns: int) -> None:
        """Make the terminal `columns` wide, as a person dragging its edge does: the terminal
        changes first, then the chat is told (SIGWINCH)."""
        self.screen.resize(self.screen.lines, columns)
        self.chat.process.setwinsize(self.screen.lines, columns)


def _text(row: dict[int, pyte.screens.Char], columns: int) -> str:
    return "".join(row[x].data for x in range(columns))
