"""The operation a drive moves forward in this process: its lane, what it runs with, its effects
and the abort request it must obey; every phase handler takes it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from harness.context import Context
from harness.errors import ModelUnavailable, ToolsUnavailable
from harness.messages import ModelIdentity
from harness.providers import Model, Provider, StreamOptions
from harness.runtime.agent_tool import AgentTool, missing_tools
from harness.runtime.branch_context import BranchContext
from harness.runtime.commit import Decision, Transition, abort_requested, commit_transition
from harness.runtime.errors import HarnessFault
from harness.runtime.hooks import RunHooks
from harness.runtime.lane import Lane
from harness.runtime.outcomes import Settled
from harness.runtime.settings import DriveSettings, SystemPrompt
from harness.runtime.tracing import NO_TRACE, PassTrace
from harness.session import SessionMutator
from harness.session.records import GenerationContext

if TYPE_CHECKING:
    from harness.providers import ModelRegistry

R = TypeVar("R")


class UnwrittenFrames(Protocol):
    def take(self, m: SessionMutator) -> None:
        """Stage the frames streamed and not yet written into the commit `m`."""
        ...


@dataclass(frozen=True)
class DriveEnvironment:
    """What steps run with: the model registry and tools (resolved only when a step executes,
    HA-23), the system prompt, the drive settings and hooks, the session id providers see, and the
    agent's name in the run's spans (`gen_ai.agent.name`)."""

    models: ModelRegistry | None
    tools: Mapping[str, AgentTool]
    system_prompt: SystemPrompt
    settings: DriveSettings
    hooks: RunHooks
    session_id: str
    agent_name: str = "harness"


class DrivenOperation:
    """One lane's current operation while a drive of this process holds it (HA-6 `running`)."""

    def __init__(self, lane: Lane, operation_id: str, context: Context, environment: DriveEnvironment) -> None:
        self.lane = lane
        self.projection = lane.projection
        self.environment = environment
        self.settings = environment.settings
        self.hooks = environment.hooks
        self.operation_id = operation_id
        self.context = context
        self.abort_signal = asyncio.Event()
        self.pause_signal = asyncio.Event()
        """Set by `Lane.pause_drive`: return `Paused` at the next step boundary."""
        self.interrupt = asyncio.Event()
        """Set by an abort request or a pause: ends a retry's wait early."""
        self.effect_tasks: set[asyncio.Task[None]] = set()
        self.halted = False
        self.wait_for_retry = True
        self.poll_permits = 0
        self.frames: UnwrittenFrames | None = None
        """The frames of the reply streaming now not yet written, if one streams (its `FrameWriter`)."""
        self.unstarted_calls: set[str] = set()
        """The result entry ids of the tool calls whose intents this drive committed and whose
        effects it has not started (`tool_batch.with_tool_intents`)."""
        self._effects: set[Context] = set()
        self.trace: PassTrace = NO_TRACE
        """The spans of this pass (`tracing`): the driver starts them when the operation is a run."""

    # -- commits --------------------------------------------------------------------------------

    async def run(self, plan: Callable[[SessionMutator], Awaitable[Decision[R]]]) -> R:
        """Run `plan` as one job on the session line."""
        return await self.lane.core.line.run(plan, self.context)

    async def commit(self, transition: Transition) -> bool:
        """Commit `transition` (see `commit_transition`): False when it was refused."""
        return await commit_transition(self.lane.core.line, self.projection, self.operation_id, transition,
                                       self.context)

    def cached_branch(self) -> BranchContext | None:
        """The lane's cached branch since the newest compaction when it ends at the tip, else None.
        Only commit continuations change it, without yielding: reading it between two of them (or
        in a job on the line) sees what a read on the line would."""
        cached = self.projection.branch
        return cached if cached is not None and cached.tip == self.projection.tip_id else None

    async def branch(self) -> BranchContext:
        """The lane's branch since the newest compaction: cached, or read once on the line."""
        cached = self.cached_branch()
        if cached is not None:
            return cached

        async def plan(m: SessionMutator) -> Decision[BranchContext]:
            return Decision(await self.projection.branch_context(m, self.context))

        return await self.run(plan)

    @property
    def aborting(self) -> bool:
        """An abort was requested, here (not yet committed by the lane) or durably."""
        return self.abort_signal.is_set() or abort_requested(self.projection)

    def settled_elsewhere(self) -> Settled:
        """The outcome of an operation that is no longer current: its last result."""
        last = self.projection.last_result
        if last is None or last.operation_id != self.operation_id:
            raise HarnessFault(f"operation {self.operation_id} vanished without a result")
        return Settled(operation_id=self.operation_id, result=last)

    # -- waiting ---------------------------------------------------------------------------------

    async def sleep(self, seconds: float, interrupt: asyncio.Event) -> bool:
        """Sleep `seconds` with the injectable sleep; False when `interrupt` was set first."""
        if seconds > 0 and not interrupt.is_set():
            sleeper = asyncio.ensure_future(self.settings.sleep(seconds))
            interrupted = asyncio.ensure_future(interrupt.wait())
            try:
                await asyncio.wait({sleeper, interrupted}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                interrupted.cancel()
        return not interrupt.is_set()

    async def wait_until(self, not_before: int) -> bool:
        """Sleep until `not_before` (Unix ms, by the injectable clock); False if an abort or a
        pause came first."""
        return await self.sleep((not_before - self.settings.clock()) / 1000, self.interrupt)

    # -- effects --------------------------------------------------------------------------------

    def effect_context(self) -> Context:
        """A Context for one provider request or tool execution; an abort request cancels it."""
        effect = Context(self.context.attributes)
        if self.abort_signal.is_set():
            effect.cancel("abort requested")
        self._effects.add(effect)
        return effect

    def end_effect(self, effect: Context) -> None:
        self._effects.discard(effect)

    def cancel_effects(self, reason: str) -> None:
        for effect in list(self._effects):
            effect.cancel(reason)

    def spawn(self, effect: Coroutine[object, object, None]) -> asyncio.Task[None]:
        """Run a tool effect as a task of this operation (cancelled when the harness closes)."""
        task = asyncio.get_running_loop().create_task(effect)
        self.effect_tasks.add(task)
        task.add_done_callback(self.effect_tasks.discard)
        return task

    # -- models and tools (HA-23) ---------------------------------------------------------------

    def resolve(self, config_model: ModelIdentity, active_tools: Sequence[str]) -> tuple[Model, Provider]:
        """Resolve the captured model and tools at the execution boundary: `ModelUnavailable`,
        `ToolsUnavailable`."""
        registry = self.environment.models
        if registry is None:
            raise ModelUnavailable(config_model.provider, config_model.model_id)
        model, provider = registry.resolve(config_model)
        missing = missing_tools(active_tools, self.environment.tools)
        if missing:
            raise ToolsUnavailable(missing)
        return model, provider

    def stream_options(self, model: Model, generation: GenerationContext | None) -> StreamOptions:
        registry = self.environment.models
        api_key = registry.api_key(model) if registry is not None else None
        thinking = generation.config.thinking_level if generation is not None else "off"
        return StreamOptions(thinking_level=thinking, api_key=api_key,
                             session_id=f"{self.environment.session_id}:{self.lane.name}")
