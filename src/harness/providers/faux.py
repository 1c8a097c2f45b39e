"""A scripted provider for tests: replies stream token by token through the provider protocol.

```python
gate = asyncio.Event()
faux = FauxProvider([
    reply(thinking("plan", signature="sig-1"), tool_call("read", {"path": "a.txt"})),
    reply("Done after ", delay(gate), "the wait."),   # waits for gate.set() or Context cancellation
    failure("retryable", "overloaded", "partial text", status=529, retry_after_ms=1000),
    deferred("job-1"),
], polls={"job-1": [deferred("job-1"), "the late answer"]})
registry = ModelRegistry([FAUX_MODEL], providers={"faux": faux})
```

A script is a list of replies, used one per request in order, or a function of the request. A
plain string is a text reply. Every request is recorded in `requests` (polls in `polls`, cancels
in `cancelled`) for assertions.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from pydantic import JsonValue

from harness.context import Context
from harness.messages import MESSAGE_ADAPTER, Message, Usage
from harness.providers.protocol import (
    DoneEvent,
    ErrorKind,
    Model,
    ProviderErrorInfo,
    ProviderRequest,
    StreamEvent,
    StreamFrame,
    StreamOptions,
    TextDeltaEvent,
    TextEndEvent,
    TextStartEvent,
    ThinkingDeltaEvent,
    ThinkingEndEvent,
    ThinkingStartEvent,
    ToolCallDeltaEvent,
    ToolCallEndEvent,
    ToolCallStartEvent,
    UsageEvent,
    usage_with_cost,
)
from harness.providers.streaming import Reply

FAUX_MODEL = Model(id="faux", provider="faux", api="faux", name="Scripted test model")
"""A model served by the `faux` api, for registries in tests."""


@dataclass(frozen=True)
class FauxText:
    text: str


@dataclass(frozen=True)
class FauxThinking:
    text: str
    signature: str | None = None
    redacted: bool = False


@dataclass(frozen=True)
class FauxToolCall:
    """A tool call whose argument text is `raw` verbatim when given (malformed text included),
    else `arguments` as JSON. `id` None gets `faux-call-{reply number}-{position}`."""

    name: str
    arguments: dict[str, JsonValue]
    raw: str | None = None
    id: str | None = None


@dataclass(frozen=True)
class FauxDelay:
    """A pause in the stream until `until` is set or `seconds` pass, whichever comes first; a
    cancelled Context ends it at once with an aborted reply. `reached` is set when the stream gets
    here, so a test can act while the reply is in flight."""

    until: asyncio.Event | None = None
    seconds: float | None = None
    reached: asyncio.Event = field(default_factory=asyncio.Event, compare=False)


FauxPart: TypeAlias = FauxText | FauxThinking | FauxToolCall | FauxDelay


@dataclass(frozen=True)
class FauxReply:
    """One scripted reply: `parts` streamed in order, then how it ends.

    It ends with `error` if set (stop reason `aborted` for kind `aborted`, else `error`), with stop
    reason `deferred` if `deferred_id` is set, else with `stop_reason` (None: `tool_use` when it
    has a tool call, else `stop`). Its usage event comes just before that end, with response id
    `faux-{number}`; `usage` None estimates it: input tokens are the request's JSON length / 4
    (0 for a poll), output tokens the number of deltas, priced at the model's cost.

    `deltas` is how a block's text (a text, thinking or tool call's arguments) is cut: `word`, a
    delta per word with the whitespace after it, as a streaming model sends tokens; `block`, the
    whole text in one delta, as a model asked without streaming answers (the benchmark's peers'
    scripted models do), and all of the reply's frames at once: the stream yields to other tasks
    before its first frame only, where `word` yields before each frame (a `FauxDelay` always waits).
    """

    parts: tuple[FauxPart, ...] = ()
    stop_reason: Literal["stop", "length", "tool_use"] | None = None
    usage: Usage | None = None
    error: ProviderErrorInfo | None = None
    deferred_id: str | None = None
    deltas: Literal["word", "block"] = "word"


def _part(part: FauxPart | str) -> FauxPart:
    return FauxText(part) if isinstance(part, str) else part


def reply(
    *parts: FauxPart | str,
    stop_reason: Literal["stop", "length", "tool_use"] | None = None,
    usage: Usage | None = None,
    deltas: Literal["word", "block"] = "word",
) -> FauxReply:
    """A reply streaming `parts` in order; a string is text. `deltas` as `FauxReply.deltas`."""
    return FauxReply(tuple(_part(part) for part in parts), stop_reason=stop_reason, usage=usage, deltas=deltas)


def thinking(text: str, *, signature: str | None = None, redacted: bool = False) -> FauxThinking:
    """A thinking block; `signature` is the replay token its end event carries."""
    return FauxThinking(text, signature, redacted)


def tool_call(
    name: str, arguments: dict[str, JsonValue] | None = None, *, raw: str | None = None, id: str | None = None
) -> FauxToolCall:
    """A call of tool `name`; `raw` streams that argument text instead of `arguments` (e.g. `'{"a": '`
    for malformed arguments, `''` for none)."""
    return FauxToolCall(name, arguments or {}, raw, id)


def delay(until: asyncio.Event | float) -> FauxDelay:
    """A pause until the event is set, or for that many seconds."""
    if isinstance(until, asyncio.Event):
        return FauxDelay(until=until)
    return FauxDelay(seconds=until)


def failure(
    kind: ErrorKind, message: str, *parts: FauxPart | str, status: int | None = None, retry_after_ms: int | None = None
) -> FauxReply:
    """A reply that streams `parts` and then fails with `ProviderErrorInfo(kind, message, ...)`."""
    error = ProviderErrorInfo(kind=kind, message=message, status=status, retry_after_ms=retry_after_ms)
    return FauxReply(tuple(_part(part) for part in parts), error=error)


def deferred(deferred_id: str, *parts: FauxPart | str, usage: Usage | None = None) -> FauxReply:
    """A reply that streams `parts` and ends with stop reason `deferred` under `deferred_id` (HA-27)."""
    return FauxReply(tuple(_part(part) for part in parts), usage=usage, deferred_id=deferred_id)


@dataclass(frozen=True)
class FauxRequest:
    """A recorded `stream` call; `number` counts every request and poll of the provider from 1."""

    number: int
    model: Model
    request: ProviderRequest
    options: StreamOptions


@dataclass(frozen=True)
class FauxPoll:
    """A recorded `poll` call."""

    number: int
    model: Model
    deferred_id: str
    options: StreamOptions


FauxScript: TypeAlias = Iterable[FauxReply | str] | Callable[[FauxRequest], FauxReply | str]


class FauxProvider:
    """A `DeferredProvider` that answers from a script (see the module docstring).

    When a list script is used up, or a poll has no scripted outcome, the stream ends with an
    `ErrorEvent` of kind `other` saying so. Cancelling the Context ends a stream at its next token
    or during a delay with an aborted reply holding the content streamed so far.
    """

    def __init__(
        self, script: FauxScript = (), *, polls: Mapping[str, Iterable[FauxReply | str]] | None = None
    ) -> None:
        self._script: Callable[[FauxRequest], FauxReply | str] | None = None
        self._replies: deque[FauxReply | str] = deque()
        if callable(script):
            self._script = script
        else:
            self._replies.extend(script)
        self._poll_outcomes: dict[str, deque[FauxReply | str]] = {
            deferred_id: deque(outcomes) for deferred_id, outcomes in (polls or {}).items()
        }
        self.requests: list[FauxRequest] = []
        self.polls: list[FauxPoll] = []
        self.cancelled: list[str] = []
        self._count = 0
        # JSON length of each message seen, by identity (the message is kept, so its id is not
        # reused): a conversation's requests repeat its messages, and serializing all of them
        # again for every request would make the scripted model's cost grow with history.
        self._message_chars: dict[int, tuple[Message, int]] = {}

    def push(self, *replies: FauxReply | str) -> None:
        """Append replies to a list script."""
        if self._script is not None:
            raise TypeError("this FauxProvider answers from a function; it has no reply list to extend")
        self._replies.extend(replies)

    def script_polls(self, deferred_id: str, *outcomes: FauxReply | str) -> None:
        """Append what successive polls of `deferred_id` answer (a `deferred(...)` reply: still pending)."""
        self._poll_outcomes.setdefault(deferred_id, deque()).extend(outcomes)

    async def stream(
        self, model: Model, request: ProviderRequest, options: StreamOptions, context: Context
    ) -> AsyncIterator[StreamEvent]:
        """Stream the next scripted reply for `request` (see `FauxReply` for how it ends)."""
        self._count += 1
        recorded = FauxRequest(self._count, model, request, options)
        self.requests.append(recorded)
        scripted: FauxReply | str | None
        if self._script is not None:
            scripted = self._script(recorded)
        else:
            scripted = self._replies.popleft() if self._replies else None
        missing = f"faux provider: no scripted reply for request {recorded.number}"
        scripted_usage = scripted is not None and not isinstance(scripted, str) and scripted.usage is not None
        input_tokens = 0 if scripted_usage else self._request_chars(request) // 4
        async for event in _play(recorded.number, model, scripted, missing, input_tokens, context):
            yield event

    def _request_chars(self, request: ProviderRequest) -> int:
        """`len(request.model_dump_json())`, serializing each message once per provider."""
        total = len(request.model_copy(update={"messages": ()}).model_dump_json()) + max(len(request.messages) - 1, 0)
        for message in request.messages:
            known = self._message_chars.get(id(message))
            if known is None or known[0] is not message:
                known = self._message_chars[id(message)] = (message, len(MESSAGE_ADAPTER.dump_json(message)))
            total += known[1]
        return total

    async def poll(
        self, model: Model, deferred_id: str, options: StreamOptions, context: Context
    ) -> AsyncIterator[StreamEvent]:
        """Stream the next scripted outcome for `deferred_id` (HA-27)."""
        self._count += 1
        self.polls.append(FauxPoll(self._count, model, deferred_id, options))
        outcomes = self._poll_outcomes.get(deferred_id)
        scripted = outcomes.popleft() if outcomes else None
        missing = f"faux provider: no scripted poll outcome for deferred id {deferred_id!r}"
        async for event in _play(self._count, model, scripted, missing, 0, context):
            yield event

    async def cancel(self, model: Model, deferred_id: str, context: Context) -> None:
        """Record the cancellation in `cancelled`; raises nothing."""
        self.cancelled.append(deferred_id)


async def _play(
    number: int,
    model: Model,
    scripted: FauxReply | str | None,
    missing: str,
    input_tokens: int,
    context: Context,
) -> AsyncIterator[StreamEvent]:
    """Stream `scripted` as the provider's reply `number` (see `FauxReply` for how it ends)."""
    streamed = Reply(model)
    yield streamed.start()
    if scripted is None:
        yield streamed.end(ProviderErrorInfo(kind="other", message=missing))
        return
    script = reply(scripted) if isinstance(scripted, str) else scripted
    deltas = 0
    for position, item in enumerate(_frames(script, number)):
        if isinstance(item, FauxDelay):
            item.reached.set()
            await _wait(item, context)
        elif script.deltas == "word" or position == 0:
            # A yield point per token, as a network stream has: other tasks (an abort, a
            # watcher) run while the reply streams. A reply asked without streaming comes in
            # one read: one yield point, before its first frame.
            await asyncio.sleep(0)
        if context.cancelled:
            reason = context.cancel_reason or "cancelled"
            yield streamed.end(ProviderErrorInfo(kind="aborted", message=f"the request was aborted ({reason})"))
            return
        if not isinstance(item, FauxDelay):
            deltas += isinstance(item, TextDeltaEvent | ThinkingDeltaEvent | ToolCallDeltaEvent)
            yield streamed.emit(item)
    usage = script.usage or usage_with_cost(model, Usage(input=input_tokens, output=deltas))
    yield streamed.emit(UsageEvent(usage=usage, response_id=f"faux-{number}"))
    if script.error is not None:
        yield streamed.end(script.error)
    elif script.deferred_id is not None:
        yield DoneEvent(message=streamed.accumulator.message("deferred", deferred_id=script.deferred_id))
    else:
        has_call = any(isinstance(part, FauxToolCall) for part in script.parts)
        yield streamed.end(script.stop_reason or ("tool_use" if has_call else "stop"))


