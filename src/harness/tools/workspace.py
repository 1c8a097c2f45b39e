"""The directory the built-in tools work in: path confinement, output limits and the files that
keep a truncated output whole."""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import JsonValue

from harness.errors import HarnessError


class PathOutsideWorkspace(HarnessError):
    """A tool was asked for a path outside its working directory (after `..` and symlinks are
    resolved) and the workspace does not allow that; details `{path, root}`."""

    code = "path_outside_workspace"


class ToolFailure(Exception):
    """A tool could not do what it was asked; its message is the error result the model reads."""


DEFAULT_MAX_CHARS = 30_000
DEFAULT_MAX_LINES = 2_000


@dataclass(frozen=True)
class Workspace:
    """Where the built-in tools work and how much of an output the model is sent.

    `root` is the working directory: relative paths are resolved against it, and with
    `allow_outside=False` (the default) every path must resolve inside it, `..` and symlinks
    followed first, so a link pointing out is refused like `../x` is. `read` may also open the
    files in `output_dir`, where outputs longer than `max_chars` characters or `max_lines` lines
    are kept whole (the model gets a truncated copy and a note naming the file). The shell tool
    runs with `root` as its working directory but is not confined by it: a shell can go anywhere,
    which is why it needs approval. `shell_timeout_s` is a shell command's default time limit and
    `max_shell_timeout_s` the most a call may ask for."""

    root: Path
    output_dir: Path
    allow_outside: bool = False
    max_chars: int = DEFAULT_MAX_CHARS
    max_lines: int = DEFAULT_MAX_LINES
    shell_timeout_s: float = 120.0
    max_shell_timeout_s: float = 1_800.0

    def __post_init__(self) -> None:
        # Confinement compares resolved paths, so the roots are resolved once here.
        object.__setattr__(self, "root", Path(self.root).expanduser().resolve())
        object.__setattr__(self, "output_dir", Path(self.output_dir).expanduser().resolve())

    # -- paths ------------------------------------------------------------------------------------

    def resolve(self, path: str, *, reading: bool = False) -> Path:
        """The absolute path `path` names (relative ones against `root`), symlinks resolved.

        Raises `PathOutsideWorkspace` when it falls outside `root` (or, with `reading`, outside
        `root` and `output_dir`) and the workspace does not allow that."""
        given = Path(path).expanduser()
        resolved = (given if given.is_absolute() else self.root / given).resolve()
        if self.allow_outside or _within(resolved, self.root) or (reading and _within(resolved, self.output_dir)):
            return resolved
        raise PathOutsideWorkspace(
            f"{path} is outside the working directory {self.root}; use a path inside it",
            path=path, root=str(self.root),
        )

    def show(self, path: Path) -> str:
        """`path` as tools report it: relative to `root` when inside it, else absolute."""
        if _within(path, self.root):
            relative = path.relative_to(self.root).as_posix()
            return relative or "."
        return str(path)

    # -- outputs ----------------------------------------------------------------------------------

    def new_output_file(self, tool_call_id: str, suffix: str = ".txt") -> Path:
        """A fresh file in `output_dir` for one call's full output (the directory is created)."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", tool_call_id)[:80] or "call"
        return self.output_dir / f"{safe}-{secrets.token_hex(4)}{suffix}"

    def limit(self, text: str, tool_call_id: str, *, keep: Literal["head", "tail"] = "head",
              full_output: Path | None = None, hint: str = "") -> LimitedOutput:
        """`text` cut to `max_lines` lines and `max_chars` characters, keeping its head or tail.

        When it is cut, the whole text is written to a new file in `output_dir` (unless
        `full_output` already holds it) and a note naming that file, and `hint` on how to see more,
        is appended to what the model reads."""
        cut, total_lines = _cut(text, self.max_lines, self.max_chars, keep)
        if cut is None:
            return LimitedOutput(text, truncated=False, full_output=full_output)
        if full_output is None:
            full_output = self.new_output_file(tool_call_id)
            full_output.write_text(text, encoding="utf-8", errors="replace")
        shown_lines = cut.count("\n") + (0 if cut.endswith("\n") or not cut else 1)
        which = "first" if keep == "head" else "last"
        note = (f"[output truncated: showing the {which} {shown_lines} of {total_lines} lines "
                f"({len(cut)} of {len(text)} characters); the full output is in {full_output}"
                f"{'; ' + hint if hint else ''}]")
        shown = f"{cut.rstrip(chr(10))}\n\n{note}" if keep == "head" else f"{note}\n\n{cut}"
        return LimitedOutput(shown, truncated=True, full_output=full_output)


@dataclass(frozen=True)
class LimitedOutput:
    """What the model is sent (`text`), whether it was cut, and the file holding all of it."""

    text: str
    truncated: bool
    full_output: Path | None

    def details(self) -> dict[str, JsonValue]:
        return {"truncated": self.truncated,
                "full_output": str(self.full_output) if self.full_output is not None else None}


def _within(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _cut(text: str, max_lines: int, max_chars: int, keep: Literal["head", "tail"]) -> tuple[str | None, int]:
    """The kept part of `text` (None when nothing had to go) and its total line count."""
    lines = text.splitlines(keepends=True)
    total = len(lines)
    if total <= max_lines and len(text) <= max_chars:
        return None, total
    kept = lines[:max_lines] if keep == "head" else lines[-max_lines:]
    joined = "".join(kept)
    if len(joined) > max_chars:
        if keep == "head":
            joined = joined[:max_chars]
            # Keep whole lines when at least one fits; a single huge line is cut mid-line.
            if "\n" in joined:
                joined = joined[: joined.rindex("\n") + 1]
        else:
            joined = joined[-max_chars:]
            if "\n" in joined[:-1]:
                joined = joined[joined.index("\n") + 1:]
    return joined, total


def is_binary(sample: bytes) -> bool:
    """True when `sample` (a file's first bytes) looks like binary data rather than text."""
    return b"\x00" in sample


def env_for_tools() -> dict[str, str]:
    """The environment a shell command runs in: this process's, with pagers and prompts off, since
    nobody can answer a pager or a prompt."""
    env = dict(os.environ)
    env.update({"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb", "GIT_TERMINAL_PROMPT": "0"})
    return env


def plural(count: int, noun: str) -> str:
    """`1 line`, `2 lines`: a count with its noun, plural unless the count is one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
