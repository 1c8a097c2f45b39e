"""The slash commands of `harness chat`, as a table: a new command is one more `@command` here (or
one more entry in the table a `ChatClient` is given), not a change to the chat loop."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import harness.conversation as conversation
from harness.cli.chat import ChatClient, ChatCommand, CommandRun
from harness.cli.chat_view import entry_summary
from harness.cli.render import branch_oldest_first
from harness.cli.session_refs import local_time, named_sessions
from harness.cli.terminal_text import escape
from harness.conversation.commands import fork_conversation
from harness.conversation.projects import resolve_project_argument
from harness.errors import InvalidInput
from harness.runtime import DriveOutcome, Settled

if TYPE_CHECKING:  # gardens load at the first /goal, not each chat's start
    from harness.garden import Garden, GardenSetup

TREE_SHOWN = 40
"""How many of the branch's newest entries `/tree` lists."""


COMMANDS: dict[str, ChatCommand] = {}
"""Every built-in command by name (aliases included), in the order `/help` lists them."""


def command(name: str, usage: str, summary: str, *, while_busy: bool = False,
            aliases: tuple[str, ...] = ()) -> Callable[[CommandRun], CommandRun]:
    """Register the decorated function as `/name` (and its aliases) in `COMMANDS`."""

    def register(run: CommandRun) -> CommandRun:
        entry = ChatCommand(name, usage, summary, run, while_busy)
        for key in (name, *aliases):
            COMMANDS[key] = entry
        return run

    return register


def door_command(name: str, *, alone: str | None = None,
                 while_busy: bool = False) -> Callable[[CommandRun], CommandRun]:
    """Register the decorated function as `/name` of the conversation's command table
    (`conversation.BUILT_IN_COMMANDS`), with the usage and summary every door shows for it;
    `alone` says what the chat does for the command without its argument, which the table's
    command needs (`/model` alone shows the models)."""
    described = conversation.BUILT_IN_COMMANDS[name]
    usage, summary = described.usage, described.summary
    if alone is not None:
        usage, summary = f"/{name} [{usage.removeprefix(f'/{name} ')}]", f"{alone}, or {summary}"
    return command(name, usage, summary, while_busy=while_busy)


@command("help", "/help", "this list", while_busy=True)
async def _help(client: ChatClient, argument: str) -> None:
    seen: set[str] = set()
    for entry in client.commands.values():
        if entry.name not in seen:
            seen.add(entry.name)
            usage = escape(f"{entry.usage:<26}")  # pad first: escaping adds characters that do not show
            client.screen.print(f"  [bold]{usage}[/] {escape(entry.summary)}")
    client.screen.print("[dim]  Enter sends (during a turn: a steer message, read after the current step); "
                        "Alt-Enter sends a follow-up during a turn and starts a new line otherwise; Ctrl-C aborts "
                        "a turn, twice leaves at once; Ctrl-D leaves.[/]")


@door_command("model", alone="show the models", while_busy=True)
async def _model(client: ChatClient, argument: str) -> None:
    current = client.conversation.config(client.lane).model
    if argument:
        async def switch() -> None:
            outcome = await conversation.model(*client.command_door(), argument, client.context)
            if outcome.queued:  # its row waits for the turn's end, where it is placed: say so now
                client.screen.print(f"[dim]model {escape(outcome.model.spec)} queued: the next turn starts on it[/]")

        if client.turns.busy:  # queued behind the running turn, which ends on the model it started with
            client.beside_the_prompt(switch)
        else:
            await switch()
        return
    client.screen.print(f"model: [bold]{escape(current.spec)}[/]")
    for row in client.registry.configured():
        mark = "●" if row.identity == current else " "
        missing = f" [dim](set {escape(row.missing_key)})[/]" if row.missing_key else ""
        client.screen.print(f" {mark} {escape(row.identity.spec)}{missing}")


