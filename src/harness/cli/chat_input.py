"""The input side of `harness chat`: one prompt that stays on screen for the whole chat, with the
keys of a chat (Enter, Alt-Enter, Ctrl-C, Ctrl-D) and questions that borrow it (approvals, choices).

A single task keeps prompting, so typing works while a turn runs. Each submitted line goes to the
oldest open question if there is one, else to the chat's line queue (`read`). The prompt erases
itself when a line is submitted; the chat prints what it did with the line instead.

A paste of several lines shows as one placeholder on the input line, saying its size and the share
of the model's context window it would take (`Pastes`); the line is sent with the pasted text.
"""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import WordCompleter
from prompt_toolkit.document import Document
from prompt_toolkit.filters import Condition
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.keys import Keys
from prompt_toolkit.styles import Style
from rich.spinner import Spinner

from harness.cli.chat_view import Screen, StatusPart, clip, fit_status
from harness.cli.terminal_text import escape
from harness.messages import UserMessage
from harness.runtime.branch_context import estimate_tokens

STYLE = Style.from_dict({
    "prompt": "bold",
    "busy": "ansiyellow",
    "working": "ansicyan",
    "queued": "ansibrightblack",
    "question": "bold ansiyellow",
    "bottom-toolbar": "noreverse ansibrightblack",
})


@dataclass(frozen=True)
class Line:
    """A submitted line; `follow_up` when it was sent with Alt-Enter."""

    text: str
    follow_up: bool = False


@dataclass
class _Question:
    prompt: str
    hint: str
    answer: asyncio.Future[str | None]
    keys: str = ""  # answered by one of these keys, without Enter; a typed line when empty


WORKING_TICK_S = 0.1
"""How often the working line is redrawn while a turn runs (its spinner and elapsed time move)."""

PASTE_WARN_SHARE = 0.5
"""A paste that would take more than this share of the model's context window is warned about: with
the system prompt, the conversation and the reply it would not fit without a compaction."""


