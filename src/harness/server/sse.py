"""The SSE framing the hand-written streams share (the AI SDK's and the LangGraph door's): each
event's `data:` is its JSON, compact and unescaped."""

from __future__ import annotations

import json

from fastapi.sse import format_sse_event
from pydantic import JsonValue


def json_text(value: JsonValue) -> str:
    """`value` as compact JSON, non-ASCII text kept as it is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def json_event(data: JsonValue, *, event: str | None = None, event_id: str | None = None) -> bytes:
    """One SSE event whose `data:` is `data` as compact JSON."""
    return format_sse_event(data_str=json_text(data), event=event, id=event_id)
