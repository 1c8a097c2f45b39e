"""The AI SDK's UI message stream (protocol v1): a conversation's run as one assistant message of
parts, as `useChat` and the `ai` package's `DefaultChatTransport` read it, and its routes:
`POST /api/chat` starts a turn and streams it, `GET /api/chat/{id}/stream` resumes the turn in
progress from its start (204 when none is), `POST /api/chat/{id}/stop` stops it durably. The chat id
is the conversation's id. With external workers the turn is admitted for them and the stream
follows the lane they drive (`ServerState.watch`), the same parts either way.

A run is one UI message whose id is the run's operation id, so a client that resumes the stream
replaces the message it has instead of adding a second one. `RunParts` turns the run into parts:
first what the lane snapshot holds (the run's entries, the streaming reply, the running tools, the
calls waiting for approval), then every live event and approval. It remembers what it has sent, so a
replay followed by live events never repeats a text delta, a tool row, an approval request or an
event row. A step (`start-step`) is opened only by its first part, so a replay and a live stream of
the same run build the same message.

A tool call that waits for the owner's approval is a `tool-approval-request` part (its `approvalId`
is the tool call id), and once nothing else of the run is in flight the stream ends there (`finish`
with reason `tool-calls`), as the protocol expects: the client answers with its next request, whose
newest message is that assistant message with the answer on the tool part (`addToolApprovalResponse`
then `sendMessage()`, or `sendAutomaticallyWhen`), and that request's stream goes on with the same
message. The run itself waits on the server all along; the approval routes answer it too.
"""

from __future__ import annotations

import asyncio
import binascii
import logging
from base64 import b64decode
from collections.abc import AsyncGenerator, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from fastapi import APIRouter, Response, status
from fastapi.sse import KEEPALIVE_COMMENT, EventSourceResponse, format_sse_event
from pydantic import BaseModel, ConfigDict, JsonValue

from harness.context import Context
from harness.conversation import (
    MAIN_LANE,
    ApprovalChange,
    ApprovalNotFound,
    ChatEventPublished,
    ConversationEvent,
    ConversationWatch,
    DelegationFinished,
    Forbidden,
    LaneEvents,
    MessageBlocksPublished,
    PendingApproval,
    SenderRow,
    conversation_events,
)
from harness.conversation.approvals import answered, pending_address
from harness.conversation.display import display_rows
from harness.conversation.turn_rows import public_error
from harness.errors import HarnessError, InvalidInput
from harness.messages import (
    AssistantMessage,
    ImageContent,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    text_of,
)
from harness.runtime import (
    EntryAdded,
    LaneSnapshot,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RetryScheduled,
    RunEnd,
    RunStart,
    ToolEnd,
    ToolStart,
    ToolUpdate,
    TurnEnd,
    TurnStart,
)
from harness.server.errors import not_found
from harness.server.sse import json_event
from harness.server.state import CurrentAuthorization, CurrentUser, RequestContext, ServerState, State
from harness.session import CustomMessagePayload, Entry, LaneLastResult, MessagePayload, SessionNotFound, addresses
from harness.tools import Approval

logger = logging.getLogger(__name__)

UI_MESSAGE_STREAM_HEADERS: dict[str, str] = {"x-vercel-ai-ui-message-stream": "v1"}
"""The header that tells an AI SDK client the body is a UI message stream of protocol v1."""

DONE = "[DONE]"
"""The raw `data:` of the stream's last event."""

UiPart: TypeAlias = dict[str, JsonValue]
"""One UI message stream part (the protocol calls it a chunk): a JSON object with its `type`."""

_FINISH_REASONS: dict[StopReason, str] = {"stop": "stop", "length": "length", "tool_use": "tool-calls",
                                          "error": "error", "aborted": "other", "deferred": "other"}


@dataclass
class _Block:
    """A text or reasoning block of the streaming reply, as far as it was sent."""

    kind: Literal["text", "reasoning"]
    part_id: str
    sent: int = 0


