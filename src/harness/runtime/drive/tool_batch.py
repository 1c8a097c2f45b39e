"""Running one assistant reply's tool calls: intent, effect, staging, placement in source order.

Each call: prepare (unknown tool, malformed or invalid arguments, truncated reply: an error result
without running, HA-25), `before_tool` (fails closed; may block or replace the arguments), the
intent commit (arguments stored, status `effect_pending`, `tool_start`), the effect, `after_tool`,
then staging (`outcome_ready`, `tool_end`). Staged results are placed on the branch in source
order as soon as every earlier call has one, so a call and its result are never separated.

When nothing but listeners may run between the reply's settlement and a call's intent (no
`before_tool` hook deciding it, no abort), the intents of the calls of tools safe to run again that
start at once are committed with the reply itself (`with_tool_intents`): still durable before
their effects, one commit fewer a tool step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence

from pydantic import JsonValue, ValidationError

from harness.messages import AssistantMessage, Message, TextContent, ToolCall, ToolResultMessage
from harness.runtime.agent_tool import AgentTool, ToolOutput, offered_tools
from harness.runtime.commit import (
    Decision,
    Placement,
    Transition,
    live_phase,
    pending_payload,
)
from harness.runtime.drive.operation import DrivenOperation
from harness.runtime.event_log import Announcement, ToolEndOf, TurnEndOf
from harness.runtime.events import (
    ToolEnd,
    ToolStart,
    ToolUpdate,
    TurnEnd,
)
from harness.runtime.fault_points import FaultPoint, reached
from harness.runtime.hooks import BeforeTool, Block, ToolCallRequest
from harness.runtime.requests import MAX_INPUT_BYTES, input_bytes
from harness.runtime.snapshot import LanePresentation
from harness.session import CommitResult, MessagePayload, SessionMutator, StorageCorruption, addresses
from harness.session.records import (
    AssistantEffectPending,
    CancelRequested,
    MayFinish,
    NeedAssistant,
    OperationState,
    PendingMessage,
    RunCheckpoint,
    RunTools,
    ToolBatch,
    ToolCallState,
)

INTERRUPTED = ("The tool was interrupted before it reported a result, so whether its side effects "
               "happened is unknown.")
NOT_RUN_ABORTED = "The run was aborted before this tool call started; it was not run."
UNKNOWN_TOOL = "Tool {name!r} is not available; it was not run."
INVALID_ARGUMENTS = "The arguments are not valid for tool {name!r}, so it was not run: {problem}"
TRUNCATED = "The reply was cut off at the output limit, so these arguments may be incomplete; it was not run. " \
            "Re-issue the call with complete arguments."
BLOCKED = "The call was blocked: {reason}"


DirectIntent = Callable[[RunCheckpoint, Sequence[Message]], Transition | None]
"""Given the checkpoint a batch's last commit would move to and the results it places, the next
step's intent to commit instead (its phase an `AssistantEffectPending`), or None
(`checkpoint.direct_intent`)."""


class ToolBatchRunner:
    """Runs the batch of phase `run_tools` to its end: every call answered and placed. With
    `direct`, the commit that completes the batch may commit the next step's intent too; `asked`
    is then that intent, for the driver to send."""

    def __init__(self, op: DrivenOperation, state: RunTools, direct: DirectIntent | None = None) -> None:
        self.op, self.lane, self.projection = op, op.lane, op.projection
        self.direct = direct
        self.asked: AssistantEffectPending | None = None
        self.batch = state.batch
        self.tools = _batch_tools(op, self.batch)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.message: AssistantMessage | None = None
        self.placed_results: list[ToolResultMessage] = []  # every result this runner placed, for turn_end
        # The calls this runner started and those whose progress it persisted: a call started here
        # that persisted none has no checkpoint to delete (a restored one may have one).
        self.launched: set[int] = set()
        self.checkpointed: set[int] = set()

    @property
    def aborting(self) -> bool:
        return self.op.aborting

    def _calls(self) -> list[ToolCallState]:
        state = live_phase(self.projection, self.op.operation_id, RunTools)
        return state.batch.calls if state is not None else []

    async def run(self) -> None:
        """Run the batch to the end (every call answered and placed), or, under an abort, answer
        every open call with an interrupted or not-run result within the grace period."""
        message = self.message = self.message or await self._assistant_message()
        for index, call in enumerate(self.batch.calls):
            if self.aborting:
                break
            calls = self._calls()
            if not calls:
                break  # calls already running answered the rest and completed the batch
            current = calls[index]
            if current.status in ("outcome_ready", "completed"):
                continue
            block = message.content[call.source_index]
            if not isinstance(block, ToolCall):  # HA-11: indexes count every content block
                raise StorageCorruption(f"content {call.source_index} of the reply is not a tool call",
                                        entry_id=self.batch.assistant_entry_id)
            if current.status == "effect_pending" and current.result_entry_id in self.op.unstarted_calls:
                # Its intent was committed with the reply (`with_tool_intents`): start it now.
                tool = self.tools[block.name]
                await self._launch(index, block, tool, dict(block.arguments))
            elif current.status == "effect_pending":
                await self._restore(index, block)
            else:
                await self._start(index, block, message)
        await self._finish()

    async def _assistant_message(self) -> AssistantMessage:
        """The reply whose calls run: the one the lane's cached branch holds (it was just settled),
        or, after a restart, the one the journal holds."""
        entry_id = self.batch.assistant_entry_id
        cached = self.projection.cached_entry(entry_id)
        if cached is not None and isinstance(cached.payload, MessagePayload) and isinstance(
                cached.payload.message, AssistantMessage):
            return cached.payload.message

        async def plan(m: SessionMutator) -> Decision[AssistantMessage]:
            entry = await m.entry(entry_id, self.op.context)
            message = entry.payload.message if entry and isinstance(entry.payload, MessagePayload) else None
            if not isinstance(message, AssistantMessage):
                raise StorageCorruption(f"entry {entry_id} should be the reply whose tools run", entry_id=entry_id)
            return Decision(message)

        return await self.op.run(plan)

    # -- one call -------------------------------------------------------------------------------

    async def _start(self, index: int, block: ToolCall, message: AssistantMessage) -> None:
        op = self.op
        tool = self.tools.get(block.name)
        args: dict[str, JsonValue] = dict(block.arguments)
        problem = _problem(block, tool, args, message)
        hook = _deciding_hook(op, tool) if problem is None and tool is not None else None
        if hook is not None and tool is not None:
            request = ToolCallRequest(op.operation_id, block.id, block.name, args, tool.asks_first)
            # An effect's Context, so a durable abort cancels a hook that waits for a person's answer.
            asking = op.effect_context()
            try:
                decision = await hook(request, asking)
            except Exception as error:  # approval fails closed
                decision = Block(reason=f"the approval check failed: {error}")
            finally:
                op.end_effect(asking)
            if self.aborting:
                return
            if isinstance(decision, Block):
                problem = BLOCKED.format(reason=decision.reason)
            elif decision is not None:
                args = decision
                problem = _problem(block, tool, args, message)
        if problem is not None or tool is None:
            await self._stage(index, block, _error_result(block, problem or UNKNOWN_TOOL.format(name=block.name)))
            return
        if await self._intent(index, block, tool, args):
            await self._launch(index, block, tool, args)

    async def _launch(self, index: int, block: ToolCall, tool: AgentTool, args: dict[str, JsonValue]) -> None:
        """Start the effect of call `index`, whose intent has committed."""
        op = self.op
        op.unstarted_calls.discard(self.batch.calls[index].result_entry_id)
        self.launched.add(index)
        reached(FaultPoint.TOOL_INTENT)
        task = self.tasks[index] = op.spawn(self._execute(index, block, tool, args))
        if op.settings.tool_execution == "sequential":
            await asyncio.wait({task})

    async def _restore(self, index: int, block: ToolCall) -> None:
        """An effect that may have happened before a crash: run it again only if it is safe."""
        op = self.op
        tool = self.tools.get(block.name)
        call = self._calls()[index]
        address = addresses.tool_args(op.operation_id, self.batch.turn_id, call.source_index)

        async def read(m: SessionMutator) -> Decision[dict[str, JsonValue] | None]:
            stored: dict[str, JsonValue] | None = await m.get(address, op.context)
            return Decision(stored)

        args = await op.run(read)
        if tool is None or tool.replay != "safe" or call.replay != "safe" or args is None:
            await self._stage(index, block, await self._interrupted(block, call))
            return
        self.lane.present(lambda _: None, [_tool_start(op, self.batch, block, args)], op.context)
        self.tasks[index] = op.spawn(self._execute(index, block, tool, args))

    async def _intent(self, index: int, block: ToolCall, tool: AgentTool, args: dict[str, JsonValue]) -> bool:
        op, projection = self.op, self.projection

        async def plan(m: SessionMutator) -> Decision[bool]:
            state = live_phase(projection, op.operation_id, RunTools, intent=True)
            if state is None:
                return Decision(False)
            new_state = _at_intent(state, [(index, tool)])
            m.set(addresses.tool_args(op.operation_id, self.batch.turn_id, self.batch.calls[index].source_index),
                  args)
            m.set(addresses.operation_state(op.operation_id), new_state)

            def publish(result: CommitResult | None) -> None:
                projection.operation_state = new_state

            return Decision(True, [_tool_start(op, self.batch, block, args)], publish)

        return await op.run(plan)

    async def _execute(self, index: int, block: ToolCall, tool: AgentTool, args: dict[str, JsonValue]) -> None:
        op, lane = self.op, self.lane
        effect = op.effect_context()
        call = self.batch.calls[index]
        checkpoint = addresses.tool_checkpoint(op.operation_id, call.result_entry_id)

        async def on_update(partial: JsonValue, persist: bool) -> None:
            reached(FaultPoint.TOOL_EFFECT)  # progress means the effect is under way

            def show(presentation: LanePresentation) -> None:
                presentation.tool_progress[block.id] = partial

            lane.present(show, [ToolUpdate(lane=lane.name, operation_id=op.operation_id, turn_id=self.batch.turn_id,
                                           tool_call_id=block.id, partial_result=partial)], op.context)
            if persist:
                async def plan(m: SessionMutator) -> Decision[None]:
                    if self._calls()[index].status == "effect_pending":
                        m.set(checkpoint, partial)
                        self.checkpointed.add(index)
                    return Decision(None)

                await op.run(plan)

        with op.trace.tool(block.name, block.id, tool.spec.description) as span:
            try:
                output = await tool.execute(block.id, args, on_update, effect)
            except asyncio.CancelledError as error:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the harness cancelled this call: an interruption, not a result
                # The tool's own (it awaited something another task cancelled): a failure like any other.
                output = _failure_output(error)
            except BaseException as error:  # SystemExit, KeyboardInterrupt too: a tool's failure is its result
                output = _failure_output(error)
            finally:
                op.end_effect(effect)
                lane.presentation.tool_progress.pop(block.id, None)
            # Under an abort too: the output may still be stored, and the hook may be what keeps
            # something out of the journal (the conversation layer's image bytes, CE-22).
            if op.hooks.after_tool is not None:
                request = ToolCallRequest(op.operation_id, block.id, block.name, args, tool.asks_first)
                try:
                    output = await op.hooks.after_tool(request, output, op.context) or output
                except Exception as error:
                    output = ToolOutput(content=[TextContent(text=f"after_tool failed: {error}")], is_error=True)
            result, terminate = _result_of(block, output)
            span.result(result)
        if op.halted:
            return  # the harness is closing: like a crash, the effect's outcome is not recorded
        reached(FaultPoint.BEFORE_TOOL_STAGING)
        await self._stage(index, block, result, terminate=terminate)

    async def _interrupted(self, block: ToolCall, call: ToolCallState) -> ToolResultMessage:
        """An interruption result: the latest checkpoint, if any, and a note that the outcome is unknown."""
        op = self.op
        address = addresses.tool_checkpoint(op.operation_id, call.result_entry_id)

        async def read(m: SessionMutator) -> Decision[JsonValue]:
            return Decision(await m.get(address, op.context))

        partial = await op.run(read)
        text = INTERRUPTED if partial is None else f"{INTERRUPTED} Last progress it reported:\n{json.dumps(partial)}"
        return _error_result(block, text)

    # -- staging and placement ------------------------------------------------------------------

    async def _stage(self, index: int, block: ToolCall, result: ToolResultMessage, *, terminate: bool = False) -> None:
        """Stage `result` for call `index` and place every result whose earlier calls all have one."""
        op, projection, lane = self.op, self.projection, self.lane.name

        async def plan(m: SessionMutator) -> Decision[None]:
            state = live_phase(projection, op.operation_id, RunTools)
            if state is None or state.batch.calls[index].status not in ("planned", "effect_pending"):
                return Decision(None)  # a late result after an interruption: discarded
            call = state.batch.calls[index]
            calls = list(state.batch.calls)
            final_terminate = terminate and not isinstance(state.control, CancelRequested)
            calls[index] = call.model_copy(update={"status": "outcome_ready", "terminate": final_terminate})
            staged = PendingMessage(message=result)
            if index not in self.launched or index in self.checkpointed:
                m.delete(addresses.tool_checkpoint(op.operation_id, call.result_entry_id))
            ready = []
            for position, candidate in enumerate(calls):
                if candidate.status == "completed":
                    continue
                if candidate.status != "outcome_ready":
                    break
                ready.append(position)
            waits = index not in ready  # an earlier call still runs: the result waits, staged
            if waits:
                m.set(addresses.pending_entry(call.result_entry_id), staged)
            earlier = [calls[i].result_entry_id for i in ready if i != index]
            await projection.load_pending(m, earlier, op.context)
            payloads = {**{entry_id: projection.pending[entry_id] for entry_id in earlier},
                        call.result_entry_id: staged}
            placement = Placement(projection.tip_id)
            for position in ready:
                entry_id = calls[position].result_entry_id
                placement.stage(m, entry_id, pending_payload(payloads[entry_id]))
                if position != index:  # placed from its pending entry
                    m.delete(addresses.pending_entry(entry_id))
                calls[position] = calls[position].model_copy(update={"status": "completed"})
            parent = placement.tip
            placed = [payload.message for _, payload, _ in placement.staged
                      if isinstance(payload, MessagePayload) and isinstance(payload.message, ToolResultMessage)]
            complete = all(c.status == "completed" for c in calls)
            direct: Transition | None = None
            new_state: RunTools | RunCheckpoint | AssistantEffectPending
            if complete:
                for c in calls:
                    m.delete(addresses.tool_args(op.operation_id, self.batch.turn_id, c.source_index))
                continuation = MayFinish() if all(c.terminate for c in calls) else NeedAssistant()
                new_state = RunCheckpoint(continuation=continuation, trigger_entry_id=parent, steps=self.batch.step,
                                          control=state.control)
                direct = self.direct(new_state, placed) if self.direct is not None else None
                if direct is not None:
                    assert isinstance(direct.state, AssistantEffectPending)
                    new_state = direct.state.model_copy(update={"control": state.control})
            else:
                new_state = state.model_copy(update={"batch": state.batch.model_copy(update={"calls": calls})})
            m.set(addresses.operation_state(op.operation_id), new_state)
            if placement.staged:
                m.set(addresses.branch_tip(lane), parent)

            tool_end = ToolEnd(lane=lane, operation_id=op.operation_id, turn_id=self.batch.turn_id,
                               tool_call_id=block.id, result=result, terminate=final_terminate)
            # Placed now (no earlier call still runs), the result is logged as its entry.
            placed_now = any(entry_id == call.result_entry_id for entry_id, _, _ in placement.staged)
            events: list[Announcement] = [ToolEndOf(tool_end, call.result_entry_id) if placed_now else tool_end,
                                          *placement.events(lane)]
            if complete and self.message is not None:
                turn_end = TurnEnd(lane=lane, operation_id=op.operation_id, turn_id=self.batch.turn_id,
                                   message=self.message, tool_results=(*self.placed_results, *placed))
                events.append(TurnEndOf(turn_end, self.batch.assistant_entry_id,
                                        tuple(c.result_entry_id for c in calls)))
            if direct is not None and direct.events is not None:
                events += direct.events()

            def publish(commit: CommitResult | None) -> None:
                projection.operation_state = new_state
                if isinstance(new_state, AssistantEffectPending):
                    self.asked = new_state
                if waits:
                    projection.pending[call.result_entry_id] = staged
                placement.publish(projection, commit)
                for entry_id, _, _ in placement.staged:
                    projection.pending.pop(entry_id, None)
                self.placed_results += placed

            return Decision(None, events, publish)

        await op.run(plan)

    async def _finish(self) -> None:
        """Wait for the running effects; under an abort, give them the grace period, then answer
        every open call: interrupted if it started, not run if it did not."""
        op = self.op
        pending = {task for task in self.tasks.values() if not task.done()}
        if pending:
            abort_wait = asyncio.ensure_future(op.abort_signal.wait())
            try:
                while pending and not self.aborting:
                    done, _ = await asyncio.wait(pending | {abort_wait}, return_when=asyncio.FIRST_COMPLETED)
                    pending -= done
            finally:
                abort_wait.cancel()
        if self.aborting and pending:
            _, late = await asyncio.wait(pending, timeout=op.settings.abort_grace_s)
            for task in late:
                task.cancel()
        failures = [task.exception() for task in self.tasks.values() if task.done() and not task.cancelled()]
        for failure in failures:  # every exception is retrieved; the first is raised
            if failure is not None:
                raise failure
        if not self.aborting:
            return
        message = self.message or await self._assistant_message()
        for index, call in enumerate(self._calls()):
            block = message.content[call.source_index]
            assert isinstance(block, ToolCall)
            if call.status == "planned" or call.result_entry_id in op.unstarted_calls:
                op.unstarted_calls.discard(call.result_entry_id)
                await self._stage(index, block, _error_result(block, NOT_RUN_ABORTED))
            elif call.status == "effect_pending":
                await self._stage(index, block, await self._interrupted(block, call))


def with_tool_intents(op: DrivenOperation, settlement: Transition, message: AssistantMessage) -> Transition:
    """The settlement of `message` (a reply whose next phase is `run_tools`) with the intents of the
    calls that start at once committed in it: each call's arguments, status `effect_pending` and
    replay rule, and its `tool_start` after the reply's events. Still durable before the effect
    (HA-25), one commit fewer than an intent of its own.

    Only for a call whose tool is safe to run again (`replay="safe"`): listeners take the reply's
    events before the call starts, and a harness closed meanwhile leaves it `effect_pending`, to be
    run again on the next attachment as a planned call would be; a never-replay call commits its
    own intent right before its effect, so such a close leaves it planned, not "interrupted". And
    only when nothing else comes between: no abort requested (decided on the session line, in the
    commit itself), no `before_tool` hook deciding the call (it may block it or change its
    arguments) nor any call before it (the call would wait for that one's answer); calls answered
    without running (unknown tool, invalid arguments, a truncated reply) keep their own path. In
    parallel execution every such call starts at once, in sequential execution only a first one.
    The calls whose intents committed wait in `DrivenOperation.unstarted_calls` for the batch
    runner, which starts them, or answers them as not run under an abort that came after."""
    state = settlement.state
    if not isinstance(state, RunTools) or op.aborting:
        return settlement
    batch, tools = state.batch, _batch_tools(op, state.batch)
    starting: list[tuple[int, ToolCall, AgentTool]] = []
    for index, call in enumerate(batch.calls):
        block = message.content[call.source_index]
        assert isinstance(block, ToolCall)  # the batch is made from the reply's tool calls
        tool = tools.get(block.name)
        decided = tool is not None and _deciding_hook(op, tool) is not None
        # A call answered without running (its problem) is not asked about and holds up nothing.
        if tool is not None and (tool.replay == "safe" or decided) and _problem(
                block, tool, dict(block.arguments), message) is None:
            if decided:
                break  # this call waits for the hook's answer, and every later call for this one
            starting.append((index, block, tool))
        if op.settings.tool_execution == "sequential":
            break  # the next call starts only after this one's result
    if not starting:
        return settlement
    intended = _at_intent(state, [(index, tool) for index, _, tool in starting])
    operation_id = op.operation_id

    def next_state(current: OperationState) -> OperationState:
        if isinstance(current.control, CancelRequested):  # decided on the line: an abort came first
            starting.clear()  # so the writes, events and publication below carry no intent
            return state
        return intended

    def stage(m: SessionMutator) -> None:
        if settlement.stage is not None:
            settlement.stage(m)
        for index, block, _ in starting:
            m.set(addresses.tool_args(operation_id, batch.turn_id, batch.calls[index].source_index),
                  dict(block.arguments))

    def events() -> Sequence[Announcement]:
        return [*(settlement.events() if settlement.events is not None else ()),
                *(_tool_start(op, batch, block, dict(block.arguments)) for _, block, _ in starting)]

    def publish(result: CommitResult | None) -> None:
        if settlement.publish is not None:
            settlement.publish(result)
        op.unstarted_calls.update(batch.calls[index].result_entry_id for index, _, _ in starting)

    return Transition(next_state, stage, events, publish)


def _at_intent(state: RunTools, calls: Sequence[tuple[int, AgentTool]]) -> RunTools:
    """`state` with calls `index` at their intent: `effect_pending`, with their tool's replay rule."""
    updated = list(state.batch.calls)
    for index, tool in calls:
        updated[index] = updated[index].model_copy(update={"status": "effect_pending", "replay": tool.replay})
    return state.model_copy(update={"batch": state.batch.model_copy(update={"calls": updated})})


def _tool_start(op: DrivenOperation, batch: ToolBatch, block: ToolCall, args: dict[str, JsonValue]) -> ToolStart:
    return ToolStart(lane=op.lane.name, operation_id=op.operation_id, turn_id=batch.turn_id, tool_call_id=block.id,
                     tool_name=block.name, args=args)


def _deciding_hook(op: DrivenOperation, tool: AgentTool) -> BeforeTool | None:
    """The `before_tool` hook when it decides the calls of `tool` (`RunHooks.before_tool_applies`)."""
    hook, applies = op.hooks.before_tool, op.hooks.before_tool_applies
    return hook if hook is not None and (applies is None or applies(tool)) else None


def _batch_tools(op: DrivenOperation, batch: ToolBatch) -> dict[str, AgentTool]:
    """The tools the batch's calls may run: the active ones of its configuration this harness has
    (a pattern's, as present now)."""
    return {tool.name: tool for tool in offered_tools(batch.config.active_tools, op.environment.tools)}


def _problem(block: ToolCall, tool: AgentTool | None, args: dict[str, JsonValue],
             message: AssistantMessage) -> str | None:
    """Why call `block` is answered with an error result without running (HA-25), or None."""
    if tool is None:
        return UNKNOWN_TOOL.format(name=block.name)
    if message.stop_reason == "length":
        return TRUNCATED
    if block.raw_arguments is not None:
        return INVALID_ARGUMENTS.format(name=block.name, problem="they are not a JSON object")
    errors = sorted(tool.arguments_validator.iter_errors(args), key=lambda e: list(e.path))
    if errors:
        return INVALID_ARGUMENTS.format(name=block.name, problem=errors[0].message)
    return None


def _failure_output(error: BaseException) -> ToolOutput:
    return ToolOutput(content=[TextContent(text=f"{type(error).__name__}: {error}")], is_error=True)


def _error_result(block: ToolCall, text: str) -> ToolResultMessage:
    """A synthetic error result: no details, the tool's own contract is not invented (HA-25)."""
    return ToolResultMessage(tool_call_id=block.id, tool_name=block.name, content=[TextContent(text=text)],
                             is_error=True)


def _result_of(block: ToolCall, output: object) -> tuple[ToolResultMessage, bool]:
    """The result message of what a tool returned, and its `terminate`; a value that is not a
    storable `ToolOutput`, or one over `MAX_INPUT_BYTES`, becomes an error result: a tool's failure
    is its result, not the run's."""
    if isinstance(output, ToolOutput):
        try:
            result = ToolResultMessage(tool_call_id=block.id, tool_name=block.name, content=output.content,
                                       details=output.details, is_error=output.is_error)
            if (size := input_bytes([result])) <= MAX_INPUT_BYTES:
                return result, output.terminate
            problem = f"its output takes {size:,} bytes, more than one result may take ({MAX_INPUT_BYTES:,})"
        except ValidationError as error:
            problem = f"its output is not storable ({error.errors()[0]['msg']})"
    else:
        problem = f"it returned {type(output).__name__}, not a ToolOutput"
    return _error_result(block, f"The tool {block.name!r} failed: {problem}."), False
