"""`Garden`: a workspace tended by a background agent, the gardener, that pursues the garden's
goals in runs, and the driver that starts, resumes and observes those runs.

A garden lives in its runtime root (`RuntimeRoot`) and in one journal session: each goal has its
own lane there (`goal-<goal id>`), so a durable goal's runs continue one history, and each pursuit
of a goal is a run whose run id is that run's harness operation id. Around every run the driver
sets the run context (`running`, and `HARNESS_GARDEN_*` for the shell commands the run starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import JsonValue, ValidationError

from harness.context import Context
from harness.conversation import ConversationEnded, ConversationService, Forbidden, GardenMessage, GoalStatus
from harness.errors import HarnessError, InvalidInput
from harness.garden.events import GardenEvent, GoalChanged, RunFinished, RunStatus, publish, tend_finished
from harness.garden.operator_messages import operator_message_tools
from harness.garden.records import GARDENER, ConversationOrigin, Gardener, GardenRecord, Goal, GoalState, GoalType
from harness.garden.root import RuntimeRoot, check_name, default_root, name_problem
from harness.garden.run_context import RunContext, current_run_context, running
from harness.home import harness_home
from harness.messages import AssistantMessage, TextContent, now_ms, text_of
from harness.providers import ModelRegistry, ToolSpec
from harness.runtime import (
    AgentHarness,
    AgentHarnessOptions,
    AgentTool,
    DriveOutcome,
    DriveSettings,
    Lane,
    ProgressCallback,
    PromptRequest,
    Settled,
    Suspended,
    ToolOutput,
)
from harness.session import LaneConfig, MessagePayload, SessionNotFound, Store, UnknownLane
from harness.session.ids import new_id
from harness.tools import BUILTIN_TOOL_NAMES, Workspace, builtin_tools
from harness.tools.workspace import TOOL_ENVIRONMENT

logger = logging.getLogger("harness.garden")


class GardenNotFound(HarnessError):
    """No garden of that name at that runtime root; details `{garden, root}`."""

    code = "garden_not_found"


class GardenExists(HarnessError):
    """A garden already lives at that runtime root; nothing was written. Details `{garden, root}`."""

    code = "garden_exists"


class GardenDamaged(HarnessError):
    """The garden's record (`garden.json`) does not read: torn, edited by hand, not JSON. Only this
    garden is unusable; nothing was written. Details `{garden}`."""

    code = "garden_damaged"


class GoalDamaged(HarnessError):
    """A goal's file does not read (torn, edited by hand); only this goal is unusable, and nothing
    was written. Details `{garden, goal_id}`."""

    code = "goal_damaged"


class GardenWriteFailed(HarnessError):
    """The garden's folder refused a write (a full disk, a file where a folder goes, no
    permission): what was being saved was not. Details `{garden, goal_id}`."""

    code = "garden_write_failed"


class GoalNotFound(HarnessError):
    """The garden has no goal of that id; details `{garden, goal_id}`."""

    code = "goal_not_found"


@dataclass(frozen=True)
class GardenSetup:
    """What a garden runs with in this process: the journal (`store`, and its URL for the shell
    commands of a run), the conversation service its messages go through, the models, and the
    drive settings of the gardener's runs."""

    store: Store
    service: ConversationService
    models: ModelRegistry | None = None
    store_url: str | None = None
    drive: DriveSettings = field(default_factory=DriveSettings)


GARDEN_FILES = ("garden.json", "goals", "runs", "inbox", "events.jsonl", "work", "tool-output")
"""What a garden keeps at its runtime root (`RuntimeRoot`, and the gardener's workspace), `garden.json`
first: `Garden.delete` removes these."""

_FRAMING: dict[GoalType, str] = {
    "tend": "Tend the garden. {text}\nLeave your survey for the operator with emit_tend_survey.",
    "durable": "Pursue this goal: {text}\nWhen it is achieved, tell the operator with emit_recently_concluded, "
               "then call conclude_goal. Otherwise say where you stopped; you will continue in a later run.",
    "converse": "A person asks: {text}\nYour final reply is sent to them as the garden's answer.",
}

_CONCLUDE = ToolSpec(name="conclude_goal", description="Mark this run's durable goal as achieved; it is not pursued "
                     "again.", parameters={"type": "object", "properties": {}, "additionalProperties": False})


