"""The directory the built-in tools work in: path confinement, output limits and the files that
keep a truncated output whole."""

from __future__ import annotations

import codecs
import contextlib
import contextvars
import fnmatch
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Literal

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
DEFAULT_MAX_KEPT_FILES = 100
DEFAULT_MAX_KEPT_BYTES = 1024 * 1024 * 1024

DEFAULT_ENV_DENY: tuple[str, ...] = (
    "*API_KEY*", "*APIKEY*", "*_KEY", "*ACCESS_KEY*", "*TOKEN", "*SECRET*", "*PASSWORD*", "*PASSWD*",
    "*CREDENTIAL*", "OPENAI_*", "ANTHROPIC_*",
)
"""The variables of this process a shell command does not inherit, as shell-style patterns over the
name, matched without regard to case: provider keys (`OPENAI_API_KEY`, `ANTHROPIC_*`, `GROQ_API_KEY`,
a `models.toml` key such as `GPU_BOX_KEY`), tokens (`GITHUB_TOKEN`, `AWS_SESSION_TOKEN`), secrets
and passwords (`AWS_SECRET_ACCESS_KEY`, `PGPASSWORD`) and credential files
(`GOOGLE_APPLICATION_CREDENTIALS`). A model that can run commands could otherwise print a key into
its context, or send it anywhere. `HARNESS_HOME` and `HARNESS_STORE` pass (a `harness` command in
the shell finds the same journal), as does `SSH_AUTH_SOCK` (git over ssh)."""


@dataclass(frozen=True)
class Workspace:
    """Where the built-in tools work and how much of an output the model is sent.

    `root` is the working directory: relative paths are resolved against it, and with
    `allow_outside=False` (the default) every path must resolve inside it, `..` and symlinks
    followed first, so a link pointing out is refused like `../x` is. `read` may also open the
    files in `output_dir`, where outputs longer than `max_chars` characters or `max_lines` lines
    are kept whole (the model gets a truncated copy and a note naming the file). Nobody asked for
    those files, so they do not pile up: `output_dir` keeps the newest `max_kept_files` of them,
    the oldest deleted when a new one is made until the rest take at most `max_kept_bytes`, and
    one output keeps at most `max_kept_bytes` (its note says so when the rest was not kept). The
    shell tool runs with `root` as its working directory but is not confined by it: a shell can
    go anywhere, which is why it needs approval. `shell_timeout_s` is a shell command's default
    time limit and `max_shell_timeout_s` the most a call may ask for. Shell commands inherit this
    process's environment except the variables `env_deny` names (shell-style patterns, case
    ignored; default `DEFAULT_ENV_DENY`), unless `env_allow` names them too: see `environment`."""

    root: Path
    output_dir: Path
    allow_outside: bool = False
    max_chars: int = DEFAULT_MAX_CHARS
    max_lines: int = DEFAULT_MAX_LINES
    max_kept_files: int = DEFAULT_MAX_KEPT_FILES
    max_kept_bytes: int = DEFAULT_MAX_KEPT_BYTES
    shell_timeout_s: float = 120.0
    max_shell_timeout_s: float = 1_800.0
    env_deny: tuple[str, ...] = DEFAULT_ENV_DENY
    env_allow: tuple[str, ...] = ()

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
        """A fresh file in `output_dir` for one call's full output (the directory is created),
        after deleting the oldest kept outputs beyond `max_kept_files` and `max_kept_bytes`."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._make_room()
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", tool_call_id)[:80] or "call"
        return self.output_dir / f"{safe}-{secrets.token_hex(4)}{suffix}"

    def _make_room(self) -> None:
        """Delete the oldest files of `output_dir` until, with the one about to be made, there are
        at most `max_kept_files` and the others take at most `max_kept_bytes`."""
        kept: list[tuple[float, int, str]] = []
        with os.scandir(self.output_dir) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):  # another process may be deleting it too
                    if entry.is_file(follow_symlinks=False):
                        info = entry.stat(follow_symlinks=False)
                        kept.append((info.st_mtime, info.st_size, entry.path))
        kept.sort(reverse=True)  # newest first
        total = 0
        for position, (_, size, path) in enumerate(kept):
            total += size
            if position + 1 >= self.max_kept_files or total > self.max_kept_bytes:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def limit(self, text: str, tool_call_id: str, *, hint: str = "") -> LimitedOutput:
        """`text` cut to `max_lines` lines and `max_chars` characters, keeping its head.

        When it is cut, the whole text is written to a new file in `output_dir` and a note naming
        that file, and `hint` on how to see more, is appended to what the model reads."""
        total_lines = _count_lines(text)
        if total_lines <= self.max_lines and len(text) <= self.max_chars:
            return LimitedOutput(text, truncated=False, full_output=None)
        full_output = self.new_output_file(tool_call_id)
        full_output.write_text(text, encoding="utf-8", errors="replace")
        cut = _cut(text, self.max_lines, self.max_chars, "head")
        note = _note("first", cut, total_lines, len(text), f"the full output is in {full_output}", hint)
        return LimitedOutput(f"{cut.rstrip(chr(10))}\n\n{note}", truncated=True, full_output=full_output)

    def capture(self, tool_call_id: str, suffix: str = ".txt") -> OutputCapture:
        """A capture of one call's output as it streams: see `OutputCapture`."""
        return OutputCapture(self, self.new_output_file(tool_call_id, suffix))

    def environment(self) -> dict[str, str]:
        """The environment a shell command runs in: this process's, without the variables
        `env_deny` matches and `env_allow` does not, plus `TOOL_ENVIRONMENT` (set on purpose by
        the code running the tools, so never filtered), with pagers and prompts off, since nobody
        can answer a pager or a prompt."""
        env = {name: value for name, value in os.environ.items() if self.passes(name)}
        env.update(TOOL_ENVIRONMENT.get() or {})
        env.update({"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb", "GIT_TERMINAL_PROMPT": "0"})
        return env

    def passes(self, variable: str) -> bool:
        """Whether a shell command inherits `variable`: `env_allow` matches it, or `env_deny` does not."""
        return _matches_any(variable, self.env_allow) or not _matches_any(variable, self.env_deny)

    def moved_to(self, root: Path) -> Workspace:
        """This workspace with `root` as its working directory (limits and `output_dir` kept)."""
        return replace(self, root=root)


