"""The job's one writer into the evidence root: callers (the shim's loop, the training thread)
only enqueue; a daemon thread hands each write to a helper process, which alone touches the root.

A root that stops answering (a hung NFS or FUSE server) leaves a process that touched it in
uninterruptible sleep, and a process with one such thread cannot exit: so the I/O happens in the
helper (`serve`, the one function here that reaches the evidence root), the thread only waits on
a pipe, and the task and the training process exit promptly whatever the root does. While a write
is stalled, only the newest record of each path is kept (bounded), new paths past `max_pending`
are dropped and counted, and the stall and the recovery are each said once on stderr.
"""

from __future__ import annotations

import errno as errno_mod
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRITE, APPEND, MKDIR, STAT, PWRITE, PWRITE_NEW, READ, CREATE_NEW, LIST, CREATED = range(1, 11)
_ANSWERS = (STAT, READ, LIST, CREATED)  # questions: their answer is awaited, none is a record
_WITH_DATA = (STAT, READ, LIST, CREATED)  # their answer line is followed by bytes
_HEADER = struct.Struct("!BIQII")  # op, mode, offset, len(path), len(data)
_PACKAGE_PARENT = os.fspath(Path(__file__).resolve().parents[2])


def _say_stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


@dataclass(frozen=True)
class WriteFailure:
    """A write the root refused (full, read-only, ...): the caller decides what that means."""

    path: str
    errno: int
    message: str


@dataclass
class _Item:
    op: int
    path: str
    data: bytearray
    mode: int
    offset: int = 0
    reply: list[Any] | None = None  # a caller waiting for the answer (probe)
    done: threading.Event | None = None


