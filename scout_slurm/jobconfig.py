"""The in-job settings: one table of every variable scout reads inside a job (the user's `SCOUT_*`
knobs, those the task shim sets for the bootstrap, the two Slurm gives), and the typed `JobConfig`
built once from it. `load()` is the one place that reads `os.environ` for the bootstrap; the rest
is pure. Runs in the job's Python too: imports only the standard library and pure scout modules.
"""

from __future__ import annotations

import difflib
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from scout_slurm.errors import ConfigError
from scout_slurm.localise.straggler import ENV_PREFIX as TIMING_PREFIX
from scout_slurm.localise.straggler import SETTINGS as TIMING_SETTINGS
from scout_slurm.localise.straggler import TimingRules
from scout_slurm.settings import Kind, Owner, Refused, Setting, format_value, parse

if TYPE_CHECKING:
    from scout_slurm.config import SiteConfig
    from scout_slurm.inject.spec import FaultSpec

PREFIX = "SCOUT_"
REPLAY_MAX_BYTES = 64 << 20
UPDATE_MAX_BYTES = 1 << 20


class SdcPolicy(str, enum.Enum):
    EXIT = "exit"  # the replicas' majority names a rank: it ends (exit 88)
    CONTINUE = "continue"  # the finding is written, the rank runs on


class ResumeMismatch(str, enum.Enum):
    WARN = "warn"  # a loud finding, the job goes on
    FATAL = "fatal"  # the rank ends (exit 90)


def _parse_fault(text: str) -> object:
    from scout_slurm.inject.spec import parse_fault

    try:
        return parse_fault(text)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def _parse_checks(text: str) -> frozenset[str]:
    from scout_slurm.bootstrap.guard import parse_broken

    return parse_broken(text)


