"""Readable terminal rendering of journal entries."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import JsonValue
from rich.console import Console, RenderableType
from rich.text import Text

from harness.cli.chat_rows import SHELL_ROW_LINES, chat_row, delegation_row, garden_row
from harness.cli.terminal_text import escape, markdown
from harness.context import Context
from harness.conversation import (
    CHAT_EVENT_TYPE,
    GARDEN_MESSAGE_TYPE,
    MESSAGE_BLOCKS_TYPE,
    SUBAGENT_RESULT_TYPE,
    delegation_rows,
)
from harness.conversation.garden_messages import garden_message_of
from harness.conversation.service import chat_event_rows
from harness.messages import (
    AssistantMessage,
    CustomMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
)
from harness.session import Entry, SessionReader, UnknownLane, addresses

_PAGE = 500
SHOW_LIMIT = 400
"""The characters of one text `harness show` prints unless told `--full`."""
_CUSTOM_LIMIT = 200


@dataclass
class Clip:
    """Cuts texts longer than `limit` characters (None: none), counting how many it cut."""

    limit: int | None
    cut: int = 0

    def __call__(self, text: str) -> str:
        if self.limit is None or len(text) <= self.limit:
            return text
        self.cut += 1
        return f"{text[:self.limit]}… [{len(text) - self.limit} more characters]"


def _user_content(content: str | list[UserContent], clip: Clip) -> str:
    if isinstance(content, str):
        return clip(content)
    parts = [
        clip(block.text) if isinstance(block, TextContent) else f"[image {block.mime_type}]"
        for block in content
        if isinstance(block, TextContent | ImageContent)
    ]
    return "\n".join(parts)


def entry_lines(entry: Entry, limit: int | Clip | None) -> list[RenderableType]:
    """Rows for one entry: rich markup, and a reply's text as Markdown; outside text is made
    visible (`terminal_text`), and text longer than `limit` characters is clipped (a `Clip` counts
    the texts it cut)."""
    clip = limit if isinstance(limit, Clip) else Clip(limit)
    payload = entry.payload
    match payload.type:
        case "message":
            message = payload.message
            if isinstance(message, UserMessage):
                return [f"[bold cyan]user[/]: {escape(_user_content(message.content, clip))}"]
            if isinstance(message, ToolResultMessage):
                status = "[red]error[/]" if message.is_error else "ok"
                text = escape(_user_content(message.content, clip))
                return [f"  [magenta]← {escape(message.tool_name)}[/] {status}: {text}"]
            return _assistant_lines(message, clip)
        case "custom_message":
            custom: CustomMessage = payload.message
            if custom.custom_type == CHAT_EVENT_TYPE:  # worded from its details; an unknown shape shows nothing (CE-5)
                shell_lines = None if clip.limit is None else SHELL_ROW_LINES
                return [chat_row(row.details, shell_lines=shell_lines) for row in chat_event_rows([entry])]
            if custom.custom_type == GARDEN_MESSAGE_TYPE:  # from the garden; an unknown shape shows nothing
                garden = garden_message_of(custom)
                return [garden_row(garden.model_copy(update={"text": clip(garden.text)}))] if garden else []
            if custom.custom_type == SUBAGENT_RESULT_TYPE:  # hidden: drawn only as its delegation row (CE-18)
                return [delegation_row(row.finish) for row in delegation_rows([entry])]
            text = escape(_user_content(custom.content, clip))
            return [f"[yellow]\\[{escape(custom.custom_type)}][/] {text}"]
        case "custom":
            if payload.custom_type == MESSAGE_BLOCKS_TYPE:
                return []  # cards are for surfaces that draw them; the terminal shows the reply alone (CE-24)
            return [f"[dim]({escape(payload.custom_type)}){_custom_data(payload.data)}[/]"]
        case "compaction":
            return [
                f"[bold yellow]── compaction ({payload.tokens_before} tokens before, "
                f"{len(payload.retained_tail)} messages kept) ──[/]",
                f"[dim]{escape(clip(payload.summary))}[/]",
            ]
        case "branch_summary":
            return [f"[bold yellow]── branch summary ──[/] [dim]{escape(clip(payload.summary))}[/]"]


def _custom_data(data: JsonValue) -> str:
    """A short readable form of a custom entry's data: its `text` when it has one (e.g. an imported
    command's output, which a person saw), else compact JSON; clipped, since the model never reads it."""
    if data is None:
        return ""
    text = data.get("text") if isinstance(data, dict) else None
    shown = text if isinstance(text, str) else json.dumps(data, ensure_ascii=False)
    return " " + escape(Clip(_CUSTOM_LIMIT)(shown))


