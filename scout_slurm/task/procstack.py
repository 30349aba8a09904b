"""What a process is doing, read from outside when its own stack dump did not come (a stopped
process runs no signal handler; a process whose bootstrap is gone has none): its threads'
scheduler state, wait channel and kernel stack from /proc, and py-spy's dump when py-spy is
installed and the process is not stopped (py-spy prints nothing for a stopped one). Not gdb:
attaching takes seconds and Yama's ptrace scope refuses it for a process not its descendant.
The function that reaches outside is `describe_process`.
"""

from __future__ import annotations

import os
import shutil
import subprocess

STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "uninterruptible sleep (disk)",
    "T": "stopped",
    "t": "traced",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}
MAX_THREADS = 64
PY_SPY_TIMEOUT_S = 10.0


def _read(path: str, limit: int = 8192) -> str:
    with open(path, "rb") as fh:
        return fh.read(limit).decode("utf-8", "replace")


def _state(stat_text: str) -> str:
    try:
        code = stat_text.rsplit(")", 1)[1].split()[0]
    except IndexError:
        return "?"
    return f"{code} ({STATES.get(code, 'unknown')})"


def describe_process(pid: int, *, py_spy: bool = True) -> list[str]:
    """Lines saying what `pid` and its threads are doing; each source that cannot be read says
    why.
    """
    lines = [f"pid {pid}:"]
    base = f"/proc/{pid}"
    try:
        state = _state(_read(base + "/stat"))
        lines.append(f"  state {state}, wchan {_read(base + '/wchan').strip() or '0'}")
    except OSError as exc:
        return lines + [f"  /proc unreadable ({exc.strerror or exc}): the process has gone"]
    try:
        tids = sorted(os.listdir(base + "/task"), key=int)
    except (OSError, ValueError) as exc:
        tids = []
        lines.append(f"  threads unlisted: {exc}")
    for tid in tids[:MAX_THREADS]:
        t = f"{base}/task/{tid}"
        try:
            comm = _read(t + "/comm").strip()
            tstate = _state(_read(t + "/stat"))
            wchan = _read(t + "/wchan").strip() or "0"
        except OSError:
            continue  # the thread ended meanwhile
        lines.append(f"  thread {tid} {comm!r}: state {tstate}, wchan {wchan}")
        try:
            kstack = [ln.strip() for ln in _read(t + "/stack").splitlines() if ln.strip()]
            lines += [f"    kernel: {ln}" for ln in kstack[:16]]
        except OSError as exc:
            lines.append(f"    kernel stack unreadable ({exc.strerror or exc}; it needs root)")
    if len(tids) > MAX_THREADS:
        lines.append(f"  ... {len(tids) - MAX_THREADS} more threads")
    exe = shutil.which("py-spy") if py_spy else None
    if exe is None:
        lines.append("  py-spy: not installed (the Python stacks are the bootstrap's dump only)")
    elif state[:1] in ("T", "t"):
        lines.append("  py-spy: not run (the process is stopped: it would print nothing)")
    else:
        try:
            res = subprocess.run(
                [exe, "dump", "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=PY_SPY_TIMEOUT_S,
            )
            out = (res.stdout or res.stderr).strip().splitlines()
            lines += [f"  py-spy: {ln}" for ln in out[:400]] or [
                f"  py-spy: no output (exit {res.returncode})"
            ]
        except (OSError, subprocess.TimeoutExpired) as exc:
            lines.append(f"  py-spy failed: {exc}")
    return lines
