"""The checkpoint between steps: the between-step hook, placing queued input, the step ceiling,
the budget, a threshold compaction, and then the next step, or the end of the run."""

from __future__ import annotations

from collections.abc import Sequence

from harness.errors import ModelUnavailable, ToolsUnavailable
from harness.messages import Message, OutputSchema
from harness.runtime.branch_context import estimate_tokens
from harness.runtime.commit import (
    Decision,
    Placement,
    Transition,
    current_phase,
    payload_of,
    pending_payload,
)
from harness.runtime.drive.operation import DrivenOperation
from harness.runtime.drive.provider_step import generate, intent_events, step_intent
from harness.runtime.drive.settlement import failure, settle
from harness.runtime.drive.structural import below_threshold, threshold_compaction
from harness.runtime.event_log import Announcement
from harness.runtime.hooks import OutputAnswer
from harness.runtime.outcomes import DriveOutcome
from harness.runtime.output import Accepted, judge, reply_of, run_entries
from harness.session import CommitResult, SessionMutator, addresses
from harness.session.ids import new_id
from harness.session.records import (
    AssistantReady,
    GenerationContext,
    MayFinish,
    NeedAssistant,
    RunCheckpoint,
    RunIntent,
)


async def checkpoint(op: DrivenOperation, state: RunCheckpoint) -> DriveOutcome | Transition | None:
    """Place what is queued; then ask the model again, or, when the run may finish and nothing was
    placed (the before-run-end hook included), settle it completed."""
    hooks = op.hooks
    extra: Sequence[Message] = ()
    if (hooks.between_steps is not None and isinstance(state.continuation, NeedAssistant) and state.steps > 0
            and not state.boundary_done):
        extra = await hooks.between_steps(op.lane, op.context)
    placed, ready = await place(op, extra, include_follow_up=isinstance(state.continuation, MayFinish), then=state)
    if placed or isinstance(state.continuation, NeedAssistant):
        return await _next_step(op, state, ready)
    if hooks.before_run_end is not None:
        await hooks.before_run_end(op.lane, op.context)
        placed, ready = await place(op, (), include_follow_up=True, then=state)
        if placed:
            return await _next_step(op, state, ready)
    meta = op.projection.meta
    if meta is not None and isinstance(meta.intent, RunIntent) and meta.intent.output is not None \
            and not op.aborting:
        return await _finish_with_output(op, state, meta.intent, meta.intent.output)
    return await settle(op, state, "completed")


async def _finish_with_output(op: DrivenOperation, state: RunCheckpoint, intent: RunIntent,
                              output: OutputSchema) -> DriveOutcome | Transition | None:
    """End a run whose answer has a shape: settle it with its answer recorded when the answer fits
    (its schema, and `RunHooks.check_output` when there is one),
    send it back to the model with what is wrong while retries are left, else fail the run
    `output_invalid` (issue 32)."""
    continuation = state.continuation
    reply_id = (state.trigger_entry_id if isinstance(continuation, MayFinish)
                and continuation.include_final_assistant else None)
    entries = run_entries((await op.branch()).entries, intent.prompt_entry_ids)
    hook = op.hooks.check_output
    check = None if hook is None else (
        lambda answer: hook(OutputAnswer(op.lane.name, op.operation_id, output, answer)))
    verdict = judge(output, intent.output_retries, entries, reply_id, reply_of(entries, reply_id), check)
    if isinstance(verdict, Accepted):
        return await settle(op, state, "completed", entries=[verdict.entry])
    if verdict.feedback is not None:
        placed, ready = await place(op, [verdict.feedback], include_follow_up=True, then=state)
        if placed:
            return await _next_step(op, state, ready)
    return failure("output_invalid", f"the answer does not take the shape of output {output.name} after "
                                     f"{intent.output_retries} retries: {verdict.reason}",
                   {"schema": output.name, "retries": intent.output_retries}, "provider")


def _ready(op: DrivenOperation, state: RunCheckpoint, trigger_entry_id: str | None) -> AssistantReady:
    """The next step of a run at checkpoint `state`, asked from `trigger_entry_id`."""
    overflow_used = isinstance(state.continuation, NeedAssistant) and state.continuation.overflow_recovery_used
    retry = op.settings.retry
    generation = GenerationContext(
        step_id=new_id(), trigger_entry_id=trigger_entry_id, config=op.projection.config, step=state.steps + 1,
        max_attempts=retry.max_retries + 1, base_delay_ms=retry.base_delay_ms, overflow_recovery_used=overflow_used,
    )
    return AssistantReady(generation=generation)


