"""The typer application that the command modules register on, and the options they share.

Every command module is imported to register its commands, so at the top a command module
imports only typer, the standard library, the journal (`harness.session`) and the small modules
under it; what a command runs (the conversation service, the runtime, the chat's terminal, the
tools, the server, gardens) it imports in its body. `harness --help` then starts in a third of
the time, and a command pays only for what it uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand
from typer.models import CommandFunctionType

from harness.context import Context
from harness.errors import HarnessError
from harness.home import STORE_VARIABLE
from harness.home import default_store_url as default_store_url  # the commands import it with the rest
from harness.session import Store, connect

T = TypeVar("T")

class HelpedCommand(TyperCommand):
    """A command whose help names each value by what it is: an option by its metavar (`--model
    MODEL`, `--root DIR`, set on every option that takes a value), an argument by its metavar alone
    (`SESSION`, where typer 0.29 prints `SESSION <str>`)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:  # typer's own click: Context, HelpFormatter
        arguments, options = [], []
        for param in self.get_params(ctx):
            if (record := param.get_help_record(ctx)) is None:
                continue
            if param.param_type_name == "argument":
                arguments.append((param.metavar or str(param.name), record[1]))
            else:
                options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


class _Typer(typer.Typer):
    """A typer application whose commands are `HelpedCommand`s unless told otherwise."""

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None,
                **settings: Any) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or HelpedCommand, **settings)


# Help is click's plain layout (rich_markup_mode=None), the one a maintained command line reads
# like: click rewraps each docstring paragraph and option help to the terminal, so a docstring's
# line breaks never show, and a flag shows no value (typer's Rich panels keep the docstrings'
# breaks and give every flag a `<bool>`). It spares `harness --help` importing Rich too.
app = _Typer(
    name="harness",
    help="Harness: a durable agent runtime. Every turn is journaled before anyone is told.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
)


def command_group(name: str, help: str) -> typer.Typer:
    """The group of sub-commands `harness NAME ...`, registered on the application and helped as
    it is (`help` is the group's one line in `harness --help`)."""
    group = _Typer(name=name, help=help, no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(group)
    return group


def _print_version(asked: bool) -> None:
    if asked:
        from harness import __version__

        typer.echo(f"harness {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print the installed version and exit.")] = False,
) -> None:
    """Harness: a durable agent runtime. Every turn is journaled before anyone is told."""

StoreOption = Annotated[
    str | None,
    typer.Option("--store", metavar="URL", help="Store URL (sqlite:///PATH or postgresql://...); default: SQLite under "
                 "$HARNESS_HOME.", envvar=STORE_VARIABLE),
]


def run_with_store(store_url: str | None, body: Callable[[Store, Context], Awaitable[T]], *,
                   pool_max: int | None = None) -> T:
    """Open the store (applying every journal data migration, CE-25; a PostgreSQL one pooling
    `pool_max` connections unless its URL says, `connect`), run `body`, close the store; a
    `HarnessError` becomes a one-line message with its code and exit status 1."""

    from harness.conversation import JOURNAL_DATA_MIGRATIONS

    async def go() -> T:
        context = Context({"cli": True})
        store = await connect(store_url or default_store_url(), context, data_migrations=JOURNAL_DATA_MIGRATIONS,
                              pool_max=pool_max)
        try:
            return await body(store, context)
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except HarnessError as error:
        typer.echo(f"error [{error.code}]: {error.message}", err=True)
        raise typer.Exit(1) from error
