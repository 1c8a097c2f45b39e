"""`harness chat`: an interactive terminal chat on a lane of a session.

The reply streams as it arrives; tool calls, retries, compaction and failures show as rows
(`chat_view`). The prompt stays on screen during a turn (`chat_input`): Enter queues a steer
message, Alt-Enter a follow-up, Ctrl-C requests a durable abort (cause `user`) and the turn ends
once the run has settled; Ctrl-C twice or Ctrl-D at an idle prompt leaves. Write, edit and shell
calls ask for approval in the `before_tool` hook (y / n / a for the session) unless `--yes`.
Slash commands come from a table (`chat_commands`). A session whose process stopped mid-turn
shows what was open and what had streamed, and is finished after asking (or at once with
`--resume`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, TextIO

import typer
from rich.markup import escape

from harness.cli.app import StoreOption, app, run_with_store
from harness.cli.chat_commands import COMMANDS, ChatCommand
from harness.cli.chat_input import Line, Terminal
from harness.cli.chat_view import ChatView, Screen, clip, content_text
from harness.cli.config import Attached, attach_client, model_name, no_tools_note, parse_model, session_name_from
from harness.cli.render import branch_oldest_first, entry_lines
from harness.context import Context
from harness.errors import HarnessError
from harness.home import harness_home
from harness.messages import ModelIdentity, UserMessage
from harness.providers import ModelRegistry
from harness.runtime import Lane, LaneBusy, NoActiveOperation, PromptRequest, ResumeOutcome, Settled
from harness.session import Store
from harness.tools import ALLOW_FOR_SESSION, ALLOW_ONCE, DENY, Approval, ApprovalPolicy, ApprovalRequest, describe_call

EXIT_LEFT_RUNNING = 130
"""The exit status when the person leaves with a turn still open (Ctrl-C twice during a turn)."""

RECENT_ENTRIES = 6
"""How many of a continued session's last entries are shown when the chat starts."""


@dataclass(frozen=True)
class ChatSettings:
    """What one `harness chat` was asked for."""

    home: Path
    cwd: Path
    session_id: str | None = None
    lane: str = "main"
    model: ModelIdentity | None = None
    approve_all: bool = False
    resume: bool = False
    tools: bool | None = None
    """A new lane's tools: None for the model's default (`offers_tools`), True or False to decide."""


