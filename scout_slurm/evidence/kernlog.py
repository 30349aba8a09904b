"""The kernel's log read by its structure: one `/dev/kmsg` record (or one dmesg line) to a typed
`KernelEvent`, or None. Hardware is recognised only from the fixed form a driver or the kernel
prints at the start of its own message; a line whose text a process supplies (its name, in
segfault, trap, OOM and hung-task reports) is recognised first and never counts as hardware.
Also the Xid class table: which Xid numbers are the node's hardware, and what each corroborates.
Pure: no I/O.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scout_slurm.evidence.records import VerdictKind

MAX_TEXT = 500  # characters of a message kept as evidence
MAX_EVENTS = 200  # the last events of a read kept


class Subsystem(str, enum.Enum):
    NVIDIA = "nvidia"  # the GPU driver (NVRM)
    MCE = "mce"  # machine checks, firmware-first hardware error reports, memory poison
    EDAC = "edac"  # the memory controllers' error counters
    PCIE_AER = "pcie-aer"  # PCIe Advanced Error Reporting
    NET = "net"  # a network driver's link state
    PROCESS = "process"  # a report about one process, in which the process's name is printed


class XidClass(str, enum.Enum):
    """What an Xid usually means, after NVIDIA's Xid catalog (see XID_TABLE)."""

    APPLICATION = "application"  # the job's own doing (a bad address, a killed process)
    DRIVER = "driver"  # driver or GPU firmware: a reset may be due, not the node's hardware
    MEMORY = "memory"  # the GPU's memory: ECC, row remapping, page retirement
    MEMORY_CORRECTED = "memory-corrected"  # corrected errors only: a warning, not a wrong result
    BUS = "bus"  # PCIe: the GPU is gone from the bus
    NVLINK = "nvlink"  # the GPU-to-GPU links
    THERMAL = "thermal"  # thermal or power delivery
    UNKNOWN = "unknown"  # not in the table, or hardware and software causes alike

    @property
    def hardware(self) -> bool:
        return self in _HARDWARE_XID_CLASSES


_HARDWARE_XID_CLASSES = frozenset(
    {XidClass.MEMORY, XidClass.MEMORY_CORRECTED, XidClass.BUS, XidClass.NVLINK, XidClass.THERMAL}
)

_FAULT = frozenset({VerdictKind.CRASH, VerdictKind.HANG, VerdictKind.SDC, VerdictKind.INFRA})
_GONE = frozenset({VerdictKind.CRASH, VerdictKind.HANG, VerdictKind.INFRA})
_SLOW = frozenset({VerdictKind.STRAGGLER})
_NOTHING: frozenset[VerdictKind] = frozenset()

# Which verdicts an Xid of each class corroborates: bad memory explains a crash, a hang or wrong
# numbers; a GPU gone from its bus or links explains a crash or a hang, and a link that replays
# a slow rank; heat or power a crash, a hang or a slow rank. Application, driver and unknown Xids
# corroborate nothing: they do not show that the node's hardware failed.
XID_CLASS_CORROBORATES: Mapping[XidClass, frozenset[VerdictKind]] = {
    XidClass.MEMORY: _FAULT,
    XidClass.MEMORY_CORRECTED: _SLOW,
    XidClass.BUS: _GONE,
    XidClass.NVLINK: _GONE | _SLOW,
    XidClass.THERMAL: frozenset({VerdictKind.CRASH, VerdictKind.HANG, VerdictKind.STRAGGLER}),
    XidClass.APPLICATION: _NOTHING,
    XidClass.DRIVER: _NOTHING,
    XidClass.UNKNOWN: _NOTHING,
}


@dataclass(frozen=True)
class XidInfo:
    number: int
    xid_class: XidClass
    what: str
    corroborates: frozenset[VerdictKind]


def _xid(number: int, cls: XidClass, what: str) -> XidInfo:
    return XidInfo(number, cls, what, XID_CLASS_CORROBORATES[cls])


