"""Closing a live conversation lets go of it even when the store fails at that moment: the next
holder (another service, a worker) can attach it."""

from __future__ import annotations

import pytest

from conversation_helpers import faux_service
from drive_helpers import FAUX
from harness.context import Context
from harness.conversation import Forbidden
from harness.session import LaneConfig, Session, SessionOwned, Store, StoreUnavailable


async def test_a_live_conversation_is_let_go_even_when_the_store_fails_at_its_close(
        store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    service, _ = faux_service(store, [])
    conversation = await service.create("ada", LaneConfig(model=FAUX), ctx)
    other, _ = faux_service(store, [])
    with pytest.raises(SessionOwned):
        await other.open("ada", conversation.id, ctx)

    async def unavailable(self: Store, session_id: str, context: Context) -> Session:
        raise StoreUnavailable("the disk went away")

    with monkeypatch.context() as failing:
        failing.setattr(Store, "open_session", unavailable)
        await service.close("ada", conversation.id, ctx)

    reopened = await other.open("ada", conversation.id, ctx)
    assert reopened.id == conversation.id
    await other.close_all(ctx)


async def test_a_live_conversation_is_not_closed_for_another_user(store: Store, ctx: Context) -> None:
    service, _ = faux_service(store, [])
    conversation = await service.create("ada", LaneConfig(model=FAUX), ctx)

    with pytest.raises(Forbidden):
        await service.close("eve", conversation.id, ctx)

    assert await service.open("ada", conversation.id, ctx) is conversation
    await service.close_all(ctx)
