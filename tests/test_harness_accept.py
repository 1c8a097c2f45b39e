"""Atomic run acceptance and the appends, queues, abort requests and setters around it
(HA-12, HA-15 to HA-22)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.context import Context
from harness.messages import AssistantMessage, CustomMessage, ImageContent, ModelIdentity, TextContent, UserMessage
from harness.providers import ToolSpec
from harness.runtime import (
    AgentHarness,
    AgentTool,
    ConfigUpdate,
    HarnessClosed,
    InvalidMessage,
    LaneBusy,
    NoActiveOperation,
    OperationIdTaken,
    PromptRequest,
    PromptTemplate,
    Skill,
    SkillRequest,
    TemplateRequest,
    ToolOutput,
    UnknownSkill,
    UnknownTemplate,
)
from harness.session import (
    CustomMessagePayload,
    DeleteValue,
    InsertEntry,
    LaneState,
    MessagePayload,
    SetValue,
    Store,
    StoreUnavailable,
    UnknownEntry,
    addresses,
)
from harness.session.records import CancelRequested, InboxItem, OperationMeta, RunIntent, RunStarting
from harness_helpers import RecordingBackend, attach, harness_with_lane, record_events, recording, said
from journal_helpers import CONFIG, new_session_with_lane

IMAGE = ImageContent(data="aGVsbG8=", mime_type="image/png")


async def recorded_harness(store: Store, ctx: Context, **options: Any) -> tuple[AgentHarness, RecordingBackend]:
    watched, backend = recording(store)
    harness = await harness_with_lane(watched, ctx, **options)
    return harness, backend


async def transcript(harness: AgentHarness, ctx: Context) -> list[Any]:
    watch = await harness.lane("main").watch(ctx)
    watch.close()
    return [entry.payload.message for entry in watch.snapshot.transcript
            if isinstance(entry.payload, MessagePayload | CustomMessagePayload)]


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (PromptRequest(text="hello"), [UserMessage(content="hello", timestamp=0)]),
        (PromptRequest(images=[IMAGE]), [UserMessage(content=[IMAGE], timestamp=0)]),
        (PromptRequest(text="look", images=[IMAGE]),
         [UserMessage(content=[TextContent(text="look"), IMAGE], timestamp=0)]),
        (PromptRequest(messages=[said("one"), CustomMessage(custom_type="note", content="two", timestamp=0)]),
         [said("one"), CustomMessage(custom_type="note", content="two", timestamp=0)]),
        (PromptRequest(messages=said("single")), [said("single")]),
    ],
    ids=["text", "images", "text-and-images", "message-list", "one-message"],
)
async def test_prompt_shapes_place_their_messages(
    store: Store, ctx: Context, request_: PromptRequest, expected: list[Any]
) -> None:
    """HA-17: text, images, both, or supplied messages become the run's prompt entries."""
    harness = await harness_with_lane(store, ctx)

    accepted = await harness.lane("main").accept(request_, ctx)

    placed = await transcript(harness, ctx)
    assert [m.model_copy(update={"timestamp": 0}) for m in placed] == expected
    assert len(accepted.entry_ids) == len(expected)


@pytest.mark.parametrize(
    "request_",
    [
        PromptRequest(messages=[said("ok"), AssistantMessage(content=[], api="a", provider="p", model="m",
                                                             stop_reason="stop")]),
        PromptRequest(text="both", messages=[said("x")]),
        PromptRequest(text="x", entry_ids=["a", "b"]),
        PromptRequest(text=""),
    ],
    ids=["assistant-message", "text-and-messages", "wrong-entry-id-count", "empty"],
)
async def test_invalid_prompts_are_refused_and_write_nothing(
    store: Store, ctx: Context, request_: PromptRequest
) -> None:
    """HA-17, HA-18: a pending assistant message, mixed shapes, mismatched ids or an empty prompt
    with nothing queued are refused before anything is written."""
    harness, backend = await recorded_harness(store, ctx)
    commits = len(backend.commits)

    with pytest.raises(InvalidMessage):
        await harness.lane("main").accept(request_, ctx)

    assert len(backend.commits) == commits
    assert harness.lane("main").info().operation is None


