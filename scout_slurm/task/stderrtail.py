"""The child's stderr as the shim keeps it: its last lines, and the last Python exception it
printed (the final `Type: message` line of its last traceback) with the rank's progress then.
Fed line by line by the shim's pump thread; the parsing is pure (`TracebackReader`).
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

TRACEBACK_START = "Traceback (most recent call last):"
# "RuntimeError: boom", "torch.OutOfMemoryError: ...", "KeyboardInterrupt": a dotted name, then
# ": message" or nothing. A warning ("/x.py:3: FutureWarning: ...") or a chained exception's
# "During handling of the above exception, ..." does not match.
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?:: .*|:)?")
# torch.distributed's excepthook writes every line of an uncaught exception as "[rank3]: ...";
# torchrun's --tee as "[default0]:..."
PREFIX = re.compile(r"\[[^\]\s]{1,40}\]: ?")
MAX_FRAME_LINES = 2000  # a traceback that never ends is given up (a frame line is indented)
# '  File "/w/train.py", line 73, in step': the innermost one before the exception line raised it
FRAME_LINE = re.compile(
    r'\s+File "(?P<path>[^"]{1,400})", line (?P<line>\d{1,9})(?:, in (?P<fn>\S{1,200}))?'
)


@dataclass(frozen=True)
class ExceptionSeen:
    line: str  # the final "Type: message" line, at most 500 characters
    position: int  # the rank's collectives entered + completed when it was read; -1 unknown
    at: float  # wall clock when it was read
    # the innermost frame of its traceback: 'path:line in function' ("" when none was printed)
    raised_at: str = ""


class TracebackReader:
    """Finds the exception line that ends each traceback in a stream of lines (pure): after
    "Traceback (most recent call last):", the first line that is not indented, not empty and
    looks like `Type: message` (a "[rankN]: " prefix is read past). Lines from other writers (a
    warning printed by another thread)
    in between are skipped."""

    def __init__(self) -> None:
        self._inside = False
        self._seen = 0
        self._frame = ""
        self.raised_at = ""  # the innermost frame of the traceback `feed` last ended

    def feed(self, line: str) -> str | None:
        """The exception line when `line` ends a traceback, else None (its innermost frame is then
        in `raised_at`)."""
        prefix = PREFIX.match(line)
        if prefix is not None:
            line = line[prefix.end() :]
        if line.startswith(TRACEBACK_START):
            self._inside, self._seen, self._frame = True, 0, ""
            return None
        if not self._inside:
            return None
        self._seen += 1
        if self._seen > MAX_FRAME_LINES:
            self._inside = False
            return None
        if not line.strip() or line.startswith((" ", "\t")):
            frame = FRAME_LINE.match(line)
            if frame is not None:
                fn = frame["fn"]
                self._frame = f"{frame['path']}:{frame['line']}" + (f" in {fn}" if fn else "")
            return None
        if EXCEPTION_LINE.fullmatch(line.rstrip()):
            self._inside = False
            self.raised_at = self._frame
            return line.rstrip()[:500]
        return None


_RANK_PREFIX = re.compile(r"\[rank(\d{1,7})\]:")


class StderrTail(deque):
    """The last `maxlen` lines (a deque, as the watchdog has always read it) and the last
    exception seen. `position` reads the rank's progress when an exception line arrives."""

    def __init__(
        self,
        maxlen: int = 40,
        *,
        position: Callable[[], int] = lambda: -1,
        wall: Callable[[], float] = time.time,
        per_rank: bool = False,
    ) -> None:
        super().__init__(maxlen=maxlen)
        # torchrun's workers share the task's stderr; torch prefixes each line a rank prints of its
        # uncaught exception with "[rankN]:". With `per_rank` (a torchrun task) each rank's lines
        # are kept apart too, so that a worker whose peer failed first is read as a cascade from
        # its own lines (64 ranks a task at most); a task that is one rank reads each line once
        self._per_rank = per_rank
        self.by_rank: dict[int, deque] = {}
        # the lines no rank prefixed (torchrun's own, a worker's before init_process_group)
        self.unprefixed: deque = deque(maxlen=maxlen)
        # the last exceptions of each rank's own lines (key: the rank; None: the lines no rank
        # prefixed), each read from those lines alone: the ranks' tracebacks interleave
        self._readers: dict[int | None, TracebackReader] = {}
        self._exceptions: dict[int | None, deque] = {}
        self._maxlen = maxlen
        self._reader = TracebackReader()
        self._position, self._wall = position, wall
        self.last_exception: ExceptionSeen | None = None
        self._ended = threading.Event()

    def end(self) -> None:
        """The stream reached its end (the child and whatever inherited its stderr closed it)."""
        self._ended.set()

    def wait_ended(self, timeout: float) -> bool:
        """Until the stream ended, at most `timeout` seconds: the lines a child printed just
        before it exited are in the tail before its exit record is written."""
        return self._ended.wait(timeout)

    def of_rank(self, rank: int) -> tuple[str, ...]:
        """The last lines the task's output attributes to torch rank `rank` ("[rankN]:")."""
        return tuple(self.by_rank.get(rank, ()))

    def exceptions_of(self, rank: int | None) -> tuple[ExceptionSeen, ...]:
        """The last exceptions (4 at most, oldest first) torch rank `rank` printed on its own lines
        ("[rankN]: ..."; None: on lines no rank prefixed), their positions unknown (-1: the task's
        progress is not that worker's)."""
        return tuple(self._exceptions.get(rank, ()))

    def _keep_apart(self, line: str) -> None:
        m = _RANK_PREFIX.match(line)
        if m is None:
            self.unprefixed.append(line)
            self._read_apart(None, line)
            return
        rank = int(m.group(1))
        if rank in self.by_rank or len(self.by_rank) < 64:
            self.by_rank.setdefault(rank, deque(maxlen=self._maxlen)).append(line)
            self._read_apart(rank, line)

    def _read_apart(self, key: int | None, line: str) -> None:
        reader = self._readers.setdefault(key, TracebackReader())
        found = reader.feed(line)
        if found is not None:
            seen = ExceptionSeen(found, -1, self._wall(), reader.raised_at)
            self._exceptions.setdefault(key, deque(maxlen=4)).append(seen)

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")[:500]
        self.append(line)
        if self._per_rank:
            self._keep_apart(line)
        found = self._reader.feed(line)
        if found is not None:
            try:
                pos = self._position()
            except Exception:  # noqa: BLE001 - a record that cannot be read: position unknown
                pos = -1
            # one assignment: read whole
            self.last_exception = ExceptionSeen(found, pos, self._wall(), self._reader.raised_at)
