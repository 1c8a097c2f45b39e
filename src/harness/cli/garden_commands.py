"""`harness garden`: make a garden, give it goals, tend it once or keep it tending, and read its
inbox (replies and notes, apart, OM-5)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.app import StoreOption, command_group, default_store_url, run_with_store
from harness.cli.terminal_text import visible
from harness.context import Context
from harness.errors import InvalidInput
from harness.home import harness_home
from harness.messages import ModelIdentity
from harness.session import Store

# Gardens and the conversation service under them are imported where a command runs them (see
# `harness.cli.app`).
if TYPE_CHECKING:
    from harness.garden import Garden, GardenEvent, GardenSetup, GoalType

garden_app = command_group("garden", "Gardens: goals pursued by a background agent, the gardener.")

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The garden's name (a-z, 0-9, _ and -).")]
RootOption = Annotated[Path | None, typer.Option(
    "--root", metavar="DIR", help="The garden's runtime root (default: $HARNESS_HOME/gardens/NAME).")]


def garden_setup(store: Store, store_url: str | None) -> GardenSetup:
    """What a garden runs with from the terminal: the models of `models.toml` and the keys set, and
    a conversation service on the same journal."""
    from harness.conversation import ConversationService, ConversationSetup
    from harness.garden import GardenSetup
    from harness.providers import ModelRegistry

    registry = ModelRegistry.load(home=harness_home())
    service = ConversationService(store, ConversationSetup(models=registry))
    return GardenSetup(store=store, service=service, models=registry, store_url=store_url or default_store_url())


def open_garden(name: str, store: Store, store_url: str | None, root: Path | None) -> Garden:
    """Garden `name` (at `root`, default its place under $HARNESS_HOME) with `garden_setup`."""
    from harness.garden import Garden

    return Garden.open(name, garden_setup(store, store_url), root=root)


def local_gardens(setup: GardenSetup) -> list[Garden]:
    """The gardens `/goal` gives goals to: those at their default roots, by name; `InvalidInput`
    when there is none."""
    from harness.garden import Garden, garden_names

    names = garden_names()
    if not names:
        raise InvalidInput(f"/goal gives goals to a garden under {harness_home() / 'gardens'}; there is none: "
                           "`harness garden create NAME` makes one", gardens=[])
    return [Garden.open(name, setup) for name in names]


@garden_app.command("create")
def create(
    name: NameArgument,
    model: Annotated[str | None, typer.Option(
        metavar="MODEL", help="The gardener's model, provider/id (default: the default model).")] = None,
    instructions: Annotated[str, typer.Option(
        metavar="TEXT", help="The gardener's instructions (its system prompt).")] = "",
    tools: Annotated[list[str] | None, typer.Option(
        "--tool", metavar="TOOL", help="A built-in tool the gardener may use, in the root's work/ folder "
                                       "(repeatable).")] = None,
    root: RootOption = None,
    store: StoreOption = None,
) -> None:
    """Make a garden; its messages go to your conversations."""
    from harness.cli.config import local_user
    from harness.garden import Garden, Gardener

    async def body(s: Store, context: Context) -> None:
        setup = garden_setup(s, store)
        assert setup.models is not None
        identity = ModelIdentity.parse(model) if model else setup.models.default_identity()
        gardener = Gardener(model=identity, instructions=instructions, builtin_tools=tuple(tools or ()))
        garden = await Garden.create(name, gardener, setup, context, owner=local_user(), root=root)
        typer.echo(f"garden {garden.name} at {garden.root.path} (gardener on {identity.spec})")

    run_with_store(store, body)


@garden_app.command("delete")
def delete(
    name: NameArgument,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking (required without a terminal).")]
    = False,
    root: RootOption = None,
    store: StoreOption = None,
) -> None:
    """Delete a garden for good. Its goals, runs, inbox and journal go (refused while it is tended
    or served); the messages it sent stay in your conversations."""
    if not yes and not sys.stdin.isatty():
        raise typer.BadParameter("nobody can be asked without a terminal: pass --yes to delete", param_hint="--yes")

    async def body(s: Store, context: Context) -> int:
        garden = open_garden(name, s, store, root)
        goals = len(garden.goals())
        if not yes and not typer.confirm(f"delete garden {name} at {garden.root.path} and its {goals} goals?",
                                         default=False):
            typer.echo("nothing deleted", err=True)
            return 1
        await garden.delete(context)
        typer.echo(f"deleted garden {name}", err=True)
        return 0

    raise typer.Exit(run_with_store(store, body))


@garden_app.command("goal")
def goal(
    name: NameArgument,
    text: Annotated[str, typer.Argument(metavar="TEXT", help="The goal, in words.")],
    goal_type: Annotated[str, typer.Option(
        "--type", metavar="TYPE", help="tend (recurs) or durable (until concluded).")] = "durable",
    every: Annotated[float | None, typer.Option(metavar="SECONDS", help="A tend goal's schedule, in seconds.")] = None,
    root: RootOption = None,
    store: StoreOption = None,
) -> None:
    """Give a garden a goal with no conversation behind it. `/goal` in a chat gives one with."""
    if goal_type not in ("tend", "durable"):
        raise typer.BadParameter("a goal given here is tend or durable; a converse goal comes from a conversation",
                                 param_hint="--type")
    chosen: GoalType = "tend" if goal_type == "tend" else "durable"

    async def body(s: Store, context: Context) -> None:
        garden = open_garden(name, s, store, root)
        added = await garden.add_goal(chosen, text, context, every_s=every)
        typer.echo(added.id)

    run_with_store(store, body)


@garden_app.command("goals")
def goals(name: NameArgument, root: RootOption = None, store: StoreOption = None) -> None:
    """List a garden's goals: id, type, status, text."""

    async def body(s: Store, context: Context) -> None:
        for listed in open_garden(name, s, store, root).goals():
            typer.echo(f"{listed.id}  {listed.type:<8} {listed.status:<7} {listed.title}")

    run_with_store(store, body)


