"""The provider step: the intent, the streamed reply (presented live, persisted in frame pages),
and its settlement, which classifies the reply into the next phase; and the retry wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from pydantic import JsonValue

from harness.errors import ModelUnavailable, ToolsUnavailable
from harness.messages import AssistantMessage, ModelIdentity, TextContent, ThinkingContent, ToolCall
from harness.providers import (
    DoneEvent,
    ErrorEvent,
    Model,
    Provider,
    ProviderErrorInfo,
    ProviderRequest,
    StartEvent,
    StreamEvent,
)
from harness.providers.errors import classify_exception
from harness.providers.protocol import AssistantStreamAccumulator
from harness.providers.structured import structured_stream
from harness.runtime.agent_tool import offered_tools
from harness.runtime.commit import Decision, Placement, Transition, payload_of
from harness.runtime.drive.operation import DrivenOperation
from harness.runtime.drive.settlement import DOES_NOT_FIT, failure, settle_with_reply
from harness.runtime.drive.tool_batch import with_tool_intents
from harness.runtime.event_log import Announcement, EntryEvent, TurnEndOf
from harness.runtime.events import (
    CompactionStart,
    ConfigUpdate,
    DeferredHandle,
    HarnessEvent,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RetryEnd,
    RetryScheduled,
    RetryStart,
    RunSuspend,
    TurnEnd,
    TurnStart,
    UsageRecorded,
)
from harness.runtime.fault_points import FaultPoint, reached
from harness.runtime.hooks import ModelFallback
from harness.runtime.outcomes import INTERRUPTED_REPLY, DriveOutcome, WaitingRetry
from harness.runtime.settings import lane_system_prompt
from harness.runtime.snapshot import LanePresentation, frames_message
from harness.session import CommitResult, Entry, MessagePayload, OperationErrorRecord, SessionMutator, addresses
from harness.session.ids import new_id
from harness.session.records import (
    AssistantEffectPending,
    AssistantReady,
    AssistantRetryWait,
    DeferredEffectPending,
    DeferredSuspended,
    FailureDrain,
    FailureProvenance,
    GenerationContext,
    MayFinish,
    NeedAssistant,
    OperationState,
    RunCheckpoint,
    RunIntent,
    RunTools,
    SummaryPending,
    SummaryTask,
    ToolBatch,
    ToolCallState,
)

EffectPending = AssistantEffectPending | DeferredEffectPending


async def generate(op: DrivenOperation, state: AssistantReady) -> DriveOutcome | Transition | None:
    """Commit the step's intent, stream the reply, and return its settlement (HA-24: the reply's
    entry and usage ids are reserved by the intent, before the request is sent), or the run's
    outcome when that settlement was the run's terminal commit too (`settle_with_reply`); None
    when the intent was refused (an abort came first: the pass settles it)."""
    generation = state.generation
    try:
        model, provider = op.resolve(generation.config.model, generation.config.active_tools)
    except (ModelUnavailable, ToolsUnavailable) as unavailable:
        return failure(unavailable.code, unavailable.message, unavailable.details, "configuration")
    intent = step_intent(generation, state.next_attempt)
    # The request is built before the intent commits, so a failing hook leaves the phase as it was.
    request = await _request(op, generation, model)
    if not await op.commit(Transition(intent, events=lambda: intent_events(op, intent), intent=True)):
        return None
    return await _send(op, intent, model, provider, request)


def step_intent(generation: GenerationContext, attempt: int) -> AssistantEffectPending:
    """A step's intent: attempt `attempt` of `generation`, the reply's entry and usage ids reserved."""
    return AssistantEffectPending(generation=generation, attempt=attempt, response_entry_id=new_id(),
                                  usage_id=new_id())


def intent_events(op: DrivenOperation, intent: AssistantEffectPending) -> list[HarnessEvent]:
    """What a step's intent announces: `turn_start`, and `retry_start` for a retried attempt."""
    lane, operation_id = op.lane.name, op.operation_id
    turn: list[HarnessEvent] = [TurnStart(lane=lane, operation_id=operation_id, turn_id=intent.generation.step_id)]
    if intent.attempt == 1:
        return turn
    return [*turn, RetryStart(lane=lane, operation_id=operation_id, attempt=intent.attempt)]


async def ask(op: DrivenOperation, intent: AssistantEffectPending) -> DriveOutcome | Transition | None:
    """The step whose intent was committed with the tool results it answers (`checkpoint`'s
    `direct_intent`): send its request, stream the reply and return its settlement, as `generate`
    does after its own intent commit."""
    reached(FaultPoint.NEXT_STEP_INTENT)
    try:
        model, provider = op.resolve(intent.generation.config.model, intent.generation.config.active_tools)
    except (ModelUnavailable, ToolsUnavailable) as unavailable:
        return failure(unavailable.code, unavailable.message, unavailable.details, "configuration")
    return await _send(op, intent, model, provider, await _request(op, intent.generation, model))


