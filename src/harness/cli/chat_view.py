"""What `harness chat` shows: the screen (rows printed above the prompt, and the reply's unfinished
line drawn live in the prompt area) and the view that turns harness events into rows.

Rows are chosen by event type from `ChatView.rows`, a table of `RowRenderer`s: a new kind of row
is one more entry in the table, not a change here. An event type with no entry renders nothing.
The view takes the conversation's live stream (`conversation_events`): a chat-event row is drawn
from its `ChatEventPublished`, worded by `chat_rows`, never from the text the model reads.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from prompt_toolkit.application import get_app_or_none
from prompt_toolkit.formatted_text import ANSI, StyleAndTextTuples, to_formatted_text
from rich.console import Console, RenderableType
from rich.padding import Padding

from harness.cli.chat_rows import chat_row, delegation_row, garden_row
from harness.cli.terminal_text import escape, markdown
from harness.context import Context
from harness.conversation import (
    CHAT_EVENT_TYPE,
    MAIN_LANE,
    MESSAGE_BLOCKS_TYPE,
    SUBAGENT_RESULT_TYPE,
    ChatEventPublished,
    DelegationFinished,
    ErrorDetails,
    conversation_events,
    delegation_rows,
    spent,
)
from harness.conversation.garden_messages import garden_message_of
from harness.conversation.service import chat_event_rows
from harness.messages import (
    AssistantMessage,
    CustomMessage,
    ImageContent,
    ModelIdentity,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserContent,
    UserMessage,
    text_of,
)
from harness.runtime import (
    CompactionEnd,
    CompactionStart,
    ConfigUpdate,
    Fault,
    HandlerError,
    HarnessEvent,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    NavigationEnd,
    OperationAbort,
    Queues,
    QueueUpdate,
    RetryScheduled,
    RunEnd,
    RunStart,
    RunSuspend,
    ToolEnd,
    ToolStart,
    UsageRecorded,
)
from harness.runtime.events import event_lane
from harness.runtime.outcomes import INTERRUPTED_REPLY
from harness.session import Entry, LaneLastResult, SessionReader, UsageRow
from harness.tools.approval import describe_call

ROW_LIMIT = 160
"""Characters of a tool result or queued message shown on its one-line row."""


def clip(text: str, limit: int = ROW_LIMIT) -> str:
    """`text` on one line, whitespace collapsed, at most `limit` characters."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def content_text(content: str | list[UserContent]) -> str:
    if isinstance(content, str):
        return content
    return " ".join(b.text if isinstance(b, TextContent) else f"[image {b.mime_type}]"
                    for b in content if isinstance(b, TextContent | ImageContent))


# -- the screen -------------------------------------------------------------------------------------


