"""The in-job settings: one table of every variable scout reads inside a job (the user's `SCOUT_*`
knobs, those the task shim sets for the bootstrap, the two Slurm gives), and the typed `JobConfig`
built once from it. `load()` is the one place that reads `os.environ` for the bootstrap; the rest
is pure. Runs in the job's Python too: imports only the standard library and pure scout modules.
"""

from __future__ import annotations

import difflib
import enum
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from scout_slurm.errors import ConfigError
from scout_slurm.localise.straggler import ENV_PREFIX as TIMING_PREFIX
from scout_slurm.localise.straggler import POLICIES as TIMING_POLICIES
from scout_slurm.localise.straggler import TimingRules, rules_from_environment

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


class Owner(str, enum.Enum):
    USER = "user"  # a knob for the job's author
    SHIM = "shim"  # scout-task sets it for the bootstrap (a user setting wins where noted)
    SLURM = "slurm"  # Slurm sets it


@dataclass(frozen=True)
class Setting:
    """One in-job variable: its JobConfig field, type, default, what it accepts and what it does."""

    name: str
    field: str
    kind: str  # "int", "float", "bool", "choice", "str", "path", "fault"
    default: object
    help: str
    owner: Owner = Owner.USER
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    def accepts(self) -> str:
        """What a valid value is, in words (for errors and the README)."""
        if self.kind == "choice":
            also = (
                " (also 1 or 0, true/false, yes/no for on or off)"
                if _SWITCH <= set(self.choices)
                else ""
            )
            return "one of " + ", ".join(self.choices) + also
        if self.kind == "bool":
            return "1 or 0 (also true/false, yes/no, on/off)"
        if self.kind in ("int", "float"):
            word = "an integer" if self.kind == "int" else "a number"
            if self.minimum is not None and self.maximum is not None:
                return f"{word} within {self.minimum}..{self.maximum}"
            if self.minimum is not None:
                return f"{word} >= {self.minimum}"
            return word
        if self.kind == "path":
            return "an absolute path"
        if self.kind == "fault":
            return "a fault spec, e.g. sleep,rank=1,step=5"
        if self.kind == "checks":
            return "check names (bootstrap/guard.py CHECKS), e.g. `state vote,checkpoint record`, or all"
        return "text"


def _timing_settings() -> tuple[Setting, ...]:
    """SCOUT_TIMING_<KEY>, one a field of TimingRules (its checks stay in rules_from_environment)."""
    helps = {
        "every": "steps per timing round (0: no timing votes)",
        "rel_floor": "a straggler exceeds the median step time by this fraction of it ...",
        "abs_floor_s": "... and by this many seconds per step ...",
        "mad_factor": "... and by this many scaled MADs of the ranks",
        "confirm_rounds": "rounds in a row before a straggler is named",
        "group_rel_floor": "a whole group slower than its best round by this fraction names nobody",
        "probe": "time a small and a medium exchange per pair of ranks each round (link probe)",
        "probe_bytes": "size of the link probe's medium exchange",
        "probe_max_world": "beyond this many ranks the link probe is off",
        "probe_rel_floor": "a slow link exceeds the median probe time by this fraction ...",
        "probe_abs_floor_s": "... and by this many seconds",
        "policy": "report: the job goes on; exit: a confirmed straggler ends (exit 91)",
        "verbose": "rank 0 says every round's reading on stderr",
    }
    out = []
    for f in fields(TimingRules):
        if f.name == "schema_version":
            continue
        default = f.default
        kind = (
            "bool"
            if isinstance(default, bool)
            else "int"
            if isinstance(default, int)
            else "float"
            if isinstance(default, float)
            else "choice"
        )
        minimum = (
            (1 if f.name in ("confirm_rounds", "probe_bytes") else 0)
            if kind in ("int", "float")
            else None
        )
        maximum = 64 * 1024 * 1024 if f.name == "probe_bytes" else None
        out.append(
            Setting(
                TIMING_PREFIX + f.name.upper(),
                "timing." + f.name,
                kind,
                default,
                helps.get(f.name, f.name),
                choices=TIMING_POLICIES if kind == "choice" else (),
                minimum=minimum,
                maximum=maximum,
            )
        )
    return tuple(out)