# Source: NVIDIA, "Xid Errors" (docs.nvidia.com/deploy/xid-errors/, the table of possible causes
# per Xid) and "Analyzing Xid Errors with the Xid Catalog" (docs.nvidia.com/deploy/xid-errors/
# analyzing-xid-catalog.html, the resolution buckets), and "A100 GPU memory error management" for
# the ECC Xids, read 2026-12. The descriptions are ours. Only Xids whose cause those pages place
# clearly are listed; any other number is UNKNOWN and corroborates nothing.
XID_TABLE: Mapping[int, XidInfo] = {
    x.number: x
    for x in (
        # the application's: the catalog's first action is to restart or check the application
        _xid(13, XidClass.APPLICATION, "graphics engine exception (often an illegal address)"),
        _xid(31, XidClass.APPLICATION, "GPU memory page fault (the MMU refused an access)"),
        _xid(43, XidClass.APPLICATION, "a channel stopped after the application's own error"),
        # logged when a process with GPU work in flight is killed: scout's watchdog does that
        _xid(45, XidClass.APPLICATION, "preemptive cleanup of a killed or failed process"),
        _xid(38, XidClass.DRIVER, "driver firmware error"),
        _xid(119, XidClass.DRIVER, "GPU System Processor (GSP) RPC timeout"),
        _xid(120, XidClass.DRIVER, "GPU System Processor (GSP) error"),
        _xid(154, XidClass.DRIVER, "the GPU's recovery action changed (see the Xid before it)"),
        _xid(48, XidClass.MEMORY, "double-bit (uncorrectable) ECC error"),
        _xid(63, XidClass.MEMORY, "row remapping or page retirement recorded: reset pending"),
        _xid(64, XidClass.MEMORY, "row remapping or page retirement failed"),
        _xid(92, XidClass.MEMORY_CORRECTED, "high single-bit (corrected) ECC error rate"),
        # contained to the processes that used the memory (they are ended), but the memory failed
        _xid(94, XidClass.MEMORY, "contained uncorrectable ECC error"),
        _xid(95, XidClass.MEMORY, "uncontained uncorrectable ECC error"),
        _xid(140, XidClass.MEMORY, "unrecovered ECC error"),
        _xid(171, XidClass.MEMORY, "uncorrectable ECC error in DRAM"),
        _xid(172, XidClass.MEMORY, "uncorrectable ECC error in SRAM"),
        _xid(79, XidClass.BUS, "the GPU has fallen off the bus"),
        _xid(74, XidClass.NVLINK, "NVLink error"),
        _xid(54, XidClass.THERMAL, "auxiliary power is not connected to the board"),
        # listed, but the pages give hardware and software causes alike
        _xid(8, XidClass.UNKNOWN, "GPU stopped processing"),
        _xid(32, XidClass.UNKNOWN, "invalid or corrupted push buffer stream"),
        _xid(61, XidClass.UNKNOWN, "internal micro-controller breakpoint or warning"),
        _xid(62, XidClass.UNKNOWN, "internal micro-controller halt"),
    )
}


def xid_info(number: int) -> XidInfo:
    return XID_TABLE.get(number) or _xid(number, XidClass.UNKNOWN, "not in scout's Xid table")


# --- categories --------------------------------------------------------------------------------
# The names findings and node evidence carry. `HARDWARE_FAULTS` are those that show the node's
# hardware failed (a site may drain on them); the corrected ones and the rest only inform.

XID_CATEGORY_PREFIX = "nvidia-xid-"
FALLEN_OFF = "gpu-fallen-off"
MACHINE_CHECK = "machine-check"
CPU_THERMAL = "cpu-thermal"
EDAC_UE = "edac"
EDAC_CE = "edac-corrected"
AER_UNCORRECTED = "pcie-aer"
AER_CORRECTED = "pcie-aer-corrected"
LINK_DOWN = "link-down"
OOM = "oom-killer"
PROCESS_FAULT = "process-fault"
HUNG_TASK = "hung-task"


def xid_category(cls: XidClass) -> str:
    return f"{XID_CATEGORY_PREFIX}{cls.value}"


_ALL_BUT_SLOW = _FAULT
CATEGORY_CORROBORATES: Mapping[str, frozenset[VerdictKind]] = {
    **{xid_category(c): k for c, k in XID_CLASS_CORROBORATES.items()},
    FALLEN_OFF: _GONE,
    MACHINE_CHECK: _ALL_BUT_SLOW | _SLOW,
    CPU_THERMAL: _SLOW,
    EDAC_UE: _ALL_BUT_SLOW | _SLOW,
    EDAC_CE: _SLOW,
    AER_UNCORRECTED: _ALL_BUT_SLOW,
    AER_CORRECTED: _SLOW,
    LINK_DOWN: frozenset({VerdictKind.HANG, VerdictKind.INFRA, VerdictKind.STRAGGLER}),
    OOM: _NOTHING,
    PROCESS_FAULT: _NOTHING,
    HUNG_TASK: _NOTHING,
}
HARDWARE_FAULTS = frozenset(
    {xid_category(c) for c in _HARDWARE_XID_CLASSES - {XidClass.MEMORY_CORRECTED}}
    | {FALLEN_OFF, MACHINE_CHECK, EDAC_UE, AER_UNCORRECTED}
)


def corroborated_by(kind: VerdictKind) -> frozenset[str]:
    """The kernel-log categories that corroborate a verdict of `kind`."""
    return frozenset(c for c, kinds in CATEGORY_CORROBORATES.items() if kind in kinds)


