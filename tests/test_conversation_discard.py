"""A turn a person stops before any output is discarded, through `ConversationService` on every
backend: no `interrupted` row, the branch back to just before the person's message with the rows
its admission recorded kept (CE-7, CE-14), in the run's settlement commit, so a crash between the
stop and the settlement ends the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from conversation_helpers import faux_service, rows, transcript
from drive_helpers import FAUX, within
from harness.context import Context
from harness.conversation import Conversation, ConversationService, Interrupted, ReasoningChanged, Renamed
from harness.messages import Message, TextContent, UserMessage
from harness.providers import FauxProvider
from harness.providers.faux import FauxReply, delay, reply
from harness.runtime import AcceptedRun, Settled
from harness.session import LaneConfig, Store

ALICE = "alice"
CONFIG = LaneConfig(model=FAUX)
CHANGED = ReasoningChanged(previous="off", level="high")


def settled(outcome: object, how: str) -> Settled:
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == how
    return outcome


def user_texts(messages: Sequence[Message]) -> list[str]:
    """The text of each user message among `messages`."""
    return ["".join(block.text for block in m.content if isinstance(block, TextContent))
            if not isinstance(m.content, str) else m.content
            for m in messages if isinstance(m, UserMessage)]


async def spoken(script: Sequence[FauxReply | str], store: Store,
                 ctx: Context) -> tuple[ConversationService, FauxProvider, Conversation]:
    """A live conversation of ALICE with one finished turn ("hello"), its reasoning level then
    raised to `high`: the next admission records a `ReasoningChanged` row above its prompt."""
    conversations, faux = faux_service(store, ["hi", *script])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversation.send("hello", ctx)), "completed")
    await conversation.set_thinking_level("high", ctx)
    return conversations, faux, conversation


async def held_admission(conversation: Conversation, held: asyncio.Event, ctx: Context,
                         ) -> tuple[AcceptedRun, asyncio.Future[object]]:
    """A turn "never mind" admitted and driven until its reply is held before any output."""
    accepted = await conversation.admit("never mind", ctx)
    running: asyncio.Future[object] = asyncio.ensure_future(conversation.drive(accepted.operation_id, ctx))
    await within(held.wait())
    return accepted, running


async def assert_discarded(conversations: ConversationService, faux: FauxProvider, conversation: Conversation,
                           accepted: AcceptedRun, ctx: Context) -> None:
    """The turn `accepted` was discarded: nothing recorded for it, the tip on its admission's
    `ReasoningChanged` row, its prompt in the journal off the branch; the next turn neither
    announces the change again nor sends the discarded prompt."""
    row_id, prompt_id = accepted.entry_ids
    assert await rows(conversation, ctx) == [CHANGED]
    assert conversation.tip_id() == row_id
    assert user_texts(await transcript(conversation, ctx)) == ["hello"]
    assert await conversation.journal.entry(prompt_id, ctx) is not None  # off the branch, not deleted

    settled(await within(conversation.send("something else", ctx)), "completed")
    assert await rows(conversation, ctx) == [CHANGED]
    sent = faux.requests[-1].request.messages
    assert user_texts(sent) == ["hello", "something else"]
    assert [m.role for m in sent] == ["user", "assistant", "custom", "user"]
    await conversations.close_all(ctx)


async def test_a_stop_before_any_output_discards_the_turn_and_keeps_its_admission_rows(
        store: Store, ctx: Context) -> None:
    """CE-7: a person's stop before the model said anything records no `interrupted` row, and the
    branch goes back to just before their message; CE-14: the `ReasoningChanged` row its admission
    recorded stays and is not announced again by the next admission."""
    held = delay(asyncio.Event())
    conversations, faux, conversation = await spoken([reply(held, "never seen"), "answered"], store, ctx)
    accepted, running = await held_admission(conversation, held.reached, ctx)

    await conversation.stop(ctx)
    outcome = settled(await within(running), "aborted")

    assert outcome.result.abort_cause == "user"
    assert outcome.result.tip_id == accepted.entry_ids[0]
    await assert_discarded(conversations, faux, conversation, accepted, ctx)


async def test_a_first_turn_stopped_before_any_output_leaves_the_empty_branch(store: Store, ctx: Context) -> None:
    """CE-7: with nothing recorded above it, the discarded turn leaves the branch as it was before
    it; the next turn's request holds only its own prompt."""
    held = delay(asyncio.Event())
    conversations, faux = faux_service(store, [reply(held, "never seen"), "answered"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    running = asyncio.ensure_future(conversation.send("never mind", ctx))
    await within(held.reached.wait())

    await conversation.stop(ctx)
    settled(await within(running), "aborted")

    assert conversation.tip_id() is None
    assert await transcript(conversation, ctx) == []
    settled(await within(conversation.send("hello", ctx)), "completed")
    assert user_texts(faux.requests[-1].request.messages) == ["hello"]
    await conversations.close_all(ctx)


async def test_rows_placed_during_a_discarded_turn_stay_on_the_branch(store: Store, ctx: Context) -> None:
    """CE-7, CE-11: a row another door recorded while the turn ran, placed at its first step
    boundary (after the person's message), stays on the branch when the turn is discarded: the
    rename it records is still shown and read by the model. (It left the branch with the turn.)"""
    held = delay(asyncio.Event())
    conversations, faux, conversation = await spoken([reply(held, "never seen"), "answered"], store, ctx)
    accepted = await conversation.admit("never mind", ctx)
    assert await conversations.rename(ALICE, conversation.id, "notes", ctx) is True  # pending: placed at the boundary
    running = asyncio.ensure_future(conversation.drive(accepted.operation_id, ctx))
    await within(held.reached.wait())

    await conversation.stop(ctx)
    settled(await within(running), "aborted")

    assert await rows(conversation, ctx) == [CHANGED, Renamed(name="notes")]
    assert user_texts(await transcript(conversation, ctx)) == ["hello"]
    settled(await within(conversation.send("something else", ctx)), "completed")
    assert "notes" in str(faux.requests[-1].request.messages)
    await conversations.close_all(ctx)


async def test_a_stop_after_some_output_still_records_interrupted(store: Store, ctx: Context) -> None:
    """CE-7: once the model said something, a stop keeps the turn and records one `interrupted`
    row after the cut reply."""
    held = delay(asyncio.Event())
    conversations, _, conversation = await spoken([reply("I was saying", held)], store, ctx)
    accepted, running = await held_admission(conversation, held.reached, ctx)

    await conversation.stop(ctx)
    settled(await within(running), "aborted")

    assert await rows(conversation, ctx) == [CHANGED, Interrupted(cause="user")]
    assert user_texts(await transcript(conversation, ctx)) == ["hello", "never mind"]
    assert conversation.tip_id() not in accepted.entry_ids
    await conversations.close_all(ctx)


async def test_an_abort_before_any_output_with_another_cause_keeps_its_row(store: Store, ctx: Context) -> None:
    """CE-7: only a person's stop discards; a delegating parent's abort before any output still
    records its `interrupted` row after the prompt."""
    held = delay(asyncio.Event())
    conversations, _, conversation = await spoken([reply(held, "never seen")], store, ctx)
    _, running = await held_admission(conversation, held.reached, ctx)

    await conversation.stop(ctx, cause="parent")
    settled(await within(running), "aborted")

    assert await rows(conversation, ctx) == [CHANGED, Interrupted(cause="parent")]
    assert user_texts(await transcript(conversation, ctx)) == ["hello", "never mind"]
    await conversations.close_all(ctx)


async def test_a_crash_between_the_stop_and_its_settlement_ends_the_same_way(store: Store, ctx: Context) -> None:
    """CE-7, CE-14: the process stops while the reply is held before any output; the stop is then
    made durable with nobody driving the run, and the process stops again; the run resumed by a
    third holder settles as the discard the live stop would have made."""
    held = delay(asyncio.Event())
    first, _, conversation = await spoken([reply(held, "never seen")], store, ctx)
    accepted, running = await held_admission(conversation, held.reached, ctx)
    await conversation.detach_now(ctx)  # as a crash stops it, the reply still held
    await asyncio.gather(running, return_exceptions=True)  # the drive ends with the harness
    await first.close_all(ctx)

    second, _ = faux_service(store, [])
    reopened = await second.open(ALICE, conversation.id, ctx)
    assert (await reopened.stop(ctx)).operation_id == accepted.operation_id
    await reopened.detach_now(ctx)  # the stop is durable; its settlement never ran
    await second.close_all(ctx)

    third, faux = faux_service(store, ["answered"])
    again = await third.open(ALICE, conversation.id, ctx)
    outcome = settled(await within(again.resume(ctx)), "aborted")

    assert outcome.result.abort_cause == "user"
    assert faux.requests == []  # settling the stop asked the model nothing
    await assert_discarded(third, faux, again, accepted, ctx)
