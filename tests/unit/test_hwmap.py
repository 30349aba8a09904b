"""The hardware map: sysfs trees (one recorded, one constructed) parsed to exact values, the
nearest NIC by PCI ancestry, CUDA_VISIBLE_DEVICES resolution, a broken NVML reported not
raised, unreadable files reported not hung, the Prolog's folders, owners, modes and exit codes,
and the rank-to-hardware table."""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import stat
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence import store
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import RankPlace
from scout_slurm.hooks import prolog
from scout_slurm.hwmap import collect, join, nvml, sysfs
from scout_slurm.hwmap.records import (
    Affinity,
    GpuInfo,
    GpuNic,
    HardwareMap,
    IbPort,
    NicInfo,
    NicKind,
)
from scout_slurm.report.map_table import RankMapRow, rank_map_rows, render_rank_map_table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
VM = FIXTURES / "vm-ethernet"
GPU_IB = FIXTURES / "gpu-ib-switch"
REPO = Path(__file__).resolve().parents[2]

GPU0_UUID = "GPU-5f0c9a2e-1b3d-4c6a-9e8f-0a1b2c3d4e5f"
GPU1_UUID = "GPU-7a8b9c0d-2e3f-4a5b-8c6d-1e2f3a4b5c6d"
MIG_UUID = "MIG-0a1b2c3d-4e5f-5a6b-9c7d-8e9f0a1b2c3d"


# -------------------------------------------------------------------------------------------
# A fake NVML: the object `read_gpus(loader=...)` gets instead of the pynvml module
# -------------------------------------------------------------------------------------------


class FakeNvml:
    """pynvml's API over a list of GPUs; `fail` maps (function, gpu index or None) to the
    exception that call raises; `delay_init_s` makes nvmlInit hang that long."""

    def __init__(self, gpus=(), *, fail=None, delay_init_s=0.0, driver="550.54.15", cuda=12040):
        self.gpus = list(gpus)
        self.fail = dict(fail or {})
        self.delay_init_s = delay_init_s
        self.driver = driver
        self.cuda = cuda
        self.shutdown_called = False

    def _maybe_fail(self, fn, index=None):
        exc = self.fail.get((fn, index)) or self.fail.get((fn, "*"))
        if exc is not None:
            raise exc

    def nvmlInit(self):
        if self.delay_init_s:
            time.sleep(self.delay_init_s)
        self._maybe_fail("nvmlInit")

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlDeviceGetCount(self):
        self._maybe_fail("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetHandleByIndex(self, index):
        self._maybe_fail("nvmlDeviceGetHandleByIndex", index)
        return ("gpu", index)

    def _gpu(self, fn, handle):
        index = handle[1]
        self._maybe_fail(fn, index)
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle):
        if handle[0] == "mig":
            return self.gpus[handle[1]]["migs"][handle[2]]
        return self._gpu("nvmlDeviceGetUUID", handle)["uuid"]

    def nvmlDeviceGetSerial(self, handle):
        return self._gpu("nvmlDeviceGetSerial", handle)["serial"]

    def nvmlDeviceGetName(self, handle):
        return self._gpu("nvmlDeviceGetName", handle)["name"]

    def nvmlDeviceGetPciInfo(self, handle):
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)

        class Pci:
            busId = gpu["bus"].encode()  # pynvml's struct field is bytes

        return Pci()

    def nvmlDeviceGetEccMode(self, handle):
        return self._gpu("nvmlDeviceGetEccMode", handle)["ecc"]

    def nvmlDeviceGetMigMode(self, handle):
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if "migs" not in gpu:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, i):
        migs = self.gpus[handle[1]]["migs"]
        if i >= len(migs):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], i)


def two_gpus():
    return [
        {
            "uuid": GPU0_UUID,
            "serial": "1654922001234",
            "name": "NVIDIA H100 80GB HBM3",
            "bus": "00000000:04:00.0",
            "ecc": [1, 1],
        },
        {
            "uuid": GPU1_UUID,
            "serial": "1654922005678",
            "name": "NVIDIA H100 80GB HBM3",
            "bus": "00000000:81:00.0",
            "ecc": [1, 1],
            "migs": [MIG_UUID],
        },
    ]


def loader_of(fake):
    return lambda: fake


class StepClock:
    """Each call returns the next time: `step` seconds after the previous."""

    def __init__(self, start=1_800_000_000.0, step=0.0):
        self.now = start - step
        self.step = step

    def __call__(self):
        self.now += self.step
        return self.now


# -------------------------------------------------------------------------------------------
# The recorded tree (this VM: Ethernet only)
# -------------------------------------------------------------------------------------------

VM_NICS = (
    NicInfo(
        name="eth0",
        mac="02:fc:00:00:00:01",
        pci_address="0000:00:03.0",
        numa_node=-1,
        speed_mbps=-1,
        operstate="up",
        kind=NicKind.ETHERNET,
    ),
    NicInfo(
        name="ifb0",
        mac="5a:21:02:a3:fe:23",
        pci_address="",
        numa_node=-1,
        speed_mbps=-1,
        operstate="down",
        kind=NicKind.VIRTUAL,
    ),
    NicInfo(
        name="ifb1",
        mac="de:43:b0:29:25:43",
        pci_address="",
        numa_node=-1,
        speed_mbps=-1,
        operstate="down",
        kind=NicKind.VIRTUAL,
    ),
    NicInfo(
        name="lo",
        mac="00:00:00:00:00:00",
        pci_address="",
        numa_node=-1,
        speed_mbps=-1,
        operstate="unknown",
        kind=NicKind.LOOPBACK,
    ),
)


def test_recorded_vm_nics_exact():
    assert sysfs.read_nics(VM / "sys") == (VM_NICS, ())


def test_recorded_vm_has_no_infiniband_and_says_nothing_about_it():
    assert sysfs.read_ib_ports(VM / "sys") == ((), ())