@command("thinking", "/thinking [level]", "show or set the thinking level", while_busy=True)
async def _thinking(client: ChatClient, argument: str) -> None:
    """Refuses a level the lane's model does not take, rather than let the lane keep it and each
    step send the nearest one (`Lane.set_thinking_level`): a person who asked for it is here to be told."""
    config = client.conversation.config(client.lane)
    name = config.model.spec
    levels = client.registry.model(config.model).thinking_levels()
    if not argument:
        client.screen.print(f"thinking: [bold]{config.thinking_level}[/] [dim](levels on "
                            f"{escape(name)}: {', '.join(levels)})[/]")
        return
    level = next((known for known in levels if known == argument), None)
    if level is None and levels == ("off",):
        raise InvalidInput(f"{name} does not think: its only thinking level is off (/model switches to one that "
                           "does)", level=argument)
    if level is None:
        raise InvalidInput(f"{name} takes the thinking levels {', '.join(levels)}, not {argument!r}", level=argument)
    await client.conversation.set_thinking_level(level, client.context, lane=client.lane)


@command("think", "/think", "collapse or expand the model's thinking", while_busy=True)
async def _think(client: ChatClient, argument: str) -> None:
    client.view.show_thinking = not client.view.show_thinking
    client.screen.print(f"[dim]thinking is {'shown' if client.view.show_thinking else 'collapsed'}[/]")


@door_command("rename", while_busy=True)
async def _rename(client: ChatClient, argument: str) -> None:
    if argument:
        await client.save_draft()  # a session worth naming is worth keeping
    await conversation.rename(*client.command_door(), argument, client.context)


@door_command("mode", alone="show the work mode (Shift+Tab toggles it)", while_busy=True)
async def _mode(client: ChatClient, argument: str) -> None:
    if not argument:
        client.screen.print(f"mode: [bold]{client.mode}[/] [dim](build: all of this session's tools; plan: the "
                            "read-only ones)[/]")
        return
    await conversation.mode(*client.command_door(), argument, client.context)


@door_command("tools", while_busy=True)
async def _tools(client: ChatClient, argument: str) -> None:
    await conversation.tools(*client.command_door(), argument or None, client.context)


@door_command("context", while_busy=True)
async def _context(client: ChatClient, argument: str) -> None:
    await conversation.show_context(*client.command_door(), argument or None, client.context)


@door_command("fast")
async def _fast(client: ChatClient, argument: str) -> None:
    try:
        await conversation.fast(*client.command_door(), argument or None, client.context)
    except conversation.NoFastModel as error:
        client.error(error)
        client.screen.print('[dim]name one in models.toml: fast = "provider/id"[/]')


@door_command("compact")
async def _compact(client: ChatClient, argument: str) -> None:
    if (notice := client.turns.model_notice()) is not None:  # the summary is the model's to write
        client.screen.print(f"[yellow]{escape(notice)}[/]")
        return

    async def compaction() -> DriveOutcome | None:
        outcome = await conversation.compact(*client.command_door(), argument or None, client.context)
        if outcome.result == "nothing_old_enough":
            return None  # its command row says so; no operation ran
        return await _last_settled(client)

    client.turns.start(compaction)


@command("goal", "/goal TEXT | pause ID", "give the garden a goal (it reports back here); /goal "
         "pause|resume|drop ID acts on one")
async def _goal(client: ChatClient, argument: str) -> None:
    """`/goal TEXT` starts the goal's kickoff turn; `/goal pause|resume|drop ID` (`goal_action_of`)
    starts none: its row says what it did. Of several gardens, an action goes to the one that holds
    its goal, and the person picks the one a new goal goes to (`_chosen_garden`)."""
    from harness.garden import GardenSetup, goal_action_of, goal_command

    await client.save_draft()  # the goal's origin, and the row of an action on it, must outlive the chat
    action = goal_action_of(argument)
    garden = await _chosen_garden(client, GardenSetup(store=client.store, service=client.attached.service,
                                                      models=client.registry), None if action is None else action[1])
    if garden is None:
        return
    if action is not None:
        await goal_command(garden)(*client.command_door(), argument, client.context)
        return

    async def kickoff() -> DriveOutcome | None:
        service, user, talk = client.command_door()
        await goal_command(garden)(service, user, talk, argument or None, client.context)
        return await _last_settled(client)

    client.turns.start(kickoff)