class Screen:
    """Rows printed above the prompt, in order, and the live line of a streaming reply.

    While a prompt is on screen, it is erased, the row written and the prompt drawn again below
    it; otherwise rows go straight to `out`. Rows wrap at word breaks to the terminal's width.
    A streaming reply is printed line by line as lines complete; its unfinished last line is
    drawn as part of the prompt (`live`), because text written after the prompt would be drawn
    over. `on_live_change` is called when that line changes (the terminal redraws the prompt).

    A row printed while a block streams (a notice from the prompt side: a command's answer, an
    error) would land inside the reply, mid-sentence: it is held, shown under the live line, and
    printed once the block ends (`end_stream`), so a reply reads whole (issue 33: one row per event).

    A block streamed with `markdown` is rendered as Markdown a piece at a time as it completes:
    each line on its own (headings, list items, emphasis, inline code), a fenced code block
    whole once its closing fence arrives, highlighted. Rows once printed are not redrawn as more
    arrives, so this keeps the reply appearing as it streams while still rendering it.

    Everything printed is kept as what renders it again (a streamed paragraph as one line, though
    it was printed a screen line at a time), so that when the terminal's width changes the
    transcript is printed again at the new width (`fit`) instead of left as the terminal cut or
    reflowed it."""

    def __init__(self, out: TextIO, *, color: bool) -> None:
        self._out = out
        self._console = Console(file=io.StringIO(), force_terminal=color, no_color=not color, highlight=False,
                                emoji=False)
        self._printed: list[Callable[[], str]] = []  # each renders one row, or paragraph, at the width of now
        self._paragraph: list[str] = []  # the screen lines printed so far of a streamed paragraph
        self._columns = self.columns()  # the width everything on screen was printed at
        self._live_key: object = None
        self._live_text = ""
        self._live_style = ""
        self._live_markdown = False
        self._fence: list[str] | None = None  # the lines of an open fenced code block
        self._held: list[Callable[[], str]] = []  # rows printed while a block streams, printed when it ends
        self.on_live_change: Callable[[], None] = lambda: None

    # -- rows -------------------------------------------------------------------------------------

    def print(self, text: RenderableType = "", *, style: str | None = None, soft_wrap: bool = False) -> None:
        """Print one row of rich markup, or a rich renderable (pass outside text through
        `terminal_text.escape`, or `visible` for a renderable). While a block streams, the row
        waits under its live line until the block ends. With `soft_wrap` the terminal wraps the
        row, not rich: no line break is written into it, so a command in it copies whole."""
        self.fit()

        def render() -> str:
            return self._render(text, style=style, soft_wrap=soft_wrap)

        if self._live_key is not None:
            self._held.append(render)
            self.on_live_change()
            return
        self._emit(render)

    def columns(self) -> int:
        """The terminal's width in characters, asked of the terminal itself: `COLUMNS`, which a
        shell sets once, is stale after a resize. `COLUMNS` (else 80) when `out` is no terminal."""
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            if (columns := os.get_terminal_size(self._out.fileno()).columns) > 0:
                return columns
        return shutil.get_terminal_size().columns

    def fit(self) -> None:
        """When the terminal's width changed since the last row was printed: clear the screen and
        its scrollback and print everything again at the new width, then let the prompt draw
        itself anew below. A terminal that reflows on a resize splits words and repeats the
        prompt's lines; one that cuts loses text. Called before each row and each draw of the
        prompt (`chat_input.Terminal`)."""
        if (columns := self.columns()) == self._columns or not self._out.isatty():
            return
        self._columns = columns
        self._out.write(_CLEAR_ALL + "".join(render() for render in self._printed))
        self._out.flush()
        app = get_app_or_none()
        if app is not None and app.is_running:
            # What it drew is gone: it draws the whole prompt again, from where the cursor is now.
            app.renderer.reset(leave_alternate_screen=False)
            app.renderer.request_absolute_cursor_position()

    def _render(self, renderable: RenderableType, *, style: str | None = None, soft_wrap: bool = False) -> str:
        self._console.width = max(20, self._columns)
        with self._console.capture() as captured:
            self._console.print(renderable, style=style, soft_wrap=soft_wrap)
        return _TRAILING_SPACE.sub(r"\1", captured.get())  # rich pads Markdown to the width

    def _emit(self, render: Callable[[], str]) -> None:
        """Print a new row, kept as `render` to print it again at another width."""
        self._printed.append(render)
        self._write(render())

    def _write(self, text: str) -> None:
        app = get_app_or_none()
        on_screen = app is not None and app.is_running and not app.is_done
        if on_screen and app is not None:
            # Not `run_in_terminal`: it puts the terminal in cooked mode while it writes, and a
            # Ctrl-D typed in that moment is eaten by the tty driver. Erase the prompt, write,
            # and let the prompt redraw itself below, keys still read in raw mode throughout.
            app.renderer.erase()
        self._out.write(text)
        self._out.flush()
        if on_screen and app is not None:
            app.renderer.request_absolute_cursor_position()
            app.invalidate()

    def drain(self) -> None:
        """Print the streaming block's unfinished line, if any, and the rows held under it (`end_stream`)."""
        self.end_stream()

    # -- the streaming line -----------------------------------------------------------------------

    def stream(self, key: object, text: str, *, style: str = "", markdown: bool = False) -> None:
        """Add `text` to the streaming block `key` (a new key ends the previous block's line):
        complete lines are printed, the unfinished one is shown live."""
        self.fit()
        if key != self._live_key:
            self._commit_live()
            self._live_key, self._live_style, self._live_markdown = key, style, markdown
        self._live_text += text
        if "\n" in self._live_text:
            done, self._live_text = self._live_text.rsplit("\n", 1)
            for line in done.split("\n"):
                self._line(line.removesuffix("\r"))
        # A paragraph longer than the terminal is printed a screen line at a time, at a word
        # break, so it keeps appearing as it streams (the live line is one screen line).
        width = max(20, self._columns - 1)
        while len(self._live_text) > width and self._fence is None:
            cut = self._live_text.rfind(" ", 0, width + 1)
            glue = " " if cut > 0 else ""
            cut = cut + 1 if cut > 0 else width
            line, self._live_text = self._live_text[:cut], self._live_text[cut:]
            self._line(line.rstrip(" "), glue=glue)
        self.on_live_change()

    def _line(self, line: str, *, glue: str | None = None) -> None:
        """Print one complete line of the streaming block (as Markdown, for a Markdown block); with
        `glue`, one screen line of a longer one, whose rest follows after `glue` (what the cut took)."""
        if glue is not None or self._paragraph:
            self._paragraph.append(line + (glue or ""))
            whole = self._line_render("".join(self._paragraph))
            if len(self._paragraph) == 1:
                self._printed.append(whole)
            else:
                self._printed[-1] = whole  # its record: nothing is printed between a paragraph's lines
            if glue is None:
                self._paragraph = []
            self._write(self._line_render(line)())
            return
        fence = _FENCE.match(line) if self._live_markdown else None
        if self._fence is not None:
            self._fence.append(line)
            if fence is not None and fence.group(1)[0] == self._fence[0].lstrip()[0] and not fence.group(2).strip():
                self._end_fence()
        elif fence is not None:
            self._fence = [line]
        else:
            self._emit(self._line_render(line))

    def _line_render(self, line: str) -> Callable[[], str]:
        """What prints `line`, one line of the streaming block outside a code block, at the width of now."""
        style = self._live_style or None
        if not self._live_markdown:
            return lambda: self._render(escape(line), style=style)
        if not line.strip():
            return lambda: "\n"
        # One line is rendered alone: its own indentation kept as padding (four spaces would make
        # it a code block), the blank lines and padding rich puts around blocks left out.
        text = line.lstrip(" ")
        return lambda: self._render(Padding(markdown(text), (0, 0, 0, len(line) - len(text)))).lstrip("\n")

    def _end_fence(self) -> None:
        if self._fence is not None:
            block, self._fence = markdown("\n".join(self._fence)), None
            self._emit(lambda: self._render(block))

    def end_stream(self) -> None:
        """Print the streaming block's unfinished line, if any, and forget the block; then the
        rows printed while it streamed."""
        self._commit_live()
        self._live_key = None
        held, self._held = self._held, []
        for render in held:
            self._emit(render)
        if held:
            self.on_live_change()

    def _commit_live(self) -> None:
        if self._live_text:
            text, self._live_text = self._live_text, ""
            self._line(text)
            self.on_live_change()
        self._end_fence()

    def live(self) -> StyleAndTextTuples:
        """The unfinished streaming line, then the rows held until the block ends, as
        prompt_toolkit text, each with its line break; empty when there are none."""
        text = self._render(escape(self._live_text), style=self._live_style or None) if self._live_text else ""
        text += "".join(render() for render in self._held)
        return to_formatted_text(ANSI(text)) if text else []


