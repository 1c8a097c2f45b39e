"""Error types with stable machine-readable codes, shared by every layer."""

from __future__ import annotations

from typing import ClassVar

from pydantic import JsonValue


class HarnessError(Exception):
    """Base of every error a caller can act on: a stable `code` and typed JSON `details`."""

    code: ClassVar[str] = "harness_error"

    def __init__(self, message: str, **details: JsonValue) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, JsonValue] = details

    def to_json(self) -> dict[str, JsonValue]:
        """`{code, message, details}` for wire formats and logs."""
        return {"code": self.code, "message": self.message, "details": self.details}


class Cancelled(HarnessError):
    """The caller's Context was cancelled; this is not a durable abort (HA-22)."""

    code = "cancelled"


class ContextNotStorable(HarnessError, TypeError):
    """Something tried to store or serialize a Context; it is never durable data (HA-22)."""

    code = "context_not_storable"


class InvalidInput(HarnessError, ValueError):
    """Caller input was malformed; nothing was written."""

    code = "invalid_input"


class ModelUnavailable(HarnessError):
    """A model identity resolves to no configured model (HA-23); details `{provider, model_id}`."""

    code = "model_unavailable"

    def __init__(self, provider: str, model_id: str, *, reason: str | None = None) -> None:
        text = f"model {provider}/{model_id} is not available" + (f": {reason}" if reason else "")
        super().__init__(text, provider=provider, model_id=model_id)


class ToolsUnavailable(HarnessError):
    """Configured active tools have no implementation here (HA-23); details `{tools}`."""

    code = "configured_tools_unavailable"

    def __init__(self, tools: list[str]) -> None:
        super().__init__(f"configured tools are not available: {', '.join(tools)}", tools=list(tools))


class UnsupportedFormat(HarnessError):
    """An import file is not in a format this version reads; nothing was written."""

    code = "unsupported_format"