async def _chosen_garden(client: ChatClient, setup: GardenSetup, goal_id: str | None) -> Garden | None:
    """The garden `/goal` acts on (issue 33, item 12): the only one; of several, the one holding
    goal `goal_id` (an action's), else the one the person picks from their list, by number or
    name (None: Enter or Ctrl-C picked none). `InvalidInput` for an answer that names none."""
    from harness.cli.garden_commands import local_gardens  # gardens load at the first /goal, not each chat's start

    gardens = local_gardens(setup)
    holding = [garden for garden in gardens if any(goal.id == goal_id for goal in garden.goals())]
    if len(gardens) == 1 or len(holding) == 1:
        return (holding or gardens)[0]
    for number, garden in enumerate(gardens, 1):
        goals = len(garden.goals())
        client.screen.print(f"   [bold]{number:>3}[/] {escape(garden.name)} "
                            f"[dim]{goals} goal{'' if goals == 1 else 's'}[/]")
    answer = (await client.terminal.ask("which garden (number or name; Enter: none): ",
                                        f"{len(gardens)} gardens: the goal goes to the one you pick") or "").strip()
    if not answer:
        client.screen.print("[dim]no garden picked: nothing given[/]")
        return None
    for number, garden in enumerate(gardens, 1):
        if answer in (str(number), garden.name):
            return garden
    raise InvalidInput(f"no garden {answer!r} here: pick a number from 1 to {len(gardens)} or one of "
                       f"{', '.join(garden.name for garden in gardens)}", gardens=[garden.name for garden in gardens])


async def _last_settled(client: ChatClient) -> DriveOutcome | None:
    """The lane's last operation as settled: what a command that ran one through the conversation
    (`/compact`, `/goal`'s kickoff) hands `TurnControl.start` for its outcome row."""
    last = (await client.conversation.inspect(client.context, lane=client.lane)).last_result
    return Settled(operation_id=last.operation_id, result=last) if last is not None else None


@door_command("restart")
async def _restart(client: ChatClient, argument: str) -> None:
    await client.restart()


@command("sessions", "/sessions", "list the sessions in the store", while_busy=True)
async def _sessions(client: ChatClient, argument: str) -> None:
    current = client.conversation.id
    for info, name in await named_sessions(client.store, client.context):
        mark = "●" if info.id == current else " "
        fork = f" [dim](fork of {escape(info.parent_session_id)})[/]" if info.parent_session_id else ""
        client.screen.print(f" {mark} [cyan]{escape(info.id)}[/] [dim]{local_time(info.created_at)}[/] "
                            f"{escape(name or '')}{fork}")


@command("tree", "/tree [N]", "list this branch's entries and move to one (0: the start of the session)")
async def _tree(client: ChatClient, argument: str) -> None:
    tip = client.conversation.tip_id(client.lane)
    if tip is None:
        client.screen.print("[dim]the branch is empty[/]")
        return
    entries = await branch_oldest_first(client.conversation.journal, tip, client.context)
    client.listing = [entry.id for entry in entries]
    if not argument:
        # Going back before entry 1 is the way out of a session whose first entry is too large.
        client.screen.print("   [bold]  0[/] [dim]the start of the session (an empty branch)[/]")
        if len(entries) > TREE_SHOWN:
            client.screen.print(f"[dim]… {len(entries) - TREE_SHOWN} earlier entries[/]")
        for number, entry in enumerate(entries, 1):
            if number > len(entries) - TREE_SHOWN:
                mark = "●" if entry.id == tip else " "
                client.screen.print(f" {mark} [bold]{number:>3}[/] {entry_summary(entry)}")
        argument = (await client.terminal.ask("go to entry (number, 0 for the start; Enter stays): ",
                                               "the next prompt continues after the entry you pick") or "").strip()
        if not argument:
            return
    target = None if argument == "0" else _entry_id(client, argument)
    if target == tip:
        client.screen.print("[dim]already there[/]")
        return
    client.turns.start(lambda: client.conversation.navigate(target, client.context, lane=client.lane))


