"""The client behind `harness chat` (the command is in `commands`): an interactive terminal chat
on a lane of a session.

The reply streams as it arrives; tool calls, retries, compaction and failures show as rows
(`chat_view`). The prompt stays on screen during a turn (`chat_input`): Enter queues a steer
message, Alt-Enter a follow-up, Ctrl-C requests a durable abort (cause `user`) and the turn ends
once the run has settled; Ctrl-C twice or Ctrl-D at an idle prompt leaves. Write, edit and shell
calls ask for approval in the `before_tool` hook (y / n / a: always, kept in the conversation's
journal) unless `--yes` or a permission rule says otherwise.
Slash commands come from the table the client is given (the built-ins are `chat_commands`). A
session whose process stopped mid-turn shows what was open and what had streamed, and is finished
after asking (or at once with `--resume`).

The client holds the screen, the prompt and the session the chat is attached to (switching it,
keeping a new chat's draft); the turn itself is `chat_turns.TurnControl`'s.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from rich.console import RenderableType

from harness.cli.call_preview import call_preview
from harness.cli.chat_input import Line, Terminal
from harness.cli.chat_rows import chat_row
from harness.cli.chat_turns import TurnControl
from harness.cli.chat_view import ChatView, Screen, StatusPart, UsageMeter
from harness.cli.config import Attached, attach_client, no_tools_note
from harness.cli.render import branch_oldest_first, entry_lines
from harness.cli.terminal_text import escape
from harness.context import Context
from harness.conversation import Budget, Conversation, ConversationService, WorkMode
from harness.conversation import restart as restart_conversation
from harness.errors import HarnessError, ModelUnavailable
from harness.messages import AssistantMessage, ModelIdentity
from harness.providers import ModelRegistry
from harness.session import Store, connect
from harness.tools import Approval, ApprovalPolicy, ApprovalRequest, BackgroundJobs, McpServers, PermissionRules
from harness.tools.approval import ALLOW_FOR_SESSION, ALLOW_ONCE, DENY

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
    rules: PermissionRules = field(default_factory=PermissionRules)
    """The permission rules of the settings files and the command line (`load_permission_rules`)."""
    budget: Budget = field(default_factory=Budget)
    """Each turn's spending caps (`--budget-tokens`, `--budget-usd`): reaching one stops the turn."""
    fallback: tuple[ModelIdentity, ...] = ()
    """The models that take a step over when the lane's model keeps failing (`--fallback`)."""


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
    """One interactive chat: the session it is attached to, the screen and the prompt; `turns`
    holds the turn.

    `commands` is the slash-command table by name (the built-ins are `chat_commands.COMMANDS`)."""

    def __init__(self, store: Store, settings: ChatSettings, registry: ModelRegistry, context: Context, *,
                 commands: Mapping[str, ChatCommand], out: TextIO, color: bool = True) -> None:
        self.store, self.settings, self.registry, self.context = store, settings, registry, context
        self.screen = Screen(out, color=color)
        self.view = ChatView(self.screen, settings.lane)
        self.commands: dict[str, ChatCommand] = dict(commands)
        # The turn control needs the terminal, so the terminal looks `turns` up when it calls.
        self.terminal = Terminal(self.screen, busy=lambda: self.turns.busy, status=self._status,
                                 on_interrupt=lambda: self.turns.interrupt(),
                                 commands={f"/{name}": entry.summary for name, entry in self.commands.items()},
                                 history=settings.home / "chat-history", on_shift_tab=self._toggle_mode_soon,
                                 working=self.view.working, queued=self.view.waiting,
                                 context_window=self.context_window)
        self.turns = TurnControl(screen=self.screen, view=self.view, terminal=self.terminal, registry=registry,
                                 context=context, attached=lambda: self.attached, save_draft=self.save_draft,
                                 error=self.error)
        """The chat's turn: start one, queue a line typed during it, abort it, finish an open one."""
        self.mcp = McpServers.from_files(settings.cwd, settings.home)
        """The MCP servers' tools, joining as each server answers: the prompt does not wait for them."""
        # One policy for the whole chat; `a` (allow always) is kept in the conversation's journal.
        # A call asked here may be answered from `harness serve` too (its approvals route, the web
        # page): the first answer wins, and the prompt is dismissed.
        self.approval = (ApprovalPolicy.allow_all(self.ask_approval, rules=settings.rules) if settings.approve_all
                         else ApprovalPolicy(self.ask_approval, rules=settings.rules, answered_anywhere=True))
        self.approval.conversation_of = lambda request: self._attached.conversation if self._attached else None
        self.allowed_always: tuple[str, ...] = ()
        """The rules the person allowed "always" in the attached conversation, for the status line."""
        self.cwd = settings.cwd
        """The terminal's own directory (`/cd`, `!cmd`); the tools run in the conversation's project
        when it has one (`Conversation.target`), else here."""
        self.jobs = BackgroundJobs()
        """The shell commands the agent started in the background; they end with the chat."""
        self.listing: list[str] = []
        """Entry ids of the last `/tree` listing, by number - 1 (for `/tree N` and `/fork N`)."""
        self._attached: Attached | None = None
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
        self.mcp.start()
        try:
            await self._show_start()
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, self.terminal.interrupt)
            prompting = asyncio.create_task(self.terminal.run())
            try:
                await self.turns.offer_resume(at_once=self.settings.resume)
                while (line := await self.terminal.read()) is not None:
                    await self.handle(line)
            finally:
                self.terminal.leave()
                await prompting
                loop.remove_signal_handler(signal.SIGINT)
                self.screen.drain()
            if (what := await self.turns.leave()) is not None:
                self.screen.print(f"[yellow]left with the turn still open; `{escape(command_as_invoked())} chat "
                                  f"{self.conversation.id}` finishes {what}[/]")
                self.screen.drain()
                os._exit(EXIT_LEFT_RUNNING)  # the journal holds the open run; nothing here must outlive it
        finally:
            if not self.turns.busy:
                await self.attached.conversation.dispose(self.context)
            await self.jobs.close()
            await self.mcp.close()
        await self._say_how_to_come_back()
        return 0

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
        harness = escape(command_as_invoked())
        self.screen.print(f"session [cyan]{journal.id}[/] [dim]· continue it with `{harness} chat {journal.id}` "
                          f"(or `{harness} chat -c`, the most recent session)[/]", soft_wrap=True)
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
        elif self.turns.busy:
            await self.turns.queue(text, follow_up=line.follow_up)
        else:
            await self.turns.send(text)

    async def run_command(self, text: str) -> None:
        """Run `/name argument` from the command table; its errors are shown, not raised."""
        name, _, argument = text[1:].partition(" ")
        command = self.commands.get(name)
        if command is None:
            self.screen.print(f"[red]no command /{escape(name)}[/] [dim](/help lists them)[/]")
            return
        if self.turns.busy and not command.while_busy:
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

    def _status(self) -> list[StatusPart]:
        """The toolbar: what the session has spent and how much of the context window the last
        request used, then the messages queued and the keys that do something now; on a narrow
        terminal the keys a person finds in /help go first (`fit_status`)."""
        usage = self.view.meter.parts(self.context_window())
        if not self.turns.busy:
            return [*usage, StatusPart(f"{self.mode} mode (Shift+Tab)", drop=2, short=f"{self.mode} mode"),
                    StatusPart("/help: commands", drop=4), StatusPart("Tab completes them", drop=6),
                    StatusPart("Alt-Enter: new line", drop=5), StatusPart("Ctrl-D: leave", drop=3),
                    StatusPart(self.approvals(), drop=1)]
        if self.turns.abort_wanted:
            keys = [StatusPart("Ctrl-C again: leave now (the abort ends on reopening)",
                               short="Ctrl-C again: leave now")]
        else:
            keys = [StatusPart("Enter: steer", drop=3), StatusPart("Alt-Enter: follow-up", drop=5),
                    StatusPart("Ctrl-C: abort", drop=1)]
        return [*usage, *self.view.status(), *keys]

    def context_window(self) -> int | None:
        """The lane's model's context window in tokens; None when no provider here offers the model."""
        try:
            return self.registry.model(self.conversation.config(self.lane).model).context_window
        except ModelUnavailable:
            return None

    # -- approval ---------------------------------------------------------------------------------

    def approvals(self) -> str:
        """Which of the lane's tools still ask before they run, e.g. `edit, shell ask first; write allowed`."""
        if not self.conversation.config(self.lane).active_tools:
            return "no tools"
        # The built-in tools first, then the MCP servers' (there may be dozens: `_few` counts them).
        gated = sorted((tool for tool in self.conversation.offered_tools(self.lane) if tool.asks_first),
                       key=lambda tool: (tool.name in self.mcp.tools, tool.name))
        if not gated:
            return "only tools that change nothing"  # plan mode, say: nothing to approve
        asking = [tool.name for tool in gated if self.approval.needs_approval(tool, self.allowed_always)]
        allowed = [tool.name for tool in gated if tool.name not in asking]
        if not asking:
            return "writes and shell allowed" + (" (--yes)" if self.settings.approve_all else "")
        return f"{_few(asking)} ask first" + (f"; {_few(allowed)} allowed" if allowed else "")

    async def ask_approval(self, request: ApprovalRequest, context: Context) -> Approval:
        """The `before_tool` question, answered by one key: y allows the call, a allows the tool
        for the rest of the conversation (kept in its journal), n refuses; a call an `ask` rule
        asks for has no a, since that rule would ask again. What a write or edit would change is
        shown first. Another process may answer first (`harness serve`): the question is then
        dismissed with a line saying who answered and how."""
        self.screen.end_stream()
        why = f"the rule {request.rule} asks" if request.rule else "needs approval"
        self.screen.print(f"[bold yellow]?[/] [magenta]{escape(request.summary)}[/] [dim]{escape(why)}[/]")
        directory = self.conversation.target.directory
        for preview_row in call_preview(directory, request.tool_name, request.args):
            self.screen.print(preview_row)
        always = f" · a: allow {request.tool_name} for this conversation" if request.rule is None else ""
        hint = f"y: allow once{always} · n: refuse · Ctrl-C: abort the turn"
        keys = "yna" if request.rule is None else "yn"
        question = f"allow {request.tool_name}? [{'/'.join(keys)}] "
        try:
            key = await self.terminal.ask(question, hint, keys=keys)
        except asyncio.CancelledError:
            decided = self.conversation.approval_decision(request.tool_call_id)
            if decided is not None:
                what = "allowed" if decided.allow else "refused"
                self.screen.print(f"[yellow]{escape(question)}[/]{what} elsewhere, by {escape(decided.by)}")
            raise
        match key:
            case "y":
                return ALLOW_ONCE
            case "a":
                self.allowed_always = (*self.allowed_always, request.tool_name)
                self.screen.print(f"[dim]{escape(request.tool_name)} runs without asking for the rest of this "
                                  f"conversation; approvals: {escape(self.approvals())}[/]")
                return ALLOW_FOR_SESSION
            case "n":
                return DENY
            case _:
                # Ctrl-C asked for an abort: it commits before this answer, so the batch asks no
                # later call of this turn for approval.
                await self.turns.abort_requested()
                return Approval(allow=False, reason="the person interrupted the turn")

    # -- attachment -------------------------------------------------------------------------------

    async def _attach(self, session_id: str | None, *, model: ModelIdentity | None = None) -> Attached:
        attached = await attach_client(
            self._draft or self.store, session_id, self.context, registry=self.registry, home=self.settings.home,
            cwd=self.cwd, approval=self.approval, jobs=self.jobs, mcp=self.mcp, model=model, lane=self.settings.lane,
            listeners=[self.view], require_model=False, tools=self.settings.tools, budget=self.settings.budget,
            fallback=self.settings.fallback,
        )
        conversation = attached.conversation
        self.view.meter = await UsageMeter.read(conversation.journal, conversation.tip_id(attached.lane), self.context)
        self.allowed_always = await conversation.allowed_always(self.context)
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

    # -- the start screen -------------------------------------------------------------------------

    async def _show_start(self) -> None:
        conversation, lane = self.conversation, self.lane
        name = await conversation.session_name(self.context)
        title = f" · {escape(name)}" if name else ""
        config, tip = conversation.config(lane), conversation.tip_id(lane)
        self.screen.print(f"[bold]harness chat[/] · session [cyan]{conversation.id}[/]{title}")
        self.screen.print(f"[dim]lane {escape(lane)} · model {escape(self.registry.label(config.model))} · "
                          f"{escape(self.where())} · {escape(self.approvals())}[/]")
        if note := no_tools_note(config, give="/tools on", switch="/model, --model"):
            self.screen.print(f"[dim]{escape(note)}[/]")
        if not self.attached.created_session and tip is not None:
            await self._show_recent(tip)
        if (notice := self.turns.model_notice()) is not None:
            self.screen.print(f"[yellow]{escape(notice)}[/]")
        if untrusted := [status.config.name for status in self.mcp.statuses() if status.state == "untrusted"]:
            # Said, not asked: a cloned repository's servers wait for the person's own command.
            self.screen.print(f"[yellow]{escape(_untrusted_note(untrusted))}[/]")
        self.screen.print("[dim]/help: commands · Enter sends · Ctrl-C interrupts a turn · Ctrl-D leaves[/]")

    async def _show_recent(self, tip: str) -> None:
        """The branch's last entries; older ones are clipped, the latest reply is shown whole."""
        entries = await branch_oldest_first(self.conversation.journal, tip, self.context)
        show_all = f"`{command_as_invoked()} show {self.conversation.id}` prints them whole"
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