async def test_skills_and_templates_are_formatted_and_unknown_names_refused(store: Store, ctx: Context) -> None:
    """HA-17: explicit skill formatting, template expansion, unknown skill/template errors."""
    skill = Skill(name="review", description="Review code", content="Read the diff carefully.")
    template = PromptTemplate(name="greet", description="Greet", content="Say hi to $1 and $2 ($@)")
    harness = await harness_with_lane(store, ctx, skills=[skill], prompt_templates=[template])
    lane = harness.lane("main")

    await lane.accept(SkillRequest(name="review", additional_instructions="Focus on tests."), ctx)
    with pytest.raises(UnknownSkill) as unknown_skill:
        await lane.accept(SkillRequest(name="missing"), ctx)
    with pytest.raises(UnknownTemplate) as unknown_template:
        await lane.accept(TemplateRequest(name="missing"), ctx)

    [message] = await transcript(harness, ctx)
    assert message.content == '<skill name="review">\nRead the diff carefully.\n</skill>\n\nFocus on tests.'
    assert unknown_skill.value.code == "unknown_skill"
    assert unknown_template.value.code == "unknown_template"

    other = await harness_with_lane(store, ctx, prompt_templates=[template])
    await other.lane("main").accept(TemplateRequest(name="greet", args=["Ann", "Bo"]), ctx)
    [expanded] = await transcript(other, ctx)
    assert expanded.content == "Say hi to Ann and Bo (Ann Bo)"


async def test_acceptance_writes_exactly_the_contract_and_nothing_else(store: Store, ctx: Context) -> None:
    """HA-19: insert next-run entries, insert prompt entries, delete the captured pending
    entries, set tip, meta, state `starting`, lane state, in that order, in one commit; then the
    lane's event log row of the events it announces (issue 16), one seq per durable event."""
    harness, backend = await recorded_harness(store, ctx)
    lane = harness.lane("main")
    queued = await lane.queue_next_run(said("earlier"), ctx)
    before = len(backend.commits)

    accepted = await lane.accept(PromptRequest(text="now", operation_id="op-1", entry_ids=["prompt-1"]), ctx)

    [commit] = backend.commits[before:]
    writes, logged = commit[:7], commit[7:]
    assert [type(w).__name__ for w in writes] == [
        "InsertEntry", "InsertEntry", "DeleteValue", "SetValue", "SetValue", "SetValue", "SetValue",
    ]
    # run_start, three events per placed message, queue_update
    assert [(type(w).__name__, getattr(w, "namespace", None), getattr(w, "key", None), getattr(w, "span", None))
            for w in logged] == [("AppendList", "harness.lane.events", "main", 8)]
    first, second = writes[0], writes[1]
    assert isinstance(first, InsertEntry)
    assert isinstance(second, InsertEntry)
    assert (first.id, first.parent_id) == (queued, None)
    assert (second.id, second.parent_id) == ("prompt-1", queued)
    assert isinstance(writes[2], DeleteValue)
    assert writes[2].key == queued
    assert [(w.namespace, w.key) for w in writes[3:] if isinstance(w, SetValue)] == [
        ("harness.branch.tip", "main"), ("harness.op.meta", "op-1"), ("harness.op.state", "op-1"),
        ("harness.lane.state", "main"),
    ]
    assert accepted.operation_id == "op-1"
    assert accepted.entry_ids == ("prompt-1",)

    await harness.close(ctx)
    session = await store.open_session(harness.session.id, ctx)
    assert await session.get(addresses.operation_state("op-1"), ctx) == RunStarting()
    assert await session.get(addresses.lane_state("main"), ctx) == LaneState(current_operation_id="op-1")
    assert await session.get(addresses.branch_tip("main"), ctx) == "prompt-1"
    assert await session.get(addresses.pending_entry(queued), ctx) is None
    meta = await session.get(addresses.operation_meta("op-1"), ctx)
    assert meta == OperationMeta(operation_id="op-1", lane="main", source_tip_id=None,
                                 started_at=accepted.started_at, intent=RunIntent(prompt_entry_ids=["prompt-1"]))