async def _request(op: DrivenOperation, generation: GenerationContext, model: Model) -> ProviderRequest:
    """The step's request: the system prompt, the branch's messages (through the
    `transform_context` hook when set), the tools it may call and the shape its answer must take
    (the run's `RunIntent.output`, issue 32)."""
    messages = tuple((await op.branch()).messages)
    tools = tuple(tool.spec for tool in offered_tools(generation.config.active_tools, op.environment.tools))
    if model.max_tool_steps is not None and generation.step > model.max_tool_steps:
        tools = ()  # a model too small to trust with more tool steps answers in text now
    system = lane_system_prompt(op.environment.system_prompt, op.lane.name)
    meta = op.projection.meta
    output = meta.intent.output if meta is not None and isinstance(meta.intent, RunIntent) else None
    if op.hooks.transform_context is not None:
        transformed = await op.hooks.transform_context(list(messages), op.context)
        return ProviderRequest(system_prompt=system, messages=tuple(transformed), tools=tools, output=output)
    # The branch's messages were validated when they were decoded or committed: checking them
    # again would cost O(history) on every step.
    return ProviderRequest.model_construct(system_prompt=system, messages=messages, tools=tools, output=output)


async def _send(op: DrivenOperation, intent: AssistantEffectPending, model: Model, provider: Provider,
                request: ProviderRequest) -> DriveOutcome | Transition | None:
    """After the intent's commit: send `request`, stream the reply and settle it."""
    reached(FaultPoint.ASSISTANT_INTENT)
    effect = op.effect_context()
    try:
        options = op.stream_options(model, intent.generation)
        message, error, framed = await consume(
            op, lambda: structured_stream(provider, model, request, options, effect), intent, model)
    finally:
        op.end_effect(effect)
    reached(FaultPoint.BEFORE_REPLY_SETTLEMENT)
    return await settle_with_reply(op, settle_reply(op, intent, message, error, framed=framed))


async def consume(
    op: DrivenOperation, open_stream: Callable[[], AsyncIterator[StreamEvent]], intent: EffectPending, model: Model
) -> tuple[AssistantMessage, ProviderErrorInfo | None, bool]:
    """Read the reply (`_stream`) under its span `chat {model}`, which records it (`tracing`)."""
    attempt = intent.attempt if isinstance(intent, AssistantEffectPending) else 1
    with op.trace.chat(model, intent.generation.step, attempt) as span:
        message, error, framed = await _stream(op, open_stream, intent, model)
        span.reply(message, error)
    return message, error, framed


async def _stream(
    op: DrivenOperation, open_stream: Callable[[], AsyncIterator[StreamEvent]], intent: EffectPending, model: Model
) -> tuple[AssistantMessage, ProviderErrorInfo | None, bool]:
    """Read the reply, publishing it live and persisting frames without awaiting storage in the
    loop (HA-14); returns the final message, for a failure its classification, and whether a
    frame page was written."""
    lane = op.lane
    accumulator = AssistantStreamAccumulator(api=model.api, provider=model.provider, model=model.id)
    frames = op.frames = FrameWriter(op, intent)
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
        lane.present(_showing(partial), [update], op.context)

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
            frames.add(event)
            # Building the partial reply costs O(its length): publish at a bounded rate, and what
            # a pause in the stream holds back is published when the interval is over.
            wait = published_at + op.settings.presentation_interval_s - loop.time()
            if not started or wait <= 0:
                if trailing is not None:
                    trailing.cancel()
                publish()
            elif trailing is None:
                trailing = loop.call_later(wait, publish)
    except Exception as failed:  # a provider that breaks its promise not to raise fails in-band
        error = classify_exception(failed)
        final = accumulator.message("error", error_message=error.message)
    finally:
        if trailing is not None:
            trailing.cancel()
        op.frames = None
        await frames.close()
    if final is None:
        error = ProviderErrorInfo(kind="other", message="the provider stream ended without a final message")
        final = accumulator.message("error", error_message=error.message)
    return final, error, frames.wrote


async def interrupted_reply(op: DrivenOperation, state: EffectPending) -> AssistantMessage:
    """The partial reply a crash left, rebuilt from its persisted frames (HA-24)."""

    async def plan(m: SessionMutator) -> Decision[AssistantMessage | None]:
        return Decision(await frames_message(m, op.operation_id, state, op.context))

    partial = await op.run(plan)
    if partial is None:
        return nothing_streamed(state)
    return partial.model_copy(update={"stop_reason": "error", "error_message": INTERRUPTED_REPLY})