_CLEAR_ALL = "\x1b[H\x1b[2J\x1b[3J"
"""To the top left, clear the screen, clear the scrollback (xterm's `E3`, which most terminals know)."""
_TRAILING_SPACE = re.compile(r" +((?:\x1b\[[0-9;]*m)*)$", re.MULTILINE)
_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})(.*)$")
"""A Markdown code fence line: its marker and what follows it (a language, or nothing on a closing fence)."""


# -- the status line --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusPart:
    """One part of the status line under the prompt. When the line is wider than the terminal,
    parts are shortened to their `short` form, the highest `drop` first, then left out in the
    same order (see `fit_status`)."""

    text: str
    drop: int = 0
    short: str | None = None


def fit_status(parts: Sequence[StatusPart], columns: int) -> str:
    """`parts` joined with ` · `, in order, on one line of at most `columns` characters: the
    parts are shortened, the highest `drop` first, then left out in that order until the line
    fits; the one kept longest is clipped if it still does not."""
    shown = {at: part.text for at, part in enumerate(parts) if part.text}
    order = sorted(shown, key=lambda at: (parts[at].drop, at), reverse=True)

    def line() -> str:
        return " · ".join(shown[at] for at in sorted(shown))

    for at in order:
        if len(line()) <= columns:
            break
        shown[at] = parts[at].short or shown[at]
    for at in order[:-1]:
        if len(line()) <= columns:
            break
        del shown[at]
    return clip(line(), columns)


# -- the usage meter --------------------------------------------------------------------------------