def test_recorded_vm_identity_cpu_memory_exact():
    assert sysfs.read_identity(VM / "proc") == (
        "vm",
        "70cc3484-e812-4a51-867e-1b7d6a6e1060",
        "6.18.44-fc-v669",
        (),
    )
    assert sysfs.read_cpu_memory(VM / "proc") == (
        "Intel(R) Xeon(R) Processor",
        1,
        24684084 * 1024,
        (),
    )


def test_recorded_vm_pci_path_goes_through_the_virtio_parent():
    assert sysfs.pci_path(VM / "sys", "0000:00:03.0") == ("pci0000:00", "0000:00:03.0")
    assert sysfs.pci_path(VM / "sys", "0000:00:09.0") == ()


def test_recorded_vm_full_map_exact():
    hwmap = collect.collect_hardware_map(
        "n1",
        sysfs_root=VM / "sys",
        proc_root=VM / "proc",
        nvml_loader=loader_of(FakeNvml([])),
        clock=StepClock(step=0.0),
    )
    assert hwmap == HardwareMap(
        node="n1",
        hostname="vm",
        boot_id="70cc3484-e812-4a51-867e-1b7d6a6e1060",
        kernel="6.18.44-fc-v669",
        cpu_model="Intel(R) Xeon(R) Processor",
        cpu_sockets=1,
        memory_bytes=24684084 * 1024,
        gpus=(),
        nics=VM_NICS,
        ib_ports=(),
        gpu_nic_affinity=(),
        nvml_status="no-gpu",
        problems=(),
        collected_at=1_800_000_000.0,
        duration_s=0.0,
    )


