"""Checkpoint notes checked as the job's own user: a root hook never opens a path a job wrote. A
forked child (it has the code loaded already: nothing has to be reachable by the user) drops to the
job's uid and gid before it opens anything, and works within a time and a byte budget; the parent
kills it when the time is up. The function that reaches outside is `verify_as_job_user`."""

from __future__ import annotations

import ctypes
import fcntl
import json
import math
import os
import pwd
import resource
import select
import signal
import time
from collections.abc import Sequence

from scout_slurm.evidence.checkfiles import check_file
from scout_slurm.evidence.records import CheckpointNote

# How a result that is not a problem begins when the file's sha256 was not compared.
SIZE_ONLY = "verified by size and presence only"

MAX_OPEN_FILES = 32  # the child: its pipe, stdio, one file or folder listing at a time
MAX_TEXT = 600  # characters of one result kept
_REAP_GRACE_S = 2.0  # after the pipe closed or SIGKILL: a child stuck in the kernel is left
_PR_SET_DUMPABLE = 4
_EXIT_FATAL = 70


def is_verified(result: str | None) -> bool:
    """A result of `verify_as_job_user` that is no problem: None, or by size and presence only."""
    return result is None or result.startswith(SIZE_ONLY)


def verify_as_job_user(
    notes: Sequence[CheckpointNote],
    *,
    uid: int,
    gid: int,
    time_budget_s: float,
    byte_budget: int,
    hook_uid: int | None = None,
) -> list[str | None]:
    """For each of `notes`, in order: None (on storage as noted), a text beginning with SIZE_ONLY
    (present with the noted size; its sha256 was not re-read, the byte budget being spent), or the
    problem. The newest notes (by step, then save time) are checked first; what is not checked
    within `time_budget_s` says so. `gid` < 0: the passwd entry's. `hook_uid` is a test seam for
    the hook's effective uid (default: this process's); a hook that is not root opens nothing."""
    count = len(notes)
    euid = os.geteuid() if hook_uid is None else hook_uid
    if euid != 0:
        return [
            f"not verified: this hook runs as uid {euid} and does not open files a job named"
        ] * count
    if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
        return [f"not verified: the job's uid {uid!r} is not a valid uid"] * count
    if not count:
        return []
    order = sorted(range(count), key=lambda i: (notes[i].step, notes[i].saved_at), reverse=True)
    deadline = time.monotonic() + max(0.0, time_budget_s)
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        return [
            f"not verified: the check as uid {uid} could not be started ({exc.strerror})"
        ] * count
    if pid == 0:  # the child: never returns into the caller's code
        try:
            os.close(read_fd)
            _child(
                write_fd,
                notes,
                order,
                uid=uid,
                gid=gid,
                time_budget_s=time_budget_s,
                byte_budget=byte_budget,
            )
        except BaseException:  # noqa: BLE001 - whatever happens, the child leaves here
            os._exit(_EXIT_FATAL)
        os._exit(0)
    os.close(write_fd)
    try:
        # a line is at most MAX_TEXT characters, six bytes each as JSON escapes, and its fields
        data, overran = _read_until(
            read_fd, deadline, limit=64 * 1024 + count * (6 * MAX_TEXT + 200)
        )
    finally:
        os.close(read_fd)
    status = _reap(pid, kill=overran)
    return _results(
        data,
        count,
        uid=uid,
        byte_budget=byte_budget,
        time_budget_s=time_budget_s,
        overran=overran,
        status=status,
    )


# --------------------------------------------------------------------------------------------
# The parent
# --------------------------------------------------------------------------------------------


