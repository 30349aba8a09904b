"""Runs a privileged hook's evidence work in a forked child process within a deadline; at the
deadline the child is killed (SIGKILL) and, if it cannot die yet (uninterruptible I/O on a hung
file system: D state), abandoned, never waited for. So no thread of the hook's own process is
ever stuck in the evidence root, and the hook exits on time whatever the storage does. The child
sends JSON lines (never pickle) to the parent; its stderr reaches the hook's stderr through the
parent, so that a child that outlives the hook holds none of Slurm's pipes. `BoundedChild` (and
`run_bounded` over it) is the one part that reaches outside.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    DONE = "done"  # the work returned
    FAILED = "failed"  # it raised, or the child died of itself
    TIMED_OUT = "timed-out"  # killed at its deadline (and maybe abandoned)


DONE, FAILED, TIMED_OUT = Status.DONE, Status.FAILED, Status.TIMED_OUT
# Of a hook's budget, kept back from its bounded work: killing a child stuck on a hung evidence
# root, logging it and exiting take this long at most.
MARGIN_S = 3.0
# After SIGKILL, how long the parent looks for the child's exit before it abandons it.
REAP_GRACE_S = 0.5
MAX_REPORT_BYTES = 1 << 20  # what a child may send in all; past it the rest is dropped
_CHILD_FAILED = 70
_PR_SET_PDEATHSIG = 1
_abandoned: set[int] = set()

Report = Callable[..., None]


@dataclass(frozen=True)
class BoundedRun:
    """How a bounded child ended: `status` done (returned), failed (raised, or died) or timed-out
    (killed at the deadline; `abandoned` if it could not be reaped: stuck in D state)."""

    name: str
    status: Status
    seconds: float
    result: Any = None
    error: str = ""
    reports: tuple[dict, ...] = ()
    abandoned: bool = False
    state: str = ""  # the child's /proc state and wait channel when it was abandoned

    @property
    def done(self) -> bool:
        return self.status == DONE

    def last(self, key: str, default: Any = None) -> Any:
        """The value of `key` in the latest report that has it."""
        for r in reversed(self.reports):
            if key in r:
                return r[key]
        return default


def margin_s(budget_s: float) -> float:
    """What a hook keeps back of `budget_s` for abandoning its child and exiting (pure)."""
    return min(MARGIN_S, budget_s / 10)


def run_bounded(
    fn: Callable[[Report], Any],
    seconds: float,
    *,
    name: str,
    log: Any = None,
    clock: Callable[[], float] = time.monotonic,
    patience_s: float = 0.0,
) -> BoundedRun:
    """Run `fn(report)` in a forked child for at most `seconds`. `report(**fields)` sends a JSON
    object to the parent at once (what was found so far, which stage the child is in); `fn`'s
    return value, JSON-able, is the result. `patience_s`: more time, once, for a child that is
    only slow at the deadline (running or waiting, not in uninterruptible sleep: a loaded node,
    not a hung file system). Never blocks past the deadline (and the patience) plus
    REAP_GRACE_S."""
    return BoundedChild(fn, name=name, clock=clock).wait(seconds, log=log, patience_s=patience_s)


class BoundedChild:
    """A bounded child started now (forked before the caller starts any thread of its own), to
    be waited for once with `wait`."""

    def __init__(
        self,
        fn: Callable[[Report], Any],
        *,
        name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        reap_abandoned()
        self.name, self.clock = name, clock
        self.started = clock()
        self.rd, wr = os.pipe()
        self.erd, ewr = os.pipe()
        with contextlib.suppress(OSError, ValueError):  # what is buffered is not written twice
            sys.stdout.flush()
            sys.stderr.flush()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            os.close(self.rd)
            os.close(self.erd)
            _die_with(parent)
            _child(fn, wr, ewr)
        os.close(wr)
        os.close(ewr)

    def wait(self, seconds: float, *, log: Any = None, patience_s: float = 0.0) -> BoundedRun:
        """Its outcome, within `seconds` from now (+ `patience_s` once when it is only slow, +
        REAP_GRACE_S if it must be killed)."""
        clock, pid = self.clock, self.pid
        deadline = clock() + max(0.0, seconds)
        patience = max(0.0, patience_s)
        lines = _Lines()
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # poll, not select: a hook run inside a busy process may hold fds past FD_SETSIZE
        poller = select.poll()
        open_fds = {self.rd, self.erd}
        for fd in open_fds:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        code: int | None = None
        try:
            while open_fds:
                left = deadline - clock()
                if left <= 0 and patience and not process_state(pid).startswith("D"):
                    deadline, patience = deadline + patience, 0.0  # slow, not stuck: once more
                    left = deadline - clock()
                if left <= 0:
                    break
                for fd, _ in poller.poll(min(left, 0.5) * 1000):
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        open_fds.discard(fd)
                        poller.unregister(fd)
                    elif fd == self.rd:
                        lines.feed(chunk)
                    else:
                        _relay(chunk, decoder)
            # both pipes closed: the child is exiting (or closed them and hangs: bounded too)
            while code is None and clock() < deadline:
                code = _reaped(pid)
                if code is None:
                    time.sleep(0.01)
        finally:
            os.close(self.rd)
            os.close(self.erd)
        reports = tuple(lines.objects())
        result = next((r["result"] for r in reversed(reports) if "result" in r), None)
        error = next((r["error"] for r in reversed(reports) if "error" in r), "")
        took = round(clock() - self.started, 3)
        if code is not None:
            status = DONE if code == 0 else FAILED
            if code != 0 and not error:
                error = f"child exited with status {code}"
            return BoundedRun(self.name, status, took, result, error, reports)
        return _kill(pid, self.name, seconds, took, reports, log)


def _kill(pid: int, name: str, seconds: float, took: float, reports, log) -> BoundedRun:
    """SIGKILL at the deadline; reaped if it dies at once, else abandoned (logged)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    end = time.monotonic() + REAP_GRACE_S
    while time.monotonic() < end:
        if _reaped(pid) is not None:
            return BoundedRun(
                name, TIMED_OUT, took, error=f"killed after {seconds:.1f} s", reports=reports
            )
        time.sleep(0.01)
    state = process_state(pid)
    _abandoned.add(pid)
    if log is not None:
        log.error(
            "hook.child_abandoned",
            work=name,
            pid=pid,
            state=state,
            after_s=round(seconds, 1),
            why="killed at its deadline but stuck in uninterruptible I/O (a hung file system?); "
            "not waited for: the hook exits on time, the kernel ends the child when its I/O "
            "returns",
        )
    return BoundedRun(
        name,
        TIMED_OUT,
        took,
        error=f"killed after {seconds:.1f} s; still in {state or 'an unknown state'}",
        reports=reports,
        abandoned=True,
        state=state,
    )