# The one table. Order is docs/USERS.md's.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "SCOUT_CONSENSUS_EVERY",
        "consensus_every",
        Kind.INT,
        50,
        "state votes among replicas every K optimizer steps (0: off; off turns replay off too)",
        minimum=0,
    ),
    Setting(
        "SCOUT_REPLAY_EVERY",
        "replay_every",
        Kind.INT,
        None,
        "in-situ replay every K steps (default: SCOUT_CONSENSUS_EVERY; 0: off)",
        minimum=0,
    ),
    Setting(
        "SCOUT_REPLAY_MAX_BYTES",
        "replay_max_bytes",
        Kind.INT,
        REPLAY_MAX_BYTES,
        "largest layer input (bytes) a replay captures and broadcasts",
        minimum=1,
    ),
    Setting(
        "SCOUT_FINITE_CHECK",
        "finite_check",
        Kind.BOOL,
        True,
        "note where a rank's loss first became NaN/Inf, decided at the next vote",
    ),
    Setting(
        "SCOUT_SIGN_ON_DEVICE",
        "sign_on_device",
        Kind.BOOL,
        False,
        "sign CPU tensors by the device path a GPU's tensors take (integer lane sums) instead of "
        "xxh3 over their bytes: the same witnesses on CPU as on a GPU (tests, the device check)",
    ),
    Setting(
        "SCOUT_AT_REST",
        "at_rest",
        Kind.CHOICE,
        "auto",
        "at-rest witness: each rank re-signs its own weights and optimizer state across one "
        "step in K "
        "(names memory corruption without replicas; auto: off after its first window where "
        "every replica group "
        "has 3 or more ranks and the votes sign all the optimizer holds; on; off)",
        choices=("auto", "on", "off"),
    ),
    Setting(
        "SCOUT_UPDATE_REPLAY",
        "update_replay",
        Kind.CHOICE,
        "auto",
        "optimizer update replay: every K steps one rank's update of a slice of its state "
        "recomputed by every "
        "rank (auto: where some shard has fewer than 3 replicas; on; off)",
        choices=("auto", "on", "off"),
    ),
    Setting(
        "SCOUT_UPDATE_MAX_BYTES",
        "update_max_bytes",
        Kind.INT,
        UPDATE_MAX_BYTES,
        "parameter bytes an optimizer update replay recomputes a round (its gradients and "
        "state move too)",
        minimum=1,
    ),
    Setting(
        "SCOUT_FINAL_VOTE_TIMEOUT_S",
        "final_vote_timeout_s",
        Kind.FLOAT,
        120.0,
        "seconds every rank has to reach destroy_process_group for the last vote",
        minimum=0,
    ),
    Setting(
        "SCOUT_SDC_POLICY",
        "sdc_policy",
        Kind.CHOICE,
        SdcPolicy.EXIT.value,
        "exit: a rank whose numbers the majority outvotes ends (exit 88); continue: it runs on",
        choices=tuple(p.value for p in SdcPolicy),
    ),
    Setting(
        "SCOUT_RESUME_MISMATCH",
        "resume_mismatch",
        Kind.CHOICE,
        ResumeMismatch.WARN.value,
        "a resumed state that differs from its checkpoint record: warn, or fatal (exit 90); "
        "default: the site's [remediation] on_resume_mismatch",
        choices=tuple(p.value for p in ResumeMismatch),
    ),
    Setting(
        "SCOUT_CHECKPOINT_AGREEMENT",
        "checkpoint_agreement",
        Kind.BOOL,
        True,
        "the replicas compare their state signatures at each checkpoint save",
    ),
    *TIMING_SETTINGS,
    Setting(
        "SCOUT_INJECT",
        "inject",
        Kind.CUSTOM,
        None,
        "inject a fault (testing scout), e.g. sleep,rank=1,step=5",
        parser=_parse_fault,
        accepts_text="a fault spec, e.g. sleep,rank=1,step=5",
    ),
    Setting(
        "SCOUT_BREAK",
        "break_checks",
        Kind.CUSTOM,
        frozenset(),
        "make scout's own checks fail inside scout on purpose (testing scout's guard): names, "
        "comma-separated, "
        "or all",
        parser=_parse_checks,
        accepts_text="check names (bootstrap/guard.py CHECKS), e.g. `state vote,checkpoint "
        "record`, or all",
    ),
    Setting(
        "SCOUT_LOG_LEVEL",
        "log_level",
        Kind.CHOICE,
        "",
        "scout's own log level: debug, info, warning or error",
        choices=("debug", "info", "warning", "error"),
    ),
    Setting(
        "SCOUT_RESUME_CHECKPOINT",
        "resume_checkpoint",
        Kind.STR,
        "",
        "the checkpoint this run resumes from (set from resume-N.json unless the job sets it)",
        owner=Owner.SHIM,
    ),
    Setting(
        "SCOUT_STEP_OFFSET",
        "step_offset",
        Kind.INT,
        0,
        "the resumed checkpoint's step: this run's steps count from it",
        owner=Owner.SHIM,
        minimum=0,
    ),
    Setting(
        "SCOUT_PROGRESS_DIR",
        "progress_dir",
        Kind.PATH,
        None,
        "the rank's shared-memory progress folder; set: the bootstrap installs",
        owner=Owner.SHIM,
    ),
    Setting(
        "SCOUT_RUN_DIR", "run_dir", Kind.PATH, None, "this run's evidence folder", owner=Owner.SHIM
    ),
    Setting(
        "SCOUT_STACKS_FILE",
        "stacks_file",
        Kind.PATH,
        None,
        "where faulthandler writes the rank's stacks",
        owner=Owner.SHIM,
    ),
    Setting(
        "SCOUT_CHECKPOINTS_DIR",
        "checkpoints_dir",
        Kind.PATH,
        None,
        "where checkpoint records go",
        owner=Owner.SHIM,
    ),
    Setting(
        "SCOUT_PACKAGE_DIR",
        "package_dir",
        Kind.PATH,
        None,
        "scout_slurm's folder, for a job Python without it installed",
        owner=Owner.SHIM,
    ),
    Setting(
        "SLURM_RESTART_COUNT",
        "restart",
        Kind.INT,
        0,
        "the run (0, then 1 per requeue)",
        owner=Owner.SLURM,
        minimum=0,
    ),
    Setting("SLURMD_NODENAME", "node", Kind.STR, "", "this node's Slurm name", owner=Owner.SLURM),
)
BY_NAME = {s.name: s for s in SETTINGS}
# the settings scout-srun and scout-task read or set by name (launcher/srun.py, task/shim.py;
# bootstrap/site/sitecustomize.py spells out two, checked by tests/unit/test_settings.py)
CONSENSUS_EVERY = BY_NAME["SCOUT_CONSENSUS_EVERY"]
REPLAY_EVERY = BY_NAME["SCOUT_REPLAY_EVERY"]
TIMING_EVERY = BY_NAME[TIMING_PREFIX + "EVERY"]
RESUME_MISMATCH = BY_NAME["SCOUT_RESUME_MISMATCH"]
RESUME_CHECKPOINT = BY_NAME["SCOUT_RESUME_CHECKPOINT"]
STEP_OFFSET = BY_NAME["SCOUT_STEP_OFFSET"]
PROGRESS_DIR = BY_NAME["SCOUT_PROGRESS_DIR"]
RUN_DIR = BY_NAME["SCOUT_RUN_DIR"]
STACKS_FILE = BY_NAME["SCOUT_STACKS_FILE"]
CHECKPOINTS_DIR = BY_NAME["SCOUT_CHECKPOINTS_DIR"]
PACKAGE_DIR = BY_NAME["SCOUT_PACKAGE_DIR"]
INJECT = BY_NAME["SCOUT_INJECT"]  # scout-srun's --scout-inject