# The one table. Order is the README's.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "SCOUT_CONSENSUS_EVERY",
        "consensus_every",
        "int",
        50,
        "state votes among replicas every K optimizer steps (0: off; off turns replay off too)",
        minimum=0,
    ),
    Setting(
        "SCOUT_REPLAY_EVERY",
        "replay_every",
        "int",
        None,
        "in-situ replay every K steps (default: SCOUT_CONSENSUS_EVERY; 0: off)",
        minimum=0,
    ),
    Setting(
        "SCOUT_REPLAY_MAX_BYTES",
        "replay_max_bytes",
        "int",
        REPLAY_MAX_BYTES,
        "largest layer input (bytes) a replay captures and broadcasts",
        minimum=1,
    ),
    Setting(
        "SCOUT_FINITE_CHECK",
        "finite_check",
        "bool",
        True,
        "note where a rank's loss first became NaN/Inf, decided at the next vote",
    ),
    Setting(
        "SCOUT_AT_REST",
        "at_rest",
        "choice",
        "auto",
        "at-rest witness: each rank re-signs its own weights and optimizer state across one step in K "
        "(names memory corruption without replicas; auto: off after its first window where every replica group "
        "has 3 or more ranks and the votes sign all the optimizer holds; on; off)",
        choices=("auto", "on", "off"),
    ),
    Setting(
        "SCOUT_UPDATE_REPLAY",
        "update_replay",
        "choice",
        "auto",
        "optimizer update replay: every K steps one rank's update of a slice of its state recomputed by every "
        "rank (auto: where some shard has fewer than 3 replicas; on; off)",
        choices=("auto", "on", "off"),
    ),
    Setting(
        "SCOUT_UPDATE_MAX_BYTES",
        "update_max_bytes",
        "int",
        UPDATE_MAX_BYTES,
        "parameter bytes an optimizer update replay recomputes a round (its gradients and state move too)",
        minimum=1,
    ),
    Setting(
        "SCOUT_FINAL_VOTE_TIMEOUT_S",
        "final_vote_timeout_s",
        "float",
        120.0,
        "seconds every rank has to reach destroy_process_group for the last vote",
        minimum=0,
    ),
    Setting(
        "SCOUT_SDC_POLICY",
        "sdc_policy",
        "choice",
        SdcPolicy.EXIT.value,
        "exit: a rank whose numbers the majority outvotes ends (exit 88); continue: it runs on",
        choices=tuple(p.value for p in SdcPolicy),
    ),
    Setting(
        "SCOUT_RESUME_MISMATCH",
        "resume_mismatch",
        "choice",
        ResumeMismatch.WARN.value,
        "a resumed state that differs from its checkpoint record: warn, or fatal (exit 90); "
        "default: the site's [remediation] on_resume_mismatch",
        choices=tuple(p.value for p in ResumeMismatch),
    ),
    Setting(
        "SCOUT_CHECKPOINT_AGREEMENT",
        "checkpoint_agreement",
        "bool",
        True,
        "the replicas compare their state signatures at each checkpoint save",
    ),
    *_timing_settings(),
    Setting(
        "SCOUT_INJECT",
        "inject",
        "fault",
        None,
        "inject a fault (testing scout), e.g. sleep,rank=1,step=5",
    ),
    Setting(
        "SCOUT_BREAK",
        "break_checks",
        "checks",
        frozenset(),
        "make scout's own checks fail inside scout on purpose (testing scout's guard): names, comma-separated, "
        "or all",
    ),
    Setting(
        "SCOUT_LOG_LEVEL",
        "log_level",
        "choice",
        "",
        "scout's own log level: debug, info, warning or error",
        choices=("debug", "info", "warning", "error"),
    ),
    Setting(
        "SCOUT_RESUME_CHECKPOINT",
        "resume_checkpoint",
        "str",
        "",
        "the checkpoint this run resumes from (set from resume-N.json unless the job sets it)",
        owner=Owner.SHIM,
    ),
    Setting(
        "SCOUT_STEP_OFFSET",
        "step_offset",
        "int",
        0,
        "the resumed checkpoint's step: this run's steps count from it",
        owner=Owner.SHIM,
        minimum=0,
    ),
    Setting(
        "SCOUT_PROGRESS_DIR",
        "progress_dir",
        "path",
        None,
        "the rank's shared-memory progress folder; set: the bootstrap installs",
        owner=Owner.SHIM,
    ),
    Setting(
        "SCOUT_RUN_DIR", "run_dir", "path", None, "this run's evidence folder", owner=Owner.SHIM
    ),
    Setting(
        "SCOUT_STACKS_FILE",
        "stacks_file",
        "path",
        None,
        "where faulthandler writes the rank's stacks",
        owner=Owner.SHIM,
    ),
    Setting(
        "SCOUT_CHECKPOINTS_DIR",
        "checkpoints_dir",
        "path",
        None,
        "where checkpoint records go",
        owner=Owner.SHIM,
    ),
    Setting(
        "SCOUT_PACKAGE_DIR",
        "package_dir",
        "path",
        None,
        "scout_slurm's folder, for a job Python without it installed",
        owner=Owner.SHIM,
    ),
    Setting(
        "SLURM_RESTART_COUNT",
        "restart",
        "int",
        0,
        "the run (0, then 1 per requeue)",
        owner=Owner.SLURM,
        minimum=0,
    ),
    Setting("SLURMD_NODENAME", "node", "str", "", "this node's Slurm name", owner=Owner.SLURM),
)
BY_NAME = {s.name: s for s in SETTINGS}

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
    at_rest: str = "auto"
    update_replay: str = "auto"
    update_max_bytes: int = UPDATE_MAX_BYTES
    final_vote_timeout_s: float = 120.0
    sdc_policy: SdcPolicy = SdcPolicy.EXIT
    resume_mismatch: ResumeMismatch = ResumeMismatch.WARN
    checkpoint_agreement: bool = True
    timing: TimingRules = field(default_factory=TimingRules)
    inject: "FaultSpec | None" = None
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
    ) -> "JobConfig":
        """The settings `environ` holds; a bad value is a JobConfigError naming each bad variable."""
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


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_SWITCH = {"on", "off"}


