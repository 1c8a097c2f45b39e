"""How the long-running commands (`harness serve`, `harness worker`) log: the standard `logging`
module to stderr, as text lines or as one JSON object per line (`--log-format json`, issue 29)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Annotated

import typer

LogFormatOption = Annotated[
    str,
    typer.Option("--log-format", metavar="FORMAT",
                 help="How log lines are written to stderr: `text`, or `json` (one JSON object per line: time, "
                      "level, logger, message and the line's fields, such as conversation_id, operation_id, "
                      "outcome, route, status, duration_ms, user)."),
]

VERBOSE_LOGGERS = ("harness", "uvicorn")
"""The loggers that log at INFO (a request, a turn, a claim); every other library logs its
warnings only (httpx would otherwise log every provider request)."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The attributes every LogRecord has; whatever else a record carries came from `extra=` and is
# one of the line's fields.
_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: `time` (ISO 8601, UTC), `level`, `logger`, `message`, then each
    field the record was given with `extra=`, and `exception` (the traceback) when it has one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update((key, value) for key, value in record.__dict__.items() if key not in _RECORD_ATTRIBUTES)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure_logging(log_format: str) -> None:
    """Send log records to stderr in `log_format` (`text` or `json`; anything else is a
    `typer.BadParameter`), at INFO for `VERBOSE_LOGGERS` and WARNING for the rest."""
    if log_format not in ("text", "json"):
        raise typer.BadParameter("text or json", param_hint="--log-format")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in VERBOSE_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