class RunParts:
    """The parts of run `operation_id` of one lane, in the order a client applies them.

    Feed it `replay(snapshot, source_tip_id, waiting)` to send a run in progress from its start,
    then `translate(event)` for each later event of the conversation's watch and `approval(change)`
    for each later change of the server's approvals; a stream that starts with the run feeds only
    those two, from before the run's `run_start`. Events of other runs, and everything after the
    stream's end, give no parts. `finished` is True once the stream's last part is out: the run's
    end (`finish`, or `abort` for a stopped run), or a pause (`finish` with reason `tool-calls`):
    once `pausing` (the run waits for an approval this stream asked for and no tool of it is
    running), the stream checks which calls still wait and feeds them to `pause`.
    """

    def __init__(self, lane: str, operation_id: str) -> None:
        self.lane = lane
        self.operation_id = operation_id
        self.started = False
        self.finished = False
        self._parts: list[UiPart] = []
        self._next_id = 0
        self._blocks: list[_Block | ToolCall | None] = []  # the streaming reply's blocks, by index
        self._step_open = False  # a `start-step` was sent and its `finish-step` not yet
        self._new_step = True  # the next content part opens a step
        self._retrying = False  # a failed attempt was reset; its retry continues the same step
        self._replied = False  # the run has an assistant reply: a user message now is a steer
        self._inputs: set[str] = set()  # tool calls whose input was sent
        self._outputs: set[str] = set()  # tool calls whose final output was sent
        self._awaiting: set[str] = set()  # tool calls of the last reply still without a result
        self._rows: set[str] = set()  # data parts sent, by part id
        self._replies: set[str] = set()  # assistant entries sent, by entry id
        self._running: set[str] = set()  # tool calls started and not ended
        self._asked: set[str] = set()  # tool calls whose approval request was sent
        self._to_ask: set[str] = set()  # tool calls waiting for approval whose input is not yet sent
        self._waiting: set[str] = set()  # asked and not answered: the run waits for the person
        self._answered: set[str] = set()  # tool calls answered: never asked again
        self._stop_reason: StopReason | None = None

    # -- the two inputs ---------------------------------------------------------------------------

    def replay(self, snapshot: LaneSnapshot, source_tip_id: str | None,
               waiting: Sequence[PendingApproval] = ()) -> list[UiPart]:
        """The parts of the run as `snapshot` shows it, from the message's `start`: its entries
        (those after `source_tip_id`, the tip the run was accepted on; the whole compaction-bounded
        transcript when that tip is no longer in it), its streaming reply and running tools, and an
        approval request for each of its calls in `waiting` (then `pausing`, when nothing runs).
        Raises `InvalidInput` when the snapshot's operation is not this run."""
        operation = snapshot.operation
        if operation is None or operation.id != self.operation_id:
            raise InvalidInput(f"the lane's current operation is not run {self.operation_id}",
                               operation_id=self.operation_id)
        self._start()
        transcript = list(snapshot.transcript)
        ids = [entry.id for entry in transcript]
        first = ids.index(source_tip_id) + 1 if source_tip_id in ids else 0
        for entry in transcript[first:]:
            for event in conversation_events(EntryAdded(lane=self.lane, entry=entry)):
                self._event(event)
        if operation.streaming_message is not None:
            self._end_step()
            self._assistant(operation.streaming_message, final=False)
        for tool in operation.running_tools:
            self._tool_input(tool.tool_call_id, tool.tool_name, tool.args)
            self._running.add(tool.tool_call_id)
            if tool.partial_result is not None:
                self._emit({"type": "tool-output-available", "toolCallId": tool.tool_call_id,
                            "output": tool.partial_result, "preliminary": True})
        for pending in waiting:
            if pending.operation_id == self.operation_id:
                self._ask(pending.tool_call_id)
        return self._take()

    def translate(self, event: ConversationEvent) -> list[UiPart]:
        """The parts `event` adds to the run; none for another lane's or run's event."""
        self._event(event)
        return self._take()

    def approval(self, change: ApprovalChange) -> list[UiPart]:
        """The parts a change of the run's approvals adds to the run: `tool-approval-request`
        when one of its calls starts waiting, after that call's input. An answer adds nothing (the
        call's output, or its refusal as an error output, follows as without approval), but a run
        that no longer waits is not paused, and the call is never asked again (a journal read late
        may still show it waiting)."""
        call = change.pending.tool_call_id
        if self.started and not self.finished and change.pending.operation_id == self.operation_id:
            if change.answer is None:
                self._ask(call)
            else:
                self._answered.add(call)
                self._to_ask.discard(call)
                self._waiting.discard(call)
        return self._take()

    def _event(self, event: ConversationEvent) -> None:
        if self.finished or getattr(event, "lane", None) != self.lane:
            return
        if isinstance(event, RunStart) and event.operation_id == self.operation_id:
            self._start()
        if not self.started:
            return
        match event:
            case ChatEventPublished():
                self._row("data-chat-event", event.row.id, event.row.model_dump(mode="json"))
            case MessageBlocksPublished():
                self._row("data-message-blocks", event.row.id, event.row.model_dump(mode="json"))
            case DelegationFinished():
                self._row("data-delegation", event.row.id, event.row.model_dump(mode="json"))
            case MessageStart() | MessageUpdate() if isinstance(event.message, AssistantMessage):
                if isinstance(event, MessageStart):
                    self._blocks = []
                self._assistant(event.message, final=False)
            case MessageEnd() if isinstance(event.message, AssistantMessage):
                self._assistant(event.message, final=True)
                if event.entry_id is not None:
                    self._replies.add(event.entry_id)
            case EntryAdded():
                self._entry(event.entry)
            case TurnStart() if event.operation_id == self.operation_id:
                if not self._retrying:
                    self._end_step()
                self._retrying = False
            case RetryScheduled() if event.operation_id == self.operation_id:
                # The failed attempt's reply is a side entry: the client drops its parts, and the
                # retry goes on in the same step, as a replay (which never sees it) builds it.
                if self._step_open:
                    self._emit({"type": "reset-step"})
                self._retrying = True
            case ToolStart() if event.operation_id == self.operation_id:
                self._tool_input(event.tool_call_id, event.tool_name, event.args)
                self._running.add(event.tool_call_id)
            case ToolUpdate() if event.operation_id == self.operation_id:
                if event.tool_call_id not in self._outputs:
                    self._emit({"type": "tool-output-available", "toolCallId": event.tool_call_id,
                                "output": event.partial_result, "preliminary": True})
            case ToolEnd() if event.operation_id == self.operation_id:
                self._running.discard(event.tool_call_id)
                self._tool_output(event.result)
            case TurnEnd() if event.operation_id == self.operation_id:
                self._end_step()
            case RunEnd() if event.operation_id == self.operation_id:
                self._finish(event.result)

    # -- the message ------------------------------------------------------------------------------

    def _start(self) -> None:
        if not self.started:
            self.started = True
            self._emit({"type": "start", "messageId": self.operation_id})

    def _finish(self, result: LaneLastResult) -> None:
        self._end_step()
        if result.outcome == "aborted":
            self._emit({"type": "abort", "reason": result.abort_cause or "user"})
        elif result.outcome == "failed":
            text = public_error(result.error).text if result.error is not None else "the turn failed"
            self._emit({"type": "error", "errorText": text})
            self._emit({"type": "finish", "finishReason": "error"})
        else:
            reason = _FINISH_REASONS[self._stop_reason] if self._stop_reason is not None else "stop"
            self._emit({"type": "finish", "finishReason": reason})
        self.finished = True

    def _entry(self, entry: Entry) -> None:
        """A placed entry: a reply not yet sent as it ended (a replay's), a tool result, a steer
        (a user message after the run's first reply), or a message from another sender (a
        garden's), shaped as the display read shows it. A chat-event row, a blocks entry or a
        delegation row comes as its own published event, before this one."""
        payload = entry.payload
        if isinstance(payload, CustomMessagePayload):
            for row in display_rows([entry]):
                if isinstance(row, SenderRow):
                    self._row("data-sender-message", entry.id, row.model_dump(mode="json"))
            return
        if not isinstance(payload, MessagePayload):
            return
        message = payload.message
        if isinstance(message, AssistantMessage) and entry.id not in self._replies:
            self._end_step()
            self._blocks = []
            self._assistant(message, final=True)
            self._replies.add(entry.id)
        elif isinstance(message, ToolResultMessage):
            self._tool_output(message)
        elif isinstance(message, UserMessage) and self._replied:
            self._emit({"type": "steering-message", "id": entry.id, "parts": _user_parts(message)})
            return
        else:
            return
        if not self._awaiting:
            self._end_step()  # the step's reply and all its tool results are placed

    def _row(self, part_type: str, part_id: str, data: JsonValue) -> None:
        if part_id not in self._rows:
            self._rows.add(part_id)
            self._emit({"type": part_type, "id": part_id, "data": data})

    def _assistant(self, message: AssistantMessage, *, final: bool) -> None:
        for index, block in enumerate(message.content):
            if index == len(self._blocks):
                self._blocks.append(None)
            sent = self._blocks[index]
            if isinstance(block, ToolCall):
                if sent is None:
                    self._reused(block.id)
                    self._open_step()
                    self._blocks[index] = block
                    self._emit({"type": "tool-input-start", "toolCallId": block.id, "toolName": block.name})
                if final:
                    self._tool_input(block.id, block.name, dict(block.arguments))
                continue
            kind: Literal["text", "reasoning"] = "text" if isinstance(block, TextContent) else "reasoning"
            text = block.text if isinstance(block, TextContent) else block.thinking
            if isinstance(block, ThinkingContent) and block.redacted and not text:
                continue
            if not isinstance(sent, _Block):
                self._open_step()
                sent = self._blocks[index] = _Block(kind, f"{kind}-{self._new_part_id()}")
                self._emit({"type": f"{kind}-start", "id": sent.part_id})
            if len(text) > sent.sent:
                self._emit({"type": f"{kind}-delta", "id": sent.part_id, "delta": text[sent.sent:]})
                sent.sent = len(text)
        if final:
            for sent_block in self._blocks:
                if isinstance(sent_block, _Block):
                    self._emit({"type": f"{sent_block.kind}-end", "id": sent_block.part_id})
            self._blocks = []
            self._replied = True
            self._stop_reason = message.stop_reason
            self._awaiting = {call.id for call in message.tool_calls}

    def _reused(self, tool_call_id: str) -> None:
        """A new reply names a call whose id an earlier step's finished call had (some providers
        send `call_1` every turn): it is a new call, sent as one, in its own step."""
        if tool_call_id in self._outputs:
            for seen in (self._inputs, self._outputs, self._asked, self._waiting, self._to_ask, self._answered):
                seen.discard(tool_call_id)

    def _tool_input(self, tool_call_id: str, tool_name: str, args: JsonValue) -> None:
        if tool_call_id in self._inputs:
            return
        self._inputs.add(tool_call_id)
        if not any(isinstance(block, ToolCall) and block.id == tool_call_id for block in self._blocks):
            self._open_step()
            self._emit({"type": "tool-input-start", "toolCallId": tool_call_id, "toolName": tool_name})
        self._emit({"type": "tool-input-available", "toolCallId": tool_call_id, "toolName": tool_name,
                    "input": args})
        if tool_call_id in self._to_ask:
            self._ask(tool_call_id)

    def _ask(self, tool_call_id: str) -> None:
        if tool_call_id in self._asked or tool_call_id in self._outputs or tool_call_id in self._answered:
            return
        if tool_call_id not in self._inputs:
            # The approval is asked on the drive's side; the reply that made the call may still be
            # on its way in the watch: the request follows the call's input.
            self._to_ask.add(tool_call_id)
            return
        self._to_ask.discard(tool_call_id)
        self._asked.add(tool_call_id)
        self._waiting.add(tool_call_id)
        self._emit({"type": "tool-approval-request", "approvalId": tool_call_id, "toolCallId": tool_call_id})

    def _tool_output(self, result: ToolResultMessage) -> None:
        self._awaiting.discard(result.tool_call_id)
        self._waiting.discard(result.tool_call_id)
        if result.tool_call_id in self._outputs or result.tool_call_id not in self._inputs:
            return
        self._outputs.add(result.tool_call_id)
        text = text_of(result.content, "\n")
        if result.is_error:
            self._emit({"type": "tool-output-error", "toolCallId": result.tool_call_id, "errorText": text})
        else:
            self._emit({"type": "tool-output-available", "toolCallId": result.tool_call_id, "output": text})

    # -- steps and plumbing -----------------------------------------------------------------------

    def _open_step(self) -> None:
        if self._new_step:
            self._new_step = False
            self._step_open = True
            self._emit({"type": "start-step"})

    def _end_step(self) -> None:
        if self._step_open:
            self._emit({"type": "finish-step"})
        self._step_open = False
        self._new_step = True

    def _new_part_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _emit(self, part: UiPart) -> None:
        self._parts.append(part)

    @property
    def pausing(self) -> bool:
        """The run waits for an approval this stream asked for and no tool of it runs: the stream
        pauses there (`pause`) once it has checked that the call still waits."""
        return bool(self._waiting) and not self._running and not self.finished

    def pause(self, still_waiting: Collection[str] | None) -> list[UiPart]:
        """Pause the stream (`finish` with reason `tool-calls`: the client answers with its next
        request) if a call it asked for is among `still_waiting`, the calls waiting now as the
        server or the journal holds them (None: not known; every call asked is taken to wait). A
        call answered since it was read waiting (elsewhere, issue 30) is not paused on, nor asked
        again: the stream goes on with its output."""
        if still_waiting is not None:
            for call in self._waiting - set(still_waiting):
                self._waiting.discard(call)
                self._answered.add(call)
        if self.pausing:
            self._end_step()
            self._emit({"type": "finish", "finishReason": "tool-calls"})
            self.finished = True
        return self._take()

    def _take(self) -> list[UiPart]:
        parts, self._parts = self._parts, []
        return parts


