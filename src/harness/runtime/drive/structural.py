"""Compaction and navigation: the summary request and its retries, the compaction entry or branch
summary it becomes, the move of the tip, and the threshold check that starts a compaction inside
a run (HA-29)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Literal

from pydantic import JsonValue

from harness.errors import ModelUnavailable
from harness.messages import AssistantMessage, Message, text_of
from harness.providers import DoneEvent, ErrorEvent, Model, ProviderErrorInfo, StreamEvent, StreamOptions
from harness.runtime.branch_context import branch_entries, context_messages
from harness.runtime.commit import Decision, Placement, Transition
from harness.runtime.drive.operation import DrivenOperation
from harness.runtime.drive.settlement import DOES_NOT_FIT, settle
from harness.runtime.event_log import Announcement
from harness.runtime.events import CompactionEnd, CompactionStart, NavigationEnd, UsageRecorded
from harness.runtime.fault_points import FaultPoint, reached
from harness.runtime.outcomes import DriveOutcome
from harness.runtime.summary import (
    BRANCH_SUMMARY_REQUEST,
    SUMMARY_REQUEST,
    CompactionPlan,
    plan_compaction,
    summary_request,
)
from harness.session import (
    BranchSummaryPayload,
    CommitResult,
    CompactionPayload,
    OperationErrorRecord,
    SessionMutator,
    addresses,
)
from harness.session.ids import new_id
from harness.session.records import (
    FailureDrain,
    FailureProvenance,
    NavigationIntent,
    RunCheckpoint,
    SummaryPending,
    SummaryRetryWait,
    SummaryTask,
)

Step = DriveOutcome | Transition | None


async def threshold_compaction(op: DrivenOperation, state: RunCheckpoint) -> Transition | None:
    """A compaction to start before the next step, when the context has grown past the model's
    window minus the reserve; None when compaction is off, has failed too often in this run, or
    could not remove anything."""
    settings, registry = op.settings.compaction, op.environment.models
    if not settings.enabled or state.compaction_failures >= settings.max_failures or registry is None:
        return None
    try:
        model = registry.model(op.projection.config.model)
    except ModelUnavailable:
        return None  # the step itself fails in-band (HA-23)
    settings = settings.for_window(model.context_window)
    branch = await op.branch()
    if branch.entries and isinstance(branch.entries[-1].payload, CompactionPayload):
        return None  # nothing new since the last compaction: compacting again cannot help
    if below_threshold(op, state, model, branch.tokens):
        return None
    if plan_compaction(branch.entries, settings.keep_recent_tokens) is None:
        return None  # only the latest turn is left: nothing a compaction could remove
    task = SummaryTask(task_id=new_id(), reason="threshold", resume_after=state)
    pending = SummaryPending(task=task, config=op.projection.config, result_entry_id=new_id(),
                             max_attempts=op.settings.retry.max_retries + 1)
    start = CompactionStart(lane=op.lane.name, operation_id=op.operation_id, reason="threshold")
    return Transition(pending, events=lambda: [start], intent=True)


def below_threshold(op: DrivenOperation, state: RunCheckpoint, model: Model, tokens: int) -> bool:
    """Whether a context of `tokens` starts no threshold compaction at checkpoint `state`:
    compaction is off or has failed too often in this run, or the context fits in `model`'s
    window less the reserve."""
    settings = op.settings.compaction
    if not settings.enabled or state.compaction_failures >= settings.max_failures:
        return True
    return tokens <= model.context_window - settings.for_window(model.context_window).reserve_tokens


async def summarize(op: DrivenOperation, state: SummaryPending) -> Step:
    """Ask the model for a compaction or branch summary and commit it with what follows."""
    task, meta = state.task, op.projection.meta
    assert meta is not None
    if state.usage_id is not None and state.attempt >= state.max_attempts:  # interrupted last attempt
        return await summary_failed(op, state, "compaction_failed", "the summary request was interrupted")
    try:
        model, provider = op.resolve(state.config.model, ())
    except ModelUnavailable as unavailable:
        return await summary_failed(op, state, unavailable.code, unavailable.message, unavailable.details)
    entries = (await op.branch()).entries
    navigation = meta.intent if isinstance(meta.intent, NavigationIntent) else None
    plan = None
    fitted = op.settings.compaction.for_window(model.context_window)
    room = model.context_window - fitted.reserve_tokens
    if navigation is not None:
        leaving = await _leaving_branch(op, navigation.target_id)
        if not leaving:
            return await finish_navigation(op, navigation, None)
        request = summary_request(await _as_sent(op, leaving), BRANCH_SUMMARY_REQUEST, task.custom_instructions,
                                  room)
    else:
        plan = plan_compaction(entries, fitted.keep_recent_tokens)
        if plan is None:
            return await _summary_declined(op, state)
        request = summary_request(await _as_sent(op, plan.summarized), SUMMARY_REQUEST, task.custom_instructions,
                                  room)
    intent = state.model_copy(update={"attempt": state.attempt + 1, "usage_id": new_id()})
    if not await op.commit(Transition(intent, intent=True)):
        return None
    reached(FaultPoint.SUMMARY_INTENT)
    effect = op.effect_context()
    try:
        options = StreamOptions(session_id=f"{op.environment.session_id}:{op.lane.name}",
                                api_key=op.stream_options(model, None).api_key)
        message, error = await _collect(provider.stream(model, request, options, effect))
    finally:
        op.end_effect(effect)
    if op.abort_signal.is_set():
        return None
    usage_id = intent.usage_id
    assert usage_id is not None
    if error is not None or message.stop_reason != "stop":
        text = error.message if error else f"the summary stopped early ({message.stop_reason})"
        if error is not None and error.kind == "retryable" and intent.attempt < intent.max_attempts:
            delay = op.settings.retry.delay_ms(intent.attempt, error.retry_after_ms)
            wait = SummaryRetryWait(task=task, config=intent.config, result_entry_id=intent.result_entry_id,
                                    next_attempt=intent.attempt + 1, max_attempts=intent.max_attempts,
                                    not_before=op.settings.clock() + delay, error_message=text)

            def record_usage(m: SessionMutator) -> None:
                m.insert_usage(message.usage, usage_id=usage_id)

            return Transition(wait, record_usage)
        return await summary_failed(op, intent, "compaction_failed", text)
    summary = text_of(message.content)
    if navigation is not None:
        return await finish_navigation(op, navigation, (intent, summary, message))
    assert plan is not None
    return await _finish_compaction(op, intent, plan, summary, message)


async def _finish_compaction(op: DrivenOperation, intent: SummaryPending, plan: CompactionPlan, summary: str,
                             message: AssistantMessage) -> Step:
    lane, task, projection = op.lane.name, intent.task, op.projection
    entry_id = intent.result_entry_id
    payload = CompactionPayload(summary=summary, retained_tail=list(plan.kept), tokens_before=plan.tokens_before)
    usage_id = intent.usage_id
    assert usage_id is not None
    placement = Placement(projection.tip_id)

    def stage(m: SessionMutator) -> None:
        placement.stage(m, entry_id, payload)
        m.insert_usage(message.usage, usage_id=usage_id, entry_id=entry_id)
        m.set(addresses.branch_tip(lane), entry_id)

    def events() -> Sequence[Announcement]:
        return [*placement.events(lane),
                UsageRecorded(lane=lane, usage_id=usage_id, usage=message.usage, entry_id=entry_id),
                CompactionEnd(lane=lane, operation_id=op.operation_id, reason=_reason(task), status="completed",
                              entry_id=entry_id)]

    def publish(commit: CommitResult | None) -> None:
        placement.publish(projection, commit)

    if task.resume_after is not None:
        return Transition(task.resume_after.model_copy(update={"compaction_failures": 0}), stage, events, publish)
    return await settle(op, intent, "completed", stage=stage, tip=entry_id, events_before=events,
                        publish_before=publish)


async def _summary_declined(op: DrivenOperation, state: SummaryPending) -> Step:
    """Nothing to summarize: an overflow cannot be recovered (the run fails), anything else goes
    on without a compaction."""
    task = state.task
    if task.reason == "overflow":
        return await summary_failed(op, state, "context_overflow",
                                    "the context is too large and nothing can be compacted")
    end = CompactionEnd(lane=op.lane.name, operation_id=op.operation_id, reason=_reason(task), status="declined")
    if task.resume_after is not None:
        return Transition(task.resume_after, events=lambda: [end])
    return await settle(op, state, "completed", events_before=lambda: [end])


async def summary_failed(op: DrivenOperation, state: SummaryPending, code: str, message: str,
                         details: dict[str, JsonValue] | None = None) -> Step:
    """A compaction that failed: a standalone one fails its operation; in a run, an overflow fails
    the run, a threshold compaction lets the run go on (and after `max_failures` in a row the run
    stops trying, saying so in the `compaction_end` error)."""
    task, limit = state.task, op.settings.compaction.max_failures
    if task.reason == "overflow" and code in ("compaction_failed", "context_overflow"):
        message = f"{message}; {DOES_NOT_FIT}"  # the run fails: its context cannot be made to fit
    error = OperationErrorRecord(code=code, message=message, details=details)
    if task.resume_after is None or task.reason == "overflow":
        end = CompactionEnd(lane=op.lane.name, operation_id=op.operation_id, reason=_reason(task),
                            status="failed", error=error)
        if task.resume_after is None:
            return await settle(op, state, "failed", error=error, events_before=lambda: [end])
        return Transition(FailureDrain(error=error, provenance=FailureProvenance(kind="provider")),
                          events=lambda: [end])
    failures = task.resume_after.compaction_failures + 1
    if failures >= limit:
        error = OperationErrorRecord(
            code="compaction_stopped", details={"failures": failures, "last_error": code},
            message=f"{failures} compactions in a row failed ({message}); this run stops compacting")
    end = CompactionEnd(lane=op.lane.name, operation_id=op.operation_id, reason=_reason(task), status="failed",
                        error=error)
    return Transition(task.resume_after.model_copy(update={"compaction_failures": failures}), events=lambda: [end])


async def wait_summary_retry(op: DrivenOperation, state: SummaryRetryWait) -> Step:
    """Wait out a summary's backoff, then ask again (its intent is the next commit)."""
    if not await op.wait_until(state.not_before):
        return None
    pending = SummaryPending(task=state.task, config=state.config, result_entry_id=state.result_entry_id,
                             attempt=state.next_attempt - 1, max_attempts=state.max_attempts)
    return await summarize(op, pending)


