"""What every SDK-backed adapter shares: the read loop the caller's Context can abort, the fold of
one reply's events, SDK clients cached per event loop, and API keys.

An adapter supplies two things to `stream_reply`: how to open the SDK stream (the HTTP request)
and a `StreamParser` that turns the SDK's stream items into protocol events. `stream_reply` does
the rest the `Provider` protocol promises: a `start` event first, exactly one `done` or `error`
event last, never an exception once started, and an abort of the HTTP request, ending in stop
reason `aborted` with the partial content, when the Context is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar

from harness.context import Context
from harness.providers.errors import classify_exception
from harness.providers.protocol import (
    AssistantStreamAccumulator,
    DoneEvent,
    ErrorEvent,
    Model,
    ProviderErrorInfo,
    StartEvent,
    StreamEvent,
    StreamFrame,
    StreamOptions,
)

T = TypeVar("T")
ChunkT = TypeVar("ChunkT")
ChunkT_co = TypeVar("ChunkT_co", covariant=True)
ChunkT_contra = TypeVar("ChunkT_contra", contravariant=True)
ClientT = TypeVar("ClientT")

Finish: TypeAlias = Literal["stop", "length", "tool_use"]
Outcome: TypeAlias = Finish | ProviderErrorInfo
"""How a stream ended: a normal stop reason, or the failure that ended it."""


class StreamParser(Protocol[ChunkT_contra]):
    """Turns one SDK's stream items into protocol events; it numbers the content blocks itself."""

    def feed(self, chunk: ChunkT_contra) -> list[StreamFrame]:
        """The events one stream item contributes (often none)."""
        ...

    def finish(self) -> tuple[list[StreamFrame], Outcome]:
        """After the last item: the events that close blocks still open, and how the reply ended
        (a stream that stopped without its terminal item ends in a retryable failure)."""
        ...


class SdkStream(Protocol[ChunkT_co]):
    """An SDK's open streaming response (`openai.AsyncStream`, `anthropic.AsyncStream`)."""

    def __aiter__(self) -> AsyncIterator[ChunkT_co]: ...

    async def close(self) -> None: ...


async def stream_reply(
    model: Model,
    context: Context,
    open_stream: Callable[[], Awaitable[SdkStream[ChunkT]]],
    parser: StreamParser[ChunkT],
) -> AsyncIterator[StreamEvent]:
    """Stream one reply: `start`, the parser's events, then exactly one `done` or `error`.

    `open_stream` sends the request and returns the SDK stream once the response headers are in
    (an HTTP error status raises there). Never raises: a failure at any point becomes an `error`
    event classified by `classify_exception`, holding whatever content had arrived. Cancelling
    `context` aborts the request or the read in progress (the SDK drops the connection) and ends
    with stop reason `aborted`.
    """
    reply = Reply(model)
    yield reply.start()
    guard = _AbortGuard(context)
    stream: SdkStream[ChunkT] | None = None
    try:
        stream = await guard.run(open_stream())
        chunks = aiter(stream)
        while True:
            try:
                chunk = await guard.run(anext(chunks))
            except StopAsyncIteration:
                break
            for frame in parser.feed(chunk):
                yield reply.emit(frame)
        frames, outcome = parser.finish()
        for frame in frames:
            yield reply.emit(frame)
        yield reply.end(outcome)
    except _Aborted:
        reason = context.cancel_reason or "cancelled"
        yield reply.end(ProviderErrorInfo(kind="aborted", message=f"the request was aborted ({reason})"))
    except Exception as error:
        yield reply.end(classify_exception(error))
    finally:
        guard.close()
        if stream is not None:
            # Closing releases the connection; the reply has already ended either way.
            with contextlib.suppress(Exception):
                await stream.close()