@dataclass
class UsageMeter:
    """What the session has spent, and how much of the model's context window the last request
    used: the toolbar's `tokens · cost · last request` part. The totals are counted from the usage
    ledger at attachment, then from each `usage` event; the last request from the latest reply on
    the branch at attachment, then from each reply that ends."""

    tokens: int = 0
    cost: float = 0.0
    context_tokens: int | None = None
    """What the last request sent, in tokens: the input and cached tokens of the latest reply's
    usage. None before any reply, and after a compaction or a move of the branch until the next
    reply says again; a reply whose provider reported no usage (one cut off) leaves it as it was."""

    @classmethod
    def of(cls, rows: Sequence[UsageRow], last_reply: AssistantMessage | None = None) -> UsageMeter:
        """The meter after the ledger `rows` (adjustments included), with the last request read
        from `last_reply`."""
        meter = cls()
        for usage_row in rows:
            meter.add(usage_row.usage)
        if last_reply is not None:
            meter.reply(last_reply)
        return meter

    @classmethod
    async def read(cls, session: SessionReader, tip: str | None, context: Context) -> UsageMeter:
        """The meter after what `session` has spent (`spent`, its whole usage ledger summed), and
        the newest reply on the branch ending at `tip` since its newest compaction."""
        meter = cls()
        meter.add(await spent(session, context))
        replies: list[AssistantMessage] = []

        def visit(entry: Entry) -> bool:
            payload = entry.payload
            if payload.type == "message" and isinstance(payload.message, AssistantMessage) and _sent(
                    payload.message.usage):
                replies.append(payload.message)
                return False
            return True

        if tip is not None:
            await session.scan_branch(tip, visit, context)
        if replies:
            meter.reply(replies[0])
        return meter

    def add(self, usage: Usage) -> None:
        """Count `usage` in the totals."""
        self.tokens += usage.total_tokens
        self.cost += usage.cost.total

    def reply(self, message: AssistantMessage) -> None:
        """A reply ended: its request is the last request, when its provider reported usage."""
        if sent := _sent(message.usage):
            self.context_tokens = sent

    def parts(self, context_window: int | None) -> list[StatusPart]:
        """The status line's usage: e.g. `1,234 tokens`, `$0.0123` and `last request: 12% of the
        128,000-token context window` (short: `12% of the window`), the last only when both the
        window and a reply's usage are known; the share of the window is kept longest, and what was
        spent outlasts the keys the status line shows beside it (/help lists those), so it does
        not come and go as other parts grow or shrink."""
        parts = [StatusPart(f"{self.tokens:,} tokens", drop=3), StatusPart(f"${self.cost:.4f}", drop=3)]
        if context_window and self.context_tokens is not None:
            share = 100 * self.context_tokens / context_window
            parts.append(StatusPart(f"last request: {share:.0f}% of the {context_window:,}-token context window",
                                    drop=1, short=f"{share:.0f}% of the window"))
        return parts


def _sent(usage: Usage) -> int:
    """The tokens a request sent, from its reply's usage: the input, cached or not."""
    return usage.input + usage.cache_read + usage.cache_write


# -- the view ---------------------------------------------------------------------------------------

RowRenderer = Callable[["ChatView", Any], None]
"""Shows one event (of the type it is registered for) on the view's screen."""

DEFAULT_ROWS: dict[str, RowRenderer] = {}


def row(*event_types: str) -> Callable[[RowRenderer], RowRenderer]:
    """Register a row renderer for `event_types` in `DEFAULT_ROWS`."""

    def register(render: RowRenderer) -> RowRenderer:
        for event_type in event_types:
            DEFAULT_ROWS[event_type] = render
        return render

    return register


