"""The `harness` command: the application with every command module registered on it."""

from harness.cli import (  # noqa: F401  (importing them registers their commands)
    commands,
    garden_commands,
    mcp_commands,
    serve_commands,
    session_commands,
    worker_commands,
)
from harness.cli.app import app


def main() -> None:
    """Run `harness` on the process's arguments."""
    app()


__all__ = ["app", "main"]
