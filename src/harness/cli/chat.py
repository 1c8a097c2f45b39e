"""The client behind `harness chat` (the command is in `commands`): an interactive terminal chat
on a lane of a session.

The reply streams as it arrives; tool calls, retries, compaction and failures show as rows
(`chat_view`). The prompt stays on screen during a turn (`chat_input`): Enter queues a steer
message, Alt-Enter a follow-up, Ctrl-C requests a durable abort (cause `user`) and the turn ends
once the run has settled; Ctrl-C twice or Ctrl-D at an idle prompt leaves. Write, edit and shell
calls ask for approval in the `before_tool` hook (y / n / a for the session) unless `--yes`.
Slash commands come from the table the client is given (the built-ins are `chat_commands`). A
session whose process stopped mid-turn shows what was open and what had streamed, and is finished
after asking (or at once with `--resume`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TextIO

from rich.console import RenderableType

from harness.cli.call_preview import call_preview
from harness.cli.chat_input import Line, Terminal
from harness.cli.chat_rows import chat_row
from harness.cli.chat_view import ChatView, Screen, UsageMeter, clip, content_text
from harness.cli.config import Attached, attach_client, no_tools_note, session_name_from
from harness.cli.render import branch_oldest_first, entry_lines
from harness.cli.terminal_text import escape
from harness.context import Context
from harness.conversation import Conversation, ConversationService, WorkMode
from harness.conversation import restart as restart_conversation
from harness.errors import HarnessError, ModelUnavailable
from harness.messages import AssistantMessage, ModelIdentity, UserMessage
from harness.providers import MissingApiKey, ModelRegistry
from harness.runtime import DriveOutcome, LaneBusy, NoActiveOperation, NotARun, Settled
from harness.session import Store, connect
from harness.tools import (
    ALLOW_FOR_SESSION,
    ALLOW_ONCE,
    DENY,
    Approval,
    ApprovalPolicy,
    ApprovalRequest,
    BackgroundJobs,
    describe_call,
)

EXIT_LEFT_RUNNING = 130
"""The exit status when the person leaves with a turn still open (Ctrl-C twice during a turn)."""

RECENT_ENTRIES = 6
"""How many of a continued session's last entries are shown when the chat starts."""


ABORT_COMMIT_WAIT_S = 5.0
"""How long leaving at once waits for the harness to close: for an abort request's commit (one
journal write) to land, and the drive to stop."""


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


CommandRun = Callable[["ChatClient", str], Awaitable[None]]
"""Runs a slash command with the text after its name (stripped; empty when none was given)."""


@dataclass(frozen=True)
class ChatCommand:
    """A slash command: `/name ARGS`. One that is not `while_busy` waits for the turn to end."""

    name: str
    usage: str
    summary: str
    run: CommandRun
    while_busy: bool = False