def interruption() -> ProviderErrorInfo:
    """How an interrupted reply is classified: retryable, under the interruption's message."""
    return ProviderErrorInfo(kind="retryable", message=INTERRUPTED_REPLY)


def settle_reply(op: DrivenOperation, intent: EffectPending, message: AssistantMessage,
                 error: ProviderErrorInfo | None, *, framed: bool = True, interrupted: bool = False) -> Transition:
    """The reply under its reserved ids and the next phase, as one commit; with tool calls, the
    intents of those that start at once too (`with_tool_intents`). `framed` False: the reply
    was streamed by this drive under this intent and no frame page was written, so there are
    none to delete (a reply restored after a crash, or interrupted, may have some). `interrupted`:
    the reply a crash cut off (`interruption()`): its retry is due at once, since the model's
    server did not fail and there is nothing to back off from; it still counts as an attempt, so
    a reply that ends its process every time fails after `max_attempts`."""
    lane, projection, generation = op.lane.name, op.projection, intent.generation
    message = _well_formed_calls(message)
    aborting = op.aborting
    retrying = (not aborting and error is not None and error.kind == "retryable"
                and isinstance(intent, AssistantEffectPending) and intent.attempt < generation.max_attempts)
    empty_abort = message.stop_reason == "aborted" and _says_nothing(message)
    fallback = None if aborting or retrying else _fallback(op, intent, error)
    # A failed attempt that is retried, taken over by a fallback model or compacted away stays a
    # side entry, out of context.
    side = retrying or fallback is not None or (not aborting and _recovers_overflow(op, intent, error))
    on_branch = not side and not empty_abort
    entry_id, parent = intent.response_entry_id, projection.tip_id
    payload = MessagePayload(message=message)
    next_state = _after_reply(op, intent, message, error, aborting, retrying, fallback, interrupted)
    switch = _FallbackSwitch(op, intent, fallback, error) if fallback is not None else None

    def stage(m: SessionMutator) -> None:
        if not empty_abort:
            m.insert_entry(payload, parent_id=parent, entry_id=entry_id)
        m.insert_usage(message.usage, usage_id=intent.usage_id, entry_id=None if empty_abort else entry_id)
        if on_branch:
            m.set(addresses.branch_tip(lane), entry_id)
        if framed:
            m.delete_list(addresses.assistant_frames(op.operation_id, entry_id))
        if switch is not None:
            switch.stage(m)

    # The reply's entry is write 0 of the commit (`commit_transition` stages it first).
    end: Announcement = (MessageEnd(lane=lane, message=message) if empty_abort
                         else EntryEvent("message_end", lane, entry_id, parent, payload, 0))

    def events() -> Sequence[Announcement]:
        out: list[Announcement] = [end]
        if on_branch:
            out.append(EntryEvent("entry_added", lane, entry_id, parent, payload, 0))
        out.append(UsageRecorded(lane=lane, usage_id=intent.usage_id, usage=message.usage,
                                 entry_id=None if empty_abort else entry_id))
        if isinstance(next_state, AssistantRetryWait):
            out.append(RetryScheduled(lane=lane, operation_id=op.operation_id, attempt=next_state.next_attempt,
                                      max_attempts=generation.max_attempts, not_before=next_state.not_before,
                                      error_message=next_state.error_message))
        elif isinstance(intent, AssistantEffectPending) and intent.attempt > 1:
            out.append(RetryEnd(lane=lane, operation_id=op.operation_id, attempt=intent.attempt,
                                success=error is None, final_error=error.message if error else None))
        if switch is not None:
            out += switch.events()
            return out  # the step goes on, on the fallback model
        if isinstance(next_state, SummaryPending):
            out.append(CompactionStart(lane=lane, operation_id=op.operation_id, reason="overflow"))
        if isinstance(next_state, DeferredSuspended):
            out.append(RunSuspend(lane=lane, operation_id=op.operation_id, deferred=DeferredHandle(
                id=message.deferred_id or "", provider=message.provider, model_id=message.model,
                api=message.api), poll=next_state.poll))
        elif not isinstance(next_state, RunTools | AssistantRetryWait | SummaryPending):
            turn_end = TurnEnd(lane=lane, operation_id=op.operation_id, turn_id=generation.step_id, message=message)
            out.append(turn_end if empty_abort else TurnEndOf(turn_end, entry_id))
        return out

    def publish(result: CommitResult | None) -> None:
        assert result is not None
        op.lane.presentation.streaming_message = None
        if on_branch:
            projection.move_tip(entry_id, [Entry(id=entry_id, parent_id=parent, seq=result.seqs[0],
                                                 timestamp=result.timestamp, payload=payload)])
        if switch is not None:
            switch.publish(result)

    return with_tool_intents(op, Transition(next_state, stage, events, publish), message)


