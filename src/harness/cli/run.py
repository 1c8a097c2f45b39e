"""`harness run`: one non-interactive turn on a session lane, printed as it streams or as JSON lines.

Exit codes: `EXIT_COMPLETED` (0), `EXIT_FAILED` (1, also for errors before the run), 2 for a usage
error (typer's, e.g. a missing prompt or a bad option), `EXIT_SUSPENDED` (3: the provider will
answer later; the operation stays open), `EXIT_ABORTED` (4: the run was aborted, by Ctrl-C, by
another process's durable abort or by a spending cap, and settled). A second Ctrl-C leaves at once
with `EXIT_INTERRUPTED` (130, as a shell reports a process Ctrl-C ended), and the operation stays open
in the journal to be resumed (`--resume`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rich.console import Console

from harness.cli.config import attach_client, no_tools_note, process_tools
from harness.cli.render import entry_lines
from harness.cli.terminal_text import escape, visible
from harness.context import Context
from harness.conversation import (
    CHAT_EVENT_TYPE,
    GARDEN_MESSAGE_TYPE,
    SUBAGENT_RESULT_TYPE,
    Budget,
    Conversation,
    ErrorDetails,
)
from harness.conversation.service import chat_event_rows
from harness.errors import InvalidInput
from harness.messages import AssistantMessage, ModelIdentity, OutputSchema, ThinkingContent, text_of
from harness.providers import ModelRegistry
from harness.runtime import (
    CompactionEnd,
    CompactionStart,
    DriveOutcome,
    EntryAdded,
    Fault,
    HarnessEvent,
    LaneBusy,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    NoActiveOperation,
    NothingToResume,
    OperationAbort,
    RetryScheduled,
    RunEnd,
    Settled,
    Suspended,
    ToolEnd,
    ToolStart,
)
from harness.runtime.outcomes import INTERRUPTED_REPLY
from harness.runtime.output import check_output_schema, recorded_output
from harness.session import CustomMessagePayload, Entry, Store
from harness.tools import ApprovalPolicy, PermissionRules
from harness.tools.approval import describe_call

_ROW_TYPES = frozenset({CHAT_EVENT_TYPE, GARDEN_MESSAGE_TYPE, SUBAGENT_RESULT_TYPE})
"""The custom messages a run's output shows as rows, as the chat does."""

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_SUSPENDED = 3
EXIT_ABORTED = 4
EXIT_INTERRUPTED = 130

NO_APPROVER = ("nobody can approve it in a non-interactive `harness run` (run with --yes to allow write, edit "
               "and shell)")


@dataclass(frozen=True)
class RunTurn:
    """What one `harness run` asks for: `prompt` (None only with `resume`), sent after the lane's
    open operation is finished when `resume` is set."""

    prompt: str | None
    cwd: Path
    home: Path
    session_id: str | None = None
    lane: str = "main"
    model: ModelIdentity | None = None
    approve_all: bool = False
    json_events: bool = False
    tools: bool | None = None
    """A new lane's tools: None for the model's default (`offers_tools`), True or False to decide."""
    resume: bool = False
    rules: PermissionRules = field(default_factory=PermissionRules)
    """The permission rules of the settings files and the command line (`load_permission_rules`)."""
    output: OutputSchema | None = None
    """The shape the answer must take (`--output-schema`): stdout then holds only the validated
    answer's JSON, the reply's text going to stderr with the status lines (`read_output_schema`)."""
    budget: Budget = field(default_factory=Budget)
    """The run's spending caps (`--budget-tokens`, `--budget-usd`): reaching one stops it, aborted."""
    fallback: tuple[ModelIdentity, ...] = ()
    """The models that take a step over when the lane's model keeps failing (`--fallback`)."""


def read_output_schema(path: Path) -> OutputSchema:
    """The output schema in JSON Schema file `path`. Raises `InvalidInput` for a file that cannot
    be read or is not a JSON Schema."""
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(schema, dict):
            raise InvalidInput(f"the output schema {path} is not a JSON object", path=str(path))
        output = OutputSchema.of(schema)
    except (OSError, UnicodeDecodeError, ValueError) as error:  # pydantic's ValidationError is a ValueError
        raise InvalidInput(f"cannot read the output schema {path}: {error}", path=str(path)) from error
    check_output_schema(output)
    return output


# -- printing -------------------------------------------------------------------------------------