def _user_parts(message: UserMessage) -> list[JsonValue]:
    if isinstance(message.content, str):
        return [{"type": "text", "text": message.content}]
    parts: list[JsonValue] = []
    for block in message.content:
        if isinstance(block, TextContent):
            parts.append({"type": "text", "text": block.text})
        else:
            parts.append({"type": "file", "mediaType": block.mime_type,
                          "url": f"data:{block.mime_type};base64,{block.data}"})
    return parts


# -- what a client sends ----------------------------------------------------------------------------


class UiMessageIn(BaseModel):
    """A message as the client holds it: its `parts` are read by `prompt_of` (text, and images as
    `file` parts with a base64 `data:` URL) and `approval_answers` (tool parts in state
    `approval-responded`); other part types are kept by the client and ignored."""

    model_config = ConfigDict(extra="allow")

    id: str
    role: Literal["user", "assistant", "system"]
    parts: list[dict[str, JsonValue]]


class ChatRequest(BaseModel):
    """The body `DefaultChatTransport` posts: the chat `id` (a conversation id), the chat's
    `messages`, the `trigger` and the `messageId` a regeneration or an approval answer names."""

    model_config = ConfigDict(extra="allow")

    id: str
    messages: list[UiMessageIn]
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None


def prompt_of(messages: Sequence[UiMessageIn]) -> tuple[str, list[ImageContent]]:
    """The text and images of the newest message of `messages`, which must be the person's: its
    `text` parts joined by blank lines, and its `file` parts whose media type is an image and whose
    URL is a base64 `data:` URL. Raises `InvalidInput` (nothing sent) when the newest message is
    not a user message, says nothing, or carries a file this door cannot take."""
    if not messages or messages[-1].role != "user":
        raise InvalidInput("the newest message must be the person's (role user)")
    texts: list[str] = []
    images: list[ImageContent] = []
    for part in messages[-1].parts:
        kind = part.get("type")
        if kind == "text" and isinstance(text := part.get("text"), str):
            texts.append(text)
        elif kind == "file":
            images.append(_image_of(part))
    text = "\n\n".join(t for t in texts if t)
    if not text and not images:
        raise InvalidInput("the newest message has no text and no image", message_id=messages[-1].id)
    return text, images


