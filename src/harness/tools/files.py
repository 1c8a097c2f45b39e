"""The file tools: read, write, edit, list and grep, each confined to the workspace."""

from __future__ import annotations

import asyncio
import difflib
import fnmatch
import io
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from pydantic import JsonValue

from harness.context import Context
from harness.messages import TextContent
from harness.runtime import ToolOutput
from harness.tools.ignored import GitIgnore
from harness.tools.workspace import PathOutsideWorkspace, ToolFailure, Workspace, is_binary, plural

SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache",
                          ".ruff_cache", ".pytest_cache", ".tox"})
"""Directories `list` (below the first level) and `grep` do not descend into: tool caches and
dependencies, rarely what a question is about and often huge."""

_SNIFF_BYTES = 8_192
_SKIP_CHUNK = 1_048_576
_GREP_MAX_FILE_BYTES = 10_000_000
_GREP_MAX_MATCHES = 5_000
_GREP_LINE_CHARS = 300
_LIST_MAX_ENTRIES = 10_000
_DIFF_CHARS = 20_000


def text_output(text: str, details: JsonValue = None, *, is_error: bool = False) -> ToolOutput:
    return ToolOutput(content=[TextContent(text=text)], details=details, is_error=is_error)


def _string(args: dict[str, JsonValue], name: str, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str):
        raise ToolFailure(f"`{name}` must be a string")
    return value


def _integer(args: dict[str, JsonValue], name: str, default: int | None) -> int | None:
    value = args.get(name, default)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ToolFailure(f"`{name}` must be an integer")


# -- read ---------------------------------------------------------------------------------------


async def read_file(workspace: Workspace, args: dict[str, JsonValue], context: Context) -> ToolOutput:
    """Lines `offset`.. (1-based) of a text file, at most `limit` lines and the workspace's
    character limit; the note on a partial read says how to continue (the file itself is the full
    output)."""
    path = workspace.resolve(_string(args, "path"), reading=True)
    offset = _integer(args, "offset", 1) or 1
    limit = min(_integer(args, "limit", workspace.max_lines) or workspace.max_lines, workspace.max_lines)
    return await asyncio.to_thread(_read, workspace, path, offset, limit, context)