def _reaped(pid: int) -> int | None:
    """The child's exit code once it has ended (a signal as 128 + its number), else None."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    if got == 0:
        return None
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def reap_abandoned() -> int:
    """Reap the children abandoned earlier that have ended since; how many are still stuck."""
    for pid in list(_abandoned):
        if _reaped(pid) is not None:
            _abandoned.discard(pid)
    return len(_abandoned)


def process_state(pid: int) -> str:
    """`D (fuse_request_wait)`-like: a process's state letter and its kernel wait channel."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""
    try:
        with open(f"/proc/{pid}/wchan", "rb") as fh:
            wchan = fh.read().decode("ascii", "replace").strip()
    except OSError:
        wchan = ""
    return f"{state} ({wchan})" if wchan and wchan != "0" else state


def _relay(chunk: bytes, decoder: codecs.IncrementalDecoder) -> None:
    """The child's stderr onto the hook's (sys.stderr: whatever it is at the time)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(decoder.decode(chunk))
        sys.stderr.flush()


class _Lines:
    def __init__(self) -> None:
        self.buf, self.size = b"", 0

    def feed(self, chunk: bytes) -> None:
        if self.size + len(chunk) <= MAX_REPORT_BYTES:
            self.buf += chunk
        self.size += len(chunk)

    def objects(self) -> list[dict]:
        out = []
        for line in self.buf.split(b"\n"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out


def _die_with(parent: int) -> None:
    """SIGKILL this child when its parent dies (PR_SET_PDEATHSIG): a child killed at its deadline
    takes its own bounded children (a root check under the Epilog's child) with it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(_CHILD_FAILED)


def _child(fn: Callable[[Report], Any], wr: int, ewr: int) -> None:
    """In the child: stdin and stdout from/to /dev/null, stderr into the parent's relay (no fd of
    Slurm's kept by a child that may outlive the hook), then `fn`, then `os._exit`."""
    code = 0
    try:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(ewr, 2)
        os.close(null)
        os.close(ewr)
        # the parent's sys.stderr may be an object of its own (a test's capture): the child's
        # lines go to fd 2, the parent's relay, whatever the parent had there
        text = {"encoding": "utf-8", "errors": "replace", "closefd": False}
        sys.stdout = os.fdopen(1, "w", **text)
        sys.stderr = os.fdopen(2, "w", buffering=1, **text)

        def report(**fields: Any) -> None:
            os.write(wr, (json.dumps(fields, default=str) + "\n").encode())

        result = fn(report)
        report(result=result)
    except BaseException as exc:
        code = _CHILD_FAILED
        # nothing more a dying child can do if even this fails
        with contextlib.suppress(BaseException):
            os.write(wr, (json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n").encode())
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