@dataclass
class ChatView:
    """A harness listener drawing one lane's events, as the conversation's live stream types
    them, as rows on `screen`.

    `rows` maps an event type to its renderer (a copy of `DEFAULT_ROWS`; add or replace entries
    to show more). `queued` names the entry ids of queued steer and follow-up messages (from
    any client), so their placement is shown; the typed prompt is not echoed twice.
    `running_tools`, `queues`, `aborting` and `meter` feed the prompt's status line."""

    screen: Screen
    lane: str
    rows: dict[str, RowRenderer] = field(default_factory=lambda: dict(DEFAULT_ROWS))
    queued: dict[str, str] = field(default_factory=dict)
    running_tools: dict[str, str] = field(default_factory=dict)
    queues: Queues = field(default_factory=Queues)
    aborting: bool = False
    meter: UsageMeter = field(default_factory=UsageMeter)
    show_thinking: bool = True  # `/think` collapses thinking to one line per block, or expands it
    calls: dict[str, ToolCall] = field(default_factory=dict)
    """The tool calls of this chat's replies by id, so a call refused before it ran still shows its row."""
    _shown: dict[int, int] = field(default_factory=dict, init=False)  # content index -> characters shown
    _run_started: float = field(default=0.0, init=False)
    _run_tokens: int = field(default=0, init=False)
    _cut_off_text: bool = field(default=False, init=False)  # the reply a crash interrupted had content
    _writing: str | None = field(default=None, init=False)  # what the streaming reply's newest block is
    _compacting: bool = field(default=False, init=False)
    _retry_at: float | None = field(default=None, init=False)  # when a scheduled retry is sent (epoch s)
    _run_id: str | None = field(default=None, init=False)  # the latest run (not compaction) started here
    _error_shown: bool = field(default=False, init=False)  # the running operation's `error` row is shown

    def __call__(self, event: HarnessEvent, context: Context) -> None:
        lane = event_lane(event)
        if lane is not None and lane != self.lane:
            return
        for typed in conversation_events(event):
            render = self.rows.get(typed.type)
            if render is not None:
                render(self, typed)

    def begin_run(self) -> None:
        """A run starts (or resumes) here: its time and tokens are counted from now."""
        self._run_started, self._run_tokens, self.aborting = time.monotonic(), 0, False
        self._writing, self._compacting, self._retry_at = None, False, None
        self._error_shown = False

    def working(self, columns: int) -> str:
        """What the lane is doing now and for how long the operation has run, in at most
        `columns` characters (what it is doing is clipped, the time kept), for the line under the
        reply while a turn runs: e.g. `waiting for the model · 4 s`, `running shell: make ·
        1 m 05 s`. The phases: waiting for the model (nothing of its reply yet), thinking,
        replying, writing a tool call, running tools, compacting the context, waiting to retry,
        aborting."""
        if self.aborting:
            doing = "aborting"
        elif self.running_tools:
            doing = "running " + ", ".join(self.running_tools.values())
        elif self._compacting:
            doing = "compacting the context"
        elif self._retry_at is not None and (wait := self._retry_at - time.time()) > 0:
            doing = f"retrying in {wait:.0f} s"
        else:
            doing = self._writing or "waiting for the model"
        elapsed = int(time.monotonic() - self._run_started) if self._run_started else 0
        took = f"{elapsed // 60} m {elapsed % 60:02d} s" if elapsed >= 60 else f"{elapsed} s"
        return f"{clip(doing, max(1, columns - len(took) - 3))} · {took}"

    # -- the streaming reply ----------------------------------------------------------------------

    def begin_reply(self) -> None:
        self.screen.end_stream()
        self._shown = {}
        self._writing, self._retry_at = None, None

    def stream_reply(self, message: AssistantMessage) -> None:
        """Show what `message` has beyond what was shown of it: text as Markdown, thinking dimmed.
        Once an abort is under way nothing more is shown: the abort rows are the last word."""
        if self.aborting:
            return
        if message.content:
            self._writing = _writing(message.content[-1])
        for index, block in enumerate(message.content):
            shown = self._shown.get(index, 0)
            if isinstance(block, TextContent) and len(block.text) > shown:
                self.screen.stream(("reply", index), block.text[shown:], markdown=True)
                self._shown[index] = len(block.text)
            elif isinstance(block, ThinkingContent):
                text = "[thinking redacted]\n" if block.redacted else block.thinking
                if not self.show_thinking:
                    if shown == 0 and text:  # collapsed: one line, once, however long it gets
                        self.screen.stream(("thinking", index), "(thinking… /think shows it)\n", style="dim")
                        self._shown[index] = 1
                elif len(text) > shown:
                    self.screen.stream(("thinking", index), text[shown:], style="dim")
                    self._shown[index] = len(text)

    def end_reply(self, message: AssistantMessage) -> None:
        self.stream_reply(message)
        self.meter.reply(message)
        self.calls.update((block.id, block) for block in message.content if isinstance(block, ToolCall))
        self.screen.end_stream()
        self._shown, self._writing = {}, None
        # A stopped or failed reply has no row of its own: the run's `interrupted` or `error` row
        # says so, or the retry row when the reply is asked again.
        if message.stop_reason == "error" and message.error_message == INTERRUPTED_REPLY:
            self._cut_off_text = _says_something(message)  # not a failure: the retry row says what follows
        elif message.stop_reason == "length":
            self.screen.print("[yellow](reply cut off at the output limit)[/]")

    def outcome_row(self, result: LaneLastResult) -> None:
        """The row saying how an operation settled: completed (with time and tokens), aborted, failed.
        A run's why (its abort cause, its error's text) is its `interrupted` or `error` row, shown
        before this one (CE-7, CE-9); a compaction or navigation has no such row, so it is said here.
        An aborted run has no outcome row: its `interrupted` row, or the row saying it was
        discarded before any output, is the one row of the abort; likewise a failed run's `error`
        row, with the provider's or the runtime's text, is the one row of the failure (issue 33,
        item 6: one row per event), unless it was not shown here."""
        run = result.kind == "run"
        what = "turn" if run else result.kind
        elapsed = time.monotonic() - self._run_started if self._run_started else 0.0
        tokens = f", {self._run_tokens} tokens" if self._run_tokens else ""
        if result.outcome == "completed":
            self.screen.print(f"[dim]✓ {what} completed ({elapsed:.1f} s{tokens})[/]")
        elif result.outcome == "aborted":
            if not run:
                self.screen.print(f"[yellow]✗ {what} aborted ({result.abort_cause or 'unknown cause'})[/]")
        elif not (run and self._error_shown):
            error = result.error
            detail = "" if error is None else f" [{error.code}]" if run else f" [{error.code}]: {error.message}"
            self.screen.print(f"[red]✗ {what} failed{escape(detail)}[/]")

    # -- the prompt's status line -----------------------------------------------------------------

    def waiting(self) -> list[str]:
        """The messages queued on the lane, from any client, one line each for the prompt area
        until the run reads them (their `sent` row is then their one row in the transcript), e.g.
        `steer queued (read after the current step): make it shorter`."""
        lines = []
        for kind, items in (("steer", self.queues.steer), ("follow-up", self.queues.follow_up)):
            when = "after the current step" if kind == "steer" else "when the run would end"
            for item in items:
                text = content_text(item.message.content) if isinstance(item.message, UserMessage) else ""
                lines.append(f"{kind} queued (read {when}): {clip(text)}")
        return lines

    def status(self) -> list[StatusPart]:
        """The messages queued on the lane, for the status line (what it is doing is `working`)."""
        parts = []
        if self.queues.steer:
            parts.append(StatusPart(f"{len(self.queues.steer)} steer queued"))
        if self.queues.follow_up:
            parts.append(StatusPart(f"{len(self.queues.follow_up)} follow-up queued"))
        return parts