# --- the event ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelEvent:
    subsystem: Subsystem
    category: str  # one of CATEGORY_CORROBORATES
    text: str  # the message, first MAX_TEXT characters
    seconds_since_boot: float = 0.0  # from the kmsg record; 0 for a bare message
    xid: int | None = None
    xid_class: XidClass | None = None
    pci: str = ""  # lower case; an Xid's "dddd:bb:dd", a device's "dddd:bb:dd.f"

    @property
    def hardware_fault(self) -> bool:
        return self.category in HARDWARE_FAULTS

    @property
    def corroborates(self) -> frozenset[VerdictKind]:
        return CATEGORY_CORROBORATES.get(self.category, _NOTHING)


# --- shapes of messages that carry a process's name ----------------------------------------------
# The kernel prints `task->comm`, at most 15 bytes that the process chooses (prctl PR_SET_NAME,
# or its executable's name). /dev/kmsg shows a byte below 0x20, above 0x7e or a backslash as
# `\xNN`, so one byte of the name is one character or one such escape.
_COMM = r"(?:\\x[0-9a-fA-F]{2}|[^\n]){1,15}?"
_PROCESS_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (category, re.compile(pattern))
    for category, pattern in (
        # `<comm>[pid]: segfault at ...`, `<comm>[pid] trap int3 ...`, `<comm>[pid]: bad frame`,
        # `<comm>[pid]: potentially unexpected fatal signal 11.`, `<comm>[pid] general protection`
        (PROCESS_FAULT, rf"^{_COMM}\[\d+\]"),
        # `<comm> (pid) used greatest stack depth: ...`, `<comm> (pid): drop_caches: 3`
        (PROCESS_FAULT, rf"^{_COMM} \(\d+\)"),
        # `traps: <comm>[pid] general protection fault ...`, `traps: <comm>[pid] trap divide error`
        (PROCESS_FAULT, r"^traps: "),
        (PROCESS_FAULT, r"^(?:audit|umip|x86/split lock detection): "),
        (PROCESS_FAULT, r"^(?:potentially unexpected fatal signal|process ')"),
        (OOM, rf"^{_COMM} invoked oom-killer: "),
        (OOM, rf"^{_COMM}: page allocation failure: "),
        (OOM, rf"^{_COMM} cpuset="),
        (OOM, r"^(?:Memory cgroup out of memory|Out of memory)(?: and no killable processes)?[:.]"),
        (OOM, r"^oom(?:-kill|_reaper):"),
        (HUNG_TASK, r"^INFO: task "),
        (HUNG_TASK, r"^task:"),
    )
)

# --- the kernel's and drivers' own forms ----------------------------------------------------------
_HEX = "[0-9a-fA-F]"
_BDF = rf"{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}}\.[0-7]"
# NVIDIA open-gpu-kernel-modules, kernel_rc.c: "NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u
# [ GPU-CI:%02u]]): %d, pid=%s, name=%s, %s"; older drivers print the address without "PCI:".
# The name field is a process's: only the fields before it are read.
_XID = re.compile(
    rf"^NVRM: Xid \((?:PCI:)?(?P<pci>{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}})"
    r"(?: GPU-I:\d{1,3})?(?: GPU-CI:\d{1,3})?\): (?P<xid>\d{1,4})(?:[,;]|$)"
)
# nv.c: "NVRM: GPU %04x:%02x:%02x.%x: GPU has fallen off the bus." (and the UUID form of it)
_FALLEN = re.compile(
    rf"^NVRM: GPU (?:at PCI:)?(?P<pci>{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}}(?:\.[0-7])?): "
    r"(?:GPU-[0-9a-fA-F-]{36} )?(?:GPU )?has fallen off the bus\.?$"
)
# arch/x86/kernel/cpu/mce: pr_fmt "mce: ", HW_ERR "[Hardware Error]: "; APEI/GHES (cper.c) print
# "{N}[Hardware Error]: "; mm/memory-failure.c: pr_fmt "Memory failure: ", then the page frame.
_MCE = re.compile(
    r"^(?:mce: \[Hardware Error\]: |\{\d{1,10}\}\[Hardware Error\]: |\[Hardware Error\]: )"
)
_MEMORY_FAILURE = re.compile(r"^Memory failure: 0x[0-9a-f]+: ")
# therm_throt.c: "CPU%d: %s temperature above threshold, cpu clock throttled ..."
_CPU_THERMAL = re.compile(r"^mce: CPU\d+: (?:Core|Package) temperature above threshold, ")
# drivers/edac/edac_mc.c: edac_mc_printk -> "EDAC MC%d: " then
# "%d CE %s%son %s (%s ...)" or "%d UE %s%son %s (%s ...)"
_EDAC = re.compile(r"^EDAC MC\d{1,4}: (?P<count>\d+) (?P<sev>CE|UE) [A-Za-z].*\bon .+ \(.*\)$")
# drivers/pci/pcie/aer.c through dev_printk: "<driver> <bdf>: AER: ..." or, older, without "AER: "
_DEVICE = re.compile(
    rf"^(?P<driver>[\w.-]{{1,32}}) (?P<bdf>{_BDF})(?: (?P<ifname>[\w.@-]{{1,16}}))?: (?P<rest>.*)$"
)
_AER_SEVERITY = re.compile(
    r"^(?:AER: )?(?:PCIe Bus Error: severity=|(?:Multiple )?)"
    r"(?P<sev>Uncorrect(?:ed|able) \((?:Non-)?Fatal\)|Correct(?:ed|able))"
    r"(?:, type=| error (?:message )?received)"
)
# a network driver's netdev_printk: "<driver> <bdf> <ifname>: [<driver>: <ifname> ][NIC ]Link is
# Down"
_LINK_DOWN = re.compile(r"^(?:[\w-]{1,32}: [\w.@-]{1,16} )?(?:NIC )?Link is Down\b")


