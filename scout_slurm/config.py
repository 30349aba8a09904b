"""Site configuration: one validated dataclass per component, read from one TOML file.

Precedence is explicit: a flag beats an environment variable (`SCOUT_<SECTION>_<KEY>`), which
beats the file (`$SCOUT_CONFIG`, default `/etc/scout/scout.toml`), which beats the default.
Unknown sections or keys are an error that lists the valid ones. The hooks, which run as root,
read it through `load_hook_config`: only a file that root can trust (trust.py), else SAFE_CONFIG.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from scout_slurm.errors import ConfigError
from scout_slurm.trust import check_bin_dir, read_trusted_file

DEFAULT_CONFIG_PATH = Path("/etc/scout/scout.toml")
CONFIG_ENV = "SCOUT_CONFIG"
MAX_CONFIG_BYTES = 1024 * 1024


@dataclass(frozen=True)
class EvidenceConfig:
    root: str = "/var/lib/scout/evidence"
    max_record_bytes: int = 4 * 1024 * 1024
    # slurm.conf's SlurmUser, as whom the controller Epilog runs: the Prolog gives its group read
    # access to what the job writes, and it owns the job's results/ folder (see docs/THREAT-MODEL.md)
    slurm_user: str = "slurm"


@dataclass(frozen=True)
class SlurmConfig:
    bin_dir: str = ""  # empty: resolve each binary on PATH (then /usr/bin)
    timeout_s: float = 30.0
    retries: int = 3
    retry_wait_s: float = 2.0


@dataclass(frozen=True)
class WatchdogConfig:
    poll_interval_s: float = 0.25
    stall_floor_s: float = 60.0  # never call a stall sooner than this
    stall_factor: float = 10.0  # ... nor sooner than this many observed step times
    publish_interval_s: float = 1.0
    # a rank that plainly advances publishes its snapshot this often only (task/publishing.py)
    steady_publish_interval_s: float = 10.0
    grace_s: float = 5.0  # SIGTERM to SIGKILL
    # the start-up limit: until training advances (its first optimizer step, or
    # arm_after_collectives completed collectives: 0 never arms on collectives alone) a rank is
    # starting (imports, engine set-up, compiling, a checkpoint load after a resume) and is given
    # this long without progress instead of the stall floor; a stall then is a `startup hang`.
    # A checkpoint save or load in progress gets it too (task/stallclock.py).
    startup_grace_s: float = 600.0
    arm_after_collectives: int = 1000
    # evidence that cannot be written (full disk, read-only, quota): "fail" ends the job with exit
    # code 89 once it has lasted evidence_loss_grace_s; "warn" only says so, loudly, every minute
    on_evidence_loss: str = "fail"
    evidence_loss_grace_s: float = 60.0
    # a job whose SCOUT_* settings are not valid (a misspelt name, a bad value): "disable" starts
    # it with scout's in-job checks off (the watchdog still runs) and says so; "fail" does not
    # start it (scout-task exits 85)
    on_bad_setting: str = "disable"


@dataclass(frozen=True)
class PrologConfig:
    time_budget_s: float = 20.0
    fail_on_broken_gpu: bool = False


@dataclass(frozen=True)
class EpilogConfig:
    time_budget_s: float = 60.0
    drain_on_local_hardware_error: bool = False
    # where the localiser runs: "controller" (EpilogSlurmctld reads the evidence) or
    # "batch-host" (the batch host's node Epilog does, for sites whose controller cannot see it)
    localise_on: str = "controller"
    wait_for_nodes_s: float = 10.0
    # an incident whose hook was killed half-way is completed by a later hook run on the cluster
    # once its marker is this old (its own hook had time to take the lock) ...
    pending_min_age_s: float = 2.0
    # ... and given up (logged) past this age: Slurm forgets finished jobs (MinJobAge, default 300 s)
    pending_max_age_s: float = 3600.0
    # the batch host's Epilog checks the job's checkpoint files as the job's user (never as root):
    # what is not checked within this time is not verified; past this many bytes hashed in all,
    # the later files are checked by size and presence only
    checkpoint_check_s: float = 15.0
    checkpoint_check_bytes: int = 2 * 1024 * 1024 * 1024


@dataclass(frozen=True)
class RemediationConfig:
    observe_only: bool = False
    min_confidence: float = 0.8
    max_drain_fraction: float = 0.5
    restart_limit: int = 3
    min_nodes_after_drain: int = 1
    requeue: bool = True
    # a confirmed straggler's node is drained only where the site says so: slowness is often the
    # job's own (data, load imbalance) or passing (thermal, a neighbour's traffic), the job still
    # finishes, and a timing signal is weaker evidence than a crash or wrong numbers
    drain_stragglers: bool = False
    # a resumed run whose restored state differs from its checkpoint record: "warn" (a loud finding,
    # the job goes on) or "fatal" (the rank exits 90); SCOUT_RESUME_MISMATCH in the job's environment wins
    on_resume_mismatch: str = "warn"


@dataclass(frozen=True)
class DrainConfig:
    """When a suspect node is drained (taken from everyone) rather than only excluded from the
    failed job's own rerun (remediation/plan.py, `drain_decision`). Everything a job writes is the
    job's word, so by default a drain needs evidence the job cannot forge."""

    # "corroborated": a root-run check on the node corroborates the verdict's kind, or incidents of
    # at least min_users different users named the node (or a GPU serial on it) within window_s;
    # otherwise the node is excluded from the rerun and put on the watch list.
    # "job-evidence": the job's own evidence drains, as before (any job can then drain the nodes it
    # holds, shared or exclusive)
    drain_on: str = "corroborated"
    window_s: float = 30 * 86400.0
    min_users: int = 2
    # the named node's Epilog waits this long for the verdict, then runs its root checks within
    # root_check_s; the controller waits for them up to wait_for_root_checks_s
    verdict_wait_s: float = 20.0
    root_check_s: float = 15.0
    wait_for_root_checks_s: float = 25.0
    # TEST DOUBLE of a hardware source, for the lab only: a root-owned file of /dev/kmsg records
    # read instead of /dev/kmsg ("{node}" is replaced by the node's name); empty on a real site
    test_kernel_log: str = ""


