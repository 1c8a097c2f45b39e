"""Input larger than the model's context window (issue 10, item 6): a prompt or queued message that
cannot fit even alone is refused before anything is stored, and a session whose branch no longer
fits (an oversized entry an older version stored) fails with a named way out that works.

White-box: it measures with the runtime's own token estimate and recognises its summary prefix
and its does-not-fit message."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from drive_helpers import FAUX, Rig, branch, shape, start_rig, text, within
from harness.context import Context
from harness.messages import ImageContent, ModelIdentity, UserMessage
from harness.providers import FAUX_MODEL
from harness.providers.faux import FauxScript, failure
from harness.runtime import PromptRequest, PromptTooLarge, Settled
from harness.runtime.branch_context import SUMMARY_PREFIX, estimate_tokens
from harness.runtime.drive.settlement import DOES_NOT_FIT
from harness.session import LaneConfig, MessagePayload, Session, SessionMutator, Store, addresses
from harness_helpers import recording, said

WINDOW = 4096
"""The embedded default's window: 1,024 tokens of it are kept for the reply."""

PASTE = "x" * 81_000  # the 81 KB paste of the issue: about 20,000 tokens
OVERFLOW = failure("context_overflow", "the request exceeds the context window")


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled), outcome
    return outcome


async def small_window_rig(store: Store, ctx: Context, script: FauxScript = (), **options: Any) -> Rig:
    """A rig whose faux model has the embedded default's window."""
    rig = await start_rig(store, ctx, script, **options)
    registry = rig.harness.options.models
    assert registry is not None
    registry.register_model(FAUX_MODEL.model_copy(update={"context_window": WINDOW}))
    return rig


async def test_a_prompt_larger_than_the_window_is_refused_and_nothing_is_written(store: Store, ctx: Context) -> None:
    """The refusal says the estimated size and the room the model has, in tokens, and stores
    nothing: no entry, no operation, no provider request; the next prompt that fits runs."""
    watched, backend = recording(store)
    rig = await small_window_rig(watched, ctx, ["fits"])
    commits = len(backend.commits)

    with pytest.raises(PromptTooLarge) as refused:
        await rig.lane.accept(PromptRequest(text=PASTE), ctx)

    error = refused.value
    assert error.code == "prompt_too_large"
    assert error.details["context_window"] == WINDOW
    assert error.details["room_tokens"] == WINDOW - 1024
    estimated = error.details["estimated_tokens"]
    assert isinstance(estimated, int)
    assert 20_000 < estimated < 21_000
    assert f"about {estimated:,} tokens" in str(error)
    assert "room for about 3,072" in str(error)
    assert "context window is 4,096 tokens" in str(error)
    assert len(backend.commits) == commits
    assert (await rig.lane.inspect_execution(ctx)).current is None
    assert rig.lane.tip_id is None
    assert rig.faux.requests == []
    assert settled(await within(rig.lane.prompt("a short one", None, ctx))).result.outcome == "completed"


async def test_the_system_prompt_counts_against_the_room(store: Store, ctx: Context) -> None:
    rig = await small_window_rig(store, ctx, system_prompt="s" * 4000)  # about 1,000 tokens

    with pytest.raises(PromptTooLarge) as refused:
        await rig.lane.accept(PromptRequest(text="y" * 9000), ctx)  # fits 3,072 tokens, not 2,072

    assert refused.value.details["room_tokens"] == WINDOW - 1024 - 1000
    assert "1,000 for the system prompt" in str(refused.value)


@pytest.mark.parametrize("kind", ["steer", "follow_up", "queue_next_run"])
async def test_a_queued_message_larger_than_the_window_is_refused(store: Store, ctx: Context, kind: str) -> None:
    """Steer, follow-up and next-run items are placed into the context later: the same check
    refuses them when they are queued, and the queue stays as it was."""
    rig = await small_window_rig(store, ctx)
    await rig.lane.accept(PromptRequest(text="go"), ctx)

    with pytest.raises(PromptTooLarge):
        await getattr(rig.lane, kind)(said(PASTE), ctx)

    watch = await rig.lane.watch(ctx)
    watch.close()
    queues = watch.snapshot.queues
    assert (queues.steer, queues.follow_up, queues.next_run) == ((), (), ())


