"""Spending caps of a conversation's runs, checked at each step boundary from the usage ledger,
what the ledger sums to (`spent`, every door's meter), and the row of a fallback model taking a
step over (issue 32).

A `Budget` caps tokens (each usage row's `total_tokens`) and US dollars (its `cost.total`) per
run and per conversation. The caps a run is held to are the tighter of its door's
(`ConversationSetup.budget`: `Agent(budget=)`, `harness run --budget-tokens`) and the
conversation's own (`BUDGET`, a session value, so every process that drives the conversation
honours it). A run over a cap at a step boundary leaves a `BudgetReached` row and settles aborted
with cause `budget`; with the cap raised, the conversation's next run goes on.
"""

from __future__ import annotations

import bisect
import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from harness.context import Context
from harness.conversation.chat_events import BudgetReached, ModelSwitched, chat_event_message
from harness.conversation.recording import CONVERSATION_VALUES
from harness.messages import Cost, Message, Usage
from harness.runtime import Lane, ModelFallback, OperationIdTaken, OverBudget
from harness.session import SessionReader, addresses
from harness.session.records import RunIntent


class Budget(BaseModel):
    """Caps on what runs spend; None: no cap. `run_*` hold each run (from its admission, its
    delegated sub-agents' usage included), `conversation_*` the whole conversation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_tokens: int | None = Field(default=None, ge=0)
    run_usd: float | None = Field(default=None, ge=0)
    conversation_tokens: int | None = Field(default=None, ge=0)
    conversation_usd: float | None = Field(default=None, ge=0)

    def tighter(self, other: Budget) -> Budget:
        """Each cap the lower of the two (a cap either has)."""
        def low(a: float | None, b: float | None) -> float | None:
            return b if a is None else a if b is None else min(a, b)

        return Budget.model_validate({name: low(getattr(self, name), getattr(other, name))
                                      for name in Budget.model_fields})


BUDGET = addresses.value_address(CONVERSATION_VALUES.namespace, "budget", Budget)
"""The conversation's own caps, durable (`ConversationService.set_budget`)."""

_BUDGET_ROW = uuid.UUID("2c6f0b7e-93d4-4a51-8e2a-5b1f7d9c3e60")
_LEDGER_PAGE = 1000

_TOKENS = ("input", "output", "cache_read", "cache_write", "total_tokens")


async def spent(journal: SessionReader, context: Context) -> Usage:
    """What the conversation on `journal` has spent: its whole usage ledger summed, tokens and US
    dollars by kind (adjustments included), read a page at a time."""
    tokens = dict.fromkeys(_TOKENS, 0)
    dollars = dict.fromkeys(Cost.model_fields, 0.0)
    after: int | None = None
    while rows := await journal.usage_ledger(context, after_seq=after, limit=_LEDGER_PAGE):
        for row in rows:
            for name in tokens:
                tokens[name] += getattr(row.usage, name)
            for name in dollars:
                dollars[name] += getattr(row.usage.cost, name)
        if len(rows) < _LEDGER_PAGE:
            break
        after = rows[-1].seq
    return Usage(**tokens, cost=Cost(**dollars))


@dataclass
class _Ledger:
    """The conversation's usage ledger summed as it grows: read past the last row seen at each
    check, so a check costs O(rows since the last one), not O(history)."""

    seqs: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # running totals, after each row
    usd: list[float] = field(default_factory=list)
    run_starts: dict[str, int | None] = field(default_factory=dict)  # by operation id: its prompt's seq

    async def catch_up(self, journal: SessionReader, context: Context) -> None:
        # A short page is the last: a check costs one read, not a second, empty one.
        while True:
            rows = await journal.usage_ledger(context, after_seq=self.seqs[-1] if self.seqs else None,
                                              limit=_LEDGER_PAGE)
            for row in rows:
                self.seqs.append(row.seq)
                self.tokens.append((self.tokens[-1] if self.tokens else 0) + row.usage.total_tokens)
                self.usd.append((self.usd[-1] if self.usd else 0.0) + row.usage.cost.total)
            if len(rows) < _LEDGER_PAGE:
                return

    def since(self, seq: int | None) -> tuple[int, float]:
        """Tokens and dollars of the rows after `seq` (None: all of them)."""
        if not self.seqs:
            return 0, 0.0
        before = bisect.bisect_right(self.seqs, seq) - 1 if seq is not None else -1
        base_tokens, base_usd = (self.tokens[before], self.usd[before]) if before >= 0 else (0, 0.0)
        return self.tokens[-1] - base_tokens, self.usd[-1] - base_usd

    async def run_start(self, journal: SessionReader, operation_id: str, context: Context) -> int | None:
        """The seq the run's usage counts after: that of its first prompt entry."""
        if operation_id not in self.run_starts:
            meta = await journal.get(addresses.operation_meta(operation_id), context)
            start = None
            if meta is not None and isinstance(meta.intent, RunIntent) and meta.intent.prompt_entry_ids:
                entry = await journal.entry(meta.intent.prompt_entry_ids[0], context)
                start = entry.seq if entry is not None else None
            self.run_starts[operation_id] = start
        return self.run_starts[operation_id]


def over_budget(journal: SessionReader, door: Budget) -> OverBudget:
    """The `RunHooks.over_budget` of a conversation on `journal`: at each step boundary, the first
    cap of `door` tightened by the conversation's `BUDGET` that the run or the conversation has
    reached (spent at least) leaves its `BudgetReached` row (once per run, whatever process
    checks) and stops the run."""
    ledger = _Ledger()

    async def check(lane: Lane, context: Context) -> bool:
        operation = lane.info().operation
        if operation is None:
            return False
        caps = door.tighter(await journal.get(BUDGET, context) or Budget())
        if caps == Budget():
            return False
        await ledger.catch_up(journal, context)
        run = ledger.since(await ledger.run_start(journal, operation.id, context))
        whole = ledger.since(None)
        for scope, (tokens, usd), (token_cap, usd_cap) in (
                ("run", run, (caps.run_tokens, caps.run_usd)),
                ("conversation", whole, (caps.conversation_tokens, caps.conversation_usd))):
            for unit, spent, cap in (("tokens", tokens, token_cap), ("usd", usd, usd_cap)):
                if cap is not None and spent >= cap:
                    row = BudgetReached(scope=scope, unit=unit, limit=cap, spent=spent)  # type: ignore[arg-type]
                    # Taken: an earlier check of this run recorded it (a crash came before the stop).
                    with contextlib.suppress(OperationIdTaken):
                        await lane.append_message(chat_event_message(row), context,
                                                  entry_id=str(uuid.uuid5(_BUDGET_ROW, operation.id)))
                    return True
        return False

    return check


def fallback_rows(fallback: ModelFallback) -> Sequence[Message]:
    """The `RunHooks.fallback_messages` of a conversation: a `ModelSwitched` row by `fallback`."""
    return [chat_event_message(ModelSwitched(previous=fallback.previous, model=fallback.model, by="fallback",
                                             reason=fallback.error[:300] or None))]
