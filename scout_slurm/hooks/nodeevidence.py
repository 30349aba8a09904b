"""Node-local post-mortem evidence for the node Epilog: kernel log lines that matter since the
job began, GPU error counters through NVML, and processes the job left behind.
`parse_kmsg` and `classify_kernel_line` are pure; `collect_node_evidence` reaches outside."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from scout_slurm.evidence import kernlog

# The kernel log is read by its structure (evidence/kernlog.py): hardware only from a driver's or
# the kernel's own fixed form, never from text a process's name can supply.
HARDWARE_CLASSES = kernlog.HARDWARE_FAULTS
MAX_LINES = kernlog.MAX_EVENTS


@dataclass(frozen=True)
class KernelLine:
    seconds_since_boot: float
    category: str
    text: str


@dataclass(frozen=True)
class LeftoverProcess:
    pid: int
    comm: str


@dataclass(frozen=True)
class NodeEvidence:
    KIND: ClassVar[str] = "node-epilog"
    node: str
    job_id: int
    kernel_lines: tuple[KernelLine, ...]
    gpu_errors: tuple[str, ...]
    leftover: tuple[LeftoverProcess, ...]
    hardware_error: bool
    collected_at: float
    problems: tuple[str, ...]
    schema_version: int = 1


def classify_kernel_line(text: str) -> str | None:
    """The category of one kernel message (the text after the kmsg header), or None."""
    event = kernlog.classify_message(text)
    return event.category if event else None


def parse_kmsg(records: list[str], *, since_boot_s: float) -> list[KernelLine]:
    """`/dev/kmsg` records ("prio,seq,usec,flags;text") after `since_boot_s` that matter (pure)."""
    return [
        KernelLine(e.seconds_since_boot, e.category, e.text)
        for e in kernlog.events_since(records, since_boot_s=since_boot_s)
    ][-MAX_LINES:]


def _read_kmsg(problems: list[str], max_records: int = 100_000) -> list[str]:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        problems.append(f"/dev/kmsg: {exc.strerror}: kernel log not read")
        return []
    out = []
    try:
        while len(out) < max_records:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: a record was overwritten; keep reading
                    continue
                problems.append(f"/dev/kmsg: {exc.strerror}")
                break
            if not chunk:
                break
            out.append(chunk.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return out


def _uptime() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def _gpu_errors(problems: list[str]) -> list[str]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if "LibraryNotFound" not in type(exc).__name__ and "Driver" not in str(exc):
            problems.append(f"NVML: {exc}")
        return []
    errors = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                n = pynvml.nvmlDeviceGetTotalEccErrors(
                    h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
                if n:
                    errors.append(f"{uuid}: {n} uncorrected volatile ECC errors")
            except pynvml.NVMLError as exc:
                problems.append(f"NVML GPU {i}: {exc}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return errors


def _leftovers(job_id: int, limit: int = 64) -> list[LeftoverProcess]:
    needle = f"SLURM_JOB_ID={job_id}\0".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read(256 * 1024)
            if needle in env or env.startswith(needle[:-1]):
                comm = Path(f"/proc/{entry}/comm").read_text().strip()[:64]
                out.append(LeftoverProcess(int(entry), comm))
        except OSError:
            continue
        if len(out) >= limit:
            break
    return out


def collect_node_evidence(node: str, job_id: int, *, job_started_wall: float) -> NodeEvidence:
    problems: list[str] = []
    since_boot = max(0.0, _uptime() - (time.time() - job_started_wall)) if job_started_wall else 0.0
    raw = "".join(_read_kmsg(problems))
    lines = parse_kmsg(raw.splitlines(), since_boot_s=since_boot)
    gpu = _gpu_errors(problems)
    leftover = _leftovers(job_id)
    hw = any(ln.category in HARDWARE_CLASSES for ln in lines) or bool(gpu)
    return NodeEvidence(
        node=node,
        job_id=job_id,
        kernel_lines=tuple(lines),
        gpu_errors=tuple(gpu),
        leftover=tuple(leftover),
        hardware_error=hw,
        collected_at=time.time(),
        problems=tuple(problems),
    )
