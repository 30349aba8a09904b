"""A real hung file system for tests: two stacked `bindfs` FUSE mounts, the inner daemon stopped
(SIGSTOP). A process that touches the outer mount waits on a request its daemon has already
taken, so SIGKILL leaves it in uninterruptible sleep (D state) until the thaw: a hard-mounted
NFS server that stopped answering, as the field saw it. Needs root, /dev/fuse and bindfs
(Debian: `apt-get install bindfs fuse3`); `why_not()` says what is missing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# resolved once: a test may change PATH while the mount is up, and the clean-up must still run
BINDFS, FUSERMOUNT = shutil.which("bindfs"), shutil.which("fusermount3")


def why_not() -> str:
    """Why a frozen mount cannot be made here ("" when it can)."""
    if os.geteuid() != 0:
        return "a FUSE mount of this kind needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    for tool, path in (("bindfs", BINDFS), ("fusermount3", FUSERMOUNT)):
        if path is None:
            return f"{tool} is not installed (Debian: apt-get install bindfs fuse3)"
    return ""


@dataclass
class FrozenMount:
    """`path`: the mount to hand to the code under test; `freeze()` / `thaw()` its daemon."""

    path: Path
    source: Path
    inner: subprocess.Popen
    outer: subprocess.Popen

    def freeze(self) -> None:
        os.kill(self.inner.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.inner.pid, signal.SIGCONT)


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == os.fspath(path) for line in fh)


def _wait_mounted(path: Path, proc: subprocess.Popen, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not _mounted(path):
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"bindfs did not mount {path} (exit {proc.poll()})")
        time.sleep(0.05)


@contextmanager
def frozen_mount(tmp: Path) -> Iterator[FrozenMount]:
    """Stacked bindfs mounts under `tmp`, thawed and unmounted on the way out whatever happens;
    the caller freezes it when it wants."""
    source, inner, outer = tmp / "fs-source", tmp / "fs-inner", tmp / "fs-outer"
    for d in (source, inner, outer):
        d.mkdir()
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([BINDFS, "-f", str(source), str(inner)]))
        _wait_mounted(inner, procs[0])
        procs.append(subprocess.Popen([BINDFS, "-f", str(inner), str(outer)]))
        _wait_mounted(outer, procs[1])
        yield FrozenMount(outer, source, procs[0], procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
        for d in (outer, inner):
            if _mounted(d):
                r = subprocess.run([FUSERMOUNT, "-u", str(d)], check=False)
                if r.returncode != 0:
                    subprocess.run([FUSERMOUNT, "-u", "-z", str(d)], check=False)
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
