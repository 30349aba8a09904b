"""Gather one node's HardwareMap within a time budget.

The parts come cheapest first (identity, CPU, NICs, InfiniBand from sysfs), then NVML, which can
take seconds or hang on a broken GPU, then the GPU-NIC affinity. Past the budget the remaining
parts are skipped and say so in `problems`. A `MapBuilder` can be snapshotted from another thread
while it runs, so a caller that stops waiting still writes what was gathered.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

from scout_slurm.hwmap import nvml, sysfs
from scout_slurm.hwmap.records import GpuInfo, GpuNic, HardwareMap, NicInfo

Clock = Callable[[], float]
DEFAULT_DEADLINE_S = 15.0


class MapBuilder:
    """Collects stage by stage; `snapshot()` is safe to call at any time, from any thread."""

    def __init__(
        self,
        node: str,
        *,
        sysfs_root: Path = Path("/sys"),
        proc_root: Path = Path("/proc"),
        nvml_loader: nvml.Loader | None = None,
        clock: Clock = time.time,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> None:
        self.node = node
        self.sysfs_root = Path(sysfs_root)
        self.proc_root = Path(proc_root)
        self.nvml_loader = nvml_loader
        self.clock = clock
        self.deadline_s = deadline_s
        self.started_at = clock()
        self.stage = "not started"
        self._lock = threading.Lock()
        self._problems: list[str] = []
        self._fields: dict[str, object] = {
            "hostname": "",
            "boot_id": "",
            "kernel": "",
            "cpu_model": "",
            "cpu_sockets": 0,
            "memory_bytes": -1,
            "gpus": (),
            "nics": (),
            "ib_ports": (),
            "gpu_nic_affinity": (),
            "nvml_status": "not collected",
        }

    # -- running -------------------------------------------------------------------------------
    def run(self) -> HardwareMap:
        self._stage("identity", self._identity, optional=False)
        self._stage("cpu and memory", self._cpu_memory)
        self._stage("network interfaces", self._nics)
        self._stage("infiniband ports", self._ib)
        self._stage("gpus (nvml)", self._gpus)
        self._stage("gpu-nic affinity", self._affinity)
        self.stage = "done"
        return self.snapshot()

    def _stage(self, name: str, fn: Callable[[], None], *, optional: bool = True) -> None:
        elapsed = self.clock() - self.started_at
        if optional and elapsed > self.deadline_s:
            self._add(
                [
                    f"skipped {name}: over the time budget of {self.deadline_s:g} s "
                    f"after {elapsed:.1f} s"
                ]
            )
            return
        self.stage = name
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one part failing must not lose the others
            self._add([f"{name}: unexpected {type(exc).__name__}: {exc}"])

    def _set(self, **values: object) -> None:
        with self._lock:
            self._fields.update(values)

    def _add(self, problems) -> None:
        with self._lock:
            self._problems.extend(problems)

    def _identity(self) -> None:
        hostname, boot_id, kernel, problems = sysfs.read_identity(self.proc_root)
        self._set(hostname=hostname, boot_id=boot_id, kernel=kernel)
        self._add(problems)

    def _cpu_memory(self) -> None:
        model, sockets, memory, problems = sysfs.read_cpu_memory(self.proc_root)
        self._set(cpu_model=model, cpu_sockets=sockets, memory_bytes=memory)
        self._add(problems)

    def _nics(self) -> None:
        nics, problems = sysfs.read_nics(self.sysfs_root)
        self._set(nics=nics)
        self._add(problems)

    def _ib(self) -> None:
        ports, problems = sysfs.read_ib_ports(self.sysfs_root)
        self._set(ib_ports=ports)
        self._add(problems)

    def _gpus(self) -> None:
        self._set(nvml_status="interrupted")
        gpus, status, problems = nvml.read_gpus(self.nvml_loader)
        self._set(gpus=gpus, nvml_status=status)
        self._add(problems)

    def _affinity(self) -> None:
        problems: list[str] = []
        gpus: tuple[GpuInfo, ...] = self._fields["gpus"]  # type: ignore[assignment]
        nics: tuple[NicInfo, ...] = self._fields["nics"]  # type: ignore[assignment]
        placed, links = [], []
        for gpu in gpus:
            numa = (
                sysfs.pci_numa_node(self.sysfs_root, gpu.pci_bus_id, problems)
                if gpu.pci_bus_id
                else -1
            )
            placed.append(dataclasses.replace(gpu, numa_node=numa))
            if gpu.uuid:
                nic, how = sysfs.nearest_nic(gpu.pci_bus_id, nics, self.sysfs_root)
                links.append(GpuNic(gpu_uuid=gpu.uuid, nic=nic, how=how))
        self._set(gpus=tuple(placed), gpu_nic_affinity=tuple(links))
        self._add(problems)

    # -- reading -------------------------------------------------------------------------------
    def snapshot(self, extra_problems: tuple[str, ...] = ()) -> HardwareMap:
        """The map as gathered so far, plus `extra_problems` (e.g. why the caller stopped
        waiting).
        """
        now = self.clock()
        with self._lock:
            f = dict(self._fields)
            problems = tuple(self._problems) + tuple(extra_problems)
        return HardwareMap(
            node=self.node,
            hostname=f["hostname"],
            boot_id=f["boot_id"],
            kernel=f["kernel"],
            cpu_model=f["cpu_model"],
            cpu_sockets=f["cpu_sockets"],
            memory_bytes=f["memory_bytes"],
            gpus=f["gpus"],
            nics=f["nics"],
            ib_ports=f["ib_ports"],
            gpu_nic_affinity=f["gpu_nic_affinity"],
            nvml_status=f["nvml_status"],
            problems=problems,
            collected_at=self.started_at,
            duration_s=round(max(0.0, now - self.started_at), 6),
        )


def collect_hardware_map(
    node: str,
    *,
    sysfs_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    nvml_loader: nvml.Loader | None = None,
    clock: Clock = time.time,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> HardwareMap:
    """This node's map; parts that did not fit in `deadline_s` are named in `problems`."""
    return MapBuilder(
        node,
        sysfs_root=sysfs_root,
        proc_root=proc_root,
        nvml_loader=nvml_loader,
        clock=clock,
        deadline_s=deadline_s,
    ).run()