def test_recorder_reproduces_this_machine(tmp_path):
    """record_sysfs.py on the live /sys and /proc gives a tree that parses like the live one."""
    out = tmp_path / "rec"
    proc = subprocess.run(
        [sys.executable, str(FIXTURES / "record_sysfs.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert sysfs.read_nics(out / "sys") == sysfs.read_nics(Path("/sys"))
    assert sysfs.read_ib_ports(out / "sys") == sysfs.read_ib_ports(Path("/sys"))
    live_model, live_sockets, _, _ = sysfs.read_cpu_memory(Path("/proc"))
    assert sysfs.read_cpu_memory(out / "proc")[:2] == (live_model, live_sockets)
    assert sysfs.read_identity(out / "proc")[1:] == sysfs.read_identity(Path("/proc"))[1:]
    for link in (out / "sys" / "class" / "net").iterdir():
        assert not os.path.isabs(os.readlink(link))


# -------------------------------------------------------------------------------------------
# The constructed tree (HCA and GPU behind one PCIe switch)
# -------------------------------------------------------------------------------------------

IB_NICS = (
    NicInfo(
        name="eth0",
        mac="3c:fd:fe:a1:b2:c3",
        pci_address="0000:05:00.0",
        numa_node=0,
        speed_mbps=10000,
        operstate="up",
        kind=NicKind.ETHERNET,
    ),
    NicInfo(
        name="eth1",
        mac="3c:fd:fe:a1:b2:d4",
        pci_address="0000:c1:00.0",
        numa_node=1,
        speed_mbps=-1,
        operstate="down",
        kind=NicKind.ETHERNET,
    ),
    NicInfo(
        name="ib0",
        mac="00:00:10:49:fe:80:00:00:00:00:00:00:b8:ce:f6:03:00:a1:b2:c4",
        pci_address="0000:03:00.0",
        numa_node=0,
        speed_mbps=200000,
        operstate="up",
        kind=NicKind.INFINIBAND,
    ),
    NicInfo(
        name="lo",
        mac="00:00:00:00:00:00",
        pci_address="",
        numa_node=-1,
        speed_mbps=-1,
        operstate="unknown",
        kind=NicKind.LOOPBACK,
    ),
)
IB_PORTS = (
    IbPort(
        hca="mlx5_0",
        port=1,
        guid="0xb8cef60300a1b2c4",
        state="4: ACTIVE",
        rate="200 Gb/sec (4X HDR)",
        link_layer="InfiniBand",
    ),
)


def test_constructed_nics_and_ib_ports_exact():
    assert sysfs.read_nics(GPU_IB / "sys") == (IB_NICS, ())
    assert sysfs.read_ib_ports(GPU_IB / "sys") == (IB_PORTS, ())


def test_constructed_pci_paths():
    root = GPU_IB / "sys"
    assert sysfs.pci_path(root, "0000:04:00.0") == (
        "pci0000:00",
        "0000:00:01.0",
        "0000:01:00.0",
        "0000:02:01.0",
        "0000:04:00.0",
    )
    assert sysfs.pci_path(root, "0000:03:00.0") == (
        "pci0000:00",
        "0000:00:01.0",
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:03:00.0",
    )
    assert sysfs.pci_path(root, "00000000:04:00.0") == sysfs.pci_path(
        root, "0000:04:00.0"
    )  # NVML form
    assert sysfs.pci_path(root, "not-an-address") == ()


def test_nearest_nic_is_the_hca_behind_the_same_switch():
    root = GPU_IB / "sys"
    assert sysfs.nearest_nic("0000:04:00.0", IB_NICS, root) == ("ib0", Affinity.SAME_PCI_SWITCH)


def test_nearest_nic_same_numa_when_no_switch_is_shared():
    root = GPU_IB / "sys"
    # GPU 1 is alone on host bridge pci0000:80 (NUMA 1); eth1 is on pci0000:c0, also NUMA 1
    assert sysfs.nearest_nic("0000:81:00.0", IB_NICS, root) == ("eth1", Affinity.SAME_NUMA)
    # without eth1 nothing is near GPU 1
    others = tuple(n for n in IB_NICS if n.name != "eth1")
    assert sysfs.nearest_nic("0000:81:00.0", others, root) == ("", Affinity.NONE)


def test_nic_affinity_counts_shared_bridges():
    eth = NicInfo("eth9", "m", "0000:09:00.0", 0, 1000, "up", NicKind.ETHERNET)
    ib = NicInfo("ib9", "m", "0000:0a:00.0", 0, 1000, "up", NicKind.INFINIBAND)
    gpu = ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:04:00.0")
    deep = ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:09:00.0")
    shallow = ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:0a:00.0")
    assert sysfs.nic_affinity(gpu, 0, eth, deep) == (
        Affinity.SAME_PCI_SWITCH,
        3,
    )  # same downstream port
    assert sysfs.nic_affinity(gpu, 0, ib, shallow) == (Affinity.SAME_PCI_SWITCH, 2)
    assert sysfs.nic_affinity(gpu, 0, ib, ("pci0000:00", "0000:00:07.0", "0000:0a:00.0")) == (
        Affinity.SAME_NUMA,
        0,
    )
    assert sysfs.nic_affinity(gpu, 0, replace(ib, numa_node=1), ("pci0000:40", "0000:40:01.0")) == (
        Affinity.NONE,
        0,
    )
    assert sysfs.nic_affinity((), -1, ib, ()) == (Affinity.NONE, 0)


def test_nearest_nic_ignores_virtual_and_loopback():
    nics = tuple(n for n in VM_NICS if n.kind is not NicKind.ETHERNET)
    assert sysfs.nearest_nic("0000:00:03.0", nics, VM / "sys") == ("", Affinity.NONE)


def test_constructed_full_map_with_fake_nvml():
    fake = FakeNvml(two_gpus())
    hwmap = collect.collect_hardware_map(
        "gpu017",
        sysfs_root=GPU_IB / "sys",
        proc_root=GPU_IB / "proc",
        nvml_loader=loader_of(fake),
        clock=StepClock(step=0.5),
    )
    assert fake.shutdown_called
    assert hwmap.problems == ()
    assert hwmap.nvml_status == "ok"
    assert (
        hwmap.hostname,
        hwmap.kernel,
        hwmap.cpu_model,
        hwmap.cpu_sockets,
        hwmap.memory_bytes,
    ) == (
        "gpu-node-017",
        "5.15.0-105-generic",
        "AMD EPYC 7763 64-Core Processor",
        2,
        2113454080 * 1024,
    )
    assert hwmap.gpus == (
        GpuInfo(
            index=0,
            uuid=GPU0_UUID,
            serial="1654922001234",
            pci_bus_id="0000:04:00.0",
            name="NVIDIA H100 80GB HBM3",
            driver_version="550.54.15",
            cuda_driver_version="12.4",
            ecc_mode="enabled",
            numa_node=0,
        ),
        GpuInfo(
            index=1,
            uuid=GPU1_UUID,
            serial="1654922005678",
            pci_bus_id="0000:81:00.0",
            name="NVIDIA H100 80GB HBM3",
            driver_version="550.54.15",
            cuda_driver_version="12.4",
            ecc_mode="enabled",
            numa_node=1,
            mig_uuids=(MIG_UUID,),
        ),
    )
    assert hwmap.nics == IB_NICS
    assert hwmap.ib_ports == IB_PORTS
    assert hwmap.gpu_nic_affinity == (
        GpuNic(GPU0_UUID, "ib0", Affinity.SAME_PCI_SWITCH),
        GpuNic(GPU1_UUID, "eth1", Affinity.SAME_NUMA),
    )
    # the record survives the store's typed round trip
    assert store.record_from_obj(HardwareMap, store.record_to_obj(hwmap), source="test") == hwmap


def test_time_budget_skips_the_remaining_parts_and_says_so():
    # every clock call advances 4 s: identity and CPU fit in 10 s, the rest does not
    hwmap = collect.collect_hardware_map(
        "n1",
        sysfs_root=GPU_IB / "sys",
        proc_root=GPU_IB / "proc",
        nvml_loader=loader_of(FakeNvml(two_gpus())),
        clock=StepClock(step=4.0),
        deadline_s=10.0,
    )
    assert hwmap.hostname == "gpu-node-017" and hwmap.cpu_sockets == 2
    assert hwmap.gpus == () and hwmap.nvml_status == "not collected"
    skipped = [p.split(":")[0] for p in hwmap.problems]
    assert skipped == [
        "skipped network interfaces",
        "skipped infiniband ports",
        "skipped gpus (nvml)",
        "skipped gpu-nic affinity",
    ]
    assert "over the time budget of 10 s" in hwmap.problems[0]


# -------------------------------------------------------------------------------------------
# Unreadable files: reported, never raised, never hung
# -------------------------------------------------------------------------------------------


def _in_thread(fn, timeout=10.0):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("v", fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the reader hung"
    return box["v"]


def test_unreadable_sysfs_files_become_problems(tmp_path):
    tree = tmp_path / "t"
    shutil.copytree(GPU_IB, tree, symlinks=True)
    eth0 = tree / "sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0/net/eth0"
    (eth0 / "operstate").unlink()
    os.mkfifo(eth0 / "operstate")  # a reader that opened it blocking would hang
    (eth0 / "address").unlink()
    (eth0 / "address").mkdir()  # root can read anything; not a directory
    rate = (
        tree
        / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0"
        / "infiniband/mlx5_0/ports/1/rate"
    )
    rate.unlink()
    rate.symlink_to("nowhere")  # dangling
    (tree / "proc/meminfo").unlink()
    os.mkfifo(tree / "proc/meminfo")

    nics, problems = _in_thread(lambda: sysfs.read_nics(tree / "sys"))
    eth = nics[0]
    assert (eth.name, eth.mac, eth.operstate, eth.speed_mbps) == ("eth0", "", "unknown", 10000)
    assert problems == (
        f"{tree}/sys/class/net/eth0/address: not a regular file (directory)",
        f"{tree}/sys/class/net/eth0/operstate: not a regular file (FIFO)",
    )
    ports, problems = _in_thread(lambda: sysfs.read_ib_ports(tree / "sys"))
    assert ports[0].rate == "" and ports[0].state == "4: ACTIVE"
    assert problems == (
        f"{tree}/sys/class/infiniband/mlx5_0/ports/1/rate: No such file or directory",
    )
    model, sockets, memory, problems = _in_thread(lambda: sysfs.read_cpu_memory(tree / "proc"))
    assert (model, sockets, memory) == ("AMD EPYC 7763 64-Core Processor", 2, -1)
    assert problems == (f"{tree}/proc/meminfo: not a regular file (FIFO)",)


def test_missing_class_net_and_identity_are_problems(tmp_path):
    (tmp_path / "sys").mkdir()
    (tmp_path / "proc").mkdir()
    hwmap = collect.collect_hardware_map(
        "n1",
        sysfs_root=tmp_path / "sys",
        proc_root=tmp_path / "proc",
        nvml_loader=loader_of(FakeNvml([])),
    )
    assert hwmap.nics == () and hwmap.hostname == ""
    assert f"{tmp_path}/sys/class/net: missing" in hwmap.problems
    assert f"{tmp_path}/proc/sys/kernel/random/boot_id: No such file or directory" in hwmap.problems
    assert f"{tmp_path}/proc/cpuinfo: No such file or directory" in hwmap.problems


def test_reads_are_bounded(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * (sysfs.READ_LIMIT + 10))
    text, truncated = sysfs.read_small(big)
    assert len(text) == sysfs.READ_LIMIT and truncated


def test_class_link_leading_outside_the_tree_is_a_problem(tmp_path):
    tree = tmp_path / "t"
    shutil.copytree(VM, tree, symlinks=True)
    (tree / "sys/class/net/evil").symlink_to("/etc")
    nics, problems = sysfs.read_nics(tree / "sys")
    assert [n.name for n in nics] == ["eth0", "evil", "ifb0", "ifb1", "lo"]
    assert problems[0] == f"{tree}/sys/class/net/evil: link does not lead into {tree}/sys/devices"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_cpuinfo_and_meminfo_parsers_never_raise(text):
    model, sockets = sysfs.parse_cpuinfo(text)
    assert sockets >= 0 and isinstance(model, str)
    assert sysfs.parse_meminfo(text) >= -1


# -------------------------------------------------------------------------------------------
# NVML: broken, missing, empty
# -------------------------------------------------------------------------------------------


def test_broken_nvml_is_reported_in_problems():
    fake = FakeNvml(
        two_gpus(),
        fail={
            ("nvmlDeviceGetSerial", 1): pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST),
            ("nvmlDeviceGetEccMode", 0): pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED),
            ("nvmlDeviceGetName", 1): pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN),
        },
    )
    gpus, status, problems = nvml.read_gpus(loader_of(fake))
    assert [g.uuid for g in gpus] == [GPU0_UUID, GPU1_UUID]
    assert (gpus[0].ecc_mode, gpus[1].serial, gpus[1].name) == ("unknown", "", "")
    assert problems == (
        "nvmlDeviceGetEccMode(gpu 0): not supported",
        "nvmlDeviceGetSerial(gpu 1): GPU is lost",
        "nvmlDeviceGetName(gpu 1): Unknown Error",
    )
    assert status == "error: 2 NVML call(s) failed; first: nvmlDeviceGetSerial(gpu 1): GPU is lost"
    assert fake.shutdown_called


def test_not_supported_alone_is_not_an_error():
    fake = FakeNvml(
        two_gpus()[:1],
        fail={("nvmlDeviceGetSerial", 0): pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)},
    )
    gpus, status, problems = nvml.read_gpus(loader_of(fake))
    assert status == "ok" and gpus[0].serial == ""
    assert problems == ("nvmlDeviceGetSerial(gpu 0): not supported",)


