"""The LangGraph Agent Server's wire shapes, from harness facts: journal entries as LangChain message
dicts, a run's items as stream parts per stream mode, and the event ids a client resumes from.

Pure functions and one renderer per connection; the routes in `langgraph_api` feed them.

A run's stream is a list of durable items (the run's acceptance, each entry it placed on the
branch, each reply that ended off it, its settlement: its `run_start`, `entry_added`, a
`message_end` no `entry_added` follows, and `run_end` in the lane's event log) with live
presentation between them (the reply streaming after an item). An event id is the position of one
part in that stream, `"{s}-{L}-{j}"`: part `j` of the durable item whose event seq is `s` (`L` =
0), or the live reply after item `s` through its `L`th character (`j` = 0), or that reply's
retraction (`j` = 1). Ids only grow, every part has one, and the stream after any id can be
rebuilt from the lane's event log and its snapshot, so a client resuming after the last id it saw
gets no gap and no duplicate.

A reply's chunks carry the id of the entry the reply is written under (reserved before its
request is sent, HA-24), the same id `values` and `updates` show for it. An attempt that fails and
is asked again (a retryable provider error, or a restart that cut it off) is kept as a side entry
under its own id, which `values` never shows, and the next attempt streams under a new one: so a
client that had chunks of the dropped attempt gets a LangChain `remove` message for its id (as a
graph node removes a message; LangGraph's `add_messages` reducer drops it), the thread's `values`
again, and then the next attempt from its first character.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from pydantic import JsonValue

from harness.errors import HarnessError
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
    text_of,
)
from harness.runtime import EntryAdded, HarnessEvent, MessageEnd, RunEnd, RunStart
from harness.runtime.events import event_lane
from harness.server.sse import json_text
from harness.session import (
    BranchSummaryPayload,
    CompactionPayload,
    CustomMessagePayload,
    Entry,
    LaneLastResult,
    MessagePayload,
)

StreamMode: TypeAlias = Literal["values", "updates", "messages-tuple"]

STREAM_MODES: tuple[StreamMode, ...] = ("values", "updates", "messages-tuple")
"""The stream modes this door serves: `values` (the thread's messages after each placed entry),
`updates` (each placed message under the node that made it: `agent`, `tools` or `input`) and
`messages-tuple` (the reply token by token as `[chunk, metadata]` pairs, tool results whole)."""

REFUSED_STREAM_MODES = ("messages", "events", "debug", "tasks", "checkpoints", "custom", "tools", "lifecycle")
"""Modes a LangGraph server knows and this door refuses (`StreamModeUnsupported`): they describe a
graph's nodes, checkpoints and callbacks, which a harness run does not have; `messages` (partial and
complete messages) is served as `messages-tuple`."""

MultitaskStrategy: TypeAlias = Literal["reject", "enqueue", "interrupt"]

MULTITASK_STRATEGIES: tuple[MultitaskStrategy, ...] = ("reject", "enqueue", "interrupt")
"""How a run asked for while the thread is busy is taken: `reject` refuses it (409 `lane_busy`),
`enqueue` queues its input as a follow-up of the open run (answered inside that run), `interrupt`
aborts the open run durably and starts the new one once it has settled. `rollback` is refused
(`RollbackUnsupported`)."""

NODE_OF_ROLE = {"assistant": "agent", "tool_result": "tools", "user": "input", "custom": "input"}
"""The node an `updates` part names for each message role."""


class StreamModeUnsupported(HarnessError):
    """A run asked for a stream mode this door does not serve; nothing was started. Details:
    `stream_mode`, `supported`."""

    code = "stream_mode_unsupported"


class RollbackUnsupported(HarnessError):
    """`rollback` (as a multitask strategy or a cancel action) asks to delete a run as if it never
    happened; the harness never deletes what it journaled, so it is refused and nothing changed.
    `interrupt` stops the run durably and keeps what it did."""

    code = "rollback_unsupported"


class MultitaskStrategyUnknown(HarnessError):
    """A multitask strategy LangGraph does not define; nothing was started."""

    code = "multitask_strategy_unknown"


class InvalidEventId(HarnessError):
    """A `Last-Event-ID` this door never sent; nothing was streamed. Details: `event_id`."""

    code = "invalid_event_id"


def stream_modes(requested: str | Sequence[str] | None) -> tuple[StreamMode, ...]:
    """The stream modes of a run request, in the order the door emits them; `values` when none is
    asked. Raises `StreamModeUnsupported` for any other mode."""
    asked = [requested] if isinstance(requested, str) else list(requested or ["values"])
    for mode in asked:
        if mode not in STREAM_MODES:
            supported: list[JsonValue] = [*STREAM_MODES]
            raise StreamModeUnsupported(
                f"stream mode {mode!r} is not served here; use one of {', '.join(STREAM_MODES)}",
                stream_mode=str(mode)[:80], supported=supported)
    return tuple(mode for mode in STREAM_MODES if mode in asked)


def multitask_strategy(requested: str | None) -> MultitaskStrategy:
    """The multitask strategy of a run request (`reject` when none is asked). Raises
    `RollbackUnsupported` for `rollback`, `MultitaskStrategyUnknown` for a name LangGraph does not
    define."""
    if requested is None:
        return "reject"
    if requested == "rollback":
        raise RollbackUnsupported("multitask strategy 'rollback' would delete the open run; the harness keeps "
                                  "every run it journaled: use 'interrupt' to stop it durably instead")
    for strategy in MULTITASK_STRATEGIES:
        if requested == strategy:
            return strategy
    raise MultitaskStrategyUnknown(f"unknown multitask strategy {requested[:80]!r}; use one of "
                                   f"{', '.join(MULTITASK_STRATEGIES)}", multitask_strategy=requested[:80])


# -- event ids ------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Cursor:
    """A position in a run's stream (see the module docstring): after part `part` of the durable
    item whose event seq is `item`, and `live` characters of the reply streaming after that item."""

    item: int
    live: int = 0
    part: int = 0

    @property
    def event_id(self) -> str:
        return f"{self.item}-{self.live}-{self.part}"


START = Cursor(0, 0, 0)
"""Before the first part of a run."""


def parse_event_id(event_id: str) -> Cursor:
    """The cursor an event id names. Raises `InvalidEventId` for text this door never sends."""
    pieces = event_id.split("-")
    # ASCII digits: `isdigit` alone takes "¹", which `int` refuses.
    if len(pieces) != 3 or not all(piece.isascii() and piece.isdigit() and len(piece) <= 12 for piece in pieces):
        raise InvalidEventId(f"event id {event_id[:80]!r} was not sent by this server", event_id=event_id[:80])
    item, live, part = (int(piece) for piece in pieces)
    return Cursor(item, live, part)


# -- messages -------------------------------------------------------------------------------------


def langchain_message(entry: Entry) -> dict[str, JsonValue] | None:
    """The entry as a LangChain message dict (`type` `human`, `ai`, `tool`, `system` or `chat`),
    with the entry id as its `id`; None for an entry the model never reads (application state)."""
    payload = entry.payload
    if isinstance(payload, MessagePayload | CustomMessagePayload):
        message = payload.message
        if isinstance(message, UserMessage):
            return {"type": "human", "id": entry.id, "content": _content(message.content)}
        if isinstance(message, AssistantMessage):
            return _ai_message(entry.id, message)
        if isinstance(message, ToolResultMessage):
            return {"type": "tool", "id": entry.id, "content": _content(message.content),
                    "tool_call_id": message.tool_call_id, "name": message.tool_name,
                    "status": "error" if message.is_error else "success"}
        if isinstance(message, CustomMessage):
            return {"type": "chat", "id": entry.id, "role": message.custom_type, "content": _content(message.content)}
    if isinstance(payload, CompactionPayload | BranchSummaryPayload):
        return {"type": "system", "id": entry.id, "content": payload.summary}
    return None


def _content(content: str | Sequence[UserContent]) -> JsonValue:
    if isinstance(content, str):
        return content
    blocks: list[JsonValue] = []
    for block in content:
        if isinstance(block, TextContent):
            blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageContent):
            blocks.append({"type": "image_url", "image_url": {"url": f"data:{block.mime_type};base64,{block.data}"}})
    if all(isinstance(block, dict) and block.get("type") == "text" for block in blocks):
        return "".join(str(block["text"]) for block in blocks if isinstance(block, dict))
    return blocks


def _ai_message(message_id: str, message: AssistantMessage) -> dict[str, JsonValue]:
    return {
        "type": "ai", "id": message_id, "content": _text_of(message),
        "additional_kwargs": _reasoning(_thinking_of(message)),
        "tool_calls": [_tool_call(call) for call in message.tool_calls],
        "invalid_tool_calls": [],
        **_metadata_of(message),
    }


def _metadata_of(message: AssistantMessage) -> dict[str, JsonValue]:
    """The `usage_metadata` and `response_metadata` of a reply, whole or as its final chunk."""
    usage = message.usage
    return {
        "usage_metadata": {"input_tokens": usage.input, "output_tokens": usage.output,
                           "total_tokens": usage.total_tokens},
        "response_metadata": {"model_provider": message.provider, "model_name": message.model,
                              "finish_reason": message.stop_reason},
    }


def _tool_call(call: ToolCall) -> dict[str, JsonValue]:
    return {"type": "tool_call", "id": call.id, "name": call.name, "args": dict(call.arguments)}


def _reasoning(thinking: str) -> dict[str, JsonValue]:
    # The key OpenAI-compatible LangChain integrations put a reply's reasoning under.
    return {"reasoning_content": thinking} if thinking else {}


def _text_of(message: AssistantMessage) -> str:
    return text_of(message.content)


def _thinking_of(message: AssistantMessage) -> str:
    return "".join(block.thinking for block in message.content
                   if isinstance(block, ThinkingContent) and not block.redacted)


def streamed_chars(message: AssistantMessage) -> int:
    """How many characters of `message` a `messages-tuple` client has once it was streamed whole:
    its thinking, then its text (tool calls come whole with the reply's entry)."""
    return len(_thinking_of(message)) + len(_text_of(message))


def _chunk_after(message_id: str, message: AssistantMessage, seen: int, *, final: bool) -> dict[str, JsonValue] | None:
    """The `AIMessageChunk` dict carrying what a client that has `seen` characters of `message`
    lacks; None when that is nothing. The `final` chunk also carries the tool calls and usage."""
    thinking, text = _thinking_of(message), _text_of(message)
    new_thinking = thinking[seen:]
    new_text = text[max(0, seen - len(thinking)):]
    calls = message.tool_calls if final else []
    if not (new_thinking or new_text or calls or final):
        return None
    chunk: dict[str, JsonValue] = {
        "type": "AIMessageChunk", "id": message_id, "content": new_text,
        "additional_kwargs": _reasoning(new_thinking),
        "tool_call_chunks": [{"type": "tool_call_chunk", "id": call.id, "name": call.name,
                              "args": call.raw_arguments if call.raw_arguments is not None
                              else json_text(call.arguments), "index": index}
                             for index, call in enumerate(calls)],
    }
    return {**chunk, **_metadata_of(message)} if final else chunk


# -- a run's stream -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunAccepted:
    """The first durable item of every run: it was accepted (its `run_start`, event `seq`)."""

    seq: int


@dataclass(frozen=True)
class EntryPlaced:
    """The run placed `entry` on the branch (committed; its `entry_added`, event `seq`)."""

    entry: Entry
    seq: int


@dataclass(frozen=True)
class RunSettled:
    """The run settled; `result` is the lane's last result it wrote (its `run_end`, event `seq`)."""

    result: LaneLastResult
    seq: int


@dataclass(frozen=True)
class ReplyDropped:
    """A reply the run streamed ended off the branch, as the side entry `entry_id` (`values` never
    shows it): its attempt failed and is asked again, or gave way to a compaction (its
    `message_end`, event `seq`, that no `entry_added` of it follows)."""

    entry_id: str
    seq: int


RunItem: TypeAlias = RunAccepted | EntryPlaced | ReplyDropped | RunSettled


class RunItems:
    """Picks run `run_id`'s durable items out of lane `lane`'s logged events, fed to `take` in
    the log's order (the log read first, then the watch after it): its `run_start`, each
    `entry_added` after it, each reply it dropped and its `run_end`. A reply's `message_end` says
    where it went only with the event after it (its `entry_added`, or anything else when it stays
    off the branch), which is logged in the same commit."""

    def __init__(self, run_id: str, lane: str) -> None:
        self.run_id = run_id
        self.lane = lane
        self.started = False
        self._ended: ReplyDropped | None = None  # a reply's `message_end`, until the next event

    def take(self, event: HarnessEvent) -> list[RunItem]:
        """The run's items `event` completes, in order; none for an event that is not logged
        (`event_seq` None), of another lane or run, or before the run's start."""
        seq = event.event_seq
        if seq is None or event_lane(event) != self.lane:
            return []
        if not self.started:
            self.started = isinstance(event, RunStart) and event.operation_id == self.run_id
            return [RunAccepted(seq)] if self.started else []
        items: list[RunItem] = []
        ended, self._ended = self._ended, None
        if ended is not None and not (isinstance(event, EntryAdded) and event.entry.id == ended.entry_id):
            items.append(ended)
        if isinstance(event, EntryAdded):
            items.append(EntryPlaced(event.entry, seq))
        elif isinstance(event, MessageEnd) and isinstance(event.message, AssistantMessage) \
                and event.entry_id is not None:
            self._ended = ReplyDropped(event.entry_id, seq)
        elif isinstance(event, RunEnd) and event.operation_id == self.run_id:
            items.append(RunSettled(event.result, seq))
        return items


RUN_STATUS = {"completed": "success", "failed": "error", "aborted": "interrupted"}
"""A settled run's LangGraph status, by the harness outcome."""


@dataclass(frozen=True)
class Part:
    """One SSE event of a run's stream: `id:`, `event:` and the JSON `data`."""

    id: str
    event: str
    data: JsonValue


@dataclass
class RunStream:
    """Renders one run's stream for one connection that resumes after `cursor` (`START`: all of it).

    Feed it the run's durable items in order (`item`) and the live reply between them (`live`);
    each returns the parts the client lacks. `before` is the thread's messages before the run, for
    `values`."""

    run_id: str
    thread_id: str
    modes: tuple[StreamMode, ...]
    before: Sequence[Entry] = ()
    cursor: Cursor = START
    _last: int = 0
    _live_seen: int = 0
    _retracted: bool = False  # the client has the retraction of the live reply after `_last`
    _state: list[dict[str, JsonValue]] = field(default_factory=list)
    ended: bool = False

    def __post_init__(self) -> None:
        self._state = [message for entry in self.before if (message := langchain_message(entry)) is not None]

    def item(self, item: RunItem) -> list[Part]:
        """The parts of the run's next durable item that the client has not seen."""
        seq, seen = item.seq, self.cursor
        retraction = self._retraction(item.entry_id) if isinstance(item, ReplyDropped) else []
        parts = [Part(Cursor(seq, 0, n).event_id, event, data) for n, (event, data) in enumerate(self._render(item))]
        self._last, self._retracted = seq, False
        self.ended = isinstance(item, RunSettled)
        if seq != seen.item:
            return retraction + parts if seq > seen.item else []
        # The item the client stopped in: it has its parts up to `seen.part`, and after them
        # `seen.live` characters of the reply that streamed next, and that reply's retraction
        # when `seen.part` is 1.
        self._live_seen, self._retracted = seen.live, seen.live > 0 and seen.part == 1
        return [] if seen.live > 0 else parts[seen.part + 1:]

    def live(self, message_id: str, message: AssistantMessage) -> list[Part]:
        """The part carrying what the client lacks of the reply streaming now (after the last
        durable item) under `message_id` (the entry id reserved for it), if `messages-tuple` is
        asked and there is something new."""
        if "messages-tuple" not in self.modes or self.ended or self._last < self.cursor.item:
            return []
        chunk = _chunk_after(message_id, message, self._live_seen, final=False)
        total = streamed_chars(message)
        if chunk is None or total <= self._live_seen:
            return []
        self._live_seen = total
        return [Part(Cursor(self._last, total, 0).event_id, "messages", [chunk, self._metadata("agent")])]

    def _retraction(self, entry_id: str) -> list[Part]:
        """The part that takes back what the client has of the live reply after the last item,
        dropped as side entry `entry_id`: nothing when it has none of it, or has its retraction.
        Its id comes after the reply's last chunk and before the next item's parts."""
        if self._live_seen == 0 or self._retracted or "messages-tuple" not in self.modes:
            return []
        removal: dict[str, JsonValue] = {"type": "remove", "id": entry_id, "content": ""}
        return [Part(Cursor(self._last, self._live_seen, 1).event_id, "messages", [removal, self._metadata("agent")])]

    def _metadata(self, node: str) -> dict[str, JsonValue]:
        return {"run_id": self.run_id, "thread_id": self.thread_id, "langgraph_node": node}

    def _render(self, item: RunItem) -> list[tuple[str, JsonValue]]:
        if isinstance(item, RunAccepted):
            return [("metadata", {"run_id": self.run_id, "attempt": 1})]
        if isinstance(item, RunSettled):
            result = item.result
            parts: list[tuple[str, JsonValue]] = []
            if result.outcome == "failed" and result.error is not None:
                parts.append(("error", {"error": result.error.code, "message": result.error.message}))
            parts.append(("end", {"run_id": self.run_id, "status": RUN_STATUS[result.outcome]}))
            return parts
        live_seen, self._live_seen = self._live_seen, 0
        if isinstance(item, ReplyDropped):
            # The thread's messages as they were: a client that shows the dropped reply's chunks
            # until the next `values` (LangGraph's `useStream`) drops them here.
            return [("values", {"messages": list(self._state)})] if "values" in self.modes else []
        entry = item.entry
        message = langchain_message(entry)
        if message is None:
            return [("values", {"messages": list(self._state)})] if "values" in self.modes else []
        self._state.append(message)
        payload = entry.payload
        role = payload.message.role if isinstance(payload, MessagePayload | CustomMessagePayload) else "custom"
        node = NODE_OF_ROLE[role]
        rendered: list[tuple[str, JsonValue]] = []
        # The reply's last chunk comes first: it is the one part whose content depends on how much
        # of the live reply the client saw, which a cursor inside this item no longer says.
        if "messages-tuple" in self.modes:
            if isinstance(payload, MessagePayload) and isinstance(payload.message, AssistantMessage):
                chunk = _chunk_after(entry.id, payload.message, live_seen, final=True)
                if chunk is not None:
                    rendered.append(("messages", [chunk, self._metadata(node)]))
            elif role == "tool_result":
                rendered.append(("messages", [message, self._metadata(node)]))
        if "values" in self.modes:
            rendered.append(("values", {"messages": list(self._state)}))
        if "updates" in self.modes:
            rendered.append(("updates", {node: {"messages": [message]}}))
        return rendered