async def test_acceptance_emits_exact_events_in_order_with_the_accepting_context(
    store: Store, ctx: Context
) -> None:
    """HA-20, HA-22: run_start, then per placed message start/end/entry_added, then
    queue_update; watchers get the object-identical accepting Context."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    await lane.queue_next_run(said("earlier"), ctx)
    seen = record_events(harness)
    watch = await lane.watch(ctx)
    accepting = Context({"call": "accept"})

    await lane.accept(PromptRequest(text="now"), accepting)

    assert [e.type for e in seen] == [
        "run_start",
        "message_start", "message_end", "entry_added",  # the captured next-run message
        "message_start", "message_end", "entry_added",  # the prompt
        "queue_update",
    ]
    deliveries = watch.buffered()
    assert [d.event.type for d in deliveries] == [e.type for e in seen]
    assert all(d.context is accepting for d in deliveries)


async def test_an_empty_prompt_runs_when_next_run_input_is_queued(store: Store, ctx: Context) -> None:
    """HA-18: zero placed messages is refused, but queued next-run input is enough."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    await lane.queue_next_run(said("queued"), ctx)

    accepted = await lane.accept(PromptRequest(), ctx)

    assert accepted.entry_ids == ()
    assert [m.content for m in await transcript(harness, ctx)] == ["queued"]


async def test_acceptance_consults_no_registry_and_starts_nothing(store: Store, ctx: Context) -> None:
    """HA-16, HA-20: no model registry is configured and the model does not exist; tools are
    never called; no task outlives the call."""
    calls: list[str] = []

    async def execute(call_id: str, args: dict[str, Any], on_update: Any, context: Context) -> ToolOutput:
        calls.append(call_id)
        return ToolOutput(content=[])

    tool = AgentTool(spec=ToolSpec(name="t", description="d", parameters={"type": "object"}), execute=execute)
    harness = await harness_with_lane(store, ctx, tools=[tool])
    lane = harness.lane("main")
    await lane.set_model(ModelIdentity(provider="nowhere", model_id="nothing"), ctx)
    before = asyncio.all_tasks()

    await lane.accept(PromptRequest(text="go"), ctx)

    assert calls == []
    assert {t for t in asyncio.all_tasks() if not t.done()} <= before


async def test_a_busy_lane_refuses_acceptance(store: Store, ctx: Context) -> None:
    """HA-18: an open operation makes a second acceptance fail with LaneBusy, writing nothing."""
    harness, backend = await recorded_harness(store, ctx)
    lane = harness.lane("main")
    await lane.accept(PromptRequest(text="first"), ctx)
    commits = len(backend.commits)

    with pytest.raises(LaneBusy):
        await lane.accept(PromptRequest(text="second"), ctx)

    assert len(backend.commits) == commits