@row("run_start")
def _run_start(view: ChatView, event: RunStart) -> None:
    if event.kind == "run":
        view._run_id = event.operation_id
    view.begin_run()
    view._compacting = event.kind == "compaction"


@row("message_start", "message_update")
def _message_progress(view: ChatView, event: MessageStart | MessageUpdate) -> None:
    message = event.message
    if isinstance(message, AssistantMessage):
        if event.type == "message_start":
            view.begin_reply()
        view.stream_reply(message)


@row("message_end")
def _message_end(view: ChatView, event: MessageEnd) -> None:
    message = event.message
    if isinstance(message, AssistantMessage):
        view.end_reply(message)
    elif isinstance(message, UserMessage) and event.entry_id in view.queued:
        kind = view.queued.pop(event.entry_id)
        view.screen.print(f"[cyan]› {escape(clip(content_text(message.content)))}[/] [dim]({kind} sent)[/]")
    elif (garden := garden_message_of(message)) is not None:
        view.screen.print(garden_row(garden))
    elif isinstance(message, CustomMessage) and message.display and message.custom_type != CHAT_EVENT_TYPE:
        # A chat event's text is the model's; its row is drawn from its details (`chat_event`).
        text = escape(clip(content_text(message.content)))
        view.screen.print(f"[yellow]\\[{escape(message.custom_type)}][/] {text}")


@row("tool_start")
def _tool_start(view: ChatView, event: ToolStart) -> None:
    view.screen.end_stream()
    args = event.args if isinstance(event.args, dict) else {}
    summary = describe_call(event.tool_name, args)
    view.running_tools[event.tool_call_id] = summary
    view.calls.pop(event.tool_call_id, None)
    view.screen.print(f"[magenta]→ {escape(summary)}[/]")