def _after_reply(op: DrivenOperation, intent: EffectPending, message: AssistantMessage,
                 error: ProviderErrorInfo | None, aborting: bool, retrying: bool,
                 fallback: ModelIdentity | None, interrupted: bool) -> OperationState:
    """Classify the reply into the next phase (first match wins)."""
    generation = intent.generation

    def finish() -> RunCheckpoint:
        written = not (message.stop_reason == "aborted" and _says_nothing(message))  # an empty abort writes none
        return RunCheckpoint(continuation=MayFinish(include_final_assistant=written),
                             trigger_entry_id=intent.response_entry_id if written else op.projection.tip_id,
                             steps=generation.step)

    calls = [i for i, block in enumerate(message.content) if block.type == "tool_call"]
    if aborting and not (calls and message.stop_reason != "aborted"):
        return finish()  # the pass then sees the abort request and settles aborted
    if retrying:
        assert error is not None
        assert isinstance(intent, AssistantEffectPending)
        delay = 0 if interrupted else op.settings.retry.delay_ms(intent.attempt, error.retry_after_ms)
        return AssistantRetryWait(generation=generation, next_attempt=intent.attempt + 1,
                                  not_before=op.settings.clock() + delay, error_message=error.message)
    if fallback is not None:
        config = generation.config.model_copy(update={"model": fallback})
        return AssistantReady(generation=generation.model_copy(update={"config": config}))
    if _recovers_overflow(op, intent, error):
        assert isinstance(intent, AssistantEffectPending)
        resume = RunCheckpoint(continuation=NeedAssistant(overflow_recovery_used=True),
                               trigger_entry_id=generation.trigger_entry_id, steps=generation.step - 1,
                               boundary_done=True)
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
    return finish()


def _fallback(op: DrivenOperation, intent: EffectPending, error: ProviderErrorInfo | None) -> ModelIdentity | None:
    """The model that takes the step over when its model's retries ran out on a retryable error
    (`DriveSettings.fallback`): the one after it there, or the first when it is not among them;
    None when there is none, or the step may still be retried."""
    if (error is None or error.kind != "retryable" or not isinstance(intent, AssistantEffectPending)
            or intent.attempt < intent.generation.max_attempts):
        return None
    chain, current = op.settings.fallback, intent.generation.config.model
    rest = chain[chain.index(current) + 1:] if current in chain else chain
    return next((model for model in rest if model != current), None)


class _FallbackSwitch:
    """What the settlement of a reply taken over by a fallback model commits besides it: the lane's
    model switched, and the rows `RunHooks.fallback_messages` gives placed on the branch, which the
    step's next request reads."""

    def __init__(self, op: DrivenOperation, intent: AssistantEffectPending | DeferredEffectPending,
                 model: ModelIdentity, error: ProviderErrorInfo | None) -> None:
        self.op, self.lane = op, op.lane.name
        self.previous = op.projection.config
        self.config = self.previous.model_copy(update={"model": model})
        hook = op.hooks.fallback_messages
        announced = ModelFallback(lane=self.lane, operation_id=op.operation_id, previous=intent.generation.config.model,
                                  model=model, error=error.message if error is not None else "")
        self.rows = tuple(hook(announced)) if hook is not None else ()
        self.placement = Placement(op.projection.tip_id)

    def stage(self, m: SessionMutator) -> None:
        m.set(addresses.lane_config(self.lane), self.config)
        for row in self.rows:
            self.placement.stage(m, new_id(), payload_of(row))
        if self.rows:
            m.set(addresses.branch_tip(self.lane), self.placement.tip)

    def events(self) -> list[Announcement]:
        update = ConfigUpdate(lane=self.lane, field="model", previous=self.previous.model, value=self.config.model)
        return [update, *self.placement.events(self.lane)]

    def publish(self, result: CommitResult) -> None:
        self.op.projection.config = self.config
        self.placement.publish(self.op.projection, result)


def _recovers_overflow(op: DrivenOperation, intent: EffectPending, error: ProviderErrorInfo | None) -> bool:
    """A context overflow is compacted away once per step chain, then retried."""
    return (error is not None and error.kind == "context_overflow" and isinstance(intent, AssistantEffectPending)
            and not intent.generation.overflow_recovery_used and op.settings.compaction.enabled)


