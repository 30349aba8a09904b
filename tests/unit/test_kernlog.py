"""The kernel log read by its structure (issue 40: a process name forged a hardware error; issue
44: Xid classes and the Xid's GPU). Genuine lines in the forms the kernel and the drivers print
them; every kernel line shape that prints a process's name, with any name, never hardware."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scout_slurm.evidence import kernlog
from scout_slurm.evidence.kernlog import (
    HARDWARE_FAULTS,
    XID_TABLE,
    Subsystem,
    XidClass,
    classify_message,
    event_from_dmesg_line,
    event_from_record,
    events_since,
    xid_info,
)
from scout_slurm.evidence.records import VerdictKind
from scout_slurm.hooks import rootcheck as rc
from scout_slurm.hwmap.records import GpuInfo, gpu_at_pci

C, H, S, INF, X = (
    VerdictKind.CRASH,
    VerdictKind.HANG,
    VerdictKind.SDC,
    VerdictKind.INFRA,
    VerdictKind.STRAGGLER,
)

# --- genuine lines, recorded in the forms the kernel and drivers print
# -----------------------------
# (message, category, subsystem, xid, pci)
GENUINE = [
    (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
        "the bus.",
        "nvidia-xid-bus",
        Subsystem.NVIDIA,
        79,
        "0000:3b:00",
    ),
    (
        "NVRM: Xid (PCI:0000:86:00): 48, pid=9021, name=python, Ch 00000008, DBE (0x00000002)",
        "nvidia-xid-memory",
        Subsystem.NVIDIA,
        48,
        "0000:86:00",
    ),
    (
        "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, name=python3, Contained: CE User "
        "Channel (0x9). RST: No, D-RST: No",
        "nvidia-xid-memory",
        Subsystem.NVIDIA,
        94,
        "0000:01:00",
    ),
    (
        "NVRM: Xid (PCI:0000:C1:00 GPU-I:01 GPU-CI:00): 74, pid=11, name=pt_main_thread, NVLink: "
        "fatal error detected on link 3",
        "nvidia-xid-nvlink",
        Subsystem.NVIDIA,
        74,
        "0000:c1:00",
    ),
    (
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception on "
        "(GPC 0, TPC 0, SM 0): Out Of Range Address",
        "nvidia-xid-application",
        Subsystem.NVIDIA,
        13,
        "0000:3b:00",
    ),
    (
        "NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python, Ch 00000010, intr 10000000. MMU "
        "Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_00000000. Fault is of type "
        "FAULT_PDE ACCESS_TYPE_VIRT_READ",
        "nvidia-xid-application",
        Subsystem.NVIDIA,
        31,
        "0000:3b:00",
    ),
    (
        "NVRM: Xid (PCI:0000:3b:00): 45, pid=1234, name=python, Ch 00000010",
        "nvidia-xid-application",
        Subsystem.NVIDIA,
        45,
        "0000:3b:00",
    ),
    (
        "NVRM: Xid (PCI:0000:65:00): 119, pid=2012, name=nvidia-smi, Timeout after 6s of waiting "
        "for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL).",
        "nvidia-xid-driver",
        Subsystem.NVIDIA,
        119,
        "0000:65:00",
    ),
    (
        "NVRM: Xid (PCI:0000:3b:00): 92, pid=<unknown>, name=<unknown>, High single-bit ECC "
        "error rate",
        "nvidia-xid-memory-corrected",
        Subsystem.NVIDIA,
        92,
        "0000:3b:00",
    ),
    (  # an older driver: no "PCI:" and no process fields
        "NVRM: Xid (0000:01:00): 62, 0096(1c54) 00000000 00000000",
        "nvidia-xid-unknown",
        Subsystem.NVIDIA,
        62,
        "0000:01:00",
    ),
    (
        "NVRM: Xid (PCI:0000:3b:00): 250, pid=1, name=x, a number the table does not know",
        "nvidia-xid-unknown",
        Subsystem.NVIDIA,
        250,
        "0000:3b:00",
    ),
    (
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "gpu-fallen-off",
        Subsystem.NVIDIA,
        None,
        "0000:3b:00.0",
    ),
    (
        "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 5: be00000000800400",
        "machine-check",
        Subsystem.MCE,
        None,
        "",
    ),
    (
        "mce: [Hardware Error]: Machine check events logged",
        "machine-check",
        Subsystem.MCE,
        None,
        "",
    ),
    (
        "{1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 0",
        "machine-check",
        Subsystem.MCE,
        None,
        "",
    ),
    (
        "Memory failure: 0x1f2a3b: recovery action for dirty LRU page: Recovered",
        "machine-check",
        Subsystem.MCE,
        None,
        "",
    ),
    (
        "mce: CPU12: Package temperature above threshold, cpu clock throttled (total events = 8)",
        "cpu-thermal",
        Subsystem.MCE,
        None,
        "",
    ),
    (
        "EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 "
        "page:0x12345 offset:0x0 grain:32 - err_code:0000:009f socket:0 ha:0 channel_mask:2 "
        "rank:0)",
        "edac",
        Subsystem.EDAC,
        None,
        "",
    ),
    (
        "EDAC MC1: 3 CE memory read error on CPU_SrcID#1_MC#0_Chan#0_DIMM#0 (channel:0 slot:0 "
        "page:0x4fd1 offset:0x240 grain:32 syndrome:0x0)",
        "edac-corrected",
        Subsystem.EDAC,
        None,
        "",
    ),
    (
        "pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0",
        "pcie-aer",
        Subsystem.PCIE_AER,
        None,
        "0000:3a:00.0",
    ),
    (
        "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Inaccessible, "
        "(Unregistered Agent ID)",
        "pcie-aer",
        Subsystem.PCIE_AER,
        None,
        "0000:3b:00.0",
    ),
    (
        "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), "
        "type=Transaction Layer, (Requester ID)",
        "pcie-aer",
        Subsystem.PCIE_AER,
        None,
        "0000:3b:00.0",
    ),
    (
        "pcieport 0000:00:01.0: AER: Multiple Corrected error message received from 0000:3b:00.0",
        "pcie-aer-corrected",
        Subsystem.PCIE_AER,
        None,
        "0000:00:01.0",
    ),
    (
        "pcieport 0000:00:1c.5: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
        "(Receiver ID)",
        "pcie-aer-corrected",
        Subsystem.PCIE_AER,
        None,
        "0000:00:1c.5",
    ),
    (
        "mlx5_core 0000:5e:00.0 ib0: Link is Down",
        "link-down",
        Subsystem.NET,
        None,
        "0000:5e:00.0",
    ),
    (
        "ice 0000:18:00.0 ens1f0: NIC Link is Down",
        "link-down",
        Subsystem.NET,
        None,
        "0000:18:00.0",
    ),
    (
        "igb 0000:01:00.0 eno1: igb: eno1 NIC Link is Down",
        "link-down",
        Subsystem.NET,
        None,
        "0000:01:00.0",
    ),
]


@pytest.mark.parametrize("text,category,subsystem,xid,pci", GENUINE)
def test_genuine_lines(text, category, subsystem, xid, pci):
    event = classify_message(text)
    assert event is not None, text
    assert (event.category, event.subsystem, event.xid, event.pci) == (
        category,
        subsystem,
        xid,
        pci,
    )
    assert event.text == text
    assert event.hardware_fault is (category in HARDWARE_FAULTS)


@pytest.mark.parametrize(
    "text",
    [
        "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
        "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode",
        "nvidia-uvm: Loaded the UVM driver, major device number 507.",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: GPU at PCI:0000:3b:00: GPU-6f0c1a77-3a7b-4c1f-b0a4-63f7e0d3a8c2",  # only its UUID
        "EDAC MC0: Giving out device to module skx_edac controller Skylake Socket#0 IMC#0",
        "EDAC amd64: F19h detected (node 0).",
        "pcieport 0000:00:01.0: AER: enabled with IRQ 26",
        "nvidia 0000:3b:00.0:   device [10de:2330] error status/mask=00001000/0000e000",
        "mce: Using 32 MCE banks",
        "aerospace aerial maced",
        "",
    ],
)
def test_ordinary_lines_are_no_event(text):
    assert classify_message(text) is None


# --- every shape of kernel line that prints a process's name (`comm`)
# -------------------------------
# `{c}` is the name as the kernel prints it (task->comm, at most 15 bytes; /dev/kmsg shows a
# control byte, a byte above 0x7e or a backslash as \xNN).
COMM_SHAPES = [
    # arch/x86/mm/fault.c show_signal_msg (the issue's own line)
    "{c}[16715]: segfault at 0 ip 00007f3a2b4c5d6e sp 00007ffd1a2b3c40 error 4 in "
    "libc.so.6[7f3a2b400000+195000] likely on CPU 3 (core 3, socket 0)",
    "{c}[16715]: segfault at 8 ip 000055d5 sp 00007ffc error 6 in python3.11[55d5+2000]",
    # arch/x86/kernel/traps.c, pr_fmt "traps: "
    "traps: {c}[4242] general protection fault ip:7f12 sp:7ffd error:0 in libx.so[7f10+3000]",
    "traps: {c}[4242] trap divide error ip:55d5c sp:7ffc9 error:0 in a.out[55d5+1000]",
    "traps: {c}[4242] trap invalid opcode ip:55d5c sp:7ffc9 error:0 in a.out[55d5+1000]",
    "traps: {c}[4242] trap int3 ip:55d5c sp:7ffc9 error:0",
    # older kernels, without the prefix
    "{c}[4242] trap int3 ip:55d5c sp:7ffc9 error:0",
    "{c}[4242] general protection ip:7f12 sp:7ffd error:0 in libx.so[7f10+3000]",
    # arch/x86/kernel/signal.c
    "{c}[4242] bad frame in rt_sigreturn frame:00007ffd ip:7f12 sp:7ffd orax:ffffffffffffffff",
    "{c}[4242]: bad frame in setup_rt_frame frame:00007ffd ip:7f12 sp:7ffd",
    # kernel/signal.c print_fatal_signal
    "{c}[4242]: potentially unexpected fatal signal 11.",
    "potentially unexpected fatal signal 11.",
    # mm/oom_kill.c and mm/page_alloc.c
    "{c} invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, "
    "oom_score_adj=0",
    "Out of memory: Killed process 4242 ({c}) total-vm:91234567kB, anon-rss:81234567kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:170000kB oom_score_adj:0",
    "Memory cgroup out of memory: Killed process 4242 ({c}) total-vm:1kB, anon-rss:1kB",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg="
    "/slurm/uid_1000/job_5,task_memcg=/slurm/uid_1000/job_5/step_0,task={c},pid=4242,uid=1000",
    "oom_reaper: reaped process 4242 ({c}), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
    "{c}: page allocation failure: order:5, mode:0x40cc0(GFP_KERNEL|__GFP_COMP), nodemask=(null)",
    "{c} cpuset=/ mems_allowed=0",
    # kernel/hung_task.c and the task dump after it
    "INFO: task {c}:4242 blocked for more than 120 seconds.",
    "task:{c}       state:D stack:0     pid:4242  ppid:1      flags:0x00004002",
    # kernel/exit.c (CONFIG_DEBUG_STACK_USAGE) and fs/drop_caches.c
    "{c} (4242) used greatest stack depth: 11488 bytes left",
    "{c} (4242): drop_caches: 3",
    # kernel/audit.c, arch/x86/kernel/umip.c, split lock detection
    "audit: type=1326 audit(1733400000.123:42): auid=1000 uid=1000 gid=1000 ses=3 pid=4242 "
    'comm="{c}" '
    'exe="/home/u/{c}" sig=31 arch=c000003e syscall=39 compat=0 ip=0x7f code=0x0',
    "umip: {c}[4242] ip:4010f0 sp:7ffd: SGDT instruction cannot be used by applications.",
    "x86/split lock detection: #AC: {c}/4242 took a split_lock trap at address: 0x401ee0",
]

NAMES = [
    "NVRM: Xid 79",
    "NVRM: Xid (PCI:",
    "mce",
    "mce: [Hardware ",
    "EDAC",
    "EDAC MC0: 1 UE",
    "EDAC MC0: 1 UE ",
    "AER",
    "pcieport 0000:0",
    "x 0000:00:01.0",
    "[Hardware Error",
    "{1}[Hardware Er",
    "Link is Down",
    "x: Link is Down",
    "Memory failure:",
    "python",
]


def _shaped(shape: str, name: str) -> str:
    return shape.replace("{c}", name)


@pytest.mark.parametrize("shape", COMM_SHAPES)
@pytest.mark.parametrize("name", NAMES)
def test_a_process_name_never_makes_a_hardware_event(shape, name):
    event = classify_message(_shaped(shape, name))
    assert event is None or (
        event.subsystem is Subsystem.PROCESS
        and not event.hardware_fault
        and event.corroborates == frozenset()
    ), (shape, name, event)


def test_the_issues_own_line_is_a_process_fault():
    record = (
        "4,5001,3600000000,-;NVRM: Xid 79[16715]: segfault at 0 ip 0000 sp 0000 error 4 in "
        "a[400000+1000]"
    )
    event = event_from_record(record)
    assert event.category == "process-fault" and event.xid is None and event.pci == ""
    assert rc.corroborating(_checks_of(record), VerdictKind.CRASH) == ()


def _comm_bytes() -> st.SearchStrategy[str]:
    """Any comm of 1..15 bytes, as /dev/kmsg shows it (non-printable bytes and `\\` escaped)."""

    def shown(raw: bytes) -> str:
        return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in raw)

    adversarial = st.sampled_from([n.encode() for n in NAMES] + [b"[Hardware Error]"[:15]])
    return st.one_of(adversarial, st.binary(min_size=1, max_size=15)).map(shown)


def _comm_text() -> st.SearchStrategy[str]:
    """Any comm of up to 15 characters as text (a dmesg line, a test double)."""
    return st.one_of(
        st.text(min_size=1, max_size=15).filter(lambda t: "\n" not in t),
        st.sampled_from(NAMES),
        # a prefix of a genuine line, cut to the 15 bytes the kernel keeps
        st.sampled_from([g[0][:15] for g in GENUINE]),
    )


@settings(
    max_examples=2000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.sampled_from(COMM_SHAPES), st.one_of(_comm_bytes(), _comm_text()), st.integers(0, 7))
def test_property_no_comm_in_any_shape_is_hardware(shape, comm, level):
    record = f"{level},77,5000000,-;{_shaped(shape, comm)}"
    for event in (event_from_record(record), classify_message(_shaped(shape, comm))):
        assert event is None or (
            event.subsystem is Subsystem.PROCESS
            and not event.hardware_fault
            and not event.corroborates
            and event.xid is None
        ), (shape, comm, event)


@settings(max_examples=300, deadline=None, database=None)
@given(st.sampled_from([g[0] for g in GENUINE]), st.integers(1, 191))
def test_property_a_process_writing_to_kmsg_is_not_the_kernel(text, prio):
    """A process may write a record to /dev/kmsg; the kernel gives it the user facility (prio >= 8)
    unless root names another: such a record is never an event, however genuine its text."""
    prio = prio if prio >= 8 else prio + 8
    assert event_from_record(f"{prio},1,5000000,-;{text}") is None


# --- records, dmesg lines ------------------------------------------------------------------------


def test_records_and_dmesg_lines():
    xid = GENUINE[0][0]
    event = event_from_record(f"3,9001,5000000,-,caller=T42;{xid}")
    assert event.seconds_since_boot == 5.0 and event.xid == 79
    assert event_from_dmesg_line(f"[ 4909.922970] {xid}").seconds_since_boot == 4909.92297
    assert event_from_dmesg_line(xid).xid == 79
    for bad in (xid, "3,1;" + xid, "3,x,5,-;" + xid, " SUBSYSTEM=pci", "3,1,5,-"):
        assert event_from_record(bad) is None, bad


def test_events_since_keeps_the_last():
    records = [f"4,{i},{1_000_000 + i},-;{GENUINE[0][0]}" for i in range(kernlog.MAX_EVENTS + 5)]
    got = events_since(records, since_boot_s=1.000002)
    assert len(got) == kernlog.MAX_EVENTS and got[-1].seconds_since_boot == 1.000204


# --- the Xid class table --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "xid,cls,kinds",
    [
        (13, XidClass.APPLICATION, set()),
        (31, XidClass.APPLICATION, set()),
        (43, XidClass.APPLICATION, set()),
        (45, XidClass.APPLICATION, set()),
        (48, XidClass.MEMORY, {C, H, S, INF}),
        (63, XidClass.MEMORY, {C, H, S, INF}),
        (64, XidClass.MEMORY, {C, H, S, INF}),
        (94, XidClass.MEMORY, {C, H, S, INF}),
        (95, XidClass.MEMORY, {C, H, S, INF}),
        (92, XidClass.MEMORY_CORRECTED, {X}),
        (79, XidClass.BUS, {C, H, INF}),
        (74, XidClass.NVLINK, {C, H, INF, X}),
        (54, XidClass.THERMAL, {C, H, X}),
        (119, XidClass.DRIVER, set()),
        (120, XidClass.DRIVER, set()),
        (62, XidClass.UNKNOWN, set()),
        (999, XidClass.UNKNOWN, set()),
    ],
)
def test_xid_classes(xid, cls, kinds):
    info = xid_info(xid)
    assert info.xid_class is cls and info.corroborates == kinds
    assert cls.hardware is (
        cls
        in {
            XidClass.MEMORY,
            XidClass.MEMORY_CORRECTED,
            XidClass.BUS,
            XidClass.NVLINK,
            XidClass.THERMAL,
        }
    )


def test_only_hardware_xids_corroborate_and_the_table_agrees_with_the_categories():
    for number, info in XID_TABLE.items():
        assert info.number == number
        assert bool(info.corroborates) is info.xid_class.hardware, info
        event = classify_message(f"NVRM: Xid (PCI:0000:3b:00): {number}, pid=1, name=x, m")
        assert event.xid_class is info.xid_class and event.corroborates == info.corroborates
        for kind in VerdictKind:
            in_root_table = event.category in rc.CORROBORATES.get(kind, frozenset())
            assert in_root_table is (kind in info.corroborates), (number, kind)


# --- the Xid's GPU --------------------------------------------------------------------------------


def _gpu(index: int, bus_id: str) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        serial=f"SER{index}",
        pci_bus_id=bus_id,
        name="H100",
        driver_version="550",
        cuda_driver_version="12.4",
        ecc_mode="enabled",
        numa_node=0,
    )


GPUS = (_gpu(0, "0000:1b:00.0"), _gpu(1, "0000:3b:00.0"), _gpu(2, "0001:3b:00.0"))


@pytest.mark.parametrize(
    "address,index",
    [
        ("0000:3b:00", 1),  # an Xid's: no function
        ("0000:3B:00", 1),
        ("0000:3b:00.0", 1),  # a device's
        ("0001:3b:00", 2),  # another domain
        ("0000:3b:00.1", None),  # the GPU's audio function, not the GPU
        ("0000:5e:00", None),
        ("", None),
        ("3b:00", None),
    ],
)
def test_gpu_at_pci(address, index):
    got = gpu_at_pci(GPUS, address)
    assert (got.index if got else None) == index


def test_the_root_check_charges_an_xid_to_the_gpu_at_its_address():
    event = classify_message(GENUINE[0][0])
    finding = rc.kernel_finding(event, GPUS)
    assert finding.gpu_serial == "SER1" and finding.category == "nvidia-xid-bus"
    assert finding.detail.endswith(f"[GPU 1 {GPUS[1].uuid}]")
    assert rc.kernel_finding(event, ()).gpu_serial == ""  # no map: no GPU named


def _checks_of(*records: str) -> rc.RootChecks:
    events = events_since(list(records), since_boot_s=0)
    findings = tuple(rc.kernel_finding(e) for e in events if e.subsystem is not Subsystem.PROCESS)
    return rc.RootChecks(
        node="n1",
        job_id=1,
        restart=0,
        verdict_kind=VerdictKind.CRASH,
        started_at=0.0,
        seconds=0.0,
        outcomes=(rc.CheckOutcome("kernel-log", "found" if findings else "clean", 0.0, findings),),
    )


@pytest.mark.parametrize("shape", COMM_SHAPES)
def test_the_hardware_forms_alone_refuse_every_shape(shape, monkeypatch):
    """Two layers: the shapes that carry a name are recognised first, and each hardware form is
    strict enough by itself that none of those shapes, with any of the names, fits it."""
    monkeypatch.setattr(kernlog, "_PROCESS_SHAPES", ())
    for name in NAMES:
        event = classify_message(_shaped(shape, name))
        assert event is None or not event.hardware_fault, (shape, name, event)
