"""Structured logs: one JSON object per line, carrying the trace and span ids of the span
current when the line was logged, so a log line and its trace find each other (DESIGN 6)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the trace and span ids
    of the span current when the line was logged (absent outside any span). `process`, when
    given, names the process on every line (`memoria serve --processes N` shares one stream).
    A record's `fields` (`log.info(..., extra={"fields": {...}})`) are added to its line as
    JSON values, for what a machine reads (the start-up settings); they never replace the
    line's own keys."""

    def __init__(self, process: str | None = None) -> None:
        super().__init__()
        self._process = process

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self._process is not None:
            line["process"] = self._process
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update({key: value for key, value in fields.items() if key not in line})
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            line["trace_id"] = trace.format_trace_id(span_context.trace_id)
            line["span_id"] = trace.format_span_id(span_context.span_id)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(level: str) -> None:
    """Structured logs on stderr: one JSON object per line (JsonFormatter), at `level`."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its plugin chatter is not news
