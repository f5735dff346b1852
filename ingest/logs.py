"""Structured logs: one line per event, ``key=value`` pairs or one JSON object.

Code logs events with ``event(logger, "batch_committed", rows=..., version=...)``;
the formatter writes ``ts=... level=info logger=... event=batch_committed rows=12
version=3`` (kv) or the same fields as JSON. Plain log calls go through the same
formatter, their text in ``msg``. A process can add fields to all its lines (a
worker: its topic, partition and pid), so the supervisor's stderr, which its
workers and its Spark JVM share, is one stream in one format.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = ["JsonFormatter", "KeyValueFormatter", "configure_logging", "event"]

_FIELDS = "ingest_fields"
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def event(logger: logging.Logger, name: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Logs one event with its fields (rendered by the configured formatter)."""
    if logger.isEnabledFor(level):
        text = " ".join([name, *(f"{k}={_kv(v)}" for k, v in fields.items())])
        logger.log(level, text, extra={_FIELDS: {"event": name, **fields}})


def _fields(record: logging.LogRecord, context: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        **context,
    }
    extra: Mapping[str, Any] | None = getattr(record, _FIELDS, None)
    if extra is not None:
        out.update(extra)
    else:
        out["msg"] = record.getMessage()
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


def _kv(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or any(c in text for c in ' "=\n\t'):
        return json.dumps(text)
    return text


class KeyValueFormatter(logging.Formatter):
    def __init__(self, context: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.context = dict(context or {})

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record, self.context)
        return " ".join(f"{key}={_kv(value)}" for key, value in fields.items())


class JsonFormatter(logging.Formatter):
    def __init__(self, context: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.context = dict(context or {})

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record, self.context), default=str)


def configure_logging(
    fmt: str,
    level: str,
    stream: TextIO | None = None,
    *,
    context: Mapping[str, Any] | None = None,
) -> None:
    """Routes the root logger to ``stream`` (stderr) with the chosen format; ``context``
    fields go on every line, after ts, level and logger."""
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter = JsonFormatter(context) if fmt == "json" else KeyValueFormatter(context)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, logging.ERROR))
    # py4j logs every gateway call at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
