"""Site configuration: one validated dataclass per component, read from one TOML file.

Precedence is explicit: a flag beats an environment variable (`SCOUT_<SECTION>_<KEY>`), which
beats the file (`$SCOUT_CONFIG`, default `/etc/scout/scout.toml`), which beats the default.
Unknown sections or keys are an error that lists the valid ones. The hooks, which run as root,
read it through `load_hook_config`: only a file that root can trust (trust.py), else SAFE_CONFIG.
Each key is declared once, on its field (`settings.declare`: default, range or choices, help, who
reads it), and read by the same engine as the in-job settings; docs/SITE-CONFIG.md is generated
from the declarations (`python -m scout_slurm.reference`).
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from scout_slurm.errors import ConfigError
from scout_slurm.settings import Refused, Setting, declare, declared, parse
from scout_slurm.trust import check_bin_dir, read_trusted_file

DEFAULT_CONFIG_PATH = Path("/etc/scout/scout.toml")
CONFIG_ENV = "SCOUT_CONFIG"
MAX_CONFIG_BYTES = 1024 * 1024


# who reads a setting, for the reference (docs/SITE-CONFIG.md)
PROLOG, NODE_EPILOG, CONTROLLER = "Prolog", "node Epilog", "controller Epilog"
TASK, CLI = "scout-task", "scout CLI"
ALL_HOOKS = (PROLOG, NODE_EPILOG, CONTROLLER)


@dataclass(frozen=True)
class EvidenceConfig:
    root: str = declare(
        "/var/lib/scout/evidence",
        "the evidence folder's root, on storage every node (and the controller) sees",
        readers=(*ALL_HOOKS, TASK, CLI),
    )
    hook_log_dir: str = declare(
        "/var/log/scout",
        "the hooks' own log: a folder on each node's local disk, never the evidence root (which "
        "may hang), where each hook appends <hook>.log before its stderr; empty: stderr only",
        readers=ALL_HOOKS,
    )
    max_record_bytes: int = declare(
        4 * 1024 * 1024, "accepted for compatibility; nothing reads it (each reader has its bound)"
    )
    slurm_user: str = declare(
        "slurm",
        "slurm.conf's SlurmUser, as whom the controller Epilog runs: the Prolog gives its group "
        "read access to what the job writes, and it owns the job's results/ folder "
        "(docs/THREAT-MODEL.md)",
        readers=(PROLOG,),
    )


@dataclass(frozen=True)
class SlurmConfig:
    bin_dir: str = declare(
        "",
        "the folder of the Slurm commands (root-owned); empty: each on PATH (then /usr/bin)",
        readers=(CONTROLLER, CLI),
    )
    timeout_s: float = declare(
        30.0, "time limit of one Slurm command", positive=True, readers=(CONTROLLER, CLI)
    )
    retries: int = declare(3, "tries again a Slurm command that failed", readers=(CONTROLLER,))
    retry_wait_s: float = declare(2.0, "wait between two tries", readers=(CONTROLLER,))


@dataclass(frozen=True)
class WatchdogConfig:
    poll_interval_s: float = declare(
        0.25, "how often the watchdog looks at its rank", positive=True, readers=(TASK,)
    )
    stall_floor_s: float = declare(
        60.0, "never call a stall sooner than this", positive=True, readers=(TASK,)
    )
    stall_factor: float = declare(
        10.0, "... nor sooner than this many observed step times", readers=(TASK,)
    )
    publish_interval_s: float = declare(
        1.0, "progress to the evidence folder this often once a rank idles", readers=(TASK,)
    )
    steady_publish_interval_s: float = declare(
        10.0,
        "a rank that plainly advances publishes its snapshot this often only (task/publishing.py)",
        readers=(TASK,),
    )
    grace_s: float = declare(5.0, "SIGTERM to SIGKILL", readers=(TASK,))
    startup_grace_s: float = declare(
        600.0,
        "the start-up limit: until training advances (its first optimizer step, or "
        "arm_after_collectives completed collectives) a rank is starting (imports, compiling, a "
        "checkpoint load) and is given this long without progress instead of the stall floor; a "
        "stall then is a `startup hang`. A checkpoint save or load in progress gets it too",
        readers=(TASK,),
    )
    arm_after_collectives: int = declare(
        1000,
        "completed collectives after which a rank counts as training (0: never on collectives "
        "alone)",
        readers=(TASK,),
    )
    on_evidence_loss: str = declare(
        "fail",
        "evidence that cannot be written (full disk, read-only, quota): fail ends the job with "
        "exit code 89 once it has lasted evidence_loss_grace_s; warn only says so, loudly, every "
        "minute",
        choices=("fail", "warn"),
        readers=(TASK,),
    )
    evidence_loss_grace_s: float = declare(
        60.0, "how long evidence may be unwritable before on_evidence_loss acts", readers=(TASK,)
    )
    on_bad_setting: str = declare(
        "disable",
        "a job whose SCOUT_* settings are not valid (a misspelt name, a bad value): disable "
        "starts it with scout's in-job checks off (the watchdog still runs) and says so; fail "
        "does not start it (scout-task exits 85)",
        choices=("disable", "fail"),
        readers=(TASK,),
    )


@dataclass(frozen=True)
class PrologConfig:
    time_budget_s: float = declare(20.0, "the Prolog's time budget", readers=(PROLOG,))
    fail_on_broken_gpu: bool = declare(
        False,
        "a GPU the Prolog finds broken fails the Prolog (Slurm drains the node)",
        readers=(PROLOG,),
    )


@dataclass(frozen=True)
class EpilogConfig:
    time_budget_s: float = declare(
        60.0, "the Epilogs' time budget", readers=(NODE_EPILOG, CONTROLLER)
    )
    drain_on_local_hardware_error: bool = declare(
        False,
        "a local hardware error (Xid, machine check) fails the node Epilog, so Slurm drains it",
        readers=(NODE_EPILOG,),
    )
    localise_on: str = declare(
        "controller",
        "where the localiser runs: controller (EpilogSlurmctld reads the evidence) or batch-host "
        "(the batch host's node Epilog does, for sites whose controller cannot see it)",
        choices=("controller", "batch-host"),
        readers=(NODE_EPILOG, CONTROLLER),
    )
    wait_for_nodes_s: float = declare(
        10.0, "how long the localiser waits for the nodes' evidence", readers=(CONTROLLER,)
    )
    pending_min_age_s: float = declare(
        2.0,
        "an incident whose hook was killed half-way is completed by a later hook run once its "
        "marker is this old (its own hook had time to take the lock) ...",
        readers=(CONTROLLER,),
    )
    pending_max_age_s: float = declare(
        3600.0,
        "... and given up (logged) past this age: Slurm forgets finished jobs (MinJobAge)",
        readers=(CONTROLLER,),
    )
    checkpoint_check_s: float = declare(
        15.0,
        "the batch host's Epilog checks the job's checkpoint files as the job's user (never as "
        "root): what is not checked within this time is not verified",
        positive=True,
        readers=(NODE_EPILOG, CLI),
    )
    checkpoint_check_bytes: int = declare(
        2 * 1024 * 1024 * 1024,
        "past this many bytes hashed in all, the later checkpoint files are checked by size and "
        "presence only",
        readers=(NODE_EPILOG, CLI),
    )


@dataclass(frozen=True)
class RemediationConfig:
    observe_only: bool = declare(
        False, "write the plan, act on nothing (no drain, no requeue)", readers=(CONTROLLER,)
    )
    min_confidence: float = declare(
        0.8, "a verdict below this confidence drains nothing", maximum=1.0, readers=(CONTROLLER,)
    )
    max_drain_fraction: float = declare(
        0.5,
        "the most of the job's nodes one incident may drain",
        maximum=1.0,
        readers=(CONTROLLER,),
    )
    restart_limit: int = declare(
        3, "the most requeues of one job (SLURM_RESTART_COUNT)", readers=(CONTROLLER,)
    )
    min_nodes_after_drain: int = declare(
        1, "accepted for compatibility; nothing reads it", readers=()
    )
    requeue: bool = declare(
        True, "requeue the job without the suspect nodes", readers=(CONTROLLER,)
    )
    drain_stragglers: bool = declare(
        False,
        "drain a confirmed straggler's node (slowness is often the job's own or passing, and a "
        "timing signal is weaker evidence than a crash or wrong numbers)",
        readers=(CONTROLLER,),
    )
    software_retries: int = declare(
        1,
        "the most requeues of a job whose failure has cause software (the job's own exception); "
        "never when the run before failed the same way at the same place",
        readers=(CONTROLLER,),
    )
    on_resume_mismatch: str = declare(
        "warn",
        "a resumed run whose restored state differs from its checkpoint record, or that loads a "
        "checkpoint scout rejected: warn (a loud line and finding, the job goes on; a rejected "
        "load makes the run's verdict tainted) or fatal (the ranks exit 90 before training from "
        "it); the job's SCOUT_RESUME_MISMATCH wins",
        choices=("warn", "fatal"),
        readers=(TASK,),
    )


@dataclass(frozen=True)
class DrainConfig:
    """When a suspect node is drained (taken from everyone) rather than only excluded from the
    failed job's own rerun (remediation/plan.py, `drain_decision`). Everything a job writes is the
    job's word, so by default a drain needs evidence the job cannot forge."""

    drain_on: str = declare(
        "corroborated",
        "corroborated: a root-run check on the node corroborates the verdict's kind, or incidents "
        "of at least min_users users named the node (or a GPU serial on it) within window_s; "
        "otherwise the node is excluded from the rerun and watched. job-evidence: the job's own "
        "evidence drains (any job can then drain the nodes it holds)",
        choices=("corroborated", "job-evidence"),
        readers=(NODE_EPILOG, CONTROLLER),
    )
    window_s: float = declare(
        30 * 86400.0, "how far back incidents of other users count", readers=(CONTROLLER,)
    )
    min_users: int = declare(
        2,
        "how many different users' incidents must name a node",
        minimum=2,
        why="one user's jobs are one word",
        readers=(CONTROLLER,),
    )
    verdict_wait_s: float = declare(
        20.0, "the named node's Epilog waits this long for the verdict", readers=(NODE_EPILOG,)
    )
    root_check_s: float = declare(
        15.0, "... then runs its root checks within this time", readers=(NODE_EPILOG,)
    )
    wait_for_root_checks_s: float = declare(
        25.0, "the controller waits for the root checks up to this long", readers=(CONTROLLER,)
    )
    test_kernel_log: str = declare(
        "",
        "TEST DOUBLE of a hardware source, for the lab only: a root-owned file of /dev/kmsg "
        'records read instead of /dev/kmsg ("{node}" is replaced by the node\'s name); empty on '
        "a real site",
        readers=(NODE_EPILOG,),
    )


