"""Root-side confirmation on suspicion: bounded checks that the node Epilog (root) runs on a node
the localiser named, recorded as root-owned evidence in `nodes/<node>/rootcheck-<run>.json`.
A job cannot forge them: they read the kernel, the GPU driver and the machine itself, never a
file the job wrote. The controller waits for them before it decides whether to drain
(remediation/plan.py, `drain_decision`).

Only what the machine has is attempted, each check within its own time bound and the whole
within the budget; each outcome is recorded, whatever it was. `wait_and_check` is the entry
point; the parsers and `corroborating` are pure.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from scout_slurm.evidence import kernlog
from scout_slurm.evidence.records import Verdict, VerdictKind
from scout_slurm.hwmap.records import GpuInfo, gpu_at_pci

# What each check can find, by category. The kernel log's own categories are evidence/kernlog.py's.
ECC = "gpu-ecc"  # uncorrected ECC errors (volatile or aggregate)
RETIRED = "gpu-retired-pages"  # pages retired, or pending retirement
REMAPPED = "gpu-remapped-rows"  # row remapping failed or pending
THROTTLE = "gpu-throttle"  # hardware slowdown / thermal / power brake
PCIE_REPLAY = "gpu-pcie-replay"  # PCIe replay counter above the threshold
DCGM = "dcgm-diag"  # `dcgmi diag -r 1` reported a failure
SIGNATURE = "compute-signature"  # the CPU/memory self-test computed a wrong result
IB_ERRORS = "ib-port-errors"  # InfiniBand error counters grew during the job

# What the root checks outside the kernel log find that shows the machine failed.
_HARD = frozenset({ECC, RETIRED, REMAPPED, DCGM, SIGNATURE})
_LINK = frozenset({IB_ERRORS, PCIE_REPLAY})
# Which root-found categories corroborate which verdict: a machine that computes wrong numbers
# explains a crash, a hang or silent corruption; a flapping link explains a hang or a failure of
# the communication layer; a slow-down explains only a straggler. The kernel log's categories
# say for themselves what they corroborate (evidence/kernlog.py: an Xid by its class, a
# corrected error only a straggler, a line about a process nothing).
CORROBORATES: Mapping[VerdictKind, frozenset[str]] = {
    VerdictKind.CRASH: _HARD | kernlog.corroborated_by(VerdictKind.CRASH),
    VerdictKind.HANG: _HARD | _LINK | kernlog.corroborated_by(VerdictKind.HANG),
    VerdictKind.SDC: _HARD | kernlog.corroborated_by(VerdictKind.SDC),
    VerdictKind.INFRA: _HARD | _LINK | kernlog.corroborated_by(VerdictKind.INFRA),
    VerdictKind.STRAGGLER: frozenset({THROTTLE, PCIE_REPLAY, IB_ERRORS})
    | kernlog.corroborated_by(VerdictKind.STRAGGLER),
}

# The self-test: a fixed, deterministic integer workload over a memory buffer (no floating point,
# no randomness, no dependence on the machine's word size), so that every sound machine computes
# the same digest. REFERENCE_SIGNATURE was computed the same way at development time and is
# checked by tests/unit/test_rootcheck.py on every install that runs the suite (about 2 s).
SIGNATURE_BYTES = 8 * 1024 * 1024
SIGNATURE_ROUNDS = 24
REFERENCE_SIGNATURE = "d1be1069f40919ab"

# The self-test is started only with this much of the budget left, and cut off at its own bound
# (a loaded node computes it in 2-50 s): a cut-off self-test is "timed-out", never a finding.
SIGNATURE_LEAST_S = 4.0
SIGNATURE_BOUND_S = 10.0
# A check that runs a command of its own gives that command this much less than the check's
# bound, so that the command's own time-out is said rather than the check's.
CHILD_SLACK_S = 0.5

IB_COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors")
PCIE_REPLAY_LIMIT = 100


@dataclass(frozen=True)
class RootFinding:
    category: str
    detail: str
    gpu_serial: str = ""


@dataclass(frozen=True)
class CheckOutcome:
    name: str  # kernel-log, compute-signature, nvml, dcgmi-diag, infiniband
    status: str  # "clean", "found", "not-available", "timed-out", "skipped", "error"
    seconds: float
    findings: tuple[RootFinding, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class RootChecks:
    KIND: ClassVar[str] = "root-checks"
    node: str
    job_id: int
    restart: int
    verdict_kind: VerdictKind
    started_at: float
    seconds: float
    outcomes: tuple[CheckOutcome, ...]
    schema_version: int = 1

    @property
    def findings(self) -> tuple[RootFinding, ...]:
        return tuple(f for o in self.outcomes for f in o.findings)


@dataclass(frozen=True)
class IbCounter:
    key: str  # hca/port/counter
    value: int


@dataclass(frozen=True)
class IbBaseline:
    """The Prolog's reading of the InfiniBand error counters at the job's start (root-owned)."""

    KIND: ClassVar[str] = "ib-counters"
    node: str
    taken_at: float
    counters: tuple[IbCounter, ...]
    schema_version: int = 1


def corroborating(checks: RootChecks | None, kind: VerdictKind) -> tuple[RootFinding, ...]:
    """The root-found facts that corroborate a verdict of `kind` (pure)."""
    if checks is None:
        return ()
    wanted = CORROBORATES.get(kind, frozenset())
    return tuple(f for f in checks.findings if f.category in wanted)


# --- the checks -------------------------------------------------------------------------------


def compute_signature(nbytes: int = SIGNATURE_BYTES, rounds: int = SIGNATURE_ROUNDS) -> str:
    """Fill a buffer from a 64-bit xorshift, then mix it `rounds` times through big-integer
    arithmetic and SHA-256 (CPU: integer units; memory: the whole buffer read and written each
    round). Deterministic on every sound machine."""
    mask = (1 << 64) - 1
    x = 0x9E3779B97F4A7C15
    seed = bytearray()
    for _ in range(4096):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        seed += x.to_bytes(8, "little")
    buf = bytearray(bytes(seed) * (nbytes // len(seed)))
    digest = hashlib.sha256(buf).digest()
    for r in range(rounds):
        n = int.from_bytes(buf, "little")
        n = (n * (int.from_bytes(digest, "little") | 1) + r) & ((1 << (8 * len(buf))) - 1)
        buf[:] = n.to_bytes(len(buf), "little")
        digest = hashlib.sha256(buf).digest()
    return digest.hex()[:16]


def check_signature() -> CheckOutcome:
    started = time.monotonic()
    got = compute_signature()
    seconds = round(time.monotonic() - started, 3)
    if got == REFERENCE_SIGNATURE:
        return CheckOutcome(
            "compute-signature", "clean", seconds, note=f"digest {got} as the reference"
        )
    return CheckOutcome(
        "compute-signature",
        "found",
        seconds,
        (RootFinding(SIGNATURE, f"digest {got}, reference {REFERENCE_SIGNATURE}"),),
    )


def check_kernel_log(
    source: str, since_boot_s: float, gpus: Sequence[GpuInfo] = ()
) -> CheckOutcome:
    """The kernel's log since the job began: `/dev/kmsg`, or the site's test double of it. Every
    event a verdict could lean on is recorded (what it corroborates is `corroborating`'s to say);
    lines about a process (segfault, trap, OOM, hung task) are not findings. `gpus` (the
    Prolog's map of this node) names the GPU at an Xid's or a device's PCI address."""
    from scout_slurm.hooks.nodeevidence import _read_kmsg

    started = time.monotonic()
    problems: list[str] = []
    if source == "/dev/kmsg":
        raw = "".join(_read_kmsg(problems))
        shown = "/dev/kmsg"
    else:
        from scout_slurm.errors import ScoutError
        from scout_slurm.trust import read_trusted_file

        try:  # root's file, writable by no one else (a planted link or a job's file is refused)
            raw = read_trusted_file(Path(source), frozenset({0}), max_bytes=4 * 1024 * 1024).decode(
                "utf-8", "replace"
            )
        except (OSError, ScoutError) as exc:
            return CheckOutcome(
                "kernel-log",
                "error",
                round(time.monotonic() - started, 3),
                note=f"test kernel log {source}: {exc}",
            )
        shown = f"{source} (TEST DOUBLE of /dev/kmsg)"
    seconds = round(time.monotonic() - started, 3)
    if problems and not raw:
        return CheckOutcome("kernel-log", "not-available", seconds, note="; ".join(problems))
    found = tuple(
        kernel_finding(event, gpus)
        for event in kernlog.events_since(raw.splitlines(), since_boot_s=since_boot_s)
        if event.subsystem is not kernlog.Subsystem.PROCESS
    )
    return CheckOutcome("kernel-log", "found" if found else "clean", seconds, found, note=shown)


def kernel_finding(event: kernlog.KernelEvent, gpus: Sequence[GpuInfo] = ()) -> RootFinding:
    """A kernel-log event as a finding, charged to the GPU at its PCI address when the map has
    one there (pure)."""
    gpu = gpu_at_pci(gpus, event.pci) if event.pci else None
    if gpu is None:
        return RootFinding(event.category, event.text)
    return RootFinding(event.category, f"{event.text} [GPU {gpu.index} {gpu.uuid}]", gpu.serial)


def ib_counters(sys_root: Path = Path("/sys/class/infiniband")) -> dict[str, int]:
    """`hca/port/counter` -> value for the error counters scout watches; {} without InfiniBand."""
    out: dict[str, int] = {}
    try:
        hcas = sorted(os.listdir(sys_root))
    except OSError:
        return out
    for hca in hcas[:32]:
        ports = sys_root / hca / "ports"
        try:
            port_names = sorted(os.listdir(ports))[:8]
        except OSError:
            continue
        for port in port_names:
            for name in IB_COUNTERS:
                try:
                    out[f"{hca}/{port}/{name}"] = int(
                        (ports / port / "counters" / name).read_text().split()[0]
                    )
                except (OSError, ValueError, IndexError):
                    continue
    return out


def ib_deltas(before: Mapping[str, int], after: Mapping[str, int]) -> tuple[RootFinding, ...]:
    """Counters that grew between the job's start and now (pure)."""
    return tuple(
        RootFinding(IB_ERRORS, f"{key} +{after[key] - before[key]}")
        for key in sorted(after)
        if key in before and after[key] > before[key]
    )


def check_infiniband(baseline: Mapping[str, int] | None) -> CheckOutcome:
    started = time.monotonic()
    now = ib_counters()
    seconds = round(time.monotonic() - started, 3)
    if not now:
        return CheckOutcome(
            "infiniband", "not-available", seconds, note="no InfiniBand port counters here"
        )
    if baseline is None:
        return CheckOutcome(
            "infiniband",
            "skipped",
            seconds,
            note="no counters from the job's start on this node: no delta to compare",
        )
    found = ib_deltas(baseline, now)
    return CheckOutcome(
        "infiniband",
        "found" if found else "clean",
        seconds,
        found,
        note=f"{len(now)} counters compared with the job's start",
    )


def nvml_findings(gpus: Sequence[Mapping]) -> tuple[RootFinding, ...]:
    """Findings from the per-GPU readings `_nvml_child` prints (pure)."""
    out = []
    for g in gpus:
        serial = str(g.get("serial", ""))
        who = f"GPU {g.get('index')} {g.get('uuid', '')}"
        for key, category, what in (
            ("ecc_volatile", ECC, "uncorrected volatile ECC errors"),
            ("ecc_aggregate", ECC, "uncorrected aggregate ECC errors"),
            ("retired_pending", RETIRED, "pages pending retirement"),
            ("retired_dbe", RETIRED, "pages retired for double-bit errors"),
            ("remap_failed", REMAPPED, "row remapping failures"),
            ("remap_pending", REMAPPED, "row remappings pending"),
        ):
            if int(g.get(key) or 0) > 0:
                out.append(RootFinding(category, f"{who}: {g[key]} {what}", serial))
        if int(g.get("pcie_replay") or 0) > PCIE_REPLAY_LIMIT:
            out.append(
                RootFinding(PCIE_REPLAY, f"{who}: PCIe replay counter {g['pcie_replay']}", serial)
            )
        reasons = int(g.get("throttle") or 0) & _HW_THROTTLE
        if reasons:
            out.append(
                RootFinding(
                    THROTTLE,
                    f"{who}: throttle reasons 0x{reasons:x} (hardware slowdown, thermal "
                    "or power brake)",
                    serial,
                )
            )
    return tuple(out)


# nvmlClocksThrottleReasonHwSlowdown | SwThermalSlowdown | HwThermalSlowdown | HwPowerBrakeSlowdown
_HW_THROTTLE = 0x8 | 0x20 | 0x40 | 0x80


def _nvml_child() -> None:
    """In a child process (so a hung driver call costs only its time bound): every GPU's error
    counters as JSON on stdout."""
    import pynvml as nv

    nv.nvmlInit()
    gpus = []

    def get(fn: Callable, *args):
        try:
            return fn(*args)
        except nv.NVMLError:
            return None

    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        remap = get(nv.nvmlDeviceGetRemappedRows, h)
        gpus.append(
            {
                "index": i,
                "uuid": _text(get(nv.nvmlDeviceGetUUID, h)),
                "serial": _text(get(nv.nvmlDeviceGetSerial, h)),
                "ecc_volatile": get(nv.nvmlDeviceGetTotalEccErrors, h, unc, nv.NVML_VOLATILE_ECC),
                "ecc_aggregate": get(nv.nvmlDeviceGetTotalEccErrors, h, unc, nv.NVML_AGGREGATE_ECC),
                "retired_pending": 1 if get(nv.nvmlDeviceGetRetiredPagesPendingStatus, h) else 0,
                "retired_dbe": len(
                    get(
                        nv.nvmlDeviceGetRetiredPages,
                        h,
                        nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                    )
                    or ()
                ),
                "remap_pending": remap[2] if remap else 0,
                "remap_failed": remap[3] if remap else 0,
                "pcie_replay": get(nv.nvmlDeviceGetPcieReplayCounter, h),
                "throttle": get(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h),
            }
        )
    nv.nvmlShutdown()
    print(json.dumps(gpus))


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v or "")


def check_nvml(timeout_s: float) -> CheckOutcome:
    started = time.monotonic()
    try:
        import pynvml  # noqa: F401 - only whether it is there
    except ImportError:
        return CheckOutcome("nvml", "not-available", 0.0, note="pynvml is not installed")
    try:
        res = subprocess.run(
            [sys.executable, "-m", "scout_slurm.hooks.rootcheck", "nvml"],
            capture_output=True,
            text=True,
            timeout=max(0.5, timeout_s),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return CheckOutcome(
            "nvml",
            "timed-out",
            round(time.monotonic() - started, 3),
            note=f"after {timeout_s:.0f} s",
        )
    seconds = round(time.monotonic() - started, 3)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or [""])[-1][:300]
        status = (
            "not-available" if "NVMLError_LibraryNotFound" in tail or "Driver" in tail else "error"
        )
        return CheckOutcome("nvml", status, seconds, note=tail)
    try:
        gpus = json.loads(res.stdout)
    except ValueError as exc:
        return CheckOutcome("nvml", "error", seconds, note=f"unreadable output: {exc}")
    if not gpus:
        return CheckOutcome("nvml", "not-available", seconds, note="NVML sees no GPU")
    found = nvml_findings(gpus)
    return CheckOutcome(
        "nvml", "found" if found else "clean", seconds, found, note=f"{len(gpus)} GPU(s) read"
    )


def dcgmi_failures(output: str) -> tuple[RootFinding, ...]:
    """The failed tests of `dcgmi diag -r 1` text output (pure): lines like `| Deployment | Fail
    |`.
    """
    out = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[-1].lower().startswith("fail"):
            out.append(RootFinding(DCGM, " ".join(c for c in cells if c)[:300]))
    return tuple(out)


def check_dcgmi(timeout_s: float) -> CheckOutcome:
    exe = shutil.which("dcgmi", path="/usr/bin:/usr/local/bin:/usr/sbin")
    if exe is None:
        return CheckOutcome("dcgmi-diag", "not-available", 0.0, note="dcgmi is not installed")
    started = time.monotonic()
    try:
        res = subprocess.run(
            [exe, "diag", "-r", "1"],
            capture_output=True,
            text=True,
            timeout=max(0.5, timeout_s),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return CheckOutcome(
            "dcgmi-diag",
            "timed-out",
            round(time.monotonic() - started, 3),
            note=f"after {timeout_s:.0f} s",
        )
    seconds = round(time.monotonic() - started, 3)
    found = dcgmi_failures(res.stdout)
    if res.returncode != 0 and not found:
        return CheckOutcome(
            "dcgmi-diag", "error", seconds, note=(res.stderr or res.stdout).strip()[-300:]
        )
    return CheckOutcome("dcgmi-diag", "found" if found else "clean", seconds, found)


# --- orchestration -----------------------------------------------------------------------------


def run_checks(
    node: str,
    verdict: Verdict,
    *,
    budget_s: float,
    kernel_source: str,
    since_boot_s: float,
    ib_baseline: Mapping[str, int] | None,
    gpus: Sequence[GpuInfo] = (),
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> RootChecks:
    """Each check that fits in what is left of `budget_s`, in a bounded child cut off at its own
    bound or at the budget's end, whichever is first; the rest recorded as skipped. `gpus`: the
    Prolog's map of the node's GPUs (an Xid's PCI address names one of them)."""
    started, at = clock(), wall()
    deadline = started + budget_s
    # (name, least time left to start it, its own bound, the check given that bound)
    plan: list[tuple[str, float, float, Callable[[float], CheckOutcome]]] = [
        ("kernel-log", 0.5, 5.0, lambda bound: check_kernel_log(kernel_source, since_boot_s, gpus)),
        ("infiniband", 0.5, 5.0, lambda bound: check_infiniband(ib_baseline)),
        ("nvml", 2.0, 10.0, lambda bound: check_nvml(bound - CHILD_SLACK_S)),
        ("dcgmi-diag", 5.0, 60.0, lambda bound: check_dcgmi(bound - CHILD_SLACK_S)),
        (
            "compute-signature",
            SIGNATURE_LEAST_S,
            SIGNATURE_BOUND_S,
            lambda bound: check_signature(),
        ),
    ]
    outcomes = []
    for name, least, own, check in plan:
        left = deadline - clock()
        if left < least:
            outcomes.append(
                CheckOutcome(
                    name, "skipped", 0.0, note=f"{left:.1f} s left of the {budget_s:.0f} s budget"
                )
            )
            continue
        outcomes.append(bounded_check(name, check, min(own, left)))
    return RootChecks(
        node=node,
        job_id=verdict.job_id,
        restart=verdict.restart,
        verdict_kind=verdict.kind,
        started_at=at,
        seconds=round(clock() - started, 3),
        outcomes=tuple(outcomes),
    )


def bounded_check(name: str, check: Callable[[float], CheckOutcome], bound: float) -> CheckOutcome:
    """`check(bound)` in a bounded child (hooks/bounded.py), cut off at `bound`: a check stuck in
    the kernel (a hung driver, a starved CPU) costs its own bound, never the next check's time or
    the hook's, and never leaves a thread of the hook behind."""
    from scout_slurm.hooks.bounded import TIMED_OUT, run_bounded

    out = run_bounded(lambda report: _outcome_json(check(bound)), bound, name=f"root check {name}")
    if out.done and isinstance(out.result, dict):
        try:
            return _outcome_of(out.result)
        except (KeyError, TypeError, ValueError) as exc:
            return CheckOutcome(name, "error", out.seconds, note=f"unreadable outcome: {exc}")
    if out.status == TIMED_OUT:
        still = f"; abandoned in {out.state}" if out.abandoned else ""
        return CheckOutcome(
            name, "timed-out", out.seconds, note=f"cut off at its bound of {bound:.1f} s{still}"
        )
    return CheckOutcome(name, "error", out.seconds, note=out.error[:300])


def _outcome_json(outcome: CheckOutcome) -> dict:
    return {
        "name": outcome.name,
        "status": outcome.status,
        "seconds": outcome.seconds,
        "findings": [[f.category, f.detail, f.gpu_serial] for f in outcome.findings],
        "note": outcome.note,
    }


def _outcome_of(data: dict) -> CheckOutcome:
    return CheckOutcome(
        str(data["name"]),
        str(data["status"]),
        float(data["seconds"]),
        tuple(RootFinding(str(c), str(d), str(g)) for c, d, g in data["findings"]),
        str(data["note"]),
    )


def wait_for_verdict(
    path: Path,
    root: Path,
    wait_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Verdict | None:
    """The controller's verdict for this run (results/ is SlurmUser's: the job cannot write
    there), once it appears within `wait_s`; None otherwise."""
    from scout_slurm.errors import EvidenceError
    from scout_slurm.evidence.store import read_record
    from scout_slurm.incident.budget import wait_until

    if not wait_until(path.exists, bool, seconds=wait_s, clock=clock, sleep=sleep):
        return None
    try:
        return read_record(path, Verdict, root=root)
    except EvidenceError:
        return None


if __name__ == "__main__" and sys.argv[1:] == ["nvml"]:
    _nvml_child()