def test_lost_gpu_handle_and_foreign_exceptions_are_errors():
    fake = FakeNvml(
        two_gpus(),
        fail={
            ("nvmlDeviceGetHandleByIndex", 0): pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST),
            ("nvmlDeviceGetPciInfo", 1): RuntimeError("driver said no"),
        },
    )
    gpus, status, problems = nvml.read_gpus(loader_of(fake))
    assert [g.index for g in gpus] == [1] and gpus[0].pci_bus_id == ""
    assert problems == (
        "nvmlDeviceGetHandleByIndex(gpu 0): GPU is lost",
        "nvmlDeviceGetPciInfo(gpu 1): RuntimeError: driver said no",
    )
    assert status.startswith("error: 2 NVML call(s) failed")


@pytest.mark.parametrize(
    "loader, expected",
    [
        (lambda: (_ for _ in ()).throw(ImportError("No module named 'pynvml'")), "no-library"),
        (
            loader_of(
                FakeNvml(
                    fail={("nvmlInit", None): pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)}
                )
            ),
            "no-library",
        ),
        (loader_of(FakeNvml([])), "no-gpu"),
        (
            loader_of(
                FakeNvml(
                    fail={("nvmlInit", None): pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)}
                )
            ),
            "error: nvmlInit: Driver Not Loaded",
        ),
        (
            loader_of(
                FakeNvml(
                    fail={("nvmlDeviceGetCount", None): pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)}
                )
            ),
            "error: 1 NVML call(s) failed; first: nvmlDeviceGetCount(): Unknown Error",
        ),
    ],
)
def test_nvml_status(loader, expected):
    gpus, status, _ = nvml.read_gpus(loader)
    assert gpus == () and status == expected


def test_real_library_absent_here_is_no_library():
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver")
    assert nvml.read_gpus()[1] == "no-library"


# -------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES
# -------------------------------------------------------------------------------------------


def _gpu(index, uuid, bus, migs=()):
    return GpuInfo(
        index=index,
        uuid=uuid,
        serial=f"S{index}",
        pci_bus_id=bus,
        name="g",
        driver_version="",
        cuda_driver_version="",
        ecc_mode="enabled",
        numa_node=0,
        mig_uuids=migs,
    )


