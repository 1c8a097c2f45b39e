"""Driving one operation: one pass per lane that moves the durable phase forward until the operation
settles or waits (a retry, a deferred reply).

Every step is intent commit, effect, settlement commit (DESIGN.md, phases). The lane projection is
the authority: each transition reads the current phase from it and replaces it whole, keeping the
control field, so an abort request committed meanwhile is never lost. Provider and tool effects
run off the session line; their results come back as lane jobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Literal

from pydantic import JsonValue

from harness.context import Context
from harness.errors import HarnessError, ModelUnavailable, ToolsUnavailable
from harness.messages import (
    AssistantMessage,
    Message,
    ModelIdentity,
    TextContent,
    ThinkingContent,
    ToolCall,
    now_ms,
)
from harness.providers import (
    AssistantStreamAccumulator,
    DeferredProvider,
    DoneEvent,
    ErrorEvent,
    Model,
    Provider,
    ProviderErrorInfo,
    ProviderRequest,
    StartEvent,
    StreamEvent,
    StreamOptions,
)
from harness.providers.errors import classify_exception
from harness.runtime.branch_context import BranchContext, branch_entries, context_messages
from harness.runtime.drive_types import INTERRUPTED_REPLY, ResumeOutcome, Settled, Suspended, WaitingRetry
from harness.runtime.errors import HarnessFault
from harness.runtime.events import (
    CompactionEnd,
    CompactionStart,
    DeferredHandle,
    EntryAdded,
    HarnessEvent,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    NavigationEnd,
    RetryEnd,
    RetryScheduled,
    RetryStart,
    RunEnd,
    RunResume,
    RunSuspend,
    TurnEnd,
    TurnStart,
    UsageRecorded,
)
from harness.runtime.fault_points import FaultPoint, reached
from harness.runtime.lane import Decision, Placement, payload_of, pending_payload, placed_events
from harness.runtime.snapshot import LanePresentation, frames_message, queued_item
from harness.runtime.summary import (
    BRANCH_SUMMARY_REQUEST,
    SUMMARY_REQUEST,
    CompactionPlan,
    plan_compaction,
    summary_request,
)
from harness.runtime.tool_batch import ToolBatchRunner
from harness.session import (
    AssistantEffectPending,
    AssistantReady,
    AssistantRetryWait,
    BranchSummaryPayload,
    CancelRequested,
    CommitResult,
    CompactionPayload,
    DeferredEffectPending,
    DeferredSuspended,
    Entry,
    FailureDrain,
    FailureProvenance,
    GenerationContext,
    LaneLastResult,
    MayFinish,
    MessagePayload,
    NavigationReady,
    NeedAssistant,
    OperationErrorRecord,
    OperationState,
    RunCheckpoint,
    RunStarting,
    RunTools,
    SessionMutator,
    StorageCorruption,
    SummaryPending,
    SummaryRetryWait,
    SummaryTask,
    ToolBatch,
    ToolCallState,
    addresses,
    new_id,
)
from harness.session.records import NavigationIntent

if TYPE_CHECKING:
    from harness.runtime.lane import Lane

DOES_NOT_FIT = ("the conversation no longer fits the model's context window: go back to an entry before the "
                "largest one, or to the start of the session (in the chat: /tree, where 0 is the start), or "
                "fork the session from an earlier entry (/fork)")
"""The way out a run names when its context cannot be made to fit: moving the tip back
(navigation) to before the entry that is too big; compacting again cannot remove the latest turn."""


class KeepTip(Enum):
    """The settlement leaves the tip where it is (a tip of None is the empty branch)."""

    KEEP = "keep"


class RunDriver:
    """The process-local owner of one lane's current operation while a drive runs (HA-6 `running`)."""

    def __init__(self, lane: Lane, operation_id: str, context: Context) -> None:
        self.lane = lane
        self.harness = lane._harness
        self.settings = self.harness.options.drive
        self.hooks = self.harness.options.hooks
        self.operation_id = operation_id
        self.context = context
        self.abort_requested = asyncio.Event()
        self._effects: set[Context] = set()
        self.wait_for_retry = True
        self.poll_permits = 0
        self.halted = False
        self.effect_tasks: set[asyncio.Task[None]] = set()
        self.task: asyncio.Task[ResumeOutcome] | None = None

    # -- effects and abort ------------------------------------------------------------------------

    def effect_context(self) -> Context:
        """A Context for one provider request or tool execution; an abort request cancels it."""
        effect = Context(self.context.attributes)
        if self.abort_requested.is_set():
            effect.cancel("abort requested")
        self._effects.add(effect)
        return effect

    def end_effect(self, effect: Context) -> None:
        self._effects.discard(effect)

    def halt(self) -> None:
        """Stop this pass now (the harness is closing): cancel its effects and its task. Its
        durable phase stays as it is, for the next attachment to resume."""
        self.halted = True
        for effect in list(self._effects):
            effect.cancel("the harness is closing")
        for task in list(self.effect_tasks):
            task.cancel()
        if self.task is not None:
            self.task.cancel()

    def on_abort(self) -> None:
        """Called in the commit continuation of a durable abort request."""
        self.abort_requested.set()
        for effect in list(self._effects):
            effect.cancel("abort requested")

    # -- the pass -------------------------------------------------------------------------------

    async def run(self) -> ResumeOutcome:
        try:
            while True:
                outcome = await self._advance()
                if outcome is not None:
                    return outcome
        finally:
            self.lane._presentation.streaming_message = None
            self.lane._presentation.tool_progress.clear()
            if self.lane._drive is self:
                self.lane._drive = None

    async def _advance(self) -> ResumeOutcome | None:
        state = self.lane._operation_state
        if state is None or self.lane._meta is None or self.lane._meta.operation_id != self.operation_id:
            return self._settled_elsewhere()
        if isinstance(state.control, CancelRequested):
            return await self._settle_aborted(state, state.control)
        match state:
            case RunStarting():
                # Not committed: a restart before the step's intent starts from `starting` again.
                await self._checkpoint(RunCheckpoint(continuation=NeedAssistant(), trigger_entry_id=self.lane._tip_id))
            case RunCheckpoint():
                await self._checkpoint(state)
            case AssistantReady():
                await self._generate(state)
            case AssistantEffectPending():
                await self._settle_reply(state, await self._interrupted_reply(state), _interruption())
            case AssistantRetryWait():
                return await self._wait_retry(state)
            case RunTools():
                await ToolBatchRunner(self, state).run()
            case DeferredSuspended():
                if self.poll_permits == 0:
                    return Suspended(operation_id=self.operation_id,
                                     deferred=await self._deferred_handle(state.source_entry_id))
                self.poll_permits -= 1
                await self._poll_deferred(state)
            case DeferredEffectPending():
                await self._recover_poll(state)
            case FailureDrain():
                return await self._settle(state, "failed", error=state.error)
            case SummaryPending():
                return await self._summarize(state)
            case SummaryRetryWait():
                return await self._wait_summary_retry(state)
            case NavigationReady():
                assert isinstance(self.lane._meta.intent, NavigationIntent)
                return await self._finish_navigation(self.lane._meta.intent, None)
        return None

    def _settled_elsewhere(self) -> ResumeOutcome:
        last = self.lane._last_result
        if last is None or last.operation_id != self.operation_id:
            raise HarnessFault(f"operation {self.operation_id} vanished without a result")
        return Settled(operation_id=self.operation_id, result=last)

    # -- commits --------------------------------------------------------------------------------

    async def _transition(
        self,
        make_state: OperationState | Callable[[OperationState], OperationState],
        stage: Callable[[SessionMutator], None] | None = None,
        events: Callable[[CommitResult | None], Sequence[HarnessEvent]] | None = None,
        *,
        intent: bool = False,
    ) -> bool:
        """Commit the next phase (replacing the whole state, keeping its control) plus `stage`'s
        writes, then publish and emit `events`. An intent is not committed once an abort was
        requested (False); an outcome always is, since admitted work must settle."""
        lane = self.lane

        async def plan(m: SessionMutator) -> Decision[bool]:
            current = lane._operation_state
            if current is None or (intent and isinstance(current.control, CancelRequested)):
                return Decision(False, lambda _: [])
            new_state = make_state(current) if callable(make_state) else make_state
            new_state = new_state.model_copy(update={"control": current.control})
            if stage is not None:
                stage(m)  # first, so an entry it inserts is write 0 of the commit
            m.set(addresses.operation_state(self.operation_id), new_state)

            def after(result: CommitResult | None) -> Sequence[HarnessEvent]:
                lane._operation_state = new_state
                return events(result) if events is not None else []

            return Decision(True, after)

        return await lane._command(plan, self.context)


    # -- checkpoints: placing queued input, finishing -------------------------------------------

    async def _checkpoint(self, state: RunCheckpoint) -> None:
        lane, hooks = self.lane, self.hooks
        extra: Sequence[Message] = ()
        if hooks.between_steps is not None and isinstance(state.continuation, NeedAssistant) and state.steps > 0:
            extra = await hooks.between_steps(lane, self.context)
        placed = await self._place(extra, include_follow_up=isinstance(state.continuation, MayFinish))
        if placed or isinstance(state.continuation, NeedAssistant):
            await self._ready_or_ceiling(state)
            return
        if hooks.before_run_end is not None:
            await hooks.before_run_end(lane, self.context)
            if await self._place((), include_follow_up=True):
                await self._ready_or_ceiling(state)
                return
        await self._settle(state, "completed")

    async def _ready_or_ceiling(self, state: RunCheckpoint) -> None:
        if state.steps >= self.settings.step_ceiling:
            await self.lane.request_abort("step_ceiling", self.context)
            return
        overflow_used = isinstance(state.continuation, NeedAssistant) and state.continuation.overflow_recovery_used
        # The model is asked next, whatever this checkpoint placed (a follow-up included): a
        # compaction first, completed or failed, resumes to ask it, never to finish the run.
        asking = state.model_copy(update={"continuation": NeedAssistant(overflow_recovery_used=overflow_used)})
        if await self._maybe_compact(asking):
            return
        retry = self.settings.retry
        generation = GenerationContext(
            step_id=new_id(), trigger_entry_id=self.lane._tip_id, config=self.lane._config, step=state.steps + 1,
            max_attempts=retry.max_retries + 1, base_delay_ms=retry.base_delay_ms,
            overflow_recovery_used=overflow_used,
        )
        # `assistant_ready` is not committed on the way: the step's intent, next, is the commit
        # a restart needs; before it, the durable phase still leads back to this checkpoint.
        await self._generate(AssistantReady(generation=generation))

    async def _place(self, extra: Sequence[Message], *, include_follow_up: bool) -> bool:
        """Place pending writes and steer items (and follow-ups when the run would finish) plus
        `extra` on the branch, in one commit; True if any of them is a message the model reads."""
        lane = self.lane

        async def plan(m: SessionMutator) -> Decision[bool]:
            kinds = {"write", "steer"} | ({"follow_up"} if include_follow_up else set())
            items = [item for item in lane._state.inbox if item.kind in kinds]
            if not items and not extra:
                return Decision(False, lambda _: [])
            await lane._load_inbox(m, self.context)
            placement = Placement(lane._tip_id)
            for item in items:
                placement.stage(m, item.entry_id, pending_payload(lane._pending[item.entry_id]))
            for message in extra:
                placement.stage(m, new_id(), payload_of(message))
            for item in items:
                m.delete(addresses.pending_entry(item.entry_id))
            taken = {item.entry_id for item in items}
            inbox = [i for i in lane._state.inbox if i.entry_id not in taken]
            lane_state = lane._state.model_copy(update={"inbox": inbox})
            m.set(addresses.branch_tip(lane.name), placement.tip)
            m.set(addresses.lane_state(lane.name), lane_state)
            projects = any(payload.type in ("message", "custom_message") for _, payload, _ in placement.staged)

            def after(result: CommitResult | None) -> Sequence[HarnessEvent]:
                lane._state = lane_state
                events = lane._placed(placement, result)
                for entry_id in taken:
                    lane._pending.pop(entry_id, None)
                if items:
                    events.append(lane._queue_update())
                return events

            return Decision(projects, after)

        return await lane._command(plan, self.context)

    # -- assistant steps ------------------------------------------------------------------------

    def _resolve(self, config_model: ModelIdentity, active_tools: Sequence[str]) -> tuple[Model, Provider]:
        """Resolve the captured model and tools at the execution boundary (HA-23)."""
        registry = self.harness.options.models
        if registry is None:
            raise ModelUnavailable(config_model.provider, config_model.model_id)
        model, provider = registry.resolve(config_model)
        missing = [name for name in active_tools if name not in self.harness._tools]
        if missing:
            raise ToolsUnavailable(missing)
        return model, provider

    def _options(self, model: Model, generation: GenerationContext | None) -> StreamOptions:
        registry = self.harness.options.models
        api_key = registry.api_key(model) if registry is not None else None
        thinking = generation.config.thinking_level if generation is not None else "off"
        return StreamOptions(thinking_level=thinking, api_key=api_key,
                             session_id=f"{self.harness.session.id}:{self.lane.name}")

    async def _generate(self, state: AssistantReady) -> None:
        generation = state.generation
        try:
            model, provider = self._resolve(generation.config.model, generation.config.active_tools)
        except (ModelUnavailable, ToolsUnavailable) as unavailable:
            await self._fail(unavailable.code, unavailable.message, unavailable.details, "configuration")
            return
        messages = list((await self._branch()).messages)
        if self.hooks.transform_context is not None:
            messages = await self.hooks.transform_context(messages, self.context)
        tools = tuple(self.harness._tools[name].spec for name in generation.config.active_tools)
        if model.max_tool_steps is not None and generation.step > model.max_tool_steps:
            tools = ()  # a model too small to trust with more tool steps answers in text now
        request = ProviderRequest(system_prompt=self.harness.options.system_prompt, messages=tuple(messages),
                                  tools=tools)
        intent = AssistantEffectPending(generation=generation, attempt=state.next_attempt,
                                        response_entry_id=new_id(), usage_id=new_id())
        turn = TurnStart(lane=self.lane.name, operation_id=self.operation_id, turn_id=generation.step_id)
        retry: list[HarnessEvent] = [] if intent.attempt == 1 else [
            RetryStart(lane=self.lane.name, operation_id=self.operation_id, attempt=intent.attempt)]
        if not await self._transition(intent, events=lambda _: [turn, *retry], intent=True):
            return
        reached(FaultPoint.ASSISTANT_INTENT)
        effect = self.effect_context()
        try:
            options = self._options(model, generation)
            message, error = await self._consume(lambda: provider.stream(model, request, options, effect), intent,
                                                 model)
        finally:
            self.end_effect(effect)
        reached(FaultPoint.BEFORE_REPLY_SETTLEMENT)
        await self._settle_reply(intent, message, error)

    async def _poll_deferred(self, state: DeferredSuspended) -> None:
        generation = state.generation
        try:
            model, provider = self._resolve(generation.config.model, ())
        except ModelUnavailable as unavailable:
            await self._fail(unavailable.code, unavailable.message, unavailable.details, "configuration")
            return
        if not isinstance(provider, DeferredProvider):
            await self._fail("deferred_unsupported", f"provider {model.provider} cannot fetch deferred replies",
                             {"provider": model.provider}, "configuration")
            return
        handle = await self._deferred_handle(state.source_entry_id)
        intent = DeferredEffectPending(generation=generation, source_entry_id=state.source_entry_id,
                                       poll=state.poll + 1, response_entry_id=new_id(), usage_id=new_id())
        resume = RunResume(lane=self.lane.name, operation_id=self.operation_id)
        turn = TurnStart(lane=self.lane.name, operation_id=self.operation_id,
                         turn_id=f"{generation.step_id}:poll:{intent.poll}")
        if not await self._transition(intent, events=lambda _: [resume, turn], intent=True):
            return
        effect = self.effect_context()
        try:
            options = self._options(model, generation)
            message, error = await self._consume(lambda: provider.poll(model, handle.id, options, effect), intent,
                                                 model)
        finally:
            self.end_effect(effect)
        reached(FaultPoint.BEFORE_REPLY_SETTLEMENT)
        await self._settle_reply(intent, message, error)

    async def _recover_poll(self, state: DeferredEffectPending) -> None:
        """A poll a crash interrupted: the provider still holds the answer, so the poll is made
        again under the same number, dropping the reserved ids and partial frames; if the model is
        gone, redemption is abandoned through a configuration failure, settling nothing (HA-24)."""
        frames = addresses.assistant_frames(self.operation_id, state.response_entry_id)

        def drop_frames(m: SessionMutator) -> None:
            m.delete_list(frames)

        try:
            self._resolve(state.generation.config.model, ())
        except ModelUnavailable as unavailable:
            error = OperationErrorRecord(code=unavailable.code, message=unavailable.message,
                                         details=unavailable.details)
            await self._transition(FailureDrain(error=error, provenance=FailureProvenance(kind="configuration")),
                                   drop_frames)
            return
        await self._transition(DeferredSuspended(generation=state.generation, source_entry_id=state.source_entry_id,
                                                 poll=state.poll - 1), drop_frames)

    async def _consume(
        self, open_stream: Callable[[], AsyncIterator[StreamEvent]],
        intent: AssistantEffectPending | DeferredEffectPending, model: Model
    ) -> tuple[AssistantMessage, ProviderErrorInfo | None]:
        """Read the reply, publishing it live and persisting frames without awaiting storage in
        the loop (HA-14); returns the final message and, for a failure, its classification."""
        lane = self.lane
        accumulator = AssistantStreamAccumulator(api=model.api, provider=model.provider, model=model.id)
        frames = FrameWriter(self, intent)
        final: AssistantMessage | None = None
        error: ProviderErrorInfo | None = None
        loop = asyncio.get_running_loop()
        published_at = 0.0
        started = False
        trailing: asyncio.TimerHandle | None = None

        def publish() -> None:
            nonlocal started, published_at, trailing
            trailing = None
            partial = accumulator.message("stop")
            update: HarnessEvent = (MessageUpdate(lane=lane.name, message=partial) if started
                                    else MessageStart(lane=lane.name, message=partial))
            started, published_at = True, loop.time()
            lane._present(_showing(partial), [update], self.context)

        try:
            async for event in open_stream():
                if final is not None:
                    break  # nothing counts after the stream's end
                if isinstance(event, DoneEvent):
                    final = event.message
                    continue
                if isinstance(event, ErrorEvent):
                    final, error = event.message, event.error
                    continue
                if isinstance(event, StartEvent):
                    event = event.model_copy(update={"timestamp": accumulator.timestamp})
                accumulator.apply(event)
                frames.add(event.model_dump(mode="json"))
                # Building the partial reply costs O(its length): publish at a bounded rate, and
                # what a pause in the stream holds back is published when the interval is over.
                wait = published_at + self.settings.presentation_interval_s - loop.time()
                if not started or wait <= 0:
                    if trailing is not None:
                        trailing.cancel()
                    publish()
                elif trailing is None:
                    trailing = loop.call_later(wait, publish)
        except Exception as failure:  # a provider that breaks its promise not to raise fails in-band
            error = classify_exception(failure)
            final = accumulator.message("error", error_message=error.message)
        finally:
            if trailing is not None:
                trailing.cancel()
            await frames.close()
        if final is None:
            error = ProviderErrorInfo(kind="other", message="the provider stream ended without a final message")
            final = accumulator.message("error", error_message=error.message)
        return final, error

    async def _interrupted_reply(self, state: AssistantEffectPending | DeferredEffectPending) -> AssistantMessage:
        """The partial reply a crash left, rebuilt from its persisted frames (HA-24)."""
        lane = self.lane

        async def plan(m: SessionMutator) -> Decision[AssistantMessage | None]:
            return Decision(await frames_message(m, self.operation_id, state, self.context), lambda _: [])

        partial = await lane._command(plan, self.context)
        if partial is None:
            return _nothing_streamed(state)
        return partial.model_copy(update={"stop_reason": "error", "error_message": INTERRUPTED_REPLY})

    async def _settle_reply(
        self,
        intent: AssistantEffectPending | DeferredEffectPending,
        message: AssistantMessage,
        error: ProviderErrorInfo | None,
    ) -> None:
        """Write the reply under its reserved ids and the next phase, in one commit."""
        lane, generation = self.lane, intent.generation
        message = _well_formed_calls(message)
        aborting = self.abort_requested.is_set() or isinstance(
            lane._operation_state.control if lane._operation_state else None, CancelRequested)
        retrying = (not aborting and error is not None and error.kind == "retryable"
                    and isinstance(intent, AssistantEffectPending) and intent.attempt < generation.max_attempts)
        empty_abort = message.stop_reason == "aborted" and _says_nothing(message)
        # A failed attempt that is retried or compacted away stays a side entry, out of context.
        side = retrying or (not aborting and self._recovers_overflow(intent, error))
        on_branch = not side and not empty_abort
        entry_id, parent = intent.response_entry_id, lane._tip_id
        payload = MessagePayload(message=message)
        next_state = self._after_reply(intent, message, error, aborting, retrying)

        def stage(m: SessionMutator) -> None:
            if not empty_abort:
                m.insert_entry(payload, parent_id=parent, entry_id=entry_id)
            m.insert_usage(message.usage, usage_id=intent.usage_id, entry_id=None if empty_abort else entry_id)
            if on_branch:
                m.set(addresses.branch_tip(lane.name), entry_id)
            m.delete_list(addresses.assistant_frames(self.operation_id, entry_id))

        def events(result: CommitResult | None) -> Sequence[HarnessEvent]:
            assert result is not None
            lane._presentation.streaming_message = None
            out: list[HarnessEvent] = [MessageEnd(lane=lane.name, message=message,
                                                  entry_id=None if empty_abort else entry_id)]
            if on_branch:
                entry = Entry(id=entry_id, parent_id=parent, seq=result.seqs[0], timestamp=result.timestamp,
                              payload=payload)
                lane._move_tip(entry_id, [entry])
                out.append(EntryAdded(lane=lane.name, entry=entry))
            out.append(UsageRecorded(lane=lane.name, usage_id=intent.usage_id, usage=message.usage,
                                     entry_id=None if empty_abort else entry_id))
            if isinstance(next_state, AssistantRetryWait):
                out.append(RetryScheduled(lane=lane.name, operation_id=self.operation_id,
                                          attempt=next_state.next_attempt, max_attempts=generation.max_attempts,
                                          not_before=next_state.not_before, error_message=next_state.error_message))
            elif isinstance(intent, AssistantEffectPending) and intent.attempt > 1:
                out.append(RetryEnd(lane=lane.name, operation_id=self.operation_id, attempt=intent.attempt,
                                    success=error is None, final_error=error.message if error else None))
            if isinstance(next_state, SummaryPending):
                out.append(CompactionStart(lane=lane.name, operation_id=self.operation_id, reason="overflow"))
            if isinstance(next_state, DeferredSuspended):
                out.append(RunSuspend(lane=lane.name, operation_id=self.operation_id, deferred=DeferredHandle(
                    id=message.deferred_id or "", provider=message.provider, model_id=message.model,
                    api=message.api), poll=next_state.poll))
            elif not isinstance(next_state, RunTools | AssistantRetryWait | SummaryPending):
                out.append(TurnEnd(lane=lane.name, operation_id=self.operation_id, turn_id=generation.step_id,
                                   message=message))
            return out

        await self._transition(next_state, stage, events)

    def _after_reply(
        self,
        intent: AssistantEffectPending | DeferredEffectPending,
        message: AssistantMessage,
        error: ProviderErrorInfo | None,
        aborting: bool,
        retrying: bool,
    ) -> OperationState:
        """Classify the reply into the next phase (first match wins)."""
        generation = intent.generation
        written = not (message.stop_reason == "aborted" and _says_nothing(message))  # an empty abort writes none
        finish = RunCheckpoint(continuation=MayFinish(include_final_assistant=written),
                               trigger_entry_id=intent.response_entry_id if written else self.lane._tip_id,
                               steps=generation.step)
        calls = [i for i, block in enumerate(message.content) if block.type == "tool_call"]
        if aborting and not (calls and message.stop_reason != "aborted"):
            return finish  # the pass then sees the abort request and settles aborted
        if retrying:
            assert error is not None
            assert isinstance(intent, AssistantEffectPending)
            delay = self.settings.retry.delay_ms(intent.attempt, error.retry_after_ms)
            return AssistantRetryWait(generation=generation, next_attempt=intent.attempt + 1,
                                      not_before=self.settings.clock() + delay, error_message=error.message)
        if self._recovers_overflow(intent, error):
            assert isinstance(intent, AssistantEffectPending)
            resume = RunCheckpoint(continuation=NeedAssistant(overflow_recovery_used=True),
                                   trigger_entry_id=generation.trigger_entry_id, steps=generation.step - 1)
            task = SummaryTask(task_id=new_id(), reason="overflow", resume_after=resume)
            return SummaryPending(task=task, config=generation.config, result_entry_id=new_id(),
                                  max_attempts=generation.max_attempts)
        if error is not None or message.stop_reason in ("error", "aborted"):
            text = error.message if error else (message.error_message or "the provider reported an error")
            code = "context_overflow" if error is not None and error.kind == "context_overflow" else "assistant_error"
            text = f"{text}; {DOES_NOT_FIT}" if code == "context_overflow" else text
            return FailureDrain(error=OperationErrorRecord(code=code, message=text),
                                provenance=FailureProvenance(kind="provider"))
        if message.stop_reason == "deferred":
            if not message.deferred_id:
                return FailureDrain(error=OperationErrorRecord(code="assistant_error",
                                                               message="a deferred reply came without a handle"),
                                    provenance=FailureProvenance(kind="provider"))
            poll = intent.poll if isinstance(intent, DeferredEffectPending) else 0
            return DeferredSuspended(generation=generation, source_entry_id=intent.response_entry_id, poll=poll)
        if calls:  # under an abort too: the batch answers each call with "not run"
            batch = ToolBatch(assistant_entry_id=intent.response_entry_id, turn_id=generation.step_id,
                              config=generation.config, step=generation.step,
                              calls=[ToolCallState(source_index=i, result_entry_id=new_id()) for i in calls])
            return RunTools(batch=batch)
        return finish

    def _recovers_overflow(self, intent: AssistantEffectPending | DeferredEffectPending,
                           error: ProviderErrorInfo | None) -> bool:
        """A context overflow is compacted away once per step chain, then retried."""
        return (error is not None and error.kind == "context_overflow" and isinstance(intent, AssistantEffectPending)
                and not intent.generation.overflow_recovery_used and self.settings.compaction.enabled)

    async def _wait_retry(self, state: AssistantRetryWait) -> ResumeOutcome | None:
        if not self.wait_for_retry:
            return WaitingRetry(operation_id=self.operation_id, not_before=state.not_before)
        if await self._wait_until(state.not_before):
            await self._generate(AssistantReady(generation=state.generation, next_attempt=state.next_attempt))
        return None

    async def _wait_until(self, not_before: int) -> bool:
        """Sleep until `not_before` (Unix ms, by the injectable clock); False if an abort came first."""
        remaining = (not_before - self.settings.clock()) / 1000
        if remaining > 0:
            sleeper = asyncio.ensure_future(self.settings.sleep(remaining))
            aborted = asyncio.ensure_future(self.abort_requested.wait())
            try:
                await asyncio.wait({sleeper, aborted}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                aborted.cancel()
        return not self.abort_requested.is_set()

    async def _deferred_handle(self, source_entry_id: str) -> DeferredHandle:
        lane = self.lane

        async def plan(m: SessionMutator) -> Decision[DeferredHandle]:
            entry = await m.entry(source_entry_id, self.context)
            message = entry.payload.message if entry and isinstance(entry.payload, MessagePayload) else None
            if not isinstance(message, AssistantMessage) or not message.deferred_id:
                raise HarnessFault(f"entry {source_entry_id} holds no deferred handle")
            handle = DeferredHandle(id=message.deferred_id, provider=message.provider, model_id=message.model,
                                    api=message.api)
            return Decision(handle, lambda _: [])

        return await lane._command(plan, self.context)

    # -- structural work: compaction and navigation -------------------------------------------

    async def _summarize(self, state: SummaryPending) -> ResumeOutcome | None:
        """Ask the model for a compaction or branch summary and commit it with what follows."""
        task, meta = state.task, self.lane._meta
        assert meta is not None
        if state.usage_id is not None and state.attempt >= state.max_attempts:  # interrupted last attempt
            return await self._summary_failed(state, "compaction_failed", "the summary request was interrupted")
        try:
            model, provider = self._resolve(state.config.model, ())
        except ModelUnavailable as unavailable:
            return await self._summary_failed(state, unavailable.code, unavailable.message, unavailable.details)
        entries = (await self._branch()).entries
        navigation = meta.intent if isinstance(meta.intent, NavigationIntent) else None
        plan = None
        fitted = self.settings.compaction.for_window(model.context_window)
        room = model.context_window - fitted.reserve_tokens
        if navigation is not None:
            leaving = await self._leaving_branch(navigation.target_id)
            if not leaving:
                return await self._finish_navigation(navigation, None)
            request = summary_request(leaving, BRANCH_SUMMARY_REQUEST, task.custom_instructions, room)
        else:
            plan = plan_compaction(entries, fitted.keep_recent_tokens)
            if plan is None:
                return await self._summary_declined(state)
            request = summary_request(plan.summarized, SUMMARY_REQUEST, task.custom_instructions, room)
        intent = state.model_copy(update={"attempt": state.attempt + 1, "usage_id": new_id()})
        if not await self._transition(intent, intent=True):
            return None
        reached(FaultPoint.SUMMARY_INTENT)
        effect = self.effect_context()
        try:
            options = StreamOptions(session_id=f"{self.harness.session.id}:{self.lane.name}",
                                    api_key=self._options(model, None).api_key)
            message, error = await _collect(provider.stream(model, request, options, effect))
        finally:
            self.end_effect(effect)
        if self.abort_requested.is_set():
            return None
        assert intent.usage_id is not None
        if error is not None or message.stop_reason != "stop":
            text = error.message if error else f"the summary stopped early ({message.stop_reason})"
            if error is not None and error.kind == "retryable" and intent.attempt < intent.max_attempts:
                delay = self.settings.retry.delay_ms(intent.attempt, error.retry_after_ms)
                wait = SummaryRetryWait(task=task, config=intent.config, result_entry_id=intent.result_entry_id,
                                        next_attempt=intent.attempt + 1, max_attempts=intent.max_attempts,
                                        not_before=self.settings.clock() + delay, error_message=text)
                usage_id = intent.usage_id

                def record_usage(m: SessionMutator) -> None:
                    m.insert_usage(message.usage, usage_id=usage_id)

                await self._transition(wait, record_usage)
                return None
            return await self._summary_failed(intent, "compaction_failed", text)
        summary = "".join(block.text for block in message.content if isinstance(block, TextContent))
        if navigation is not None:
            return await self._finish_navigation(navigation, (intent, summary, message))
        assert plan is not None
        return await self._finish_compaction(intent, plan, summary, message)

    async def _finish_compaction(self, intent: SummaryPending, plan: CompactionPlan, summary: str,
                                 message: AssistantMessage) -> ResumeOutcome | None:
        lane, task = self.lane, intent.task
        entry_id, parent = intent.result_entry_id, lane._tip_id
        payload = CompactionPayload(summary=summary, retained_tail=list(plan.kept), tokens_before=plan.tokens_before)
        usage_id = intent.usage_id
        assert usage_id is not None

        placement = Placement(parent)

        def stage(m: SessionMutator) -> None:
            placement.stage(m, entry_id, payload)
            m.insert_usage(message.usage, usage_id=usage_id, entry_id=entry_id)
            m.set(addresses.branch_tip(lane.name), entry_id)

        def events(commit: CommitResult | None) -> Sequence[HarnessEvent]:
            return [*lane._placed(placement, commit),
                    UsageRecorded(lane=lane.name, usage_id=usage_id, usage=message.usage, entry_id=entry_id),
                    CompactionEnd(lane=lane.name, operation_id=self.operation_id, reason=_reason(task),
                                  status="completed", entry_id=entry_id)]

        if task.resume_after is not None:
            resume = task.resume_after.model_copy(update={"compaction_failures": 0})
            await self._transition(resume, stage, events)
            return None
        return await self._settle(intent, "completed", stage=stage, tip=entry_id, events_before=events)

    async def _summary_declined(self, state: SummaryPending) -> ResumeOutcome | None:
        """Nothing to summarize: an overflow cannot be recovered (the run fails), anything else
        goes on without a compaction."""
        task = state.task
        if task.reason == "overflow":
            return await self._summary_failed(state, "context_overflow",
                                              "the context is too large and nothing can be compacted")
        end = CompactionEnd(lane=self.lane.name, operation_id=self.operation_id, reason=_reason(task),
                            status="declined")
        if task.resume_after is not None:
            await self._transition(task.resume_after, events=lambda _: [end])
            return None
        return await self._settle(state, "completed", events_before=lambda _: [end])

    async def _summary_failed(self, state: SummaryPending, code: str, message: str,
                              details: dict[str, JsonValue] | None = None) -> ResumeOutcome | None:
        """A compaction that failed: a standalone one fails its operation; in a run, an overflow
        fails the run, a threshold compaction lets the run go on (and after `max_failures` in a
        row the run stops trying, saying so in the `compaction_end` error)."""
        task, limit = state.task, self.settings.compaction.max_failures
        if task.reason == "overflow" and code in ("compaction_failed", "context_overflow"):
            message = f"{message}; {DOES_NOT_FIT}"  # the run fails: its context cannot be made to fit
        error = OperationErrorRecord(code=code, message=message, details=details)
        if task.resume_after is None or task.reason == "overflow":
            end = CompactionEnd(lane=self.lane.name, operation_id=self.operation_id, reason=_reason(task),
                                status="failed", error=error)
            if task.resume_after is None:
                return await self._settle(state, "failed", error=error, events_before=lambda _: [end])
            await self._transition(FailureDrain(error=error, provenance=FailureProvenance(kind="provider")),
                                   events=lambda _: [end])
            return None
        failures = task.resume_after.compaction_failures + 1
        if failures >= limit:
            error = OperationErrorRecord(
                code="compaction_stopped", details={"failures": failures, "last_error": code},
                message=f"{failures} compactions in a row failed ({message}); this run stops compacting")
        end = CompactionEnd(lane=self.lane.name, operation_id=self.operation_id, reason=_reason(task),
                            status="failed", error=error)
        await self._transition(task.resume_after.model_copy(update={"compaction_failures": failures}),
                               events=lambda _: [end])
        return None

    async def _wait_summary_retry(self, state: SummaryRetryWait) -> ResumeOutcome | None:
        if not await self._wait_until(state.not_before):
            return None
        pending = SummaryPending(task=state.task, config=state.config, result_entry_id=state.result_entry_id,
                                 attempt=state.next_attempt - 1, max_attempts=state.max_attempts)
        return await self._summarize(pending)  # its intent is the next commit

    async def _maybe_compact(self, state: RunCheckpoint) -> bool:
        """Start a threshold compaction when the context has grown past the model's window minus
        the reserve (True), unless compaction is off or has failed too often in this run."""
        settings, registry = self.settings.compaction, self.harness.options.models
        if not settings.enabled or state.compaction_failures >= settings.max_failures or registry is None:
            return False
        try:
            model = registry.model(self.lane._config.model)
        except ModelUnavailable:
            return False  # the step itself fails in-band (HA-23)
        settings = settings.for_window(model.context_window)
        branch = await self._branch()
        if branch.entries and isinstance(branch.entries[-1].payload, CompactionPayload):
            return False  # nothing new since the last compaction: compacting again cannot help
        if branch.tokens <= model.context_window - settings.reserve_tokens:
            return False
        if plan_compaction(branch.entries, settings.keep_recent_tokens) is None:
            return False  # only the latest turn is left: nothing a compaction could remove
        task = SummaryTask(task_id=new_id(), reason="threshold", resume_after=state)
        pending = SummaryPending(task=task, config=self.lane._config, result_entry_id=new_id(),
                                 max_attempts=self.settings.retry.max_retries + 1)
        start = CompactionStart(lane=self.lane.name, operation_id=self.operation_id, reason="threshold")
        return await self._transition(pending, events=lambda _: [start], intent=True)

    async def _leaving_branch(self, target_id: str | None) -> list[Message]:
        """The messages of the branch being left: from the tip back to the newest entry it shares
        with `target_id`'s path (compaction-bounded on both sides)."""
        lane = self.lane

        async def plan(m: SessionMutator) -> Decision[list[Message]]:
            kept = {entry.id for entry in await branch_entries(m, target_id, self.context)}
            leaving = [e for e in await branch_entries(m, lane._tip_id, self.context) if e.id not in kept]
            return Decision(context_messages(leaving), lambda _: [])

        return await lane._command(plan, self.context)

    async def _finish_navigation(
        self, intent: NavigationIntent, summary: tuple[SummaryPending, str, AssistantMessage] | None
    ) -> ResumeOutcome | None:
        """Move the tip to the target (after a branch summary, when one was made) and settle."""
        lane = self.lane
        from_tip, target = lane._tip_id, intent.target_id
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
            m.set(addresses.branch_tip(lane.name), tip)
            if intent.label is not None and target is not None:
                m.set(addresses.entry_label(target), intent.label)

        def events(commit: CommitResult) -> Sequence[HarnessEvent]:
            return [NavigationEnd(lane=lane.name, operation_id=self.operation_id, status="completed",
                                  from_tip_id=from_tip, tip_id=tip)]

        current = self.lane._operation_state
        assert current is not None
        return await self._settle(current, "completed", stage=stage, tip=tip, events_before=events)

    async def _branch(self) -> BranchContext:
        lane = self.lane

        async def plan(m: SessionMutator) -> Decision[BranchContext]:
            return Decision(await lane._branch_context(m, self.context), lambda _: [])

        return await lane._command(plan, self.context)

    # -- failure and settlement -----------------------------------------------------------------

    async def _fail(self, code: str, message: str, details: dict[str, JsonValue] | None, provenance: str) -> None:
        """Go to `failure_drain` with a machine-readable error and its provenance (HA-23, HA-26)."""
        drain = FailureDrain(error=OperationErrorRecord(code=code, message=message, details=details),
                             provenance=FailureProvenance.model_validate({"kind": provenance}))
        await self._transition(drain)

    async def _settle_aborted(self, state: OperationState, control: CancelRequested) -> ResumeOutcome | None:
        if isinstance(state, RunTools):
            await ToolBatchRunner(self, state).run()
            return await self._advance() or self._settled_elsewhere()
        if isinstance(state, AssistantEffectPending | DeferredEffectPending):
            try:
                partial = await self._interrupted_reply(state)
            except StorageCorruption:
                # An abort must settle even when what had streamed cannot be read back, or a
                # damaged frame would hold the lane for good: the reply is kept without it.
                partial = _nothing_streamed(state)
            message = partial.model_copy(update={"stop_reason": "aborted"})
            await self._settle_reply(state, message, None)
            return await self._advance() or self._settled_elsewhere()
        if isinstance(state, DeferredSuspended):
            await self._cancel_deferred(state)
        return await self._settle(state, "aborted", abort_cause=control.cause)

    async def _cancel_deferred(self, state: DeferredSuspended) -> None:
        registry = self.harness.options.models
        try:
            model, provider = self._resolve(state.generation.config.model, ())
            handle = await self._deferred_handle(state.source_entry_id)
            if isinstance(provider, DeferredProvider) and registry is not None:
                await provider.cancel(model, handle.id, Context(self.context.attributes))
        except HarnessError:
            pass  # best effort: the operation settles aborted either way

    async def _settle(
        self,
        state: OperationState,
        outcome: str,
        *,
        error: OperationErrorRecord | None = None,
        abort_cause: str | None = None,
        stage: Callable[[SessionMutator], None] | None = None,
        tip: str | KeepTip | None = KeepTip.KEEP,
        events_before: Callable[[CommitResult], Sequence[HarnessEvent]] | None = None,
    ) -> Settled | None:
        """The terminal commit: `stage`'s final writes (moving the tip to `tip`, where None is the
        empty branch before the session's first entry), clean up the operation, drain steer and
        follow-up items that were not placed, write the lane's last result, go idle; emits
        `events_before`, then `run_end`.

        Decided on the line from the current projection: an abort requested meanwhile makes a
        completion `aborted`; steer or follow-up input that arrived since the last boundary makes
        it not settle at all (None: the run goes on to place it)."""
        reached(FaultPoint.BEFORE_TERMINAL_SETTLEMENT)
        lane, meta = self.lane, self.lane._meta
        assert meta is not None
        final_assistant = self._final_assistant(state)

        async def plan(m: SessionMutator) -> Decision[Settled | None]:
            nonlocal outcome, abort_cause
            current = lane._operation_state
            control = current.control if current is not None else state.control
            if isinstance(control, CancelRequested) and outcome == "completed":
                outcome, abort_cause = "aborted", control.cause
            queued_steer, queued_follow = lane._state.ids_of("steer"), lane._state.ids_of("follow_up")
            if outcome == "completed" and meta.intent.kind == "run" and (queued_steer or queued_follow):
                return Decision(None, lambda _: [])
            drained_steer = list(control.drained_steer) if isinstance(control, CancelRequested) else []
            drained_follow = list(control.drained_follow_up) if isinstance(control, CancelRequested) else []
            drained_steer += queued_steer  # never left behind for a run that did not ask for them
            drained_follow += queued_follow
            await lane._load_inbox(m, self.context, [*drained_steer, *drained_follow])
            if stage is not None:
                stage(m)
            # Pending writes are never stranded: whatever arrived after the last boundary is
            # placed by the terminal commit.
            writes = [item.entry_id for item in lane._state.inbox if item.kind == "write"]
            placement = Placement(lane._tip_id if tip is KeepTip.KEEP else tip)
            for entry_id in writes:
                placement.stage(m, entry_id, pending_payload(lane._pending[entry_id]))
                m.delete(addresses.pending_entry(entry_id))
            new_tip = placement.tip
            if writes:
                m.set(addresses.branch_tip(lane.name), new_tip)
            ended_at = now_ms()
            result = LaneLastResult.model_validate({
                "operation_id": self.operation_id, "kind": meta.intent.kind, "outcome": outcome,
                "tip_id": new_tip, "final_assistant_entry_id": final_assistant,
                "error": error.model_dump() if error else None, "abort_cause": abort_cause,
                "started_at": meta.started_at, "ended_at": ended_at,
            })
            drained = set(drained_steer) | set(drained_follow)
            removed = drained | set(writes)
            lane_state = lane._state.model_copy(update={
                "current_operation_id": None,
                "inbox": [i for i in lane._state.inbox if i.entry_id not in removed],
            })
            m.delete(addresses.operation_meta(self.operation_id))
            m.delete(addresses.operation_state(self.operation_id))
            for entry_id in drained:
                m.delete(addresses.pending_entry(entry_id))
            m.set(addresses.lane_last_result(lane.name), result)
            m.set(addresses.lane_state(lane.name), lane_state)
            steer = tuple(queued_item(i, lane._pending[i]) for i in drained_steer)
            follow_up = tuple(queued_item(i, lane._pending[i]) for i in drained_follow)
            settled = Settled(operation_id=self.operation_id, result=result, steer=steer, follow_up=follow_up)

            def after(commit: CommitResult | None) -> Sequence[HarnessEvent]:
                assert commit is not None
                lane._meta = lane._operation_state = None
                lane._state, lane._last_result = lane_state, result
                placed = placement.entries(commit)
                lane._move_tip(new_tip, placed)
                events: list[HarnessEvent] = list(events_before(commit)) if events_before else []
                events += placed_events(lane.name, placed)
                queue_changed = any(lane._pending.pop(i, None) is not None for i in removed)
                if queue_changed:
                    events.append(lane._queue_update())
                events.append(RunEnd(lane=lane.name, operation_id=self.operation_id, result=result))
                return events

            return Decision(settled, after)

        return await lane._command(plan, self.context)

    def _final_assistant(self, state: OperationState) -> str | None:
        if (isinstance(state, RunCheckpoint) and isinstance(state.continuation, MayFinish)
                and state.continuation.include_final_assistant):
            return state.trigger_entry_id
        return None


def _showing(message: AssistantMessage) -> Callable[[LanePresentation], None]:
    def show(presentation: LanePresentation) -> None:
        presentation.streaming_message = message

    return show


class FrameWriter:
    """Persists a streaming reply in pages, at most one page write in flight, never awaited by the
    stream loop (HA-14). Each page waits `frame_interval_s` first, so a reply that ends within
    one interval writes none, and closing cancels that wait: the settlement, which supersedes
    the frames, waits on no timer. A page lands only while its response is still effect-pending."""

    def __init__(self, driver: RunDriver, intent: AssistantEffectPending | DeferredEffectPending) -> None:
        self.driver, self.intent = driver, intent
        self._buffer: list[JsonValue] = []
        self._wakeup = asyncio.Event()
        self._closed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._write())

    def add(self, frame: JsonValue) -> None:
        self._buffer.append(frame)
        self._wakeup.set()

    async def close(self) -> None:
        """Stop writing; waits only for a page write already on the line."""
        self._closed.set()
        self._wakeup.set()
        await self._task

    async def _pause(self) -> bool:
        """Wait one frame interval; False when closing came first."""
        interval = self.driver.settings.frame_interval_s
        if interval > 0:
            sleeper = asyncio.ensure_future(self.driver.settings.sleep(interval))
            closed = asyncio.ensure_future(self._closed.wait())
            try:
                await asyncio.wait({sleeper, closed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                closed.cancel()
        return not self._closed.is_set()

    async def _write(self) -> None:
        lane = self.driver.lane
        address = addresses.assistant_frames(self.driver.operation_id, self.intent.response_entry_id)
        while True:
            await self._wakeup.wait()
            if not await self._pause():
                return
            self._wakeup.clear()
            page, self._buffer = self._buffer, []

            async def plan(m: SessionMutator, page: list[JsonValue] = page) -> Decision[None]:
                current = lane._operation_state
                if getattr(current, "response_entry_id", None) == self.intent.response_entry_id:
                    frames: dict[str, JsonValue] = {"frames": list(page)}
                    m.append(address, frames)
                return Decision(None, lambda _: [])

            await lane._command(plan, self.driver.context)
            reached(FaultPoint.MID_STREAM)


def _nothing_streamed(state: AssistantEffectPending | DeferredEffectPending) -> AssistantMessage:
    """The interrupted reply of a step whose streamed frames are absent (or unreadable)."""
    model = state.generation.config.model
    return AssistantMessage(content=[], api="", provider=model.provider, model=model.model_id,
                            stop_reason="error", error_message=INTERRUPTED_REPLY)


def _interruption() -> ProviderErrorInfo:
    return ProviderErrorInfo(kind="retryable", message=INTERRUPTED_REPLY)


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


def _says_nothing(message: AssistantMessage) -> bool:
    """True when a reply holds nothing worth keeping: no tool call, no signed or non-blank
    thinking, no non-blank text (an abort right after a block started)."""
    for block in message.content:
        if isinstance(block, TextContent) and block.text.strip():
            return False
        if not isinstance(block, TextContent) and not isinstance(block, ThinkingContent):
            return False
        if isinstance(block, ThinkingContent) and (block.thinking.strip() or block.signature):
            return False
    return True


def _well_formed_calls(message: AssistantMessage) -> AssistantMessage:
    """The reply with every tool call answerable: an empty or repeated call id gets a fresh one and
    an empty name a placeholder (answered as an unknown tool), so no later request that replays
    the journal is one a provider would refuse."""
    seen: set[str] = set()
    content = []
    for block in message.content:
        if isinstance(block, ToolCall):
            call_id = block.id if block.id and block.id not in seen else f"call_{new_id()}"
            name = block.name or "unnamed_tool"
            if (call_id, name) != (block.id, block.name):
                block = block.model_copy(update={"id": call_id, "name": name})
            seen.add(call_id)
        content.append(block)
    return message if content == message.content else message.model_copy(update={"content": content})
