"""A session made before conversations had owners (or imported, forked, saved as a chat's draft)
is adopted by the local user on its first open, once (issue 13 item 8), on every backend."""

from __future__ import annotations

import asyncio

import pytest

from drive_helpers import FAUX
from harness.context import Context
from harness.conversation import ConversationService, Forbidden
from harness.session import LaneConfig, SessionNotFound, Store

ALICE, BOB = "alice", "bob"


async def test_a_session_without_an_owner_is_adopted_once_and_then_opens(store: Store, ctx: Context) -> None:
    session = await store.create_session(ctx)  # as an older version made it: no owner record
    await session.create_lane("main", LaneConfig(model=FAUX), ctx)
    conversations = ConversationService(store)
    with pytest.raises(SessionNotFound):
        await conversations.open(ALICE, session.id, ctx)  # not a conversation until adopted

    assert await conversations.adopt(ALICE, session.id, ctx)
    assert not await conversations.adopt(ALICE, session.id, ctx)  # recorded once
    opened = await conversations.open(ALICE, session.id, ctx)

    assert opened.info.owner == ALICE
    assert [info.id for info in await conversations.list(ALICE, ctx)] == [session.id]
    await conversations.close_all(ctx)


async def test_of_two_adopters_one_wins_and_the_other_is_refused(store: Store, ctx: Context) -> None:
    session = await store.create_session(ctx)
    conversations = ConversationService(store)

    results = await asyncio.gather(conversations.adopt(ALICE, session.id, ctx),
                                   conversations.adopt(BOB, session.id, ctx), return_exceptions=True)

    assert sorted(type(result).__name__ for result in results) == ["Forbidden", "bool"]
    assert True in results
    winner = ALICE if results[0] is True else BOB
    loser = BOB if winner == ALICE else ALICE
    with pytest.raises(Forbidden):
        await conversations.adopt(loser, session.id, ctx)
    assert [info.owner for info in await conversations.list(winner, ctx)] == [winner]