async def test_concurrent_acceptances_have_exactly_one_winner(store: Store, ctx: Context) -> None:
    """HA-21: of several concurrent accepts on one idle lane exactly one commits."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")

    outcomes = await asyncio.gather(*(lane.accept(PromptRequest(text=f"p{i}"), ctx) for i in range(5)),
                                    return_exceptions=True)

    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(o, LaneBusy) for o in outcomes if o not in winners)
    assert len(await transcript(harness, ctx)) == 1


async def test_a_failed_commit_leaves_no_state_and_no_event(store: Store, ctx: Context) -> None:
    """HA-21: when the acceptance commit fails nothing is published, emitted or written."""
    harness, backend = await recorded_harness(store, ctx)
    lane = harness.lane("main")
    await lane.queue_next_run(said("kept"), ctx)
    seen = record_events(harness)
    backend.fail_next_commit = StoreUnavailable("disk went away")

    with pytest.raises(StoreUnavailable):
        await lane.accept(PromptRequest(text="lost"), ctx)

    assert seen == []
    assert lane.info().operation is None
    assert lane.tip_id is None
    assert isinstance(harness.persistence_failure, StoreUnavailable)  # the latch CE-3 reads
    retry = await lane.accept(PromptRequest(text="again"), ctx)
    assert [m.content for m in await transcript(harness, ctx)] == ["kept", "again"]
    assert retry.operation_id == lane.info().operation.id  # type: ignore[union-attr]


async def test_close_during_acceptance_leaves_all_or_nothing(store: Store, ctx: Context) -> None:
    """HA-21: an acceptance racing close either fully commits before it or is refused."""
    session = await new_session_with_lane(store, ctx)
    harness, _ = await attach(session, ctx)

    accepted, _ = await asyncio.gather(harness.lane("main").accept(PromptRequest(text="race"), ctx),
                                       harness.close(ctx), return_exceptions=True)
    late = await asyncio.gather(harness.lane("main").accept(PromptRequest(text="late"), ctx),
                                return_exceptions=True)

    assert isinstance(late[0], HarnessClosed)
    state = await session.get(addresses.lane_state("main"), ctx)
    assert state is not None
    if isinstance(accepted, BaseException):
        assert state.current_operation_id is None
        assert await session.get(addresses.branch_tip("main"), ctx) is None
    else:
        assert state.current_operation_id == accepted.operation_id
        assert await session.get(addresses.operation_state(accepted.operation_id), ctx) == RunStarting()


async def test_supplied_ids_already_in_use_are_refused(store: Store, ctx: Context) -> None:
    """HA-17: a supplied operation or entry id that exists is refused; nothing is written."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    entry_id = await lane.append_message(said("exists"), ctx)
    accepted = await lane.accept(PromptRequest(text="first", operation_id="op"), ctx)
    other = await harness.create_lane("other", CONFIG, ctx)

    with pytest.raises(OperationIdTaken):
        await other.accept(PromptRequest(text="dup", operation_id=accepted.operation_id), ctx)
    with pytest.raises(OperationIdTaken):
        await other.accept(PromptRequest(text="dup", entry_ids=[entry_id]), ctx)
    assert other.info().operation is None


async def test_appends_place_at_once_when_idle_and_wait_while_busy(store: Store, ctx: Context) -> None:
    """CE-4, HA-15: an idle append is an entry with message events; during an operation it is a
    pending write shown in `queue_update` and the snapshot."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    seen = record_events(harness)

    idle = await lane.append_message(said("idle"), ctx)
    await lane.accept(PromptRequest(text="run"), ctx)
    seen.clear()
    pending = await lane.append_message(said("while busy"), ctx)
    custom = await lane.append_custom("marker", {"n": 1}, ctx)

    assert [e.type for e in seen] == ["queue_update", "queue_update"]
    watch = await lane.watch(ctx)
    assert [w.entry_id for w in watch.snapshot.pending_writes] == [pending, custom]
    assert watch.snapshot.pending_writes[1].data == {"n": 1}
    assert next(e.id for e in watch.snapshot.transcript) == idle


async def test_queues_need_an_open_operation_except_next_run(store: Store, ctx: Context) -> None:
    """HA-18: steer and follow-up need an open operation; next-run is always accepted; each
    stores its entry by a pre-minted id and emits the full queues."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    with pytest.raises(NoActiveOperation):
        await lane.steer(said("too early"), ctx)
    with pytest.raises(NoActiveOperation):
        await lane.follow_up(said("too early"), ctx)
    await lane.accept(PromptRequest(text="run"), ctx)
    seen = record_events(harness)

    steer = await lane.steer(said("steer"), ctx)
    follow = await lane.follow_up(said("follow"), ctx)
    later = await lane.queue_next_run(said("later"), ctx)

    last = seen[-1]
    assert last.type == "queue_update"
    assert [i.entry_id for i in last.queues.steer] == [steer]
    assert [i.entry_id for i in last.queues.follow_up] == [follow]
    assert [i.entry_id for i in last.queues.next_run] == [later]
    with pytest.raises(InvalidMessage):
        await lane.steer(AssistantMessage(content=[], api="a", provider="p", model="m", stop_reason="stop"), ctx)


