"""`scout-srun [srun options] [--scout-* options] COMMAND [ARGS...]`

Every srun option passes through unchanged; scout's own options start with `--scout-` and are
removed (`SCOUT_OPTIONS`, which `--help` prints). It runs `srun <options> python -m
scout_slurm.task.shim -- COMMAND ...` by replacing itself with srun, so the exit status and signals
are srun's.
"""

from __future__ import annotations

import os
import random
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from scout_slurm import config, jobconfig
from scout_slurm.errors import ScoutError
from scout_slurm.launcher import containers

# srun 22.05 short options that take a value (from `srun --help`); the others are flags
SHORT_WITH_VALUE = frozenset("AbBcCdDeFGiJLmMnNopqrStTwWx")
# long options that take a required value; options with an optional value (--exclusive,
# --kill-on-bad-exit, --immediate, --exact...) accept it only as --opt=value, so they are flags here
LONG_WITH_VALUE = frozenset(
    """
accel-bind account acctg-freq bb bbf begin bcast-exclude chdir cluster-constraint clusters comment
constraint container contiguous-? core-spec cores-per-socket cpu-bind cpu-freq cpus-per-gpu
cpus-per-task deadline delay-boot dependency distribution epilog error export extra-node-info gid
gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags het-group hint
input jobid job-name licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu
mincpus mpi msg-timeout network nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu
ntasks-per-node ntasks-per-socket open-mode output partition power prefer prolog priority profile
qos quit-on-interrupt? reboot? relative reservation resv-ports? signal slurmd-debug sockets-per-node
switches task-epilog task-prolog thread-spec threads threads-per-core time time-min tmp
tres-per-task uid wait wait-all-nodes? wckey x11? exclude cpus-per-gpu array
""".split()
) - {x for x in "contiguous-? quit-on-interrupt? reboot? resv-ports? wait-all-nodes? x11?".split()}
LONG_WITH_VALUE |= containers.PYXIS_WITH_VALUE  # pyxis's SPANK options, where a site has them


@dataclass(frozen=True)
class ScoutOption:
    name: str  # without the leading --
    metavar: str  # "" for a flag
    help: str


SCOUT_OPTIONS = (
    ScoutOption(
        "scout-stall-floor",
        "SECONDS",
        "never call a stall sooner than this (SCOUT_WATCHDOG_STALL_FLOOR_S)",
    ),
    ScoutOption("scout-inject", "SPEC", "inject a fault, e.g. sleep,rank=1,step=5 (SCOUT_INJECT)"),
    ScoutOption("scout-config", "PATH", "site config file (SCOUT_CONFIG)"),
    ScoutOption(
        "scout-consensus-every",
        "K",
        "vote on the replicas' state every K steps (default 50; 0: off)",
    ),
    ScoutOption(
        "scout-replay-every",
        "K",
        "replay one layer every K steps (default: as consensus; 0: off)",
    ),
    ScoutOption("scout-off", "", "run plain srun, no shim"),
    ScoutOption("scout-dry-run", "", "print the srun command line and exit"),
)
_TAKES_VALUE = frozenset(o.name for o in SCOUT_OPTIONS if o.metavar)
HELP_OPTIONS = frozenset({"-h", "--help", "--usage"})
VERSION_OPTIONS = frozenset({"-V", "--version"})


