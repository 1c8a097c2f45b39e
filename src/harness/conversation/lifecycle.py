"""A conversation's end: once its person ends it, it takes no new turn and no garden message; it
stays in the journal to be read, renamed or deleted. "Open" here is what OM-7 asks of a garden
message's conversation origin (an ended one is `INVALID_OPERATOR_MESSAGE_CONTEXT`)."""

from __future__ import annotations

from harness.context import Context
from harness.conversation.recording import CONVERSATION_VALUES
from harness.errors import HarnessError
from harness.session import SessionReader, addresses

ENDED_AT = addresses.value_address(CONVERSATION_VALUES.namespace, "ended_at", int)
"""When the conversation was ended (Unix ms); absent while it is open."""


class ConversationEnded(HarnessError):
    """The conversation was ended: it takes no new turn and no garden message; nothing was written.
    Details `{conversation_id, ended_at}`."""

    code = "conversation_ended"


async def refuse_if_ended(session: SessionReader, conversation_id: str, context: Context) -> None:
    """Raise `ConversationEnded` if the conversation was ended."""
    ended_at = await session.get(ENDED_AT, context)
    if ended_at is not None:
        raise ConversationEnded(f"conversation {conversation_id} was ended", conversation_id=conversation_id,
                                ended_at=ended_at)
