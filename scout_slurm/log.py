"""Logging set-up: structlog, JSON lines when not on a terminal, readable on one.

Where each part logs: the privileged hooks to a file on the node's own disk first (`HookLog`, so
that a hung evidence root or a lost stderr still leaves a line), then to the site's hook log
(their stderr); the per-task shim and its watchdog to a bounded file of their own in the job's
evidence folder (`TaskLog`), never to the job's output, which belongs to the user (scout prints
there only its start banner and loud event lines); the operator commands to stderr, warnings and
errors only unless `SCOUT_LOG_LEVEL` says otherwise.
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
# The privileged hooks' own log on each node's local disk (not the evidence root, which may hang).
HOOK_LOG_DIR = Path("/var/log/scout")
HOOK_LOG_MAX_BYTES = 64 << 20

_configured = False
_hook_log: HookLog | None = None


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

    def __init__(self, path: Path, *, max_bytes: int = TASK_LOG_MAX_BYTES, writer=None) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.written, self.dropped = 0, 0
        self.fd: int | None = None
        # the job's evidence writer (evidence/writer.py): lines are enqueued, never written on the
        # caller's thread, so a hung evidence root does not stall the task's loop
        self.writer = writer

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
        if self.writer is not None:
            if self.written + len(data) > self.max_bytes:
                if self.dropped == 0:
                    note = '{"event": "log.truncated", "level": "warning", "max_bytes": '
                    self.writer.append(self.path, f"{note}{self.max_bytes}}}\n".encode())
                self.dropped += 1
            else:
                self.writer.append(self.path, data)
                self.written += len(data)
            return len(text)
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


class HookLog:
    """A privileged hook's log: each line appended to `<dir>/<hook>.log` on the node's own disk
    (created 0640 without following a link; past `max_bytes` renamed to `.1` and begun anew),
    then to stderr. A local file that cannot be opened costs only that copy (said once on
    stderr): the hook goes on."""

    def __init__(self, directory: Path, hook: str, *, max_bytes: int = HOOK_LOG_MAX_BYTES):
        self.path, self.max_bytes = Path(directory) / f"{hook}.log", max_bytes
        self.fd: int | None = None
        self.failed = ""
        self.stderr = _CurrentStderr()
        try:
            os.makedirs(directory, mode=0o750, exist_ok=True)
            self._open()
        except OSError as exc:
            self.failed = f"{self.path}: {exc.strerror or exc}"

    def _open(self) -> None:
        self.fd = os.open(
            self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640
        )
        if os.fstat(self.fd).st_size > self.max_bytes:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            os.close(self.fd)
            self.fd = os.open(
                self.path,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o640,
            )

    def write(self, text: str) -> int:
        if self.fd is not None:
            try:
                os.write(self.fd, text.encode("utf-8", "replace"))
            except OSError:
                pass
        try:
            return self.stderr.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            self.stderr.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        return False


def configure_hook(hook: str, directory: Path | str | None = HOOK_LOG_DIR) -> HookLog | None:
    """JSON lines to `<directory>/<hook>.log` (local disk) and stderr; stderr only without a
    directory. Returns the local log (its `failed` says why it has no file)."""
    global _hook_log
    if _hook_log is not None and _hook_log.fd is not None:  # a test's earlier run of a hook
        os.close(_hook_log.fd)
        _hook_log = None
    if not directory:
        configure()
        return None
    local = _hook_log = HookLog(Path(directory), hook)
    configure(local, json=True)
    if local.failed:
        get_logger(f"scout.{hook}").warning(
            "hook.no_local_log",
            path=str(local.path),
            reason=local.failed,
            consequence="this hook logs to stderr only",
        )
    return local


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