@command("fork", "/fork [N | ENTRY_ID]", "start a new session from an entry of this one (default: the last)")
async def _fork(client: ChatClient, argument: str) -> None:
    service, user, source = client.command_door()
    target = _entry_id(client, argument) if argument else source.tip_id(client.lane)
    if target is None:
        client.screen.print("[dim]nothing to fork: the branch is empty[/]")
        return
    forked = await fork_conversation(service, user, source.id, target, client.context, lane=client.lane)
    await client.switch_session(forked)
    client.screen.print(f"forked session [cyan]{escape(forked)}[/] at entry {escape(target)}; now chatting in it "
                        f"[dim](the original, {escape(source.id)}, keeps its branch as it is now)[/]")


@command("cd", "/cd [DIR]", "show or change this terminal's directory (the tools follow it unless in a project)")
async def _cd(client: ChatClient, argument: str) -> None:
    target = client.conversation.target
    if argument:
        moved_to = _directory(client.cwd, argument)
        os.chdir(moved_to)
        client.cwd = target.default = moved_to
        if target.selection is None:
            service, user, moved = client.command_door()
            # The model learns of the move from the row the person sees (nothing before anyone spoke, CE-13).
            await service.record_setting(user, moved.id, conversation.DirectoryMoved(path=str(moved_to)),
                                         client.context)
    client.screen.print(f"working directory: {escape(str(client.cwd))}")
    if target.selection is not None:  # a local move never changes the execution target (CE-19)
        client.screen.print(f"[dim]the tools stay in project {escape(target.selection.slug)} "
                            f"({escape(target.selection.path)}); /project switches it[/]")


@command("project", "/project [SLUG | ID]", "list the projects, or switch the one the tools work in", while_busy=True)
async def _project(client: ChatClient, argument: str) -> None:
    service, user, current = client.command_door()
    listed = service.list_switchable_projects(user)
    if not argument:
        if not listed:
            where = client.settings.home / conversation.PROJECTS_FILE
            client.screen.print(f"[dim]no projects to switch to: list them in {escape(str(where))}[/]")
            return
        selected = current.target.selection
        for row in listed:
            mark = "●" if selected is not None and selected.execution_ref == row.execution_ref else " "
            icon = f"{row.icon} " if row.icon else ""
            client.screen.print(f" {mark} [bold]{row.id:>3}[/] {escape(icon + row.slug)} [dim]{escape(row.path)}[/]")
        argument = (await client.terminal.ask("switch to (slug or id; Enter stays): ",
                                               "the tools work in the project you pick from the next call on") or ""
                    ).strip()
        if not argument:
            return
    chosen = resolve_project_argument(listed, argument)
    # Never a chdir: the terminal stays where it is, only the conversation's tools move (CE-21).
    await service.select_project_execution(user, current.id, chosen.execution_ref, client.context)
    client.screen.print(f"project: [bold]{escape(chosen.slug)}[/] [dim]the tools now work in {escape(chosen.path)}; "
                        f"this terminal stays in {escape(str(client.cwd))}[/]")


@command("resume", "/resume", "finish the lane's open operation (a stopped turn, a deferred reply)")
async def _resume(client: ChatClient, argument: str) -> None:
    await client.turns.resume_open()


@command("quit", "/quit", "leave (as Ctrl-D does)", aliases=("exit",))
async def _quit(client: ChatClient, argument: str) -> None:
    client.terminal.leave()


def _directory(base: Path, argument: str) -> Path:
    target = (base / Path(argument).expanduser()).resolve()
    if not target.is_dir():
        raise InvalidInput(f"{target} is not a directory", path=str(target))
    return target


def _entry_id(client: ChatClient, argument: str) -> str:
    """An entry id from a `/tree` number or an id as it is."""
    if argument.isdigit():
        number = int(argument)
        if not client.listing:
            raise InvalidInput("list the entries with /tree first, then pick a number")
        if not 1 <= number <= len(client.listing):
            raise InvalidInput(f"pick a number from 1 to {len(client.listing)}", number=number)
        return client.listing[number - 1]
    return argument
