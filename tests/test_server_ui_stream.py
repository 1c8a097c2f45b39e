"""The AI SDK UI message stream's translation (issue 16 item 5): a run as one UI message, the same
whether a client follows it live from its start or resumes it from any snapshot on the way, and the
prompt a client's newest message carries."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from conversation_helpers import faux_service
from drive_helpers import FAUX, ProbeTool, within
from harness.context import Context
from harness.conversation import (
    GARDEN_MESSAGE_TYPE,
    AgentDefinition,
    AgentRegistry,
    ConversationService,
    ConversationSetup,
    GardenMessage,
    conversation_events,
)
from harness.conversation.delegation import subagent_result_of
from harness.errors import InvalidInput
from harness.messages import UserMessage
from harness.providers.faux import FauxReply, delay, failure, reply, thinking, tool_call
from harness.runtime import (
    DriveSettings,
    HarnessEvent,
    LaneSnapshot,
    PendingWrite,
    QueueUpdate,
    RetryPolicy,
    RunEnd,
    RunStart,
    ToolStart,
    reduce_lane_snapshot,
)
from harness.server import ApprovalChange, PendingApproval
from harness.server.ui_stream import RunParts, UiMessageIn, UiPart, approval_answers, prompt_of, unseen
from harness.session import LaneConfig, Store
from harness.tools import Approval

ALICE = "alice"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """The translation does not depend on the backend: the embedded one is enough."""
    return f"sqlite:///{tmp_path / 'journal.db'}?synchronous=NORMAL"

CONFIG = LaneConfig(model=FAUX)


class ClientMessage:
    """The assistant message an AI SDK client builds from parts, as its stream processor does:
    it refuses a delta or an output for a part it never saw, so a broken stream fails here."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.parts: list[dict[str, Any]] = []
        self.ending: list[str] = []
        self._open: dict[str, dict[str, Any]] = {}

    def apply(self, parts: Sequence[UiPart]) -> ClientMessage:
        for part in parts:
            self._apply(dict(part))
        return self

    def _apply(self, part: dict[str, Any]) -> None:
        kind = part["type"]
        if kind == "start":
            self.id = part["messageId"]
        elif kind in ("text-start", "reasoning-start"):
            block = {"type": kind.removesuffix("-start"), "text": ""}
            self._open[part["id"]] = block
            self.parts.append(block)
        elif kind in ("text-delta", "reasoning-delta"):
            self._open[part["id"]]["text"] += part["delta"]
        elif kind in ("text-end", "reasoning-end"):
            del self._open[part["id"]]
        elif kind == "tool-input-start":
            self.parts.append({"type": "tool", "toolCallId": part["toolCallId"], "state": "input-streaming"})
        elif kind == "tool-input-available":
            self._tool(part["toolCallId"]).update(state="input-available", input=part["input"])
        elif kind == "tool-output-available":
            self._tool(part["toolCallId"]).update(state="output-available", output=part["output"],
                                                  preliminary=part.get("preliminary", False))
        elif kind == "tool-output-error":
            self._tool(part["toolCallId"]).update(state="output-error", errorText=part["errorText"])
        elif kind == "start-step":
            self.parts.append({"type": "step-start"})
        elif kind == "reset-step":
            starts = [i for i, p in enumerate(self.parts) if p["type"] == "step-start"]
            del self.parts[starts[-1] + 1:]
            self._open.clear()
        elif kind == "steering-message" or kind.startswith("data-"):
            self.parts.append(part)
        elif kind in ("finish", "abort", "error"):
            self.ending.append(kind if kind != "finish" else f"finish:{part['finishReason']}")
        elif kind != "finish-step":
            raise AssertionError(f"unexpected part {part}")

    def _tool(self, tool_call_id: str) -> dict[str, Any]:
        return next(p for p in self.parts if p["type"] == "tool" and p["toolCallId"] == tool_call_id)

    def shape(self) -> list[str]:
        return [p["type"] for p in self.parts]


