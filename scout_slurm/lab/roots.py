"""Slurm releases the lab runs besides the host's: each a Debian root (mmdebstrap) built once into
a cache, then seen by each lab through a private view of bind mounts, its daemons run by chroot.

Cache: $SCOUT_SLURM_ROOTS, else /var/cache/scout-slurm/roots/<version> (about 185 MB each).
View: <state dir>/rootfs, a bind mount of the cached root (made private, so nothing mounted under
it reaches the cache or another lab's view) plus /proc, /sys, /dev, /tmp, the users (/etc/passwd,
/etc/group), /etc/hosts, the lab's state folder and the project's Python (the venv, the project,
the interpreter and its standard library), each at the path it has outside. `unmount_view` takes
it all down again; `mounts_under` is what tests assert empty.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scout_slurm.errors import LabError
from scout_slurm.log import get_logger

log = get_logger("scout.lab")

# Debian suite per Slurm release (measured 2026-12: bookworm 22.05.8, trixie 24.11.5, sid 26.05.5)
SUITES = {"24.11": "trixie", "26.05": "sid"}
# what the daemons need, plus the two libraries the host's Python needs that the apt variant lacks
ROOT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "procps", "libexpat1", "libffi8")
ROOT_RECORD = ".scout-root.json"
_BUILD_TIMEOUT_S = 1800


def cache_dir() -> Path:
    return Path(os.environ.get("SCOUT_SLURM_ROOTS", "/var/cache/scout-slurm/roots"))


def host_version() -> str:
    """The host's Slurm release as MAJOR.MINOR (from dpkg; "" where Slurm is not a Debian
    package).
    """
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "slurm-client"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return ".".join(out.split(".")[:2]) if out else ""


def check_version(version: str) -> str:
    """`version` if the lab can run it ("" = the host's), else a LabError that lists the choices."""
    if not version or version == host_version():
        return ""
    if version not in SUITES:
        raise LabError(
            f"lab: Slurm {version!r} is not one the lab can run; choose the host's "
            f"({host_version() or 'none installed'}) or one of {', '.join(SUITES)}"
        )
    return version


def root_record(version: str) -> dict:
    """What the cached root of `version` holds (built, Slurm version, size, seconds), {} if not
    built.
    """
    try:
        data = json.loads((cache_dir() / version / ROOT_RECORD).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def ensure_root(version: str, *, echo=None) -> Path:
    """The cached root of `version`, built first when missing (mmdebstrap, root only, needs Debian's
    mirror). A half-built root is never used: it is built under another name and renamed."""
    root = cache_dir() / version
    if root_record(version):
        return root
    mmdebstrap = shutil.which("mmdebstrap", path="/usr/bin:/usr/sbin:/bin:/sbin")
    if not mmdebstrap:
        raise LabError(
            f"lab --slurm {version}: mmdebstrap is needed to build its root once "
            "(apt-get install mmdebstrap; scripts/setup.sh installs it)"
        )
    if os.geteuid() != 0:
        raise LabError(
            f"lab --slurm {version}: building and running a root needs root (chroot, mounts)"
        )
    cache_dir().mkdir(parents=True, exist_ok=True)
    tmp = cache_dir() / f".build-{version}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    if echo:
        echo(
            f"lab: building the Slurm {version} root ({SUITES[version]}) in {root}, once "
            "(about 20 to 100 s)"
        )
    t0 = time.monotonic()
    # Check-Valid-Until off: sid's Release file may be past its Valid-Until on a machine whose clock
    # is ahead
    argv = [
        mmdebstrap,
        "--variant=apt",
        '--aptopt=Acquire::Check-Valid-Until "false"',
        f"--include={','.join(ROOT_PACKAGES)}",
        SUITES[version],
        str(tmp),
    ]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LabError(
            f"lab: building the Slurm {version} root took over {_BUILD_TIMEOUT_S} s; gave up"
        ) from None
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LabError(
            f"lab: `{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()[-800:]}"
        )
    seconds = time.monotonic() - t0
    slurm = _package_version(tmp, "slurmd")
    if not slurm.startswith(version + "."):
        shutil.rmtree(tmp, ignore_errors=True)
        raise LabError(
            f"lab: the {SUITES[version]} root holds Slurm {slurm or 'nothing'}, not {version}: "
            "Debian moved on; update roots.SUITES"
        )
    record = {
        "version": version,
        "suite": SUITES[version],
        "slurm": slurm,
        "build_s": round(seconds, 1),
        "bytes": _tree_bytes(tmp),
        "built": time.time(),
    }
    (tmp / ROOT_RECORD).write_text(json.dumps(record, indent=1))
    shutil.rmtree(root, ignore_errors=True)  # an unrecorded (half-built) one
    tmp.rename(root)
    log.info("lab.root_built", **record)
    return root


def _package_version(root: Path, package: str) -> str:
    proc = subprocess.run(
        ["chroot", str(root), "dpkg-query", "-W", "-f", "${Version}", package],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


# -- the per-lab view ------------------------------------------------------------------------


def python_paths(python: str) -> list[Path]:
    """What the project's Python needs at its own path inside a root: the venv, the project (an
    editable install points there), the interpreter and its standard library."""
    import scout_slurm

    project = Path(scout_slurm.__file__).resolve().parents[1]
    stdlib = Path(os.__file__).resolve().parent
    real = Path(os.path.realpath(python))
    return outermost([venv_of(python), project, stdlib, real])


def venv_of(python: str) -> Path:
    """The environment `python` belongs to: its venv (the folder above bin/ holding pyvenv.cfg),
    else
    its install prefix."""
    above = Path(python).absolute().parent.parent
    return above if (above / "pyvenv.cfg").exists() else Path(sys.prefix)


def outermost(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts)):
        if not any(p.is_relative_to(q) for q in out):
            out.append(p)
    return out


def _mount(*args: str) -> None:
    proc = subprocess.run(
        ["mount", *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        raise LabError(
            f"lab: `mount {' '.join(args)}` exited {proc.returncode}: {proc.stderr.strip()[:300]}"
        )


def _mount_point(view: Path, outside: Path) -> Path:
    """Create, inside the view, the file or folder `outside` is mounted on (same kind, same
    path).
    """
    inside = view / str(outside).lstrip("/")
    if outside.is_dir():
        inside.mkdir(parents=True, exist_ok=True)
    else:
        inside.parent.mkdir(parents=True, exist_ok=True)
        if not inside.exists() and not inside.is_symlink():
            inside.touch()
    return inside


def mount_view(root: Path, view: Path, *, binds: list[Path], hosts: Path, python: str) -> None:
    """Bind `root` at `view`, private, then what the daemons, hooks and jobs need inside it."""
    if mounts_under(view):
        raise LabError(f"lab: {view} still has mounts; run `scout lab down` on its lab first")
    view.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(root), str(view))
    _mount("--make-rprivate", str(view))
    _mount("-t", "proc", "proc", str(view / "proc"))
    _mount("--bind", "/sys", str(view / "sys"))
    _mount("--rbind", "/dev", str(view / "dev"))
    _mount("--make-rslave", str(view / "dev"))
    _link_interpreter(view, binds, python)
    for outside in [Path("/tmp"), *binds]:
        _mount("--bind", str(outside), str(_mount_point(view, outside)))
    for name, outside in (
        ("passwd", Path("/etc/passwd")),
        ("group", Path("/etc/group")),
        ("hosts", hosts),
    ):
        inside = view / "etc" / name
        if not inside.exists():
            inside.touch()
        _mount("--bind", str(outside), str(inside))


def _link_interpreter(view: Path, binds: list[Path], python: str) -> None:
    """The venv's `python -> python3 -> /usr/bin/python3 -> python3.11` chain: the links the root
    lacks are made in the root (the last target is bind-mounted there)."""
    link = Path(python).absolute()
    for _ in range(8):
        if not link.is_symlink():
            return
        target = os.readlink(link)
        inside = view / str(link).lstrip("/")
        if (
            not any(link.is_relative_to(b) for b in binds)
            and not inside.is_symlink()
            and not inside.exists()
        ):
            inside.parent.mkdir(parents=True, exist_ok=True)
            inside.symlink_to(target)
        link = (link.parent / target) if not os.path.isabs(target) else Path(target)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or under `path` in this mount namespace, deepest first."""
    base = str(Path(path).resolve())
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            target = fields[4].encode().decode("unicode_escape")
            if target == base or target.startswith(base + "/"):
                found.append(target)
    return sorted(set(found), key=lambda t: -t.count("/"))


def unmount_view(view: Path) -> list[str]:
    """Unmount everything at and under `view`, deepest first; returns what was unmounted."""
    done = []
    for _ in range(3):
        targets = mounts_under(view)
        if not targets:
            break
        for target in targets:
            proc = subprocess.run(
                ["umount", target],
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
            )
            if proc.returncode == 0:
                done.append(target)
    left = mounts_under(view)
    if left:
        for target in left:  # busy: a process we could not stop still holds it; detach it at least
            subprocess.run(
                ["umount", "-l", target], capture_output=True, timeout=30, stdin=subprocess.DEVNULL
            )
        still = mounts_under(view)
        if still:
            raise LabError(f"lab down: could not unmount {', '.join(still)}")
        log.warning("lab.lazy_unmount", targets=left)
    return done


def main(argv: list[str] | None = None) -> int:
    """`python -m scout_slurm.lab.roots 24.11 26.05`: build what is missing, print each root's
    record
    (CI runs this before the tests so the build time shows on its own line)."""
    for version in argv if argv is not None else sys.argv[1:]:
        check_version(version)
        t0 = time.monotonic()
        root = ensure_root(version, echo=print)
        rec = root_record(version)
        print(
            f"slurm root {version}: {root}, Slurm {rec.get('slurm')}, "
            f"{rec.get('bytes', 0) / 1e6:.0f} MB, "
            f"built in {rec.get('build_s')} s; ready after {time.monotonic() - t0:.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