def open_regular_file(path: Path) -> BinaryIO | None:
    """`path` opened for reading if it is a regular file, else None (a FIFO, socket or device).

    Opened without blocking and checked on the open descriptor, so a named pipe (whose open or
    read would wait for a writer forever) is never waited on, even if it replaced the file after
    a check by name."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _read(workspace: Workspace, path: Path, offset: int, limit: int, context: Context) -> ToolOutput:
    shown_path = workspace.show(path)
    if path.is_dir():
        raise ToolFailure(f"{shown_path} is a directory; use the list tool")
    raw = open_regular_file(path)
    if raw is None:
        raise ToolFailure(f"{shown_path} is not a regular file (a named pipe, socket or device); it is not read")
    with raw:
        if is_binary(raw.read(_SNIFF_BYTES)):
            size = os.fstat(raw.fileno()).st_size
            return text_output(f"{shown_path} is a binary file ({size} bytes); it is not shown",
                               {"path": shown_path, "binary": True, "bytes": size})
        raw.seek(0)
        return _read_lines(workspace, shown_path, raw, offset, limit, context)


def _read_lines(workspace: Workspace, shown_path: str, raw: BinaryIO, offset: int, limit: int,
                context: Context) -> ToolOutput:
    """The page of lines `offset`.. of `raw` and the file's line count (lines end with `\\n`).

    Lines outside the page are counted a megabyte at a time, not read one by one, and a line is
    read no further than the page can show: a kept shell output of 50 MB, one line or millions,
    is paged in a moment and in a few megabytes."""
    total = _skip_lines(raw, offset - 1, context)
    kept: list[str] = []
    chars, cut_line = 0, False
    widest = 4 * workspace.max_chars + 1  # bytes enough for `max_chars` characters and a line end
    while len(kept) < limit and chars < workspace.max_chars and (data := raw.readline(widest)):
        total += 1
        if not data.endswith(b"\n") and len(data) == widest:
            _skip_lines(raw, 1, context)  # the rest of a line too long to show
        line = data.decode("utf-8", errors="replace")
        room = workspace.max_chars - chars
        if len(line) > room:
            if kept:  # the next whole line does not fit: stop before it
                break
            line, cut_line = line[:room] + "\n", True
        kept.append(line)
        chars += len(line)
    total += _skip_lines(raw, sys.maxsize, context)
    if total == 0:
        return text_output(f"{shown_path} is empty", {"path": shown_path, "total_lines": 0, "truncated": False})
    if offset > total:
        raise ToolFailure(f"offset {offset} is past the end of {shown_path} ({total} lines)")
    last = offset + len(kept) - 1
    text = "".join(kept)
    notes = []
    if cut_line:
        notes.append(f"line {offset} is longer than {workspace.max_chars} characters and was cut")
    if last < total:
        notes.append(f"showing lines {offset}-{last} of {total}; continue with offset={last + 1}")
    if notes:
        text = f"{text.rstrip(chr(10))}\n\n[{'; '.join(notes)}]"
    details: dict[str, JsonValue] = {"path": shown_path, "first_line": offset, "last_line": last,
                                     "total_lines": total, "truncated": bool(notes)}
    return text_output(text, details)


def _skip_lines(raw: BinaryIO, count: int, context: Context) -> int:
    """Move past the next `count` lines of `raw` (a last line without a line end counts) and
    return how many there were: `count`, or fewer at the end of the file."""
    skipped, partial = 0, False
    while skipped < count:
        if context.cancelled:
            raise ToolFailure("cancelled")
        start = raw.tell()
        chunk = raw.read(_SKIP_CHUNK)
        if not chunk:
            return skipped + partial
        ends = chunk.count(b"\n")
        if skipped + ends >= count:
            at = -1
            for _ in range(count - skipped):
                at = chunk.index(b"\n", at + 1)
            raw.seek(start + at + 1)
            return count
        skipped += ends
        partial = not chunk.endswith(b"\n")
    return skipped


# -- write and edit -------------------------------------------------------------------------------


async def write_file(workspace: Workspace, args: dict[str, JsonValue], context: Context) -> ToolOutput:
    """Create or overwrite a file with `content`, creating missing parent directories."""
    path = workspace.resolve(_string(args, "path"))
    content = _string(args, "content")

    def write() -> ToolOutput:
        if path.is_dir():
            raise ToolFailure(f"{workspace.show(path)} is a directory")
        if path.exists() and not path.is_file():  # writing a named pipe waits for a reader forever
            raise ToolFailure(f"{workspace.show(path)} is not a regular file (a named pipe, socket or device)")
        created = not path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode("utf-8")
        path.write_bytes(data)
        lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
        verb = "Created" if created else "Overwrote"
        shown = workspace.show(path)
        return text_output(f"{verb} {shown}: {plural(len(data), 'byte')}, {plural(lines, 'line')}",
                           {"path": shown, "bytes": len(data), "created": created})

    return await asyncio.to_thread(write)


async def edit_file(workspace: Workspace, args: dict[str, JsonValue], context: Context) -> ToolOutput:
    """Replace `old_text` with `new_text` in a file: exactly one occurrence, or every one with
    `replace_all`. The text must match exactly, line endings included."""
    path = workspace.resolve(_string(args, "path"))
    old, new = _string(args, "old_text"), _string(args, "new_text")
    replace_all = args.get("replace_all", False) is True
    if not old:
        raise ToolFailure("`old_text` must not be empty; use the write tool to create a file")
    if old == new:
        raise ToolFailure("`old_text` and `new_text` are the same; nothing would change")

    def edit() -> ToolOutput:
        shown = workspace.show(path)
        if not path.is_file():
            raise ToolFailure(f"{shown} does not exist or is not a file")
        with path.open(encoding="utf-8", newline="") as file:
            before = file.read()
        count = before.count(old)
        if count == 0:
            raise ToolFailure(f"`old_text` was not found in {shown}; read the file and copy the text exactly")
        if count > 1 and not replace_all:
            raise ToolFailure(f"`old_text` occurs {count} times in {shown}; include more surrounding text so it "
                              "is unique, or set replace_all to replace every occurrence")
        line = before[: before.index(old)].count("\n") + 1
        after = before.replace(old, new) if replace_all else before.replace(old, new, 1)
        with path.open("w", encoding="utf-8", newline="") as file:
            file.write(after)
        diff = "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                            fromfile=shown, tofile=shown))
        replaced = count if replace_all else 1
        where = f"first at line {line}" if replaced > 1 else f"at line {line}"
        return text_output(f"Edited {shown}: replaced {plural(replaced, 'occurrence')}, {where}",
                           {"path": shown, "replacements": replaced, "line": line, "diff": diff[:_DIFF_CHARS]})

    return await asyncio.to_thread(edit)


# -- list ---------------------------------------------------------------------------------------


async def list_directory(workspace: Workspace, tool_call_id: str, args: dict[str, JsonValue],
                         context: Context) -> ToolOutput:
    """The entries of a directory, sorted, directories marked with a trailing `/`; with `depth` > 1
    their contents too (not descending into `SKIPPED_DIRS`). Entries git ignores are left out and
    counted in a note (see `_Tree`)."""
    path = workspace.resolve(_string(args, "path", "."), reading=True)
    depth = max(1, min(_integer(args, "depth", 1) or 1, 10))

    def listing() -> ToolOutput:
        shown = workspace.show(path)
        if not path.is_dir():
            raise ToolFailure(f"{shown} is not a directory")
        tree = _Tree(path, workspace.root, context)
        lines: list[str] = []
        complete = True
        for relative, entry, error in tree.entries(depth):
            if len(lines) >= _LIST_MAX_ENTRIES:
                complete = False
                break
            if error is not None:
                lines.append(f"{relative}[cannot list: {error}]")
            elif entry is not None:
                lines.append(f"{relative}{'/' if entry.is_dir(follow_symlinks=False) else ''}")
        ignored = _ignored_note(tree.ignored, "list")
        if not lines:
            return text_output(f"{shown} is empty{ignored}", {"path": shown, "entries": 0, "ignored": tree.ignored})
        text = "\n".join(lines)
        if not complete:
            text += f"\n[stopped after {_LIST_MAX_ENTRIES} entries]"
        limited = workspace.limit(text, tool_call_id, hint="list a subdirectory or use a smaller depth")
        return text_output(limited.text + ignored, {"path": shown, "entries": len(lines), "ignored": tree.ignored,
                                          **limited.details()})

    return await asyncio.to_thread(listing)


def _ignored_note(ignored: int, tool: str) -> str:
    if not ignored:
        return ""
    reach = "list a directory or read a file by naming it" if tool == "list" else "search one by giving it"
    return f"\n[{plural(ignored, 'path')} ignored by .gitignore not shown; {reach} as path]"


class _Tree:
    """The entries under directory `top`, as list and grep walk them: sorted by name, depth first,
    `SKIPPED_DIRS` listed but not entered, and symbolic links not followed into directories.

    What git ignores there (`.gitignore` files and `.git/info/exclude`, see `GitIgnore`; `root` is
    the workspace's, which bounds the rules read outside a repository) is left out and counted in
    `ignored`, an ignored directory once, not what it holds. When `top` itself is ignored nothing
    under it is: a path naming an ignored directory lists or searches it whole."""

    def __init__(self, top: Path, root: Path, context: Context) -> None:
        self.top, self._context = top, context
        self.ignored = 0
        rules = GitIgnore.in_directory(top, root)
        self._rules = GitIgnore() if rules.ignores(top, is_dir=True) else rules

    def entries(self, depth: int | None = None) -> Iterator[tuple[str, os.DirEntry[str] | None, str | None]]:
        """`(relative, entry, None)` for each entry at most `depth` levels down (None: all),
        `relative` its path from `top` with a trailing `/` between the parts, and
        `(prefix, None, error)` for a directory that could not be read."""
        yield from self._walk(self.top, "", 1, depth, self._rules)

    def _walk(self, directory: Path, prefix: str, level: int, depth: int | None,
              rules: GitIgnore) -> Iterator[tuple[str, os.DirEntry[str] | None, str | None]]:
        if self._context.cancelled:
            raise ToolFailure("cancelled")
        try:
            with os.scandir(directory) as scanned:
                children = sorted(scanned, key=lambda e: e.name)
        except OSError as error:
            yield prefix, None, error.strerror or str(error)
            return
        for child in children:
            is_dir = child.is_dir(follow_symlinks=False)
            path = Path(child.path)
            if rules.ignores(path, is_dir=is_dir):
                self.ignored += 1
                continue
            yield f"{prefix}{child.name}", child, None
            if is_dir and (depth is None or level < depth) and child.name not in SKIPPED_DIRS:
                yield from self._walk(path, f"{prefix}{child.name}/", level + 1, depth, rules.entering(path))


# -- grep ---------------------------------------------------------------------------------------


async def grep(workspace: Workspace, tool_call_id: str, args: dict[str, JsonValue], context: Context) -> ToolOutput:
    """Lines matching a regular expression in the files under `path` (or in one file), as
    `path:line:text`, files in sorted order, at most 5,000; `glob` filters file names; binary
    files, `SKIPPED_DIRS`, what git ignores (counted in a note, see `_Tree`) and, below a
    directory, files over 10 MB are skipped (a file named as `path`, such as a kept tool output
    or an ignored file, is searched whatever its size)."""
    pattern_text = _string(args, "pattern")
    flags = re.IGNORECASE if args.get("ignore_case") is True else 0
    try:
        pattern = re.compile(pattern_text, flags)
    except re.error as error:
        raise ToolFailure(f"`pattern` is not a valid regular expression: {error}") from error
    path = workspace.resolve(_string(args, "path", "."), reading=True)
    glob = args.get("glob")
    if glob is not None and not isinstance(glob, str):
        raise ToolFailure("`glob` must be a string")

    def search() -> ToolOutput:
        shown = workspace.show(path)
        if not path.exists():
            raise ToolFailure(f"{shown} does not exist")
        matches: list[str] = []
        not_regular: list[str] = []
        files = 0
        tree = _Tree(path, workspace.root, context) if path.is_dir() else None
        for file in [path] if tree is None else _files(tree, glob):
            try:  # a link inside the tree may point out of it: confinement applies to every file
                workspace.resolve(str(file), reading=True)
            except PathOutsideWorkspace:
                continue
            found = _grep_file(file, pattern, workspace.show(file), context, most=_GREP_MAX_MATCHES - len(matches),
                               any_size=file == path)
            if found is None:
                not_regular.append(workspace.show(file))
            elif found:
                files += 1
                matches.extend(found)
            if len(matches) >= _GREP_MAX_MATCHES:
                matches = matches[:_GREP_MAX_MATCHES]
                matches.append(f"[stopped after {_GREP_MAX_MATCHES} matches]")
                break
        ignored = 0 if tree is None else tree.ignored
        skipped = (f"\n[not searched: {len(not_regular)} named pipes, sockets or devices, such as "
                   f"{not_regular[0]}]" if not_regular else "") + _ignored_note(ignored, "grep")
        if not matches:
            return text_output(f"No matches for {pattern_text!r} in {shown}{skipped}",
                               {"path": shown, "matches": 0, "not_regular_files": len(not_regular),
                                "ignored": ignored})
        limited = workspace.limit("\n".join(matches), tool_call_id,
                                  hint="narrow the pattern, the path or the glob")
        details: dict[str, JsonValue] = {"path": shown, "matches": len(matches), "files": files,
                                         "not_regular_files": len(not_regular), "ignored": ignored,
                                         **limited.details()}
        return text_output(limited.text + skipped, details)

    return await asyncio.to_thread(search)


def _files(tree: _Tree, glob: str | None) -> Iterator[Path]:
    """The files `grep` searches under `tree.top`: every entry but directories and links to them."""
    for _, entry, _ in tree.entries():
        if entry is not None and not entry.is_dir() and (glob is None or fnmatch.fnmatch(entry.name, glob)):
            yield Path(entry.path)


def _grep_file(file: Path, pattern: re.Pattern[str], shown: str, context: Context, *, most: int,
               any_size: bool) -> list[str] | None:
    """The first `most` matching lines of `file` ([] for a binary file, or one over 10 MB unless
    `any_size`); None if it is not a regular file (never read: see `open_regular_file`)."""
    try:
        raw = open_regular_file(file)
        if raw is None:
            return None
        with raw:
            too_large = not any_size and os.fstat(raw.fileno()).st_size > _GREP_MAX_FILE_BYTES
            if too_large or is_binary(raw.read(_SNIFF_BYTES)):
                return []
            raw.seek(0)
            return _matches(io.TextIOWrapper(raw, encoding="utf-8", errors="replace"), pattern, shown, most, context)
    except OSError:
        return []  # unreadable files (permissions, vanished) are not matches


def _matches(text: io.TextIOWrapper, pattern: re.Pattern[str], shown: str, most: int,
             context: Context) -> list[str]:
    found: list[str] = []
    for number, line in enumerate(text, start=1):
        if len(found) >= most:  # a file of millions of matches is not collected whole
            break
        if number % 10_000 == 0 and context.cancelled:  # a kept output may have millions of lines
            raise ToolFailure("cancelled")
        if pattern.search(line):
            line = line.rstrip("\r\n")
            if len(line) > _GREP_LINE_CHARS:
                line = line[:_GREP_LINE_CHARS] + "…"
            found.append(f"{shown}:{number}:{line}")
    return found
