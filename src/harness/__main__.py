"""The `harness` command's entry (and `python -m harness`): `--version` is answered here, before
the application is loaded, and so is `--help` once it has been printed for this version, source and
terminal width; anything else runs `harness.cli`. `harness chat` in a terminal draws its first
prompt (`harness.chat_start`) before the application loads, and runs it with what was typed there.

Loading the application (typer, pydantic, every command's options) takes a third of a second, about
twenty-five bare Python starts; `harness --version` needs none of it, and `harness --help` needs it
once: its text is kept in the help cache (`help_cache`) and printed from there after.
"""

from __future__ import annotations

import os
import sys

HELP_ARGS = (["--help"], ["-h"])


def main() -> None:
    """Run `harness` on the process's arguments."""
    args = sys.argv[1:]
    if args == ["--version"]:
        from harness import __version__

        print(f"harness {__version__}")
        return
    cache = help_cache() if args in HELP_ARGS and os.path.basename(sys.argv[0]) == "harness" else None
    if cache is not None:
        try:
            with open(cache, encoding="utf-8") as kept:
                sys.stdout.write(kept.read())
            return
        except OSError:
            pass  # not printed yet for this key: the application writes it, and it is kept
        from harness.cli import help_text

        text = help_text("harness")
        _keep(cache, text)
        sys.stdout.write(text)
        return
    typed = ""
    if args[:1] == ["chat"] and not {"--help", "-h"} & set(args) and sys.stdin.isatty() and sys.stdout.isatty():
        from harness.chat_start import typed_while_loading

        typed = typed_while_loading(_load_chat)
    from harness.cli import main as run_cli

    run_cli(typed)


def _load_chat() -> None:
    """Import what `harness chat` runs: the application, and the chat's modules."""
    import importlib

    from harness.cli.commands import CHAT_MODULES

    for name in CHAT_MODULES:
        importlib.import_module(name)


def help_cache() -> str:
    """The file `harness --help` is kept in: under `$HARNESS_HOME/cache`, else the user's cache
    folder (`$XDG_CACHE_HOME/harness`, `~/.cache/harness`), named for what the text depends on:
    the version, the newest change to the command modules (an edited docstring is a new text) and
    the width click wraps to (the terminal's, at most 80 columns, less 2). Reads only the
    modules' folder, with `os`: no import this start would not make anyway."""
    from harness import __version__

    home = os.environ.get("HARNESS_HOME")
    folder = (os.path.join(home, "cache") if home
              else os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "harness"))
    commands = os.path.join(os.path.dirname(__file__), "cli")
    changed = max(entry.stat().st_mtime_ns for entry in os.scandir(commands) if entry.name.endswith(".py"))
    return os.path.join(folder, f"help-{__version__}-{changed}-{_help_width()}.txt")


def _help_width() -> int:
    # As click's HelpFormatter sizes help (`shutil.get_terminal_size`, without importing shutil).
    stdout = sys.__stdout__
    try:
        columns = int(os.environ.get("COLUMNS", "0")) or (os.get_terminal_size(stdout.fileno()).columns if stdout
                                                          else 80)
    except (ValueError, OSError):
        columns = 80
    return max(min(columns or 80, 80) - 2, 50)


def _keep(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all (a rename), and remove the help kept for another
    version or source; as best it can: a home that cannot be written to leaves the help uncached,
    not failed."""
    folder, name = os.path.split(path)
    current = name.rsplit("-", 1)[0]  # help-VERSION-CHANGED, whatever the width
    try:
        os.makedirs(folder, exist_ok=True)
        partial = f"{path}.{os.getpid()}"
        with open(partial, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(partial, path)
        for entry in os.scandir(folder):
            if entry.name.startswith("help-") and not entry.name.startswith(f"{current}-"):
                os.remove(entry.path)
    except OSError:
        pass


if __name__ == "__main__":
    main()
