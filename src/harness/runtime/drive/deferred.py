"""Deferred replies: a provider that answers later is polled (once per permission), a poll a
crash interrupted is made again, and an aborted run cancels what it waits for (HA-27)."""

from __future__ import annotations

from harness.context import Context
from harness.errors import HarnessError, ModelUnavailable
from harness.messages import AssistantMessage
from harness.providers import DeferredProvider
from harness.runtime.commit import Decision, Transition
from harness.runtime.drive.operation import DrivenOperation
from harness.runtime.drive.provider_step import consume, settle_reply
from harness.runtime.drive.settlement import failure
from harness.runtime.errors import HarnessFault
from harness.runtime.events import DeferredHandle, RunResume, TurnStart
from harness.runtime.fault_points import FaultPoint, reached
from harness.session import MessagePayload, OperationErrorRecord, SessionMutator, addresses
from harness.session.ids import new_id
from harness.session.records import DeferredEffectPending, DeferredSuspended, FailureDrain, FailureProvenance


async def poll(op: DrivenOperation, state: DeferredSuspended) -> Transition | None:
    """Commit the poll's intent, fetch the reply, and return its settlement."""
    generation = state.generation
    try:
        model, provider = op.resolve(generation.config.model, ())
    except ModelUnavailable as unavailable:
        return failure(unavailable.code, unavailable.message, unavailable.details, "configuration")
    if not isinstance(provider, DeferredProvider):
        return failure("deferred_unsupported", f"provider {model.provider} cannot fetch deferred replies",
                       {"provider": model.provider}, "configuration")
    handle = await deferred_handle(op, state.source_entry_id)
    intent = DeferredEffectPending(generation=generation, source_entry_id=state.source_entry_id,
                                   poll=state.poll + 1, response_entry_id=new_id(), usage_id=new_id())
    resume = RunResume(lane=op.lane.name, operation_id=op.operation_id)
    turn = TurnStart(lane=op.lane.name, operation_id=op.operation_id,
                     turn_id=f"{generation.step_id}:poll:{intent.poll}")
    if not await op.commit(Transition(intent, events=lambda: [resume, turn], intent=True)):
        return None
    effect = op.effect_context()
    try:
        options = op.stream_options(model, generation)
        message, error, framed = await consume(op, lambda: provider.poll(model, handle.id, options, effect), intent,
                                               model)
    finally:
        op.end_effect(effect)
    reached(FaultPoint.BEFORE_REPLY_SETTLEMENT)
    return settle_reply(op, intent, message, error, framed=framed)


def recover_poll(op: DrivenOperation, state: DeferredEffectPending) -> Transition:
    """A poll a crash interrupted: the provider still holds the answer, so the poll is made again
    under the same number, dropping the reserved ids and partial frames; if the model is gone,
    redemption is abandoned through a configuration failure, settling nothing (HA-24)."""
    frames = addresses.assistant_frames(op.operation_id, state.response_entry_id)

    def drop_frames(m: SessionMutator) -> None:
        m.delete_list(frames)

    try:
        op.resolve(state.generation.config.model, ())
    except ModelUnavailable as unavailable:
        error = OperationErrorRecord(code=unavailable.code, message=unavailable.message, details=unavailable.details)
        return Transition(FailureDrain(error=error, provenance=FailureProvenance(kind="configuration")), drop_frames)
    return Transition(DeferredSuspended(generation=state.generation, source_entry_id=state.source_entry_id,
                                        poll=state.poll - 1), drop_frames)


async def deferred_handle(op: DrivenOperation, source_entry_id: str) -> DeferredHandle:
    """The handle the deferred reply in entry `source_entry_id` holds."""

    async def plan(m: SessionMutator) -> Decision[DeferredHandle]:
        entry = op.projection.cached_entry(source_entry_id) or await m.entry(source_entry_id, op.context)
        message = entry.payload.message if entry and isinstance(entry.payload, MessagePayload) else None
        if not isinstance(message, AssistantMessage) or not message.deferred_id:
            raise HarnessFault(f"entry {source_entry_id} holds no deferred handle")
        handle = DeferredHandle(id=message.deferred_id, provider=message.provider, model_id=message.model,
                                api=message.api)
        return Decision(handle)

    return await op.run(plan)


async def cancel_deferred(op: DrivenOperation, state: DeferredSuspended) -> None:
    """Ask the provider to drop the reply it holds; best effort, the run settles aborted anyway."""
    try:
        model, provider = op.resolve(state.generation.config.model, ())
        handle = await deferred_handle(op, state.source_entry_id)
        if isinstance(provider, DeferredProvider):
            await provider.cancel(model, handle.id, Context(op.context.attributes))
    except HarnessError:
        pass
