"""Small builders shared by the journal tests, and a second process to run journal actions in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.context import Context
from harness.messages import ModelIdentity, UserMessage
from harness.session import (
    CompactionPayload,
    Entry,
    LaneConfig,
    MessagePayload,
    Session,
    SessionMutator,
    SessionOwned,
    SessionOwnership,
    Store,
    addresses,
)

TESTS = Path(__file__).resolve().parent

CONFIG = LaneConfig(model=ModelIdentity(provider="p", model_id="m"))


async def new_session_with_lane(store: Store, context: Context) -> Session:
    """A new session with lane `main` on an empty branch, configured with `CONFIG`."""
    session = await store.create_session(context)
    await session.create_lane("main", CONFIG, context)
    return session


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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file's non-blank lines, read independently of the importers."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


async def lane_branch(store: Store, session_id: str, context: Context, lane: str = "main") -> list[Entry]:
    """A lane's whole branch, root first, asserting it fits one page."""
    session = await store.open_session(session_id, context)
    tip = await session.get(addresses.branch_tip(lane), context)
    assert tip is not None
    page = await session.read_branch(tip, context, limit=10_000)
    assert page.next_before is None
    return page.entries[::-1]


@contextmanager
def child(url: str, session_id: str, *action: str) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    process = subprocess.Popen(
        [sys.executable, str(TESTS / "journal_child.py"), url, session_id, *action],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        assert process.stdout is not None
        process.stdout.close()


def read_word(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


async def assert_owned_only_by(ownership: SessionOwnership, other: Store, context: Context) -> None:
    """Through `other` (a second store on the same database), the owned session can be neither
    claimed nor written; once `ownership` is released, `other` can claim it (HA-4)."""
    seen = await other.open_session(ownership.session.id, context)
    with pytest.raises(SessionOwned):
        await seen.attach("second", context)
    with pytest.raises(SessionOwned):
        await append_chain(seen, ["intruder"], context)
    await ownership.detach(context)
    claimed = await seen.attach("second", context)
    await claimed.detach(context)