@garden_app.command("tend")
def tend(name: NameArgument, root: RootOption = None, store: StoreOption = None) -> None:
    """Tend a garden once, now. It tends every active tend goal and every open durable or converse one."""

    async def body(s: Store, context: Context) -> None:
        garden = open_garden(name, s, store, root)
        try:
            for event in await garden.tend(context):
                typer.echo(event_line(event))
        finally:
            await garden.close(context)
            await garden.setup.service.close_all(context)

    run_with_store(store, body)


@garden_app.command("serve")
def serve(
    name: NameArgument,
    poll: Annotated[float, typer.Option(metavar="SECONDS", help="Seconds between looks for new goals.")] = 30.0,
    root: RootOption = None,
    store: StoreOption = None,
) -> None:
    """Keep a garden tending until Ctrl-C. Each tend goal runs on its schedule; runs left open by
    Ctrl-C are resumed by the next tending."""

    async def body(s: Store, context: Context) -> None:
        garden = open_garden(name, s, store, root)
        typer.echo(f"tending {garden.name} (Ctrl-C stops); its events: {garden.root.events_file}")
        try:
            await garden.serve(context, poll_s=poll)
        finally:
            await garden.close(context)
            await garden.setup.service.close_all(context)

    try:
        run_with_store(store, body)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@garden_app.command("inbox")
def inbox(name: NameArgument, root: RootOption = None, store: StoreOption = None) -> None:
    """List a garden's inbox. The replies (copies of what it said in conversations) and, apart,
    its notes (what it said to nobody in particular)."""

    async def body(s: Store, context: Context) -> None:
        garden = open_garden(name, s, store, root)
        for title, folder in (("replies", garden.root.reply_dir), ("notes", garden.root.notes_dir)):
            files = sorted(folder.glob("*.md")) if folder.is_dir() else []
            typer.echo(f"{title} ({garden.root.relative(folder)}/): {len(files)}")
            for path in files:
                first = next((line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()), "")
                typer.echo(f"  {path.name}  {visible(first[:100])}")

    run_with_store(store, body)


def event_line(event: GardenEvent) -> str:
    """One line for a run's end: the goal, the run, how it ended, and a tend run's note."""
    from harness.garden import RunFinished, TendFinished

    if isinstance(event, TendFinished):
        note = event.operator_note_path or "in the conversation" if event.operator_note_written else "no note"
        return f"tend {event.goal_id} run {event.run_id}: {event.status}; {note}"
    if isinstance(event, RunFinished):
        return f"{event.goal_type} {event.goal_id} run {event.run_id}: {event.status}"
    return f"goal {event.goal_id}: {event.status}"
