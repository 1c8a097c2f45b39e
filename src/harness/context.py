"""Context: the caller's per-invocation cancellation signal and telemetry attributes (HA-22).

A Context is passed explicitly as the last argument of every public call. It is never stored:
receivers keep no reference to it past the call, and the journal refuses to encode one.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import NoReturn

from harness.errors import Cancelled, ContextNotStorable, InvalidInput

TelemetryValue = str | int | float | bool


class Context:
    """One invocation's cancellation signal and telemetry attributes.

    `cancel(reason)` is a local, in-memory signal for this invocation only; it is distinct from a
    durable abort request written to the journal (HA-22). `child()` makes a Context that is
    cancelled when its parent is, and may also be cancelled on its own.
    """

    __slots__ = ("__weakref__", "_cancel_reason", "_cancelled", "_children", "_waiters", "attributes")

    def __init__(self, attributes: Mapping[str, TelemetryValue] | None = None) -> None:
        self.attributes: dict[str, TelemetryValue] = dict(attributes or {})
        self._cancelled = False
        self._cancel_reason: str | None = None
        self._waiters: list[asyncio.Future[None]] = []
        # Weak: a long-lived parent must not keep every finished child alive.
        self._children: weakref.WeakSet[Context] = weakref.WeakSet()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def cancel_reason(self) -> str | None:
        return self._cancel_reason

    def cancel(self, reason: str = "cancelled") -> None:
        """Signal cancellation to everything waiting on this Context and its children; idempotent."""
        if self._cancelled:
            return
        self._cancelled = True
        self._cancel_reason = reason
        for waiter in self._waiters:
            if not waiter.done():
                waiter.get_loop().call_soon_threadsafe(_resolve, waiter)
        self._waiters.clear()
        for child in list(self._children):
            child.cancel(reason)

    def child(self, **attributes: TelemetryValue) -> Context:
        """A Context with these extra attributes, cancelled whenever this one is."""
        child = Context({**self.attributes, **attributes})
        if self._cancelled:
            child.cancel(self._cancel_reason or "cancelled")
        else:
            self._children.add(child)
        return child

    def raise_if_cancelled(self) -> None:
        """Raise `Cancelled` if this invocation was cancelled."""
        if self._cancelled:
            raise Cancelled(f"invocation cancelled: {self._cancel_reason}", reason=self._cancel_reason)

    async def wait_cancelled(self) -> None:
        """Return once this Context is cancelled (at once if it already is)."""
        await self.cancellation()

    def cancellation(self) -> asyncio.Future[None]:
        """A future of the running loop, done once this Context is cancelled (already done if it
        is); cancel it to stop waiting. Racing it against other work (`asyncio.wait`) needs no
        task of its own, as racing `wait_cancelled()` does."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._cancelled:
            waiter.set_result(None)
            return waiter
        self._waiters.append(waiter)
        waiter.add_done_callback(self._forget)
        return waiter

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def __reduce__(self) -> NoReturn:
        raise ContextNotStorable("a Context is per-invocation and is never stored or pickled (HA-22)")

    def __repr__(self) -> str:
        state = f"cancelled={self._cancel_reason!r}" if self._cancelled else "active"
        return f"Context({state}, attributes={self.attributes!r})"


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class NotAContext(InvalidInput):
    """A public call was given something other than a `Context` as its context (HA-22)."""

    code = "invalid_context"


def check_context(context: object) -> None:
    """Raise `NotAContext` unless `context` is a `Context`; called before anything is touched."""
    if not isinstance(context, Context):
        raise NotAContext(f"the last argument must be a harness Context, not {type(context).__name__}",
                          given=type(context).__name__)
