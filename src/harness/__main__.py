"""The `harness` command's entry (and `python -m harness`): `--version` is answered here, before
the application is loaded; anything else runs `harness.cli`.

Loading the application (typer, pydantic, every command's options) takes a third of a second, about
twenty-five bare Python starts; `harness --version` needs none of it.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run `harness` on the process's arguments."""
    if sys.argv[1:] == ["--version"]:
        from harness import __version__

        print(f"harness {__version__}")
        return
    from harness.cli import main as run_cli

    run_cli()


if __name__ == "__main__":
    main()
