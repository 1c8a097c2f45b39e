"""What a conversation's person allowed "always" (issue 30): each answer is an `AlwaysAllowed` row
the model reads and one more rule in a session value, which outlives compaction and restarts.

The rules are kept as text (`shell`, `write`): the approval policy that reads them
(`harness.tools.ApprovalPolicy`) knows their syntax; this room only keeps them."""

from __future__ import annotations

import asyncio
import weakref

from harness.context import Context
from harness.conversation.chat_events import AlwaysAllowed
from harness.conversation.recording import CONVERSATION_VALUES, record_chat_event
from harness.runtime import AgentHarness
from harness.session import SessionReader, addresses

ALWAYS_ALLOWED = addresses.value_address(CONVERSATION_VALUES.namespace, "always_allowed", list[str])
"""The rules the person allowed "always" in this conversation, oldest first."""

_locks: weakref.WeakKeyDictionary[AgentHarness, asyncio.Lock] = weakref.WeakKeyDictionary()


async def allowed_always(journal: SessionReader, context: Context) -> tuple[str, ...]:
    """The rules the person allowed "always" in the conversation `journal` holds, oldest first."""
    return tuple(await journal.get(ALWAYS_ALLOWED, context) or ())


async def allow_always(harness: AgentHarness, rule: str, context: Context) -> bool:
    """Keep `rule` as allowed "always" in the conversation `harness` runs: its `AlwaysAllowed`
    row (placed at once when idle, else at the run's next safe boundary, CE-4), then the rule in
    `ALWAYS_ALLOWED`. A rule already kept is True without a second row. False when the store
    refused the row (the rule is then not kept: the next call asks again)."""
    lock = _locks.setdefault(harness, asyncio.Lock())
    async with lock:  # two answers of one tool batch must not each write the list without the other's rule
        kept = await allowed_always(harness.session, context)
        if rule in kept:
            return True
        # The row first: a crash between the two leaves a row and a call that asks again, never a
        # rule in force that the model was not told of.
        if not await record_chat_event(harness, AlwaysAllowed(rule=rule), context):
            return False
        await harness.set_value(ALWAYS_ALLOWED, [*kept, rule], context)
        return True
