"""Recording a chat event on an attached conversation (CE-3, CE-4, CE-11); `ConversationService`
attaches a closed one for it (CE-10)."""

from __future__ import annotations

from harness.context import Context
from harness.conversation.chat_events import ChatEventDetails, chat_event_message, logger
from harness.errors import HarnessError
from harness.runtime import AgentHarness
from harness.session import addresses

MAIN_LANE = "main"
"""The lane of a conversation that talks to the person."""

CONVERSATION_VALUES = addresses.value_address("conversation")
"""Every session value a conversation keeps of its own (its owner, fast mode, the work mode, the
turn baseline), as JSON: `scan_values` of it lists them, for a copy of the conversation."""


async def record_chat_event(harness: AgentHarness, details: ChatEventDetails, context: Context, *,
                            lane: str = MAIN_LANE) -> bool:
    """Append one chat event to `lane` of a live conversation; never starts a turn (CE-3).

    Idle, the row is placed at once; while an operation is open it waits as a pending write placed
    at the next safe boundary, never between a tool call and its result (CE-4, CE-11). True when
    the append was accepted and the session's persistence had not failed before or after it; a
    refusal is logged and gives False, so a caller that owns an acknowledgement must not report
    success then."""
    if harness.persistence_failure is not None:
        logger.warning("chat event %s not recorded: this session's store already refused a write", details.kind)
        return False
    try:
        await harness.lane(lane).append_message(chat_event_message(details), context)
    except HarnessError as error:
        logger.warning("chat event %s not recorded: %s [%s]", details.kind, error.message, error.code)
        return False
    return harness.persistence_failure is None