def _assistant_lines(message: AssistantMessage, clip: Clip) -> list[RenderableType]:
    head = f"[bold green]assistant[/] [dim]({escape(message.provider)}/{escape(message.model)}"
    head += f", {message.stop_reason})[/]"
    lines: list[RenderableType] = [head]
    for block in message.content:
        if isinstance(block, TextContent) and block.text.strip():
            lines.append(markdown(clip(block.text)))
        elif isinstance(block, ThinkingContent):
            text = "[redacted thinking]" if block.redacted else clip(block.thinking)
            lines.append(f"[dim]{escape(text)}[/]")
        elif isinstance(block, ToolCall):
            sent = block.raw_arguments if block.raw_arguments is not None else json.dumps(block.arguments,
                                                                                          ensure_ascii=False)
            args = clip(sent)  # as the model sent them: text that was not a JSON object stays text
            lines.append(f"  [magenta]→ {escape(block.name)}[/] {escape(args)}")
    if message.error_message and message.stop_reason != "aborted":  # the head says it; the `interrupted` row why
        lines.append(f"[red]{escape(message.error_message)}[/]")
    return lines


async def branch_oldest_first(session: SessionReader, tip: str, context: Context) -> list[Entry]:
    """Every entry of the branch ending at `tip`, root first, read page by page."""
    newest_first: list[Entry] = []
    before: str | None = tip
    while before is not None:
        page = await session.read_branch(tip, context, before=before, limit=_PAGE)
        newest_first.extend(page.entries)
        before = page.next_before
    return newest_first[::-1]


async def print_branch(
    session: SessionReader, lane: str, context: Context, *, limit: int | None = SHOW_LIMIT,
    console: Console | None = None,
) -> None:
    """Print the lane's branch, root first, ending at its last line of text, texts longer than
    `limit` characters cut (None: whole) and a last line saying how many were and how to see them
    whole; raises `UnknownLane` if the lane does not exist."""
    console = console or Console(highlight=False, emoji=False)
    record = await session.get_record(addresses.branch_tip(lane), context)
    if record is None:
        raise UnknownLane(f"session {session.id} has no lane {lane}", lane=lane)
    name = await session.get(addresses.session_name(), context)
    # The name is free text: the separator keeps it from running into the lane ("notes · lane main").
    console.print(f"[bold]{escape(name or session.id)}[/] [dim]· lane {escape(lane)}[/]")
    if record.value is None:
        console.print("[dim](empty branch)[/]")
        return
    # Blank lines are held until text follows them: a reply's Markdown ends with the padding rich
    # puts under a code block or a table, which must not trail the output.
    blank: list[str] = []
    clip = Clip(limit)
    for entry in await branch_oldest_first(session, record.value, context):
        for line in entry_lines(entry, clip):
            with console.capture() as captured:
                console.print(line)
            for row in captured.get().splitlines(keepends=True):
                if not Text.from_ansi(row).plain.strip():
                    blank.append(row if console.is_terminal else "\n")
                    continue
                # Without a terminal, the padding rich puts around a code block is only spaces.
                console.file.write("".join(blank) + (row if console.is_terminal else row.rstrip() + "\n"))
                blank = []
    if clip.cut:
        texts = "text was" if clip.cut == 1 else "texts were"
        lane_option = "" if lane == "main" else f" --lane {escape(lane)}"
        console.print(f"[dim]({clip.cut} {texts} cut at {limit} characters: `harness show {session.id}{lane_option} "
                      "--full` shows them whole)[/]", soft_wrap=True)
    console.file.flush()