def parse_value(setting: Setting, text: str) -> object:
    """One variable's text as its type; ValueError says why not (pure)."""
    t = text.strip()
    kind = setting.kind
    if kind == "bool":
        if t.lower() not in _TRUE + _FALSE:
            raise ValueError(f"not a boolean; expected {setting.accepts()}")
        return t.lower() in _TRUE
    if kind in ("int", "float"):
        try:
            value: float = int(t) if kind == "int" else float(t)
        except ValueError:
            raise ValueError(
                f"not {'an integer' if kind == 'int' else 'a number'}; expected {setting.accepts()}"
            ) from None
        if (
            not math.isfinite(value)
            or (setting.minimum is not None and value < setting.minimum)
            or (setting.maximum is not None and value > setting.maximum)
        ):
            raise ValueError(f"out of range; expected {setting.accepts()}")
        return value
    if kind == "choice":
        if (
            _SWITCH <= set(setting.choices) and t.lower() in _TRUE + _FALSE
        ):  # a switch also takes a boolean's words
            return "on" if t.lower() in _TRUE else "off"
        if t.lower() not in setting.choices:
            raise ValueError(f"not a valid choice; expected {setting.accepts()}")
        return t.lower()
    if kind == "path":
        if not os.path.isabs(t):
            raise ValueError("not an absolute path")
        return Path(t)
    if kind == "checks":
        from scout_slurm.bootstrap.guard import parse_broken

        return parse_broken(t)
    if kind == "fault":
        from scout_slurm.inject.spec import parse_fault

        try:
            return parse_fault(t)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return text


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
        else "see the README's in-job settings for the valid names"
    )
    return Problem(name, "", f"unknown scout setting; {hint}")


