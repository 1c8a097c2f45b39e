"""A run's spans by the OpenTelemetry semantic conventions for generative AI, through
`opentelemetry-api` alone: without an SDK the API's tracer is a no-op, and each drive pass makes one
span that does not record and nothing more.

With an SDK (`opentelemetry-sdk` with any exporter, Logfire) a run is one trace:

    accept_run                       the admission; its context is stored with the run (`traceparent`)
    └─ invoke_agent {agent}          one per drive pass, in whichever process drives it
       ├─ chat {model}               one per provider request
       └─ execute_tool {tool}        one per tool execution

A pass that continues a run (after a crash, a pause or a retry wait, in another worker) is a child
of the stored context like the first, marked `harness.resumed`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from harness.messages import AssistantMessage, ModelIdentity, StopReason, ToolResultMessage
from harness.providers import Model, ProviderErrorInfo
from harness.runtime.outcomes import DriveOutcome, Settled

# A proxy until the application installs a provider, and that provider's tracer after.
_TRACER = trace.get_tracer("harness")
_PROPAGATOR = TraceContextTextMapPropagator()

# The conventions name finish reasons by OpenAI's words; ours are the journal's stop reasons.
_FINISH_REASONS: dict[StopReason, str] = {"tool_use": "tool_call"}


def admission(lane: str) -> AbstractContextManager[str | None]:
    """The span `accept_run` around a run's acceptance on `lane`, under the caller's current span;
    yields its W3C traceparent for the operation's record, or None when nothing records (no SDK,
    or not sampled): the run's passes then start traces of their own."""
    span = _TRACER.start_span("accept_run", kind=SpanKind.INTERNAL)
    return _admitting(span, lane) if span.is_recording() else _NOTHING


@contextmanager
def _admitting(span: Span, lane: str) -> Iterator[str | None]:
    span.set_attribute("harness.lane", lane)
    with trace.use_span(span, end_on_exit=True):
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        yield carrier.get("traceparent")


def drive_pass(*, agent: str, conversation_id: str, lane: str, operation_id: str, model: ModelIdentity,
               traceparent: str | None, resumed: bool) -> PassTrace:
    """Start the span `invoke_agent {agent}` of a pass driving run `operation_id` on the lane's
    `model`: a child of the run's stored `traceparent` (None: the root of a trace of its own),
    `resumed` when an earlier pass began the run."""
    # Never the drive task's current context: it is whichever caller's started the task.
    parent = otel_context.Context()
    if traceparent is not None:
        parent = _PROPAGATOR.extract({"traceparent": traceparent}, parent)
    span = _TRACER.start_span(f"invoke_agent {agent}", parent, kind=SpanKind.INTERNAL)
    if span.is_recording():
        span.set_attributes({
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
            "gen_ai.provider.name": model.provider, "gen_ai.request.model": model.model_id,
            "gen_ai.conversation.id": conversation_id, "harness.lane": lane,
            "harness.operation_id": operation_id, "harness.resumed": resumed})
    return PassTrace(span, conversation_id)


