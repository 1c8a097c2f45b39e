"""The project switch: the checks and the commit behind `ConversationService.select_project_execution`,
the model's `project` tool, which only asks for a switch, and the between-step boundary that
commits what it asked once the whole tool batch has settled (CE-19, CE-20).

The model's switch lands between two steps of its own turn, so a batch of tool calls never
straddles two directories, and its confirmation is placed into the very next request. A switch is
refused before anything is stored while work launched against the current target still runs; at
the boundary such a refusal becomes a hidden `harness.project-switch-refused` message the model
reads in its next step, and the turn goes on.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue

from harness.context import Context
from harness.conversation.chat_events import DirectoryMoved, chat_event_message
from harness.conversation.projects import (
    PROJECT_SELECTION,
    ExecutionTarget,
    ProjectSelection,
    SwitchableProject,
    resolve_project_argument,
)
from harness.conversation.recording import MAIN_LANE
from harness.conversation.settings import ConversationSettings, SettingNotRecorded
from harness.errors import HarnessError
from harness.messages import CustomMessage, Message, TextContent, ToolResultMessage
from harness.providers import ToolSpec
from harness.runtime import AgentTool, BetweenSteps, Lane, ProgressCallback, ToolOutput
from harness.session import Entry, MessagePayload, SessionReader

PROJECT_TOOL = "project"
"""The name of the model's project tool."""

PROJECT_SWITCH_REFUSED_TYPE = "harness.project-switch-refused"
"""The custom type of the hidden message that tells the model its switch did not apply (CE-20)."""

SwitchedBy = Literal["user", "agent"]


class ProjectSwitchRefused(HarnessError):
    """A project switch was refused before anything was stored (CE-20); details `{reason,
    execution_ref}`. `reason`: `turn_running` (a turn runs on the conversation), `lane_running`
    (another of its lanes runs work, e.g. a delegated child), `jobs_running` (tracked background
    jobs of the conversation still run), `unreachable` (the project's directory cannot be
    entered) or `unknown` (no listed project has that execution ref)."""

    code = "project_switch_refused"


class ProjectSwitch(BaseModel):
    """A person's project switch (`ConversationService.select_project_execution`): `row`, the
    `DirectoryMoved` it records, and `queued` True when it was posted to the process holding
    the conversation, which makes it, or records why it could not, at once (issue 28: CE-21's
    synchronous refusal holds where the switch is made, not for its poster)."""

    model_config = ConfigDict(frozen=True)

    row: DirectoryMoved
    queued: bool = False


def refuse_unknown(execution_ref: str) -> ProjectSwitchRefused:
    return ProjectSwitchRefused(f"no listed project has the execution ref {execution_ref!r}", reason="unknown",
                                execution_ref=execution_ref)


async def switch_project(settings: ConversationSettings, project: SwitchableProject, by: SwitchedBy,
                         running_jobs: int, context: Context) -> DirectoryMoved:
    """Make `project` the conversation's execution target and say so (CE-19, CE-20).

    `by="user"` (a person's command or picker, a cold switch): refused while a turn runs or is
    being admitted; the row is recorded with user wording, unless nobody has spoken yet (CE-13),
    and `SettingNotRecorded` is raised when the store refused it. `by="agent"` (the model's own
    between-step path): its turn is not counted, and the row (by the agent) is returned for the
    next request instead of being recorded. Either way `ProjectSwitchRefused` is raised, before
    anything is stored, while another lane runs work, while `running_jobs` tracked background
    jobs still run, or when the project's directory cannot be entered."""
    if by == "user" and (settings.turn_lock.locked() or settings.lane.info().operation is not None):
        raise _refused(project, "turn_running", "a turn is running in this conversation; wait for it to end")
    if by == "agent":
        return await _commit(settings, project, by, running_jobs, context)
    async with settings.turn_lock:
        return await _commit(settings, project, by, running_jobs, context)


async def _commit(settings: ConversationSettings, project: SwitchableProject, by: SwitchedBy, running_jobs: int,
                  context: Context) -> DirectoryMoved:
    busy = sorted(info.name for info in settings.harness.lanes
                  if info.name != settings.lane.name and info.operation is not None)
    if busy:
        raise _refused(project, "lane_running", f"work still runs on lane {', '.join(busy)} of this conversation")
    if running_jobs:
        raise _refused(project, "jobs_running", f"{running_jobs} background job(s) of this conversation still run; "
                                                "stop them or wait for them to end")
    if not _enterable(Path(project.path)):
        raise _refused(project, "unreachable", f"the directory {project.path} cannot be entered")
    selection = ProjectSelection(execution_ref=project.execution_ref, project_id=project.id, slug=project.slug,
                                 path=project.path)
    await settings.harness.set_value(PROJECT_SELECTION, selection, context)
    settings.target.selection = selection
    details = DirectoryMoved(path=project.path, by=by, project=project.slug)
    if by == "user" and not await settings.record_setting(details, context):
        raise SettingNotRecorded(f"the switch to project {project.slug} applied, but its row was not recorded",
                                 kind=details.kind)
    return details