def classify_message(text: str, *, seconds_since_boot: float = 0.0) -> KernelEvent | None:
    """The event one kernel message (the text after the kmsg header) reports, or None."""
    text = text.split("\n", 1)[0][:MAX_TEXT]
    for category, pattern in _PROCESS_SHAPES:
        if pattern.match(text):
            return KernelEvent(Subsystem.PROCESS, category, text, seconds_since_boot)
    if text.startswith("NVRM: "):
        m = _XID.match(text)
        if m:
            info = xid_info(int(m["xid"]))
            return KernelEvent(
                Subsystem.NVIDIA,
                xid_category(info.xid_class),
                text,
                seconds_since_boot,
                xid=info.number,
                xid_class=info.xid_class,
                pci=m["pci"].lower(),
            )
        m = _FALLEN.match(text)
        if m:
            return KernelEvent(
                Subsystem.NVIDIA, FALLEN_OFF, text, seconds_since_boot, pci=m["pci"].lower()
            )
        return None
    if _MCE.match(text) or _MEMORY_FAILURE.match(text):
        return KernelEvent(Subsystem.MCE, MACHINE_CHECK, text, seconds_since_boot)
    if _CPU_THERMAL.match(text):
        return KernelEvent(Subsystem.MCE, CPU_THERMAL, text, seconds_since_boot)
    m = _EDAC.match(text)
    if m:
        category = EDAC_UE if m["sev"] == "UE" else EDAC_CE
        return KernelEvent(Subsystem.EDAC, category, text, seconds_since_boot)
    m = _DEVICE.match(text)
    if m:
        aer = _AER_SEVERITY.match(m["rest"])
        if aer and not m["ifname"]:
            category = AER_UNCORRECTED if aer["sev"].startswith("Uncorrect") else AER_CORRECTED
            return KernelEvent(
                Subsystem.PCIE_AER, category, text, seconds_since_boot, pci=m["bdf"].lower()
            )
        if _LINK_DOWN.match(m["rest"]):
            return KernelEvent(
                Subsystem.NET, LINK_DOWN, text, seconds_since_boot, pci=m["bdf"].lower()
            )
    return None


# --- records -------------------------------------------------------------------------------------

_HEADER = re.compile(r"^(?P<prio>[0-9]{1,10}),(?P<seq>[0-9]{1,20}),(?P<usec>[0-9]{1,20})(?:,|$)")
_DMESG_TIME = re.compile(r"^\[\s*(?P<s>[0-9]{1,12}\.[0-9]{1,9})\] ")


def event_from_record(record: str) -> KernelEvent | None:
    """One /dev/kmsg record, "prio,seq,usec,flags[,...];message" (the lines " KEY=value" that
    follow some records carry no header and are not records). A record whose facility is not
    the kernel's (prio >= 8) was written to /dev/kmsg by a process: it is never an event."""
    head, sep, text = record.partition(";")
    if not sep:
        return None
    m = _HEADER.match(head)
    if not m or int(m["prio"]) >> 3 != 0:
        return None
    return classify_message(text, seconds_since_boot=round(int(m["usec"]) / 1e6, 6))


def event_from_dmesg_line(line: str) -> KernelEvent | None:
    """One line of `dmesg` output, "[   12.345678] message" (the time is optional)."""
    m = _DMESG_TIME.match(line)
    if m:
        return classify_message(line[m.end() :], seconds_since_boot=float(m["s"]))
    return classify_message(line)


def events_since(records: Iterable[str], *, since_boot_s: float) -> list[KernelEvent]:
    """The events of /dev/kmsg records logged at or after `since_boot_s`, the last MAX_EVENTS."""
    out = []
    for rec in records:
        event = event_from_record(rec)
        if event is not None and event.seconds_since_boot >= since_boot_s:
            out.append(event)
    return out[-MAX_EVENTS:]