class Reply:
    """One reply as it streams: every event passes through `emit`, which folds it into the
    reply's `AssistantStreamAccumulator`, and `end` builds the terminal event."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self.accumulator = AssistantStreamAccumulator(api=model.api, provider=model.provider, model=model.id)

    def start(self) -> StartEvent:
        event = StartEvent(api=self._model.api, provider=self._model.provider, model=self._model.id)
        self.accumulator.apply(event)
        return event

    def emit(self, frame: StreamFrame) -> StreamFrame:
        """Fold `frame` in and hand it back for yielding."""
        self.accumulator.apply(frame)
        return frame

    def end(self, outcome: Outcome) -> DoneEvent | ErrorEvent:
        """`done` with the complete reply, or `error` with the partial one: stop reason `aborted`
        for an abort, else `error`, and the failure's text as `error_message`."""
        if isinstance(outcome, ProviderErrorInfo):
            stop_reason: Literal["error", "aborted"] = "aborted" if outcome.kind == "aborted" else "error"
            message = self.accumulator.message(stop_reason, error_message=outcome.message)
            return ErrorEvent(message=message, error=outcome)
        return DoneEvent(message=self.accumulator.message(outcome))


class _Aborted(Exception):
    """The caller's Context was cancelled before or during a read."""


class _AbortGuard:
    """Lets the caller's Context abort the awaits made through `run`.

    If the Context is cancelled while a `run` is pending, the task awaiting it is cancelled right
    there, so the SDK drops the HTTP request, and `run` raises `_Aborted` instead of
    `CancelledError`. This costs nothing per read, unlike racing every read against the Context.
    A cancellation of the task by anyone else still propagates as `CancelledError`.
    """

    def __init__(self, context: Context) -> None:
        self._context = context
        self._reading: asyncio.Task[Any] | None = None
        self._cancel_sent = False
        self._watcher = context.cancellation()
        self._watcher.add_done_callback(self._on_cancel)

    async def run(self, awaitable: Awaitable[T]) -> T:
        if self._context.cancelled:
            _discard(awaitable)
            raise _Aborted
        task = asyncio.current_task()
        assert task is not None, "stream_reply runs inside an asyncio task"
        baseline = task.cancelling()
        self._reading = task
        try:
            result = await awaitable
        except BaseException:
            if self._take_cancel(task, baseline):
                raise _Aborted from None
            raise
        finally:
            self._reading = None
        if self._take_cancel(task, baseline):
            raise _Aborted
        return result

    def close(self) -> None:
        self._watcher.remove_done_callback(self._on_cancel)
        self._watcher.cancel()

    def _on_cancel(self, watcher: asyncio.Future[None]) -> None:
        if watcher.cancelled() or self._reading is None or self._cancel_sent:
            return
        self._cancel_sent = True
        self._reading.cancel("the caller's Context was cancelled")

    def _take_cancel(self, task: asyncio.Task[Any], baseline: int) -> bool:
        """Whether this guard cancelled `task` and no one else did too (then it is an abort)."""
        if not self._cancel_sent:
            return False
        self._cancel_sent = False
        return task.uncancel() <= baseline


def _discard(awaitable: Awaitable[Any]) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()


class ClientCache(Generic[ClientT]):
    """SDK clients by `(base_url, api_key)`, kept per event loop: a client's connection pool
    belongs to the loop that opened it. Entries of closed loops are dropped."""

    def __init__(self, factory: Callable[[str | None, str | None], ClientT]) -> None:
        self._factory = factory
        self._by_loop: dict[asyncio.AbstractEventLoop, dict[tuple[str | None, str | None], ClientT]] = {}

    def get(self, base_url: str | None, api_key: str | None) -> ClientT:
        """The client for this loop, base URL (None: the SDK's default and environment) and key."""
        for closed in [loop for loop in self._by_loop if loop.is_closed()]:
            del self._by_loop[closed]
        clients = self._by_loop.setdefault(asyncio.get_running_loop(), {})
        key = (base_url, api_key)
        client = clients.get(key)
        if client is None:
            client = clients[key] = self._factory(base_url, api_key)
        return client


def resolve_api_key(model: Model, options: StreamOptions) -> str | None:
    """`options.api_key`, else the environment variable `model.api_key_env` names, else None
    (the SDK then reads its own default variable)."""
    if options.api_key:
        return options.api_key
    if model.api_key_env:
        return os.environ.get(model.api_key_env) or None
    return None