class OutputCapture:
    """One call's output as it streams (`write` its bytes, then `finish`): every byte goes to a
    file in the workspace's `output_dir`, up to `max_kept_bytes`, and only the tail the model can
    be shown stays in memory (the last `max_chars` characters), with the whole output's counts
    (`bytes` so far). So memory stays a small multiple of what the model reads, however long the
    output."""

    def __init__(self, workspace: Workspace, path: Path) -> None:
        self._workspace = workspace
        self.path = path
        self._file: BinaryIO | None = path.open("wb")
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._tail = ""
        self._chars = 0
        self._newlines = 0
        self.bytes = 0
        self._kept_bytes = 0
        self._not_kept: str | None = None  # why the file holds only the output's beginning

    def write(self, chunk: bytes) -> None:
        """Add `chunk` of output: to the file, and to the counts and the tail."""
        self.bytes += len(chunk)
        self._keep(chunk)
        self._add(self._decoder.decode(chunk))

    def last(self, chars: int) -> str:
        """The last `chars` characters of the output so far (at most `max_chars` of them)."""
        return self._tail[-chars:]

    def finish(self, *, hint: str = "") -> LimitedOutput:
        """The output is over: what the model reads of it (`view`); when nothing was cut the
        file is deleted."""
        self._add(self._decoder.decode(b"", final=True))
        self._close()
        limited = self.view(hint=hint)
        if not limited.truncated:
            with contextlib.suppress(OSError):
                self.path.unlink()
        return limited

    def view(self, *, hint: str = "") -> LimitedOutput:
        """What the model reads of the output so far: its tail cut to `max_lines` lines and
        `max_chars` characters, after a note naming the file with all of it and `hint` on how to
        see more (no note when nothing was cut). The capture goes on."""
        workspace, text = self._workspace, self._tail
        total_lines = self._newlines + (0 if text.endswith("\n") or not text else 1)
        if total_lines <= workspace.max_lines and self._chars <= workspace.max_chars:
            return LimitedOutput(text, truncated=False, full_output=None)
        cut = _cut(text, workspace.max_lines, workspace.max_chars, "tail")
        where = f"the full output is in {self.path}"
        if self._not_kept is not None:
            kept = self.path.stat().st_size if self.path.exists() else 0
            where = f"only its first {kept:,} bytes are in {self.path} ({self._not_kept})"
        note = _note("last", cut, total_lines, self._chars, where, hint)
        return LimitedOutput(f"{note}\n\n{cut}", truncated=True, full_output=self.path)

    def close(self) -> None:
        """Close the file (kept as it is); `finish` closes it too."""
        self._close()

    def _add(self, text: str) -> None:
        self._chars += len(text)
        self._newlines += text.count("\n")
        # Joined then cut: a copy of at most `max_chars` plus one chunk, never of the output. One
        # character more than is shown, so a cut can tell a whole first line from a partial one.
        self._tail = (self._tail + text)[-(self._workspace.max_chars + 1):]

    def _keep(self, chunk: bytes) -> None:
        if self._file is None:
            return
        room = self._workspace.max_kept_bytes - self._kept_bytes
        try:
            self._file.write(chunk[:room])
            self._kept_bytes += min(len(chunk), room)
        except OSError as error:  # a full disk, say: the output goes on, only the file stops
            self._stop(f"writing more failed: {error.strerror or error}")
            return
        if len(chunk) > room:
            self._stop(f"{self._workspace.max_kept_bytes:,} bytes is the most one output keeps")

    def _stop(self, why: str) -> None:
        self._not_kept = why
        self._close()

    def _close(self) -> None:
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            file.close()
        except OSError as error:  # the last buffered bytes did not reach the disk
            self._not_kept = self._not_kept or f"writing more failed: {error.strerror or error}"


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


