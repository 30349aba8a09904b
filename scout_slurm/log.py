"""Logging set-up: structlog, JSON lines when not on a terminal, readable on one.

Where each part logs: the privileged hooks to the site's hook log (their stderr); the per-task shim
and its watchdog to a bounded file of their own in the job's evidence folder (`TaskLog`), never to
the job's output, which belongs to the user (scout prints there only its start banner and loud
event lines); the operator commands to stderr, warnings and errors only unless `SCOUT_LOG_LEVEL`
says otherwise.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TextIO

import structlog

LEVEL_ENV = "SCOUT_LOG_LEVEL"
TASK_LOG_MAX_BYTES = 4 << 20

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


class TaskLog:
    """A log file of the task's own in the evidence folder: appended, created 0640 without following
    a link, at most `max_bytes` (then one line says the rest was dropped). A line the file refuses
    (full or read-only storage) is dropped, except an error, which goes to the job's stderr: the
    watchdog says evidence loss there loudly in any case."""

    def __init__(self, path: Path, *, max_bytes: int = TASK_LOG_MAX_BYTES) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.written, self.dropped = 0, 0
        self.fd: int | None = None

    def _open(self) -> int:
        if self.fd is None:
            self.fd = os.open(
                self.path,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o640,
            )
            self.written = os.fstat(self.fd).st_size
        return self.fd

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        try:
            fd = self._open()
            if self.written + len(data) > self.max_bytes:
                if self.dropped == 0:
                    note = (
                        f'{{"event": "log.truncated", "level": "warning", "max_bytes": '
                        f"{self.max_bytes}}}\n"
                    )
                    os.write(fd, note.encode())
                self.dropped += 1
                return len(text)
            os.write(fd, data)
            self.written += len(data)
        except OSError:
            self.dropped += 1
            if '"level": "error"' in text or " [error" in text:
                try:
                    sys.stderr.write(text)
                except OSError:
                    pass
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def level_from_env(default: int = logging.INFO) -> int:
    """The level `SCOUT_LOG_LEVEL` names (debug, info, warning, error), else `default`."""
    name = os.environ.get(LEVEL_ENV, "").strip().upper()
    value = logging.getLevelName(name) if name else default
    return value if isinstance(value, int) else default


def configure(
    stream: TextIO | None = None, *, json: bool | None = None, level: int = logging.INFO
) -> None:
    global _configured
    stream = stream or _CurrentStderr()
    if json is None:
        json = not stream.isatty()
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
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
