"""Long sessions for the benchmarks, built fast with large direct commits."""

from __future__ import annotations

from collections.abc import Sequence

from harness.context import Context
from harness.session import EntryPayload, Session, SessionMutator, addresses


async def append_history(
    session: Session,
    lane: str,
    total: int,
    *,
    newest_compaction_behind: int,
    batch: int,
    turns: Sequence[EntryPayload],
    compaction: EntryPayload,
    context: Context,
) -> str:
    """Append `total` entries in one chain to `lane` (its tip moves), cycling through `turns`; the
    newest compaction is `newest_compaction_behind` entries behind the tip and older ones stand every
    10,000 entries before it. Commits `batch` entries at a time; returns the new tip."""
    newest = total - 1 - newest_compaction_behind
    tip: str | None = None
    for start in range(0, total, batch):

        async def job(m: SessionMutator, start: int = start, parent: str | None = tip) -> str | None:
            for index in range(start, min(total, start + batch)):
                is_compaction = index == newest or (index < newest and index % 10_000 == 5_000)
                parent = m.insert_entry(compaction if is_compaction else turns[index % len(turns)],
                                        parent_id=parent)
            m.set(addresses.branch_tip(lane), parent)
            return parent

        tip = await session.mutate(job, context)
    assert tip is not None
    return tip
