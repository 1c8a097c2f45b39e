"""The driver: one pass per lane that maps each durable phase to its handler and commits the
transition the handler returns, until the operation settles or waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from harness.context import Context
from harness.runtime.commit import Transition
from harness.runtime.drive.checkpoint import checkpoint, direct_intent
from harness.runtime.drive.deferred import cancel_deferred, deferred_handle, poll, recover_poll
from harness.runtime.drive.operation import DriveEnvironment, DrivenOperation
from harness.runtime.drive.provider_step import (
    ask,
    generate,
    interrupted_reply,
    interruption,
    nothing_streamed,
    settle_reply,
    wait_retry,
)
from harness.runtime.drive.settlement import settle
from harness.runtime.drive.structural import finish_navigation, summarize, wait_summary_retry
from harness.runtime.drive.tool_batch import ToolBatchRunner
from harness.runtime.lane import Lane
from harness.runtime.outcomes import DriveOutcome, Paused, Suspended
from harness.runtime.tracing import NO_TRACE, PassTrace, drive_pass
from harness.session import SessionMutator, StorageCorruption
from harness.session.records import (
    AssistantEffectPending,
    AssistantReady,
    AssistantRetryWait,
    CancelRequested,
    DeferredEffectPending,
    DeferredSuspended,
    FailureDrain,
    NavigationIntent,
    NavigationReady,
    NeedAssistant,
    OperationState,
    RunCheckpoint,
    RunIntent,
    RunStarting,
    RunTools,
    SummaryPending,
    SummaryRetryWait,
)

Step = DriveOutcome | Transition | None
"""What a handler returns: an outcome ends the pass, a transition is committed, None goes on
from whatever the durable phase now is."""

STEP_BOUNDARIES = (RunStarting, RunCheckpoint, AssistantReady, AssistantRetryWait, DeferredSuspended,
                   SummaryRetryWait)
"""The durable phases in which no effect is in flight and none has started: a pause returns there,
and the next drive starts the step afresh (a tool batch or a streaming reply runs to its end first)."""


class OperationDriver:
    """Drives one lane's current operation in this process (`Lane.drive` starts it, HA-6 `running`).

    Every step is intent commit, effect, settlement commit. The projection is the authority: each
    pass of the loop reads the current phase from it, and each transition replaces it whole,
    keeping the control field, so an abort request committed meanwhile is never lost. Provider
    and tool effects run off the session line; their results come back as jobs on it."""

    def __init__(self, lane: Lane, operation_id: str, context: Context, environment: DriveEnvironment) -> None:
        self.op = DrivenOperation(lane, operation_id, context, environment)
        self._task: asyncio.Task[DriveOutcome] | None = None

    @property
    def operation_id(self) -> str:
        return self.op.operation_id

    @property
    def task(self) -> asyncio.Task[DriveOutcome] | None:
        return self._task

    def join(self, *, wait_for_retry: bool, poll_deferred: bool) -> asyncio.Task[DriveOutcome]:
        """The pass's task, started on the first join; each join may forbid waiting out a retry
        and may permit one poll of a deferred reply."""
        self.op.wait_for_retry = self.op.wait_for_retry and wait_for_retry
        self.op.poll_permits += int(poll_deferred)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self._task

    def stage_shown(self, m: SessionMutator) -> None:
        """Stage into an abort request's commit what this drive has shown and not persisted yet:
        the frames of the reply streaming now (CE-7: a settlement after a crash knows whether the
        person saw any output when they stopped)."""
        if self.op.frames is not None:
            self.op.frames.take(m)

    def on_abort(self) -> None:
        """Called in the commit continuation of a durable abort request."""
        self.op.abort_signal.set()
        self.op.interrupt.set()
        self.op.cancel_effects("abort requested")

    def pause(self) -> None:
        """Return `Paused` at the next step boundary (`STEP_BOUNDARIES`); an abort still settles first."""
        self.op.pause_signal.set()
        self.op.interrupt.set()

    def halt(self) -> Awaitable[object]:
        """Stop this pass now (the harness is closing): cancel its effects and its task; await the
        result to know they ended. The durable phase stays as it is, for the next attachment."""
        self.op.halted = True
        self.op.cancel_effects("the harness is closing")
        tasks: list[asyncio.Future[Any]] = [*self.op.effect_tasks, *([self._task] if self._task else [])]
        for task in tasks:
            task.cancel()
        return asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> DriveOutcome:
        trace = self.op.trace = self._trace()
        try:
            with trace.current():
                outcome = await self._loop()
        except BaseException as error:
            trace.end(None, error)
            raise
        finally:
            self.op.lane.presentation.streaming_message = None
            self.op.lane.presentation.tool_progress.clear()
        trace.end(outcome)
        return outcome

    async def _loop(self) -> DriveOutcome:
        while True:
            step = await self._advance()
            if isinstance(step, Transition):
                await self.op.commit(step)
            elif step is not None:
                return step

    def _trace(self) -> PassTrace:
        """The spans of this pass: a run's continue the trace its acceptance stored, in any process."""
        op = self.op
        meta = op.projection.meta
        if meta is None or meta.operation_id != op.operation_id or not isinstance(meta.intent, RunIntent):
            return NO_TRACE
        return drive_pass(agent=op.environment.agent_name, conversation_id=op.environment.session_id,
                          lane=op.lane.name, operation_id=op.operation_id, model=op.projection.config.model,
                          traceparent=meta.traceparent,
                          resumed=not isinstance(op.projection.operation_state, RunStarting))

    async def _advance(self) -> Step:
        op = self.op
        state, meta = op.projection.operation_state, op.projection.meta
        if state is None or meta is None or meta.operation_id != op.operation_id:
            return op.settled_elsewhere()
        if isinstance(state.control, CancelRequested):
            return await self._settle_aborted(state, state.control)
        if op.pause_signal.is_set() and not op.aborting and isinstance(state, STEP_BOUNDARIES):
            return Paused(operation_id=op.operation_id)
        match state:
            case RunStarting():
                # Not committed: a restart before the step's intent starts from `starting` again.
                return await checkpoint(op, RunCheckpoint(continuation=NeedAssistant(),
                                                          trigger_entry_id=op.projection.tip_id))
            case RunCheckpoint():
                return await checkpoint(op, state)
            case AssistantReady():
                return await generate(op, state)
            case AssistantEffectPending():
                return settle_reply(op, state, await interrupted_reply(op, state), interruption(), interrupted=True)
            case AssistantRetryWait():
                return await wait_retry(op, state)
            case RunTools():
                runner = ToolBatchRunner(op, state, lambda then, placed: direct_intent(op, then, placed))
                await runner.run()
                # Its last commit may have committed the next step's intent with the results.
                return None if runner.asked is None else await ask(op, runner.asked)
            case DeferredSuspended():
                if op.poll_permits == 0:
                    return Suspended(operation_id=op.operation_id,
                                     deferred=await deferred_handle(op, state.source_entry_id))
                op.poll_permits -= 1
                return await poll(op, state)
            case DeferredEffectPending():
                return recover_poll(op, state)
            case FailureDrain():
                return await settle(op, state, "failed", error=state.error)
            case SummaryPending():
                return await summarize(op, state)
            case SummaryRetryWait():
                return await wait_summary_retry(op, state)
            case NavigationReady():
                assert isinstance(meta.intent, NavigationIntent)
                return await finish_navigation(op, meta.intent, None)
        return None

    async def _settle_aborted(self, state: OperationState, control: CancelRequested) -> Step:
        """Answer what was in flight (the batch's calls, the streaming reply), then settle aborted."""
        op = self.op
        if isinstance(state, RunTools):
            await ToolBatchRunner(op, state).run()
            return None
        if isinstance(state, AssistantEffectPending | DeferredEffectPending):
            try:
                partial = await interrupted_reply(op, state)
            except StorageCorruption:
                # An abort must settle even when what had streamed cannot be read back, or a
                # damaged frame would hold the lane for good: the reply is kept without it.
                partial = nothing_streamed(state)
            return settle_reply(op, state, partial.model_copy(update={"stop_reason": "aborted"}), None)
        if isinstance(state, DeferredSuspended):
            await cancel_deferred(op, state)
        return await settle(op, state, "aborted", abort_cause=control.cause)
