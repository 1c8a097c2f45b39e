"""The `harness` command."""

from harness.cli.app import app, main

__all__ = ["app", "main"]