# SCOUT_* names that are not in-job settings but legitimately reach a job's environment
OTHER_NAMES = {
    "SCOUT_CONFIG": "the site config file",
    "SCOUT_PYTHON": "the Python the launcher and hook scripts run",
    "SCOUT_LAB_DIR": "the lab's state folder",
    "SCOUT_KEEP_LAB": "tests: keep the lab",
}


@dataclass(frozen=True)
class JobConfig:
    """Every in-job setting, typed. Built once per process from the table (`from_environment`)."""

    consensus_every: int = 50
    replay_every: int = 50
    replay_max_bytes: int = REPLAY_MAX_BYTES
    finite_check: bool = True
    sign_on_device: bool = False
    at_rest: str = "auto"
    update_replay: str = "auto"
    update_max_bytes: int = UPDATE_MAX_BYTES
    final_vote_timeout_s: float = 120.0
    sdc_policy: SdcPolicy = SdcPolicy.EXIT
    resume_mismatch: ResumeMismatch = ResumeMismatch.WARN
    checkpoint_agreement: bool = True
    timing: TimingRules = field(default_factory=TimingRules)
    inject: FaultSpec | None = None
    break_checks: frozenset[str] = frozenset()
    log_level: str = ""
    resume_checkpoint: str = ""
    step_offset: int = 0
    progress_dir: Path | None = None
    run_dir: Path | None = None
    stacks_file: Path | None = None
    checkpoints_dir: Path | None = None
    package_dir: Path | None = None
    restart: int = 0
    node: str = ""

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str], defaults: Mapping[str, str] | None = None
    ) -> JobConfig:
        """The settings `environ` holds; a bad value is a JobConfigError naming each bad
        variable.
        """
        config, problems = read_settings(environ, defaults, check_names=False)
        if problems:
            raise JobConfigError(problems)
        return config


@dataclass(frozen=True)
class Problem:
    """A variable that is not a known name, or whose value is not valid."""

    name: str
    value: str
    message: str

    def __str__(self) -> str:
        return f"{self.name}={self.value!r}: {self.message}"