class EvidenceWriter:
    """Writes into the evidence root off the caller's thread. `write`/`append`/`mkdir` return at
    once; `flush`, `probe` and `close` take a bound. `root` names the root in what is said."""

    def __init__(
        self,
        root: Path | str,
        *,
        stall_after_s: float = 5.0,
        max_pending: int = 256,
        max_append_bytes: int = 1 << 20,
        say: Callable[[str], None] = _say_stderr,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = os.fspath(root)
        self.stall_after_s, self.max_pending = stall_after_s, max_pending
        self.max_append_bytes = max_append_bytes
        self.say, self.clock = say, clock
        self.dropped = 0  # records given up (queue full, or helper gone, or lost at exit)
        self.written = 0
        self.stalled = False
        self.stall_count = 0  # how many stalls began (said once each)
        self._failures: list[WriteFailure] = []
        self._pending: OrderedDict[tuple[int, str, int], _Item] = OrderedDict()
        self._inflight: _Item | None = None
        self._cond = threading.Condition()
        self._closing = False
        self._broken = ""  # why the helper is gone: writes are dropped from then on
        self._said_drop = False
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._run, name="scout-evidence-writer", daemon=True)
        self._thread.start()

    # ---- the callers' side: never blocks on the root
    def write(self, path: Path | str, data: bytes, *, mode: int = 0o644) -> None:
        """Replace the file at `path` by `data` (atomically, in the helper); a newer write of the
        same path before this one went out replaces it."""
        self._put(_Item(WRITE, os.fspath(path), bytearray(data), mode))

    def write_record(self, path: Path | str, record: Any, *, mode: int = 0o644) -> None:
        from scout_slurm.evidence.codec import record_to_bytes

        self.write(path, record_to_bytes(record), mode=mode)

    def append(self, path: Path | str, data: bytes, *, mode: int = 0o640) -> None:
        self._put(_Item(APPEND, os.fspath(path), bytearray(data), mode))

    def pwrite(
        self, path: Path | str, data: bytes, offset: int, *, new: bool = False, mode: int = 0o644
    ) -> None:
        """Write `data` at `offset` of the file (a ring file's slot); `new`: truncate it first."""
        op = PWRITE_NEW if new else PWRITE
        self._put(_Item(op, os.fspath(path), bytearray(data), mode, offset=offset))

    def create_new(self, path: Path | str, data: bytes, *, mode: int = 0o644) -> None:
        """Make the file appear with `data` only if nothing is there yet (a mark the first of
        several writers sets)."""
        self._put(_Item(CREATE_NEW, os.fspath(path), bytearray(data), mode))

    def mkdir(self, path: Path | str, *, mode: int = 0o755) -> None:
        self._put(_Item(MKDIR, os.fspath(path), bytearray(), mode))

    def _put(self, item: _Item) -> None:
        key = (item.op, item.path, item.offset)
        with self._cond:
            if self._closing:
                self.dropped += 1  # after the bounded close: the end of the process, said there
                return
            if self._broken:
                self._drop(1)
                return
            held = self._pending.get(key)
            if held is not None:
                if item.op == APPEND:
                    room = self.max_append_bytes - len(held.data)
                    if len(item.data) > room:
                        self._drop(1)
                        return
                    held.data += item.data
                elif item.op == CREATE_NEW:
                    pass  # the first mark held is the one that may appear
                else:
                    held.data = item.data  # the newest record of a path is the one that counts
                return
            if len(self._pending) >= self.max_pending:
                self._drop(1)
                return
            self._pending[key] = item
            self._cond.notify()

    def _drop(self, n: int) -> None:
        self.dropped += n
        if not self._said_drop:
            self._said_drop = True
            why = self._broken or (
                f"more than {self.max_pending} records wait for the evidence root {self.root}"
            )
            self.say(f"scout: {why}: scout drops records from now on (counted); training goes on")

    def take_failures(self) -> list[WriteFailure]:
        with self._cond:
            out, self._failures = self._failures, []
        return out

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending) + (self._inflight is not None)

    def flush(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until everything enqueued so far is written."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._inflight is not None:
                if self._broken:
                    return False
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def probe(self, path: Path | str, timeout: float) -> int | None:
        """Does `path` answer? 0: it exists; an errno: it answered with that error; None: no
        answer within `timeout` (the root hangs, or the writer is stalled on it already)."""
        answer = self._ask(_Item(STAT, os.fspath(path), bytearray(), 0), timeout)
        return answer if answer is None else answer[0]

    def size(self, path: Path | str, timeout: float) -> int | None:
        """The file's size; None when it is not there or the root did not answer in time."""
        answer = self._ask(_Item(STAT, os.fspath(path), bytearray(), 0), timeout)
        return int(answer[1]) if answer is not None and answer[0] == 0 else None

    def read(
        self,
        path: Path | str,
        timeout: float,
        *,
        max_bytes: int = 1 << 20,
        root: Path | str | None = None,
    ) -> bytes | int | None:
        """The file's bytes (at most `max_bytes`, read without following a link); an errno when
        the root answered with an error (ENOENT: not there); None: no answer within `timeout`."""
        below = os.fsencode(root) if root is not None else b""  # no link followed below it
        answer = self._ask(_Item(READ, os.fspath(path), bytearray(below), max_bytes), timeout)
        if answer is None:
            return None
        return answer[1] if answer[0] == 0 else answer[0]

    def list_records(
        self, directory: Path | str, pattern: str, cls: type, *, root: Path | str, timeout: float
    ) -> tuple[list[Any], list[str]] | None:
        """store.list_records of `directory`, made by the helper: the records (of a class of
        evidence/records.py) and an error line per unusable file; None: no answer in time."""
        import json

        from scout_slurm.evidence.codec import record_from_obj

        spec = {"pattern": pattern, "kind": cls.__name__, "root": os.fspath(root)}
        item = _Item(LIST, os.fspath(directory), bytearray(json.dumps(spec).encode()), 0)
        answer = self._ask(item, timeout)
        if answer is None:
            return None
        if answer[0] != 0:
            return [], [f"{directory}: cannot list ({os.strerror(answer[0])})"]
        got = json.loads(answer[1])
        records, errors = [], list(got["errors"])
        for name, obj in got["records"]:
            try:
                records.append(record_from_obj(cls, obj, source=os.path.join(directory, name)))
            except Exception as exc:  # noqa: BLE001 - the helper read it; a bad one is one line
                errors.append(str(exc))
        return records, errors

    def create_exclusive(self, path: Path | str, data: bytes, timeout: float) -> bool | None:
        """Make the file appear with `data` if nothing is there: True when this call made it,
        False when something was there already, None when the root did not answer in time."""
        answer = self._ask(_Item(CREATED, os.fspath(path), bytearray(data), 0o644), timeout)
        if answer is None or answer[0] != 0:
            return None
        return answer[1] == b"1"

    def _ask(self, item: _Item, timeout: float) -> tuple[int, bytes] | None:
        item.reply, item.done = [], threading.Event()
        with self._cond:
            if self._broken or self.stalled or len(self._pending) >= self.max_pending:
                return None  # the root is known not to answer: no new question piles up
            self._pending[(item.op, item.path, id(item))] = item
            self._cond.notify()
        if not item.done.wait(timeout):
            return None
        return item.reply[0] if item.reply else None

    def close(self, timeout: float) -> bool:
        """Write what is held, for at most `timeout` s, then let the helper go. Not written in
        time: the records are lost, said once; the helper is killed and never waited for."""
        flushed = self.flush(timeout)
        with self._cond:
            self._closing = True
            held = [*self._pending.values(), *([self._inflight] if self._inflight else [])]
            lost = sum(item.op not in _ANSWERS for item in held)  # a question is no record
            self._cond.notify_all()
        if not flushed and lost:
            self.dropped += lost
            self.say(
                f"scout: the evidence root {self.root} did not take scout's last {lost} "
                "record(s) in time: they are lost; the task exits with the training's own code"
            )
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                if flushed:
                    assert proc.stdin is not None
                    proc.stdin.close()  # the helper ends at end of input
                else:
                    os.kill(proc.pid, signal.SIGKILL)  # a D-state helper dies at the thaw
            except OSError:
                pass
        return flushed

    # ---- the writer thread: waits on a pipe, never on the root
    def _start_helper(self) -> subprocess.Popen:
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from scout_slurm.evidence.writer import serve; serve()"
        )
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", code, _PACKAGE_PARENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # the job's Ctrl-C or SIGTERM is not the helper's
        )

    def _run(self) -> None:
        try:
            self._proc = self._start_helper()
        except OSError as exc:
            with self._cond:
                self._broken = f"scout's evidence writer could not start ({exc})"
                n = len(self._pending)
                self._pending.clear()
                self._drop(n)
                self._cond.notify_all()
            return
        reader = _Replies(self._proc.stdout.fileno())  # type: ignore[union-attr]
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                _, item = self._pending.popitem(last=False)
                self._inflight = item
            answer = self._send(item, reader)
            with self._cond:
                self._inflight = None
                if answer is None:
                    self._broken = "scout's evidence writer stopped"
                    n = len(self._pending) + 1
                    self._pending.clear()
                    self._drop(n)
                elif answer[0] == 0:
                    self.written += 1
                elif item.op not in _ANSWERS:
                    self._failures.append(WriteFailure(item.path, answer[0], answer[1]))
                if item.done is not None and item.reply is not None:
                    if answer is not None:
                        item.reply.append((answer[0], answer[2]))
                    item.done.set()
                self._cond.notify_all()
                if answer is None:
                    return

    def _send(self, item: _Item, reader: _Replies) -> tuple[int, str, bytes] | None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        path = item.path.encode("utf-8", "surrogateescape")
        try:
            proc.stdin.write(
                _HEADER.pack(item.op, item.mode, item.offset, len(path), len(item.data))
            )
            proc.stdin.write(path)
            proc.stdin.write(item.data)
            proc.stdin.flush()
        except (OSError, ValueError):
            return None
        started = self.clock()
        while True:
            line = reader.line(0.25)
            if line is not None:
                break
            if reader.eof:
                return None
            waited = self.clock() - started
            if not self.stalled and waited >= self.stall_after_s:
                self.stalled = True
                self.stall_count += 1
                self.say(
                    f"scout: the evidence root {self.root} has not answered for {waited:.0f} s: "
                    "scout's records are held back; training goes on"
                )
        if self.stalled:
            self.stalled = False
            self.say(
                f"scout: the evidence root {self.root} answers again after "
                f"{self.clock() - started:.0f} s: scout writes its held records "
                f"({self.dropped} dropped)"
            )
        code, _, message = line.partition(" ")
        data = b""
        if item.op in _WITH_DATA and code == "0":
            data = reader.take(int(message))  # sent with its line: no wait on the root here
            if data is None:
                return None
        return int(code), message, data