@row("tool_end")
def _tool_end(view: ChatView, event: ToolEnd) -> None:
    view.running_tools.pop(event.tool_call_id, None)
    refused = view.calls.pop(event.tool_call_id, None)  # still here: it never started
    if refused is not None:
        view.screen.print(f"[magenta]→ {escape(call_summary(refused))}[/]")
    result: ToolResultMessage = event.result
    mark = "[red]error[/]" if result.is_error else "[green]ok[/]"
    first = clip(content_text(result.content))
    view.screen.print(f"[magenta]← {escape(result.tool_name)}[/] {mark} [dim]{escape(first)}[/]")


@row("retry_scheduled")
def _retry_scheduled(view: ChatView, event: RetryScheduled) -> None:
    view.screen.end_stream()
    if event.error_message == INTERRUPTED_REPLY:
        what = ("that reply was cut off when the process stopped; asking again" if view._cut_off_text
                else "finishing the open turn")
        view.screen.print(f"[dim]↻ {what}[/]")
        return
    view._retry_at = event.not_before / 1000
    wait = max(0.0, (event.not_before - time.time() * 1000) / 1000)
    view.screen.print(f"[yellow]↻ retrying in {wait:.0f} s (attempt {event.attempt} of {event.max_attempts}): "
                      f"{escape(clip(event.error_message))}[/]")


@row("compaction_start")
def _compaction_start(view: ChatView, event: CompactionStart) -> None:
    view._compacting = True
    view.screen.end_stream()
    view.screen.print(f"[dim]compacting the context ({event.reason})…[/]")


@row("chat_event")
def _chat_event(view: ChatView, event: ChatEventPublished) -> None:
    view.screen.end_stream()
    if isinstance(event.row.details, ErrorDetails):
        view._error_shown = True
    view.screen.print(chat_row(event.row.details))


@row("delegation")
def _delegation(view: ChatView, event: DelegationFinished) -> None:
    view.screen.end_stream()
    view.screen.print(delegation_row(event.row.finish))


@row("compaction_end")
def _compaction_end(view: ChatView, event: CompactionEnd) -> None:
    view._compacting = False
    if event.status == "completed":
        view.meter.context_tokens = None  # the summary's usage is not the context's: the next reply says
    if event.reason == "manual" and event.status != "declined":
        return  # a /compact of this chat: its outcome row says how it ended (not why it did nothing)
    detail = f": {event.error.message}" if event.error is not None else ""
    colour = "dim" if event.status == "completed" else "yellow"
    view.screen.print(f"[{colour}]compaction {event.status}{escape(detail)}[/]")


@row("navigation_end")
def _navigation_end(view: ChatView, event: NavigationEnd) -> None:
    if event.operation_id == view._run_id:  # a run that moves the tip: stopped before any output (CE-7)
        view.meter.context_tokens = None
        view.screen.print("[dim]stopped before any reply: the turn is discarded, your message is back on the "
                          "input line[/]")
    elif event.status == "completed":
        view.meter.context_tokens = None
        view.screen.print(f"[dim]moved to entry {escape(event.tip_id or '(the empty branch)')}[/]")
    else:
        view.screen.print(f"[yellow]navigation {event.status}[/]")


@row("operation_abort")
def _operation_abort(view: ChatView, event: OperationAbort) -> None:
    # No row: the status line says "aborting…" until the run settles, and its `interrupted` row
    # is then the abort's one row (the messages it did not send are listed with the outcome).
    view.aborting = True
    view.screen.end_stream()


@row("run_suspend")
def _run_suspend(view: ChatView, event: RunSuspend) -> None:
    view.screen.print("[yellow]the provider will answer later; /resume asks for the reply[/]")


@row("usage")
def _usage(view: ChatView, event: UsageRecorded) -> None:
    view._run_tokens += event.usage.total_tokens
    view.meter.add(event.usage)


@row("run_end")
def _run_end(view: ChatView, event: RunEnd) -> None:
    # The outcome row is the client's to print (`outcome_row`), once the prompt is idle again, so
    # a person who sees "completed" can type the next prompt at once.
    view.screen.end_stream()
    view.running_tools.clear()
    view.aborting = False