async def _next_step(op: DrivenOperation, state: RunCheckpoint, ready: AssistantReady | None = None
                     ) -> DriveOutcome | Transition | None:
    if state.steps >= op.settings.step_ceiling:
        await op.lane.request_abort("step_ceiling", op.context)
        return None
    if op.hooks.over_budget is not None and await op.hooks.over_budget(op.lane, op.context):
        await op.lane.request_abort("budget", op.context)
        return None
    overflow_used = isinstance(state.continuation, NeedAssistant) and state.continuation.overflow_recovery_used
    # The model is asked next, whatever this checkpoint placed (a follow-up included): a compaction
    # first, completed or failed, resumes to ask it, never to finish the run.
    asking = state.model_copy(update={"continuation": NeedAssistant(overflow_recovery_used=overflow_used),
                                      "boundary_done": True})
    compaction = await threshold_compaction(op, asking)
    if compaction is not None:
        return compaction
    # `run_checkpoint` and `assistant_ready` are not committed on the way when nothing was placed:
    # the step's intent is the commit a restart needs, and before it the durable phase leads back
    # here. A placement commits `assistant_ready` with it (see `place`).
    return await generate(op, ready or _ready(op, state, op.projection.tip_id))


def direct_intent(op: DrivenOperation, then: RunCheckpoint, placed: Sequence[Message]) -> Transition | None:
    """The next step's intent (its `state` an `AssistantEffectPending`, with its events), for the
    commit that places `placed`, the results completing a tool batch, when checkpoint `then`
    would do nothing but ask the model again: no `between_steps`, `transform_context` or
    `over_budget` hook, no
    abort or pause requested, no write or steer item queued, the step ceiling not reached, the
    context under the compaction threshold and the model resolvable. None otherwise: the batch
    commits `then` and the checkpoint runs.

    Called on the session line, in that commit's job, so nothing queued can slip in between. A
    crash before the commit leaves the batch's last call at its intent, after it the step's
    intent with the results on the branch, as the two commits did (bench/README.md)."""
    hooks, branch = op.hooks, op.cached_branch()  # a job on the line cannot read the branch itself
    if (not isinstance(then.continuation, NeedAssistant) or hooks.between_steps is not None
            or hooks.transform_context is not None or hooks.over_budget is not None or op.aborting
            or op.pause_signal.is_set() or then.steps >= op.settings.step_ceiling
            or any(item.kind in ("write", "steer") for item in op.projection.state.inbox) or branch is None):
        return None
    ready = _ready(op, then, then.trigger_entry_id)
    config = ready.generation.config
    try:
        model, _ = op.resolve(config.model, config.active_tools)
    except (ModelUnavailable, ToolsUnavailable):
        return None  # the step fails in-band, from the checkpoint (HA-23)
    if not below_threshold(op, then, model, branch.tokens + estimate_tokens(placed)):
        return None
    intent = step_intent(ready.generation, 1)
    return Transition(intent, events=lambda: intent_events(op, intent), intent=True)


async def place(op: DrivenOperation, extra: Sequence[Message], *, include_follow_up: bool,
                then: RunCheckpoint) -> tuple[bool, AssistantReady | None]:
    """Place pending writes and steer items (and follow-ups when the run would finish) plus `extra`
    on the branch, in one commit; True if any of them asks the model to answer (a steer item, a
    follow-up or one of `extra`).

    When one is, the same commit moves the run from checkpoint `then` to `assistant_ready` for the
    step that answers it (returned), unless an abort was requested or the step ceiling is reached:
    a restart after this commit must neither finish the run with a placed follow-up unanswered
    nor place the between-step hook's messages again."""
    projection, lane = op.projection, op.lane.name
    kinds = {"write", "steer"} | ({"follow_up"} if include_follow_up else set())
    if not extra and not any(item.kind in kinds for item in projection.state.inbox):
        return False, None  # nothing queued now: what arrives later waits for the next boundary, as it would

    async def plan(m: SessionMutator) -> Decision[tuple[bool, AssistantReady | None]]:
        items = [item for item in projection.state.inbox if item.kind in kinds]
        if not items and not extra:
            return Decision((False, None))
        await projection.load_inbox(m, op.context)
        placement = Placement(projection.tip_id)
        for item in items:
            placement.stage(m, item.entry_id, pending_payload(projection.pending[item.entry_id]))
        for message in extra:
            placement.stage(m, new_id(), payload_of(message))
        for item in items:
            m.delete(addresses.pending_entry(item.entry_id))
        taken = {item.entry_id for item in items}
        lane_state = projection.state.model_copy(
            update={"inbox": [i for i in projection.state.inbox if i.entry_id not in taken]})
        m.set(addresses.branch_tip(lane), placement.tip)
        m.set(addresses.lane_state(lane), lane_state)
        # A steer, a follow-up or the hook's messages ask the model to answer; a pending write (a
        # chat-event row, say) is placed and read with the next request, and starts no step (CE-3).
        reads = bool(extra) or any(item.kind != "write" for item in items)
        ready: AssistantReady | None = None
        current = current_phase(projection, op.operation_id, intent=True)
        if reads and current is not None and then.steps < op.settings.step_ceiling:
            ready = _ready(op, then, placement.tip).model_copy(update={"control": current.control})
            m.set(addresses.operation_state(op.operation_id), ready)

        events: list[Announcement] = [*placement.events(lane)]
        if items:
            events.append(projection.queue_update(lane_state))

        def publish(result: CommitResult | None) -> None:
            projection.state = lane_state
            if ready is not None:
                projection.operation_state = ready
            placement.publish(projection, result)
            for entry_id in taken:
                projection.pending.pop(entry_id, None)

        return Decision((reads, ready), events, publish)

    return await op.run(plan)
