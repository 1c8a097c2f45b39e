"""`/goal TEXT`: a conversation's command that gives a garden a durable goal whose origin is that
conversation, then starts the kickoff turn (CE-16)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from harness.context import Context
from harness.conversation import (
    BuiltInCommand,
    CommandInvocation,
    Conversation,
    ConversationService,
    GoalOutcome,
    RecordNow,
)
from harness.errors import InvalidInput
from harness.garden.garden import Garden
from harness.garden.records import ConversationOrigin, Goal
from harness.runtime import AcceptedRun
from harness.session import new_id

KickoffDrive = Callable[[Conversation, AcceptedRun, Context], Awaitable[None]]
"""What `/goal` does with its admitted kickoff turn: drive it to its end (the default), or hand
it to a driver that returns at once (a server answering 202)."""


async def drive_to_end(conversation: Conversation, accepted: AcceptedRun, context: Context) -> None:
    await conversation.drive(accepted.operation_id, context)


def goal_command(garden: Garden, *, drive: KickoffDrive = drive_to_end) -> BuiltInCommand:
    """`/goal TEXT` for `garden`, shaped as the conversation's built-in commands are (pass it to
    `run_typed_command` in its `commands`).

    Through `run_command`: the kickoff turn (`TEXT` as the person's message) is admitted with the
    command's row (a `GoalOutcome`) right above it, in one commit; only then is the goal given
    to the garden, with that message as its origin, and the turn passed to `drive`. An admission
    refused (`LaneBusy` while a turn runs, `ConversationEnded`) leaves no goal and no row claiming
    one: the command's row records the refusal (CE-16). The goal's later status changes come as
    goal rows (`Garden.set_status`). Raises `InvalidInput` for an empty text (recorded as the
    command's error), and what admitting the turn raises."""

    async def goal(service: ConversationService, user: str, conversation: Conversation, args: str | None,
                   context: Context, *, typed: bool = True) -> GoalOutcome:
        text = (args or "").strip()

        async def run(record_now: RecordNow) -> GoalOutcome:
            if not text:
                raise InvalidInput("/goal needs the goal: /goal TEXT")
            goal_id = new_id()
            outcome = GoalOutcome(garden=garden.name, goal_id=goal_id,
                                  title=Goal(id=goal_id, type="durable", text=text, created_at=0).title)
            accepted = await record_now.admit_with(outcome, text)
            origin = ConversationOrigin(conversation_id=conversation.id, message_id=accepted.entry_ids[-1])
            try:
                await garden.add_goal("durable", text, context, origin=origin, goal_id=goal_id)
            finally:  # the person's message is answered either way
                await drive(conversation, accepted, context)
            return outcome

        invocation = CommandInvocation(name="goal", args=args or None) if typed else None
        return await service.run_command(user, conversation, invocation, run, lambda outcome: outcome, context)

    return goal
