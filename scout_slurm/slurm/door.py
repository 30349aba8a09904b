"""The one door to Slurm. `run_slurm` is the only function in scout that runs a Slurm command.

Binaries are resolved once to absolute paths; argv is a list (never a shell string); every call
has a keyword-only timeout and is logged with its argv, exit code and duration.

A lab running another Slurm release (`scout lab up --slurm 24.11`) puts its root in the callers'
environment as SCOUT_SLURM_ROOT: the door then runs that root's binaries, `chroot ROOT
/usr/bin/CMD`,
and takes the variable out of the command's environment (a job sbatch submits runs inside that
root already, and must not chroot again).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scout_slurm.errors import SlurmError, SlurmNotInstalled, SlurmTimeout
from scout_slurm.log import get_logger

SLURM_COMMANDS = frozenset({"scontrol", "squeue", "sinfo", "sacct", "srun", "sbatch", "scancel"})
_FALLBACK_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin")
SLURM_ROOT_ENV = "SCOUT_SLURM_ROOT"
_ROOT_BIN_DIRS = ("/usr/bin", "/usr/sbin")
_resolved: dict[tuple[str, str], str] = {}
log = get_logger("scout.slurm")


@dataclass(frozen=True)
class SlurmResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float


def resolve_binary(name: str, *, bin_dir: str = "", path_env: str | None = None) -> str:
    """Absolute path of a Slurm command, resolved once per (name, bin_dir)."""
    if name not in SLURM_COMMANDS:
        raise SlurmError(
            f"{name!r} is not a Slurm command scout runs; known: "
            f"{', '.join(sorted(SLURM_COMMANDS))}"
        )
    key = (name, bin_dir)
    if key in _resolved:
        return _resolved[key]
    found = None
    if bin_dir:
        cand = os.path.join(bin_dir, name)
        found = cand if os.access(cand, os.X_OK) else None
    else:
        search = path_env if path_env is not None else os.environ.get("PATH", "")
        found = shutil.which(name, path=search + os.pathsep + os.pathsep.join(_FALLBACK_DIRS))
    if not found:
        raise SlurmNotInstalled(
            f"the Slurm command {name!r} was not found "
            f"({'in ' + bin_dir if bin_dir else 'on PATH or in ' + ', '.join(_FALLBACK_DIRS)}); "
            "install the Slurm client (Debian: apt-get install slurm-client) or set [slurm] "
            "bin_dir in the site config"
        )
    found = os.path.abspath(found)
    _resolved[key] = found
    return found


def slurm_root(env: Mapping[str, str] | None) -> str:
    """The lab root whose Slurm to run (SCOUT_SLURM_ROOT), "" for this machine's own. Must be an
    absolute folder holding Slurm's clients."""
    root = (env if env is not None else os.environ).get(SLURM_ROOT_ENV, "")
    if not root:
        return ""
    if not os.path.isabs(root) or not os.path.isfile(os.path.join(root, "usr/bin/scontrol")):
        raise SlurmNotInstalled(
            f"{SLURM_ROOT_ENV}={root!r} is not a Slurm root (no usr/bin/scontrol in it); "
            "unset it, or start the lab again (`scout lab up --slurm VERSION`)"
        )
    return root


def _root_binary(name: str, root: str) -> str:
    """The path, inside `root`, of a Slurm command (or runuser)."""
    for d in _ROOT_BIN_DIRS:
        if os.access(os.path.join(root, d.lstrip("/"), name), os.X_OK):
            return os.path.join(d, name)
    raise SlurmNotInstalled(
        f"the Slurm root {root} has no {name!r} in {' or '.join(_ROOT_BIN_DIRS)}"
    )


def _chroot_prefix(root: str) -> tuple[str, ...]:
    if not root:
        return ()
    chroot = shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not chroot:
        raise SlurmNotInstalled(
            "chroot (Debian package coreutils) is needed to run a lab root's Slurm; install it"
        )
    return (chroot, root)