async def record_run(conversations: ConversationService, ctx: Context, prompt: str, during: Any = None,
                     config: LaneConfig = CONFIG) -> tuple[LaneSnapshot, list[HarnessEvent], str]:
    """Send `prompt` to a new conversation, awaiting `during(conversation)` while the run goes on;
    returns the lane's snapshot from before the send, every event after it up to the run's end, and
    the run's operation id."""
    conversation = await conversations.create(ALICE, config, ctx)
    watch = await conversation.lane_events(ctx)
    send = asyncio.create_task(conversations.send(ALICE, conversation.id, prompt, ctx))
    if during is not None:
        await during(conversation)
    await within(send)
    events: list[HarnessEvent] = []

    async def collect() -> None:
        async for event in watch:
            events.append(event)
            if isinstance(event, RunEnd):
                return

    await within(collect())
    watch.close()
    operation_id = next(e.operation_id for e in events if isinstance(e, RunStart))
    return watch.snapshot, events, operation_id


def live_parts(events: Sequence[HarnessEvent], operation_id: str) -> list[UiPart]:
    parts = RunParts("main", operation_id)
    return [part for event in events for shown in conversation_events(event) for part in parts.translate(shown)]


def resumed_parts(snapshot: LaneSnapshot, events: Sequence[HarnessEvent], operation_id: str, cut: int,
                  source_tip: str | None) -> list[UiPart] | None:
    """The parts of a client that resumes with the snapshot after `events[:cut]`; None when the run
    is not open there (a resume then gets no stream)."""
    for event in events[:cut]:
        snapshot = reduce_lane_snapshot(snapshot, event)
    if snapshot.operation is None or snapshot.operation.id != operation_id:
        return None
    parts = RunParts("main", operation_id)
    out = parts.replay(snapshot, source_tip)
    return out + [part for event in events[cut:] for shown in conversation_events(event)
                  for part in parts.translate(shown)]


def assert_every_resume_builds_the_live_message(snapshot: LaneSnapshot, events: Sequence[HarnessEvent],
                                                 operation_id: str) -> ClientMessage:
    live = ClientMessage().apply(live_parts(events, operation_id))
    start = next(i for i, e in enumerate(events) if isinstance(e, RunStart))
    source_tip = snapshot.tip_id
    for event in events[:start]:
        snapshot = reduce_lane_snapshot(snapshot, event)
        source_tip = snapshot.tip_id
    resumed = 0
    for cut in range(len(events) + 1):
        parts = resumed_parts(snapshot, events, operation_id, cut, source_tip) if cut > start else None
        if parts is None:
            continue
        resumed += 1
        message = ClientMessage().apply(parts)
        assert (message.id, message.parts, message.ending) == (live.id, live.parts, live.ending), f"cut {cut}"
    assert resumed > 3
    return live


async def test_a_run_is_one_message_of_steps_tools_rows_and_steers_live_and_from_every_resume(
        store: Store, ctx: Context) -> None:
    """Issue 16 item 5: thinking, text, a tool call with its output, a chat-event row (id = row id)
    and a steer, in two steps; resuming from the snapshot at any event gives the same message."""
    probe = ProbeTool()
    conversations, _ = faux_service(store, [
        reply(thinking("Let me look."), "Looking it up. ", tool_call("probe", {"key": "a"})),
        reply("Found probe:a."),
    ], tools=[probe])
    gate = probe.gate("a")

    async def during(conversation: Any) -> None:
        await probe.wait_started("a")
        await conversations.record_local_shell(ALICE, conversation.id, "ls", 0, "notes.txt\n", ctx)
        await conversation.steer(UserMessage(content="and then stop"), ctx)
        gate.set()

    snapshot, events, operation_id = await record_run(conversations, ctx, "look it up", during,
                                                      LaneConfig(model=FAUX, active_tools=["probe"]))
    live = assert_every_resume_builds_the_live_message(snapshot, events, operation_id)

    assert live.id == operation_id
    assert live.shape() == ["step-start", "reasoning", "text", "tool", "data-chat-event", "steering-message",
                            "step-start", "text"]
    _, reasoning, text, tool, row, steer, _, answer = live.parts
    assert (reasoning["text"], text["text"], answer["text"]) == ("Let me look.", "Looking it up. ", "Found probe:a.")
    assert (tool["state"], tool["input"], tool["output"]) == ("output-available", {"key": "a"}, "probe:a")
    assert row["data"]["details"]["kind"] == "shell"
    assert row["id"] == row["data"]["id"]
    assert steer["parts"] == [{"type": "text", "text": "and then stop"}]
    assert live.ending == ["finish:stop"]


