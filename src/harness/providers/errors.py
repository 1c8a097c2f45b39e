"""How a failed provider request should be treated: classification into `ProviderErrorInfo`.

One place decides, for every adapter and both SDKs, whether a failure is worth retrying (rate
limits, overload, server errors, dropped connections; with the server's `retry-after`), is a
context overflow (the runtime compacts and retries once), is an authentication problem, or is a
request the server will never accept. (An abort by the caller is `aborted`; only the stream's
Context knows that, so `harness.providers.streaming` says it, not this module.)

- `classify_exception`: an exception raised by the `openai` or `anthropic` SDK (or the transport
  under it) while opening or reading a stream.
- `classify_error_payload`: an error body or in-stream error event payload, as JSON.
- `is_context_overflow`: whether an error text says the request did not fit the context window.
"""

from __future__ import annotations

import email.utils
import re
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from harness.providers.protocol import ErrorKind, ProviderErrorInfo

if TYPE_CHECKING:
    import anthropic
    import openai

    StatusError = openai.APIStatusError | anthropic.APIStatusError
    SdkError = openai.APIError | anthropic.APIError

_SDKS = ("openai", "anthropic")
_TRANSPORTS = ("httpx2", "httpx")  # the SDKs' HTTP clients; the Anthropic SDK lets their read errors through

# Texts servers use when the prompt (plus the requested output) does not fit the context window.
# Each alternative is one server family's wording; see tests/test_openai_adapters.py for samples.
_OVERFLOW_TEXT = re.compile(
    "|".join(
        [
            r"context[_ ]length[_ ]exceeded",  # the OpenAI error code, also echoed in texts
            r"maximum context length is \d+",  # OpenAI Chat Completions, vLLM, OpenRouter, DeepSeek
            r"exceeds? the context window",  # OpenAI Responses
            r"prompt is too long",  # Anthropic
            r"exceed context limit",  # Anthropic: "input length and `max_tokens` exceed context limit"
            r"input token count.*exceeds the maximum",  # Gemini
            r"input is too long for (the )?requested model",  # Amazon Bedrock
            r"maximum prompt length is \d+",  # xAI
            r"exceeds the available context size",  # llama.cpp server
            r"exceed context window of \d+",  # llama-cpp-python, the embedded model
            r"too long to fit into the model",  # vLLM
            r"longer than the maximum model length",  # vLLM
            r"too large for model with \d+ maximum context length",  # Mistral
            r"reduce the length of the messages",  # Groq
            r"tokens \+ `max_new_tokens` must be <=",  # Hugging Face text-generation-inference
        ]
    ),
    re.IGNORECASE,
)

_OVERFLOW_CODES = frozenset({"context_length_exceeded", "model_context_window_exceeded"})
# Out of credit: retrying cannot succeed until someone pays, so it is not `retryable`.
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_error"})
_RETRYABLE_CODES = frozenset(
    {
        "overloaded_error",
        "rate_limit_error",
        "rate_limit_exceeded",
        "api_error",
        "server_error",
        "internal_server_error",
        "service_unavailable",
        "timeout_error",
    }
)
_AUTHENTICATION_CODES = frozenset({"authentication_error", "permission_error", "invalid_api_key"})
_RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})


def is_context_overflow(text: str) -> bool:
    """Whether an error text says the request did not fit the model's context window (any server
    family we know of; the wording differs per server)."""
    return _OVERFLOW_TEXT.search(text) is not None


def classify_error_payload(payload: object, *, status: int | None = None) -> ProviderErrorInfo:
    """Classify an error body or an in-stream error event payload.

    `payload` is parsed JSON in any of the shapes servers send: `{"error": {...}}`, the inner
    `{"type", "code", "message", ...}` object, or `{"type": "error", "error": {...}}`; anything
    else is classified by `status` alone, with its text as the message. `status` is the HTTP
    status when there was one (a status inside the payload, `status_code` or a numeric `code`, is
    used when it is None). The message is the payload's `message`, followed by
    `metadata.raw` when a router forwards the upstream server's text there.
    """
    error = payload.get("error") if isinstance(payload, Mapping) else None
    fields: Mapping[str, object] = error if isinstance(error, Mapping) else (
        payload if isinstance(payload, Mapping) else {}
    )
    message = fields.get("message")
    text = message if isinstance(message, str) and message else _text_of(payload)
    metadata = fields.get("metadata")
    raw = metadata.get("raw") if isinstance(metadata, Mapping) else None
    if isinstance(raw, str) and raw and raw not in text:
        text = f"{text}: {raw}"
    codes = {value for key in ("type", "code") if isinstance(value := fields.get(key), str)}
    if status is None:
        status = _status_in(fields)
    return ProviderErrorInfo(kind=_kind(status, codes, text), message=text, status=status)