def _image_of(part: dict[str, JsonValue]) -> ImageContent:
    media_type, url = part.get("mediaType"), part.get("url")
    if not isinstance(media_type, str) or not media_type.startswith("image/") or not isinstance(url, str):
        raise InvalidInput("a file part must be an image with a data: URL", media_type=str(media_type)[:80])
    head, _, data = url.partition(",")
    if not (head.startswith("data:") and head.endswith(";base64")):
        raise InvalidInput("an image must come as a base64 data: URL", url=url[:40])
    try:
        b64decode(data, validate=True)
    except binascii.Error:
        raise InvalidInput("an image's data: URL is not valid base64", url=url[:40]) from None
    return ImageContent(data=data, mime_type=media_type)


def approval_answers(message: UiMessageIn) -> dict[str, Approval]:
    """The approval answers an assistant message carries, by approval id (the tool call id): its
    tool parts (`tool-NAME` or `dynamic-tool`) in state `approval-responded`, each with
    `approval: {id, approved, reason?}`. Raises `InvalidInput` when it carries none, or one
    without an id or a boolean `approved`."""
    answers: dict[str, Approval] = {}
    for part in message.parts:
        kind = part.get("type")
        if not (isinstance(kind, str) and kind.startswith(("tool-", "dynamic-tool"))
                and part.get("state") == "approval-responded"):
            continue
        approval = part.get("approval")
        if not isinstance(approval, dict) or not isinstance(approval.get("id"), str) \
                or not isinstance(approval.get("approved"), bool):
            raise InvalidInput("an answered approval needs its id and whether it is approved",
                               tool_call_id=str(part.get("toolCallId"))[:80])
        reason = approval.get("reason")
        answers[str(approval["id"])] = Approval(allow=bool(approval["approved"]),
                                                reason=reason if isinstance(reason, str) and reason else None)
    if not answers:
        raise InvalidInput("the newest message is the assistant's but answers no approval: send the "
                           "person's message, or the assistant message with a tool part in state "
                           "approval-responded", message_id=message.id[:80])
    return answers


