"""The garden doors: `/goal` from a conversation, a garden's goals and their actions, and its inbox.

The server reaches the gardens at their default runtime roots (`$HARNESS_HOME/gardens/<name>/`,
as `harness garden` makes them). A garden belongs to the user its record names as owner (the one
whose conversations it speaks in, `GardenRecord.owner`): only that user sees it, gives it goals,
acts on them or reads its inbox; to anyone else it answers 404 `garden_not_found`, exactly like a
garden that does not exist."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Response, status
from pydantic import BaseModel, ConfigDict, Field

from harness.context import Context
from harness.conversation import MAIN_LANE, Conversation, GoalActionOutcome, GoalOutcome
from harness.errors import InvalidInput
from harness.garden import (
    Garden,
    GardenDamaged,
    GardenNotFound,
    GardenSetup,
    Goal,
    GoalState,
    garden_names,
    goal_command,
)
from harness.messages import ModelIdentity
from harness.runtime import AcceptedRun
from harness.server.guards import NAME_CHARS, TEXT_CHARS
from harness.server.state import CurrentUser, RequestContext, ServerState, State

router = APIRouter(prefix="/api", tags=["gardens"])


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _setup(state: ServerState) -> GardenSetup:
    service = state.service
    return GardenSetup(store=service.store, service=service, models=service.setup.models)


def _open(state: ServerState, user: str, name: str) -> Garden:
    """`user`'s garden `name`; `GardenNotFound` for a garden of someone else, worded as for none
    (and without the server's paths)."""
    try:
        garden: Garden | None = Garden.open(name, _setup(state))
    except GardenNotFound:
        garden = None
    if garden is None or garden.record.owner != user:
        raise GardenNotFound(f"no garden {name!r}", garden=name)
    return garden


def _gardens_of(state: ServerState, user: str) -> list[Garden]:
    """`user`'s gardens. One whose record does not read is left out (whose it is cannot be told;
    opening it by name answers `garden_damaged`): it must not hide every other garden."""
    mine = []
    for name in garden_names():
        with contextlib.suppress(GardenDamaged):  # logged where it was found
            garden = Garden.open(name, _setup(state))
            if garden.record.owner == user:
                mine.append(garden)
    return mine


class GardenOut(BaseModel):
    """A garden as its owner lists it; `created_at` is Unix ms."""

    name: str
    gardener_model: ModelIdentity
    created_at: int
    active_goals: int

    @classmethod
    def of(cls, garden: Garden) -> GardenOut:
        record = garden.record
        return cls(name=record.name, gardener_model=record.gardener.model, created_at=record.created_at,
                   active_goals=sum(goal.status == "active" for goal in garden.goals()))


@router.get("/gardens", response_model=list[GardenOut])
async def list_gardens(user: CurrentUser, state: State) -> list[GardenOut]:
    """The current user's gardens, by name."""
    return [GardenOut.of(garden) for garden in _gardens_of(state, user)]


# -- /goal from a conversation -------------------------------------------------------------------


class GoalCommand(_Body):
    text: str = Field(max_length=TEXT_CHARS,
                      description="The goal, in words; it is also the person's message of the kickoff turn. "
                                  "`pause|resume|drop GOAL_ID` acts on a goal instead.")
    garden: str | None = Field(default=None, max_length=NAME_CHARS,
                               description="The garden to give it; none: your only garden.")


class GoalAccepted(BaseModel):
    """`/goal`: the garden now pursues goal `goal_id`, and the kickoff turn `operation_id` is
    durable and driven by the server (watch `/events`)."""

    garden: str
    goal_id: str
    title: str
    operation_id: str


@router.post("/conversations/{conversation_id}/goal", status_code=status.HTTP_202_ACCEPTED,
             response_model=GoalAccepted | GoalActionOutcome,
             responses={200: {"model": GoalActionOutcome, "description": "A goal action (`pause|resume|drop "
                                                                        "GOAL_ID`) done; no turn started."}})
async def goal(conversation_id: str, body: GoalCommand, response: Response, user: CurrentUser, state: State,
               context: RequestContext) -> GoalAccepted | GoalActionOutcome:
    """`/goal TEXT`: give a garden a durable goal whose origin is this conversation, recorded as
    the command's row above the kickoff turn it starts (CE-16); answered once that turn is
    accepted (202). `invalid_input` (400, recorded) for an empty text or when `garden` is not
    given and you have no garden or several; `garden_not_found` (404); `lane_busy` (409) while a
    turn runs. With external workers the kickoff turn is theirs to drive.

    A `text` of `pause|resume|drop GOAL_ID` (`goal_action_of`) is the goal action the chat's
    `/goal` runs, with the same row: 200 with its `GoalActionOutcome`, or, recorded,
    `goal_not_found` (404) and `invalid_input` (400) for a goal of another conversation or an
    action its status does not allow."""
    async with state.conversation(user, conversation_id, context) as conversation:
        answer = await _give_goal(state, user, conversation, body, context)
    if isinstance(answer, GoalActionOutcome):
        response.status_code = status.HTTP_200_OK
    return answer


async def _give_goal(state: ServerState, user: str, conversation: Conversation, body: GoalCommand,
                     context: Context) -> GoalAccepted | GoalActionOutcome:
    if body.garden is not None:
        garden = _open(state, user, body.garden)
    else:
        mine = _gardens_of(state, user)
        if len(mine) != 1:
            raise InvalidInput(f"/goal gives the goal to your only garden, and you have {len(mine)}: name one",
                               gardens=[garden.name for garden in mine])
        garden = mine[0]
    kickoff: list[AcceptedRun] = []

    async def drive(driven: Conversation, accepted: AcceptedRun, context: Context) -> None:
        state.drive(driven, MAIN_LANE, accepted.operation_id)
        kickoff.append(accepted)

    outcome = await goal_command(garden, drive=drive)(state.service, user, conversation, body.text, context)
    if isinstance(outcome, GoalActionOutcome):
        return outcome
    assert isinstance(outcome, GoalOutcome), "/goal answers with its goal or its action"
    return GoalAccepted(garden=outcome.garden, goal_id=outcome.goal_id, title=outcome.title,
                        operation_id=kickoff[0].operation_id)


# -- a garden's goals --------------------------------------------------------------------------------


@router.get("/gardens/{garden}/goals", response_model=list[Goal])
async def list_goals(garden: str, user: CurrentUser, state: State) -> list[Goal]:
    """The garden's goals, oldest first."""
    return _open(state, user, garden).goals()


class NewGoal(_Body):
    type: Literal["tend", "durable"] = Field(description="`tend` recurs; `durable` is pursued until concluded.")
    text: str = Field(max_length=TEXT_CHARS)
    every_s: float | None = Field(default=None, gt=0, description="A tend goal's schedule; none: every tending.")


@router.post("/gardens/{garden}/goals", status_code=status.HTTP_201_CREATED, response_model=Goal)
async def add_goal(garden: str, body: NewGoal, user: CurrentUser, state: State, context: RequestContext) -> Goal:
    """Give the garden a goal with no conversation behind it (`/goal` gives one with), active.
    `invalid_input` (400) for a blank text or a schedule on a durable goal."""
    return await _open(state, user, garden).add_goal(body.type, body.text, context, every_s=body.every_s)


GoalAction = Literal["pause", "resume", "drop", "conclude"]

STATUS_OF_ACTION: dict[GoalAction, GoalState] = {"pause": "paused", "resume": "active", "drop": "dropped",
                                                 "conclude": "done"}
"""The status each goal action sets: a paused or dropped goal is not pursued, a resumed one is
again, a concluded one is done."""


class GoalActionBody(_Body):
    action: GoalAction


@router.post("/gardens/{garden}/goals/{goal_id}/action", response_model=Goal)
async def goal_action(garden: str, goal_id: str, body: GoalActionBody, user: CurrentUser, state: State,
                      context: RequestContext) -> Goal:
    """Pause, resume, drop or conclude a goal; a goal from a conversation shows its new status
    there as a goal row. Acting again with the same status changes nothing. `goal_not_found` (404)."""
    return await _open(state, user, garden).set_status(goal_id, STATUS_OF_ACTION[body.action], context)


# -- the inbox -----------------------------------------------------------------------------------------


INBOX_FILES = 100
"""The most files of each inbox folder one read returns: the newest."""

INBOX_TEXT_BYTES = 64 * 1024
"""The most of one file's text one read returns: its beginning."""


class InboxFile(BaseModel):
    """One message the garden left: its file name in the inbox folder, its Markdown text (at most
    its first `INBOX_TEXT_BYTES`; `truncated` when cut there) and its whole `size` in bytes."""

    name: str
    text: str
    size: int
    truncated: bool


class Inbox(BaseModel):
    """A garden's inbox (OM-5): `replies`, copies of what it said in conversations, and apart
    from them `notes`, what it said to nobody in particular; each folder's newest `INBOX_FILES`
    files, newest first, and `more` when either folder holds older ones (`harness garden inbox`
    lists them all)."""

    replies: list[InboxFile]
    notes: list[InboxFile]
    more: bool


def _files(folder: Path) -> tuple[list[InboxFile], bool]:
    """The newest `INBOX_FILES` messages of `folder` (bounded, as `InboxFile` says), and whether it
    holds more. A garden writes a note at every tending, however large: read neither all of them
    nor all of one."""
    dated = []
    for path in folder.glob("*.md") if folder.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):  # removed since it was listed
            dated.append((path.stat(), path))
    dated.sort(key=lambda item: (item[0].st_mtime_ns, item[1].name), reverse=True)
    files = []
    for info, path in dated[:INBOX_FILES]:
        with contextlib.suppress(FileNotFoundError), path.open("rb") as file:
            head = file.read(INBOX_TEXT_BYTES)
            truncated = info.st_size > len(head)
            files.append(InboxFile(name=path.name, text=head.decode("utf-8", errors="replace"), size=info.st_size,
                                   truncated=truncated))
    return files, len(dated) > INBOX_FILES


@router.get("/gardens/{garden}/inbox", response_model=Inbox)
async def read_inbox(garden: str, user: CurrentUser, state: State) -> Inbox:
    """The garden's replies and notes, as `Inbox` bounds them."""
    root = _open(state, user, garden).root
    (replies, more_replies), (notes, more_notes) = await asyncio.gather(
        asyncio.to_thread(_files, root.reply_dir), asyncio.to_thread(_files, root.notes_dir))
    return Inbox(replies=replies, notes=notes, more=more_replies or more_notes)
