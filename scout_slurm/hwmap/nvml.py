"""The node's GPUs through NVML: the only module that imports pynvml.

`read_gpus` reaches outside (NVML); its `loader` parameter is the test seam: a callable that
returns an object with pynvml's API. `resolve_visible_uuids` is pure.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from scout_slurm.hwmap.records import GpuInfo
from scout_slurm.hwmap.sysfs import normalise_pci_address

try:  # the error classes are needed even when a fake loader stands in for the library
    import pynvml as _pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    _pynvml = None

Loader = Callable[[], Any]

STATUS_OK = "ok"
STATUS_NO_LIBRARY = "no-library"
STATUS_NO_GPU = "no-gpu"

_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_LIBRARY_NOT_FOUND = 12


def _default_loader() -> Any:
    return importlib.import_module("pynvml")


def _error_value(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _is_nvml_error(exc: BaseException) -> bool:
    return _pynvml is not None and isinstance(exc, _pynvml.NVMLError)


def _describe(exc: BaseException) -> str:
    if _is_nvml_error(exc):
        return str(exc) or f"NVML error {_error_value(exc)}"
    return f"{type(exc).__name__}: {exc}"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").strip("\0 ")
    return str(value).strip()


def _cuda_version(value: int) -> str:
    """nvmlSystemGetCudaDriverVersion's 12040 is CUDA 12.4."""
    return f"{value // 1000}.{(value % 1000) // 10}"


