"""Builders shared by the harness tests: a backend that records reads and commits, and event capture."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from harness.context import Context
from harness.messages import UserMessage
from harness.runtime import AgentHarness, AgentHarnessOptions, HarnessEvent, OpenOperation
from harness.session import (
    Backend,
    Claim,
    CommitResult,
    EntryRow,
    Read,
    ReadAnswer,
    Session,
    Store,
    ValueRow,
    Write,
    read_each,
)
from journal_helpers import CONFIG


class RecordingBackend:
    """A real backend that remembers every read (`reads`) and every committed write list
    (`commits`), so tests can assert exactly what attachment, acceptance and watch touch."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.reads: list[tuple[str, ...]] = []
        self.commits: list[list[Write]] = []
        self.fail_next_commit: Exception | None = None

    @property
    def kind(self) -> Literal["memory", "sqlite", "postgres"]:
        return self.inner.kind

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read_many(self, session_id: str, reads: Sequence[Read], context: Context) -> list[ReadAnswer]:
        return await read_each(self, session_id, reads, context)  # each read recorded as it would be alone

    async def get_entries(self, session_id: str, ids: Sequence[str], context: Context) -> dict[str, EntryRow]:
        self.reads.append(("entries", *ids))
        return await self.inner.get_entries(session_id, ids, context)

    async def walk_branch(
        self, session_id: str, start: str, limit: int, stop_at_compaction: bool, context: Context
    ) -> list[EntryRow]:
        self.reads.append(("branch", start))
        return await self.inner.walk_branch(session_id, start, limit, stop_at_compaction, context)

    async def get_value(self, session_id: str, namespace: str, key: str, context: Context) -> ValueRow | None:
        self.reads.append(("value", namespace, key))
        return await self.inner.get_value(session_id, namespace, key, context)

    async def scan_values(self, session_id: str, namespace: str, key_prefix: str, context: Context) -> list[ValueRow]:
        self.reads.append(("scan", namespace, key_prefix))
        return await self.inner.scan_values(session_id, namespace, key_prefix, context)

    async def read_list(
        self, session_id: str, namespace: str, key: str, after_seq: int | None, limit: int, context: Context
    ) -> list[ValueRow]:
        self.reads.append(("list", namespace, key))
        return await self.inner.read_list(session_id, namespace, key, after_seq, limit, context)

    async def commit(
        self, session_id: str, writes: Sequence[Write], claim: Claim | None, context: Context
    ) -> CommitResult:
        if self.fail_next_commit is not None:
            error, self.fail_next_commit = self.fail_next_commit, None
            raise error
        result = await self.inner.commit(session_id, writes, claim, context)
        self.commits.append(list(writes))
        return result

    def namespaces_read(self) -> set[str]:
        return {read[1] for read in self.reads if read[0] in ("value", "scan", "list")}


def recording(store: Store) -> tuple[Store, RecordingBackend]:
    """A second Store over the same database whose backend records reads and commits."""
    backend = RecordingBackend(store.backend)
    return Store(backend, store.url), backend


async def attach(session: Session, context: Context, **options: Any) -> tuple[AgentHarness, list[OpenOperation]]:
    return await AgentHarness.create(AgentHarnessOptions(session=session, **options), context)


async def harness_with_lane(store: Store, context: Context, **options: Any) -> AgentHarness:
    """A new session with lane `main` (configured with `CONFIG`) and a harness attached to it."""
    session = await store.create_session(context)
    await session.create_lane("main", CONFIG, context)
    harness, _ = await attach(session, context, **options)
    return harness


def record_events(harness: AgentHarness) -> list[HarnessEvent]:
    """Every event delivered to a listener registered now, in delivery order."""
    seen: list[HarnessEvent] = []
    harness.add_listener(lambda event, context: seen.append(event))
    return seen


def said(text: str) -> UserMessage:
    return UserMessage(content=text, timestamp=0)