def _enterable(directory: Path) -> bool:
    return directory.is_dir() and os.access(directory, os.X_OK)


def _refused(project: SwitchableProject, reason: str, why: str) -> ProjectSwitchRefused:
    return ProjectSwitchRefused(f"the switch to project {project.slug} was refused: {why}", reason=reason,
                                execution_ref=project.execution_ref)


def refusal_message(refusal: ProjectSwitchRefused, target: ExecutionTarget) -> CustomMessage:
    """The hidden message a refused switch of the model becomes at the boundary: journaled and read
    by the model in its next step (and again after a restore), drawn by no surface (CE-20)."""
    return CustomMessage(
        custom_type=PROJECT_SWITCH_REFUSED_TYPE, display=False,
        content=f"[Your project switch did not apply: {refusal.message}. You are still in {target.describe()}; "
                "your tools run there.]",
        details={"v": 1, "code": refusal.code, "message": refusal.message, **refusal.details})


# -- the model's tool and the boundary --------------------------------------------------------------

_SPEC = ToolSpec(
    name=PROJECT_TOOL,
    description="Switch the project your tools work in, or list the projects (leave out project). A switch "
                "lands when the current batch of tool calls has ended, before your next step.",
    parameters={"type": "object", "additionalProperties": False, "required": [],
                "properties": {"project": {"type": "string", "description": "The project's slug or id."}}},
)

PENDING = ("pending: the switch to {project} lands when this batch of tool calls has ended, before your next "
           "step. Do not end your turn to apply it: go on, and your next tool calls run there.")
"""What the tool answers to a switch it recorded (CE-19)."""


def project_tool(projects: Callable[[], Sequence[SwitchableProject]], target: ExecutionTarget) -> AgentTool:
    """The model's `project` tool over the listing `projects` (CE-19). Without `project` it lists
    them; with one (a slug or id, resolved as a person's `/project` is) it only records the
    request in its result's details (`{project_request: execution_ref}`) and answers `PENDING`:
    the boundary commits it. Safe to run again after a crash: it changes nothing."""

    async def execute(tool_call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                      context: Context) -> ToolOutput:
        try:
            listed = projects()
            argument = args.get("project")
            if argument is None:
                return _text(_listing(listed, target))
            project = resolve_project_argument(listed, str(argument))
        except HarnessError as error:
            return _text(error.message, {"code": error.code}, is_error=True)
        if target.selection is not None and target.selection.execution_ref == project.execution_ref:
            return _text(f"you are in project {project.slug} already; your tools run in {project.path}")
        return _text(PENDING.format(project=f"project {project.slug} ({project.path})"),
                     {"status": "pending", "project_request": project.execution_ref})

    return AgentTool(spec=_SPEC, execute=execute, replay="safe")


def _listing(projects: Sequence[SwitchableProject], target: ExecutionTarget) -> str:
    current = target.selection.execution_ref if target.selection is not None else None
    lines = [f"{project.id} {project.slug}: {project.path}" + (" (current)" if project.execution_ref == current else "")
             for project in projects]
    return "\n".join([f"your tools run in {target.describe()}", *lines]) if lines else "no projects are listed"


def _text(text: str, details: JsonValue = None, *, is_error: bool = False) -> ToolOutput:
    return ToolOutput(content=[TextContent(text=text)], details=details, is_error=is_error)


def project_boundary(session: SessionReader, target: ExecutionTarget,
                     select: Callable[[str, Context], Awaitable[DirectoryMoved]]) -> BetweenSteps:
    """The between-step hook that commits the model's switch (CE-19, CE-20): when the tool batch
    that just settled on the main lane asked for one (the last such call wins), `select(ref)` makes
    it, and its confirmation row (by the agent) is returned, to be placed into the very next
    request; a `ProjectSwitchRefused` becomes the hidden refusal message instead and the turn goes
    on. Any other error is raised, and ends the turn."""

    async def between_steps(lane: Lane, context: Context) -> Sequence[Message]:
        if lane.name != MAIN_LANE or lane.tip_id is None:
            return ()
        requested = await requested_project(session, lane.tip_id, context)
        if requested is None:
            return ()
        try:
            details = await select(requested, context)
        except ProjectSwitchRefused as refusal:
            return [refusal_message(refusal, target)]
        return [chat_event_message(details)]

    return between_steps


async def requested_project(session: SessionReader, tip: str, context: Context) -> str | None:
    """The execution ref the newest project call of the tool batch ending at `tip` asked for."""
    found: list[str] = []

    def visit(entry: Entry) -> bool:
        if not isinstance(entry.payload, MessagePayload):
            return True
        message = entry.payload.message
        if message.role in ("assistant", "user"):
            return False  # the batch's results follow its assistant message: the batch is read
        if (isinstance(message, ToolResultMessage) and message.tool_name == PROJECT_TOOL and not message.is_error
                and isinstance(message.details, dict)
                and isinstance(ref := message.details.get("project_request"), str)):
            found.append(ref)
            return False
        return True

    await session.scan_branch(tip, visit, context)
    return found[0] if found else None