def unseen(parts: Sequence[UiPart], message: UiMessageIn) -> list[UiPart]:
    """The parts of a replay that `message` (the assistant message the client continues) does not
    hold yet, for a stream that goes on with it: the `start`, final tool outputs, approval
    requests, data parts and steers it lacks. Its text, reasoning and tool inputs are what they
    were when its stream paused: a run waiting for approval writes none."""
    held: dict[tuple[str, str], JsonValue] = {}
    for part in message.parts:
        kind, state = part.get("type"), part.get("state")
        if isinstance(call := part.get("toolCallId"), str):
            held[("tool", call)] = state
        elif isinstance(kind, str) and isinstance(part_id := part.get("id"), str):
            held[(kind, part_id)] = True

    def lacks(part: UiPart) -> bool:
        kind, call, part_id = part["type"], part.get("toolCallId"), part.get("id")
        if kind in ("tool-output-available", "tool-output-error") and isinstance(call, str):
            return not part.get("preliminary") and held.get(("tool", call), "output-available") not in (
                "output-available", "output-error", "output-denied")
        if kind == "tool-approval-request" and isinstance(call, str):
            return held.get(("tool", call)) in ("input-streaming", "input-available")
        if isinstance(kind, str) and (kind.startswith("data-") or kind == "steering-message"):
            return isinstance(part_id, str) and (kind, part_id) not in held
        return kind == "start"

    return [part for part in parts if lacks(part)]