def event_json(event: HarnessEvent) -> str:
    """One event as the JSON line `--json` prints: `event.model_dump(mode="json")`, nothing added."""
    return json.dumps(event.model_dump(mode="json"), ensure_ascii=False)


def session_json(session_id: str, lane: str) -> str:
    """The first line `--json` prints: `{"type": "session", "session_id": ..., "lane": ...}`."""
    return json.dumps({"type": "session", "session_id": session_id, "lane": lane}, ensure_ascii=False)


@dataclass
class JsonEventPrinter:
    """A listener printing every event as one JSON line on `out`, flushed, so a reader can follow.

    The first line names the session (`session_json`): events that arrive before `begin` (while the
    session is opened) are held and printed after it."""

    out: TextIO
    _held: list[str] | None = field(default_factory=list)

    def begin(self, session_id: str, lane: str) -> None:
        held, self._held = self._held or [], None
        for line in [session_json(session_id, lane), *held]:
            self.out.write(line + "\n")
        self.out.flush()

    def __call__(self, event: HarnessEvent, context: Context) -> None:
        if self._held is not None:
            self._held.append(event_json(event))
            return
        self.out.write(event_json(event) + "\n")
        self.out.flush()


@dataclass
class TextPrinter:
    """A listener printing the reply text to `out` as it streams, and thinking, tool calls, retries,
    compactions and the outcome compactly to `status` (stderr), so `out` holds only the reply."""

    out: TextIO
    status: Console
    _text_shown: int = 0
    _thinking_shown: int = 0
    _ended_line: bool = True
    _thinking_open: bool = False
    _error_row: str | None = None

    def __call__(self, event: HarnessEvent, context: Context) -> None:
        match event:
            case MessageStart(message=AssistantMessage() as message):
                self._text_shown = self._thinking_shown = 0
                self._stream(message)
            case MessageUpdate(message=message):
                self._stream(message)
            case MessageEnd(message=AssistantMessage() as message) if _cut_off(message):
                # A reply a stopped process was streaming, settled by the resume: not part of the answer.
                self._end_line()
                if text_of(message.content):
                    self.status.print("[dim]the reply cut off when the earlier process stopped is discarded[/]")
            case MessageEnd(message=AssistantMessage() as message):
                # A failed reply's error is printed once, by the retry or the run's end that follows.
                self._stream(message)
                self._end_line()
            case ToolStart(tool_name=name, args=args):
                self._end_line()
                shown = describe_call(name, args if isinstance(args, dict) else {})
                self.status.print(f"[magenta]→ {escape(shown)}[/]")
            case ToolEnd(result=result):
                text = text_of(result.content, " ").strip()
                first = text.splitlines()[0] if text else ""
                first = first if len(first) <= 160 else first[:159] + "…"
                mark = "[red]error[/]" if result.is_error else "[green]ok[/]"
                self.status.print(f"[magenta]← {escape(result.tool_name)}[/] {mark} [dim]{escape(first)}[/]")
            case RetryScheduled(error_message=problem) if problem == INTERRUPTED_REPLY:
                self._end_line()
                self.status.print("[dim]resuming the run: asking the model again[/]")
            case RetryScheduled(attempt=attempt, max_attempts=most, error_message=problem):
                self._end_line()
                self.status.print(f"[yellow]retrying (attempt {attempt} of {most}): {escape(problem)}[/]")
            case CompactionStart(reason=reason):
                self._end_line()
                self.status.print(f"[dim]compacting the context ({reason})…[/]")
            case CompactionEnd(status=outcome, error=error):
                detail = f": {error.message}" if error is not None else ""
                self.status.print(f"[dim]compaction {outcome}{escape(detail)}[/]")
            case OperationAbort(cause=cause) if cause != "budget":  # a budget stop's row says it
                self._end_line()
                self.status.print(f"[yellow]abort requested ({cause}); waiting for the run to settle…[/]")
            case EntryAdded(entry=entry):
                self._rows(entry)
            case RunEnd(result=result):
                self._end_line()
                if result.outcome == "failed" and result.error is not None:
                    # The stored row's cleaned text, as every reader shows it; the raw text is logged (CE-9).
                    text = f": {self._error_row}" if self._error_row is not None else ""
                    self.status.print(f"[red]run failed \\[{escape(result.error.code)}]{escape(text)}[/]")
                elif result.outcome == "aborted" and result.abort_cause != "budget":
                    self.status.print(f"[yellow]run aborted ({result.abort_cause or 'unknown cause'})[/]")
            case Fault(code=code, message=text):
                self._end_line()
                self.status.print(f"[red]harness fault \\[{escape(code)}]: {escape(text)}[/]")
            case _:
                pass

    def _rows(self, entry: Entry) -> None:
        """A placed row (a chat event's, a garden's, a delegation's) as the terminal words it
        (`entry_lines`); an error row's text waits for the run's end, whose line says it."""
        if not isinstance(entry.payload, CustomMessagePayload) or entry.payload.message.custom_type not in _ROW_TYPES:
            return
        errors = [row.details for row in chat_event_rows([entry]) if isinstance(row.details, ErrorDetails)]
        if errors:
            self._error_row = errors[-1].text
            return
        for line in entry_lines(entry, None):
            self._end_line()
            self.status.print(line)

    def _stream(self, message: AssistantMessage) -> None:
        thinking = "".join(b.thinking for b in message.content if isinstance(b, ThinkingContent) and not b.redacted)
        if len(thinking) > self._thinking_shown:
            if not self._ended_line:
                self.out.write("\n")
                self.out.flush()
                self._ended_line = True
            self.status.print(escape(thinking[self._thinking_shown:]), style="dim", end="")
            self._thinking_shown = len(thinking)
            self._thinking_open = True
        text = text_of(message.content)
        if len(text) > self._text_shown:
            self._end_thinking()
            self.out.write(visible(text[self._text_shown:]))
            self.out.flush()
            self._text_shown = len(text)
            self._ended_line = text.endswith("\n")

    def _end_thinking(self) -> None:
        if self._thinking_open:
            self.status.print()
            self._thinking_open = False

    def _end_line(self) -> None:
        """End the reply's line on stdout (and a thinking line on stderr) before a status line."""
        self._end_thinking()
        if not self._ended_line:
            self.out.write("\n")
            self.out.flush()
            self._ended_line = True


