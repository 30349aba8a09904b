"""The pyxis/enroot shape (`srun --container-image ...`): pyxis joins the container before the
task's command runs, so the shim runs inside the image. This module plans how scout's install
reaches it: read-only mounts of the packages the shim needs, added to the user's own
`--container-mounts`, and a start line that runs the shim with the image's python3, or the
command unwatched when the image cannot run it (pure; `scout_install` is the one function that
looks outside, at where the packages are installed).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from scout_slurm.errors import ScoutError

# pyxis's srun options (its `srun --help` section) that make a step a container step; pyxis reads
# each also from PYXIS_<NAME> in the environment where the option is not given (its mounts too,
# only where no --container-mounts is)
PYXIS_SELECTORS = ("container-image", "container-name")
PYXIS_ENV = {
    n: "PYXIS_" + n.upper().replace("-", "_") for n in (*PYXIS_SELECTORS, "container-mounts")
}
# pyxis's options that take a value, as srun's own long options do
PYXIS_WITH_VALUE = frozenset(
    "container-image container-mounts container-workdir container-name container-save "
    "container-env".split()
)
# where the shim's packages appear inside the image: a folder of its own, so that no package of
# the image is shadowed and no package of the host (built for another Python) leaks in
IN_CONTAINER_HOME = "/opt/scout-slurm"
IN_CONTAINER_LIB = IN_CONTAINER_HOME + "/lib"
# what the shim imports beyond the stdlib (pure Python both); the training process's bootstrap
# needs scout_slurm alone. xxhash (compiled) is optional and not mounted: the in-job signing
# falls back to blake2b on every rank when one rank lacks it.
SHIM_PACKAGES = ("scout_slurm", "structlog")
MIN_PYTHON = (3, 11)  # pyproject's requires-python

# What the image runs first: sh finds the image's python3, else says so and runs the command as
# if scout were not there. $1 is ENTRY; the rest is the user's command.
SH_START = (
    'entry=$1; shift; if command -v python3 >/dev/null 2>&1; then exec python3 -c "$entry" -- "$@"'
    '; fi; [ "${SLURM_LOCALID:-0}" = 0 ] && echo "scout: WARNING on $(hostname): the container '
    "image has no python3 on its PATH: scout cannot watch this step's tasks; they run unwatched "
    '(no evidence, no stall watch)" >&2; exec "$@"'
)
# The shim's start in the image's python3: a Python older than scout's, or a package that does not
# import, is said once a node and the command runs unwatched, with torch's rank variables from
# Slurm's (no MASTER_ADDR: a job that needs scout to set it sets it itself, or fails as without
# scout).
ENTRY = f"""import os, sys
sys.path.insert(0, {IN_CONTAINER_LIB!r})
cmd = sys.argv[sys.argv.index('--') + 1:]
try:
    if sys.version_info < {MIN_PYTHON!r}:
        raise ImportError('the image has Python %d.%d; scout needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]}'
                          ' or newer' % sys.version_info[:2])
    from scout_slurm.task.shim import main
except Exception as exc:
    if os.environ.get('SLURM_LOCALID', '0') == '0':
        sys.stderr.write('scout: WARNING on %s: scout cannot start in this container image (%s); '
                         "this node's tasks run unwatched (no evidence, no stall watch)\\n"
                         % (os.uname().nodename, exc))
        sys.stderr.flush()
    for name, slurm in (('RANK', 'SLURM_PROCID'), ('WORLD_SIZE', 'SLURM_NTASKS'),
                        ('LOCAL_RANK', 'SLURM_LOCALID')):
        if slurm in os.environ and not os.environ.get(name):
            os.environ[name] = os.environ[slurm]
    os.execvp(cmd[0], cmd)
sys.exit(main(['--', *cmd]))
"""


@dataclass(frozen=True)
class Mount:
    """One entry of pyxis's `--container-mounts` (SRC[:DST[:FLAGS]], flags joined by +)."""

    src: str
    dst: str
    flags: str = ""

    def spec(self) -> str:
        return ":".join(p for p in (self.src, self.dst, self.flags) if p)


@dataclass(frozen=True)
class ScoutInstall:
    """What the image needs from the host: each package's host folder, the site config file ("":
    none to mount) and the evidence root."""

    packages: tuple[tuple[str, str], ...]
    config_file: str
    evidence_root: str


@dataclass(frozen=True)
class ContainerStep:
    """srun's options with scout's mounts added, and the words that start the shim in the image."""

    srun_options: tuple[str, ...]
    start: tuple[str, ...]
    mounts: tuple[Mount, ...]


def parse_mounts(text: str) -> list[Mount]:
    """pyxis's comma list of mounts (pure); an entry without DST mounts at its own path."""
    out = []
    for entry in text.split(","):
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) > 3:
            raise ScoutError(f"scout-srun: --container-mounts entry {entry!r} is not SRC:DST:FLAGS")
        src = parts[0]
        dst = parts[1] if len(parts) > 1 and parts[1] else src
        out.append(Mount(src, dst, parts[2] if len(parts) > 2 else ""))
    return out