class _Replies:
    """Lines from the helper's stdout, read with a bound on each wait."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.eof = fd, b"", False

    def line(self, timeout: float) -> str | None:
        while b"\n" not in self.buf:
            if self.eof:
                return None
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:
                self.eof = True
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode("utf-8", "replace")

    def take(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            chunk = os.read(self.fd, max(4096, n - len(self.buf)))
            if not chunk:
                self.eof = True
                return None
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


# ---- the helper process: the one place that touches the evidence root


def _read_exact(fh, n: int) -> bytes | None:
    out = b""
    while len(out) < n:
        chunk = fh.read(n - len(out))
        if not chunk:
            return None
        out += chunk
    return out


def _perform(op: int, path: str, data: bytes, mode: int, offset: int) -> bytes:
    """Do one request; the bytes of a READ, else b""."""
    if op == READ:
        from scout_slurm.evidence.safeio import safe_read_bytes

        root = Path(os.fsdecode(data)) if data else None
        return safe_read_bytes(Path(path), max_bytes=mode, root=root)
    if op == LIST:
        return _list(path, data)
    if op in (CREATE_NEW, CREATED):
        from scout_slurm.evidence.safeio import create_exclusive

        made = create_exclusive(Path(path), data, mode=mode)
        return (b"1" if made else b"0") if op == CREATED else b""
    elif op == WRITE:
        from scout_slurm.evidence.safeio import atomic_write_bytes

        atomic_write_bytes(Path(path), data, mode=mode)
    elif op == APPEND:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, mode)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    elif op in (PWRITE, PWRITE_NEW):
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags | (os.O_TRUNC if op == PWRITE_NEW else 0), mode)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
    elif op == MKDIR:
        os.makedirs(path, mode=mode, exist_ok=True)
    elif op == STAT:
        return str(os.stat(path).st_size).encode()
    else:
        raise ValueError(f"unknown operation {op}")
    return b""


def _list(directory: str, spec_bytes: bytes) -> bytes:
    import json

    from scout_slurm.evidence import records as records_mod
    from scout_slurm.evidence.codec import record_to_obj
    from scout_slurm.evidence.store import list_named_records

    spec = json.loads(spec_bytes)
    cls = getattr(records_mod, spec["kind"])  # a record class of evidence/records.py only
    named, errors = list_named_records(
        Path(directory), spec["pattern"], cls, root=Path(spec["root"])
    )
    got = {"records": [[n, record_to_obj(r)] for n, r in named], "errors": errors}
    return json.dumps(got).encode()


def _errno_of(exc: BaseException) -> int:
    from scout_slurm.evidence.safeio import EvidenceMissing

    if isinstance(exc, EvidenceMissing):
        return errno_mod.ENOENT
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno:
            return exc.errno
        exc = exc.__cause__  # type: ignore[assignment]
    return errno_mod.EIO


def serve() -> None:
    """The helper's loop: one request at a time from stdin, one answer line each on stdout
    ("0 " when done, "<errno> <message>" when refused). Ends at the end of its input."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = _read_exact(inp, _HEADER.size)
        if header is None:
            return
        op, mode, offset, n_path, n_data = _HEADER.unpack(header)
        raw_path, data = _read_exact(inp, n_path), _read_exact(inp, n_data)
        if raw_path is None or data is None:
            return
        path = raw_path.decode("utf-8", "surrogateescape")
        got = b""
        try:
            got = _perform(op, path, data, mode, offset)
            answer = f"0 {len(got)}" if op in _WITH_DATA else "0 "
        except Exception as exc:  # noqa: BLE001 - every refusal is answered, none ends the helper
            answer = f"{_errno_of(exc)} {str(exc).replace(chr(10), ' ')[:500]}"
        out.write(answer.encode("utf-8", "replace") + b"\n" + got)
        out.flush()