# -- the routes -------------------------------------------------------------------------------------

router = APIRouter(prefix="/api/chat", tags=["ai-sdk ui message stream"])

_STREAM_HEADERS = {**UI_MESSAGE_STREAM_HEADERS, "cache-control": "no-cache", "x-accel-buffering": "no"}


class StopOut(BaseModel):
    """A durable stop: the run's operation id, and False when a stop was already requested."""

    operation_id: str
    requested: bool


_SSE: dict[str, dict[str, str]] = {"text/event-stream": {}}


@router.post("", responses={200: {"description": "The turn's parts.", "content": _SSE}})
async def send(body: ChatRequest, user: CurrentUser, state: State, authorization: CurrentAuthorization,
               context: RequestContext) -> Response:
    """Start a turn of conversation `body.id` with the newest message (the person's) and stream the
    reply as UI message stream parts, ending with `data: [DONE]`; or, when the newest message is
    the assistant message of a run waiting for approval with the answers on its tool parts (see
    `approval_answers`), answer those calls and stream the rest of that message. The turn is the
    server's: a client that goes away stops only its stream (resume it with `GET
    /api/chat/{id}/stream`). Errors, before anything streams: 400 `invalid_input` (no text or
    image, no answer, a regeneration), 404 for a missing conversation or another user's, 404
    `approval_not_found` for an answer no call waits for (none is answered then), 409
    `approval_answered` for one another answer came before (a person elsewhere), 409 `lane_busy`
    while a turn runs, 413 `prompt_too_large`."""
    if body.trigger != "submit-message":
        raise InvalidInput("regenerating a reply is not offered: send a new message", trigger=body.trigger)
    newest = body.messages[-1] if body.messages else None
    answers = approval_answers(newest) if newest is not None and newest.role == "assistant" else None
    text, images = prompt_of(body.messages) if answers is None else ("", [])
    try:
        # Watched before the turn is accepted or the calls answered, so what follows is all watched.
        sources = _Sources(state, body.id, await state.watch(user, body.id, context))
    except (Forbidden, SessionNotFound):
        return not_found(body.id)
    try:
        if newest is not None and answers is not None:
            parts = RunParts(MAIN_LANE, newest.id)
            first = await _answer(state, user, body.id, sources.watch, parts, answers, newest, context)
        else:
            _, accepted = await state.start_turn(user, body.id, text, context, images=images)
            parts, first = RunParts(MAIN_LANE, accepted.operation_id), []
    except BaseException:
        sources.close()
        raise
    return EventSourceResponse(authorization.until_revoked(_stream(sources, parts, first, state.options.heartbeat_s)),
                              headers=_STREAM_HEADERS)