def _option_values(options: Sequence[str], name: str) -> list[tuple[int, str, bool]]:
    """(index, value, whether the value is inline: --name=value) for each time srun's `--name`
    is given (pure)."""
    found = []
    for i, a in enumerate(options):
        if a == "--" + name and i + 1 < len(options):
            found.append((i + 1, options[i + 1], False))
        elif a.startswith(f"--{name}="):
            found.append((i, a.split("=", 1)[1], True))
    return found


def is_container_step(options: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Does srun run this step inside a pyxis container? (pure)"""
    return any(_option_values(options, n) or environ.get(PYXIS_ENV[n]) for n in PYXIS_SELECTORS)


def _mountable(path: str, what: str) -> str:
    # pyxis splits its option on "," and ":": a path holding either cannot be named there
    if not path.startswith("/") or "," in path or ":" in path:
        raise ScoutError(
            f"scout-srun: cannot mount {what} {path!r} into the container: pyxis's "
            "--container-mounts takes absolute paths without ',' or ':'; install scout-slurm (or "
            "place the evidence root) under such a path, or run this step with --scout-off"
        )
    return path


def scout_mounts(install: ScoutInstall) -> list[Mount]:
    """The mounts the shim needs in the image (pure): its packages read-only under
    IN_CONTAINER_LIB, the site config read-only and the evidence root read-write at their own
    paths (the records name them, the site's hooks read them there)."""
    mounts = [
        Mount(_mountable(src, f"the package {name} at"), f"{IN_CONTAINER_LIB}/{name}", "ro")
        for name, src in install.packages
    ]
    if install.config_file:
        cfg = _mountable(install.config_file, "the site config")
        mounts.append(Mount(cfg, cfg, "ro"))
    root = _mountable(install.evidence_root, "the evidence root")
    mounts.append(Mount(root, root))
    return mounts


def _under(path: str, folder: str) -> bool:
    p, f = PurePosixPath(path), PurePosixPath(folder)
    return p == f or f in p.parents


def _check_user_mounts(user: Sequence[Mount], ours: Sequence[Mount]) -> list[Mount]:
    """Refuse a user's mount that would hide one of scout's; drop ours where the user's is the
    same (pure)."""
    keep = list(ours)
    for m in user:
        if _under(m.dst, IN_CONTAINER_HOME) or _under(IN_CONTAINER_HOME, m.dst):
            raise ScoutError(
                f"scout-srun: --container-mounts entry {m.spec()!r} mounts at {m.dst}, over "
                f"{IN_CONTAINER_HOME} where scout mounts its own install; mount it elsewhere"
            )
        for o in ours:
            if PurePosixPath(m.dst) != PurePosixPath(o.dst):
                continue
            if PurePosixPath(m.src) != PurePosixPath(o.src):
                raise ScoutError(
                    f"scout-srun: --container-mounts entry {m.spec()!r} puts {m.src} at {m.dst}, "
                    f"where scout needs {o.src} (the "
                    + ("site config" if o.flags == "ro" else "evidence root")
                    + "); mount it elsewhere, or run this step with --scout-off"
                )
            keep.remove(o)  # the user mounts it already
    return keep


def container_step(
    srun_options: Sequence[str],
    command: Sequence[str],
    install: ScoutInstall,
    environ: Mapping[str, str],
) -> ContainerStep:
    """srun's options and start words for a pyxis step (pure). scout's mounts go after the user's
    in the last `--container-mounts` given, or in a new one that starts with the user's
    PYXIS_CONTAINER_MOUNTS (pyxis reads that only where no option is given, so it is carried
    over)."""
    options = list(srun_options)
    given = _option_values(options, "container-mounts")
    from_env = "" if given else environ.get(PYXIS_ENV["container-mounts"], "").strip(",")
    texts = [text for _, text, _ in given] or [from_env]
    user = [m for text in texts for m in parse_mounts(text)]
    ours = _check_user_mounts(user, scout_mounts(install))
    added = ",".join(m.spec() for m in ours)
    if not given:
        options.append(f"--container-mounts={from_env + ',' if from_env else ''}{added}")
    elif ours:
        at, text, inline = given[-1]
        joined = f"{text.rstrip(',')},{added}" if text.strip(",") else added
        options[at] = f"--container-mounts={joined}" if inline else joined
    start = ("/bin/sh", "-c", SH_START, "scout-task", ENTRY, *command)
    return ContainerStep(tuple(options), start, tuple(ours))


def scout_install(evidence_root: str, config_file: str) -> ScoutInstall:
    """Where this host holds the shim's packages (the one look outside: importlib's finder)."""
    packages = []
    for name in SHIM_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ScoutError(f"scout-srun: the package {name} is not installed beside scout-srun")
        packages.append((name, str(list(spec.submodule_search_locations)[0])))
    return ScoutInstall(tuple(packages), config_file, evidence_root)