async def test_abort_request_is_durable_drains_queues_and_is_idempotent(store: Store, ctx: Context) -> None:
    """HA-5, CE-7: the abort request is committed with its cause; steer and follow-up items move
    into it (kept stored); inventory and inspection show `aborting`; a repeat changes nothing."""
    session = await new_session_with_lane(store, ctx)
    harness, _ = await attach(session, ctx)
    lane = harness.lane("main")
    await lane.accept(PromptRequest(text="run"), ctx)
    steer = await lane.steer(said("s"), ctx)
    follow = await lane.follow_up(said("f"), ctx)
    later = await lane.queue_next_run(said("n"), ctx)
    seen = record_events(harness)

    first = await lane.request_abort("user_during_tool", ctx)
    again = await lane.request_abort("user", ctx)

    assert (first.newly_requested, first.steer, first.follow_up) == (True, (steer,), (follow,))
    assert (again.newly_requested, again.steer) == (False, ())
    assert [e.type for e in seen] == ["operation_abort", "queue_update"]
    await harness.close(ctx)
    _, [operation] = await attach(session, ctx)
    assert operation.aborting is True
    state = await harness.session.get(addresses.lane_state("main"), ctx)
    assert state is not None
    assert state.inbox == [InboxItem(entry_id=later, kind="next_run")]
    assert await harness.session.get(addresses.pending_entry(steer), ctx) is not None
    stored = await harness.session.get(addresses.operation_state(first.operation_id), ctx)
    assert stored is not None
    assert isinstance(stored.control, CancelRequested)
    assert stored.control.cause == "user_during_tool"  # the first cause stands
    with pytest.raises(NoActiveOperation):
        await (await harness_with_lane(store, ctx)).lane("main").request_abort("user", ctx)


async def test_setters_commit_and_emit_their_events(store: Store, ctx: Context) -> None:
    """HA-15: model, thinking level, active tools, session name and entry label each commit
    and emit their event through the commit continuation."""
    harness = await harness_with_lane(store, ctx)
    lane = harness.lane("main")
    entry = await lane.append_message(said("label me"), ctx)
    seen = record_events(harness)
    model = ModelIdentity(provider="openai", model_id="gpt-4o")

    await lane.set_model(model, ctx)
    await lane.set_thinking_level("high", ctx)
    await lane.set_active_tools(["read", "grep"], ctx)
    await harness.set_session_name("my session", ctx)
    await harness.set_entry_label(entry, "important", ctx)
    with pytest.raises(UnknownEntry):
        await harness.set_entry_label("missing", "x", ctx)

    assert [(e.type, getattr(e, "field", getattr(e, "key", None))) for e in seen] == [
        ("config_update", "model"), ("config_update", "thinking_level"), ("config_update", "active_tools"),
        ("value_update", "session_name"), ("value_update", "entry_label"),
    ]
    model_update = seen[0]
    assert isinstance(model_update, ConfigUpdate)
    assert (model_update.previous, model_update.value) == (CONFIG.model, model)
    assert lane.config.model == model
    assert lane.config.active_tools == ["read", "grep"]
    assert await harness.session_name(ctx) == "my session"
    assert await harness.entry_label(entry, ctx) == "important"
    await harness.close(ctx)
    reopened, _ = await attach(harness.session, ctx)
    assert reopened.lane("main").config.thinking_level == "high"


async def test_lane_creation_emits_lane_created_in_its_commit_continuation(store: Store, ctx: Context) -> None:
    """HA-15: `lane_created` is emitted when the lane's commit lands; the lane is usable at once."""
    harness = await harness_with_lane(store, ctx)
    entry = await harness.lane("main").append_message(said("fork here"), ctx)
    seen = record_events(harness)

    side = await harness.create_lane("side", CONFIG, ctx, at=entry)

    assert [e.type for e in seen] == ["lane_created"]
    assert side.tip_id == entry
    assert harness.lane("side") is side
    accepted = await side.accept(PromptRequest(text="on the side"), ctx)
    watch = await side.watch(ctx)
    assert [e.id for e in watch.snapshot.transcript] == [entry, accepted.entry_ids[0]]
    assert isinstance(watch.snapshot.transcript[0].payload, MessagePayload)