class _Calls:
    """Runs NVML calls, turning each failure into a problem line; remembers real errors."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.problems: list[str] = []
        self.errors: list[str] = []  # failures other than "not supported"

    def call(self, what: str, fn_name: str, *args: Any, default: Any = None) -> Any:
        try:
            return getattr(self.nv, fn_name)(*args)
        except Exception as exc:  # noqa: BLE001 - a broken driver may raise anything; it is reported
            if _error_value(exc) == _NVML_ERROR_NOT_SUPPORTED:
                self.problems.append(f"{fn_name}({what}): not supported")
            else:
                line = f"{fn_name}({what}): {_describe(exc)}"
                self.problems.append(line)
                self.errors.append(line)
            return default


def read_gpus(loader: Loader | None = None) -> tuple[tuple[GpuInfo, ...], str, tuple[str, ...]]:
    """(GPUs ordered by NVML index, status, problems).

    Status: "ok"; "no-library" (NVML is not installed: not a GPU node); "no-gpu" (NVML works and
    counts none); "error: ..." when NVML or any GPU failed a call other than one it does not
    support. numa_node is left at -1: sysfs knows it (collect fills it in).
    """
    try:
        nv = (loader or _default_loader)()
    except ImportError as exc:
        return (), STATUS_NO_LIBRARY, (f"import pynvml: {exc}",)
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVML raises its own types, or anything when broken
        if _error_value(exc) == _NVML_ERROR_LIBRARY_NOT_FOUND:
            return (), STATUS_NO_LIBRARY, (f"nvmlInit: {_describe(exc)}",)
        return (), f"error: nvmlInit: {_describe(exc)}", (f"nvmlInit: {_describe(exc)}",)
    calls = _Calls(nv)
    try:
        gpus = _read_all(calls)
    finally:
        calls.call("", "nvmlShutdown")
    if calls.errors:
        status = f"error: {len(calls.errors)} NVML call(s) failed; first: {calls.errors[0]}"
    elif not gpus:
        status = STATUS_NO_GPU
    else:
        status = STATUS_OK
    return gpus, status, tuple(calls.problems)


def _read_all(calls: _Calls) -> tuple[GpuInfo, ...]:
    count = calls.call("", "nvmlDeviceGetCount")
    if count is None:
        return ()
    driver = _text(calls.call("", "nvmlSystemGetDriverVersion", default=""))
    cuda_raw = calls.call("", "nvmlSystemGetCudaDriverVersion")
    cuda = _cuda_version(cuda_raw) if isinstance(cuda_raw, int) else ""
    gpus = []
    for index in range(int(count)):
        where = f"gpu {index}"
        handle = calls.call(where, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            continue
        uuid = _text(calls.call(where, "nvmlDeviceGetUUID", handle, default=""))
        serial = _text(calls.call(where, "nvmlDeviceGetSerial", handle, default=""))
        name = _text(calls.call(where, "nvmlDeviceGetName", handle, default=""))
        pci = calls.call(where, "nvmlDeviceGetPciInfo", handle)
        bus_id = normalise_pci_address(_text(getattr(pci, "busId", ""))) if pci is not None else ""
        ecc = calls.call(where, "nvmlDeviceGetEccMode", handle)
        ecc_mode = "unknown"
        if isinstance(ecc, (tuple, list)) and ecc:
            ecc_mode = "enabled" if ecc[0] else "disabled"
        gpus.append(
            GpuInfo(
                index=index,
                uuid=uuid,
                serial=serial,
                pci_bus_id=bus_id,
                name=name,
                driver_version=driver,
                cuda_driver_version=cuda,
                ecc_mode=ecc_mode,
                numa_node=-1,
                mig_uuids=_mig_uuids(calls, handle, where),
            )
        )
    return tuple(gpus)


def _mig_uuids(calls: _Calls, handle: Any, where: str) -> tuple[str, ...]:
    # Only asked when MIG is on; most GPUs answer "not supported", which is not worth a line.
    try:
        mode = calls.nv.nvmlDeviceGetMigMode(handle)
    except Exception:  # noqa: BLE001 - no MIG on this GPU or this driver
        return ()
    if not (isinstance(mode, (tuple, list)) and mode and mode[0]):
        return ()
    count = calls.call(where, "nvmlDeviceGetMaxMigDeviceCount", handle, default=0) or 0
    out = []
    for i in range(int(count)):
        try:
            mig = calls.nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except Exception:  # noqa: BLE001 - slot not populated
            continue
        uuid = _text(calls.call(f"{where} mig {i}", "nvmlDeviceGetUUID", mig, default=""))
        if uuid:
            out.append(uuid)
    return tuple(out)


def resolve_visible_uuids(cuda_visible_devices: str, gpus: Sequence[GpuInfo]) -> tuple[str, ...]:
    """The physical GPUs' UUIDs a process sees under CUDA_VISIBLE_DEVICES (pure).

    Entries may be indices (positions in the map ordered by PCI bus id: what
    CUDA_DEVICE_ORDER=PCI_BUS_ID means), UUIDs or unique UUID prefixes (GPU-...), or MIG ids
    (MIG-<uuid>, or the older MIG-GPU-<uuid>/<gi>/<ci>), which resolve to their parent GPU.
    Like CUDA, parsing stops at the first entry that names no device. An empty string means the
    variable was not set, so every GPU is visible.
    """
    by_pci = sorted(gpus, key=lambda g: (g.pci_bus_id, g.index))
    if not cuda_visible_devices.strip():
        return tuple(g.uuid for g in by_pci if g.uuid)
    out: list[str] = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        uuid = _resolve_one(entry, by_pci)
        if uuid is None:
            break
        if uuid not in out:
            out.append(uuid)
    return tuple(out)


def _resolve_one(entry: str, by_pci: Sequence[GpuInfo]) -> str | None:
    if entry.isdigit():
        i = int(entry)
        return by_pci[i].uuid if i < len(by_pci) and by_pci[i].uuid else None
    if entry.startswith("MIG-GPU-"):  # MIG-GPU-<parent uuid>/<gi>/<ci> (drivers before R470)
        return _by_prefix(entry[len("MIG-") :].split("/", 1)[0], by_pci, exact=True)
    if entry.startswith("MIG-"):
        for gpu in by_pci:
            if entry in gpu.mig_uuids:
                return gpu.uuid
        return None
    if entry.startswith("GPU-"):
        return _by_prefix(entry, by_pci, exact=False)
    return None


def _by_prefix(prefix: str, by_pci: Sequence[GpuInfo], *, exact: bool) -> str | None:
    matches = [
        g.uuid
        for g in by_pci
        if g.uuid and (g.uuid == prefix if exact else g.uuid.startswith(prefix))
    ]
    return matches[0] if len(matches) == 1 else None
