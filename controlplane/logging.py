"""structlog, configured in one place: console lines on a terminal, JSON otherwise, on stderr."""

from __future__ import annotations

import logging
import os
import sys

import structlog


def configure_logging(level: str | None = None) -> None:
    """Route every log line to stderr; results alone go to stdout."""
    level_name = (level or os.environ.get("FLEET_LOG_LEVEL") or "WARNING").upper()
    numeric = logging.getLevelNamesMapping().get(level_name, logging.WARNING)
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=True) if sys.stderr.isatty()
        else structlog.processors.JSONRenderer(sort_keys=True))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(stream=sys.stderr, level=max(numeric, logging.WARNING),
                        format="%(levelname)s %(name)s: %(message)s")