# NVML's index order is not PCI order here: CUDA_DEVICE_ORDER=PCI_BUS_ID counts by bus id
MAP_GPUS = (
    _gpu(0, "GPU-cccc-0001", "0000:81:00.0"),
    _gpu(1, "GPU-aaaa-0002", "0000:04:00.0", migs=("MIG-1111-aaaa", "MIG-2222-aaaa")),
    _gpu(2, "GPU-aaab-0003", "0000:05:00.0"),
)


@pytest.mark.parametrize(
    "cvd, expected",
    [
        ("0", ("GPU-aaaa-0002",)),
        ("2,0", ("GPU-cccc-0001", "GPU-aaaa-0002")),
        (" 1 , 2 ", ("GPU-aaab-0003", "GPU-cccc-0001")),
        ("GPU-cccc-0001", ("GPU-cccc-0001",)),
        ("GPU-cccc", ("GPU-cccc-0001",)),  # unique prefix, as CUDA accepts
        ("GPU-aaa,0", ()),  # ambiguous prefix: CUDA stops there
        ("0,7,1", ("GPU-aaaa-0002",)),  # stops at the first bad entry
        ("0,-1,1", ("GPU-aaaa-0002",)),
        ("MIG-2222-aaaa", ("GPU-aaaa-0002",)),  # MIG instance -> its GPU
        ("MIG-GPU-aaaa-0002/1/0", ("GPU-aaaa-0002",)),  # pre-R470 MIG form
        ("MIG-9999", ()),
        ("0,0,GPU-aaaa-0002", ("GPU-aaaa-0002",)),
        ("", ("GPU-aaaa-0002", "GPU-aaab-0003", "GPU-cccc-0001")),  # unset: all, in PCI order
        ("NoDevFiles", ()),
    ],
)
def test_resolve_visible_uuids(cvd, expected):
    assert nvml.resolve_visible_uuids(cvd, MAP_GPUS) == expected


def test_resolve_against_an_empty_map():
    assert nvml.resolve_visible_uuids("0,1", ()) == ()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789,-GPUMIacb /", max_size=40))
def test_resolve_returns_only_known_uuids_once(cvd):
    out = nvml.resolve_visible_uuids(cvd, MAP_GPUS)
    assert set(out) <= {g.uuid for g in MAP_GPUS} and len(out) == len(set(out))


# -------------------------------------------------------------------------------------------
# The Prolog, in-process
# -------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _restore_logging():
    """prolog.main() configures logging onto the test's (soon closed) stderr: put it back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


JOB_UID = 65534
JOB_GID = pwd.getpwuid(JOB_UID).pw_gid
SLURM_USER = "daemon"  # stands for SlurmUser: a system user every Debian has
SLURM_UID, SLURM_GID = pwd.getpwnam(SLURM_USER).pw_uid, pwd.getpwnam(SLURM_USER).pw_gid
CLUSTER = "testc"


@pytest.fixture()
def hook_env(tmp_path, monkeypatch):
    """A node Prolog's environment, a site config and an evidence root in tmp_path."""
    for var in list(os.environ):
        if var.startswith(("SLURM", "SCOUT_")):
            monkeypatch.delenv(var)
    root = tmp_path / "evidence"
    root.mkdir()
    conf = tmp_path / "scout.toml"

    def configure(*, evidence=root, fail_on_broken_gpu=False, time_budget_s=20.0):
        conf.write_text(
            f'[evidence]\nroot = "{evidence}"\nhook_log_dir = "{tmp_path / "hook-log"}"\n'
            f'slurm_user = "{SLURM_USER}"\n[prolog]\ntime_budget_s = {time_budget_s}\n'
            f"fail_on_broken_gpu = {'true' if fail_on_broken_gpu else 'false'}\n"
        )

    configure()
    for k, v in {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_UID": str(JOB_UID),
        "SLURM_JOB_USER": "nobody",
        "SLURMD_NODENAME": "n1",
        "SLURM_CLUSTER_NAME": CLUSTER,
        "SLURM_JOB_RESTART_COUNT": "0",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SCOUT_CONFIG": str(conf),
    }.items():
        monkeypatch.setenv(k, v)

    class Env:
        pass

    env = Env()
    env.root, env.conf, env.configure = root, conf, configure
    env.folder = JobFolder(root, CLUSTER, 4242)
    return env


def run_prolog(fake=None, tree=GPU_IB):
    return prolog.main(
        sysfs_root=tree / "sys",
        proc_root=tree / "proc",
        nvml_loader=loader_of(fake if fake is not None else FakeNvml(two_gpus())),
    )


def owner_mode(path):
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), stat.S_ISDIR(st.st_mode)


def test_prolog_writes_the_map_and_lays_out_the_folder(hook_env):
    assert run_prolog() == 0
    f = hook_env.folder
    map_path = f.hardware_map_path("n1")
    hwmap = store.read_record(map_path, HardwareMap, root=hook_env.root)
    assert hwmap.node == "n1" and hwmap.hostname == "gpu-node-017"
    assert [g.uuid for g in hwmap.gpus] == [GPU0_UUID, GPU1_UUID]
    assert hwmap.gpu_nic_affinity[0] == GpuNic(GPU0_UUID, "ib0", Affinity.SAME_PCI_SWITCH)
    assert owner_mode(map_path)[:3] == (0, 0, 0o644)
    for d in (f.cluster_dir, f.path, f.nodes_dir, f.node_dir("n1")):
        assert owner_mode(d) == (0, 0, 0o755, True), d
    # the job's folders: its uid, SlurmUser's group (setgid), so the controller Epilog reads them
    for d in (
        f.run_dir(0),
        f.ranks_dir(0),
        f.progress_dir(0),
        f.findings_dir(0),
        f.stacks_dir(0),
        f.checkpoints_dir,
    ):
        assert owner_mode(d) == (JOB_UID, SLURM_GID, 0o2750, True), d
    # SlurmUser's own: where the controller writes its verdict, and the cluster's pending incidents
    assert owner_mode(f.results_dir) == (SLURM_UID, SLURM_GID, 0o755, True)
    assert owner_mode(f.pending_dir) == (SLURM_UID, SLURM_GID, 0o750, True)
    assert sorted(p.name for p in f.path.iterdir()) == ["checkpoints", "nodes", "results", "run-0"]


