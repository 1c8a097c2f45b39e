"""Recording a chat event on a live conversation or a cold one (CE-3, CE-4, CE-10, CE-11)."""

from __future__ import annotations

from harness.context import Context
from harness.conversation.chat_events import ChatEventDetails, chat_event_message, logger
from harness.errors import HarnessError
from harness.runtime import AgentHarness, AgentHarnessOptions
from harness.session import Session

MAIN_LANE = "main"
"""The lane of a conversation that talks to the person."""


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


async def record_cold_chat_event(session: Session, details: ChatEventDetails, context: Context, *,
                                 lane: str = MAIN_LANE) -> bool:
    """`record_chat_event` on a conversation no harness of this process holds: attach (taking the
    session's lock, so `SessionOwned` while another process holds it), record, detach. An
    operation a dead process left open gets the row as a pending write, as a live one would."""
    harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session), context)
    try:
        return await record_chat_event(harness, details, context, lane=lane)
    finally:
        await harness.close(context)
