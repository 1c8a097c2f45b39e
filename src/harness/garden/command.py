"""`/goal`: a conversation's command that gives a garden a durable goal whose origin is that
conversation, then starts the kickoff turn, or pauses, resumes or drops one of its goals (CE-16)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Literal, NamedTuple

from harness.context import Context
from harness.conversation import (
    BuiltInCommand,
    CommandInvocation,
    Conversation,
    ConversationService,
    GoalActionOutcome,
    GoalOutcome,
    RecordNow,
)
from harness.errors import HarnessError, InvalidInput
from harness.garden.garden import Garden, GardenNotFound
from harness.garden.records import ConversationOrigin, GoalState
from harness.runtime import AcceptedRun
from harness.session.ids import new_id

KickoffDrive = Callable[[Conversation, AcceptedRun, Context], Awaitable[None]]
"""What `/goal` does with its admitted kickoff turn: drive it to its end (the default), or hand
it to a driver that returns at once (a server answering 202)."""


class _Action(NamedTuple):
    status: Literal["active", "paused", "dropped"]
    allowed_from: frozenset[GoalState]
    rule: str


_ACTIONS: dict[str, _Action] = {
    "pause": _Action("paused", frozenset({"active"}), "only an active goal is paused"),
    "resume": _Action("active", frozenset({"paused"}), "only a paused goal is resumed"),
    "drop": _Action("dropped", frozenset({"active", "paused"}), "only an active or paused goal is dropped"),
}
"""The goal actions a person types after `/goal`: the status each sets, and the statuses it is
allowed from (a done or dropped goal is over: no action takes it back)."""

_MINTED_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
"""The shape of the goal ids gardens mint (`new_id`, a UUID): what makes `/goal pause ID` an
action rather than a goal's text."""


def goal_action_of(args: str | None) -> tuple[str, str] | None:
    """`(action, goal_id)` when `/goal`'s `args` are an action: exactly two words, `pause`, `resume`
    or `drop` (lower case), then one goal id shaped as gardens mint them (a UUID, any case, read
    lower case). Anything else is a new goal's text, so `/goal pause the hedge trimming` gives a goal;
    a goal given a hand-made id is acted on through the garden's goal actions instead."""
    words = (args or "").split()
    if len(words) == 2 and words[0] in _ACTIONS and _MINTED_ID.fullmatch(words[1]):
        return words[0], words[1].lower()
    return None


async def drive_to_end(conversation: Conversation, accepted: AcceptedRun, context: Context) -> None:
    await conversation.drive(accepted.operation_id, context)


def goal_command(garden: Garden, *, drive: KickoffDrive = drive_to_end) -> BuiltInCommand:
    """`/goal TEXT` and `/goal pause|resume|drop GOAL_ID` for `garden`, shaped as the
    conversation's built-in commands are (pass it to `run_typed_command` in its `commands`).
    Which of the two a line is follows `goal_action_of`.

    `/goal TEXT`, through `run_command`: the goal is given to the garden, its origin the kickoff
    turn's message (`TEXT` as the person's message) by an id chosen beforehand; only then is that
    turn admitted with the command's row (a `GoalOutcome`) right above it, in one commit, and
    passed to `drive`. A goal the garden cannot keep (a disk error) admits nothing, and an
    admission refused (`LaneBusy` while a turn runs, `ConversationEnded`) withdraws the goal: no
    row claims a goal that does not exist, the command's row records the refusal (CE-16). The goal's later
    status changes come as goal rows (`Garden.set_status`). Raises `InvalidInput` for an empty
    text (recorded as the command's error), and what admitting the turn raises.

    `/goal pause|resume|drop GOAL_ID` sets the goal's status (`paused`, `active`, `dropped`) and
    records one row with a `GoalActionOutcome`, the change's only record in this conversation (no
    goal row repeats it, CE-6); it starts no turn and needs no idle lane. Refused with the exact
    text recorded as the command's error, and nothing changed: `GoalNotFound` for an id the garden
    does not have, `GardenNotFound` (worded as for no garden) when the garden is not this user's,
    `InvalidInput` for a goal that came from another conversation (acted on there) and for an
    action its status does not allow (pause: active; resume: paused; drop: active or paused). A
    goal that came from no conversation is acted on from any of the owner's conversations."""

    async def goal(service: ConversationService, user: str, conversation: Conversation, args: str | None,
                   context: Context, *, typed: bool = True) -> GoalOutcome | GoalActionOutcome:
        invocation = CommandInvocation(name="goal", args=args or None) if typed else None
        if (action := goal_action_of(args)) is not None:
            word, goal_id = action

            async def act(record_now: RecordNow) -> GoalActionOutcome:
                return await _act(garden, user, conversation, word, goal_id, context)

            return await service.run_command(user, conversation, invocation, act, lambda outcome: outcome, context)
        text = (args or "").strip()

        async def run(record_now: RecordNow) -> GoalOutcome:
            if not text:
                raise InvalidInput("/goal needs the goal: /goal TEXT")
            goal_id, message_id = new_id(), new_id()
            origin = ConversationOrigin(conversation_id=conversation.id, message_id=message_id)
            goal = await garden.add_goal("durable", text, context, origin=origin, goal_id=goal_id)
            outcome = GoalOutcome(garden=garden.name, goal_id=goal_id, title=goal.title)
            try:
                accepted = await record_now.admit_with(outcome, text, prompt_entry_id=message_id)
            except HarnessError:
                await garden.withdraw_goal(goal_id, context)  # its kickoff turn was refused
                raise
            await drive(conversation, accepted, context)
            return outcome

        return await service.run_command(user, conversation, invocation, run, lambda outcome: outcome, context)

    return goal


async def _act(garden: Garden, user: str, conversation: Conversation, word: str, goal_id: str,
               context: Context) -> GoalActionOutcome:
    if garden.record.owner != user:  # worded as the server words another user's garden: as none
        raise GardenNotFound(f"no garden {garden.name!r}", garden=garden.name)
    goal = garden.goal(goal_id)
    if goal.origin is not None and goal.origin.conversation_id != conversation.id:
        raise InvalidInput(f"goal {goal.title!r} came from another conversation: act on it there",
                           goal_id=goal.id, conversation_id=goal.origin.conversation_id)
    action = _ACTIONS[word]
    if goal.status not in action.allowed_from:
        raise InvalidInput(f"goal {goal.title!r} is {goal.status}; {action.rule}", goal_id=goal.id,
                           status=goal.status, action=word)
    changed = await garden.set_status(goal.id, action.status, context, recorded_in=conversation.id)
    return GoalActionOutcome(garden=garden.name, goal_id=changed.id, title=changed.title, status=action.status)