def test_prolog_second_node_and_restart_share_the_folder(hook_env, monkeypatch):
    assert run_prolog() == 0
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    monkeypatch.setenv("SLURM_JOB_RESTART_COUNT", "1")
    assert run_prolog(tree=VM) == 0
    f = hook_env.folder
    assert store.read_record(f.hardware_map_path("n2"), HardwareMap).hostname == "vm"
    assert store.read_record(f.hardware_map_path("n1"), HardwareMap).hostname == "gpu-node-017"
    assert owner_mode(f.run_dir(1)) == (JOB_UID, SLURM_GID, 0o2750, True)
    assert owner_mode(f.run_dir(0)) == (JOB_UID, SLURM_GID, 0o2750, True)


def test_prolog_on_many_nodes_at_once(hook_env):
    """Many Prologs racing on one folder: mkdir races lost, root-owned folders handed over."""
    folder = hook_env.folder
    owner = prolog.Owner(JOB_UID, JOB_GID, prolog.JOB_DIR_MODE)
    log = prolog.scout_log.get_logger("test")
    results = {}
    barrier = threading.Barrier(16)

    def one(i):
        barrier.wait()
        results[i] = prolog.prepare_job_folder(folder, f"n{i}", 0, owner, log)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {i: folder.node_dir(f"n{i}") for i in range(16)}
    assert owner_mode(folder.run_dir(0)) == (JOB_UID, JOB_GID, 0o2750, True)
    assert owner_mode(folder.stacks_dir(0)) == (JOB_UID, JOB_GID, 0o2750, True)


def test_prolog_refuses_a_planted_symlink(hook_env, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    hook_env.folder.path.mkdir(parents=True)
    hook_env.folder.nodes_dir.symlink_to(elsewhere)
    assert run_prolog() == 0
    assert list(elsewhere.iterdir()) == []
    assert os.path.islink(hook_env.folder.nodes_dir)
    err = capsys.readouterr().err
    assert "prolog.folder_failed" in err and "is a symbolic link; refusing to follow it" in err


def test_prolog_refuses_a_run_folder_owned_by_someone_else(hook_env, capsys):
    run = hook_env.folder.run_dir(0)
    run.mkdir(parents=True)
    os.chown(run, 12345, 12345)
    assert run_prolog() == 0
    assert (hook_env.folder.hardware_map_path("n1")).is_file()  # the map is still written
    assert owner_mode(run)[:2] == (12345, 12345)  # and nothing was taken over
    assert not (run / "ranks").exists()
    err = capsys.readouterr().err
    assert "prolog.job_folders_failed" in err and "owned by uid 12345, expected uid 65534" in err


def test_prolog_refuses_a_file_where_a_folder_belongs(hook_env, capsys):
    hook_env.folder.path.mkdir(parents=True)
    (hook_env.folder.path / "nodes").write_text("x")
    assert run_prolog() == 0
    assert "exists and is not a directory" in capsys.readouterr().err


def test_prolog_exit_0_when_the_config_is_unreadable(hook_env, monkeypatch, capsys):
    bad = hook_env.conf.parent / "conf-dir"
    bad.mkdir()
    monkeypatch.setenv("SCOUT_CONFIG", str(bad))
    assert run_prolog() == 0
    hook_env.conf.write_text("[prolog\nthis is not toml")
    monkeypatch.setenv("SCOUT_CONFIG", str(hook_env.conf))
    assert run_prolog() == 0
    assert list(hook_env.root.iterdir()) == []
    assert (
        capsys.readouterr().err.count("prolog.config_refused") == 2
    )  # safe defaults: observe only


def test_prolog_exit_0_without_slurm_environment(hook_env, monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_ID")
    assert run_prolog() == 0
    assert "SLURM_JOB_ID is not set" in capsys.readouterr().err


def test_prolog_exit_0_when_the_evidence_root_is_missing(hook_env, capsys):
    hook_env.configure(evidence=hook_env.root / "not-mounted")
    assert run_prolog() == 0
    assert not (hook_env.root / "not-mounted").exists()  # no local stand-in for shared storage
    assert "does not exist: create it on storage every node sees" in capsys.readouterr().err


def test_prolog_exit_0_on_a_full_disk(hook_env, tmp_path, capsys):
    mnt = tmp_path / "full"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        hook_env.configure(evidence=mnt)
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        assert run_prolog() == 0
        err = capsys.readouterr().err
        assert "No space left on device" in err
        assert not (JobFolder(mnt, CLUSTER, 4242).hardware_map_path("n1")).exists()
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def _broken_gpu():
    return FakeNvml(
        two_gpus(),
        fail={("nvmlDeviceGetSerial", 1): pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)},
    )


@pytest.mark.parametrize(
    "fail_on_broken_gpu, fake, expected",
    [
        (True, "broken", 1),
        (False, "broken", 0),
        (True, "healthy", 0),
        (True, "no-library", 0),
        (True, "no-gpu", 0),
    ],
)
def test_prolog_exit_1_only_for_a_broken_gpu_when_asked(
    hook_env, capsys, fail_on_broken_gpu, fake, expected
):
    fakes = {
        "broken": _broken_gpu(),
        "healthy": FakeNvml(two_gpus()),
        "no-gpu": FakeNvml([]),
        "no-library": FakeNvml(
            fail={("nvmlInit", None): pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)}
        ),
    }
    hook_env.configure(fail_on_broken_gpu=fail_on_broken_gpu)
    assert run_prolog(fakes[fake]) == expected
    hwmap = store.read_record(hook_env.folder.hardware_map_path("n1"), HardwareMap)
    if fake == "broken":
        assert hwmap.nvml_failed and "nvmlDeviceGetSerial(gpu 1): GPU is lost" in hwmap.problems
        assert "prolog.broken_gpu" in capsys.readouterr().err
    else:
        assert not hwmap.nvml_failed