def _count_lines(text: str) -> int:
    """Lines as `\\n` ends them; a last line without one counts too."""
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def _cut(text: str, max_lines: int, max_chars: int, keep: Literal["head", "tail"]) -> str:
    """The first (or last) `max_lines` lines of `text`, then at most `max_chars` characters of
    them: whole lines when at least one fits, else one huge line cut mid-line. Found by searching
    for line ends, so a text of many short lines is never split into a list of them."""
    if keep == "head":
        end = 0
        for _ in range(max_lines):
            found = text.find("\n", end)
            if found < 0:
                end = len(text)
                break
            end = found + 1
        kept = text[:end]
        if len(kept) > max_chars:
            kept = kept[:max_chars]
            if "\n" in kept:
                kept = kept[: kept.rindex("\n") + 1]
        return kept
    start = len(text) - (1 if text.endswith("\n") else 0)
    for _ in range(max_lines):
        start = text.rfind("\n", 0, start)
        if start < 0:
            break
    kept = text[start + 1:]
    if len(kept) > max_chars:
        kept = kept[-max_chars:]
        if "\n" in kept[:-1]:
            kept = kept[kept.index("\n") + 1:]
    return kept


def _note(which: str, cut: str, total_lines: int, total_chars: int, where: str, hint: str) -> str:
    shown_lines = _count_lines(cut)
    return (f"[output truncated: showing the {which} {shown_lines} of {total_lines} lines "
            f"({len(cut)} of {total_chars} characters); {where}{'; ' + hint if hint else ''}]")


def is_binary(sample: bytes) -> bool:
    """True when `sample` (a file's first bytes) looks like binary data rather than text."""
    return b"\x00" in sample


TOOL_ENVIRONMENT: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "harness_tool_environment", default=None)
"""Variables added to the environment of the shell commands the current run starts (a garden's
driver sets its run context here); set around a drive, the run's tool tasks inherit it."""


def _matches_any(variable: str, patterns: tuple[str, ...]) -> bool:
    name = variable.upper()
    return any(fnmatch.fnmatchcase(name, pattern.upper()) for pattern in patterns)


def plural(count: int, noun: str) -> str:
    """`1 line`, `2 lines`: a count with its noun, plural unless the count is one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