async def _answer(state: ServerState, user: str, conversation_id: str, watch: ConversationWatch, parts: RunParts,
                  answers: dict[str, Approval], message: UiMessageIn, context: Context) -> list[UiPart]:
    """Answer the calls of run `message.id` that `answers` names, all or none, wherever they wait
    (this server, or another process holding the conversation: posted to it, issue 28), and
    return the parts of the run `message` lacks (the replay of the watch's snapshot, as far as it
    is new to the client)."""
    reader = watch.events.reader
    meta = await reader.get(addresses.operation_meta(message.id), context)
    pending = await state.approvals.listed(reader, context)
    waiting = {call.tool_call_id for call in pending if call.operation_id == message.id}
    unknown = [approval_id for approval_id in answers if approval_id not in waiting]
    if unknown:
        kept = await reader.get(pending_address(unknown[0]), context)
        if kept is not None and kept.operation_id == message.id and kept.decided is not None:
            # Answered elsewhere after this client was asked (the first answer wins): a conflict.
            raise answered(unknown[0], kept.decided)
        raise ApprovalNotFound(f"no call {unknown[0][:80]!r} of run {message.id[:80]!r} waits for approval",
                               tool_call_id=unknown[0][:80])
    # Replayed before anything is answered (a replay that fails answers nothing), without the
    # calls answered now: the stream must not pause on them.
    replayed = parts.replay(watch.snapshot, meta.source_tip_id if meta is not None else None,
                            [call for call in pending if call.tool_call_id not in answers])
    calls = {call.tool_call_id: call for call in pending}
    for approval_id, answer in answers.items():
        await state.service.answer_approval(user, conversation_id, approval_id, answer, context)
        # A posted answer leaves the journal's copy waiting until the holder takes it: the
        # stream must not ask it again meanwhile.
        replayed += parts.approval(ApprovalChange(calls[approval_id], answer))
    return unseen(replayed, message)


@router.get("/{conversation_id}/stream", responses={
    200: {"description": "The turn's parts from its start.", "content": _SSE},
    204: {"description": "No turn is in progress."}})
async def resume(conversation_id: str, user: CurrentUser, state: State, authorization: CurrentAuthorization,
                 context: RequestContext) -> Response:
    """The turn in progress, replayed from its start (its durable entries, the streaming reply, the
    running tools and the calls waiting for approval as the lane's snapshot and the server hold
    them) and then live, as one message with the same id as the stream that started it; 204 when
    no turn is in progress. 404 for a missing conversation or another user's."""
    sources = _Sources(state, conversation_id, await state.watch(user, conversation_id, context))
    snapshot = sources.watch.snapshot
    operation = snapshot.operation
    if operation is None or operation.kind != "run":
        sources.close()
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    try:
        meta = await sources.watch.events.reader.get(addresses.operation_meta(operation.id), context)
        parts = RunParts(MAIN_LANE, operation.id)
        first = parts.replay(snapshot, meta.source_tip_id if meta is not None else None,
                             await state.approvals.listed(sources.watch.events.reader, context))
    except BaseException:
        sources.close()
        raise
    return EventSourceResponse(authorization.until_revoked(_stream(sources, parts, first, state.options.heartbeat_s)),
                              headers=_STREAM_HEADERS)


@router.post("/{conversation_id}/stop", status_code=status.HTTP_202_ACCEPTED, response_model=StopOut)
async def stop(conversation_id: str, user: CurrentUser, state: State, context: RequestContext) -> StopOut:
    """Stop the conversation's turn durably (cause `user`), wherever it is driven: it stops at its
    next safe point, answers every open tool call and its stream ends with `abort`. 409
    `no_active_operation` when no turn runs; 404 for a missing conversation or another user's."""
    request = await state.stop(user, conversation_id, context)
    return StopOut(operation_id=request.operation_id, requested=request.newly_requested)


@dataclass(frozen=True)
class _Change:
    """An approval change and what the watch had delivered before it and the stream had not yet
    translated: the read that had finished (if any), then the buffered events, in order."""

    read: asyncio.Future[ConversationEvent] | None
    earlier: list[ConversationEvent]
    change: ApprovalChange