_TOKEN = re.compile(r"\S+\s*|\s+")


def _tokens(text: str) -> list[str]:
    """`text` in word-sized pieces (each word with the whitespace after it) that join back to it."""
    return _TOKEN.findall(text)


def _frames(script: FauxReply, number: int) -> Iterator[StreamFrame | FauxDelay]:
    cut: Callable[[str], list[str]] = _tokens if script.deltas == "word" else lambda text: [text] if text else []
    index = 0
    for position, part in enumerate(script.parts):
        match part:
            case FauxDelay():
                yield part
                continue
            case FauxText(text=text):
                yield TextStartEvent(content_index=index)
                yield from (TextDeltaEvent(content_index=index, delta=token) for token in cut(text))
                yield TextEndEvent(content_index=index)
            case FauxThinking(text=text, signature=signature, redacted=redacted):
                yield ThinkingStartEvent(content_index=index, redacted=redacted)
                yield from (ThinkingDeltaEvent(content_index=index, delta=token) for token in cut(text))
                yield ThinkingEndEvent(content_index=index, signature=signature)
            case FauxToolCall(name=name, arguments=arguments, raw=raw, id=call_id):
                text = raw if raw is not None else json.dumps(arguments)
                yield ToolCallStartEvent(content_index=index, id=call_id or f"faux-call-{number}-{position}", name=name)
                yield from (ToolCallDeltaEvent(content_index=index, delta=token) for token in cut(text))
                yield ToolCallEndEvent(content_index=index)
        index += 1


async def _wait(pause: FauxDelay, context: Context) -> None:
    """Wait until `pause` is over or `context` is cancelled."""
    waiters: list[asyncio.Future[Any]] = [context.cancellation()]
    if pause.until is not None:
        waiters.append(asyncio.ensure_future(pause.until.wait()))
    try:
        await asyncio.wait(waiters, timeout=pause.seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