def classify_exception(error: BaseException) -> ProviderErrorInfo:
    """Classify an exception from the `openai` or `anthropic` SDK, or the transport under it.

    - An HTTP status error is classified by its status and body; `retry_after_ms` comes from the
      `retry-after-ms` or `retry-after` header (seconds or an HTTP date) of a retryable one.
    - An error the SDK raised for an in-stream error event (no HTTP error status: the response
      was 200) is classified by its payload alone.
    - A connection, timeout or stream-read failure (the SDKs' `APIConnectionError`, their HTTP
      client's `TransportError`, e.g. a body cut off mid-stream, or an `OSError`) is `retryable`;
      its message names the URL of the request ("cannot connect to URL: ..." when no connection
      was made, "the connection to URL failed: ..." otherwise).
    - Anything else is `context_overflow` if its text says so (a local runtime's plain exception),
      else `other` (a malformed chunk, a bug).
    """
    if isinstance(error, _loaded_classes(_SDKS, "APIStatusError")):
        status_error = cast("StatusError", error)
        status = status_error.status_code if status_error.status_code >= 400 else None
        info = classify_error_payload(status_error.body, status=status)
        if info.kind == "retryable":
            info = info.model_copy(update={"retry_after_ms": retry_after_ms(status_error.response.headers)})
        return info
    transport_errors = _loaded_classes(_TRANSPORTS, "TransportError")
    if isinstance(error, (*_loaded_classes(_SDKS, "APIConnectionError"), *transport_errors, OSError)):
        return ProviderErrorInfo(kind="retryable", message=_describe_connection(error))
    if isinstance(error, _loaded_classes(_SDKS, "APIError")):
        return classify_error_payload(cast("SdkError", error).body)
    message = _describe(error)
    # A local runtime (the embedded model) says so in plain exceptions.
    return ProviderErrorInfo(kind="context_overflow" if is_context_overflow(message) else "other", message=message)


def retry_after_ms(headers: Mapping[str, str]) -> int | None:
    """The wait a server asked for, in milliseconds: `retry-after-ms`, else `retry-after` as
    seconds or as an HTTP date. None when neither is present or parseable. `headers` should be
    case-insensitive (the SDKs' are); keys are looked up in lower case."""
    value = headers.get("retry-after-ms")
    if value is not None and (milliseconds := _number(value)) is not None:
        return max(0, round(milliseconds))
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return max(0, round(seconds * 1000))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0, round((when.timestamp() - time.time()) * 1000))


def _loaded_classes(modules: tuple[str, ...], name: str) -> tuple[type[BaseException], ...]:
    """The exception class `name` of each of `modules` imported so far. An exception from a library
    that was never imported cannot exist, and importing an SDK only to say so costs seconds."""
    return tuple(getattr(module, name) for library in modules if (module := sys.modules.get(library)) is not None)


def _kind(status: int | None, codes: set[str], text: str) -> ErrorKind:
    if codes & _OVERFLOW_CODES or is_context_overflow(text) or status == 413:
        return "context_overflow"
    if codes & _QUOTA_CODES:
        return "other"
    if codes & _AUTHENTICATION_CODES or status in (401, 403):
        return "authentication"
    if codes & _RETRYABLE_CODES or status in _RETRYABLE_STATUSES or (status is not None and status >= 500):
        return "retryable"
    if (status is not None and 400 <= status < 500) or "invalid_request_error" in codes:
        return "invalid_request"
    return "other"


def _status_in(fields: Mapping[str, object]) -> int | None:
    for key in ("status_code", "status", "code"):
        value = fields.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value < 600:
            return value
    return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _text_of(payload: object) -> str:
    if isinstance(payload, str | bytes):
        text = payload.decode(errors="replace") if isinstance(payload, bytes) else payload
        return text.strip() or "the server returned an empty error"
    return "the server returned an error without a message" if payload is None else str(payload)


def _describe_connection(error: BaseException) -> str:
    text = _describe(error)
    url = _request_url(error)
    if url is None:
        return text
    never_connected = _loaded_classes(_TRANSPORTS, "ConnectError") + _loaded_classes(_TRANSPORTS, "ConnectTimeout")
    if isinstance(error, never_connected) or isinstance(error.__cause__, never_connected):
        return f"cannot connect to {url}: {text}"
    return f"the connection to {url} failed: {text}"


def _request_url(error: BaseException) -> str | None:
    """The URL (without its query) of the request `error` or its cause was sending, if it says."""
    for candidate in (error, error.__cause__):
        try:
            request = getattr(candidate, "request", None)
        except RuntimeError:  # httpx raises when the error has no request attached
            continue
        url = getattr(request, "url", None)
        if url is not None:
            return str(url).partition("?")[0]
    return None


def _describe(error: BaseException) -> str:
    """The exception's text plus its cause's: the SDKs say only "Connection error." and keep the
    reason (e.g. an incomplete chunked read) on `__cause__`."""
    text = str(error) or type(error).__name__
    cause = error.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        return f"{text} ({type(cause).__name__}: {cause})"
    return text
