"""The crash suite's child (`drive_crash_child.main`) with an OpenTelemetry SDK installed: every span
it ends is written at once to a file, one JSON object a line, so what it exported before it killed
itself is there for the test to read.

Run as `python traces_child.py SPANS_FILE URL SESSION_ID WORKDIR` with `HARNESS_FAULT_POINT` set.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from drive_crash_child import main


def one_line(span: ReadableSpan) -> str:
    text: str = span.to_json(indent=None)
    return text + "\n"


if __name__ == "__main__":
    with open(sys.argv[1], "a") as spans_file:
        provider = TracerProvider()
        # Simple, not batched: a span is written and flushed when it ends, before any kill.
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=spans_file, formatter=one_line)))
        trace.set_tracer_provider(provider)
        asyncio.run(main(sys.argv[2], sys.argv[3], Path(sys.argv[4])))
