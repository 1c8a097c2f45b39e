"""Turn control of `harness chat`: starting a turn and driving it in the background, what a line
typed during it does (steer, follow-up, kept for the next run), Ctrl-C's durable abort, leaving
with a turn still open, and finishing an operation a stopped process left open.

It acts on the conversation only through its door (`Conversation`); the screen, the prompt and
the session a chat is attached to are the client's (`chat`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime

from harness.cli.chat_input import Terminal
from harness.cli.chat_view import ChatView, Screen, clip, content_text
from harness.cli.config import Attached
from harness.cli.terminal_text import escape
from harness.context import Context
from harness.conversation import Conversation
from harness.errors import HarnessError, ModelUnavailable
from harness.messages import ModelIdentity, UserMessage
from harness.providers import MissingApiKey, ModelRegistry
from harness.runtime import DriveOutcome, LaneBusy, NoActiveOperation, NotARun, Settled
from harness.tools.approval import describe_call

ABORT_COMMIT_WAIT_S = 5.0
"""How long leaving at once waits for the harness to close: for an abort request's commit (one
journal write) to land, and the drive to stop."""

TurnWork = Callable[[], Awaitable[DriveOutcome | None]]
"""What a turn does: drive an operation to its settlement (None when none ran)."""


class TurnControl:
    """The turn of one chat: at most one at a time, driven in the background while the prompt
    takes input. `attached` gives the conversation and lane the chat is on now (they change when
    the chat moves to another session); `save_draft` keeps a new chat's session before its first
    prompt; `error` shows an error as the chat shows them."""

    def __init__(self, *, screen: Screen, view: ChatView, terminal: Terminal, registry: ModelRegistry,
                 context: Context, attached: Callable[[], Attached], save_draft: Callable[[], Awaitable[None]],
                 error: Callable[[HarnessError], None]) -> None:
        self._screen, self._view, self._terminal = screen, view, terminal
        self._registry, self._context, self._attached = registry, context, attached
        self._save_draft, self._error = save_draft, error
        self._turn: asyncio.Task[None] | None = None
        self._abort_wanted = False
        self._leave_now = False
        self._abort_requests: set[asyncio.Task[None]] = set()
        self._run_queued = False
        """The session whose first prompt this chat has offered as its name."""

    # -- state ------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a turn (a run, compaction or navigation driven from here) is under way."""
        return self._turn is not None

    @property
    def abort_wanted(self) -> bool:
        """Whether Ctrl-C has asked this turn to abort (a second Ctrl-C leaves at once)."""
        return self._abort_wanted

    def _on(self) -> tuple[Conversation, str]:
        """The conversation and lane the chat is on now."""
        attached = self._attached()
        return attached.conversation, attached.lane

    def _unusable(self, identity: ModelIdentity) -> str | None:
        """Why model `identity` cannot run a turn now (its API key is not set, or it is not
        configured here); None when it can."""
        try:
            self._registry.usable(identity)
        except MissingApiKey as error:
            return f"{error.details['env']} is not set"
        except ModelUnavailable:
            return "no provider here offers it (`harness models` lists those that do)"
        return None

    def model_notice(self) -> str | None:
        """The notice that the lane's model cannot run a turn, with the way out; None when it can."""
        conversation, lane = self._on()
        identity = conversation.config(lane).model
        if (reason := self._unusable(identity)) is None:
            return None
        return f"model {identity.spec} is not usable: {reason}; /model to switch"

    # -- turns ------------------------------------------------------------------------------------

    def start(self, work: TurnWork) -> None:
        """Drive `work` (an operation to its settlement) in the background; the prompt steers meanwhile."""
        self._abort_wanted = False
        self._view.aborting = False
        self._view.begin_run()
        self._turn = asyncio.create_task(self._run(work))
        self._terminal.invalidate()

    async def wait(self) -> None:
        """Wait for the current turn, if any, to end."""
        if self._turn is not None:
            await asyncio.shield(self._turn)

    async def _run(self, work: TurnWork) -> None:
        outcome: DriveOutcome | None = None
        try:
            outcome = await work()
        except LaneBusy as error:
            self._error(error)
            self._screen.print("[dim]an operation a stopped process left open comes first: /resume finishes it[/]")
        except HarnessError as error:
            self._error(error)
        except Exception as error:  # a bug: say so, keep the chat alive
            self._screen.print(f"[red]unexpected error: {escape(type(error).__name__)}: {escape(str(error))}[/]")
        finally:
            # Idle first, then the outcome row: whoever reads "completed" may type the next prompt.
            self._turn = None
            self._abort_wanted = False
            self._view.aborting = False
            self._screen.end_stream()
            self._terminal.invalidate()
        if isinstance(outcome, Settled):
            for item in (*outcome.steer, *outcome.follow_up):
                text = clip(content_text(item.message.content)) if isinstance(item.message, UserMessage) else ""
                self._screen.print(f"[dim]not sent: {escape(text)}[/]")
            self._view.outcome_row(outcome.result)
        if self._run_queued:  # input typed during a compaction or navigation: its run starts now
            self._run_queued = False
            self.start(lambda: self._prompt(""))

    async def send(self, text: str) -> None:
        """A prompt at the idle prompt: a new turn; while a stopped process's run is left open, a
        follow-up it answers once finished; refused (and put back on the input line) when it
        cannot be either."""
        conversation, lane = self._on()
        current = (await conversation.inspect(self._context, lane=lane)).current
        if current is not None:
            if current.kind != "run" or current.status == "aborting":
                what = "the abort of the open run" if current.kind == "run" else f"the open {current.kind}"
                self._screen.print(f"[yellow]{what} comes first: /resume finishes it[/]")
                self._terminal.give_back(text)
                return
            try:
                await conversation.follow_up(UserMessage(content=text), self._context, lane=lane)
            except HarnessError as error:  # refused (too large): nothing was queued
                self._error(error)
                return
            self._screen.print("[dim]queued as follow-up: the open run answers it once finished (/resume)[/]")
            return
        if (notice := self.model_notice()) is not None:
            self._screen.print(f"[yellow]{escape(notice)}[/]")
            self._terminal.give_back(text)
            return
        self.start(lambda: self._prompt(text))

    async def _prompt(self, text: str) -> DriveOutcome:
        await self._save_draft()
        conversation, lane = self._on()
        before = conversation.tip_id(lane)
        if text:
            # Admitted as every door admits a turn: after a queued model switch, with the row of a
            # reasoning level changed since the last turn right above it (CE-14).
            accepted = await conversation.admit(text, self._context, lane=lane)
        else:  # the input typed during a compaction or navigation, kept for this run
            accepted = await conversation.admit_next_run(self._context, lane=lane)
        if self._abort_wanted:  # Ctrl-C came before the run existed
            await self._request_abort()
        outcome = await conversation.drive(accepted.operation_id, self._context, lane=lane)
        if (text and isinstance(outcome, Settled) and outcome.result.outcome == "aborted"
                and outcome.result.tip_id in (before, *accepted.entry_ids[:-1])):
            self._terminal.give_back(text)  # stopped before any output: the turn was discarded (CE-7)
        return outcome

    async def queue(self, text: str, *, follow_up: bool) -> None:
        """A line typed during a turn: a steer message (a follow-up with Alt-Enter), shown as
        queued above the prompt (`ChatView.waiting`) and printed once, where the model reads it
        (its `sent` row); kept for the run that follows a compaction or navigation; the next
        prompt if the run settled meanwhile; back on the input line if it was refused."""
        conversation, lane = self._on()
        message = UserMessage(content=text)
        queue = conversation.follow_up if follow_up else conversation.steer
        try:
            await queue(message, self._context, lane=lane)
        except NoActiveOperation:  # the run settled meanwhile: this is the next prompt
            await self.wait()
            self._terminal.echo(text)
            self.start(lambda: self._prompt(text))
            return
        except NotARun as error:  # a compaction or navigation: kept for the run that follows it
            await conversation.queue_next_run(message, self._context, lane=lane)
            self._run_queued = True
            self._terminal.echo(text, note=f"queued: sent when the {error.details['kind']} ends")
            return
        except HarnessError as error:  # refused (too large for the model's window): nothing was queued
            self._error(error)
            self._terminal.give_back(text)
            return
        self._terminal.invalidate()  # its queued line shows above the prompt

    # -- abort and leaving ------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Ctrl-C during a turn: the first requests a durable abort, the second leaves at once."""
        if self._abort_wanted:
            self._leave_now = True
            self._terminal.leave()
            return
        self._abort_wanted = True
        self._view.aborting = True  # the status line says so; the run's `interrupted` row ends it
        self._terminal.invalidate()
        task = asyncio.create_task(self._request_abort())
        self._abort_requests.add(task)
        task.add_done_callback(self._abort_requests.discard)

    async def _request_abort(self) -> None:
        conversation, lane = self._on()
        try:
            await conversation.stop(self._context, lane=lane)
        except NoActiveOperation:
            pass  # not accepted yet (the turn asks again once it is) or already settled
        except HarnessError as error:
            self._error(error)

    async def abort_requested(self) -> None:
        """Wait until the abort Ctrl-C asked for has been requested (committed, or refused)."""
        await asyncio.gather(*self._abort_requests)

    async def leave(self) -> str | None:
        """The chat is leaving. With a turn under way (or after a second Ctrl-C), leave at once:
        the drive stops where it is, as a crash would stop it, and settles nothing more here; an
        abort requested just before (a job already on the session line) is made durable first,
        within `ABORT_COMMIT_WAIT_S`. Returns what reopening the chat finishes (`it`, or `its
        abort`) when the turn is still open; None when there was none, or it settled before the
        leave and the chat ends as it would after any turn."""
        what = "its abort" if self._abort_wanted else "it"  # before the turn's end resets it
        if not (self._leave_now or self.busy):
            return None
        if self._abort_requests:
            self._screen.print("[dim]saving the abort request before leaving…[/]")
            self._screen.drain()
        conversation, lane = self._on()
        closing = asyncio.ensure_future(conversation.detach_now(self._context))
        await asyncio.wait([closing], timeout=ABORT_COMMIT_WAIT_S)
        return what if conversation.operation(lane) is not None else None

    # -- an operation a stopped process left open -------------------------------------------------

    async def offer_resume(self, *, at_once: bool) -> None:
        """Show the lane's open operation left by a stopped process, then finish it (after asking,
        or at once when `at_once`, as `--resume` asks), abort it, or leave it open."""
        attached = self._attached()
        conversation, lane = attached.conversation, attached.lane
        mine = [op for op in attached.open_operations if op.lane == lane]
        others = [op for op in attached.open_operations if op.lane != lane]
        for op in others:
            self._screen.print(f"[dim]lane {escape(op.lane)} has an open {op.kind} (not this chat's lane)[/]")
        if not mine:
            return
        op = mine[0]
        started = datetime.fromtimestamp(op.started_at / 1000).strftime("%Y-%m-%d %H:%M:%S")
        aborting = ", abort requested" if op.aborting else ""
        self._screen.print(f"[bold yellow]open {op.kind}[/] [yellow]{op.operation_id} (started {started}{aborting}): "
                           "the process running it stopped before it ended[/]")
        watch = await conversation.lane_events(self._context, lane=lane)
        watch.close()
        operation = watch.snapshot.operation
        if operation is not None:
            if operation.streaming_message is not None and operation.streaming_message.content:
                self._screen.print("[dim]already streamed:[/]")
                self._view.stream_reply(operation.streaming_message)
                self._screen.end_stream()
            for tool in operation.running_tools:
                args = tool.args if isinstance(tool.args, dict) else {}
                self._screen.print(f"[magenta]→ {escape(describe_call(tool.tool_name, args))}[/] [dim](was running)[/]")
            if operation.retry is not None:
                self._screen.print(f"[dim]waiting to retry (attempt {operation.retry.attempt} of "
                                   f"{operation.retry.max_attempts})[/]")
        leave = {"n": "leave", "no": "leave"}
        blocked = await self.open_blocked()
        if op.aborting:  # Ctrl-C asked for the abort before a second Ctrl-C left; it cannot be taken back
            question, hint = "Finish the abort now? [Y/n] ", "Enter or y: end it as aborted · n: leave it open"
            actions = {**leave, "": "finish", "y": "finish", "yes": "finish"}
        elif blocked is not None:
            self._screen.print(f"[yellow]{escape(blocked)}[/]")
            question, hint = "Abort it now? [y/N] ", "y: end it as aborted · Enter or n: leave it open"
            actions = {**leave, "": "leave", "y": "abort", "yes": "abort"}
        else:
            question, hint = "Finish it now? [Y/n/abort] ", ("Enter or y: finish it · abort: end it as aborted · "
                                                             "n: leave it open")
            actions = {**leave, "": "finish", "y": "finish", "yes": "finish", "abort": "abort"}
        action: str | None = "leave" if blocked else "finish"
        while not at_once:
            answer = await self._terminal.ask(question, hint)
            if (action := "leave" if answer is None else actions.get(answer.strip().lower())) is not None:
                break  # Ctrl-D leaves it open
        if action == "finish":
            self.start(self._resume)
        elif action == "abort":
            self.start(self._abort_and_settle)
        elif op.kind == "run" and not op.aborting:
            self._screen.print("[dim]left open: /resume finishes it; prompts you send meanwhile are queued as "
                               "follow-ups and answered then[/]")
        else:
            self._screen.print("[dim]left open: /resume finishes it; new prompts are refused until then[/]")

    async def open_blocked(self) -> str | None:
        """Why the lane's open operation cannot be finished now (its model is not usable), with the
        way out; None when it can (an abort needs no model), or when there is none."""
        conversation, lane = self._on()
        current = (await conversation.inspect(self._context, lane=lane)).current
        if current is None or current.status == "aborting":
            return None
        identity = current.captured_model or conversation.config(lane).model
        if (reason := self._unusable(identity)) is None:
            return None
        # A phase that captured its model keeps it; otherwise the next step takes the lane's.
        way_out = ("make it usable and reopen the chat, or abort it" if current.captured_model
                   else "/model to switch, then /resume; or abort it")
        return (f"the open {current.kind} cannot be finished until model {identity.spec} is usable "
                f"({reason}): {way_out}")

    async def resume_open(self) -> None:
        """Finish the lane's open operation as a turn (`/resume`), unless its model is not usable."""
        if (blocked := await self.open_blocked()) is not None:
            self._screen.print(f"[yellow]{escape(blocked)}[/]")
            return
        self.start(self._resume)

    async def _resume(self) -> DriveOutcome:
        conversation, lane = self._on()
        return await conversation.resume(self._context, lane=lane)

    async def _abort_and_settle(self) -> DriveOutcome:
        conversation, lane = self._on()
        with contextlib.suppress(NoActiveOperation):
            await conversation.stop(self._context, lane=lane)
        return await self._resume()
