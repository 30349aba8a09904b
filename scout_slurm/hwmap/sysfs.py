"""NICs, InfiniBand ports, PCI ancestry, CPU and memory, read from a sysfs and a procfs tree.

Both roots are parameters so recorded trees (tests/fixtures/sysfs/) stand in for a node. Every
read is bounded and refuses anything that is not a regular file (a FIFO would block, a directory
or dangling link cannot be read); whatever cannot be read becomes a `problems` entry naming the
file, never an exception. The one function that reaches outside is `read_small`.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from scout_slurm.hwmap.records import Affinity, IbPort, NicInfo, NicKind

READ_LIMIT = 64 * 1024  # every sysfs attribute is at most a page; 64 KiB is generous
CPUINFO_LIMIT = 8 * 1024 * 1024  # /proc/cpuinfo is ~1.5 KiB per logical CPU
MAX_ENTRIES = 4096  # interfaces, HCAs or ports listed per directory

_PCI_ADDR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_PCI_ROOT = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")

# ARPHRD_* values in /sys/class/net/<if>/type (include/uapi/linux/if_arp.h)
_ARPHRD_ETHER = 1
_ARPHRD_INFINIBAND = 32
_ARPHRD_LOOPBACK = 772

Problems = list[str]


class UnreadableFile(OSError):
    """A file that exists but is not something a bounded read can take (FIFO, directory, ...)."""


def read_small(path: Path, *, limit: int = READ_LIMIT) -> tuple[str, bool]:
    """Text of a small regular file, at most `limit` bytes; returns (text, truncated).

    Opened non-blocking so a FIFO planted in a copy cannot hang the reader; anything but a
    regular file is refused after `fstat` on the open descriptor.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableFile(
                errno.EINVAL, f"not a regular file ({_file_type(mode)})", str(path)
            )
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    truncated = len(data) > limit
    return data[:limit].decode("utf-8", errors="replace"), truncated


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "unknown type"


def _why(exc: OSError) -> str:
    if isinstance(exc, UnreadableFile):
        return exc.strerror or "unreadable"
    return exc.strerror or type(exc).__name__


def _read(
    path: Path, problems: Problems, *, limit: int = READ_LIMIT, quiet_errnos: Iterable[int] = ()
) -> str | None:
    """Stripped text of `path`, or None with a problem recorded (none for `quiet_errnos`)."""
    try:
        text, truncated = read_small(path, limit=limit)
    except OSError as exc:
        if exc.errno not in tuple(quiet_errnos) or isinstance(exc, UnreadableFile):
            problems.append(f"{path}: {_why(exc)}")
        return None
    if truncated:
        problems.append(f"{path}: larger than {limit} bytes; read the first {limit}")
    return text.strip()


def _int_or(text: str | None, default: int, path: Path, problems: Problems) -> int:
    if text is None:
        return default
    try:
        return int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        problems.append(f"{path}: not an integer: {text[:40]!r}")
        return default


def _list_dir(path: Path, problems: Problems, *, missing_ok: bool = False) -> list[str]:
    try:
        with os.scandir(path) as it:
            names = []
            for entry in it:
                names.append(entry.name)
                if len(names) > MAX_ENTRIES:
                    problems.append(
                        f"{path}: more than {MAX_ENTRIES} entries; listed the first {MAX_ENTRIES}"
                    )
                    break
    except FileNotFoundError:
        if not missing_ok:
            problems.append(f"{path}: missing")
        return []
    except OSError as exc:
        problems.append(f"{path}: {_why(exc)}")
        return []
    return sorted(names[:MAX_ENTRIES])