# -- the turn ---------------------------------------------------------------------------------------


async def run_turn(store: Store, turn: RunTurn, registry: ModelRegistry, context: Context, *,
                   out: TextIO | None = None, status: Console | None = None) -> int:
    """Run one turn of `turn.prompt` and return the exit code (see the module docstring); with
    `turn.resume`, first finish the lane's open operation (its outcome is the exit code when there is
    no prompt, or when it did not settle completed or failed).

    Without `approve_all`, write, edit and shell calls are blocked with a reason the model reads,
    since nobody can be asked, unless a permission rule of `turn.rules` allows them; a rule that
    denies or asks blocks a call even with it. Ctrl-C (SIGINT) requests a durable abort with cause `user` and
    waits for settlement; a second one leaves at once. Errors before the run starts
    (`SessionNotFound`, `ModelUnavailable`, `MissingApiKey`, `LaneHasTools`, `LaneBusy` naming
    `--resume`, `NothingToResume`, ...) are raised."""
    out = out or sys.stdout
    status = status or Console(stderr=True, highlight=False, soft_wrap=True)
    # With an answer's shape, stdout holds that answer alone: the reply streams with the status lines.
    printer = (JsonEventPrinter(out) if turn.json_events
               else TextPrinter(sys.stderr if turn.output is not None else out, status))
    # What the run starts in the background ends with it.
    async with process_tools(turn.cwd, turn.home) as (jobs, mcp):
        approval = (ApprovalPolicy.allow_all(rules=turn.rules) if turn.approve_all
                    else ApprovalPolicy(None, rules=turn.rules, unavailable_reason=NO_APPROVER))
        await mcp.ready()  # one prompt, nobody typing meanwhile: its first step offers the servers' tools
        attached = await attach_client(
            store, turn.session_id, context, registry=registry, home=turn.home, cwd=turn.cwd, approval=approval,
            jobs=jobs, model=turn.model, lane=turn.lane, listeners=[printer],
            tools=turn.tools, mcp=mcp, budget=turn.budget, fallback=turn.fallback,
        )
        conversation, lane = attached.conversation, attached.lane
        approval.conversation_of = lambda request: conversation  # path rules follow its working directory
        session_id = conversation.id
        if isinstance(printer, JsonEventPrinter):
            printer.begin(session_id, lane)
        status.print(f"[dim]session {session_id}[/]")
        config = conversation.config(lane)
        identity, model = config.model, attached.model
        if model is not None and not registry.is_listed(identity):
            status.print(f"[yellow]{escape(identity.spec)} is not a listed model: using default limits "
                         f"({model.context_window:,} tokens of context, {model.max_tokens:,} per reply); declare it "
                         f"in models.toml to set them[/]")
        interrupt = _Interrupts(conversation, lane, context, status)
        # Said when a turn starts on the lane (not before a refusal, nor when there was nothing to
        # resume), in this command's words: `--tools`, not the chat's `/tools on`.
        note = no_tools_note(config, give="--tools", switch="--model") if turn.tools is None else None

        def turn_starts() -> None:
            nonlocal note
            if note is not None:
                status.print(f"[dim]{escape(note)}[/]")
            note = None

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, interrupt.on_signal)
        outcome: DriveOutcome | None = None
        try:
            if turn.resume:
                await interrupt.accepted()
                if any(op.lane == lane for op in attached.open_operations):
                    turn_starts()
                try:
                    outcome = await conversation.resume(context, lane=lane)
                except NothingToResume:
                    if turn.prompt is None:
                        raise
            if turn.prompt is not None and (outcome is None or _settled(outcome, "completed", "failed")):
                try:
                    # Admitted as every door admits a turn: refused once the conversation was ended, after a
                    # queued model switch, with a changed reasoning level's row above it (CE-14).
                    accepted = await conversation.admit(turn.prompt, context, lane=lane, output=turn.output)
                except LaneBusy as error:
                    raise LaneBusy(f"{error.message}; finish it with `harness run --session {session_id} "
                                   f"{_lane_option(turn.lane)}--resume` (a prompt given as well is sent after it)",
                                   **error.details) from error
                await interrupt.accepted()
                turn_starts()
                outcome = await conversation.drive(accepted.operation_id, context, lane=lane)
            if turn.output is not None and not turn.json_events and _settled(outcome, "completed"):
                assert isinstance(outcome, Settled)
                recorded = await recorded_output(conversation.journal, outcome.result, context)
                if recorded is not None:
                    out.write(json.dumps(recorded.output, ensure_ascii=False) + "\n")
                    out.flush()
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            await interrupt.settle()
            await conversation.dispose(context)
    if isinstance(outcome, Suspended):
        status.print(f"[yellow]the provider will answer later (deferred {outcome.deferred.id}); the run stays "
                     f"open in session {session_id}[/]")
        return EXIT_SUSPENDED
    if isinstance(outcome, Settled):
        return {"completed": EXIT_COMPLETED, "aborted": EXIT_ABORTED}.get(outcome.result.outcome, EXIT_FAILED)
    return EXIT_FAILED