class _Sources:
    """What one stream reads: the conversation's watch and the changes of its approvals, both
    subscribed before anything is read, so nothing between them is missed. A call waiting in this
    server changes synchronously with the run, so what the watch delivered before a change is
    known when it changes: the change carries it, and the stream puts the change after those
    events and before any later one, whichever the stream's task sees first. A call waiting in
    another process (a `harness worker`, a chat) is read from the journal's copies whenever the
    conversation's journal changes while this server does not hold it (`JournalApprovals`); its
    change comes after the events read by then, and `RunParts` asks it after the call's input."""

    def __init__(self, state: ServerState, conversation_id: str, events: LaneEvents) -> None:
        self.conversation_id = conversation_id
        self.watch = ConversationWatch(events)
        self.changes: asyncio.Queue[_Change] = asyncio.Queue()
        self._reading: asyncio.Future[ConversationEvent] | None = None

        def on_change(change: ApprovalChange) -> None:
            if change.pending.conversation_id == conversation_id:
                read = self._reading if self._reading is not None and self._reading.done() else None
                self.changes.put_nowait(_Change(read, self.watch.buffered(), change))

        self._approvals = state.approvals
        self._stop_listening = state.approvals.listen(on_change)
        self.elsewhere = asyncio.ensure_future(state.approvals.follow_elsewhere(
            self.watch.events.reader, state.service.store.changes, state.options.follow_poll_s, on_change))
        """The reader of the journal's approvals (`Approvals.follow_elsewhere`): it runs until
        closed, so its end is its failure."""

    async def waiting(self) -> set[str] | None:
        """The calls of the conversation waiting for an answer now, as this server or the journal
        holds them (`Approvals.listed`); None when the store cannot tell now (logged)."""
        context = Context({"server": "ai sdk stream", "conversation": self.conversation_id})
        try:
            listed = await self._approvals.listed(self.watch.events.reader, context)
        except HarnessError as error:
            logger.warning("approvals of conversation %s not read before a pause: %s [%s]", self.conversation_id,
                           error.message, error.code)
            return None
        return {pending.tool_call_id for pending in listed}

    def read(self) -> asyncio.Future[ConversationEvent]:
        """The watch's next event, as a future."""
        self._reading = asyncio.ensure_future(anext(self.watch))
        return self._reading

    def close(self) -> None:
        self._stop_listening()
        self.elsewhere.cancel()
        self.watch.close()


async def _stream(sources: _Sources, parts: RunParts, first: list[UiPart],
                  heartbeat_s: float) -> AsyncGenerator[bytes, None]:
    """`first`, then the parts of each watched event and approval change, in the order they
    happened, until the stream's end (the run's, or its pause for an approval, once the calls it
    would pause on are read again and one still waits: one answered elsewhere just before is
    not paused on), then `[DONE]`; a comment every `heartbeat_s` of quiet. A watch that fails
    (a slow client overflowed it, the harness stopped), or a reader of the approvals waiting
    elsewhere that fails, ends the stream with an `error` part. The sources are closed however
    the stream ends, also when the client goes away."""
    event = sources.read()
    change: asyncio.Future[_Change] = asyncio.ensure_future(sources.changes.get())
    try:
        for part in first:
            yield json_event(part)
        while not parts.finished:
            if parts.pausing:
                for part in parts.pause(await sources.waiting()):
                    yield json_event(part)
                continue
            sources_ready: set[asyncio.Future[Any]] = {event, change, sources.elsewhere}
            done, _ = await asyncio.wait(sources_ready, timeout=heartbeat_s, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                yield KEEPALIVE_COMMENT
                continue
            if sources.elsewhere in done:  # it runs until closed: it failed
                logger.error("the approvals of conversation %s waiting elsewhere could not be read",
                             sources.conversation_id, exc_info=sources.elsewhere.exception())
                yield json_event({"type": "error", "errorText": "the approvals waiting elsewhere could not be read"})
                break
            changed = change.result() if change in done else None
            if changed is None or changed.read is event:  # the event came first
                try:
                    translated = parts.translate(event.result())
                except StopAsyncIteration:
                    break
                except HarnessError as error:
                    yield json_event({"type": "error", "errorText": error.message})
                    break
                for part in translated:
                    yield json_event(part)
                event = sources.read()
            if changed is not None:
                for earlier in changed.earlier:
                    for part in parts.translate(earlier):
                        yield json_event(part)
                for part in parts.approval(changed.change):
                    yield json_event(part)
                change = asyncio.ensure_future(sources.changes.get())
        yield format_sse_event(data_str=DONE)
    finally:
        event.cancel()
        change.cancel()
        sources.close()