async def test_an_image_counts_as_an_image_not_as_its_bytes(store: Store, ctx: Context) -> None:
    """A photo's base64 is far longer than the window, but a provider reads it as an image."""
    rig = await small_window_rig(store, ctx, ["nice"])
    photo = ImageContent(data=base64.b64encode(b"\x89PNG" * 100_000).decode(), mime_type="image/png")

    outcome = settled(await within(rig.lane.prompt("look", [photo], ctx)))

    assert outcome.result.outcome == "completed"


async def test_without_a_model_to_measure_against_acceptance_checks_nothing(store: Store, ctx: Context) -> None:
    """A model the registry does not know is not measured at acceptance: it is measured when a
    step resolves it (and fails there, in-band, HA-23)."""
    unknown = ModelIdentity(provider="elsewhere", model_id="big-window")
    rig = await start_rig(store, ctx, [], model=unknown)

    accepted = await rig.lane.accept(PromptRequest(text=PASTE), ctx)

    assert (await rig.lane.inspect_execution(ctx)).current is not None
    assert accepted.entry_ids


# -- the way out of a branch that no longer fits -------------------------------------------------


async def session_with_an_oversized_first_entry(store: Store, ctx: Context) -> Session:
    """A session as an older version left it: the paste stored as entry 1, at the lane's tip."""
    session = await store.create_session(ctx)
    await session.create_lane("main", LaneConfig(model=FAUX), ctx)

    async def job(m: SessionMutator) -> None:
        entry_id = m.insert_entry(MessagePayload(message=UserMessage(content=PASTE, timestamp=0)), parent_id=None)
        m.set(addresses.branch_tip("main"), entry_id)

    await session.mutate(job, ctx)
    return session


async def test_a_compaction_cuts_an_oversized_old_entry_to_fit_and_the_session_recovers(
    store: Store, ctx: Context
) -> None:
    """The threshold compaction summarizes the paste cut in the middle to fit the window (its
    beginning and end kept, the cut marked), so the next step fits and the turn completes."""
    session = await session_with_an_oversized_first_entry(store, ctx)
    rig = await small_window_rig(store, ctx, ["SUMMARY", "hello back"], session=session)

    outcome = settled(await within(rig.lane.prompt("hi", None, ctx)))

    assert outcome.result.outcome == "completed"
    summary_request = rig.faux.requests[0].request
    assert estimate_tokens(summary_request.messages, summary_request.system_prompt or "") <= WINDOW - 1024
    cut = text(summary_request.messages[0])
    assert cut.startswith("x" * 1000)
    assert cut.endswith("x" * 500)
    assert "characters left out here to fit the model's context window" in cut
    assert text(rig.requests()[1][0]).startswith(SUMMARY_PREFIX)
    assert shape(rig.requests()[1][1:]) == ["user:hi"]


async def test_a_branch_that_no_longer_fits_fails_naming_the_way_out_and_it_works(
    store: Store, ctx: Context
) -> None:
    """Every compaction of the oversized entry overflows (a server whose window is smaller than
    it says), so the run fails; its error names the
    way out (go back before the entry, to the session's start); navigating there works and the
    next prompt completes without the entry."""
    session = await session_with_an_oversized_first_entry(store, ctx)
    # three threshold compactions, the step, its overflow compaction: all overflow
    rig = await small_window_rig(store, ctx, [OVERFLOW] * 5 + ["a fresh start"], session=session)

    failed = settled(await within(rig.lane.prompt("hi", None, ctx)))
    back = settled(await within(rig.lane.navigate(None, ctx)))
    tip_after_navigation = rig.lane.tip_id
    answered = settled(await within(rig.lane.prompt("hi again", None, ctx)))

    assert failed.result.outcome == "failed"
    assert failed.result.error is not None
    assert failed.result.error.code == "compaction_failed"
    assert DOES_NOT_FIT in failed.result.error.message
    assert "/tree" in failed.result.error.message
    assert (back.result.outcome, back.result.tip_id, tip_after_navigation) == ("completed", None, None)
    assert answered.result.outcome == "completed"
    assert shape(rig.requests()[-1]) == ["user:hi again"]
    assert shape([e.payload.message for e in await branch(rig.lane, ctx)]) == [  # type: ignore[union-attr]
        "user:hi again", "assistant:a fresh start"]