def _cut_off(message: AssistantMessage) -> bool:
    """Whether `message` is the reply a stopped process was streaming, as a resume settles it."""
    return message.stop_reason == "error" and message.error_message == INTERRUPTED_REPLY


def _settled(outcome: DriveOutcome | None, *outcomes: str) -> bool:
    return isinstance(outcome, Settled) and outcome.result.outcome in outcomes


def _lane_option(lane: str) -> str:
    return "" if lane == "main" else f"--lane {lane} "


class _Interrupts:
    """Ctrl-C during a run: the first requests a durable abort (as soon as the run is accepted),
    the second leaves at once."""

    def __init__(self, conversation: Conversation, lane: str, context: Context, status: Console) -> None:
        self._conversation, self._lane, self._context, self._status = conversation, lane, context, status
        self._count = 0
        self._is_accepted = False
        self._abort: asyncio.Task[None] | None = None

    def on_signal(self) -> None:
        self._count += 1
        if self._count > 1:
            self._status.print("[yellow]leaving now; the run stays open in the journal and can be resumed[/]")
            sys.stdout.flush()
            os._exit(EXIT_INTERRUPTED)
        self._status.print("[yellow]interrupted: aborting the run (Ctrl-C again to leave at once)[/]")
        if self._is_accepted:
            self._start_abort()

    async def accepted(self) -> None:
        self._is_accepted = True
        if self._count:
            self._start_abort()
            await self.settle()

    def _start_abort(self) -> None:
        if self._abort is None:
            self._abort = asyncio.ensure_future(self._request())

    async def _request(self) -> None:
        with contextlib.suppress(NoActiveOperation):  # it settled meanwhile
            await self._conversation.stop(self._context, lane=self._lane)

    async def settle(self) -> None:
        if self._abort is not None:
            await self._abort