class PassTrace:
    """The spans of one drive pass of a run (`drive_pass`): `invoke_agent {agent}` and under it
    the pass's `chat` and `execute_tool` spans. `recording` False (no SDK, or not a run): every
    method does nothing."""

    def __init__(self, span: Span, conversation_id: str) -> None:
        self.span = span
        self.recording = span.is_recording()
        self._context = trace.set_span_in_context(span) if self.recording else None
        self._conversation_id = conversation_id
        self._input_tokens = self._output_tokens = 0

    def current(self) -> AbstractContextManager[object]:
        """The pass's span as the current one, so spans others make meanwhile (an instrumented
        HTTP client, a tool's own) nest under it."""
        return trace.use_span(self.span) if self.recording else _NOTHING

    def end(self, outcome: DriveOutcome | None, error: BaseException | None = None) -> None:
        """End the pass's span with how the pass ended: settled (`harness.run.outcome`), another
        outcome (`harness.drive.outcome`: paused, suspended, waiting_retry) or `error`."""
        if not self.recording:
            return
        span = self.span
        span.set_attributes({"gen_ai.usage.input_tokens": self._input_tokens,
                             "gen_ai.usage.output_tokens": self._output_tokens})
        if isinstance(outcome, Settled):
            span.set_attribute("harness.run.outcome", outcome.result.outcome)
            if outcome.result.error is not None:
                span.set_attribute("error.type", outcome.result.error.code)
                span.set_status(Status(StatusCode.ERROR, outcome.result.error.message))
        elif outcome is not None:
            span.set_attribute("harness.drive.outcome", outcome.kind)
        elif error is not None:
            span.set_attribute("error.type", type(error).__qualname__)
            if isinstance(error, Exception):
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()

    def chat(self, model: Model, step: int, attempt: int) -> AbstractContextManager[ChatSpan]:
        """The span `chat {model}` of one provider request, current while it streams; the caller
        gives it the reply (`ChatSpan.reply`)."""
        return self._chat(model, step, attempt) if self.recording else _NO_CHAT

    @contextmanager
    def _chat(self, model: Model, step: int, attempt: int) -> Iterator[ChatSpan]:
        span = _TRACER.start_span(f"chat {model.id}", self._context, kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": model.provider,
            # The name the conventions had before `gen_ai.provider.name`, which backends still read.
            "gen_ai.system": model.provider,
            "gen_ai.request.model": model.id, "gen_ai.conversation.id": self._conversation_id,
            "harness.step": step, "harness.attempt": attempt})
        with trace.use_span(span, end_on_exit=True):
            yield ChatSpan(self, span)

    def tool(self, name: str, call_id: str, description: str) -> AbstractContextManager[ToolSpan]:
        """The span `execute_tool {name}` of one tool execution, current while it runs; the caller
        gives it the result (`ToolSpan.result`)."""
        return self._tool(name, call_id, description) if self.recording else _NO_TOOL

    @contextmanager
    def _tool(self, name: str, call_id: str, description: str) -> Iterator[ToolSpan]:
        span = _TRACER.start_span(f"execute_tool {name}", self._context, kind=SpanKind.INTERNAL, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function", "gen_ai.tool.description": description,
            "gen_ai.conversation.id": self._conversation_id})
        with trace.use_span(span, end_on_exit=True):
            yield ToolSpan(span)

    def _count(self, input_tokens: int, output_tokens: int) -> None:
        self._input_tokens += input_tokens
        self._output_tokens += output_tokens


class ChatSpan:
    """A provider request's span in flight."""

    __slots__ = ("_pass", "_span")

    def __init__(self, owner: PassTrace | None, span: Span) -> None:
        self._pass, self._span = owner, span

    def reply(self, message: AssistantMessage, error: ProviderErrorInfo | None) -> None:
        """Record the reply: its model, id, finish reason and token usage (input counts the cached
        tokens too, as the conventions ask), and `error` as the span's error."""
        if self._pass is None:
            return
        usage = message.usage
        input_tokens = usage.input + usage.cache_read + usage.cache_write
        self._pass._count(input_tokens, usage.output)
        span = self._span
        span.set_attributes({
            "gen_ai.response.model": message.model,
            "gen_ai.response.finish_reasons": [_FINISH_REASONS.get(message.stop_reason, message.stop_reason)],
            "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": usage.output,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_write})
        if message.response_id:
            span.set_attribute("gen_ai.response.id", message.response_id)
        if error is not None:
            span.set_attribute("error.type", error.kind)
            span.set_status(Status(StatusCode.ERROR, error.message))


class ToolSpan:
    """A tool execution's span in flight."""

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def result(self, result: ToolResultMessage) -> None:
        """Record the result: an error result is the span's error (`error.type` `tool_error`)."""
        if result.is_error and self._span.is_recording():
            self._span.set_attribute("error.type", "tool_error")
            self._span.set_status(Status(StatusCode.ERROR))


# Without an SDK no generator is made: these shared context managers hold nothing between uses.
_NOTHING: AbstractContextManager[None] = nullcontext()
_NO_CHAT = nullcontext(ChatSpan(None, INVALID_SPAN))
_NO_TOOL = nullcontext(ToolSpan(INVALID_SPAN))
NO_TRACE = PassTrace(INVALID_SPAN, "")
"""The trace of a pass that makes no spans (a compaction's, a navigation's)."""
