"""The work board of a PostgreSQL store: which lanes have an operation to drive or a request to
take, which sessions are free to claim, wake-ups when that may have changed, and leases, so that
a claim whose holder stopped answering can be taken over."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from harness.context import Context
from harness.session import addresses
from harness.session.errors import WorkNeedsPostgres
from harness.session.records import AssistantRetryWait, SummaryRetryWait
from harness.session.session import decode_value
from harness.session.store import Store

if TYPE_CHECKING:  # psycopg is imported only by a store that opens PostgreSQL
    from harness.session.postgres import PostgresBackend

DEFAULT_LEASE_S = 10.0
"""How long a lease's connection may stay quiet before a claimant ends it (`WorkBoard`)."""


@dataclass(frozen=True)
class OpenWork:
    """One lane with something to do: its current operation (None when only requests wait), the
    Unix ms before which a retry waits (None: ready now), whether the session is held, and
    whether its holder is a lease gone quiet, which a claimant may end (`end_stale_lease`)."""

    session_id: str
    lane: str
    operation_id: str | None
    not_before: int | None
    held: bool
    stale: bool


class WorkBoard:
    """Work across the processes of one PostgreSQL store (`work_board`). The claim itself is the
    session's advisory lock (`Session.attach`): a worker that finds a session free claims it, one
    that finds it held skips it, and a killed holder's lock goes with its connection."""

    def __init__(self, backend: PostgresBackend, lease_s: float) -> None:
        self._backend = backend
        self.lease_s = lease_s

    async def open_work(self, context: Context, *, session_ids: Sequence[str] | None = None) -> list[OpenWork]:
        """Every lane of the sessions named (None: all) with a current operation or a posted
        request, from one indexed query plus a look at the locks held; oldest order not implied."""
        state_adapter = addresses.operation_state("").adapter
        work = []
        for row in await self._backend.open_work(session_ids, self.lease_s, context):
            not_before = None
            if row.operation_state is not None:
                state = decode_value(state_adapter, row.operation_state, f"operation {row.operation_id}")
                if isinstance(state, AssistantRetryWait | SummaryRetryWait):
                    not_before = state.not_before
            work.append(OpenWork(row.session_id, row.lane, row.operation_id, not_before, row.held, row.stale))
        return work

    def listen(self) -> AsyncIterator[str]:
        """Session ids as they are released or get a request, live (LISTEN on the store's channel);
        `StoreConnectionLost` when the listening connection drops."""
        return self._backend.listen()

    async def end_stale_lease(self, session_id: str, context: Context) -> bool:
        """End the session's holder if it is a lease quiet for longer than `lease_s` (a stopped or
        hung worker); True if one was ended. Its lock goes as its connection closes on the server,
        and it can commit nothing more (the next claim also bumps the epoch)."""
        return await self._backend.end_stale_lease(session_id, self.lease_s, context)

    async def renew(self, context: Context) -> None:
        """Keep this store's leases alive; call it well within `lease_s` (a third of it, say)."""
        await self._backend.renew_claims(context)


def work_board(store: Store, *, lease_s: float = DEFAULT_LEASE_S, leases: bool = True) -> WorkBoard:
    """The work board of `store`, whose claims become leases from now on (each one a dedicated
    connection marked as a lease, which `WorkBoard.renew` keeps alive); with `leases` False its
    claims stay as they are, for a process that only looks for open work (`harness serve`'s
    sweep). Raises `WorkNeedsPostgres` for a memory or SQLite store."""
    if store.backend.kind != "postgres":
        raise WorkNeedsPostgres(f"claiming work across processes needs a postgresql:// store, not {store.url!r}",
                                url=store.url)
    backend = cast("PostgresBackend", store.backend)
    if leases:
        backend.leases = True
    return WorkBoard(backend, lease_s)