def _without_root(env: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(env if env is not None else os.environ)
    out.pop(SLURM_ROOT_ENV, None)
    return out


def _as_user_prefix(user: str, root: str = "") -> tuple[str, ...]:
    """`runuser -u USER --`: a command run with that user's own credentials (root only; the lab
    submits its jobs this way, as a site's users do). Inside `root` when given (runuser then runs
    after chroot: a user cannot chroot)."""
    if not user:
        return ()
    if not user.replace("-", "").replace("_", "").isalnum():
        raise SlurmError(f"refusing user name {user!r}: letters, digits, '-' and '_' only")
    if root:
        return (_root_binary("runuser", root), "-u", user, "--")
    runuser = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not runuser:
        raise SlurmNotInstalled(
            "runuser (Debian package util-linux) is needed to run a Slurm command as "
            f"{user!r}; install it"
        )
    return (runuser, "-u", user, "--")


def run_slurm(
    command: str,
    args: Sequence[str],
    *,
    timeout: float,
    bin_dir: str = "",
    env: Mapping[str, str] | None = None,
    check: bool = True,
    input_text: str | None = None,
    as_user: str = "",
) -> SlurmResult:
    """Run one Slurm command and return its result; the only place scout runs Slurm.

    Raises SlurmTimeout past `timeout` seconds, and SlurmError on a non-zero exit when `check`.
    `as_user` runs it as that user (root only).
    """
    for a in args:
        if not isinstance(a, str):
            raise TypeError(f"Slurm argument {a!r} must be a str")
        if "\x00" in a:
            raise SlurmError(f"refusing a Slurm argument with a NUL byte: {a!r}")
    root = slurm_root(env)
    if root:
        if command not in SLURM_COMMANDS:
            raise SlurmError(
                f"{command!r} is not a Slurm command scout runs; known: "
                f"{', '.join(sorted(SLURM_COMMANDS))}"
            )
        binary = _root_binary(command, root)
        run_env: dict[str, str] | None = _without_root(env)
    else:
        binary = resolve_binary(command, bin_dir=bin_dir)
        run_env = dict(env) if env is not None else None
    argv = (*_chroot_prefix(root), *_as_user_prefix(as_user, root), binary, *args)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=run_env,
            input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        dt = time.monotonic() - t0
        log.warning("slurm.timeout", argv=list(argv), timeout_s=timeout, duration_s=round(dt, 3))
        raise SlurmTimeout(
            f"{command} did not answer within {timeout:g} s; is slurmctld up?",
            argv=argv,
            stderr=(exc.stderr or "") if isinstance(exc.stderr, str) else "",
        ) from None
    except OSError as exc:
        raise SlurmError(f"{command} could not be started: {exc}", argv=argv) from exc
    dt = time.monotonic() - t0
    log.info("slurm.call", argv=list(argv), returncode=proc.returncode, duration_s=round(dt, 3))
    result = SlurmResult(argv, proc.returncode, proc.stdout, proc.stderr, dt)
    if check and proc.returncode != 0:
        raise SlurmError(
            f"{command} failed", argv=argv, returncode=proc.returncode, stderr=proc.stderr
        )
    return result


def exec_slurm(
    command: str, args: Sequence[str], *, env: Mapping[str, str], bin_dir: str = ""
) -> None:
    """Replace this process with a Slurm command (scout-srun: srun's exit status and signals
    must be the user's, exactly). Logged like every other call; never returns."""
    for a in args:
        if "\x00" in a:
            raise SlurmError(f"refusing a Slurm argument with a NUL byte: {a!r}")
    root = slurm_root(env)
    if root:
        argv = [*_chroot_prefix(root), _root_binary(command, root), *args]
        log.info("slurm.exec", argv=argv)
        os.execve(argv[0], argv, _without_root(env))
    path = resolve_binary(command, bin_dir=bin_dir, path_env=env.get("PATH"))
    log.info("slurm.exec", argv=[path, *args])
    os.execve(path, [path, *args], dict(env))