def read_settings(
    environ: Mapping[str, str],
    defaults: Mapping[str, str] | None = None,
    *,
    check_names: bool = True,
) -> tuple[JobConfig, tuple[Problem, ...]]:
    """The JobConfig `environ` gives, and what is wrong in it: a bad value keeps its default (pure).
    `defaults` (text by variable name, e.g. `site_defaults(cfg)`) stand where the job sets nothing."""
    problems: list[Problem] = []
    values: dict[str, object] = {}
    timing_env: dict[str, str] = {}
    merged = dict(defaults or {})
    merged.update({k: v for k, v in environ.items() if k in BY_NAME or k.startswith(TIMING_PREFIX)})
    if check_names:
        known = known_names()
        for name in sorted(environ):
            if name.startswith(PREFIX) and name not in known and not name.startswith(TIMING_PREFIX):
                p = unknown_name(name, known)
                problems.append(Problem(name, environ[name], p.message))
    for name, text in merged.items():
        if name.startswith(TIMING_PREFIX):
            if name in BY_NAME:
                try:
                    parse_value(BY_NAME[name], text)
                    timing_env[name] = text
                except ValueError as exc:
                    problems.append(Problem(name, text, str(exc)))
            else:
                known = known_names() if check_names else frozenset(BY_NAME)
                problems.append(Problem(name, text, unknown_name(name, known).message))
            continue
        setting = BY_NAME[name]
        if not text.strip() and setting.kind != "str":
            continue  # set but empty: the default
        try:
            values[setting.field] = parse_value(setting, text)
        except ValueError as exc:
            problems.append(Problem(name, text, str(exc)))
    try:
        values["timing"] = rules_from_environment(timing_env)
    except ConfigError as exc:  # a value that passed the table's check but not the rules' own
        problems.append(Problem(", ".join(sorted(timing_env)) or TIMING_PREFIX + "*", "", str(exc)))
    if "replay_every" not in values:
        values["replay_every"] = values.get("consensus_every", JobConfig.consensus_every)
    if "sdc_policy" in values:
        values["sdc_policy"] = SdcPolicy(values["sdc_policy"])
    if "resume_mismatch" in values:
        values["resume_mismatch"] = ResumeMismatch(values["resume_mismatch"])
    return JobConfig(**values), tuple(problems)  # type: ignore[arg-type]


def site_defaults(cfg: "SiteConfig") -> dict[str, str]:
    """The site config's in-job values, as the defaults of the variables they stand for."""
    return {"SCOUT_RESUME_MISMATCH": cfg.remediation.on_resume_mismatch}


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
            "scout: the job runs with scout's in-job checks OFF (state votes, replay, timing votes, "
            "checkpoint records); the watchdog still watches for stalls and crashes. Fix or unset "
            "the variables above (README: In-job settings)."
        )
    else:
        lines.append(
            'scout: the job is not started (the site\'s [watchdog] on_bad_setting = "fail"). Fix or '
            "unset the variables above (README: In-job settings)."
        )
    lines.append(bar)
    return "\n".join(lines)


def _default_text(s: Setting) -> str:
    if s.name == "SCOUT_REPLAY_EVERY":
        return "= SCOUT_CONSENSUS_EVERY"
    if s.default is None or s.default == "" or s.default == frozenset():
        return "unset"
    if isinstance(s.default, bool):
        return "1" if s.default else "0"
    if isinstance(s.default, float):
        return f"{s.default:g}"
    return str(s.default)


def render_markdown() -> str:
    """The README's knob reference, generated from the table (pure)."""
    rows = ["| variable | set by | default | accepts | what it does |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        rows.append(
            f"| `{s.name}` | {s.owner.value} | {_default_text(s)} | {s.accepts()} | {s.help} |"
        )
    return "\n".join(rows) + "\n"