async def _leaving_branch(op: DrivenOperation, target_id: str | None) -> list[Message]:
    """The messages of the branch being left: from the tip back to the newest entry it shares with
    `target_id`'s path (compaction-bounded on both sides)."""

    async def plan(m: SessionMutator) -> Decision[list[Message]]:
        kept = {entry.id for entry in await branch_entries(m, target_id, op.context)}
        here = await op.projection.branch_context(m, op.context)
        return Decision(context_messages([e for e in here.entries if e.id not in kept]))

    return await op.run(plan)


async def finish_navigation(op: DrivenOperation, intent: NavigationIntent,
                            summary: tuple[SummaryPending, str, AssistantMessage] | None) -> Step:
    """Move the tip to the target (after a branch summary, when one was made) and settle."""
    lane, projection = op.lane.name, op.projection
    from_tip, target = projection.tip_id, intent.target_id
    tip = target
    payload: BranchSummaryPayload | None = None
    if summary is not None:
        summarized, text, _ = summary
        payload = BranchSummaryPayload(from_id=from_tip, summary=text)
        tip = summarized.result_entry_id

    def stage(m: SessionMutator) -> None:
        if payload is not None and summary is not None:
            summarized, _, message = summary
            m.insert_entry(payload, parent_id=target, entry_id=summarized.result_entry_id)
            m.insert_usage(message.usage, usage_id=summarized.usage_id, entry_id=summarized.result_entry_id)
        m.set(addresses.branch_tip(lane), tip)
        if intent.label is not None and target is not None:
            m.set(addresses.entry_label(target), intent.label)

    def events() -> Sequence[Announcement]:
        return [NavigationEnd(lane=lane, operation_id=op.operation_id, status="completed", from_tip_id=from_tip,
                              tip_id=tip)]

    current = projection.operation_state
    assert current is not None
    return await settle(op, current, "completed", stage=stage, tip=tip, events_before=events)


async def _as_sent(op: DrivenOperation, messages: Sequence[Message]) -> list[Message]:
    """`messages` as a step would send them: through the `transform_context` hook, so a summary
    reads what the model read (the conversation layer's replayed replies, CE-8)."""
    if op.hooks.transform_context is None:
        return list(messages)
    return await op.hooks.transform_context(list(messages), op.context)


def _reason(task: SummaryTask) -> Literal["manual", "threshold", "overflow"]:
    return "manual" if task.reason == "navigation" else task.reason


async def _collect(stream: AsyncIterator[StreamEvent]) -> tuple[AssistantMessage, ProviderErrorInfo | None]:
    """The final message of a stream nobody watches (a summary: no frames, no presentation)."""
    async for event in stream:
        if isinstance(event, DoneEvent):
            return event.message, None
        if isinstance(event, ErrorEvent):
            return event.message, event.error
    error = ProviderErrorInfo(kind="other", message="the provider stream ended without a final message")
    return AssistantMessage(content=[], api="", provider="", model="", stop_reason="error",
                            error_message=error.message), error