class JobConfigError(ConfigError):
    def __init__(self, problems: list[Problem] | tuple[Problem, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


def known_names() -> frozenset[str]:
    """Every SCOUT_* name scout reads: the table's, the site config's SCOUT_<SECTION>_<KEY>
    overrides, and the few others (OTHER_NAMES)."""
    from scout_slurm.config import site_override_names

    return frozenset(
        {s.name for s in SETTINGS if s.name.startswith(PREFIX)}
        | set(site_override_names())
        | set(OTHER_NAMES)
    )


def unknown_name(name: str, known: frozenset[str]) -> Problem:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    hint = (
        f"did you mean {close[0]}?"
        if close
        else "see docs/USERS.md, In-job settings, for the valid names"
    )
    return Problem(name, "", f"unknown scout setting; {hint}")


def read_settings(
    environ: Mapping[str, str],
    defaults: Mapping[str, str] | None = None,
    *,
    check_names: bool = True,
) -> tuple[JobConfig, tuple[Problem, ...]]:
    """The JobConfig `environ` gives, and what is wrong in it: a bad value keeps its default (pure).
    `defaults` (text by variable name, e.g. `site_defaults(cfg)`) stand where the job sets
    nothing."""
    problems: list[Problem] = []
    values: dict[str, object] = {}
    timing: dict[str, object] = {}
    merged = dict(defaults or {})
    merged.update({k: v for k, v in environ.items() if k in BY_NAME or k.startswith(TIMING_PREFIX)})
    if check_names:
        known = known_names()
        for name in sorted(environ):
            if name.startswith(PREFIX) and name not in known and not name.startswith(TIMING_PREFIX):
                p = unknown_name(name, known)
                problems.append(Problem(name, environ[name], p.message))
    for name, text in merged.items():
        setting = BY_NAME.get(name)
        if setting is None:  # a SCOUT_TIMING_* that is not one
            known = known_names() if check_names else frozenset(BY_NAME)
            problems.append(Problem(name, text, unknown_name(name, known).message))
            continue
        if not text.strip() and setting.kind is not Kind.STR:
            continue  # set but empty: the default
        try:
            value = parse(setting, text)
        except Refused as exc:
            problems.append(Problem(name, text, str(exc)))
            continue
        if setting.field.startswith("timing."):
            timing[setting.field.split(".", 1)[1]] = value
        else:
            values[setting.field] = value
    values["timing"] = TimingRules(**timing)  # type: ignore[arg-type]
    if "replay_every" not in values:
        values["replay_every"] = values.get("consensus_every", JobConfig.consensus_every)
    if "sdc_policy" in values:
        values["sdc_policy"] = SdcPolicy(values["sdc_policy"])
    if "resume_mismatch" in values:
        values["resume_mismatch"] = ResumeMismatch(values["resume_mismatch"])
    return JobConfig(**values), tuple(problems)  # type: ignore[arg-type]


def site_defaults(cfg: SiteConfig) -> dict[str, str]:
    """The site config's in-job values, as the defaults of the variables they stand for."""
    return as_environment({RESUME_MISMATCH: cfg.remediation.on_resume_mismatch})


def as_environment(values: Mapping[Setting, object]) -> dict[str, str]:
    """Values for in-job settings as the variables that carry them, each checked against its
    declaration the way the job will read it back (pure): what scout-task passes to the job."""
    out = {}
    for setting, value in values.items():
        text = "1" if value is True else "0" if value is False else str(value)
        try:
            parse(setting, text)
        except Refused as exc:
            raise ConfigError(f"{setting.name}={text!r}: {exc}") from None
        out[setting.name] = text
    return out


def load() -> JobConfig:
    """The bootstrap's one read of the process environment (the shim validated it already)."""
    return JobConfig.from_environment(os.environ)


def problems_message(problems: tuple[Problem, ...] | list[Problem], *, disabled: bool) -> str:
    """The loud start-up message in the job's output (pure)."""
    bar = "!" * 78
    lines = [bar, "scout: this job's scout settings are not valid:"]
    for p in problems:
        shown = f"{p.name}={p.value!r}" if p.value or p.name in BY_NAME else p.name
        lines.append(f"scout:   {shown}: {p.message}")
    if disabled:
        lines.append(
            "scout: the job runs with scout's in-job checks OFF (state votes, replay, timing "
            "votes, "
            "checkpoint records); the watchdog still watches for stalls and crashes. Fix or unset "
            "the variables above (docs/USERS.md: In-job settings)."
        )
    else:
        lines.append(
            'scout: the job is not started (the site\'s [watchdog] on_bad_setting = "fail"). '
            "Fix or "
            "unset the variables above (docs/USERS.md: In-job settings)."
        )
    lines.append(bar)
    return "\n".join(lines)


def _default_text(s: Setting) -> str:
    if s is REPLAY_EVERY:
        return "= SCOUT_CONSENSUS_EVERY"
    if isinstance(s.default, bool):
        return "1" if s.default else "0"
    if isinstance(s.default, float):
        return f"{s.default:g}"
    return format_value(s.default)


def render_markdown() -> str:
    """docs/USERS.md's knob reference, generated from the table (pure)."""
    rows = ["| variable | set by | default | accepts | what it does |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        rows.append(
            f"| `{s.name}` | {s.owner.value} | {_default_text(s)} | {s.accepts()} | {s.help} |"
        )
    return "\n".join(rows) + "\n"