@dataclass(frozen=True)
class SiteConfig:
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    prolog: PrologConfig = field(default_factory=PrologConfig)
    epilog: EpilogConfig = field(default_factory=EpilogConfig)
    remediation: RemediationConfig = field(default_factory=RemediationConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)


_SECTION_TYPES = {
    "evidence": EvidenceConfig,
    "slurm": SlurmConfig,
    "watchdog": WatchdogConfig,
    "prolog": PrologConfig,
    "epilog": EpilogConfig,
    "remediation": RemediationConfig,
    "drain": DrainConfig,
}


def _coerce(value: Any, target: type, where: str) -> Any:
    if target is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in (
            "1",
            "true",
            "yes",
            "on",
            "0",
            "false",
            "no",
            "off",
        ):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if target is int:
        if isinstance(value, (bool, float)):  # int(2.5) would silently make it 2
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if target is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if target is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported type {target}")


_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def _build_section(name: str, raw: Mapping[str, Any], source: str) -> Any:
    cls = _SECTION_TYPES[name]
    valid = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)} in [{name}]; "
            f"valid keys: {', '.join(sorted(valid))}"
        )
    kwargs = {}
    for key, value in raw.items():
        ftype = _TYPES[valid[key].type] if isinstance(valid[key].type, str) else valid[key].type
        kwargs[key] = _coerce(value, ftype, f"{source}: [{name}] {key}")
    return cls(**kwargs)


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> SiteConfig:
    """Validate a parsed TOML mapping into a SiteConfig (pure)."""
    unknown = sorted(set(data) - set(_SECTION_TYPES))
    if unknown:
        raise ConfigError(
            f"{source}: unknown section(s) {', '.join(unknown)}; "
            f"valid sections: {', '.join(sorted(_SECTION_TYPES))}"
        )
    sections = {}
    for name, raw in data.items():
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{source}: [{name}] must be a table, got {type(raw).__name__}")
        sections[name] = _build_section(name, raw, source)
    cfg = SiteConfig(**sections)
    _check_ranges(cfg, source)
    return cfg


