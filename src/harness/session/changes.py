"""Wake-ups when a session of a store may have changed, for readers that do not hold it
(`Store.changes`): on PostgreSQL every commit notifies the store's change channel with its session id
inside its transaction, and one listening connection per store fans the notifications out by
session id; elsewhere (memory, SQLite) a commit made through the store wakes this process's
readers of its session at once, while another process's commit notifies nobody and a
subscriber's wait times out, so it polls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from harness.errors import HarnessError

logger = logging.getLogger(__name__)

Change = tuple[str, tuple[str, ...] | None]
"""A notification: the session id, and the namespaces the commit wrote among those the store tags
(`Store.tag`), or None for any change of the session."""

Listen = Callable[[], AsyncIterator[Change]]
"""The `Change`s a store's channels carry, from one dedicated connection, until the caller stops
iterating, after a first `("", None)` once it listens; a `HarnessError` (`StoreConnectionLost` as
a rule) when that connection drops."""

RECONNECT_S = 1.0
"""How long a change feed waits before it listens again after its connection dropped."""

LINGER_S = 30.0
"""How long a change feed keeps listening after its last subscriber left (seconds): a process that
holds conversations one after another (a server admitting turns for workers, a worker) would
otherwise open a listening connection for each."""


class ChangeSubscription:
    """The wake-ups of one session for one reader (`ChangeFeed.subscribe`); `close` it when done."""

    def __init__(self, feed: ChangeFeed, session_id: str, namespace: str | None) -> None:
        self.session_id = session_id
        self.namespace = namespace
        self._feed = feed
        self._changed = asyncio.Event()

    def wake(self) -> None:
        """End the current (or next) wait now, as a notification would."""
        self._changed.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait until the session may have changed since the last wait returned, at most
        `timeout_s` seconds. True on a notification (or the feed's reconnection, after which
        anything may have changed), False when the time ran out: the caller reads anyway, since
        a notification can be lost while the listening connection is down."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        notified = self._changed.is_set()
        self._changed.clear()
        return notified

    def close(self) -> None:
        """Stop the wake-ups; idempotent."""
        self._feed._unsubscribe(self)


class ChangeFeed:
    """The change notifications of one store, shared by all of its readers in this process: one
    listening connection from the first subscriber until `LINGER_S` after the last (none before),
    each notification handed to the subscribers of its session id. Without `listen` (memory,
    SQLite) it notifies nobody and subscribers poll."""

    def __init__(self, listen: Listen | None) -> None:
        self._listen = listen
        self._subscribers: dict[str, set[ChangeSubscription]] = {}
        self._task: asyncio.Task[None] | None = None
        self._quiet: asyncio.TimerHandle | None = None  # stops the listening once no one subscribed

    @property
    def notifies(self) -> bool:
        """Whether commits of other processes wake this feed's subscribers (PostgreSQL only)."""
        return self._listen is not None

    def subscribe(self, session_id: str, *, namespace: str | None = None) -> ChangeSubscription:
        """Wake-ups for `session_id` from now on; with `namespace` (one the store tags,
        `Store.tag`), only for commits that wrote it where the database says which (PostgreSQL;
        elsewhere for every commit of this process). The listening connection starts with the
        first subscriber, so a notification sent before its LISTEN ran is not seen: read after
        subscribing, not before, and poll."""
        subscription = ChangeSubscription(self, session_id, namespace)
        self._subscribers.setdefault(session_id, set()).add(subscription)
        if self._quiet is not None:
            self._quiet.cancel()
            self._quiet = None
        if self._listen is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(self._listen))
        return subscription

    def committed(self, session_id: str) -> None:
        """A commit to `session_id` was made in this process: wake its subscribers now where the
        database does not notify (memory, SQLite); on PostgreSQL the commit's own notification
        wakes them, and a second wake would cost each a second, empty read."""
        if self.notifies:
            return
        for subscription in list(self._subscribers.get(session_id, ())):
            subscription.wake()

    def _unsubscribe(self, subscription: ChangeSubscription) -> None:
        subscribers = self._subscribers.get(subscription.session_id)
        if subscribers is None:
            return
        subscribers.discard(subscription)
        if not subscribers:
            del self._subscribers[subscription.session_id]
        if not self._subscribers and self._task is not None and self._quiet is None:
            self._quiet = self._task.get_loop().call_later(LINGER_S, self._stop_listening)

    def _stop_listening(self) -> None:
        self._quiet = None
        if not self._subscribers and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self, listen: Listen) -> None:
        while True:
            try:
                async for session_id, namespaces in listen():
                    if session_id:
                        for subscription in list(self._subscribers.get(session_id, ())):
                            if subscription.namespace is None if namespaces is None else (
                                    subscription.namespace in namespaces):
                                subscription.wake()
                    else:
                        self._notify_all()  # listening now; what came before it is unknown
            except HarnessError as error:  # the server went away or refused: listen again later
                logger.warning("the change feed's listening connection dropped: %s", error)
            await asyncio.sleep(RECONNECT_S)

    def _notify_all(self) -> None:
        for subscribers in list(self._subscribers.values()):
            for subscription in list(subscribers):
                subscription.wake()

    async def close(self) -> None:
        """Stop listening; subscribers left only time out from now on. Idempotent."""
        task, self._task, self._listen = self._task, None, None
        if self._quiet is not None:
            self._quiet.cancel()
            self._quiet = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
