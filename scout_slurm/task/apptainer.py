"""The Apptainer/Singularity shape (`srun ... apptainer exec [options] IMAGE python train.py`): the
shim runs on the host and its child is the container runtime. This module recognises that command
line and plans how the bootstrap reaches the Python inside: read-only binds of scout's package,
binds of the evidence folder and the progress folder, and the shim's variables passed as
APPTAINERENV_* (which --cleanenv and --containall keep) (pure).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scout_slurm import jobconfig

# the runtime's name and the prefix of the variables it passes into the container
RUNTIMES = {"apptainer": "APPTAINERENV_", "singularity": "SINGULARITYENV_"}
VERBS = frozenset({"exec", "run"})
GLOBAL_WITH_VALUE = frozenset({"-c", "--config"})
# `apptainer exec --help` (1.3): the options that take a value; the rest are flags
EXEC_WITH_VALUE = frozenset(
    """
--add-caps --app --apply-cgroups --authfile -B --bind --blkio-weight --blkio-weight-device
--cpu-shares --cpus --cpuset-cpus --cpuset-mems --docker-host --dns --drop-caps --env --env-file
-H --home --hostname --memory --memory-reservation --memory-swap --mount --network --network-args
-o --overlay --pem-path --pids-limit -S --scratch --security -W --workdir --pwd --cwd
""".split()
)
PID_NAMESPACE = frozenset({"-p", "--pid", "-C", "--containall"})
# where scout's package appears inside the image (a folder of its own: nothing of the image is
# shadowed, nothing of the host's site-packages leaks in)
IN_CONTAINER_PACKAGE = "/opt/scout-slurm/lib/scout_slurm"
IN_CONTAINER_BOOTSTRAP = IN_CONTAINER_PACKAGE + "/bootstrap/site"


@dataclass(frozen=True)
class ContainerExec:
    """An `apptainer exec|run` command line: where its verb is, what runs inside (empty when an
    option scout does not know hides where the image is), and whether it has its own PID
    namespace (the pid the bootstrap records is then the container's, not the host's)."""

    runtime: str
    verb_at: int
    inner: tuple[str, ...]
    pid_namespace: bool

    @property
    def env_prefix(self) -> str:
        return RUNTIMES[self.runtime]


def parse_exec(command: Sequence[str]) -> ContainerExec | None:
    """The container runtime's exec/run in `command`, or None when it is not one (pure)."""
    if not command or os.path.basename(command[0]) not in RUNTIMES:
        return None
    runtime = os.path.basename(command[0])
    i = 1
    while i < len(command) and command[i].startswith("-"):  # the runtime's global options
        i += 2 if command[i] in GLOBAL_WITH_VALUE else 1
    if i >= len(command) or command[i] not in VERBS:
        return None
    verb_at = i
    i += 1
    pid = False
    while i < len(command) and command[i].startswith("-"):
        word = command[i]
        name = word.split("=", 1)[0]
        if name.startswith("--"):
            pid = pid or (name in PID_NAMESPACE and not word.endswith("=false"))
            i += 2 if name in EXEC_WITH_VALUE and "=" not in word else 1
            continue
        letters = _short_letters(word)
        pid = pid or any("-" + ch in PID_NAMESPACE for ch in letters)
        takes = bool(letters) and "-" + letters[-1] in EXEC_WITH_VALUE
        i += 2 if takes and len(word) == len(letters) + 1 else 1
    image_at = i
    inner = tuple(command[image_at + 1 :]) if image_at < len(command) else ()
    return ContainerExec(runtime, verb_at, inner, pid)


def _short_letters(word: str) -> str:
    """The option letters of a short word, up to the first that takes a value: -eB /x and -eB/x
    both end at B; only the first takes the next word (its value is not attached) (pure)."""
    letters = word[1:]
    for j, ch in enumerate(letters):
        if "-" + ch in EXEC_WITH_VALUE:
            return letters[: j + 1]
    return letters


def _bindable(path: str) -> bool:
    # the bind spec is split on "," and ":"
    return path.startswith("/") and "," not in path and ":" not in path


@dataclass(frozen=True)
class ContainerLaunch:
    """The command with scout's binds, the variables to add to its environment, and what the
    shim says once when the bootstrap cannot reach the container ("" when it can)."""

    command: tuple[str, ...]
    env: Mapping[str, str]
    problem: str = ""


def with_bootstrap(
    found: ContainerExec,
    command: Sequence[str],
    *,
    package_dir: str,
    binds_rw: Sequence[str],
    shim_env: Mapping[str, str],
    environ: Mapping[str, str],
) -> ContainerLaunch:
    """Bind scout's package read-only and `binds_rw` (the evidence and progress folders) at their
    own paths, right after the verb; pass every variable the shim set or changed (`shim_env`
    against `environ`) as <PREFIX><NAME>, with PYTHONPATH and the package folder pointing inside
    (pure). A variable the user already passes that way is kept; PYTHONPATH gets the bootstrap
    in front of the user's."""
    paths = [package_dir, *binds_rw]
    bad = [p for p in paths if not _bindable(p)]
    if bad:
        return ContainerLaunch(
            tuple(command),
            {},
            f"cannot bind {bad[0]!r} into the container (a bind path must be absolute, without "
            "',' or ':'): scout's in-job checks do not run inside it; the task is watched for its "
            "exit only",
        )
    binds = [f"{package_dir}:{IN_CONTAINER_PACKAGE}:ro", *(f"{p}:{p}" for p in binds_rw)]
    at = found.verb_at + 1
    new_command = [*command[:at], "-B", ",".join(binds), *command[at:]]
    prefix = found.env_prefix
    inside = {k: v for k, v in shim_env.items() if environ.get(k) != v}
    inside[jobconfig.PACKAGE_DIR.name] = IN_CONTAINER_PACKAGE
    user_path = environ.get(prefix + "PYTHONPATH", environ.get("PYTHONPATH", ""))
    inside["PYTHONPATH"] = os.pathsep.join(p for p in (IN_CONTAINER_BOOTSTRAP, user_path) if p)
    env = {}
    for name, value in inside.items():
        if name == "PYTHONPATH" or prefix + name not in environ:
            env[prefix + name] = value
    return ContainerLaunch(tuple(new_command), env)