def _check_ranges(cfg: SiteConfig, source: str) -> None:
    # no count, size or duration is negative (nan and inf are no duration either)
    for section in _SECTION_TYPES:
        for key, value in dataclasses.asdict(getattr(cfg, section)).items():
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and not 0 <= value < math.inf
            ):
                raise ConfigError(
                    f"{source}: [{section}] {key} must be a finite number >= 0, got {value}"
                )
    if cfg.slurm.timeout_s <= 0:
        raise ConfigError(
            f"{source}: [slurm] timeout_s must be positive, got {cfg.slurm.timeout_s}"
        )
    r = cfg.remediation
    if not 0.0 <= r.min_confidence <= 1.0:
        raise ConfigError(
            f"{source}: [remediation] min_confidence must be within 0..1, got {r.min_confidence}"
        )
    if not 0.0 <= r.max_drain_fraction <= 1.0:
        raise ConfigError(
            f"{source}: [remediation] max_drain_fraction must be within 0..1, got {r.max_drain_fraction}"
        )
    if cfg.epilog.localise_on not in ("controller", "batch-host"):
        raise ConfigError(
            f"{source}: [epilog] localise_on must be 'controller' or 'batch-host', "
            f"got {cfg.epilog.localise_on!r}"
        )
    if cfg.epilog.checkpoint_check_s <= 0:
        raise ConfigError(
            f"{source}: [epilog] checkpoint_check_s must be positive, got {cfg.epilog.checkpoint_check_s}"
        )
    if cfg.watchdog.stall_floor_s <= 0 or cfg.watchdog.poll_interval_s <= 0:
        raise ConfigError(
            f"{source}: [watchdog] stall_floor_s and poll_interval_s must be positive"
        )
    if cfg.remediation.on_resume_mismatch not in ("warn", "fatal"):
        raise ConfigError(
            f"{source}: [remediation] on_resume_mismatch must be 'warn' or 'fatal', "
            f"got {cfg.remediation.on_resume_mismatch!r}"
        )
    if cfg.watchdog.on_bad_setting not in ("disable", "fail"):
        raise ConfigError(
            f"{source}: [watchdog] on_bad_setting must be 'disable' or 'fail', "
            f"got {cfg.watchdog.on_bad_setting!r}"
        )
    if cfg.drain.drain_on not in ("corroborated", "job-evidence"):
        raise ConfigError(
            f"{source}: [drain] drain_on must be 'corroborated' or 'job-evidence', "
            f"got {cfg.drain.drain_on!r}"
        )
    if cfg.drain.min_users < 2:
        raise ConfigError(
            f"{source}: [drain] min_users must be at least 2 (one user's jobs are one word), "
            f"got {cfg.drain.min_users}"
        )
    if cfg.watchdog.on_evidence_loss not in ("fail", "warn"):
        raise ConfigError(
            f"{source}: [watchdog] on_evidence_loss must be 'fail' or 'warn', "
            f"got {cfg.watchdog.on_evidence_loss!r}"
        )


def site_override_names() -> list[str]:
    """Every `SCOUT_<SECTION>_<KEY>` name the site config reads from the environment (pure)."""
    return [
        f"SCOUT_{section.upper()}_{f.name.upper()}"
        for section, cls in _SECTION_TYPES.items()
        for f in fields(cls)
    ]


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """`SCOUT_<SECTION>_<KEY>=value` variables as a nested mapping (pure)."""
    out: dict[str, dict[str, str]] = {}
    for section, cls in _SECTION_TYPES.items():
        for f in fields(cls):
            var = f"SCOUT_{section.upper()}_{f.name.upper()}"
            if var in environ:
                out.setdefault(section, {})[f.name] = environ[var]
    return out


def merge(
    base: SiteConfig, overrides: Mapping[str, Mapping[str, Any]], *, source: str
) -> SiteConfig:
    """Apply overrides (already grouped by section) on top of a config."""
    changes = {}
    for section, values in overrides.items():
        if section not in _SECTION_TYPES:
            raise ConfigError(
                f"{source}: unknown section {section}; valid: {', '.join(sorted(_SECTION_TYPES))}"
            )
        current = dataclasses.asdict(getattr(base, section))
        current.update(values)
        changes[section] = _build_section(section, current, source)
    cfg = dataclasses.replace(base, **changes)
    _check_ranges(cfg, source)
    return cfg


