"""Project context: the project's instruction files (`AGENTS.md`, or `CLAUDE.md` where a directory
has no `AGENTS.md`), from the project's root down to the conversation's working directory, carried
in the system prompt of its `main` lane (issue 30).

The files are read when a turn is admitted, from the directory its tools run in (CE-19), so a
project switch changes which files apply from the next turn on. The root is the nearest directory
at or above the working directory that holds `.git`, else the working directory itself. At most a
limit of bytes of file content is read in all, root first; a file cut at the limit, or left out,
says so in the prompt.

Which files a turn reads (path, sha256, size, bytes included) is recorded only when that changes:
a hidden `harness.project-context` row, in the admission's own commit, right above the prompt. The
prompt text itself is a conversation value (`PROJECT_CONTEXT`), so a conversation reopened after a
crash sends the same system prompt its open turn started with.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from harness.conversation.chat_events import ContextFile, context_files_text, logger
from harness.conversation.recording import CONVERSATION_VALUES, MAIN_LANE
from harness.errors import HarnessError, ModelUnavailable
from harness.messages import CustomMessage, ModelIdentity
from harness.providers import ModelRegistry
from harness.runtime import SystemPrompt
from harness.runtime.settings import lane_system_prompt
from harness.session import addresses

AGENTS_FILE = "AGENTS.md"
CLAUDE_FILE = "CLAUDE.md"
"""Read in a directory that has no `AGENTS.md`."""

PROJECT_CONTEXT_BYTES = 32_768
"""The default limit on the bytes of instruction files one turn reads, all files together."""

PROJECT_CONTEXT_TYPE = "harness.project-context"
"""The custom type of the hidden row that records which instruction files the model reads."""

_CHUNK = 1 << 16


class ProjectContextOff(HarnessError):
    """`/context` was asked for, but this service reads no project context
    (`ConversationSetup.project_context_bytes` is None); nothing changed."""

    code = "project_context_off"


class ProjectContext(BaseModel):
    """The project context one turn reads: its `files`, root first, and `text`, the section of
    the system prompt that holds them ("" when no file applies)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: tuple[ContextFile, ...] = ()
    text: str = ""


PROJECT_CONTEXT = addresses.value_address(CONVERSATION_VALUES.namespace, "project_context", ProjectContext)
"""The project context the conversation's `main` lane reads now; none until a turn read a file."""


def instruction_files(directory: Path) -> list[Path]:
    """The instruction files that apply in `directory`, root first: in each directory from the
    project's root (the nearest one at or above `directory` holding `.git`, else `directory`)
    down to `directory`, its `AGENTS.md`, else its `CLAUDE.md`. None when `directory` is not one."""
    directory = directory.resolve()
    if not directory.is_dir():
        return []
    lineage = [directory, *directory.parents]
    root = next((index for index, folder in enumerate(lineage) if (folder / ".git").exists()), 0)
    found: list[Path] = []
    for folder in lineage[root::-1]:  # root first
        for name in (AGENTS_FILE, CLAUDE_FILE):
            if (folder / name).is_file():
                found.append(folder / name)
                break
    return found


async def read_project_context(directory: Path, limit_bytes: int) -> ProjectContext:
    """The project context of `directory` (`instruction_files`), at most `limit_bytes` of file
    content in all: the file that reaches the limit is cut at a character boundary, later ones
    are left out, and the text says so for each. A file that cannot be read is skipped (logged).
    Reads the files in a worker thread."""
    return await asyncio.to_thread(_read_context, directory, limit_bytes)


def _read_context(directory: Path, limit_bytes: int) -> ProjectContext:
    files: list[ContextFile] = []
    sections: list[str] = []
    room = limit_bytes
    for path in instruction_files(directory):
        try:
            file, text = _read_file(path, room)
        except OSError as error:
            logger.warning("project instruction file %s not read: %s", path, error)
            continue
        # A cut file ends the reading: what a character boundary left of the room is not a later file's.
        room = room - file.size if file.included == file.size else 0
        files.append(file)
        if file.included == file.size:
            sections.append(f"## {file.path}\n\n{text}")
        elif file.included:
            sections.append(f"## {file.path}\n\n{text}\n\n[Cut here: the file has {file.size:,} bytes, and only the "
                            f"first {file.included:,} fit within the project context limit of {limit_bytes:,}.]")
        else:
            sections.append(f"## {file.path}\n\n[Left out: the project context limit of {limit_bytes:,} bytes was "
                            f"reached before this file.]")
    if not files:
        return ProjectContext()
    text = "\n\n".join([
        "# Project instructions",
        "The instruction files of the project you work in, from its root down to the working directory; "
        "a deeper file is the more specific. Follow them.",
        *sections])
    return ProjectContext(files=tuple(files), text=text)


def _read_file(path: Path, room: int) -> tuple[ContextFile, str]:
    """`path`'s record (its whole content hashed) and the text of at most `room` bytes of it."""
    digest, head, size = hashlib.sha256(), bytearray(), 0
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if len(head) <= room:
                head += chunk[:room + 1 - len(head)]  # one byte past the room tells where a character ends
    cut = len(head) if len(head) <= room else _boundary(bytes(head), room)
    text = bytes(head[:cut]).decode("utf-8", errors="replace")
    return ContextFile(path=str(path), sha256=digest.hexdigest(), size=size, included=cut), text


def _boundary(data: bytes, at: int) -> int:
    """The largest cut at or before `at` that splits no UTF-8 character of `data`."""
    while at > 0 and data[at] & 0xC0 == 0x80:  # a continuation byte: the character began earlier
        at -= 1
    return at


def context_limit(cap_bytes: int, models: ModelRegistry | None, model: ModelIdentity) -> int:
    """How many bytes of instruction files a turn on `model` reads: `cap_bytes`, and no more
    bytes than the model's context window has tokens (about a quarter of the window), so a
    small model keeps room for the conversation. `cap_bytes` alone when `models` cannot say."""
    if models is None:
        return cap_bytes
    try:
        window = models.model(model).context_window
    except ModelUnavailable:
        return cap_bytes
    return min(cap_bytes, window)


def context_row(files: Sequence[ContextFile]) -> CustomMessage:
    """The hidden row that records which instruction files the model reads from here on: read by
    the model, drawn by no surface; its details `{v: 1, files: [ContextFile]}`."""
    said = context_files_text(files) if files else "No project instruction files apply any more."
    return CustomMessage(custom_type=PROJECT_CONTEXT_TYPE, display=False,
                         content=f"[The project instructions in your system prompt were read. {said}]",
                         details={"v": 1, "files": [file.model_dump(mode="json") for file in files]})


class ProjectContextPrompt:
    """The project context one live conversation's `main` lane reads now (`current`), added to
    its system prompt at each request; `cap_bytes` limits what a turn reads
    (`ConversationSettings` reads and records it at each admission)."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.current = ProjectContext()

    def system_prompt(self, base: SystemPrompt) -> SystemPrompt:
        """`base`, with the project context after it on the `main` lane."""

        def prompt(lane: str) -> str | None:
            text = lane_system_prompt(base, lane)
            if lane != MAIN_LANE or not self.current.text:
                return text
            return f"{text}\n\n{self.current.text}" if text else self.current.text

        return prompt