class ChatClient:
    """One interactive chat: a harness attached to a session, the screen, the prompt, the turn.

    `commands` is the slash-command table (default `COMMANDS`); a caller may pass more."""

    def __init__(self, store: Store, settings: ChatSettings, registry: ModelRegistry, context: Context, *,
                 out: TextIO, color: bool = True, commands: Mapping[str, ChatCommand] | None = None) -> None:
        self.store, self.settings, self.registry, self.context = store, settings, registry, context
        self.screen = Screen(out, color=color)
        self.view = ChatView(self.screen, settings.lane)
        self.terminal = Terminal(self.screen, busy=lambda: self.busy, status=self._status,
                                 on_interrupt=self._interrupt_turn, history=settings.home / "chat-history")
        self.commands: dict[str, ChatCommand] = dict(commands if commands is not None else COMMANDS)
        self.cwd = settings.cwd
        self.listing: list[str] = []
        """Entry ids of the last `/tree` listing, by number - 1 (for `/tree N` and `/fork N`)."""
        self._attached: Attached | None = None
        self._turn: asyncio.Task[None] | None = None
        self._abort_wanted = False
        self._leave_now = False
        self._named = False
        self._background: set[asyncio.Task[None]] = set()

    # -- state ------------------------------------------------------------------------------------

    @property
    def attached(self) -> Attached:
        assert self._attached is not None, "the chat is not attached"
        return self._attached

    @property
    def lane(self) -> Lane:
        return self.attached.lane

    @property
    def busy(self) -> bool:
        """Whether a turn (a run, compaction or navigation driven from here) is under way."""
        return self._turn is not None

    def error(self, error: HarnessError) -> None:
        """Show an error a person can act on: its stable code and message."""
        self.screen.print(f"[red]error \\[{escape(error.code)}]: {escape(error.message)}[/]")

    # -- the chat ---------------------------------------------------------------------------------

    async def run(self) -> int:
        """Chat until the person leaves; returns the exit status."""
        self._attached = await self._attach(self.settings.session_id, model=self.settings.model)
        try:
            await self._show_start()
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, self.terminal.interrupt)
            prompting = asyncio.create_task(self.terminal.run())
            try:
                await self._offer_resume()
                while (line := await self.terminal.read()) is not None:
                    await self.handle(line)
            finally:
                self.terminal.leave()
                await prompting
                loop.remove_signal_handler(signal.SIGINT)
                self.screen.drain()
            if self._leave_now or self._turn is not None:
                self.screen.print("[yellow]left with the turn still open; `harness chat "
                                  f"{self.attached.harness.session.id}` finishes it[/]")
                self.screen.drain()
                os._exit(EXIT_LEFT_RUNNING)  # the journal holds the open run; nothing here must outlive it
        finally:
            if self._turn is None:
                await self.attached.harness.close(self.context)
        return 0

    async def handle(self, line: Line) -> None:
        """One submitted line: a slash command, a steer or follow-up during a turn, else a prompt."""
        text = line.text.strip()
        if not text:
            return
        if text.startswith("/"):
            await self.run_command(text)
        elif self.busy:
            await self._queue(text, follow_up=line.follow_up)
        else:
            self.start_turn(lambda: self._prompt(text))

    async def run_command(self, text: str) -> None:
        """Run `/name argument` from the command table; its errors are shown, not raised."""
        name, _, argument = text[1:].partition(" ")
        command = self.commands.get(name)
        if command is None:
            self.screen.print(f"[red]no command /{escape(name)}[/] [dim](/help lists them)[/]")
            return
        if self.busy and not command.while_busy:
            self.screen.print(f"[yellow]/{escape(name)} waits for the turn to end (Ctrl-C aborts it)[/]")
            return
        try:
            await command.run(self, argument.strip())
        except HarnessError as error:
            self.error(error)

    # -- turns ------------------------------------------------------------------------------------

    def start_turn(self, work: Callable[[], Awaitable[ResumeOutcome]]) -> None:
        """Drive `work` (an operation to its settlement) in the background; the prompt steers meanwhile."""
        self._abort_wanted = False
        self.view.aborting = False
        self.view.begin_run()
        self._turn = asyncio.create_task(self._run_turn(work))
        self.terminal.invalidate()

    async def wait_turn(self) -> None:
        """Wait for the current turn, if any, to end."""
        if self._turn is not None:
            await asyncio.shield(self._turn)

    async def _run_turn(self, work: Callable[[], Awaitable[ResumeOutcome]]) -> None:
        outcome: ResumeOutcome | None = None
        try:
            outcome = await work()
        except LaneBusy as error:
            self.error(error)
            self.screen.print("[dim]an operation a stopped process left open comes first: /resume finishes it[/]")
        except HarnessError as error:
            self.error(error)
        except Exception as error:  # a bug: say so, keep the chat alive
            self.screen.print(f"[red]unexpected error: {escape(type(error).__name__)}: {escape(str(error))}[/]")
        finally:
            # Idle first, then the outcome row: whoever reads "completed" may type the next prompt.
            self._turn = None
            self._abort_wanted = False
            self.view.aborting = False
            self.screen.end_stream()
            self.terminal.invalidate()
        if isinstance(outcome, Settled):
            for item in (*outcome.steer, *outcome.follow_up):
                text = clip(content_text(item.message.content)) if isinstance(item.message, UserMessage) else ""
                self.screen.print(f"[dim]not sent: {escape(text)}[/]")
            self.view.outcome_row(outcome.result)

    async def _prompt(self, text: str) -> ResumeOutcome:
        accepted = await self.lane.accept(PromptRequest(text=text), self.context)
        if self._abort_wanted:  # Ctrl-C came before the run existed
            await self._request_abort()
        await self._name_session(text)
        return await self.lane.drive(accepted.operation_id, self.context)

    async def _name_session(self, text: str) -> None:
        if self._named:
            return
        self._named = True
        if await self.attached.harness.session_name(self.context) is None and (name := session_name_from(text)):
            await self.attached.harness.set_session_name(name, self.context)

    async def _queue(self, text: str, *, follow_up: bool) -> None:
        message = UserMessage(content=text)
        try:
            if follow_up:
                await self.lane.follow_up(message, self.context)
            else:
                await self.lane.steer(message, self.context)
        except NoActiveOperation:  # the run settled meanwhile: this is the next prompt
            await self.wait_turn()
            self.start_turn(lambda: self._prompt(text))
            return
        when = "when the run would end" if follow_up else "after the current step"
        self.screen.print(f"[dim]queued as {'follow-up' if follow_up else 'steer'}: the model reads it {when}[/]")

    def _interrupt_turn(self) -> None:
        """Ctrl-C during a turn: the first requests a durable abort, the second leaves at once."""
        if self._abort_wanted:
            self._leave_now = True
            self.terminal.leave()
            return
        self._abort_wanted = True
        self.view.aborting = True
        self.screen.print("[yellow]^C: aborting the turn…[/]")
        task = asyncio.create_task(self._request_abort())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _request_abort(self) -> None:
        try:
            await self.lane.request_abort("user", self.context)
        except NoActiveOperation:
            pass  # not accepted yet (the turn asks again once it is) or already settled
        except HarnessError as error:
            self.error(error)

    def _status(self) -> str:
        status = self.view.status()
        keys = ("Ctrl-C again: leave now (the run stays open)" if self._abort_wanted
                else "Enter: steer · Alt-Enter: follow-up · Ctrl-C: abort")
        return f"{status} · {keys}" if status else keys

    # -- approval ---------------------------------------------------------------------------------

    async def ask_approval(self, request: ApprovalRequest, context: Context) -> Approval:
        """The `before_tool` question: y allows the call, a allows the tool for the session, n refuses."""
        self.screen.end_stream()
        self.screen.print(f"[bold yellow]?[/] [magenta]{escape(request.summary)}[/] [dim]needs approval[/]")
        for name in ("old_text", "new_text"):
            value = request.args.get(name)
            if isinstance(value, str):
                self.screen.print(f"[dim]  {name}: {escape(clip(value))}[/]")
        hint = f"y: allow once · a: allow {request.tool_name} for this session · n: refuse · Ctrl-C: abort the turn"
        while True:
            answer = await self.terminal.ask(f"allow {request.tool_name}? [y/n/a] ", hint)
            if answer is None:
                return Approval(allow=False, reason="the person interrupted the turn")
            match answer.strip().lower():
                case "y" | "yes":
                    return ALLOW_ONCE
                case "a" | "always":
                    return ALLOW_FOR_SESSION
                case "n" | "no":
                    return DENY
                case _:
                    self.screen.print(f"[dim]answer y (allow once), n (refuse) or a (allow {escape(request.tool_name)} "
                                      "for this session)[/]")

    # -- attachment -------------------------------------------------------------------------------

    async def _attach(self, session_id: str | None, *, model: ModelIdentity | None = None) -> Attached:
        approval = (ApprovalPolicy.allow_all() if self.settings.approve_all
                    else ApprovalPolicy(self.ask_approval))
        return await attach_client(
            self.store, session_id, self.context, registry=self.registry, home=self.settings.home, cwd=self.cwd,
            approval=approval, model=model, lane=self.settings.lane, listeners=[self.view], tools=self.settings.tools,
        )

    async def switch_session(self, session_id: str) -> None:
        """Detach from this session and attach to `session_id` (the chat must be idle); on failure
        the chat stays on the old session and the error is raised."""
        previous = self.attached.harness.session.id
        await self.attached.harness.close(self.context)
        try:
            self._attached = await self._attach(session_id)
        except HarnessError:
            self._attached = await self._attach(previous)
            raise
        self._named = False
        self.listing = []

    # -- start and resume -------------------------------------------------------------------------

    async def _show_start(self) -> None:
        harness, lane = self.attached.harness, self.lane
        name = await harness.session_name(self.context)
        title = f" · {escape(name)}" if name else ""
        self.screen.print(f"[bold]harness chat[/] · session [cyan]{harness.session.id}[/]{title}")
        if not lane.config.active_tools:
            approvals = "no tools"
        elif self.settings.approve_all:
            approvals = "writes and shell allowed (--yes)"
        else:
            approvals = "writes and shell ask first"
        self.screen.print(f"[dim]lane {escape(lane.name)} · model {escape(model_name(lane.config.model))} · "
                          f"{escape(str(self.cwd))} · {approvals}[/]")
        if note := no_tools_note(lane.config):
            self.screen.print(f"[dim]{escape(note)}[/]")
        if not self.attached.created_session and lane.tip_id is not None:
            await self._show_recent(lane.tip_id)
        self.screen.print("[dim]/help: commands · Enter sends · Ctrl-C interrupts a turn · Ctrl-D leaves[/]")

    async def _show_recent(self, tip: str) -> None:
        entries = await branch_oldest_first(self.attached.harness.session, tip, self.context)
        if len(entries) > RECENT_ENTRIES:
            self.screen.print(f"[dim]… {len(entries) - RECENT_ENTRIES} earlier entries (/tree lists them)[/]")
        for entry in entries[-RECENT_ENTRIES:]:
            for line in entry_lines(entry, 300):
                self.screen.print(line)

    async def _offer_resume(self) -> None:
        """Show the lane's open operation left by a stopped process, then finish it (after asking,
        or at once with `--resume`), abort it, or leave it open."""
        mine = [op for op in self.attached.open_operations if op.lane == self.lane.name]
        others = [op for op in self.attached.open_operations if op.lane != self.lane.name]
        for op in others:
            self.screen.print(f"[dim]lane {escape(op.lane)} has an open {op.kind} (not this chat's lane)[/]")
        if not mine:
            return
        op = mine[0]
        started = datetime.fromtimestamp(op.started_at / 1000).strftime("%Y-%m-%d %H:%M:%S")
        aborting = ", abort requested" if op.aborting else ""
        self.screen.print(f"[bold yellow]open {op.kind}[/] [yellow]{op.operation_id} (started {started}{aborting}): "
                          "the process running it stopped before it ended[/]")
        watch = await self.lane.watch(self.context)
        watch.close()
        operation = watch.snapshot.operation
        if operation is not None:
            if operation.streaming_message is not None and operation.streaming_message.content:
                self.screen.print("[dim]already streamed:[/]")
                self.view.stream_reply(operation.streaming_message)
                self.screen.end_stream()
            for tool in operation.running_tools:
                args = tool.args if isinstance(tool.args, dict) else {}
                self.screen.print(f"[magenta]→ {escape(describe_call(tool.tool_name, args))}[/] [dim](was running)[/]")
            if operation.retry is not None:
                self.screen.print(f"[dim]waiting to retry (attempt {operation.retry.attempt} of "
                                  f"{operation.retry.max_attempts})[/]")
        answer: str | None = "y"
        while not self.settings.resume:
            answer = await self.terminal.ask("Finish it now? [Y/n/abort] ",
                                             "Enter or y: finish it · abort: end it as aborted · n: leave it open")
            answer = "n" if answer is None else answer.strip().lower()  # Enter finishes; Ctrl-D leaves it open
            if answer in ("", "y", "yes", "n", "no", "abort"):
                break
        if answer in ("", "y", "yes"):
            self.start_turn(lambda: self.lane.resume(self.context))
        elif answer == "abort":
            self.start_turn(self._abort_and_settle)
        else:
            self.screen.print("[dim]left open: /resume finishes it; new prompts wait until it ends[/]")

    async def _abort_and_settle(self) -> ResumeOutcome:
        with contextlib.suppress(NoActiveOperation):
            await self.lane.request_abort("user", self.context)
        return await self.lane.resume(self.context)


