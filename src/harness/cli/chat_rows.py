"""How the terminal words a chat-event row: one line of rich markup per typed fact, live (from
`ChatEventPublished`) and in history (from the transcript's rows) alike; and a delegation row from
its finish marker (CE-18).

Every word a person reads here comes from the row's details, never from the English text the
model reads (CE-5); outside text in them (an error's public text, a name, a command) is made
visible, not obeyed (`terminal_text.escape`).
"""

from __future__ import annotations

from harness.cli.terminal_text import escape
from harness.conversation import (
    AgentFinish,
    AlwaysAllowed,
    BudgetReached,
    ChatEventDetails,
    CommandOutcome,
    CommandRan,
    Compacted,
    CompactionStopped,
    CompactOutcome,
    ContextOutcome,
    ContextOverflow,
    DelegationFinish,
    DirectoryMoved,
    ErrorDetails,
    FastOutcome,
    GardenMessage,
    GoalActionOutcome,
    GoalOutcome,
    GoalStatus,
    Interrupted,
    ModelOutcome,
    ModelSwitched,
    ModelSwitchFailed,
    ModeOutcome,
    ModeSelected,
    ReasoningChanged,
    Renamed,
    RenameOutcome,
    RestartOutcome,
    ShellRan,
    ToolsOutcome,
    WorkflowFinish,
)
from harness.conversation.chat_events import ChatErrorNotice
from harness.conversation.commands import tools_to_add
from harness.session import AbortCause

_STOPPED: dict[AbortCause, str] = {
    "user": "interrupted by you",
    "user_during_tool": "interrupted by you during a tool call",
    "step_ceiling": "stopped: the turn reached its limit of steps",
    "parent": "stopped by the agent that delegated it",
    "deleted": "stopped: the conversation was deleted",
    "probe": "stopped by an internal probe",
    "budget": "stopped: the turn reached its budget",
}

_GOAL_ACTED = {"paused": "paused", "active": "resumed", "dropped": "dropped"}
"""How `/goal pause|resume|drop`'s row words the status it set."""

_MODES = {"build": "build (all of this session's tools)", "plan": "plan (read-only tools)"}

SHELL_ROW_LINES = 40
"""The lines of a `!cmd`'s recorded output its row shows, its last ones, unless told otherwise."""


def chat_row(details: ChatEventDetails, *, shell_lines: int | None = SHELL_ROW_LINES) -> str:
    """The row for `details`, as rich markup on one line (a `!cmd` row adds the last `shell_lines`
    lines of its recorded output, None: all, and says how many it left out)."""
    match details:
        case Interrupted():
            return f"[yellow]■ {_STOPPED[details.cause]}[/]"
        case ErrorDetails():
            return f"[red]✗ {escape(_error_text(details.text, details.notice))}[/]"
        case ModelSwitched():
            before = f"{details.previous.spec} -> " if details.previous is not None else ""
            why = f" (fallback: {details.reason or 'it kept failing'})" if details.by == "fallback" else ""
            return f"[dim]model: {escape(before + details.model.spec + _tools_followed(details.tools) + why)}[/]"
        case Renamed():
            return f"[dim]renamed: {escape(details.name)}[/]" if details.name else "[dim]name cleared[/]"
        case DirectoryMoved(project=str(project)):
            where = escape(f"{project} ({details.path})")
            return f"[dim]the agent switched to project {where}[/]" if details.by == "agent" else \
                f"[dim]project: {where}[/]"
        case DirectoryMoved():
            who = "the agent moved to" if details.by == "agent" else "working directory:"
            return f"[dim]{who} {escape(details.path)}[/]"
        case ModeSelected():
            return f"[dim]mode: {_MODES[details.mode]}[/]"
        case ReasoningChanged():
            return f"[dim]reasoning: {details.previous} -> {details.level}[/]"
        case CommandRan():
            invocation = escape(f"/{details.name}" + (f" {details.args}" if details.args else ""))
            if details.error is not None:
                return f"[red]{invocation}: failed: {escape(details.error)}[/]"
            said = _outcome_text(details.outcome)
            return f"[dim]{invocation}{': ' + escape(said) if said else ''}[/]"
        case ShellRan():
            # The output is shown here only, as recorded (what the model reads), but a long one cut
            # to its end: it would push the whole chat off the screen.
            status = "could not finish" if details.exit_code is None else f"exit {details.exit_code}"
            row = f"[dim]! {escape(details.command)} · {status}[/]"
            lines = details.output.rstrip("\n").split("\n")
            if not "".join(lines).strip():
                return row
            hidden = len(lines) - shell_lines if shell_lines is not None else 0
            if hidden > 0:
                earlier = f"{hidden} earlier line{'s' if hidden > 1 else ''}"
                cut = f"\n[dim]… {earlier} not shown (`harness show --full` prints them)[/]"
                lines = lines[hidden:]
            else:
                cut = "\n[dim]… (only the output's end is kept)[/]" if details.truncated else ""
            return f"{row}{cut}\n{escape(chr(10).join(lines))}"
        case Compacted():
            before = f", {details.tokens_before} tokens before" if details.tokens_before is not None else ""
            return f"[dim]compacted ({details.reason}{before})[/]"
        case GoalStatus():
            return f"[dim]goal {escape(details.title)}: {details.status}[/]"
        case BudgetReached():
            return f"[yellow]■ stopped: the {details.scope} reached its budget of {details.amount(details.limit)} " \
                   f"({details.amount(details.spent)} used)[/]"
        case AlwaysAllowed():
            return f"[dim]{escape(details.rule)} runs without asking for the rest of this conversation[/]"