@row("queue_update")
def _queue_update(view: ChatView, event: QueueUpdate) -> None:
    view.queues = event.queues
    for kind, items in (("steer", event.queues.steer), ("follow-up", event.queues.follow_up)):
        for item in items:
            view.queued[item.entry_id] = kind


@row("config_update")
def _config_update(view: ChatView, event: ConfigUpdate) -> None:
    if event.lane == MAIN_LANE and event.field != "thinking_level":
        return  # the model and the tools of `main` change with a row that says so (CE-12, CE-13)
    value = event.value
    if isinstance(value, ModelIdentity):
        shown = value.spec
    elif isinstance(value, tuple):
        shown = ", ".join(value) or "(none)"
    else:
        shown = value
    view.screen.print(f"[dim]{event.field.replace('_', ' ')} → {escape(shown)}[/]")


@row("fault", "handler_error")
def _fault(view: ChatView, event: Fault | HandlerError) -> None:
    if event.type == "fault":
        view.screen.print(f"[red]harness fault \\[{escape(event.code)}]: {escape(event.message)}[/]")
    else:
        view.screen.print(f"[red]a display handler failed on {escape(event.event_type)}: {escape(event.error)}[/]")


def _writing(block: TextContent | ThinkingContent | ToolCall) -> str:
    """What a reply whose newest block is `block` is doing, for `ChatView.working`."""
    if isinstance(block, ThinkingContent):
        return "thinking"
    if isinstance(block, ToolCall):
        return f"writing a {block.name} call"
    return "replying"


def _says_something(message: AssistantMessage) -> bool:
    """Whether `message` holds any text, thinking or tool call (a reply cut off before its first
    token holds none)."""
    for block in message.content:
        if isinstance(block, TextContent):
            if block.text:
                return True
        elif not isinstance(block, ThinkingContent) or block.thinking or block.redacted:
            return True
    return False


# -- entries as one line ----------------------------------------------------------------------------


def call_summary(call: ToolCall) -> str:
    """One line for a tool call as the model sent it: its raw argument text when that was not a
    JSON object (so a refused call shows what was refused), else `describe_call`."""
    if call.raw_arguments is not None:
        return clip(f"{call.name} {call.raw_arguments}", 200)
    return describe_call(call.name, dict(call.arguments))


def entry_summary(entry: Entry, limit: int = 100) -> str:
    """One line of rich markup saying what an entry is, for `/tree` and `/fork` listings."""
    payload = entry.payload
    match payload.type:
        case "message":
            message = payload.message
            if isinstance(message, UserMessage):
                return f"[cyan]you[/]: {escape(clip(content_text(message.content), limit))}"
            if isinstance(message, ToolResultMessage):
                mark = "[red]error[/]" if message.is_error else "ok"
                return f"[magenta]← {escape(message.tool_name)}[/] {mark}"
            text = text_of(message.content, " ")
            calls = [b.name for b in message.content if isinstance(b, ToolCall)]
            shown = clip(text, limit) if text.strip() else ""
            if calls:
                shown += (" " if shown else "") + f"→ {', '.join(calls)}"
            return f"[green]assistant[/]: {escape(shown or '(' + message.stop_reason + ')')}"
        case "custom_message":
            if payload.message.custom_type == CHAT_EVENT_TYPE:
                return " ".join(chat_row(r.details).split("\n", 1)[0] for r in chat_event_rows([entry]))
            if (garden := garden_message_of(payload.message)) is not None:
                return garden_row(garden.model_copy(update={"text": clip(garden.text, limit)}))
            if payload.message.custom_type == SUBAGENT_RESULT_TYPE:
                return " ".join(delegation_row(r.finish) for r in delegation_rows([entry]))
            text = clip(content_text(payload.message.content), limit)
            return f"[yellow]\\[{escape(payload.message.custom_type)}][/] {escape(text)}"
        case "custom":
            if payload.custom_type == MESSAGE_BLOCKS_TYPE:  # a node of the branch; its cards are not drawn (CE-24)
                return "[dim](message blocks)[/]"
            data = clip(json.dumps(payload.data, ensure_ascii=False), limit)
            return f"[dim]({escape(payload.custom_type)}) {escape(data)}[/]"
        case "compaction":
            return f"[yellow]compaction[/] [dim]{escape(clip(payload.summary, limit))}[/]"
        case "branch_summary":
            return f"[yellow]branch summary[/] [dim]{escape(clip(payload.summary, limit))}[/]"
