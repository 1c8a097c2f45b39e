"""`harness --help` and every command's help read like a maintained command line's (issue 33,
item 10): each docstring paragraph and option help is rewrapped to the terminal, so no line
breaks where the next word would still fit; no value shows typer's type label (`<bool>` on a
flag, `<str>`, `<path>`, `<int range>`), each is named for what it is (`--model MODEL`); and each
command's line in a listing is a whole first sentence, not one cut with `...`. In process,
through typer's CliRunner, at 80 columns.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from harness.__main__ import help_cache, main
from harness.cli import app

WIDTH = 78
"""Click wraps help to the terminal's width, at most 80 columns, less 2."""


def command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """`path` and the path of every command under it (a group's commands are in `commands`)."""
    return [path, *(each for name, sub in getattr(command, "commands", {}).items()
                    for each in command_paths(sub, (*path, name)))]


def broken_early(line: str, following: str) -> bool:
    """Whether `following` continues `line`'s text (it starts at a column where a run of `line`'s
    text starts, and is no new option or table row) although its first word would have fit on
    `line`."""
    text = following.strip()
    indent = len(following) - len(following.lstrip())
    if not text or indent == 0 or text.startswith("-") or "  " in text or len(line) <= indent:
        return False
    if line[indent - 1] != " " or line[indent] == " ":
        return False
    return len(line.rstrip()) + 1 + len(text.split()[0]) <= WIDTH


TYPE_LABEL = re.compile(r"<(?:bool|str|int|float|path|list\[\w+\])(?: range)?>")
"""How typer 0.29 labels a value it has no metavar for."""


def test_every_commands_help_is_wrapped_to_the_terminal_and_names_its_values() -> None:
    paths = command_paths(typer.main.get_command(app))
    assert ("garden", "goal") in paths  # the walk reaches the commands of groups
    faults = []
    for path in paths:
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
        assert shown.exit_code == 0, (path, shown.output)
        lines = shown.output.splitlines()
        faults += [f"harness {' '.join(path)}: {line.strip()!r} shows a type, not a name" for line in lines
                   if TYPE_LABEL.search(line)]
        faults += [f"harness {' '.join(path)}: {line.strip()!r} ends before {following.split()[0]!r}"
                   for line, following in itertools.pairwise(lines) if broken_early(line, following)]
        faults += [f"harness {' '.join(path)}: {line.strip()!r} is cut" for line in lines
                   if line.endswith("...") and not line.startswith("Usage:")]
    assert not faults, "\n".join(faults)


def test_help_is_printed_from_its_cache_without_loading_the_application(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 33, item 13: `harness --help` prints what the application printed the first time for
    this version, source and width, without importing typer, pydantic or any command; the text
    kept for another version or source is removed."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "help-0.0.1-1-78.txt").write_text("an older version's help\n")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(sys, "argv", ["harness", "--help"])
    main()
    first = capsys.readouterr().out
    probe = ("import sys; sys.argv = ['harness', '--help']; from harness.__main__ import main; main(); "
             "print(sorted({'typer', 'pydantic', 'harness.cli'} & set(sys.modules)))")

    again = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60,
                           env={**os.environ, "HARNESS_HOME": str(tmp_path), "COLUMNS": "80"})

    assert first == CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}).output
    assert again.stdout == f"{first}[]\n"
    assert [kept.name for kept in (tmp_path / "cache").iterdir()] == [Path(help_cache()).name]


def option_help(command: str, option: str) -> str:
    """What `harness COMMAND --help` says of `option`, its lines joined (typer's plain help, as above)."""
    lines = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80"}).output.splitlines()
    start = next(at for at, line in enumerate(lines) if line.strip().startswith(option))
    said = [lines[start].strip().removeprefix(option).strip()]
    for line in lines[start + 1:]:
        if not line.strip() or line.strip().startswith("-"):
            break
        said.append(line.strip())
    return " ".join(" ".join(said).split())


def test_chat_and_run_say_the_same_default_model() -> None:
    """Issue 33: `chat --help` left out models.toml's default that `run --help` named; both say the
    one order the registry follows (`providers.models`), the OPENAI_BASE_URL server's models too."""
    chat, run = option_help("chat", "--model"), option_help("run", "--model")

    assert chat == run
    assert ("the lane's model, else models.toml's default, else a model the OPENAI_BASE_URL server lists, else the "
            "first built-in model whose API key is set, else embedded/smollm2-135m") in chat