@dataclass(frozen=True)
class SiteConfig:
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    prolog: PrologConfig = field(default_factory=PrologConfig)
    epilog: EpilogConfig = field(default_factory=EpilogConfig)
    remediation: RemediationConfig = field(default_factory=RemediationConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)


_SECTION_TYPES = {f.name: f.default_factory for f in fields(SiteConfig)}  # type: ignore[misc]
# every section's settings, declared on its dataclass's fields
SECTIONS: dict[str, tuple[Setting, ...]] = {
    name: declared(cls) for name, cls in _SECTION_TYPES.items()
}


def _build_section(name: str, raw: Mapping[str, Any], source: str) -> Any:
    declared_here = {s.name: s for s in SECTIONS[name]}
    unknown = sorted(set(raw) - set(declared_here))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)} in [{name}]; "
            f"valid keys: {', '.join(sorted(declared_here))}"
        )
    kwargs = {}
    for key, value in raw.items():
        try:
            kwargs[key] = parse(declared_here[key], value)
        except Refused as exc:
            raise ConfigError(exc.sentence(f"{source}: [{name}] {key}")) from None
    return _SECTION_TYPES[name](**kwargs)


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
    return SiteConfig(**sections)


def env_name(section: str, key: str) -> str:
    """The environment variable that overrides `[section] key`."""
    return f"SCOUT_{section.upper()}_{key.upper()}"


def site_override_names() -> list[str]:
    """Every `SCOUT_<SECTION>_<KEY>` name the site config reads from the environment (pure)."""
    return [env_name(section, s.name) for section, group in SECTIONS.items() for s in group]


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """`SCOUT_<SECTION>_<KEY>=value` variables as a nested mapping (pure)."""
    out: dict[str, dict[str, str]] = {}
    for section, group in SECTIONS.items():
        for s in group:
            var = env_name(section, s.name)
            if var in environ:
                out.setdefault(section, {})[s.name] = environ[var]
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
    return dataclasses.replace(base, **changes)


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
            names = [env_name(s, k) for s, keys in env.items() for k in keys]
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
