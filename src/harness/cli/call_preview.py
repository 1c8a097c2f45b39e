"""What a `write` or `edit` call would change, shown to the person before they approve it."""

from __future__ import annotations

import difflib
from pathlib import Path

from pydantic import JsonValue

from harness.cli.terminal_text import escape

PREVIEW_LINES = 30
"""At most this many lines of content or diff are shown; the rest is counted."""
_READ_LIMIT = 1_000_000  # bytes of an existing file compared; a bigger one is not diffed


def call_preview(root: Path, tool_name: str, args: dict[str, JsonValue]) -> list[str]:
    """Rich-markup rows showing what the call would write: the content of a new file, or a
    unified diff against the file as it is now (for an edit, or a write over an existing file).
    Empty for other tools and for arguments the tool itself would refuse."""
    path, content = args.get("path"), args.get("content")
    if not isinstance(path, str):
        return []
    target = (root / Path(path).expanduser()).resolve()
    before = _current(target)
    if tool_name == "write" and isinstance(content, str):
        if before is None:
            return _clipped([f"[green]{escape(line)}[/]" for line in content.splitlines()], "new file")
        return _diff(path, before, content)
    old, new = args.get("old_text"), args.get("new_text")
    if tool_name == "edit" and isinstance(old, str) and isinstance(new, str) and old:
        if before is None or old not in before:
            before = old  # the tool will refuse; still show what was asked
        replace_all = args.get("replace_all", False) is True
        return _diff(path, before, before.replace(old, new) if replace_all else before.replace(old, new, 1))
    return []


def _current(target: Path) -> str | None:
    try:
        if not target.is_file() or target.stat().st_size > _READ_LIMIT:
            return None
        with target.open(encoding="utf-8", newline="") as file:
            return file.read()
    except (OSError, UnicodeDecodeError):
        return None


def _diff(path: str, before: str, after: str) -> list[str]:
    rows = []
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), fromfile=path, tofile=path,
                                     lineterm=""):
        colour = ("bold" if line.startswith(("---", "+++")) else "cyan" if line.startswith("@@")
                  else "green" if line.startswith("+") else "red" if line.startswith("-") else "dim")
        rows.append(f"[{colour}]{escape(line)}[/]")
    return _clipped(rows, "diff")


def _clipped(rows: list[str], what: str) -> list[str]:
    shown = [f"  {row}" for row in rows[:PREVIEW_LINES]]
    if len(rows) > PREVIEW_LINES:
        shown.append(f"  [dim]… {len(rows) - PREVIEW_LINES} more lines of the {what}[/]")
    return [f"[dim]  ({what}, {len(rows)} line{'' if len(rows) == 1 else 's'})[/]", *shown]