class Pastes:
    """The multi-line pastes of a chat, each shown on the input line as a placeholder such as
    `[pasted 200 lines · ~1,900 tokens · 46% of the window]` and put back in a submitted line.

    Tokens are the runtime's estimate (`estimate_tokens`, four characters a token), the share is
    of the window given when pasted. Placeholders stay known for the whole chat, so a line
    recalled from this chat's history is sent whole too."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}

    def add(self, text: str, context_window: int | None) -> tuple[str, float | None]:
        """Keep `text` (line ends made `\\n`, the final one dropped) and return its placeholder and
        the share of `context_window` (tokens) it would take, None when the window is unknown."""
        text = text.replace("\r\n", "\n").replace("\r", "\n").removesuffix("\n")
        lines, tokens = text.count("\n") + 1, estimate_tokens([UserMessage(content=text)])
        share = tokens / context_window if context_window else None
        of_window = f" · {share:.0%} of the window" if share is not None else ""
        label = f"pasted {lines:,} lines · ~{tokens:,} tokens{of_window}"
        placeholder, copy = f"[{label}]", 1
        while self._texts.get(placeholder, text) != text:  # the same size again: number it
            copy += 1
            placeholder = f"[{label} #{copy}]"
        self._texts[placeholder] = text
        return placeholder, share

    def expand(self, line: str) -> str:
        """`line` with each placeholder replaced by the text pasted."""
        for placeholder, text in self._texts.items():
            line = line.replace(placeholder, text)
        return line

    def collapse(self, line: str) -> str:
        """`line` with each pasted text it holds shown as its placeholder again."""
        for placeholder, text in self._texts.items():
            line = line.replace(text, placeholder)
        return line


class Terminal:
    """The chat's prompt. `busy()` says whether a turn runs (the prompt then steers), `status()`
    gives the status line shown under it (fitted to one line of the terminal), `working(columns)`
    what the turn is doing in at most that many characters, shown above the prompt behind a
    spinner while it runs (before the reply's first token too), `on_interrupt()` is what Ctrl-C
    does during a turn, and Tab completes the names in `commands` (`/name` to its one-line summary,
    which the Tab menu shows beside each name). `queued()` gives the lines typed during the turn
    that wait for the model to read them, shown above the working line until they are sent (the
    chat then prints each once, where the model reads it).

    Ctrl-C: answers an open question with None; during a turn calls `on_interrupt`; at an idle
    prompt clears the line, or, on an empty line, warns once and then leaves. Ctrl-D on an empty
    idle prompt leaves. Alt-Enter sends a follow-up during a turn and inserts a line break
    otherwise. `read()` returns None once the person leaves.

    A bracketed paste of several lines is collapsed to a placeholder (`Pastes`); with more than
    `PASTE_WARN_SHARE` of `context_window()` (tokens; None when unknown) it is warned about."""

    def __init__(self, screen: Screen, *, busy: Callable[[], bool], status: Callable[[], Sequence[StatusPart]],
                 on_interrupt: Callable[[], None], commands: Mapping[str, str] | None = None,
                 history: Path | None = None, on_shift_tab: Callable[[], None] | None = None,
                 working: Callable[[int], str] = lambda columns: "",
                 queued: Callable[[], Sequence[str]] = lambda: (),
                 context_window: Callable[[], int | None] = lambda: None) -> None:
        self._screen = screen
        self._busy = busy
        self._status = status
        self._working = working
        self._queued = queued
        self._context_window = context_window
        self._pastes = Pastes()
        self._spinner = Spinner("dots")
        self._on_interrupt = on_interrupt
        self._on_shift_tab = on_shift_tab
        self._questions: list[_Question] = []
        self._lines: asyncio.Queue[Line | None] = asyncio.Queue()
        self._stashed: str | None = None
        self._follow_up_next = False
        self._leave_armed = False
        self._done = False
        store: History = InMemoryHistory()
        if history is not None:
            with contextlib.suppress(OSError):
                history.parent.mkdir(parents=True, exist_ok=True)
                store = FileHistory(str(history))
        self._session: PromptSession[str] = PromptSession(
            history=store, key_bindings=self._bindings(), erase_when_done=True, style=STYLE,
            bottom_toolbar=self._toolbar, enable_suspend=True,
            completer=WordCompleter(list(commands or {}), meta_dict=dict(commands or {}), sentence=True),
            complete_while_typing=False,
        )
        screen.on_live_change = self.invalidate
        # A resize redraws the prompt: the transcript above it is printed again first if the width changed.
        self._session.app.before_render.add_handler(lambda app: screen.fit())

    # -- what the chat calls ----------------------------------------------------------------------

    async def run(self) -> None:
        """Prompt until `leave()`; every submitted line is routed (see the module docstring)."""
        ticking = asyncio.create_task(self._tick())
        try:
            while not self._done:
                try:
                    text = await self._session.prompt_async(
                        self._message, handle_sigint=False, set_exception_handler=False,
                        default=self._take_stash())
                except (EOFError, KeyboardInterrupt):
                    self.leave()
                    break
                if self._done:
                    break
                follow_up, self._follow_up_next = self._follow_up_next, False
                self._route(Line(text, follow_up))
        finally:
            ticking.cancel()
        self._screen.drain()

    async def _tick(self) -> None:
        """Redraw the working line while a turn runs, so its spinner turns and its time counts."""
        while True:
            await asyncio.sleep(WORKING_TICK_S)
            if self._busy() and not self._questions:
                self.invalidate()

    async def read(self) -> Line | None:
        """The next line for the chat; None when the person leaves."""
        return await self._lines.get()

    async def ask(self, prompt: str, hint: str = "", *, keys: str = "") -> str | None:
        """Ask a question on the prompt and return the answer, or None if Ctrl-C cancelled it or
        the chat is leaving. With `keys` (lower-case letters), a press of one of them is the
        answer at once (returned lower-case) and other keys are ignored; without, the answer is
        a line ended by Enter. What the person had typed is kept and given back afterwards.
        Cancelling the call dismisses the question (it was answered elsewhere)."""
        if self._done:
            return None
        answer: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        if not self._questions:
            buffer = self._session.default_buffer
            if buffer.text and self._session.app.is_running:
                self._stashed = buffer.text
                buffer.reset()
        question = _Question(prompt, hint, answer, keys)
        self._questions.append(question)
        self.invalidate()
        try:
            return await answer
        finally:
            if question in self._questions:  # dismissed, not answered here
                self._questions.remove(question)
                self.invalidate()
            if not self._questions and self._stashed is not None and self._session.app.is_running:
                self._session.default_buffer.insert_text(self._take_stash())

    def give_back(self, text: str) -> None:
        """Put `text` back on the input line, before anything typed since (a refused prompt is not
        lost); during a question it waits until the question is answered. Pasted text shows as
        its placeholder again."""
        text = self._pastes.collapse(text)
        buffer = self._session.default_buffer
        if self._questions or not self._session.app.is_running:
            self._stashed = text + (self._stashed or "")
            return
        buffer.document = Document(text + buffer.text, cursor_position=len(text) + buffer.cursor_position)
        self.invalidate()

    def leave(self) -> None:
        """Stop prompting: open questions get None, `read()` gets None."""
        if self._done:
            return
        self._done = True
        for question in self._questions:
            if not question.answer.done():
                question.answer.set_result(None)
        self._questions.clear()
        self._lines.put_nowait(None)
        app = self._session.app
        if app.is_running and not app.is_done:
            app.exit(result="")

    def interrupt(self) -> None:
        """What Ctrl-C does (also when it arrives as SIGINT, between prompts)."""
        if self._questions:
            question = self._questions.pop(0)
            if not question.answer.done():
                question.answer.set_result(None)
            self._screen.print(f"[dim]{escape(question.prompt)}^C[/]")
            if self._busy():
                self._on_interrupt()
            self.invalidate()
        elif self._busy():
            self._on_interrupt()
        elif self._session.default_buffer.text and self._session.app.is_running:
            self._session.default_buffer.reset()
        elif self._leave_armed:
            self.leave()
        else:
            self._leave_armed = True
            self._screen.print("[dim](Ctrl-C again or Ctrl-D to leave)[/]")
        self.invalidate()

    def echo(self, text: str, *, note: str = "") -> None:
        """Print a sent line as typed (a paste as its placeholder), with `note` dimmed after it."""
        after = f" [dim]({escape(note)})[/]" if note else ""
        self._screen.print(f"[bold]› [/]{escape(self._pastes.collapse(text))}{after}")

    def invalidate(self) -> None:
        """Redraw the prompt (its message, live line and status line may have changed)."""
        self._session.app.invalidate()

    # -- the prompt -------------------------------------------------------------------------------

    def _label(self) -> StyleAndTextTuples:
        if self._questions:
            return [("class:question", self._questions[0].prompt)]
        if self._busy():
            return [("class:busy", "steer› ")]
        return [("class:prompt", "› ")]

    def _message(self) -> StyleAndTextTuples:
        return [*self._screen.live(), *self._queued_lines(), *self._working_line(), *self._label()]

    def _queued_lines(self) -> StyleAndTextTuples:
        """The lines waiting for the model to read them, one screen line each."""
        if not self._busy():
            return []
        columns = max(20, self._session.app.output.get_size().columns - 1)
        return [("class:queued", clip(line, columns) + "\n") for line in self._queued()]

    def _working_line(self) -> StyleAndTextTuples:
        """The spinner and what the turn is doing, on a line of its own; nothing when idle or
        while a question waits (the question is what the turn waits for)."""
        if not self._busy() or self._questions:
            return []
        frames = self._spinner.frames
        frame = frames[int(time.monotonic() * 1000 / self._spinner.interval) % len(frames)]
        columns = self._session.app.output.get_size().columns
        return [("class:working", f"{frame} {self._working(max(20, columns - 1) - 2)}\n")]

    def _toolbar(self) -> StyleAndTextTuples:
        """A question's hint, wrapped (all of it is needed to answer); else the status line, on
        one line whatever the width."""
        width = max(20, self._session.app.output.get_size().columns - 1)
        if self._questions:
            return [("class:bottom-toolbar", "\n".join(textwrap.wrap(self._questions[0].hint, width)))]
        return [("class:bottom-toolbar", fit_status(self._status(), width))]

    def _take_stash(self) -> str:
        text, self._stashed = self._stashed or "", None
        return text

    def _paste(self, data: str) -> None:
        """Insert a paste at the cursor: as it is when it is one line, else as its placeholder,
        with a warning when it would take much of the context window."""
        buffer = self._session.default_buffer
        if "\n" not in data.replace("\r", "\n").rstrip("\n"):
            buffer.insert_text(data.replace("\r", "").replace("\n", ""))
            return
        placeholder, share = self._pastes.add(data, window := self._context_window())
        buffer.insert_text(placeholder)
        if share is not None and share > PASTE_WARN_SHARE:
            self._screen.print(f"[yellow]this paste is {share:.0%} of the {window:,}-token window; sending it may "
                               "compact the chat[/]")

    def _route(self, line: Line) -> None:
        """Answer the oldest question with `line`, or queue it for `read()`, its pastes put back
        either way; echo it as typed (the prompt erased itself), except a message typed during a
        turn: it shows as queued until the chat prints it where the model reads it (one row)."""
        if self._questions:
            question = self._questions.pop(0)
            self._screen.print(f"[yellow]{escape(question.prompt)}[/]{escape(line.text)}")
            if not question.answer.done():
                question.answer.set_result(self._pastes.expand(line.text))
            return
        self._leave_armed = False
        text = line.text.strip()
        if text and not (self._busy() and not text.startswith(("/", "!"))):
            self.echo(line.text)
        self._lines.put_nowait(Line(self._pastes.expand(line.text), line.follow_up))

    def _bindings(self) -> KeyBindings:
        bindings = KeyBindings()
        empty = Condition(lambda: not self._session.default_buffer.text)
        turn = Condition(lambda: self._busy() and not self._questions)

        @bindings.add("c-c", eager=True)
        def _(event: KeyPressEvent) -> None:
            self.interrupt()

        @bindings.add("s-tab", filter=Condition(lambda: self._on_shift_tab is not None and not self._questions))
        def _(event: KeyPressEvent) -> None:
            if self._on_shift_tab is not None:
                self._on_shift_tab()

        @bindings.add("c-d", filter=empty, eager=True)
        def _(event: KeyPressEvent) -> None:
            if self._busy() and not self._questions:
                self._screen.print("[dim]a turn is running: Ctrl-C aborts it, Ctrl-C twice leaves at once[/]")
            elif self._questions:
                self.interrupt()
            else:
                self.leave()

        choosing = Condition(lambda: bool(self._questions) and bool(self._questions[0].keys))

        @bindings.add("<any>", filter=choosing)
        def _(event: KeyPressEvent) -> None:
            key, question = event.data.lower(), self._questions[0]
            if len(key) == 1 and key in question.keys:
                self._questions.pop(0)
                self._screen.print(f"[yellow]{escape(question.prompt)}[/]{escape(key)}")
                if not question.answer.done():
                    question.answer.set_result(key)
                self.invalidate()

        @bindings.add(Keys.BracketedPaste, filter=~choosing)
        def _(event: KeyPressEvent) -> None:
            self._paste(event.data)

        @bindings.add("escape", "enter", filter=turn, eager=True)
        def _(event: KeyPressEvent) -> None:
            self._follow_up_next = True
            event.current_buffer.validate_and_handle()

        @bindings.add("escape", "enter", filter=~turn, eager=True)
        def _(event: KeyPressEvent) -> None:
            event.current_buffer.insert_text("\n")

        return bindings