# -- the command ------------------------------------------------------------------------------------


@app.command()
def chat(
    session: Annotated[str | None, typer.Argument(help="The session to continue; a new one when omitted.")] = None,
    lane: Annotated[str, typer.Option(help="The lane to chat on.")] = "main",
    model: Annotated[str | None, typer.Option(
        help="provider/id, e.g. openai/gpt-4o; default: the lane's model, else the first model whose API key is "
             "set, else the embedded one.")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Finish a turn that a stopped process left open, without asking.")] = False,
    yes: Annotated[bool, typer.Option(
        "--yes", "-y", help="Allow write, edit and shell calls for this chat without asking.")] = False,
    tools: Annotated[bool, typer.Option(
        "--tools", help="Give a new lane the built-in tools even on the tiny embedded model, which gets none by "
                        "default.")] = False,
    store: StoreOption = None,
) -> None:
    """Chat with an agent in the terminal; every turn is journaled, so a stopped chat can be resumed."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        typer.echo("harness chat needs a terminal; for one prompt from a script use `harness run`", err=True)
        raise typer.Exit(2)

    async def body(s: Store, context: Context) -> int:
        settings = ChatSettings(home=harness_home(), cwd=Path.cwd(), session_id=session, lane=lane,
                                model=parse_model(model) if model else None, approve_all=yes, resume=resume,
                                tools=True if tools else None)
        registry = ModelRegistry.load(home=settings.home)
        client = ChatClient(s, settings, registry, context, out=sys.stdout, color="NO_COLOR" not in os.environ)
        return await client.run()

    raise typer.Exit(run_with_store(store, body))
