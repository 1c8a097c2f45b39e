"""Context: per-invocation cancellation and telemetry (HA-22)."""

from __future__ import annotations

import asyncio
import copy
import pickle

import pytest

from harness import Context
from harness.errors import Cancelled, ContextNotStorable


async def test_cancel_wakes_waiters_and_children() -> None:
    parent = Context({"request": "r1"})
    child = parent.child(step=1)
    waiting = asyncio.create_task(child.wait_cancelled())
    await asyncio.sleep(0)
    assert not waiting.done()

    parent.cancel("user left")

    await asyncio.wait_for(waiting, timeout=5)
    assert child.cancelled
    assert child.cancel_reason == "user left"
    assert child.attributes == {"request": "r1", "step": 1}
    with pytest.raises(Cancelled):
        child.raise_if_cancelled()


async def test_cancellation_is_a_future_that_cancel_resolves_and_its_waiter_may_give_up() -> None:
    context = Context()
    given_up, waiting = context.cancellation(), context.cancellation()
    given_up.cancel()
    await asyncio.sleep(0)

    context.cancel("stop")

    await asyncio.wait_for(waiting, timeout=5)
    assert given_up.cancelled()
    assert context.cancellation().done()  # asked after the cancel: done already


def test_cancelling_a_child_leaves_the_parent_running() -> None:
    parent = Context()
    parent.child().cancel()
    assert not parent.cancelled
    parent.raise_if_cancelled()


def test_a_child_of_a_cancelled_context_starts_cancelled() -> None:
    parent = Context()
    parent.cancel("gone")
    assert parent.child().cancelled


def test_a_context_refuses_to_be_pickled_or_copied_deeply() -> None:
    """HA-22: a Context is never stored; serializing it fails loudly."""
    with pytest.raises(ContextNotStorable):
        pickle.dumps(Context())
    with pytest.raises(ContextNotStorable):
        copy.deepcopy(Context())
