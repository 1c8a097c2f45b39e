"""A garden's runtime root on disk: where each file of a garden lives, and the two ways anything
is written there (a whole file replaced at once, a whole line appended under a lock).

Every path is built here, from names checked first (`check_name`), and every write checks that the
path it writes resolves inside the runtime root, so nothing is ever written outside it (issue 15,
item 7).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import JsonValue

from harness.errors import InvalidInput
from harness.home import harness_home

NameKind = Literal["garden name", "goal id", "run id", "emission id"]

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


def name_problem(kind: NameKind, value: object) -> str | None:
    """Why `value` is not a valid `kind` (None when it is): a garden name is 1 to 63 of `a-z 0-9 _
    -`, starting with a letter or digit; an id 1 to 128 of `A-Z a-z 0-9 _ -`. Neither can hold a
    path separator, `.` or `..`, so either is safe as one path segment."""
    pattern = _NAME if kind == "garden name" else _ID
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        allowed = "a-z, 0-9, _ and -" if kind == "garden name" else "A-Z, a-z, 0-9, _ and -"
        return f"a {kind} is 1 to {63 if kind == 'garden name' else 128} of {allowed}, not {value!r}"
    return None


def check_name(kind: NameKind, value: str) -> str:
    """`value` if it is a valid `kind` (see `name_problem`); else `InvalidInput`."""
    if (problem := name_problem(kind, value)) is not None:
        raise InvalidInput(problem, **{kind.replace(" ", "_"): value})
    return value


def default_root(name: str) -> Path:
    """`$HARNESS_HOME/gardens/<name>/`, a garden's runtime root unless it was given another."""
    return harness_home() / "gardens" / check_name("garden name", name)


REPLY_SURFACE = "inbox/{garden}"
"""The reply folder, relative to the runtime root: transcript-backed delivery copies only (OM-5)."""

NOTE_SURFACE = "inbox/{garden}/notes"
"""The notes folder, relative to the runtime root: out-of-band notes (OM-4)."""


@dataclass(frozen=True)
class RuntimeRoot:
    """The files of garden `name` under `path`:

    - `garden.json`: the garden (its gardener, owner and session);
    - `goals/<goal-id>.json`: one goal each;
    - `runs/<run-id>/operator-messages.jsonl`: the run's operator-message records (OM-2);
    - `inbox/<name>/`: reply copies; `inbox/<name>/notes/`: notes (OM-4, OM-5);
    - `events.jsonl`: the garden's event feed.
    """

    name: str
    path: Path

    def __post_init__(self) -> None:
        check_name("garden name", self.name)
        object.__setattr__(self, "path", Path(self.path).expanduser().resolve())

    @property
    def garden_file(self) -> Path:
        return self.path / "garden.json"

    @property
    def goals_dir(self) -> Path:
        return self.path / "goals"

    def goal_file(self, goal_id: str) -> Path:
        return self.goals_dir / f"{check_name('goal id', goal_id)}.json"

    def records_file(self, run_id: str) -> Path:
        return self.path / "runs" / check_name("run id", run_id) / "operator-messages.jsonl"

    @property
    def reply_dir(self) -> Path:
        return self.path / REPLY_SURFACE.format(garden=self.name)

    @property
    def notes_dir(self) -> Path:
        return self.path / NOTE_SURFACE.format(garden=self.name)

    @property
    def events_file(self) -> Path:
        return self.path / "events.jsonl"

    def relative(self, path: Path) -> str:
        """`path` relative to the root, `/`-separated, as records carry it."""
        return self.inside(path).relative_to(self.path).as_posix()

    def inside(self, path: Path) -> Path:
        """`path` resolved, if it lies inside the root; `InvalidInput` otherwise (a symlink out
        counts as out)."""
        resolved = path.resolve()
        if not resolved.is_relative_to(self.path):
            raise InvalidInput(f"{path} is outside the garden's runtime root {self.path}", path=str(path))
        return resolved

    # -- writes -------------------------------------------------------------------------------------

    def write_file(self, path: Path, text: str) -> None:
        """Replace `path` with `text` at once (a temporary file beside it, flushed, then renamed
        over it), so a reader sees the old file or the new one, never half of either. Raises
        `OSError` when the disk refuses, `InvalidInput` for a path outside the root."""
        target = self.inside(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.inside(target.parent)  # a parent that is a symlink out is refused too
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def write_json(self, path: Path, value: JsonValue) -> None:
        self.write_file(path, json.dumps(value, ensure_ascii=False, indent=2) + "\n")

    def append_line(self, path: Path, line: JsonValue, *,
                    already: Callable[[dict[str, JsonValue]], bool] | None = None) -> dict[str, JsonValue] | None:
        """Append `line` as one JSON line to `path`, whole or not at all, and return None; or,
        when a line already there satisfies `already`, append nothing and return that line.

        The file is locked (`flock`) for the whole call, so concurrent appenders, in this process
        or others, never interleave bytes; a last line a crash left torn (no newline at its end)
        is cut off before the append, so the file holds only whole lines. The line is written with
        one `write` and flushed to disk before the lock is released. Blocking: call it off the
        event loop. Raises `OSError` when the disk refuses (nothing of the line is left then,
        unless the disk failed mid-write, which the next append repairs)."""
        target = self.inside(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.inside(target.parent)
        data = (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        descriptor = os.open(target, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            existing = _read_all(descriptor)
            whole = existing[: existing.rfind(b"\n") + 1]
            if len(whole) != len(existing):
                os.ftruncate(descriptor, len(whole))  # a torn last line: a crash cut it mid-write
            if already is not None:
                for known in _json_lines(whole):
                    if already(known):
                        return known
            written = os.write(descriptor, data)
            if written != len(data):
                os.ftruncate(descriptor, len(whole))
                raise OSError(f"short write to {target}: {written} of {len(data)} bytes")
            os.fsync(descriptor)
            return None
        finally:
            os.close(descriptor)  # closing releases the lock


def read_lines(path: Path) -> list[dict[str, JsonValue]]:
    """The whole JSON-object lines of `path` (none when it does not exist); a torn last line, or a
    line that is not a JSON object, is left out."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return _json_lines(data[: data.rfind(b"\n") + 1])


def _read_all(descriptor: int) -> bytes:
    os.lseek(descriptor, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(descriptor, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _json_lines(data: bytes) -> list[dict[str, JsonValue]]:
    lines = []
    for raw in data.splitlines():
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            lines.append(value)
    return lines
