"""Background load for `scout acceptance` step 8: a loopback TCP stream and a disk writer in the
evidence file system, each its own process so the rim can track, stop and reap it by pid.

Run as `python -m scout_slurm.acceptance.load tcp|disk --stats FILE [...]`. Each writes the
bytes it moved so far to its stats file (atomically, twice a second) and once more when
SIGTERM stops it; the disk writer removes its own file on the way out. Rates are capped so that
on a small machine the load slows the job without starving it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

CHUNK = 64 * 1024


class _Stop:
    def __init__(self) -> None:
        self.event = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self.event.set())
        signal.signal(signal.SIGINT, lambda *_: self.event.set())


def _write_stats(path: Path, moved: int, started: float, extra: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"bytes": moved, "seconds": time.monotonic() - started, **extra}))
    os.replace(tmp, path)


def _paced(rate: float, started: float, moved: int) -> float:
    """Seconds to wait so that `moved` bytes since `started` stay under `rate` bytes/s."""
    return max(0.0, moved / rate - (time.monotonic() - started)) if rate > 0 else 0.0


def run_tcp(stats: Path, rate_mib: float, stop: _Stop) -> None:
    """A server and a client on 127.0.0.1 (port chosen by the kernel): the client streams,
    the server drains. Only loopback."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    received = [0]

    def drain() -> None:
        conn, _ = server.accept()
        with conn:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    return
                received[0] += len(data)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    buf = os.urandom(CHUNK)
    started, sent, last = time.monotonic(), 0, 0.0
    rate = rate_mib * (1 << 20)
    try:
        while not stop.event.is_set():
            client.sendall(buf)
            sent += len(buf)
            wait = _paced(rate, started, sent)
            if wait:
                stop.event.wait(wait)
            if time.monotonic() - last > 0.5:
                _write_stats(stats, received[0], started, {"port": port})
                last = time.monotonic()
    finally:
        client.close()
        t.join(timeout=5)
        server.close()
        _write_stats(stats, received[0], started, {"port": port, "stopped": True})


def run_disk(stats: Path, directory: Path, rate_mib: float, wrap_mib: int, stop: _Stop) -> None:
    """Writes 1 MiB blocks into one file in `directory`, fsync every 8 MiB, back to its start
    every `wrap_mib` MiB (bounded space); removes the file at the end."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f".scout-acceptance-load-{os.getpid()}"
    block = os.urandom(1 << 20)
    started, written, last = time.monotonic(), 0, 0.0
    rate = rate_mib * (1 << 20)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while not stop.event.is_set():
            if written and written % (wrap_mib << 20) == 0:
                os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, block)
            written += len(block)
            if written % (8 << 20) == 0:
                os.fsync(fd)
            wait = _paced(rate, started, written)
            if wait:
                stop.event.wait(wait)
            if time.monotonic() - last > 0.5:
                _write_stats(stats, written, started, {"file": str(target)})
                last = time.monotonic()
    finally:
        os.close(fd)
        try:
            os.unlink(target)
        except OSError:
            pass
        _write_stats(stats, written, started, {"file": str(target), "stopped": True})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scout_slurm.acceptance.load")
    ap.add_argument("kind", choices=("tcp", "disk"))
    ap.add_argument("--stats", type=Path, required=True)
    ap.add_argument("--dir", type=Path, default=None, help="disk: the folder to write in")
    ap.add_argument("--rate-mib", type=float, default=64.0, help="cap, MiB/s")
    ap.add_argument("--wrap-mib", type=int, default=64, help="disk: file size bound, MiB")
    args = ap.parse_args(argv)
    stop = _Stop()
    if args.kind == "tcp":
        run_tcp(args.stats, args.rate_mib, stop)
    else:
        if args.dir is None:
            ap.error("disk needs --dir")
        run_disk(args.stats, args.dir, args.rate_mib, args.wrap_mib, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