class Garden:
    """A garden: its record, goals, runtime root and gardener (see the module docstring)."""

    def __init__(self, root: RuntimeRoot, record: GardenRecord, setup: GardenSetup) -> None:
        self.root = root
        self.record = record
        self.setup = setup
        self._harness: AgentHarness | None = None

    @property
    def name(self) -> str:
        return self.record.name

    # -- making and finding gardens -----------------------------------------------------------------

    @classmethod
    async def create(cls, name: str, gardener: Gardener, setup: GardenSetup, context: Context, *, owner: str,
                     root: Path | None = None) -> Garden:
        """A new garden `name` at `root` (default `$HARNESS_HOME/gardens/<name>/`) whose messages
        go to `owner`'s conversations, with a journal session of its own. Raises `InvalidInput`
        for a malformed name or a built-in tool that does not exist and `GardenExists`; nothing
        was written then."""
        runtime = RuntimeRoot(check_name("garden name", name), root or default_root(name))
        unknown = sorted(set(gardener.builtin_tools) - set(BUILTIN_TOOL_NAMES))
        if unknown:
            raise InvalidInput(f"no built-in tools {', '.join(unknown)}: they are {', '.join(BUILTIN_TOOL_NAMES)}",
                               tools=list(unknown))
        if runtime.garden_file.exists():
            raise GardenExists(f"garden {name} already lives at {runtime.path}", garden=name, root=str(runtime.path))
        session = await setup.store.create_session(context)
        record = GardenRecord(name=name, owner=owner, gardener=gardener, session_id=session.id, created_at=now_ms())
        await asyncio.to_thread(runtime.write_json, runtime.garden_file, record.model_dump(mode="json"))
        return cls(runtime, record, setup)

    @classmethod
    def open(cls, name: str, setup: GardenSetup, *, root: Path | None = None) -> Garden:
        """The garden `name` at `root` (default under `$HARNESS_HOME/gardens/`); `GardenNotFound`
        when none lives there, `GardenDamaged` when its record does not read, `InvalidInput` for a
        malformed name."""
        runtime = RuntimeRoot(check_name("garden name", name), root or default_root(name))
        try:
            record = GardenRecord.model_validate_json(runtime.garden_file.read_bytes())
        except FileNotFoundError:
            raise GardenNotFound(f"no garden {name} at {runtime.path}", garden=name, root=str(runtime.path)) from None
        except (OSError, ValidationError) as error:
            logger.error("garden %s: its record %s does not read: %s", name, runtime.garden_file, error)
            raise GardenDamaged(f"garden {name}'s record (garden.json) does not read; mend or remove it",
                                garden=name) from None
        if record.name != name:
            raise GardenNotFound(f"the garden at {runtime.path} is {record.name}, not {name}", garden=name,
                                 root=str(runtime.path))
        return cls(runtime, record, setup)

    async def delete(self, context: Context) -> None:
        """Delete the garden for good: its journal session (every goal's lane and run), then what it
        keeps at its runtime root (`GARDEN_FILES`), and the root itself if nothing else is left in
        it. The messages it sent stay in the conversations they went to.

        Raises `SessionOwned` while a process tends or serves it (nothing is deleted) and
        `GardenWriteFailed` when a file cannot be removed (the journal session is gone by then,
        and so is the garden: `garden.json` goes first)."""
        with contextlib.suppress(SessionNotFound):  # a delete that stopped half-way is finished
            await self.setup.store.delete_session(self.record.session_id, context)

        def remove() -> None:
            for name in GARDEN_FILES:
                path = self.root.path / name
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # not empty: files the garden did not make stay
                self.root.path.rmdir()

        try:
            await asyncio.to_thread(remove)
        except OSError as error:
            raise GardenWriteFailed(f"garden {self.name}: cannot remove its files at {self.root.path}: {error}",
                                    garden=self.name) from error

    async def close(self, context: Context) -> None:
        """Detach the gardener's journal session, if a run attached it; runs left open stay open."""
        if self._harness is not None:
            harness, self._harness = self._harness, None
            await harness.close(context)

    # -- goals --------------------------------------------------------------------------------------

    def goals(self) -> list[Goal]:
        """Every goal, oldest first; a goal file that does not read is logged and left out."""
        goals = []
        for path in sorted(self.root.goals_dir.glob("*.json")) if self.root.goals_dir.is_dir() else []:
            try:
                goals.append(Goal.model_validate_json(path.read_bytes()))
            except (OSError, ValidationError) as error:
                logger.error("garden %s: goal file %s does not read: %s", self.name, path.name, error)
        return sorted(goals, key=lambda goal: (goal.created_at, goal.id))

    def goal(self, goal_id: str) -> Goal:
        """Goal `goal_id`; `GoalNotFound`, `GoalDamaged` when its file does not read, or
        `InvalidInput` for a malformed id."""
        path = self.root.goal_file(goal_id)
        try:
            return Goal.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            raise GoalNotFound(f"garden {self.name} has no goal {goal_id}", garden=self.name,
                               goal_id=goal_id) from None
        except (OSError, ValidationError) as error:
            logger.error("garden %s: goal file %s does not read: %s", self.name, path.name, error)
            raise GoalDamaged(f"goal {goal_id} of garden {self.name} does not read; mend or remove its file",
                              garden=self.name, goal_id=goal_id) from None

    async def add_goal(self, goal_type: GoalType, text: str, context: Context, *,
                       origin: ConversationOrigin | None = None, every_s: float | None = None,
                       goal_id: str | None = None) -> Goal:
        """Give the garden a goal, `active`. A converse goal needs an `origin` (it answers there);
        an origin conversation must be the garden owner's and open; `every_s` is a tend goal's
        schedule (None: every tending pass). Raises `InvalidInput` for a blank text, a malformed
        or taken id, a converse goal without an origin, a schedule on another type or an origin
        that is not a conversation of the owner, `ConversationEnded` for an ended one; nothing
        was written then."""
        goal_id = check_name("goal id", goal_id or new_id())
        if goal_type == "converse" and origin is None:
            raise InvalidInput("a converse goal answers in its origin conversation: give one", goal_type=goal_type)
        if every_s is not None and goal_type != "tend":
            raise InvalidInput("only a tend goal has a schedule", goal_type=goal_type)
        if self.root.goal_file(goal_id).exists():
            raise InvalidInput(f"garden {self.name} already has a goal {goal_id}", goal_id=goal_id)
        if origin is not None:
            await self._check_origin(origin, context)
        try:
            goal = Goal(id=goal_id, type=goal_type, text=text.strip(), origin=origin, every_s=every_s,
                        created_at=now_ms())
        except ValidationError as error:
            raise InvalidInput(f"not a goal: {error.errors()[0]['msg']}", goal_id=goal_id) from error
        await self._save(goal)
        return goal

    async def withdraw_goal(self, goal_id: str, context: Context) -> None:
        """Take back goal `goal_id` that never started, as if it had not been given: its file goes
        and nothing is published (a goal command whose kickoff turn was refused). A goal this
        garden does not have is left alone."""
        await asyncio.to_thread(self.root.goal_file(goal_id).unlink, missing_ok=True)

    async def set_status(self, goal_id: str, status: GoalState, context: Context, *,
                         recorded_in: str | None = None) -> Goal:
        """Set goal `goal_id`'s status, publish `goal_status`, and show it in the goal's origin
        conversation as a goal row (a conversation that cannot take it now is logged, not fatal),
        unless that conversation is `recorded_in`, the one whose typed command made the change:
        its command row is the change's record there (CE-6). Unchanged: nothing is written.
        Raises `GoalNotFound`."""
        goal = self.goal(goal_id)
        if goal.status == status:
            return goal
        goal = goal.model_copy(update={"status": status})
        await self._save(goal)
        await self._publish(GoalChanged(goal_id=goal.id, status=status))
        if goal.origin is not None and goal.origin.conversation_id != recorded_in:
            row = GoalStatus(goal_id=goal.id, status=status, title=goal.title)
            try:
                await self.setup.service.record(self.record.owner, goal.origin.conversation_id, row, context)
            except HarnessError as error:
                logger.warning("goal %s: its conversation %s did not take the status row: %s", goal.id,
                               goal.origin.conversation_id, error.message)
        return goal

    # -- tending --------------------------------------------------------------------------------------

    async def tend(self, context: Context, *, every_tend_goal: bool = True) -> list[GardenEvent]:
        """One tending pass: pursue every active goal that is due, oldest first, and return the
        event each run ended with. With `every_tend_goal` (what `harness garden tend` asks) every
        active tend goal runs now, whatever its schedule; without it (`serve`), only those whose
        schedule is due. A goal whose run raises is logged and the pass goes on."""
        finished: list[GardenEvent] = []
        now = now_ms()
        for goal in self.goals():
            if goal.status != "active" or not (goal.due(now) or (every_tend_goal and goal.type == "tend")):
                continue
            try:
                finished.append(await self.pursue(goal.id, context))
            except HarnessError as error:
                logger.error("garden %s: goal %s did not run: %s [%s]", self.name, goal.id, error.message, error.code)
        return finished

    async def serve(self, context: Context, *, poll_s: float = 30.0) -> None:
        """Tend the garden until `context` is cancelled: a pass, then wait for the next tend goal
        to fall due, or `poll_s` at most (goals given meanwhile, e.g. by `/goal` in another
        process, are picked up then)."""
        while not context.cancelled:
            await self.tend(context, every_tend_goal=False)
            pause = poll_s
            for goal in self.goals():
                if goal.status == "active" and (due_at := goal.scheduled_at()) is not None:
                    pause = min(pause, max(0.0, (due_at - now_ms()) / 1000))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(context.wait_cancelled(), timeout=pause)

    async def pursue(self, goal_id: str, context: Context) -> GardenEvent:
        """Run goal `goal_id` once: resume its run a stopped process left open, else start one (its
        id minted and kept in the goal before the run is accepted), drive it with the run context
        set, then settle the goal: a tend goal's `tend_finished` (OM-9), a converse goal's answer
        posted to its conversation, a concluded durable goal `done`. Returns the event published.
        Raises `GoalNotFound`, `InvalidInput` for a goal that is not active, and what attaching
        the garden's session raises (`SessionOwned` while another process tends it)."""
        goal = self.goal(goal_id)
        if goal.status != "active":
            raise InvalidInput(f"goal {goal.id} is {goal.status}, not active", goal_id=goal.id, status=goal.status)
        lane = await self._lane(goal, context)
        run_id = goal.current_run_id
        last = lane.projection.last_result
        if run_id is None or (lane.projection.state.current_operation_id != run_id
                              and (last is None or last.operation_id != run_id)):
            run_id = new_id()  # none open: a run accepted nowhere yet gets a new id too
            goal = goal.model_copy(update={"current_run_id": run_id})
            await self._save(goal)
            prompt = _FRAMING[goal.type].format(text=goal.text)
            await lane.accept(PromptRequest(text=prompt, operation_id=run_id), context)
        run = RunContext(garden=self.name, root=self.root.path, goal_id=goal.id, goal_type=goal.type, run_id=run_id,
                         caller=GARDENER, store_url=self.setup.store_url, service=self.setup.service)
        with running(run):
            token = TOOL_ENVIRONMENT.set(run.environment())
            try:
                outcome = await lane.drive(run_id, context)
            finally:
                TOOL_ENVIRONMENT.reset(token)
        return await self._settle(goal.id, run_id, outcome, context)

    # -- internals ----------------------------------------------------------------------------------

    async def _settle(self, goal_id: str, run_id: str, outcome: DriveOutcome, context: Context) -> GardenEvent:
        goal = self.goal(goal_id)
        if not isinstance(outcome, Settled):
            status: RunStatus = "suspended" if isinstance(outcome, Suspended) else "waiting_retry"
        else:
            status = outcome.result.outcome
            goal = goal.model_copy(update={"current_run_id": None, "last_run_id": run_id,
                                           "last_run_at": outcome.result.ended_at})
            await self._save(goal)
            if goal.type == "converse" and status == "completed":
                await self._answer(goal, run_id, outcome, context)
        event: GardenEvent
        if goal.type == "tend":
            event = await asyncio.to_thread(tend_finished, self.root, goal.id, run_id, status)
        else:
            event = RunFinished(goal_id=goal.id, goal_type=goal.type, run_id=run_id, status=status)
        await self._publish(event)
        return event

    async def _answer(self, goal: Goal, run_id: str, outcome: Settled, context: Context) -> None:
        """Post a converse goal's final reply to its conversation (the emission id is the run id,
        so a second settlement of the same run posts nothing twice), then mark the goal `done`."""
        assert goal.origin is not None
        text = await self._final_text(outcome, context)
        if text:
            message = GardenMessage(garden=self.name, kind="reply", emission_id=run_id, goal_id=goal.id,
                                    run_id=run_id, text=text)
            try:
                await self.setup.service.post_garden_message(self.record.owner, goal.origin.conversation_id, message,
                                                             context)
            except HarnessError as error:  # the goal stays active: the next pass answers again
                logger.warning("goal %s: the answer did not reach conversation %s: %s", goal.id,
                               goal.origin.conversation_id, error.message)
                return
        await self.set_status(goal.id, "done", context)

    async def _final_text(self, outcome: Settled, context: Context) -> str:
        entry_id = outcome.result.final_assistant_entry_id
        harness = await self._gardener(context)
        entry = await harness.session.entry(entry_id, context) if entry_id is not None else None
        if entry is None or not isinstance(entry.payload, MessagePayload):
            return ""
        message = entry.payload.message
        if not isinstance(message, AssistantMessage):
            return ""
        return text_of(message.content, "\n").strip()

    async def _check_origin(self, origin: ConversationOrigin, context: Context) -> None:
        try:
            is_open = await self.setup.service.is_open(self.record.owner, origin.conversation_id, context)
        except (SessionNotFound, Forbidden) as error:
            raise InvalidInput(f"conversation {origin.conversation_id} is not one of {self.record.owner}'s",
                               conversation_id=origin.conversation_id) from error
        if not is_open:
            raise ConversationEnded(f"conversation {origin.conversation_id} was ended",
                                    conversation_id=origin.conversation_id)

    async def _lane(self, goal: Goal, context: Context) -> Lane:
        harness = await self._gardener(context)
        name = f"goal-{goal.id}"
        try:
            return harness.lane(name)
        except UnknownLane:
            tools = [tool.name for tool in harness.options.tools]
            return await harness.create_lane(name, LaneConfig(model=self.record.gardener.model, active_tools=tools),
                                             context)

    async def _gardener(self, context: Context) -> AgentHarness:
        if self._harness is None:
            session = await self.setup.store.open_session(self.record.session_id, context)
            gardener = self.record.gardener
            tools: list[AgentTool] = [*operator_message_tools(), AgentTool(spec=_CONCLUDE, execute=self._conclude)]
            if gardener.builtin_tools:
                work = self.root.path / "work"
                work.mkdir(parents=True, exist_ok=True)
                workspace = Workspace(root=work, output_dir=self.root.path / "tool-output")
                tools += [tool for tool in builtin_tools(workspace) if tool.name in gardener.builtin_tools]
            prompt = gardener.instructions or f"You are the gardener of the garden {self.name}."
            self._harness, _ = await AgentHarness.create(AgentHarnessOptions(
                session=session, models=self.setup.models, tools=tools, system_prompt=prompt,
                drive=self.setup.drive), context)
        return self._harness

    async def _conclude(self, tool_call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                        context: Context) -> ToolOutput:
        run = current_run_context()
        if run is None or run.garden != self.name:
            return _tool_error("conclude_goal runs only inside one of this garden's runs")
        goal = self.goal(run.goal_id)
        if goal.type != "durable" or goal.current_run_id != run.run_id:
            return _tool_error(f"goal {goal.id} is a {goal.type} goal; only a durable goal is concluded")
        await self.set_status(goal.id, "done", context)
        return ToolOutput(content=[TextContent(text=f"goal {goal.id} is done")])

    async def _save(self, goal: Goal) -> None:
        try:
            await asyncio.to_thread(self.root.write_json, self.root.goal_file(goal.id), goal.model_dump(mode="json"))
        except OSError as error:  # the path stays in the log: an answer over HTTP must not show it
            logger.warning("garden %s could not save goal %s: %s", self.name, goal.id, error)
            raise GardenWriteFailed(f"garden {self.name} could not save goal {goal.id}: {error.strerror}",
                                    garden=self.name, goal_id=goal.id) from error

    async def _publish(self, event: GardenEvent) -> None:
        await asyncio.to_thread(publish, self.root, event)


def _tool_error(text: str) -> ToolOutput:
    return ToolOutput(content=[TextContent(text=text)], is_error=True)


def garden_names() -> Sequence[str]:
    """The names of the gardens at their default runtime roots, under `$HARNESS_HOME/gardens/`,
    sorted; a folder whose name is no garden name (`check_name`) holds no garden."""
    gardens = harness_home() / "gardens"
    if not gardens.is_dir():
        return []
    return sorted(path.name for path in gardens.iterdir()
                  if name_problem("garden name", path.name) is None and (path / "garden.json").is_file())