class ChatClient:
    """One interactive chat: a harness attached to a session, the screen, the prompt, the turn.

    `commands` is the slash-command table by name (the built-ins are `chat_commands.COMMANDS`)."""

    def __init__(self, store: Store, settings: ChatSettings, registry: ModelRegistry, context: Context, *,
                 commands: Mapping[str, ChatCommand], out: TextIO, color: bool = True) -> None:
        self.store, self.settings, self.registry, self.context = store, settings, registry, context
        self.screen = Screen(out, color=color)
        self.view = ChatView(self.screen, settings.lane)
        self.commands: dict[str, ChatCommand] = dict(commands)
        self.terminal = Terminal(self.screen, busy=lambda: self.busy, status=self._status,
                                 on_interrupt=self._interrupt_turn, commands=lambda: [f"/{n}" for n in self.commands],
                                 history=settings.home / "chat-history", on_shift_tab=self._toggle_mode_soon)
        # One policy for the whole chat, so `a` (allow for the session) survives /cd and /fork.
        self.approval = (ApprovalPolicy.allow_all() if settings.approve_all else ApprovalPolicy(self.ask_approval))
        self.cwd = settings.cwd
        """The terminal's own directory (`/cd`, `!cmd`); the tools run in the conversation's project
        when it has one (`Conversation.target`), else here."""
        self.jobs = BackgroundJobs()
        """The shell commands the agent started in the background; they end with the chat."""
        self.listing: list[str] = []
        """Entry ids of the last `/tree` listing, by number - 1 (for `/tree N` and `/fork N`)."""
        self._attached: Attached | None = None
        self._turn: asyncio.Task[None] | None = None
        self._abort_wanted = False
        self._leave_now = False
        self._named = False
        self._background: set[asyncio.Task[None]] = set()
        self._run_queued = False
        self._side_tasks: set[asyncio.Task[None]] = set()  # Shift+Tab's mode switches, queued model switches
        self._draft: Store | None = None
        """A new chat's session lives in this memory store until `save_draft`, so that a chat left
        with nothing said leaves nothing in the store."""
        self._saved_draft_id: str | None = None

    # -- state ------------------------------------------------------------------------------------

    @property
    def attached(self) -> Attached:
        assert self._attached is not None, "the chat is not attached"
        return self._attached

    @property
    def conversation(self) -> Conversation:
        """The conversation this chat talks in: every act on it goes through its door."""
        return self.attached.conversation

    @property
    def lane(self) -> str:
        """The lane this chat talks on: `main`, or the side lane `--lane` named."""
        return self.attached.lane

    def command_door(self) -> tuple[ConversationService, str, Conversation]:
        """The service, user and conversation a conversation command takes: every door of a command
        records the same row (CE-16)."""
        return self.attached.service, self.attached.user, self.attached.conversation

    @property
    def mode(self) -> WorkMode:
        """The conversation's work mode."""
        return self.conversation.mode

    @property
    def busy(self) -> bool:
        """Whether a turn (a run, compaction or navigation driven from here) is under way."""
        return self._turn is not None

    def where(self) -> str:
        """Where the tools run, as the terminal says it: the project and its path, or the directory."""
        selection = self.conversation.target.selection
        return f"project {selection.slug} ({selection.path})" if selection is not None else str(self.cwd)

    def error(self, error: HarnessError) -> None:
        """Show an error a person can act on: its stable code and message."""
        self.screen.print(f"[red]error \\[{escape(error.code)}]: {escape(error.message)}[/]")

    # -- the chat ---------------------------------------------------------------------------------

    async def run(self) -> int:
        """Chat until the person leaves; returns the exit status."""
        if self.settings.session_id is None:
            self._draft = await connect("memory://", self.context)
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
            what = "its abort" if self._abort_wanted else "it"  # before the turn's end resets it
            if (self._leave_now or self._turn is not None) and await self._leave_at_once():
                self.screen.print("[yellow]left with the turn still open; `harness chat "
                                  f"{self.conversation.id}` finishes {what}[/]")
                self.screen.drain()
                os._exit(EXIT_LEFT_RUNNING)  # the journal holds the open run; nothing here must outlive it
        finally:
            if self._turn is None:
                await self.attached.conversation.dispose(self.context)
            await self.jobs.close()
        await self._say_how_to_come_back()
        return 0

    async def _leave_at_once(self) -> bool:
        """Leave at once: the drive stops where it is, as a crash would stop it, and settles
        nothing more here; an abort requested just before (a job already on the session line) is
        made durable first, within `ABORT_COMMIT_WAIT_S`. True if the turn is still open; False
        if it settled before the leave, and the chat ends as it would after any turn."""
        if self._background:
            self.screen.print("[dim]saving the abort request before leaving…[/]")
            self.screen.drain()
        closing = asyncio.ensure_future(self.conversation.detach_now(self.context))
        await asyncio.wait([closing], timeout=ABORT_COMMIT_WAIT_S)
        return self.conversation.operation(self.lane) is not None

    async def _say_how_to_come_back(self) -> None:
        """On leaving: a draft is dropped, and so is a saved session still without entries (its
        first prompt was refused); any other session is named, with how to continue it."""
        journal = self.conversation.journal
        if self._draft is not None:
            await self._draft.close(self.context)
            return
        if journal.id == self._saved_draft_id and not await journal.read_entries(self.context, limit=1):
            await self.store.delete_session(journal.id, self.context)
            return
        self.screen.print(f"session [cyan]{journal.id}[/] [dim]· continue it with `harness chat {journal.id}` "
                          "(or `harness chat -c`, the most recent session)[/]")
        self.screen.drain()

    async def handle(self, line: Line) -> None:
        """One submitted line: a slash command, a steer or follow-up during a turn, else a prompt."""
        text = line.text.strip()
        if not text:
            return
        if text.startswith("/"):
            await self.run_command(text)
        elif text.startswith("!") and len(text) > 1:
            await self.run_local_shell(text[1:].strip())
        elif self.busy:
            await self._queue(text, follow_up=line.follow_up)
        else:
            await self._send(text)

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

    async def run_local_shell(self, command: str) -> None:
        """`!cmd`: run `command` here, in the chat's directory, and record it as a shell row the
        model reads with the next message, which is sent as typed (CE-17). The row, shown as it is
        published, is where its output shows; a row the store refused is shown here, saying so."""
        service, user, conversation = self.command_door()
        row, recorded = await service.run_local_shell(user, conversation.id, command, self.cwd, self.context)
        if not recorded:
            self.screen.print(chat_row(row))
            self.screen.print("[yellow]the store refused this row: the model will not read it[/]")

    async def restart(self) -> None:
        """`/restart`: the conversation's restart (its row written first, CE-17), after which this
        chat goes on with the conversation reopened from the journal, in the same session."""
        service, user, talking = self.command_door()
        await restart_conversation(service, user, talking, None, self.context)
        self._attached = replace(self.attached, conversation=await service.open(user, talking.id, self.context))

    def beside_the_prompt(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` in the background, its errors shown: the prompt takes input meanwhile."""

        async def shown() -> None:
            try:
                await work()
            except HarnessError as error:
                self.error(error)

        task = asyncio.create_task(shown())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def _toggle_mode_soon(self) -> None:
        self.beside_the_prompt(self.toggle_mode)

    async def toggle_mode(self) -> None:
        """Shift+Tab: build to plan and back, recorded as a mode row at once (CE-13)."""
        service, user, conversation = self.command_door()
        await service.select_mode(user, conversation.id, "plan" if self.mode == "build" else "build", self.context)
        self.terminal.invalidate()

    # -- turns ------------------------------------------------------------------------------------

    def start_turn(self, work: Callable[[], Awaitable[DriveOutcome | None]]) -> None:
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

    async def _run_turn(self, work: Callable[[], Awaitable[DriveOutcome | None]]) -> None:
        outcome: DriveOutcome | None = None
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
        if self._run_queued:  # input typed during a compaction or navigation: its run starts now
            self._run_queued = False
            self.start_turn(lambda: self._prompt(""))

    async def _send(self, text: str) -> None:
        """A prompt at the idle prompt: a new turn; while a stopped process's run is left open, a
        follow-up it answers once finished; refused (and put back on the input line) when it
        cannot be either."""
        current = (await self.conversation.inspect(self.context, lane=self.lane)).current
        if current is not None:
            if current.kind != "run" or current.status == "aborting":
                what = "the abort of the open run" if current.kind == "run" else f"the open {current.kind}"
                self.screen.print(f"[yellow]{what} comes first: /resume finishes it[/]")
                self.terminal.give_back(text)
                return
            try:
                await self.conversation.follow_up(UserMessage(content=text), self.context, lane=self.lane)
            except HarnessError as error:  # refused (too large): nothing was queued
                self.error(error)
                return
            self.screen.print("[dim]queued as follow-up: the open run answers it once finished (/resume)[/]")
            return
        if (notice := self.model_notice()) is not None:
            self.screen.print(f"[yellow]{escape(notice)}[/]")
            self.terminal.give_back(text)
            return
        self.start_turn(lambda: self._prompt(text))

    def unusable(self, identity: ModelIdentity) -> str | None:
        """Why model `identity` cannot run a turn now (its API key is not set, or it is not
        configured here); None when it can."""
        try:
            self.registry.usable(identity)
        except MissingApiKey as error:
            return f"{error.details['env']} is not set"
        except ModelUnavailable:
            return "no provider here offers it (`harness models` lists those that do)"
        return None

    def model_notice(self) -> str | None:
        """The notice that the lane's model cannot run a turn, with the way out; None when it can."""
        identity = self.conversation.config(self.lane).model
        if (reason := self.unusable(identity)) is None:
            return None
        return f"model {identity.spec} is not usable: {reason}; /model to switch"

    async def _prompt(self, text: str) -> DriveOutcome:
        await self.save_draft()
        conversation = self.conversation
        if text:
            # Admitted as every door admits a turn: after a queued model switch, with the row of a
            # reasoning level changed since the last turn right above it (CE-14).
            accepted = await conversation.admit(text, self.context, lane=self.lane)
        else:  # the input typed during a compaction or navigation, kept for this run
            accepted = await conversation.admit_next_run(self.context, lane=self.lane)
        if self._abort_wanted:  # Ctrl-C came before the run existed
            await self._request_abort()
        await self._name_session(text)
        return await conversation.drive(accepted.operation_id, self.context, lane=self.lane)

    async def _name_session(self, text: str) -> None:
        if self._named:
            return
        self._named = True
        if name := session_name_from(text):
            await self.conversation.name_from_first_prompt(name, self.context)

    async def _queue(self, text: str, *, follow_up: bool) -> None:
        message = UserMessage(content=text)
        queue = self.conversation.follow_up if follow_up else self.conversation.steer
        try:
            await queue(message, self.context, lane=self.lane)
        except NoActiveOperation:  # the run settled meanwhile: this is the next prompt
            await self.wait_turn()
            self.start_turn(lambda: self._prompt(text))
            return
        except NotARun as error:  # a compaction or navigation: kept for the run that follows it
            await self.conversation.queue_next_run(message, self.context, lane=self.lane)
            self._run_queued = True
            self.screen.print(f"[dim]queued: sent when the {error.details['kind']} ends[/]")
            return
        except HarnessError as error:  # refused (too large for the model's window): nothing was queued
            self.error(error)
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
            await self.conversation.stop(self.context, lane=self.lane)
        except NoActiveOperation:
            pass  # not accepted yet (the turn asks again once it is) or already settled
        except HarnessError as error:
            self.error(error)

    def _status(self) -> str:
        """The toolbar: what the session has spent and how much of the context window the last
        request used, then what the lane is doing and the keys that do something now."""
        usage = self.view.meter.text(self.context_window())
        if not self.busy:
            return (f"{usage} · {self.mode} mode (Shift+Tab) · /help: commands · Tab completes them · "
                    f"Alt-Enter: new line · Ctrl-D: leave · {self.approvals()}")
        status = self.view.status()
        keys = ("Ctrl-C again: leave now (the abort ends on reopening)" if self._abort_wanted
                else "Enter: steer · Alt-Enter: follow-up · Ctrl-C: abort")
        return " · ".join(part for part in (usage, status, keys) if part)

    def context_window(self) -> int | None:
        """The lane's model's context window in tokens; None when no provider here offers the model."""
        try:
            return self.registry.model(self.conversation.config(self.lane).model).context_window
        except ModelUnavailable:
            return None

    # -- approval ---------------------------------------------------------------------------------

    def approvals(self) -> str:
        """Which of the lane's tools still ask before they run, e.g. `edit, shell ask first; write allowed`."""
        active = set(self.conversation.config(self.lane).active_tools)
        if not active:
            return "no tools"
        gated = sorted(self.approval.gated & active)
        if not gated:
            return "only tools that change nothing"  # plan mode, say: nothing to approve
        asking = [name for name in gated if self.approval.needs_approval(name)]
        allowed = [name for name in gated if name not in asking]
        if not asking:
            return "writes and shell allowed" + (" (--yes)" if self.settings.approve_all else "")
        return f"{', '.join(asking)} ask first" + (f"; {', '.join(allowed)} allowed" if allowed else "")

    async def ask_approval(self, request: ApprovalRequest, context: Context) -> Approval:
        """The `before_tool` question, answered by one key: y allows the call, a allows the tool
        for the rest of the chat, n refuses. What a write or edit would change is shown first."""
        self.screen.end_stream()
        self.screen.print(f"[bold yellow]?[/] [magenta]{escape(request.summary)}[/] [dim]needs approval[/]")
        directory = self.conversation.target.directory
        for preview_row in call_preview(directory, request.tool_name, request.args):
            self.screen.print(preview_row)
        hint = f"y: allow once · a: allow {request.tool_name} for this chat · n: refuse · Ctrl-C: abort the turn"
        match await self.terminal.ask(f"allow {request.tool_name}? [y/n/a] ", hint, keys="yna"):
            case "y":
                return ALLOW_ONCE
            case "a":
                self.approval.allow_for_session(request.tool_name)
                self.screen.print(f"[dim]{escape(request.tool_name)} runs without asking for the rest of this chat; "
                                  f"approvals: {escape(self.approvals())}[/]")
                return ALLOW_FOR_SESSION
            case "n":
                return DENY
            case _:
                # Ctrl-C asked for an abort: it commits before this answer, so the batch asks no
                # later call of this turn for approval.
                await asyncio.gather(*self._background)
                return Approval(allow=False, reason="the person interrupted the turn")

    # -- attachment -------------------------------------------------------------------------------

    async def _attach(self, session_id: str | None, *, model: ModelIdentity | None = None) -> Attached:
        attached = await attach_client(
            self._draft or self.store, session_id, self.context, registry=self.registry, home=self.settings.home,
            cwd=self.cwd, approval=self.approval, jobs=self.jobs, model=model, lane=self.settings.lane,
            listeners=[self.view], require_model=False, tools=self.settings.tools,
        )
        conversation = attached.conversation
        self.view.meter = await UsageMeter.read(conversation.journal, conversation.tip_id(attached.lane), self.context)
        return attached

    async def switch_session(self, session_id: str) -> None:
        """Detach from this session and attach to `session_id` (the chat must be idle); on failure
        the chat stays on the old session and the error is raised."""
        previous = self.conversation.id
        await self.conversation.dispose(self.context)
        try:
            self._attached = await self._attach(session_id)
        except HarnessError:
            self._attached = await self._attach(previous)
            raise
        self._named = False
        self.listing = []

    async def save_draft(self) -> None:
        """Write a new chat's session to the store under the same id, with the lane settings and
        the name chosen meanwhile, and attach to it there; nothing when it is already stored."""
        draft = self._draft
        if draft is None:
            return
        drafted = self.conversation
        session_id = await drafted.copy_into(self.store, self.context, lane=self.lane)
        self._draft = None
        try:
            attached = await self._attach(session_id)
        except BaseException:
            self._draft = draft
            await self.store.delete_session(session_id, self.context)
            raise
        await drafted.dispose(self.context)
        await draft.close(self.context)
        self._attached, self._saved_draft_id = attached, session_id

    # -- start and resume -------------------------------------------------------------------------

    async def _show_start(self) -> None:
        conversation, lane = self.conversation, self.lane
        name = await conversation.session_name(self.context)
        title = f" · {escape(name)}" if name else ""
        config, tip = conversation.config(lane), conversation.tip_id(lane)
        self.screen.print(f"[bold]harness chat[/] · session [cyan]{conversation.id}[/]{title}")
        self.screen.print(f"[dim]lane {escape(lane)} · model {escape(config.model.spec)} · "
                          f"{escape(self.where())} · {escape(self.approvals())}[/]")
        if note := no_tools_note(config):
            self.screen.print(f"[dim]{escape(note)}[/]")
        if not self.attached.created_session and tip is not None:
            await self._show_recent(tip)
        if (notice := self.model_notice()) is not None:
            self.screen.print(f"[yellow]{escape(notice)}[/]")
        self.screen.print("[dim]/help: commands · Enter sends · Ctrl-C interrupts a turn · Ctrl-D leaves[/]")

    async def _show_recent(self, tip: str) -> None:
        """The branch's last entries; older ones are clipped, the latest reply is shown whole."""
        entries = await branch_oldest_first(self.conversation.journal, tip, self.context)
        show_all = f"`harness show {self.conversation.id}` prints them whole"
        if len(entries) > RECENT_ENTRIES:
            self.screen.print(f"[dim]… {len(entries) - RECENT_ENTRIES} earlier entries (/tree lists them; "
                              f"{escape(show_all)})[/]")
        recent = entries[-RECENT_ENTRIES:]
        replies = [e for e in recent if e.payload.type == "message" and isinstance(e.payload.message, AssistantMessage)]
        clipped = False
        for entry in recent:
            whole = entry_lines(entry, None)
            lines = whole if replies and entry is replies[-1] else entry_lines(entry, 300)
            clipped = clipped or _sources(lines) != _sources(whole)
            for line in lines:
                self.screen.print(line)
        if clipped and len(entries) <= RECENT_ENTRIES:
            self.screen.print(f"[dim](long entries are clipped; {escape(show_all)})[/]")

    async def _offer_resume(self) -> None:
        """Show the lane's open operation left by a stopped process, then finish it (after asking,
        or at once with `--resume`), abort it, or leave it open."""
        mine = [op for op in self.attached.open_operations if op.lane == self.lane]
        others = [op for op in self.attached.open_operations if op.lane != self.lane]
        for op in others:
            self.screen.print(f"[dim]lane {escape(op.lane)} has an open {op.kind} (not this chat's lane)[/]")
        if not mine:
            return
        op = mine[0]
        started = datetime.fromtimestamp(op.started_at / 1000).strftime("%Y-%m-%d %H:%M:%S")
        aborting = ", abort requested" if op.aborting else ""
        self.screen.print(f"[bold yellow]open {op.kind}[/] [yellow]{op.operation_id} (started {started}{aborting}): "
                          "the process running it stopped before it ended[/]")
        watch = await self.conversation.lane_events(self.context, lane=self.lane)
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
        leave = {"n": "leave", "no": "leave"}
        blocked = await self.open_blocked()
        if op.aborting:  # Ctrl-C asked for the abort before a second Ctrl-C left; it cannot be taken back
            question, hint = "Finish the abort now? [Y/n] ", "Enter or y: end it as aborted · n: leave it open"
            actions = {**leave, "": "finish", "y": "finish", "yes": "finish"}
        elif blocked is not None:
            self.screen.print(f"[yellow]{escape(blocked)}[/]")
            question, hint = "Abort it now? [y/N] ", "y: end it as aborted · Enter or n: leave it open"
            actions = {**leave, "": "leave", "y": "abort", "yes": "abort"}
        else:
            question, hint = "Finish it now? [Y/n/abort] ", ("Enter or y: finish it · abort: end it as aborted · "
                                                             "n: leave it open")
            actions = {**leave, "": "finish", "y": "finish", "yes": "finish", "abort": "abort"}
        action: str | None = "leave" if blocked else "finish"
        while not self.settings.resume:
            answer = await self.terminal.ask(question, hint)
            if (action := "leave" if answer is None else actions.get(answer.strip().lower())) is not None:
                break  # Ctrl-D leaves it open
        if action == "finish":
            self.start_turn(self._resume)
        elif action == "abort":
            self.start_turn(self._abort_and_settle)
        elif op.kind == "run" and not op.aborting:
            self.screen.print("[dim]left open: /resume finishes it; prompts you send meanwhile are queued as "
                              "follow-ups and answered then[/]")
        else:
            self.screen.print("[dim]left open: /resume finishes it; new prompts are refused until then[/]")

    async def open_blocked(self) -> str | None:
        """Why the lane's open operation cannot be finished now (its model is not usable), with the
        way out; None when it can (an abort needs no model), or when there is none."""
        current = (await self.conversation.inspect(self.context, lane=self.lane)).current
        if current is None or current.status == "aborting":
            return None
        identity = current.captured_model or self.conversation.config(self.lane).model
        if (reason := self.unusable(identity)) is None:
            return None
        # A phase that captured its model keeps it; otherwise the next step takes the lane's.
        way_out = ("make it usable and reopen the chat, or abort it" if current.captured_model
                   else "/model to switch, then /resume; or abort it")
        return (f"the open {current.kind} cannot be finished until model {identity.spec} is usable "
                f"({reason}): {way_out}")

    async def resume_open(self) -> None:
        """Finish the lane's open operation as a turn (`/resume`), unless its model is not usable."""
        if (blocked := await self.open_blocked()) is not None:
            self.screen.print(f"[yellow]{escape(blocked)}[/]")
            return
        self.start_turn(self._resume)

    async def _resume(self) -> DriveOutcome:
        return await self.conversation.resume(self.context, lane=self.lane)

    async def _abort_and_settle(self) -> DriveOutcome:
        with contextlib.suppress(NoActiveOperation):
            await self.conversation.stop(self.context, lane=self.lane)
        return await self._resume()


def _sources(rows: list[RenderableType]) -> list[object]:
    """What rows say, comparable: a Markdown row by its source text (rich's Markdown has no `==`)."""
    return [getattr(row, "markup", row) for row in rows]