def load_config(
    environ: Mapping[str, str],
    *,
    path: str | Path | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> SiteConfig:
    """Read the site config: defaults < file < environment < flags.

    A config file named explicitly (flag or SCOUT_CONFIG) must exist; the default path may not.
    """
    explicit = path or environ.get(CONFIG_ENV)
    cfg_path = Path(explicit) if explicit else DEFAULT_CONFIG_PATH
    cfg = SiteConfig()
    if cfg_path.exists():
        try:
            # O_NONBLOCK: a FIFO or device in its place must not hang the job's tasks either
            fd = os.open(cfg_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with open(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise ConfigError(
                        f"{cfg_path}: the site config is not a regular file; point "
                        f"{CONFIG_ENV} at the file itself"
                    )
                raw = fh.read(1024 * 1024 + 1)
            if len(raw) > 1024 * 1024:
                raise ConfigError(
                    f"{cfg_path}: config file larger than 1 MiB; is this the right file?"
                )
            data = tomllib.loads(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(
                f"{cfg_path}: cannot read the site config ({exc}); fix the file or point "
                f"{CONFIG_ENV} at another"
            ) from exc
        cfg = parse_config(data, source=str(cfg_path))
    elif explicit:
        raise ConfigError(
            f"{cfg_path}: site config not found (named by "
            f"{'--config' if path else CONFIG_ENV}); create it or unset the variable"
        )
    env = env_overrides(environ)
    if env:
        cfg = merge(cfg, env, source="environment (SCOUT_* variables)")
    if flags:
        cfg = merge(cfg, flags, source="command-line flags")
    return cfg


# What a privileged hook runs with when it cannot trust the site config: nothing from that file,
# and no drain or requeue on the strength of settings nobody vouched for.
SAFE_CONFIG = SiteConfig(remediation=RemediationConfig(observe_only=True))


@dataclass(frozen=True)
class HookConfig:
    """The site config as a hook running as root (or SlurmUser) may use it. `refused` says why
    the file was not trusted; `config` is then SAFE_CONFIG. `source` says where the values came
    from, for the hook's log."""

    config: SiteConfig
    refused: str | None
    source: str


def load_hook_config(
    environ: Mapping[str, str],
    *,
    path: str | Path | None = None,
    trusted_uids: Iterable[int] | None = None,
) -> HookConfig:
    """Read the site config for a privileged hook, trusting it the way sshd trusts its own.

    Like `load_config` (defaults < file < environment), but the file, every directory above it,
    and `[slurm] bin_dir` with the Slurm commands in it must be owned by a trusted uid (default:
    root and this process's effective uid) and writable by no one else; any failure, and any
    parse or validation error, is a refusal with SAFE_CONFIG, never an exception.
    """
    explicit = path or environ.get(CONFIG_ENV)
    cfg_path = Path(explicit) if explicit else DEFAULT_CONFIG_PATH
    trusted = frozenset({0, os.geteuid()} if trusted_uids is None else trusted_uids)
    try:
        cfg, source = _read_hook_file(
            cfg_path,
            trusted,
            named_by=(None if not explicit else "the caller" if path else CONFIG_ENV),
        )
        env = env_overrides(environ)
        if env:
            cfg = merge(cfg, env, source="environment (SCOUT_* variables)")
            names = [f"SCOUT_{s.upper()}_{k.upper()}" for s, keys in env.items() for k in keys]
            source += f" < environment ({', '.join(names)})"
        if cfg.slurm.bin_dir:
            from scout_slurm.slurm.door import (
                SLURM_COMMANDS,
            )  # the door (subprocess, logging) only here

            # checked after the environment: root runs what is there, whoever named it
            try:
                check_bin_dir(cfg.slurm.bin_dir, trusted, SLURM_COMMANDS)
            except FileNotFoundError:
                raise ConfigError(
                    f"[slurm] bin_dir {cfg.slurm.bin_dir} (from {source}) does not exist; "
                    "fix it, or leave it empty to find Slurm on PATH"
                ) from None
    except ConfigError as exc:  # UntrustedPath is one
        return HookConfig(SAFE_CONFIG, str(exc), f"safe defaults (refused {cfg_path})")
    return HookConfig(cfg, None, source)


def _read_hook_file(
    cfg_path: Path, trusted: frozenset[int], *, named_by: str | None
) -> tuple[SiteConfig, str]:
    try:
        raw = read_trusted_file(cfg_path, trusted, max_bytes=MAX_CONFIG_BYTES)
    except FileNotFoundError:
        if named_by:
            raise ConfigError(
                f"{cfg_path}: site config not found (named by {named_by}); "
                "create it or name another"
            ) from None
        return SiteConfig(), f"defaults ({cfg_path} not present)"
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{cfg_path}: cannot read the site config ({exc}); fix the file") from exc
    return parse_config(data, source=str(cfg_path)), str(cfg_path)


def render_toml(cfg: SiteConfig) -> str:
    """The config as TOML text (used by the lab to write its site config)."""
    lines = []
    for section in _SECTION_TYPES:
        lines.append(f"[{section}]")
        for key, value in dataclasses.asdict(getattr(cfg, section)).items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, (int, float)):
                lines.append(f"{key} = {value}")
            else:
                lines.append(f"{key} = {_toml_str(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_str(s: str) -> str:
    # a TOML basic string takes no raw control character (newline, DEL, ...): escape them
    return (
        '"'
        + "".join(
            "\\" + ch
            if ch in '"\\'
            else f"\\u{ord(ch):04x}"
            if ord(ch) < 0x20 or ord(ch) == 0x7F
            else ch
            for ch in s
        )
        + '"'
    )
