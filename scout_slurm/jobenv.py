"""The environment is read here and nowhere else: one table per context maps Slurm's variables
to typed fields; a missing or bad variable raises an error naming it and its value."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from scout_slurm.errors import ConfigError


def _int(name: str, raw: str) -> int:
    # not int() alone: it reads "4711_3" (an array task's id) as 47113, and non-ASCII digits;
    # and at most 18 digits, which int() can always convert and every id or count fits in
    if not re.fullmatch(r"[+-]?[0-9]{1,18}", raw.strip()):
        raise ConfigError(
            f"environment variable {name}={raw[:40]!r}{'...' if len(raw) > 40 else ''} "
            f"is not an integer of at most 18 digits"
        )
    return int(raw.strip())


def _nodename(name: str, raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", raw or ""):
        raise ConfigError(f"environment variable {name}={raw!r} is not a valid node name")
    return raw


def _str(name: str, raw: str) -> str:
    return raw


def _cluster(name: str, raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", raw or ""):
        raise ConfigError(f"environment variable {name}={raw!r} is not a valid cluster name")
    return raw


MAX_NODES = (
    1_000_000  # far above any cluster; bounds what a corrupted variable can make us allocate
)


def expand_tasks_per_node(spec: str) -> list[int]:
    """`2(x3),1` -> [2, 2, 2, 1] (SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE)."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"([0-9]{1,9})(?:\(x([0-9]{1,9})\))?", part)
        if not m:
            raise ConfigError(
                f"tasks-per-node value {spec!r} is not in Slurm's form (e.g. 2(x3),1)"
            )
        repeat = int(m.group(2) or 1)
        # a job cannot span more nodes than a cluster has: refuse before building a huge list
        if repeat > MAX_NODES or len(out) + repeat > MAX_NODES:
            raise ConfigError(
                f"tasks-per-node value {spec!r} names more than {MAX_NODES} nodes; "
                f"is the variable corrupted?"
            )
        out.extend([int(m.group(1))] * repeat)
    return out


Field = tuple[
    str, str, Callable[[str, str], object], object
]  # field, variable, parser, default (... = required)
_REQUIRED = ...


@dataclass(frozen=True)
class TaskContext:
    """One task of a job step, as the task shim sees it (`srun` sets these)."""

    job_id: int
    step_id: int
    rank: int
    world_size: int
    local_rank: int
    node_index: int
    node: str
    step_nodelist: str
    tasks_per_node: str
    cluster: str
    restart: int
    cuda_visible_devices: str

    @property
    def local_world_size(self) -> int:
        counts = expand_tasks_per_node(self.tasks_per_node)
        if self.node_index >= len(counts):
            raise ConfigError(
                f"SLURM_NODEID={self.node_index} is outside "
                f"SLURM_STEP_TASKS_PER_NODE={self.tasks_per_node!r}"
            )
        return counts[self.node_index]


TASK_TABLE: tuple[Field, ...] = (
    ("job_id", "SLURM_JOB_ID", _int, _REQUIRED),
    ("step_id", "SLURM_STEP_ID", _int, 0),
    ("rank", "SLURM_PROCID", _int, _REQUIRED),
    ("world_size", "SLURM_STEP_NUM_TASKS", _int, _REQUIRED),
    ("local_rank", "SLURM_LOCALID", _int, _REQUIRED),
    ("node_index", "SLURM_NODEID", _int, 0),
    ("node", "SLURMD_NODENAME", _nodename, _REQUIRED),
    ("step_nodelist", "SLURM_STEP_NODELIST", _str, ""),
    ("tasks_per_node", "SLURM_STEP_TASKS_PER_NODE", _str, "1"),
    ("cluster", "SLURM_CLUSTER_NAME", _cluster, "cluster"),
    ("restart", "SLURM_RESTART_COUNT", _int, 0),
    ("cuda_visible_devices", "CUDA_VISIBLE_DEVICES", _str, ""),
)


@dataclass(frozen=True)
class HookContext:
    """A Prolog or Epilog run (slurmd side: node set; controller side: node empty)."""

    job_id: int
    job_uid: int
    job_user: str
    cluster: str
    restart: int
    node: str  # SLURMD_NODENAME; "" in controller hooks
    job_nodelist: str  # SLURM_JOB_NODELIST (controller) or SLURM_NODELIST (node)
    exit_code_raw: int  # SLURM_JOB_EXIT_CODE: raw wait status; -1 in a Prolog
    script_context: str  # prolog_slurmd, epilog_slurmd, epilog_slurmctld, ...
    work_dir: str
    job_gid: int = -1  # SLURM_JOB_GID; -1 when Slurm did not say (then the passwd entry's)

    @property
    def is_controller(self) -> bool:
        return self.script_context.endswith("slurmctld")

    @property
    def job_failed(self) -> bool:
        return self.exit_code_raw not in (0, -1)


HOOK_TABLE: tuple[Field, ...] = (
    ("job_id", "SLURM_JOB_ID", _int, _REQUIRED),
    ("job_uid", "SLURM_JOB_UID", _int, _REQUIRED),
    ("job_user", "SLURM_JOB_USER", _str, ""),
    ("cluster", "SLURM_CLUSTER_NAME", _cluster, "cluster"),
    ("restart", "SLURM_JOB_RESTART_COUNT", _int, 0),
    ("node", "SLURMD_NODENAME", _nodename, ""),
    ("job_nodelist", "SLURM_JOB_NODELIST", _str, ""),
    ("exit_code_raw", "SLURM_JOB_EXIT_CODE", _int, -1),
    ("script_context", "SLURM_SCRIPT_CONTEXT", _str, ""),
    ("work_dir", "SLURM_JOB_WORK_DIR", _str, ""),
    ("job_gid", "SLURM_JOB_GID", _int, -1),
)


def _read(table: tuple[Field, ...], environ: Mapping[str, str], what: str) -> dict:
    values = {}
    for fname, var, parse, default in table:
        raw = environ.get(var)
        if raw is None or raw == "":
            if default is _REQUIRED:
                raise ConfigError(
                    f"{what}: environment variable {var} is not set; is this running under Slurm?"
                )
            values[fname] = default
            continue
        values[fname] = parse(var, raw)
    return values


def task_context(environ: Mapping[str, str]) -> TaskContext:
    return TaskContext(**_read(TASK_TABLE, environ, "scout-task"))


def hook_context(environ: Mapping[str, str]) -> HookContext:
    values = _read(HOOK_TABLE, environ, "scout hook")
    if not values["job_nodelist"]:
        values["job_nodelist"] = environ.get("SLURM_NODELIST", "")
    return HookContext(**values)