async def test_a_retried_reply_is_reset_and_its_retry_continues_the_same_step(store: Store, ctx: Context) -> None:
    """A failed attempt that is retried leaves nothing in the message (`reset-step`), live or resumed."""
    quick = ConversationSetup(drive=DriveSettings(frame_interval_s=0, retry=RetryPolicy(base_delay_ms=1)))
    conversations, _ = faux_service(store, [failure("retryable", "overloaded", "Half an ans"), reply("Whole answer.")],
                                    setup=quick)
    snapshot, events, operation_id = await record_run(conversations, ctx, "hi")

    live = assert_every_resume_builds_the_live_message(snapshot, events, operation_id)

    assert {"type": "reset-step"} in live_parts(events, operation_id)
    assert live.shape() == ["step-start", "text"]
    assert live.parts[1]["text"] == "Whole answer."


async def test_a_stopped_run_ends_with_its_interrupted_row_then_abort(store: Store, ctx: Context) -> None:
    """A durable stop (cause `user`) ends the message with the `interrupted` row and `abort`, no `finish`."""
    release = asyncio.Event()
    pause = delay(release)
    conversations, _ = faux_service(store, [FauxReply(parts=(*reply("Partial ").parts, pause, *reply("rest").parts))])

    async def during(conversation: Any) -> None:
        await within(pause.reached.wait())
        await conversation.stop(ctx)
        release.set()

    snapshot, events, operation_id = await record_run(conversations, ctx, "hi", during)
    live = assert_every_resume_builds_the_live_message(snapshot, events, operation_id)

    assert live.ending == ["abort"]
    assert live.parts[-1]["type"] == "data-chat-event"
    assert live.parts[-1]["data"]["details"]["kind"] == "interrupted"
    assert live_parts(events, operation_id)[-1] == {"type": "abort", "reason": "user"}


async def test_a_failed_run_ends_with_its_error_text_then_finish(store: Store, ctx: Context) -> None:
    conversations, _ = faux_service(store, [failure("other", "the model refused the request")])
    _, events, operation_id = await record_run(conversations, ctx, "hi")

    parts = live_parts(events, operation_id)

    assert parts[-2:] == [{"type": "error", "errorText": "the model refused the request"},
                          {"type": "finish", "finishReason": "error"}]


async def test_other_runs_give_no_parts_and_a_replay_of_another_run_is_refused(store: Store, ctx: Context) -> None:
    conversations, _ = faux_service(store, [reply("one"), reply("two")])
    _, first, _ = await record_run(conversations, ctx, "hi")
    snapshot, _, operation_id = await record_run(conversations, ctx, "hi")

    assert live_parts(first, operation_id) == []
    with pytest.raises(InvalidInput):
        RunParts("main", operation_id).replay(snapshot, None)


def user(*parts: dict[str, Any]) -> UiMessageIn:
    return UiMessageIn(id="m1", role="user", parts=list(parts))