def usage() -> str:
    """What `scout-srun --help` prints (pure)."""
    lines = [
        "usage: scout-srun [srun options] [scout options] COMMAND [ARGS...]",
        "",
        "Runs COMMAND under srun with scout's per-task watchdog: write scout-srun where the",
        "sbatch script said srun. Every option that is not scout's passes to srun unchanged",
        "(see `srun --help`); the first word that is not an option starts the command, as does --.",
        "srun's exit status and signals are the job's. With pyxis's --container-image the shim",
        "runs inside the image from read-only mounts scout-srun adds to --container-mounts; under",
        "`apptainer exec` it stays outside and binds the bootstrap in (docs/USERS.md, Containers).",
        "",
        "scout options:",
    ]
    for o in SCOUT_OPTIONS:
        flag = f"--{o.name}=" + o.metavar if o.metavar else f"--{o.name}"
        lines.append(f"  {flag:<30}{o.help}")
    lines += [
        "  -h, --help                    this text",
        "  -V, --version                 scout-slurm's version",
        "",
        "example: scout-srun -N 2 --ntasks-per-node=4 --scout-stall-floor=120 python train.py",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class LaunchPlan:
    srun_options: tuple[str, ...]
    command: tuple[str, ...]
    scout_env: Mapping[str, str] = field(default_factory=dict)
    off: bool = False
    dry_run: bool = False
    asked: str = ""  # "help" or "version": print that instead of launching


def _steps(option: str, value: str) -> str:
    # a whole number of steps, as the job's table will read it (no sign, no spaces: the tasks
    # would take them, but a launch line that has them is a typo)
    if not value.isdigit():
        raise ScoutError(f"scout-srun: {option} takes a whole number of steps, got {value!r}")
    return value


def split_args(argv: Sequence[str]) -> LaunchPlan:
    """Separate srun's options, scout's `--scout-*` options and the command (pure)."""
    srun: list[str] = []
    env: dict[str, str] = {}
    off = dry = False
    i = 0
    argv = list(argv)
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in HELP_OPTIONS or a in VERSION_OPTIONS:
            # before the command these are scout-srun's own; after it, the command's
            return LaunchPlan((), (), asked="help" if a in HELP_OPTIONS else "version")
        if a.startswith("--scout-"):
            name, _, value = a[2:].partition("=")
            if name in _TAKES_VALUE and not _:
                if i + 1 >= len(argv):
                    raise ScoutError(f"scout-srun: {a} needs a value")
                i += 1
                value = argv[i]
            if name == "scout-stall-floor":
                env[config.env_name("watchdog", "stall_floor_s")] = value
            elif name == "scout-inject":
                from scout_slurm.inject.spec import parse_fault

                parse_fault(value)  # refuse a bad spec here, not in every task
                env[jobconfig.INJECT.name] = value
            elif name == "scout-config":
                env[config.CONFIG_ENV] = value
            elif name == "scout-consensus-every":
                env[jobconfig.CONSENSUS_EVERY.name] = _steps("--" + name, value)
            elif name == "scout-replay-every":
                env[jobconfig.REPLAY_EVERY.name] = _steps("--" + name, value)
            elif name == "scout-off":
                off = True
            elif name == "scout-dry-run":
                dry = True
            else:
                raise ScoutError(
                    f"scout-srun: unknown option {a}; scout's options: "
                    + ", ".join("--" + o.name for o in SCOUT_OPTIONS)
                    + " (scout-srun --help)"
                )
            i += 1
            continue
        if a.startswith("--"):
            srun.append(a)
            name = a[2:]
            if "=" not in name and name in LONG_WITH_VALUE:
                if i + 1 >= len(argv):
                    raise ScoutError(f"scout-srun: srun option {a} needs a value")
                srun.append(argv[i + 1])
                i += 1
            i += 1
            continue
        if a.startswith("-") and len(a) > 1:
            srun.append(a)
            # -N2 carries its value; -N 2 takes the next word; -lN 2: the last letter decides
            letters = a[1:]
            for j, ch in enumerate(letters):
                if ch in SHORT_WITH_VALUE:
                    if j == len(letters) - 1:
                        if i + 1 >= len(argv):
                            raise ScoutError(f"scout-srun: srun option -{ch} needs a value")
                        srun.append(argv[i + 1])
                        i += 1
                    break
            i += 1
            continue
        break
    command = tuple(argv[i:])
    if not command and not dry:
        raise ScoutError(
            "scout-srun: no command given; usage: scout-srun [srun options] COMMAND [ARGS...] "
            "(scout-srun --help)"
        )
    return LaunchPlan(tuple(srun), command, env, off, dry)


def srun_argv(
    plan: LaunchPlan,
    python: str,
    install: containers.ScoutInstall | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """srun's arguments (pure). A pyxis container step (`--container-image`, `--container-name`
    or their PYXIS_* variables in `environ`) runs the shim inside the image, from `install`
    mounted there (launcher/containers.py)."""
    environ = environ or {}
    if plan.off:
        return [*plan.srun_options, *plan.command]
    if containers.is_container_step(plan.srun_options, environ):
        if install is None:
            raise ScoutError("scout-srun: a container step needs scout's install to mount")
        step = containers.container_step(plan.srun_options, plan.command, install, environ)
        return [*step.srun_options, *step.start]
    return [*plan.srun_options, python, "-m", "scout_slurm.task.shim", "--", *plan.command]


def container_install(environ: Mapping[str, str]) -> containers.ScoutInstall:
    """What a pyxis step mounts: the shim's packages, the site config the job would read and its
    evidence root (reads the config: the one look outside, beside importlib's)."""
    path = environ.get(config.CONFIG_ENV) or str(config.DEFAULT_CONFIG_PATH)
    cfg = config.load_config(environ)
    return containers.scout_install(cfg.evidence.root, path if os.path.isfile(path) else "")


def pick_master_port(rng: random.Random, is_free: Callable[[int], bool], *, tries: int = 32) -> int:
    """A port in scout's rendezvous range, drawn from `rng`, the first that `is_free` accepts
    (the last drawn when none is: the rendezvous then says which port it could not bind)."""
    from scout_slurm.task.shim import PORT_BASE, PORT_SPAN

    port = PORT_BASE
    for _ in range(max(1, tries)):
        port = PORT_BASE + rng.randrange(PORT_SPAN)
        if is_free(port):
            return port
    return port


def port_is_free(port: int) -> bool:
    """Whether nothing on this host holds `port` (the batch host is the step's first node as a
    rule; elsewhere the draw alone keeps the port unpredictable)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    from scout_slurm.log import configure, level_from_env
    from scout_slurm.slurm.door import exec_slurm, resolve_binary

    configure(
        level=level_from_env(logging.WARNING)
    )  # the job's output is the user's: warnings only
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        plan = split_args(argv)
        if plan.asked == "help":
            sys.stdout.write(usage())
            return 0
        if plan.asked == "version":
            from scout_slurm import __version__

            print(f"scout-srun (scout-slurm) {__version__}")
            return 0
        env = dict(os.environ)
        env.update(plan.scout_env)
        in_container = not plan.off and containers.is_container_step(plan.srun_options, env)
        install = container_install(env) if in_container else None
        args = srun_argv(plan, sys.executable, install, env)
        if not plan.off and not env.get("MASTER_PORT"):
            # one port for the step's rendezvous, drawn at random here (not from the public job id,
            # which another user can read and squat on), new for every step and every rerun
            env["MASTER_PORT"] = str(pick_master_port(random.SystemRandom(), port_is_free))
        if plan.dry_run:
            print(shlex.join([resolve_binary("srun", path_env=env.get("PATH")), *args]))
            return 0
        exec_slurm("srun", args, env=env)
    except ScoutError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0  # not reached: exec_slurm replaces this process


if __name__ == "__main__":
    sys.exit(main())