def _resolve_inside(root: Path, path: Path) -> Path | None:
    """Where `path` (under `root`) really is, or None when its links lead outside `root`."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        return None
    return Path(real)


def _device_parts(sysfs_root: Path, real: Path) -> tuple[str, ...] | None:
    """The parts of a resolved path below `<sysfs_root>/devices`, or None if elsewhere."""
    devices = Path(os.path.realpath(sysfs_root)) / "devices"
    try:
        return real.relative_to(devices).parts
    except ValueError:
        return None


def normalise_pci_address(address: str) -> str:
    """NVML's `00000000:1B:00.0` and sysfs' `0000:1b:00.0` to the sysfs form (pure)."""
    address = address.strip().lower()
    m = re.fullmatch(r"([0-9a-f]{1,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])", address)
    if not m:
        return address
    return f"{int(m.group(1), 16):04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


# -- identity, CPU, memory --------------------------------------------------------------------


def read_identity(proc_root: Path) -> tuple[str, str, str, tuple[str, ...]]:
    """(hostname, boot_id, kernel release, problems) from /proc/sys/kernel."""
    problems: Problems = []
    kernel_dir = Path(proc_root) / "sys" / "kernel"
    hostname = _read(kernel_dir / "hostname", problems) or ""
    boot_id = _read(kernel_dir / "random" / "boot_id", problems) or ""
    kernel = _read(kernel_dir / "osrelease", problems) or ""
    return hostname, boot_id, kernel, tuple(problems)


def parse_cpuinfo(text: str) -> tuple[str, int]:
    """(model name, number of distinct physical ids; 0 when cpuinfo has none) (pure)."""
    model = ""
    sockets: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "model name" and not model:
            model = value
        elif key == "physical id":
            sockets.add(value)
    return model, len(sockets)


def parse_meminfo(text: str) -> int:
    """MemTotal in bytes, -1 when absent (pure)."""
    for line in text.splitlines():
        m = re.fullmatch(r"MemTotal:\s+(\d+)\s*kB", line.strip())
        if m:
            return int(m.group(1)) * 1024
    return -1


def read_cpu_memory(proc_root: Path) -> tuple[str, int, int, tuple[str, ...]]:
    """(cpu model, sockets, memory bytes, problems); unknowns are "", 0 and -1."""
    problems: Problems = []
    cpuinfo_path = Path(proc_root) / "cpuinfo"
    cpuinfo = _read(cpuinfo_path, problems, limit=CPUINFO_LIMIT)
    model, sockets = ("", 0)
    if cpuinfo is not None:
        model, sockets = parse_cpuinfo(cpuinfo)
        if not model:
            problems.append(f"{cpuinfo_path}: no 'model name' line")
        if sockets == 0:
            problems.append(f"{cpuinfo_path}: no 'physical id' lines; socket count unknown")
    meminfo_path = Path(proc_root) / "meminfo"
    meminfo = _read(meminfo_path, problems)
    memory = -1
    if meminfo is not None:
        memory = parse_meminfo(meminfo)
        if memory < 0:
            problems.append(f"{meminfo_path}: no MemTotal line")
    return model, sockets, memory, tuple(problems)


# -- PCI ---------------------------------------------------------------------------------------


def pci_path(sysfs_root: Path, pci_address: str) -> tuple[str, ...]:
    """The PCI chain from the root complex down to the device, e.g.
    ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:04:00.0");
    () when the device is not in this tree."""
    address = normalise_pci_address(pci_address)
    if not _PCI_ADDR.match(address):
        return ()
    link = Path(sysfs_root) / "bus" / "pci" / "devices" / address
    if not os.path.lexists(link):
        return ()
    real = _resolve_inside(Path(sysfs_root), link)
    if real is None:
        return ()
    parts = _device_parts(Path(sysfs_root), real)
    if not parts:
        return ()
    chain = [p for p in parts if _PCI_ROOT.match(p) or _PCI_ADDR.match(p)]
    if not chain or chain[-1] != address:
        return ()
    return tuple(chain)


def pci_numa_node(sysfs_root: Path, pci_address: str, problems: Problems) -> int:
    """A PCI device's NUMA node, -1 when the platform does not say (or the device is unknown)."""
    address = normalise_pci_address(pci_address)
    if not _PCI_ADDR.match(address):
        return -1
    path = Path(sysfs_root) / "bus" / "pci" / "devices" / address / "numa_node"
    return _int_or(_read(path, problems), -1, path, problems)


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    out = []
    for x, y in zip(a, b):
        if x != y:
            break
        out.append(x)
    return tuple(out)


def nic_affinity(
    gpu_chain: Sequence[str], gpu_numa: int, nic: NicInfo, nic_chain: Sequence[str]
) -> tuple[Affinity, int]:
    """How near one NIC is to one GPU, and the depth of their common PCI ancestry (pure).

    Sharing any PCI bridge below the root complex means sharing a switch (a root port has one
    link); sharing only the host bridge puts both on one socket, as does an equal NUMA node.
    """
    common = _common_prefix(gpu_chain, nic_chain)
    bridges = sum(1 for p in common if _PCI_ADDR.match(p))
    if bridges:
        return Affinity.SAME_PCI_SWITCH, bridges
    if common or (gpu_numa >= 0 and gpu_numa == nic.numa_node):
        return Affinity.SAME_NUMA, 0
    return Affinity.NONE, 0


_KIND_PREFERENCE = {NicKind.INFINIBAND: 0, NicKind.ETHERNET: 1}
_HOW_RANK = {Affinity.SAME_PCI_SWITCH: 0, Affinity.SAME_NUMA: 1, Affinity.NONE: 2}