def command_as_invoked(argv0: str | None = None, *, cwd: Path | None = None, path: str | None = None) -> str:
    """The `harness` command as the person can type it again in the shell they started it from:
    `harness` when their PATH (`path`, default `$PATH`) finds this very program by that name,
    else the path they ran (`argv0`, default `sys.argv[0]`), relative to `cwd` (default the
    current directory) when it lies under it, e.g. `.venv/bin/harness` after the README's set-up."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    cwd = Path.cwd() if cwd is None else cwd
    if "/" not in argv0:
        return argv0  # found on PATH by this name
    if Path(argv0).name == "__main__.py":  # python -m harness
        return f"{command_as_invoked(sys.executable, cwd=cwd, path=path)} -m harness"
    program = Path(os.path.abspath(cwd / argv0))
    found = shutil.which(program.name, path=path)
    if found is not None and Path(found).resolve() == program.resolve():
        return program.name
    if program.is_relative_to(cwd):
        return str(program.relative_to(cwd))
    return str(program)


def _few(names: list[str], shown: int = 3) -> str:
    """`names` for the status line: an MCP server may bring dozens, so past `shown` + 1 the
    rest are counted."""
    if len(names) <= shown + 1:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def _untrusted_note(names: list[str]) -> str:
    """The start's line about the servers of ./.mcp.json the person has not trusted (`names`)."""
    trust = f"{command_as_invoked()} mcp trust"
    if len(names) == 1:
        return f"./.mcp.json's MCP server {names[0]} is not started until you trust it: `{trust} {names[0]}`"
    return f"./.mcp.json's MCP servers {', '.join(names)} are not started until you trust them: `{trust} NAME`"


def _sources(rows: list[RenderableType]) -> list[object]:
    """What rows say, comparable: a Markdown row by its source text (rich's Markdown has no `==`)."""
    return [getattr(row, "markup", row) for row in rows]
