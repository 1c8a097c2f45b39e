"""Recording a chat event on an attached conversation (CE-3, CE-4, CE-11); `ConversationService`
attaches a closed one for it (CE-10)."""

from __future__ import annotations

import uuid

from harness.context import Context
from harness.conversation.chat_events import ChatEventDetails, chat_event_message, logger
from harness.errors import HarnessError
from harness.runtime import AgentHarness, OperationIdTaken
from harness.session import addresses

MAIN_LANE = "main"
"""The lane of a conversation that talks to the person."""

CONVERSATION_VALUES = addresses.value_address("conversation")
"""Every session value a conversation keeps of its own (its owner, fast mode, the work mode, the
turn baseline), as JSON: `scan_values` of it lists them, for a copy of the conversation."""


async def record_chat_event(harness: AgentHarness, details: ChatEventDetails, context: Context, *,
                            lane: str = MAIN_LANE, entry_id: str | None = None) -> bool:
    """Append one chat event to `lane` of a live conversation; never starts a turn (CE-3).

    Idle, the row is placed at once; while an operation is open it waits as a pending write placed
    at the next safe boundary, never between a tool call and its result (CE-4, CE-11). True when
    the append was accepted and the session's persistence had not failed before or after it; a
    refusal is logged and gives False, so a caller that owns an acknowledgement must not report
    success then. With `entry_id` the row is recorded once: one of that id already there is True."""
    if harness.persistence_failure is not None:
        logger.warning("chat event %s not recorded: this session's store already refused a write", details.kind)
        return False
    try:
        await harness.lane(lane).append_message(chat_event_message(details), context, entry_id=entry_id)
    except OperationIdTaken:
        return True
    except HarnessError as error:
        logger.warning("chat event %s not recorded: %s [%s]", details.kind, error.message, error.code)
        return False
    return harness.persistence_failure is None


_DRIVE_FAILURE = uuid.UUID("6f1d3c52-2b8e-4c1a-9d0e-7a4b5c6d7e8f")


def drive_failure_entry_id(operation_id: str) -> str:
    """The id of the error row of run `operation_id` failing to drive (CE-9): one per run."""
    return str(uuid.uuid5(_DRIVE_FAILURE, operation_id))
