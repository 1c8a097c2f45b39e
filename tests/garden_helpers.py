"""Builders shared by the garden tests: a garden on the real SQLite store whose gardener is the
faux model, answering by what each run's prompt asks, and readers of what a garden left on disk."""

from __future__ import annotations

from pathlib import Path

from conversation_helpers import faux_service
from drive_helpers import FAUX, text
from harness.context import Context
from harness.conversation import Conversation, ConversationService
from harness.garden import GARDENER, ConversationOrigin, Garden, Gardener, GardenSetup, Goal, GoalType, RunContext
from harness.messages import ToolResultMessage, UserMessage
from harness.providers import FauxProvider
from harness.providers.faux import FauxReply, FauxRequest, reply, tool_call
from harness.session import LaneConfig, Store
from harness.session.ids import new_id

OWNER = "alice"
SURVEY = "All beds watered; the roses need a person."
CONCLUDED = "The compost heap is turned."
ANSWER = "Tomatoes want six hours of sun."


def gardener_script(request: FauxRequest) -> FauxReply | str:
    """The faux model as gardener and as the conversation's agent: a tend run leaves a survey, a
    durable run tells of its end and concludes, a converse run answers; after a tool result, and
    in a conversation, it says a short line."""
    last = request.request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return "Done."
    prompt = text(last) if isinstance(last, UserMessage) else ""
    if prompt.startswith("Tend the garden."):
        return reply(tool_call("emit_tend_survey", {"content": SURVEY}))
    if prompt.startswith("Pursue this goal:"):
        return reply(tool_call("emit_recently_concluded", {"content": CONCLUDED}), tool_call("conclude_goal"))
    if prompt.startswith("A person asks:"):
        return ANSWER
    return "I have given that to the garden."


def conversations(store: Store) -> tuple[ConversationService, FauxProvider]:
    return faux_service(store, gardener_script)


async def make_garden(store: Store, service: ConversationService, root: Path, ctx: Context, *,
                      name: str = "allotment", builtin_tools: tuple[str, ...] = (), owner: str = OWNER) -> Garden:
    setup = GardenSetup(store=store, service=service, models=service.setup.models)
    return await Garden.create(name, Gardener(model=FAUX, builtin_tools=builtin_tools), setup, ctx, owner=owner,
                               root=root)


async def conversation(service: ConversationService, ctx: Context) -> Conversation:
    return await service.create(OWNER, LaneConfig(model=FAUX), ctx)


def files_in(folder: Path) -> list[str]:
    """The names of the files directly in `folder`, sorted (none when it does not exist)."""
    return sorted(path.name for path in folder.iterdir() if path.is_file()) if folder.is_dir() else []


async def in_run(garden: Garden, goal_type: GoalType, ctx: Context, *, origin: ConversationOrigin | None = None,
                 caller: str = GARDENER) -> tuple[Goal, RunContext]:
    """A goal of `goal_type` with a current run, as the driver leaves it while the run is driven,
    and that run's context."""
    goal = await garden.add_goal(goal_type, f"a {goal_type} goal", ctx, origin=origin)
    run_id = new_id()
    goal = goal.model_copy(update={"current_run_id": run_id})
    garden.root.write_json(garden.root.goal_file(goal.id), goal.model_dump(mode="json"))
    return goal, RunContext(garden=garden.name, root=garden.root.path, goal_id=goal.id, goal_type=goal_type,
                            run_id=run_id, caller=caller, service=garden.setup.service)
