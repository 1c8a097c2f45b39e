"""Small builders shared by the journal tests."""

from __future__ import annotations

from harness.context import Context
from harness.messages import UserMessage
from harness.session import CompactionPayload, MessagePayload, Session, SessionMutator, addresses


def user(text: str) -> MessagePayload:
    return MessagePayload(message=UserMessage(content=text, timestamp=0))


async def append_chain(
    session: Session, texts: list[str], context: Context, *, lane: str = "main", compaction_at: set[int] | None = None
) -> list[str]:
    """Append one message entry per text (a compaction entry where `i in compaction_at`) after the
    lane's tip, in one commit, and move the tip; returns the new ids in order."""
    compaction_at = compaction_at or set()

    async def job(m: SessionMutator) -> list[str]:
        tip = await m.get(addresses.branch_tip(lane), context)
        ids: list[str] = []
        for i, text in enumerate(texts):
            payload = CompactionPayload(summary=text) if i in compaction_at else user(text)
            tip = m.insert_entry(payload, parent_id=tip)
            ids.append(tip)
        m.set(addresses.branch_tip(lane), tip)
        return ids

    return await session.mutate(job, context)


def text_of(payload: object) -> str:
    """The text of a user message payload or the summary of a compaction payload."""
    if isinstance(payload, CompactionPayload):
        return payload.summary
    assert isinstance(payload, MessagePayload)
    assert isinstance(payload.message, UserMessage)
    assert isinstance(payload.message.content, str)
    return payload.message.content