def test_the_prompt_is_the_newest_user_messages_text_and_images() -> None:
    earlier = UiMessageIn(id="m0", role="assistant", parts=[{"type": "text", "text": "no"}])
    image = {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,iVBORw0KGgo="}

    text, images = prompt_of([earlier, user({"type": "text", "text": "look"}, {"type": "step-start"},
                                            {"type": "text", "text": "here"}, image)])

    assert text == "look\n\nhere"
    assert [(i.mime_type, i.data) for i in images] == [("image/png", "iVBORw0KGgo=")]


@pytest.mark.parametrize("messages", [
    [],
    [UiMessageIn(id="a", role="assistant", parts=[{"type": "text", "text": "hi"}])],
    [user({"type": "text", "text": ""})],
    [user({"type": "file", "mediaType": "application/pdf", "url": "data:application/pdf;base64,AAAA"})],
    [user({"type": "file", "mediaType": "image/png", "url": "https://example.com/cat.png"})],
    [user({"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,not base64!"})],
])
def test_a_prompt_that_is_not_a_persons_text_or_image_is_refused(messages: list[UiMessageIn]) -> None:
    with pytest.raises(InvalidInput):
        prompt_of(messages)


async def test_a_delegation_finish_and_a_garden_message_during_a_run_are_data_parts_live_and_from_every_resume(
        store: Store, ctx: Context) -> None:
    """A background child that finishes while its parent's batch runs is a `data-delegation` part,
    and a garden's message a `data-sender-message` part (the display read's row), each with its
    entry id as part id; resuming from the snapshot at any event gives the same message."""
    probe = ProbeTool()
    hold = probe.gate("slow")
    writer = AgentDefinition(name="writer", description="writes things", instructions="WRITER: write it down.")
    parent = [reply(tool_call("delegate", {"agent": "writer", "task": "Quick one", "background": True}),
                    tool_call("probe", {"key": "slow"})), reply("Both done.")]
    setup = ConversationSetup(drive=DriveSettings(frame_interval_s=0), agents=AgentRegistry([writer]))
    conversations, _ = faux_service(
        store, lambda asked: "Quick answer." if (asked.request.system_prompt or "").startswith("WRITER:")
        else parent.pop(0), tools=[probe], setup=setup)
    said = GardenMessage(garden="allotment", kind="reply", emission_id="e1", goal_id="g1", run_id="r1",
                         text="The beans are up.")

    def delivered(writes: Sequence[PendingWrite]) -> bool:
        return any(write.message is not None and subagent_result_of(write.message) is not None for write in writes)

    async def during(conversation: Any) -> None:
        watch = await conversation.watch(ctx)  # the child's result waits for the batch's end
        if not delivered(watch.snapshot.pending_writes):
            await within(anext(e async for e in watch if isinstance(e, QueueUpdate) and delivered(e.pending_writes)))
        watch.close()
        await conversations.post_garden_message(ALICE, conversation.id, said, ctx)
        hold.set()

    snapshot, events, operation_id = await record_run(
        conversations, ctx, "go", during, LaneConfig(model=FAUX, active_tools=["probe", "delegate"]))
    live = assert_every_resume_builds_the_live_message(snapshot, events, operation_id)
    await conversations.close_all(ctx)

    rows = {part["type"]: part for part in live.parts if part["type"].startswith("data-")}
    assert sorted(rows) == ["data-delegation", "data-sender-message"]  # placed at one boundary, either first
    delegation, garden = rows["data-delegation"], rows["data-sender-message"]
    assert delegation["id"] == delegation["data"]["id"]
    assert delegation["data"]["finish"]["agent"] == "writer"
    assert garden["id"] == garden["data"]["id"]
    assert (garden["data"]["sender"], garden["data"]["custom_type"]) == ("garden", GARDEN_MESSAGE_TYPE)


def streamed(parts: RunParts, events: list[Any], still_waiting: set[str]) -> list[UiPart]:
    """The parts of `events` as the stream sends them, pausing (`RunParts.pause`) as it does
    whenever `pausing`, with `still_waiting` the calls read waiting then."""
    sent: list[UiPart] = []
    for event in events:
        for shown in conversation_events(event):
            sent += parts.translate(shown)
            if parts.pausing:
                sent += parts.pause(still_waiting)
    return sent


async def call_waiting(store: Store, ctx: Context) -> tuple[RunParts, PendingApproval, list[UiPart],
                                                          list[HarnessEvent]]:
    """A recorded run whose one `probe` call waits for approval: the run's parts translated up to
    its start, the call's approval, those parts, and the run's events after its start."""
    probe = ProbeTool()
    conversations, _ = faux_service(store, [reply("Checking. ", tool_call("probe", {"key": "a"})), reply("Done.")],
                                    tools=[probe])
    _, events, operation_id = await record_run(conversations, ctx, "hi",
                                               config=LaneConfig(model=FAUX, active_tools=["probe"]))
    call = next(e for e in events if isinstance(e, ToolStart))
    waits = PendingApproval(conversation_id="c", operation_id=operation_id, tool_call_id=call.tool_call_id,
                            tool_name="probe", args={"key": "a"}, summary="probe a", asked_at=0)
    start = next(i for i, e in enumerate(events) if isinstance(e, RunStart))
    parts = RunParts("main", operation_id)
    before = [part for event in events[:start + 1] for part in parts.translate(event)]
    return parts, waits, before, events[start + 1:]


async def test_an_approval_told_before_the_reply_that_made_the_call_is_asked_after_its_input_then_pauses(
        store: Store, ctx: Context) -> None:
    """The approvals tell a waiting call as the drive asks, which can be before the stream has
    read the reply that made the call: the request still follows the call's input, and with no
    tool running the stream pauses there (`finish`, `tool-calls`); what comes after gives nothing."""
    parts, waits, before, rest = await call_waiting(store, ctx)
    told = parts.approval(ApprovalChange(waits, None))
    after = streamed(parts, rest, {waits.tool_call_id})

    assert told == []
    kinds = [part["type"] for part in before + after]
    asked = kinds.index("tool-approval-request")
    assert kinds[asked - 1] == "tool-input-available"
    assert kinds[-2:] == ["finish-step", "finish"]
    assert after[-1] == {"type": "finish", "finishReason": "tool-calls"}
    assert parts.finished
    assert "tool-output-available" not in kinds


def test_a_continued_message_gets_only_the_outputs_rows_and_steers_it_lacks() -> None:
    """An approval answer's stream goes on with the client's message: of the run's replay it sends
    the `start` and what that message does not hold yet, never text or inputs it has."""
    replay: list[UiPart] = [
        {"type": "start", "messageId": "run"}, {"type": "start-step"}, {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "Checking."}, {"type": "text-end", "id": "text-1"},
        {"type": "tool-input-available", "toolCallId": "a", "toolName": "probe", "input": {}},
        {"type": "tool-approval-request", "approvalId": "a", "toolCallId": "a"},
        {"type": "tool-output-available", "toolCallId": "b", "output": "probe:b"},
        {"type": "tool-output-available", "toolCallId": "c", "output": "half", "preliminary": True},
        {"type": "tool-approval-request", "approvalId": "c", "toolCallId": "c"},
        {"type": "data-chat-event", "id": "r1", "data": {}}, {"type": "steering-message", "id": "s1", "parts": []},
        {"type": "data-chat-event", "id": "r2", "data": {}},
        {"type": "tool-output-error", "toolCallId": "gone", "errorText": "no such part"},
    ]
    held = UiMessageIn(id="run", role="assistant", parts=[
        {"type": "step-start"}, {"type": "text", "text": "Checking."},
        {"type": "tool-probe", "toolCallId": "a", "state": "approval-responded",
         "approval": {"id": "a", "approved": True}},
        {"type": "tool-probe", "toolCallId": "b", "state": "input-available"},
        {"type": "tool-probe", "toolCallId": "c", "state": "input-available"},
        {"type": "data-chat-event", "id": "r1", "data": {}},
    ])

    assert unseen(replay, held) == [
        {"type": "start", "messageId": "run"},
        {"type": "tool-output-available", "toolCallId": "b", "output": "probe:b"},
        {"type": "tool-approval-request", "approvalId": "c", "toolCallId": "c"},
        {"type": "steering-message", "id": "s1", "parts": []},
        {"type": "data-chat-event", "id": "r2", "data": {}},
    ]


@pytest.mark.parametrize(("part", "answer"), [
    ({"state": "approval-responded", "approval": {"id": "a", "approved": True}}, Approval(allow=True)),
    ({"state": "approval-responded", "approval": {"id": "a", "approved": False, "reason": "not now"}},
     Approval(allow=False, reason="not now")),
])
def test_an_answered_tool_part_is_an_approval_by_its_id(part: dict[str, Any], answer: Approval) -> None:
    message = UiMessageIn(id="run", role="assistant", parts=[
        {"type": "tool-probe", "toolCallId": "b", "state": "output-available"},
        {"type": "tool-probe", "toolCallId": "a", **part}])

    assert approval_answers(message) == {"a": answer}


async def test_a_call_answered_elsewhere_just_before_the_pause_is_not_paused_on(store: Store, ctx: Context) -> None:
    """Issue 30: a call read waiting (from the journal: its holder is another process) is answered
    there just before the stream would pause on it: the stream reads the calls waiting again
    before it pauses, finds it no longer waits, and goes on with the call's output and the rest of
    the run, to its `finish`, having asked it once."""
    parts, waits, before, rest = await call_waiting(store, ctx)
    parts.approval(ApprovalChange(waits, None))
    after = streamed(parts, rest, set())  # answered: waits no more

    kinds = [part["type"] for part in before + after]
    assert kinds.count("tool-approval-request") == 1
    assert {"type": "finish", "finishReason": "tool-calls"} not in after
    assert "tool-output-available" in kinds
    assert kinds[-1] == "finish"
    assert parts.finished
