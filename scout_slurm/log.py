"""Logging set-up: structlog, JSON lines when not on a terminal, readable on one."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

_configured = False


class _CurrentStderr:
    """Writes to whatever sys.stderr is at the time of the write, not at configure time (a
    hook's main() run inside a test must not keep a closed capture stream)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def configure(stream: TextIO | None = None, *, json: bool | None = None, level: int = logging.INFO) -> None:
    global _configured
    stream = stream or _CurrentStderr()
    if json is None:
        json = not stream.isatty()
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*processors, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    _configured = True


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    if not _configured:
        configure()
    return structlog.get_logger(name)