def test_prolog_time_budget_writes_what_it_has(hook_env, capsys):
    hook_env.configure(time_budget_s=1.0)
    t0 = time.monotonic()
    assert run_prolog(FakeNvml(two_gpus(), delay_init_s=4.0)) == 0
    assert time.monotonic() - t0 < 2.5
    hwmap = store.read_record(hook_env.folder.hardware_map_path("n1"), HardwareMap)
    assert hwmap.nics == IB_NICS and hwmap.gpus == () and hwmap.nvml_status == "interrupted"
    assert any(
        p.startswith("timed out after") and p.endswith("while collecting gpus (nvml)")
        for p in hwmap.problems
    )
    assert "prolog.collect_timeout" in capsys.readouterr().err


def test_prolog_module_runs_as_slurm_runs_it(hook_env):
    """`python -m scout_slurm.hooks.prolog`: the real /sys, /proc and NVML of this machine."""
    env = {k: v for k, v in os.environ.items()}
    proc = subprocess.run(
        [sys.executable, "-m", "scout_slurm.hooks.prolog"],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    hwmap = store.read_record(hook_env.folder.hardware_map_path("n1"), HardwareMap)
    assert hwmap.node == "n1" and hwmap.boot_id == sysfs.read_identity(Path("/proc"))[1]


# -------------------------------------------------------------------------------------------
# Each rank joins its node's map
# -------------------------------------------------------------------------------------------


def _constructed_map():
    return collect.collect_hardware_map(
        "n1",
        sysfs_root=GPU_IB / "sys",
        proc_root=GPU_IB / "proc",
        nvml_loader=loader_of(FakeNvml(two_gpus())),
    )


@pytest.mark.parametrize(
    "cvd, local_rank, gpus, nic",
    [
        ("0", 0, (GPU0_UUID,), "ib0"),  # bus 04 is first in PCI order; behind ib0's switch
        ("1", 0, (GPU1_UUID,), "eth1"),
        ("0,1", 1, (GPU1_UUID,), "eth1"),  # several visible: the one at LOCAL_RANK
        ("", 2, (GPU0_UUID,), "ib0"),  # unset: all visible, local rank 2 wraps to 0
        (MIG_UUID, 0, (GPU1_UUID,), "eth1"),
        ("7", 0, (), "ib0"),  # nothing resolved: the first InfiniBand NIC up
    ],
)
def test_join_with_map(cvd, local_rank, gpus, nic):
    place = replace(_place(0, "n1", []), cuda_visible_devices=cvd, local_rank=local_rank, nic="")
    joined = join.join_with_map(place, _constructed_map())
    assert (joined.gpu_uuids, joined.nic) == (gpus, nic)


def test_join_keeps_a_nic_the_rank_already_named_and_falls_back_to_ethernet():
    vm = collect.collect_hardware_map(
        "n1", sysfs_root=VM / "sys", proc_root=VM / "proc", nvml_loader=loader_of(FakeNvml([]))
    )
    place = replace(_place(0, "n1", []), nic="")
    assert join.join_with_map(place, vm).nic == "eth0"
    assert join.join_with_map(replace(place, nic="bond0"), vm).nic == "bond0"


def test_join_place_reads_the_prologs_map(hook_env):
    assert run_prolog() == 0
    place = replace(_place(3, "n1", []), cuda_visible_devices="0,1", local_rank=1, nic="")
    joined = join.join_place(hook_env.folder, place)
    assert (joined.gpu_uuids, joined.nic) == ((GPU1_UUID,), "eth1")
    with pytest.raises(EvidenceError):
        join.join_place(hook_env.folder, replace(place, node="n2"))


# -------------------------------------------------------------------------------------------
# The rank-to-hardware table
# -------------------------------------------------------------------------------------------


def _place(rank, node, uuids, nic="ib0", local_rank=None, hostname=None):
    return RankPlace(
        job_id=4242,
        restart=0,
        rank=rank,
        local_rank=rank % 2 if local_rank is None else local_rank,
        world_size=4,
        node=node,
        hostname=hostname if hostname is not None else f"{node}.cl",
        task_pid=100 + rank,
        child_pid=200 + rank,
        gpu_uuids=tuple(uuids),
        cuda_visible_devices="",
        nic=nic,
        master_addr="10.0.0.1",
        master_port=29500,
        started_at=1.0,
    )


def _map(node, gpus):
    return HardwareMap(
        node=node,
        hostname=f"{node}-host",
        boot_id="b",
        kernel="k",
        cpu_model="c",
        cpu_sockets=1,
        memory_bytes=1,
        gpus=tuple(gpus),
        nics=(),
        ib_ports=(),
        gpu_nic_affinity=(),
        nvml_status="ok",
        problems=(),
        collected_at=0.0,
        duration_s=0.0,
    )


def test_rank_map_rows_join_serials_by_uuid():
    maps = {
        "n1": _map("n1", [_gpu(0, "GPU-a", "0000:04:00.0"), _gpu(1, "GPU-b", "0000:05:00.0")]),
        "n2": _map("n2", [_gpu(0, "GPU-c", "0000:04:00.0")]),
    }
    places = [
        _place(3, "n3", ["GPU-x"]),
        _place(1, "n1", ["GPU-b"]),
        _place(0, "n1", ["GPU-a"]),
        _place(2, "n2", ["GPU-c", "GPU-zz"], nic="", hostname=""),
        _place(1, "n9", ["GPU-q"]),
    ]
    assert rank_map_rows(places, maps) == [
        RankMapRow(0, 0, "n1", "n1.cl", ("GPU-a",), ("S0",), "ib0"),
        RankMapRow(1, 1, "n1", "n1.cl", ("GPU-b",), ("S1",), "ib0"),  # first place of rank 1 kept
        RankMapRow(
            2, 0, "n2", "n2-host", ("GPU-c", "GPU-zz"), ("S0", "?"), ""
        ),  # hostname from the map
        RankMapRow(3, 1, "n3", "n3.cl", ("GPU-x",), ("?",), "ib0", map_missing=True),
    ]


def test_rank_map_rows_cpu_only_and_empty():
    assert rank_map_rows([], {}) == []
    assert rank_map_rows([_place(0, "n1", [], nic="eth0")], {"n1": _map("n1", [])}) == [
        RankMapRow(0, 0, "n1", "n1.cl", (), (), "eth0")
    ]


def test_render_rank_map_table_exact():
    rows = [
        RankMapRow(0, 0, "n1", "host-a", ("GPU-a",), ("S0",), "ib0"),
        RankMapRow(1, 1, "n10", "", ("GPU-b", "GPU-c"), ("S1", "?"), ""),
        RankMapRow(12, 0, "n3", "host-c", (), (), "eth0", map_missing=True),
    ]
    assert render_rank_map_table(rows) == (
        "RANK  LOCAL  NODE         HOSTNAME  GPU UUID     GPU SERIAL  NIC\n"
        "0     0      n1           host-a    GPU-a        S0          ib0\n"
        "1     1      n10          ?         GPU-b,GPU-c  S1,?        -\n"
        "12    0      n3 (no map)  host-c    -            -           eth0\n"
    )
    assert render_rank_map_table([]) == "no ranks recorded\n"


# -------------------------------------------------------------------------------------------
# The GPU from the rank itself: torch's device UUID, joined by UUID
# -------------------------------------------------------------------------------------------

# A node of four GPUs whose NVML order is not PCI order, as the Prolog recorded it; the job was
# given the GPUs on buses 05 and c1, and Slurm's device cgroup renumbers them 0 and 1 for the job
CGROUP_GPUS = (
    _gpu(0, "GPU-cccc0001-0000-0000-0000-000000000000", "0000:81:00.0"),
    _gpu(1, "GPU-aaaa0002-0000-0000-0000-000000000000", "0000:04:00.0"),
    _gpu(2, "GPU-bbbb0003-0000-0000-0000-000000000000", "0000:05:00.0"),
    _gpu(3, "GPU-dddd0004-0000-0000-0000-000000000000", "0000:c1:00.0"),
)


def _cgroup_map():
    vm = collect.collect_hardware_map(
        "n1", sysfs_root=VM / "sys", proc_root=VM / "proc", nvml_loader=loader_of(FakeNvml([]))
    )
    return replace(vm, gpus=CGROUP_GPUS)


@pytest.mark.parametrize(
    "local_rank, torch_uuid, expected",
    [
        # torch prints the UUID bare; the job's cuda:0 is bus 05, cuda:1 bus c1
        (0, "bbbb0003-0000-0000-0000-000000000000", "GPU-bbbb0003-0000-0000-0000-000000000000"),
        (1, "dddd0004-0000-0000-0000-000000000000", "GPU-dddd0004-0000-0000-0000-000000000000"),
        (1, "GPU-DDDD0004-0000-0000-0000-000000000000", "GPU-dddd0004-0000-0000-0000-000000000000"),
    ],
)
def test_the_rank_own_uuid_names_its_gpu_where_the_index_rule_cannot(
    local_rank, torch_uuid, expected
):
    hwmap = _cgroup_map()
    place = replace(_place(0, "n1", []), cuda_visible_devices="0,1", local_rank=local_rank)
    by_index = join.join_with_map(place, hwmap)
    # the index rule reads the cgroup's "0,1" against the whole node in PCI order: buses 04, 05
    assert by_index.gpu_from == "index"
    assert by_index.gpu_uuids != (expected,)
    by_device = join.join_with_map(replace(place, device_uuid=torch_uuid), hwmap)
    assert (by_device.gpu_uuids, by_device.gpu_from) == ((expected,), "device")


def test_a_device_uuid_the_map_lacks_is_kept_never_replaced_by_an_index():
    hwmap = _cgroup_map()
    place = replace(_place(0, "n1", []), cuda_visible_devices="0", device_uuid="eeee-1")
    joined = join.join_with_map(place, hwmap)
    assert (joined.gpu_uuids, joined.gpu_from) == (("GPU-eeee-1",), "device")
    mig = join.join_with_map(replace(place, device_uuid=MIG_UUID), _constructed_map())
    assert mig.gpu_uuids == (GPU1_UUID,)  # a MIG instance names its parent GPU


def test_the_bootstrap_rewrites_its_place_with_the_device_uuid(hook_env):
    from scout_slurm.bootstrap import deviceid
    from scout_slurm.evidence import store

    assert run_prolog() == 0
    place = replace(_place(3, "n1", []), cuda_visible_devices="0", local_rank=0, nic="")
    place = join.join_place(hook_env.folder, place)
    assert (place.gpu_uuids, place.gpu_from) == ((GPU0_UUID,), "index")
    path = hook_env.folder.rank_place_path(0, 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    store.write_record(path, place)
    run_dir = hook_env.folder.run(0).path
    bare = GPU1_UUID.removeprefix("GPU-")  # torch's form
    new = deviceid.record(run_dir, 3, bare)
    assert new == store.read_record(path, RankPlace)
    assert (new.gpu_uuids, new.gpu_from, new.device_uuid, new.nic) == (
        (GPU1_UUID,),
        "device",
        bare,
        "eth1",  # the NIC nearest the GPU it uses, no longer the index rule's
    )
    assert deviceid.record(run_dir, 5, bare) is None  # no place of this rank's: nothing written


def test_a_version_1_place_record_still_reads(tmp_path):
    import json

    from scout_slurm.evidence import store

    path = tmp_path / "rank-0.json"
    store.write_record(path, _place(0, "n1", ["GPU-x"]))
    obj = json.loads(path.read_text())
    for k in ("device_uuid", "gpu_from"):
        obj.pop(k)
    obj["schema_version"] = 1
    path.write_text(json.dumps(obj))
    old = store.read_record(path, RankPlace)
    assert (old.device_uuid, old.gpu_from, old.gpu_uuids) == ("", "", ("GPU-x",))
