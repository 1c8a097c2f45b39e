"""The `harness` command: the application with every command module registered on it."""

import typer

from harness.cli import (  # noqa: F401  (importing them registers their commands)
    commands,
    garden_commands,
    mcp_commands,
    serve_commands,
    session_commands,
    worker_commands,
)
from harness.cli.app import app


def main(typed: str = "") -> None:
    """Run `harness` on the process's arguments; `typed` is what the person typed at `harness
    chat`'s first prompt (`harness.chat_start`), for the chat's own prompt."""
    app(obj=typed)


def help_text(program: str) -> str:
    """What `program --help` prints for the application, as click lays it out for this terminal."""
    command = typer.main.get_command(app)
    with command.make_context(program, [], resilient_parsing=True) as context:
        return command.get_help(context) + "\n"


__all__ = ["app", "help_text", "main"]