def nearest_nic(gpu_pci: str, nics: Sequence[NicInfo], sysfs_root: Path) -> tuple[str, Affinity]:
    """The NIC nearest a GPU by longest common PCI ancestry (same switch beats same NUMA node
    beats none); ties prefer InfiniBand, then a link that is up, then the name. ("", NONE) when
    no physical NIC shares anything with the GPU."""
    ignored: Problems = []
    gpu_chain = pci_path(sysfs_root, gpu_pci)
    gpu_numa = pci_numa_node(sysfs_root, gpu_pci, ignored)
    best: tuple | None = None
    for nic in nics:
        if not nic.pci_address or nic.kind not in _KIND_PREFERENCE:
            continue
        how, depth = nic_affinity(gpu_chain, gpu_numa, nic, pci_path(sysfs_root, nic.pci_address))
        if how is Affinity.NONE:
            continue
        key = (_HOW_RANK[how], -depth, _KIND_PREFERENCE[nic.kind], nic.operstate != "up", nic.name)
        if best is None or key < best[0]:
            best = (key, nic.name, how)
    if best is None:
        return "", Affinity.NONE
    return best[1], best[2]


# -- network interfaces ------------------------------------------------------------------------


def _nic_kind(arphrd: int, is_virtual: bool) -> NicKind:
    if arphrd == _ARPHRD_LOOPBACK:
        return NicKind.LOOPBACK
    if is_virtual:
        return NicKind.VIRTUAL
    if arphrd == _ARPHRD_INFINIBAND:
        return NicKind.INFINIBAND
    return NicKind.ETHERNET


def read_nics(sysfs_root: Path) -> tuple[tuple[NicInfo, ...], tuple[str, ...]]:
    """Every interface in /sys/class/net, with its PCI address and NUMA node when it has one."""
    problems: Problems = []
    root = Path(sysfs_root)
    class_net = root / "class" / "net"
    nics = []
    for name in _list_dir(class_net, problems):
        entry = class_net / name
        real = _resolve_inside(root, entry)
        parts = _device_parts(root, real) if real is not None else None
        if parts is None:
            problems.append(f"{entry}: link does not lead into {root / 'devices'}")
            parts = ()
        is_virtual = bool(parts) and parts[0] == "virtual"
        pci_address, pci_dir = "", None
        for i, part in enumerate(parts):
            if _PCI_ADDR.match(part):
                pci_address = part
                pci_dir = root / "devices" / Path(*parts[: i + 1])
        arphrd = _int_or(_read(entry / "type", problems), -1, entry / "type", problems)
        mac = _read(entry / "address", problems) or ""
        operstate = _read(entry / "operstate", problems) or "unknown"
        # the kernel answers EINVAL for the speed of a link that is down or has no speed
        speed_path = entry / "speed"
        speed = _int_or(
            _read(speed_path, problems, quiet_errnos=(errno.EINVAL, errno.ENOENT)),
            -1,
            speed_path,
            problems,
        )
        numa = -1
        if pci_dir is not None:
            numa_path = pci_dir / "numa_node"
            numa = _int_or(_read(numa_path, problems), -1, numa_path, problems)
        nics.append(
            NicInfo(
                name=name,
                mac=mac,
                pci_address=pci_address,
                numa_node=numa,
                speed_mbps=speed if speed >= 0 else -1,
                operstate=operstate,
                kind=_nic_kind(arphrd, is_virtual),
            )
        )
    return tuple(nics), tuple(problems)


# -- InfiniBand --------------------------------------------------------------------------------


def _guid(text: str | None) -> str:
    """`0c42:a103:0001:2b3c` (node_guid) or a GID's last 64 bits as 0x0c42a10300012b3c."""
    if not text:
        return ""
    groups = text.strip().split(":")
    if len(groups) < 4 or not all(re.fullmatch(r"[0-9a-fA-F]{1,4}", g) for g in groups[-4:]):
        return ""
    value = "".join(g.zfill(4) for g in groups[-4:]).lower()
    return "" if int(value, 16) == 0 else "0x" + value


def read_ib_ports(sysfs_root: Path) -> tuple[tuple[IbPort, ...], tuple[str, ...]]:
    """Every port of every HCA in /sys/class/infiniband (none, quietly, when the class is
    absent).
    """
    problems: Problems = []
    class_ib = Path(sysfs_root) / "class" / "infiniband"
    ports = []
    for hca in _list_dir(class_ib, problems, missing_ok=True):
        hca_dir = class_ib / hca
        node_guid = _guid(_read(hca_dir / "node_guid", problems))
        for port_name in _list_dir(hca_dir / "ports", problems):
            if not port_name.isdigit():
                continue
            port_dir = hca_dir / "ports" / port_name
            gid0 = _guid(_read(port_dir / "gids" / "0", problems))
            ports.append(
                IbPort(
                    hca=hca,
                    port=int(port_name),
                    guid=gid0 or node_guid,
                    state=_read(port_dir / "state", problems) or "",
                    rate=_read(port_dir / "rate", problems) or "",
                    link_layer=_read(port_dir / "link_layer", problems) or "",
                )
            )
    ports.sort(key=lambda p: (p.hca, p.port))
    return tuple(ports), tuple(problems)