def _read_until(fd: int, deadline: float, *, limit: int) -> tuple[bytes, bool]:
    """What the child wrote until it closed the pipe; True when the deadline (or the limit) came
    first."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    data = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(data), True
        if not poller.poll(max(1, math.ceil(left * 1000))):
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(data), False
        data += chunk
        if len(data) > limit:
            return bytes(data), True


def _reap(pid: int, *, kill: bool) -> int | None:
    """The child's wait status; None when it could not be reaped within the grace (stuck in the
    kernel, on a hung file system: the kill lands when it leaves, init reaps it then)."""
    if kill:
        _kill(pid)
    end = time.monotonic() + _REAP_GRACE_S
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() >= end:
            if not kill:  # it closed its pipe and did not leave: it has nothing more to say
                _kill(pid)
            return None
        time.sleep(0.005)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _results(
    data: bytes,
    count: int,
    *,
    uid: int,
    byte_budget: int,
    time_budget_s: float,
    overran: bool,
    status: int | None,
) -> list[str | None]:
    missing = object()
    out: list = [missing] * count
    fatal = None
    for line in data.split(b"\n")[:-1]:  # a last line without its newline was cut off
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if type(obj) is not dict:
            continue
        if type(obj.get("fatal")) is str:
            fatal = obj["fatal"][:MAX_TEXT]
            continue
        i, problem, size_only, left = (
            obj.get("i"),
            obj.get("problem"),
            obj.get("size_only"),
            obj.get("left"),
        )
        if (
            type(i) is not int
            or not 0 <= i < count
            or not (problem is None or type(problem) is str)
            or type(size_only) is not bool
            or type(left) is not int
        ):
            continue
        if problem is not None:
            out[i] = problem[:MAX_TEXT]
        elif size_only:
            out[i] = (
                f"{SIZE_ONLY}: its sha256 was not re-read ({max(0, left)} of the "
                f"{byte_budget} bytes "
                f"of the hashing budget were left)"
            )
        else:
            out[i] = None
    if fatal is not None:
        unfinished = f"not verified: the check could not run as uid {uid}: {fatal}"
    elif overran:
        unfinished = f"not verified: the check did not finish within the {time_budget_s:g} s budget"
    else:
        unfinished = (
            f"not verified: the check as uid {uid} ended without a result for it ({_how(status)})"
        )
    return [unfinished if r is missing else r for r in out]


def _how(status: int | None) -> str:
    if status is None:
        return "it could not be reaped"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by {name}" + (": over its CPU limit" if sig == signal.SIGXCPU else "")
    return f"exit status {os.waitstatus_to_exitcode(status)}"


# --------------------------------------------------------------------------------------------
# The child
# --------------------------------------------------------------------------------------------


def _child(
    write_fd: int,
    notes: Sequence[CheckpointNote],
    order: list[int],
    *,
    uid: int,
    gid: int,
    time_budget_s: float,
    byte_budget: int,
) -> None:
    fd = _only_the_pipe(write_fd)
    try:
        _become(uid, gid)
        _limit(time_budget_s)
    except Exception as exc:  # noqa: BLE001 - said to the parent, which then says "not verified"
        _send(fd, {"fatal": f"{type(exc).__name__}: {exc}"})
        return
    left = max(0, byte_budget)
    for i in order:
        try:
            result = check_file(notes[i], digest_budget=left)
            problem = None if result.problem is None else result.problem[:MAX_TEXT]
            message = {"i": i, "problem": problem, "size_only": result.size_only, "left": left}
            left = max(0, left - result.hashed_bytes)
        except Exception as exc:  # noqa: BLE001 - one note's failure is that note's result
            message = {
                "i": i,
                "problem": f"not verified: checking it failed ({type(exc).__name__}: {exc})"[
                    :MAX_TEXT
                ],
                "size_only": False,
                "left": left,
            }
        _send(fd, message)


def _only_the_pipe(write_fd: int) -> int:
    """Close every descriptor the hook had open (a lock it holds, a folder it opened as root) but
    stdio and the pipe; the pipe's descriptor."""
    fd = fcntl.fcntl(write_fd, fcntl.F_DUPFD_CLOEXEC, 3)
    high = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    high = 1 << 16 if high == resource.RLIM_INFINITY or high > 1 << 16 else high
    os.closerange(3, fd)
    os.closerange(fd + 1, max(fd + 1, high))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    return fd


def _become(uid: int, gid: int) -> None:
    """Drop to the job's uid, gid and groups, and make sure there is no way back to root."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        entry = None
    if gid < 0:
        if entry is None:
            raise ValueError(f"uid {uid} has no passwd entry and no gid was given")
        gid = entry.pw_gid
    groups = os.getgrouplist(entry.pw_name, gid) if entry is not None else []
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise RuntimeError(
            f"still {os.getresuid()}/{os.getresgid()} after switching to {uid}/{gid}"
        )
    if set(os.getgroups()) != set(groups):
        raise RuntimeError(f"groups {sorted(os.getgroups())} after setting {sorted(groups)}")
    if uid != 0:
        attempts = [
            ("uid 0", lambda: os.setresuid(0, 0, 0)),
            ("group 0", lambda: os.setgroups([0])),
        ]
        if gid != 0:
            attempts.append(("gid 0", lambda: os.setresgid(0, 0, 0)))
        for what, attempt in attempts:
            try:
                attempt()
            except PermissionError:
                continue
            raise RuntimeError(f"could switch back to {what} after dropping to uid {uid}")
        capabilities = _capabilities()
        if any(capabilities.values()):
            raise RuntimeError(f"capabilities left after dropping to uid {uid}: {capabilities}")
    # not traceable by the job's user (the kernel does this on a uid change, unless suid_dumpable=1)
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _capabilities() -> dict[str, int]:
    with open("/proc/self/status", "rb") as fh:
        text = fh.read(1 << 16)
    caps = {}
    for line in text.splitlines():
        for name in (b"CapPrm:", b"CapEff:", b"CapAmb:"):
            if line.startswith(name):
                caps[name[:-1].decode()] = int(line.split()[1], 16)
    if "CapEff" not in caps or "CapPrm" not in caps:
        raise RuntimeError("/proc/self/status shows no capability sets")
    return caps


def _limit(time_budget_s: float) -> None:
    cpu = max(1, math.ceil(time_budget_s)) + 1  # the wall-clock deadline is the parent's
    _lower(resource.RLIMIT_CPU, cpu, cpu + 1)
    _lower(resource.RLIMIT_NOFILE, MAX_OPEN_FILES, MAX_OPEN_FILES)
    _lower(resource.RLIMIT_CORE, 0, 0)
    _lower(resource.RLIMIT_FSIZE, 0, 0)


def _lower(which: int, soft: int, hard: int) -> None:
    _, current = resource.getrlimit(which)
    if current != resource.RLIM_INFINITY:
        hard = min(hard, current)
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def _send(fd: int, message: dict) -> None:
    data = (json.dumps(message, ensure_ascii=True) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
