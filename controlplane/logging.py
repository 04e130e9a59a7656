"""structlog, configured in one place: console lines on a terminal, JSON otherwise, on stderr."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any

import orjson
import structlog

from controlplane.errors import InputError

_JSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
# The standard names, in any case; anything else is refused rather than read as WARNING.
LOG_LEVEL_NAMES = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def json_line(event: Any, **_: Any) -> str:
    """One log event as JSON with sorted keys; a value JSON cannot hold is written as its repr.

    orjson renders it (the standard library took 12 of a line's 32 us, and a worker at INFO
    writes a line per decision); an integer beyond 64 bits, which orjson refuses, falls back
    to the standard library (unsorted if its keys are of mixed types).
    """
    try:
        return orjson.dumps(event, option=_JSON_OPTIONS, default=repr).decode("utf-8")
    except orjson.JSONEncodeError:
        pass
    try:
        return json.dumps(event, sort_keys=True, default=repr)
    except TypeError:  # keys of mixed types cannot be sorted: the line keeps their order
        return json.dumps(event, default=repr)


def log_level_number(name: str, source: str) -> int:
    """The numeric level of a standard level name (any case); InputError naming `source` and
    the valid names otherwise."""
    if name.upper() not in LOG_LEVEL_NAMES:
        raise InputError(f"{source} must be one of {', '.join(LOG_LEVEL_NAMES)} (any case), "
                         f"got {name[:40]!r}")
    return logging.getLevelNamesMapping()[name.upper()]


_configured: list[str] = []  # the level name configure_logging last set


def configured_level() -> str | None:
    """The level name `configure_logging` last set in this process, if it ran: what the
    processes it starts are given (FLEET_LOG_LEVEL), so `--log-level` reaches them too."""
    return _configured[-1] if _configured else None


def configure_logging(level: str | None = None) -> None:
    """Route every log line to stderr; results alone go to stdout. `level` (else
    FLEET_LOG_LEVEL, else WARNING) must be a standard level name: InputError otherwise."""
    from_env = os.environ.get("FLEET_LOG_LEVEL")
    if level is not None:
        numeric = log_level_number(level, "the log level")
    elif from_env:
        numeric = log_level_number(from_env, "FLEET_LOG_LEVEL")
    else:
        numeric = logging.WARNING
    _configured[:] = [logging.getLevelName(numeric)]
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=True) if sys.stderr.isatty()
        else structlog.processors.JSONRenderer(serializer=json_line))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Libraries' lines (RQ's "exception raised while executing" with its traceback) as ours:
    # one line each, JSON unless on a terminal, the exception as a field.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(as_json=not sys.stderr.isatty()))
    logging.basicConfig(handlers=[handler], level=max(numeric, logging.WARNING))


TRACEBACK_MARKER = "Traceback (most recent call last):"


class LineFormatter(logging.Formatter):
    """A standard-library log record as one line: JSON with structlog's keys (`event`,
    `level`, `timestamp`) plus `logger` and, when one is attached, `exception` (its type and
    first line, never the traceback), or `LEVEL logger: message` on a terminal."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        # RQ writes a failed job's traceback into the message itself: it is cut there, and its
        # last line (the exception) kept as the `exception` field.
        text, marker, traceback = record.getMessage().partition(TRACEBACK_MARKER)
        message = " ".join(text.split())
        error = record.exc_info[1] if record.exc_info else None
        exception = None if error is None else \
            f"{type(error).__name__}: {' '.join(str(error).split())[:500]}"
        if marker and exception is None:
            last = [line.strip() for line in traceback.splitlines() if line.strip()][-1:]
            exception = last[0][:500] if last else None
        if not self.as_json:
            return f"{record.levelname} {record.name}: {message}" + \
                (f" ({exception})" if exception else "")
        line = {"event": message, "level": record.levelname.lower(), "logger": record.name,
                "timestamp": self.formatTime(record)}
        if exception is not None:
            line["exception"] = exception
        return json_line(line)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z")