async def wait_retry(op: DrivenOperation, state: AssistantRetryWait) -> DriveOutcome | Transition | None:
    """Wait out a retry's backoff, then make the attempt; or hand a wait not yet over back to the
    caller. A retry that is due is made at once either way: handing it back would leave a caller
    that waits for `not_before` (a worker) nothing to wait for, and it would drive again for ever."""
    if not op.wait_for_retry and state.not_before > op.settings.clock():
        return WaitingRetry(operation_id=op.operation_id, not_before=state.not_before, attempt=state.next_attempt,
                            error_message=state.error_message)
    if await op.wait_until(state.not_before):
        return await generate(op, AssistantReady(generation=state.generation, next_attempt=state.next_attempt))
    return None


class FrameWriter:
    """Persists a streaming reply in pages, at most one page write in flight, never awaited by the
    stream loop (HA-14). Each page waits `frame_interval_s` first, so a reply that ends within
    one interval writes none, and closing cancels that wait: the settlement, which supersedes
    the frames, waits on no timer. A page lands only while its response is still effect-pending.
    The writer's task starts once the stream first yields to the loop after a frame (a reply
    that arrives whole and closes first never starts one) and ends when no frame waits to be
    written."""

    def __init__(self, op: DrivenOperation, intent: EffectPending) -> None:
        self.op, self.intent = op, intent
        self._buffer: list[StreamEvent] = []  # frozen: dumped only when a page is written
        self._page: list[StreamEvent] | None = None  # taken from the buffer, its write not yet staged
        self._starting: asyncio.Handle | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiting = False  # the task sleeps out an interval (which closing cancels)
        self._closed = False
        self.wrote = False
        """Whether a page was staged: frames of the reply may be stored."""

    def add(self, frame: StreamEvent) -> None:
        self._buffer.append(frame)
        if self._task is None and self._starting is None and not self._closed:
            self._starting = asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self._starting = None
        self._task = asyncio.get_running_loop().create_task(self._write())

    async def close(self) -> None:
        """Stop writing; waits only for a page write already on the line."""
        self._closed = True
        if self._starting is not None:
            self._starting.cancel()
            self._starting = None
        task = self._task
        if task is None:
            return
        if self._waiting:
            task.cancel()  # the wait ends at once; `_write` returns
        await task

    async def _write(self) -> None:
        op = self.op
        try:
            while self._buffer and not self._closed:
                if op.settings.frame_interval_s > 0:
                    self._waiting = True
                    try:
                        await op.settings.sleep(op.settings.frame_interval_s)
                    except asyncio.CancelledError:
                        if self._closed:  # close() ended the wait
                            return
                        raise
                    finally:
                        self._waiting = False
                page = self._page = self._buffer
                self._buffer = []

                async def plan(m: SessionMutator, page: list[StreamEvent] = page) -> Decision[None]:
                    if self._page is page:  # not taken by an abort request's commit meanwhile
                        self._page = None
                        self._stage(m, page)
                    return Decision(None)

                await op.run(plan)
                reached(FaultPoint.MID_STREAM)
        finally:
            self._task = None

    def take(self, m: SessionMutator) -> None:
        """Stage every frame streamed and not yet written, as one page, into the commit `m` (an
        abort request's, on the line): a settlement after a crash then knows what the person saw
        when they stopped, and does not take a reply they saw for one cut before any output (CE-7)."""
        page = [*(self._page or ()), *self._buffer]
        self._page, self._buffer = None, []
        self._stage(m, page)

    def _stage(self, m: SessionMutator, page: list[StreamEvent]) -> None:
        """Append `page` while its response is still effect-pending."""
        response_entry_id = self.intent.response_entry_id
        if page and getattr(self.op.projection.operation_state, "response_entry_id", None) == response_entry_id:
            frames: dict[str, JsonValue] = {"frames": [frame.model_dump(mode="json") for frame in page]}
            m.append(addresses.assistant_frames(self.op.operation_id, response_entry_id), frames)
            self.wrote = True


def nothing_streamed(state: EffectPending) -> AssistantMessage:
    """The interrupted reply of a step whose streamed frames are absent (or unreadable)."""
    model = state.generation.config.model
    return AssistantMessage(content=[], api="", provider=model.provider, model=model.model_id,
                            stop_reason="error", error_message=INTERRUPTED_REPLY)


def _showing(message: AssistantMessage) -> Callable[[LanePresentation], None]:
    def show(presentation: LanePresentation) -> None:
        presentation.streaming_message = message

    return show


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