_GARDEN_KINDS = {"tend_survey": "tend survey", "recently_concluded": "recently concluded", "reply": "answer"}


def garden_row(message: GardenMessage) -> str:
    """A garden's message as the terminal shows it: from the garden, never as the person's or the
    model's (OM-4, OM-5); its text is outside text, made visible."""
    return f"[bold green]garden {escape(message.garden)}[/] [dim]({_GARDEN_KINDS[message.kind]})[/]: " \
           f"{escape(message.text)}"


_FINISHED = {"completed": ("dim", "finished"), "failed": ("red", "failed"), "aborted": ("yellow", "was stopped")}


def delegation_row(finish: DelegationFinish) -> str:
    """The row where a delegated job's result reached this lane, worded from its finish marker."""
    colour, ended = _FINISHED[finish.outcome]
    match finish:
        case AgentFinish():
            return f"[{colour}]⇢ agent {escape(finish.agent)} {ended}: {escape(finish.task)}[/]"
        case WorkflowFinish():
            tally = finish.tally
            return (f"[{colour}]⇢ workflow {escape(finish.title)} {ended} · {tally.completed} completed, "
                    f"{tally.failed} failed, {tally.aborted} stopped[/]")


def _error_text(text: str, notice: ChatErrorNotice | None) -> str:
    """A notice is worded from its type; without one the text is the provider's or an exception's
    own, shown verbatim (CE-5)."""
    match notice:
        case None:
            return text
        case ContextOverflow():
            return ("the conversation no longer fits the model's context window, even compacted: /tree goes back "
                    "to an entry before the largest one (0: the start of the session), /fork starts a new "
                    "session from an earlier entry")
        case CompactionStopped():
            return (f"compaction stopped after {notice.failures} failures in a row "
                    f"(the last: {notice.last_error}); the turn goes on without compacting")
        case ModelSwitchFailed():
            return f"could not switch the model to {notice.requested.spec}"


def _outcome_text(outcome: CommandOutcome | None) -> str:
    match outcome:
        case None:
            return ""
        case CompactOutcome(result="compacted"):
            return "compacted"
        case CompactOutcome(result="nothing_old_enough"):
            return "nothing old enough to compact"
        case CompactOutcome():
            return "the compaction failed"
        case FastOutcome():
            state = "on" if outcome.on else "off"
            return f"fast mode {state}: {outcome.model.spec}, reasoning {outcome.thinking_level}"
        case ModelOutcome(queued=True):
            return f"model {outcome.model.spec} after the running turn"
        case ModelOutcome():
            return f"model {outcome.model.spec}{_tools_followed(outcome.tools)}"
        case RenameOutcome():
            return f"named {outcome.name}" if outcome.name else "name cleared"
        case ModeOutcome():
            return f"mode {_MODES[outcome.mode]}"
        case ToolsOutcome():
            whose = "your choice, kept across model switches" if outcome.chosen else "the model's"
            others = [name for name in outcome.available if name not in outcome.tools]
            more = f"; {tools_to_add(others)}" if others else ""
            return f"tools: {', '.join(outcome.tools) or 'none'} ({whose}){more}"
        case RestartOutcome():
            return "restarted from the journal"
        case GoalOutcome():
            return f"goal {outcome.title} given to garden {outcome.garden}"
        case GoalActionOutcome():
            return f"goal {outcome.title} {_GOAL_ACTED[outcome.status]}"
        case ContextOutcome():
            return _context_text(outcome)


def _context_text(outcome: ContextOutcome) -> str:
    """`/context`'s files, one a line: path, size (and how much of it is read), a short sha256."""
    if not outcome.files:
        return "no AGENTS.md or CLAUDE.md applies here"
    lines = [f"project instructions, at most {outcome.limit_bytes:,} bytes"
             + ("" if outcome.current else " (changed since the last turn: the next one reads these)")]
    for file in outcome.files:
        read = "" if file.included == file.size else f", the first {file.included:,} read"
        lines.append(f"  {file.path} · {file.size:,} bytes{read} · sha256 {file.sha256[:12]}")
    return "\n".join(lines)


def _tools_followed(tools: list[str] | None) -> str:
    """What a model switch did to the tools that follow the model (None: nothing)."""
    if tools is None:
        return ""
    return f" · tools: {', '.join(tools)}" if tools else " · no tools"
