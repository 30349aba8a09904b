"""`scout site check`: the doctor a site administrator runs on the controller and on each kind of
node after installing scout. Each check returns `Finding`s (ok, warn, FAIL or skip, what was found,
what to do); nothing here writes, creates, chmods or signals anything.

The rules over what was read are pure (`slurm_findings`, `observe_only_finding`, `may_access`,
`tree_findings`); `run_checks` reaches outside: it stats and reads files, opens /dev/kmsg
read-only, runs `scontrol show config` through the door, and asks NVML and the evidence root in
bounded children (hooks/bounded.py), since a hung driver or mount must not hang the doctor.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import stat
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from scout_slurm.config import (
    CONFIG_ENV,
    DEFAULT_CONFIG_PATH,
    SiteConfig,
    load_config,
    load_hook_config,
)
from scout_slurm.errors import ConfigError, ScoutError, UntrustedPath
from scout_slurm.slurm.parse import SlurmSettings
from scout_slurm.trust import command_problem, directory_problem, resolve_trusted

# The releases scout is tested on (docs/SITE-ADMIN.md, "Slurm versions"): the lab runs each of them.
TESTED_RELEASES = ((22, 5), (24, 11), (26, 5))
# Slurm kills a Prolog or Epilog at PrologEpilogTimeout and drains the node: the hooks' own
# budgets must end this much earlier (their children are abandoned, then they log and exit).
TIMEOUT_SLACK_S = 5
MIN_JOB_AGE_S = 300  # the snippet's: a finished job stays requeueable for the controller Epilog
JOBS_CHECKED = 100  # the newest job folders whose modes are checked
HOOK_READ_BYTES = 64 * 1024
NVML_BOUND_S = 15.0
EVIDENCE_BOUND_S = 15.0
SNIPPET = "PREFIX/etc/scout/slurm.conf.snippet (written by `scout site install`)"


class Severity(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"
    SKIP = "skip"  # not for this host (a node's hook on a controller that runs no slurmd)


@dataclass(frozen=True)
class Finding:
    check: str  # config, observe-only, slurm, Prolog, Epilog, EpilogSlurmctld, evidence, ...
    severity: Severity
    message: str
    remedy: str = ""


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]

    @property
    def failed(self) -> bool:
        return any(f.severity == Severity.FAIL for f in self.findings)

    def as_json(self) -> dict:
        return {
            "ok": not self.failed,
            "findings": [{**asdict(f), "severity": f.severity.value} for f in self.findings],
        }

    def render(self) -> str:
        """One line per finding (`ok`, `warn`, `FAIL`, `skip`), its remedy indented below."""
        out = []
        for f in self.findings:
            out.append(f"{f.severity.value:<4}  {f.check:<15} {f.message}")
            if f.remedy:
                out.append(f"{'':<6}{'':<15} -> {f.remedy}")
        fails = sum(f.severity == Severity.FAIL for f in self.findings)
        warns = sum(f.severity == Severity.WARN for f in self.findings)
        out.append(
            f"{fails} failed, {warns} warning(s): "
            + ("scout's hooks will not work as designed here" if fails else "nothing failed")
        )
        return "\n".join(out) + "\n"


def _split_fix(problem: str) -> tuple[str, str]:
    """trust.py's refusals end in "; fix: ...": the remedy, apart."""
    head, sep, fix = problem.partition("; fix: ")
    return (head, fix) if sep else (problem, "")


# -- the site config ------------------------------------------------------------------------


def config_path(path: str | Path | None, environ: Mapping[str, str]) -> Path:
    return Path(path or environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)


def check_config(
    path: Path, *, trusted_uids: Collection[int] = frozenset({0})
) -> tuple[list[Finding], SiteConfig, bool]:
    """The site config as the hooks will judge it (trust.py's rule, root as the one trusted owner);
    returns the findings, the config the other checks use (what the file says, when it parses,
    even if the hooks refuse it) and whether the hooks trust it."""
    if not os.path.lexists(path):
        return (
            [
                Finding(
                    "config",
                    Severity.WARN,
                    f"no site config at {path}: the hooks run on the defaults",
                    "lay one out with `scout site install`, or run this check with --config "
                    "naming the file the hook wrappers export as SCOUT_CONFIG",
                )
            ],
            SiteConfig(),
            True,
        )
    hook = load_hook_config({}, path=path, trusted_uids=trusted_uids)
    if hook.refused is None:
        st = os.stat(path)
        return (
            [
                Finding(
                    "config",
                    Severity.OK,
                    f"{path}: trusted (owner uid {st.st_uid}, mode "
                    f"{stat.S_IMODE(st.st_mode):04o}, every folder above it root's)",
                )
            ],
            hook.config,
            True,
        )
    message, fix = _split_fix(hook.refused)
    findings = [
        Finding(
            "config",
            Severity.FAIL,
            f"the hooks refuse it: {message}; until fixed they run on safe defaults (observe "
            "only) and ignore every setting in it",
            fix or f"correct {path} as said above",
        )
    ]
    try:
        intended = load_config({}, path=path)
    except (ConfigError, OSError):
        intended = SiteConfig()
    return findings, intended, False


def observe_only_finding(cfg: SiteConfig, trusted: bool) -> Finding:
    """observe_only said plainly (pure)."""
    if not trusted or cfg.remediation.observe_only:
        why = "" if trusted else " (the hooks refuse the config, and run observe-only)"
        return Finding(
            "observe-only",
            Severity.OK,
            f"on{why}: scout writes verdicts and plans, and drains and requeues nothing",
            ""
            if not trusted
            else "set [remediation] observe_only = false once `scout show` "
            "has shown plans you agree with",
        )
    return Finding(
        "observe-only",
        Severity.OK,
        f"off: scout drains the nodes its verdicts name (verdict confidence >= "
        f"{cfg.remediation.min_confidence}, at most {cfg.remediation.max_drain_fraction:g} of a "
        f"job's nodes, drain_on = {cfg.drain.drain_on}) and requeues the job (restart_limit "
        f"{cfg.remediation.restart_limit})",
    )


# -- slurm.conf -------------------------------------------------------------------------------


def _release_text(release: tuple[int, int]) -> str:
    return f"{release[0]}.{release[1]:02d}"


def slurm_findings(s: SlurmSettings, cfg: SiteConfig, *, slurm_user_here: bool) -> list[Finding]:
    """Slurm's release and the parameters scout needs, from `scontrol show config` (pure).
    `slurm_user_here`: whether SlurmUser is a user of this host."""
    out = []
    tested = ", ".join(_release_text(r) for r in TESTED_RELEASES)
    release = s.release
    if release in TESTED_RELEASES:
        out.append(
            Finding("slurm", Severity.OK, f"Slurm {s.version}: a release scout is tested on")
        )
    elif release is not None and release < TESTED_RELEASES[0]:
        out.append(
            Finding(
                "slurm",
                Severity.FAIL,
                f"Slurm {s.version} is older than every release scout is tested on ({tested})",
                f"upgrade Slurm to one of {tested}",
            )
        )
    else:
        out.append(
            Finding(
                "slurm",
                Severity.WARN,
                f"Slurm {s.version} is not a release scout is tested on ({tested})",
                f"run `scout acceptance` on this cluster before relying on it, or use one of "
                f"{tested}",
            )
        )
    if "Alloc" in s.prolog_flags:
        out.append(Finding("slurm", Severity.OK, f"PrologFlags={','.join(s.prolog_flags)}"))
    else:
        shown = ",".join(s.prolog_flags) or "(none)"
        out.append(
            Finding(
                "slurm",
                Severity.FAIL,
                f"PrologFlags={shown} lacks Alloc: the Prolog runs only where a step first lands, "
                "so most nodes' hardware maps are missing",
                "add Alloc to PrologFlags in slurm.conf (PrologFlags=Alloc, or Alloc,<the "
                "present flags>), then `scontrol reconfigure`",
            )
        )
    out += _timeout_findings(s, cfg)
    if s.min_job_age_s is not None and s.min_job_age_s < MIN_JOB_AGE_S:
        out.append(
            Finding(
                "slurm",
                Severity.WARN,
                f"MinJobAge={s.min_job_age_s} s: Slurm may forget a finished job before the "
                "controller Epilog requeues it, or before a later one completes a killed incident",
                f"set MinJobAge={MIN_JOB_AGE_S} (the snippet's) or more in slurm.conf",
            )
        )
    if s.slurm_user != cfg.evidence.slurm_user:
        out.append(
            Finding(
                "slurm",
                Severity.FAIL,
                f"SlurmUser is {s.slurm_user}, the site config's [evidence] slurm_user is "
                f"{cfg.evidence.slurm_user}: the controller Epilog (run as {s.slurm_user}) cannot "
                "read the jobs' records nor write results/ and pending/",
                f'set [evidence] slurm_user = "{s.slurm_user}" in the site config',
            )
        )
    elif not slurm_user_here:
        out.append(
            Finding(
                "slurm",
                Severity.FAIL,
                f"SlurmUser {s.slurm_user} is no user of this host: the Prolog here hands the "
                "job's results/ and pending/ folders to root, and the controller Epilog cannot "
                "write them",
                f"create the user {s.slurm_user} with the controller's uid and gid on every node",
            )
        )
    else:
        out.append(
            Finding("slurm", Severity.OK, f"SlurmUser {s.slurm_user}, as the site config says")
        )
    return out


def _timeout_findings(s: SlurmSettings, cfg: SiteConfig) -> list[Finding]:
    """Slurm's limit on the Prolog and on the Epilogs against scout's budgets for them (pure)."""
    limits = [
        ("Prolog", "[prolog] time_budget_s", cfg.prolog.time_budget_s, s.prolog_timeout),
        ("Epilogs", "[epilog] time_budget_s", cfg.epilog.time_budget_s, s.epilog_timeout),
    ]
    if s.prolog_timeout[0] == s.epilog_timeout[0]:  # one parameter for both: one line
        budget = max(cfg.prolog.time_budget_s, cfg.epilog.time_budget_s)
        limits = [
            (
                "hooks",
                "[prolog] time_budget_s and [epilog] time_budget_s",
                budget,
                s.prolog_timeout,
            )
        ]
    out = []
    for what, setting, budget, (param, timeout) in limits:
        need = budget + TIMEOUT_SLACK_S
        if timeout is None:
            out.append(
                Finding(
                    "slurm",
                    Severity.OK,
                    f"{param} unlimited: scout's {what} end within their own budget ({budget:g} s)",
                )
            )
        elif timeout < need:
            out.append(
                Finding(
                    "slurm",
                    Severity.FAIL,
                    f"{param}={timeout} s is shorter than scout's {what} budget plus "
                    f"{TIMEOUT_SLACK_S} s ({need:g} s): Slurm may kill a hook that is on time, "
                    "and drain the node",
                    f"set {param}={int(need + 0.999)} or more in slurm.conf, or lower {setting} "
                    "in the site config",
                )
            )
        else:
            out.append(
                Finding(
                    "slurm",
                    Severity.OK,
                    f"{param}={timeout} s, above scout's {what} budget plus slack ({need:g} s)",
                )
            )
    return out


# -- the hooks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class HookSpec:
    parameter: str
    marker: re.Pattern[str]  # what only scout's hook (a wrapper or the console script) contains
    controller: bool  # EpilogSlurmctld: runs on the controller, as SlurmUser


HOOK_SPECS = (
    HookSpec("Prolog", re.compile(r"scout_slurm\.hooks\.prolog\b|scout-prolog\b"), False),
    HookSpec(
        "Epilog",
        re.compile(r"scout_slurm\.hooks\.epilog\b|scout-epilog(?!-slurmctld)\b"),
        False,
    ),
    HookSpec(
        "EpilogSlurmctld",
        re.compile(r"scout_slurm\.hooks\.controller\b|scout-epilog-slurmctld\b"),
        True,
    ),
)
_EXEC_TARGET = re.compile(r"exec\s+'(/[^']+)'")


@dataclass(frozen=True)
class Runner:
    """Who runs a hook: root, or SlurmUser with its groups."""

    name: str
    uid: int
    gids: frozenset[int]


def may_access(st: os.stat_result, who: Runner, bits: int) -> bool:
    """Whether `who` may do `bits` (4 read, 2 write, 1 execute/enter) to a file of this stat
    (pure; root may do anything but execute a file no one may execute)."""
    mode = stat.S_IMODE(st.st_mode)
    if who.uid == 0:
        if bits & 1 and stat.S_ISREG(st.st_mode):
            return bool(mode & 0o111)
        return True
    if st.st_uid == who.uid:
        granted = mode >> 6
    elif st.st_gid in who.gids:
        granted = mode >> 3
    else:
        granted = mode
    return granted & bits == bits


def _runner(name: str, fallback_uid: int | None) -> Runner | None:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        if fallback_uid is None:
            return None
        return Runner(name, fallback_uid, frozenset())
    return Runner(name, pw.pw_uid, frozenset(os.getgrouplist(name, pw.pw_gid)))


def _expand(entries: Sequence[str]) -> tuple[list[str], list[str]]:
    """(programs, globs that matched nothing): slurmd runs every program a glob matches."""
    programs, empty = [], []
    for entry in entries:
        if glob.has_magic(entry):
            found = sorted(glob.glob(entry))
            if not found:
                empty.append(entry)
            programs += found
        else:
            programs.append(entry)
    return programs, empty


def _head(path: str) -> str:
    """The start of a hook program, to tell scout's from the site's; "" for what is no regular
    file (stat first: a device planted there is never opened, opening some has effects)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        return ""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, HOOK_READ_BYTES).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _program_problems(path: str, who: Runner, trusted: Collection[int]) -> list[str]:
    """Why `who` cannot run the program at `path`, or root must not: trust.py's rule for what
    root runs (owner, mode, every folder on the way), then the execute bit for `who`."""
    try:
        real, st = resolve_trusted(path, trusted, follow_last=True)
    except FileNotFoundError:
        return [f"{path} does not exist"]
    except UntrustedPath as exc:
        return [str(exc)]
    if problem := command_problem(real, st, trusted):
        return [problem]
    if not may_access(st, who, 1):
        shown = path if real == path else f"{path} (really {real})"
        return [
            f"{shown} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}) is not "
            f"executable by {who.name}; fix: chmod 755 {real}"
        ]
    return []


def hook_findings(
    spec: HookSpec, entries: Sequence[str], who: Runner | None, *, here: bool
) -> list[Finding]:
    """The programs slurm.conf names for one hook: scout's among them, each present, trusted and
    executable by whom runs it. `here`: whether this host runs that hook at all."""
    name = spec.parameter
    where = "the controller" if spec.controller else "a compute node"
    if not here:
        return [
            Finding(
                name,
                Severity.SKIP,
                f"not run on this host (no {'slurmctld' if spec.controller else 'slurmd'} here): "
                f"run `scout site check` on {where} for it",
            )
        ]
    if not entries:
        return [
            Finding(
                name,
                Severity.FAIL,
                f"slurm.conf names no {name}: scout's {name} never runs",
                f"add the {name}= line of {SNIPPET} to slurm.conf",
            )
        ]
    if who is None:
        return [
            Finding(
                name,
                Severity.FAIL,
                f"its runner is no user of this host, so whether it may run {name} is unknown",
                "create SlurmUser on this host",
            )
        ]
    trusted = frozenset({0, who.uid})
    out = []
    programs, empty = _expand(entries)
    for entry in empty:
        out.append(
            Finding(
                name,
                Severity.WARN,
                f"{name}={entry} matches no file",
                "link scout's hook (and the site's own programs) into that folder, as "
                "`scout site install` does",
            )
        )
    scout_own = []
    for program in programs:
        problems = _program_problems(program, who, trusted)
        text = ""
        try:  # read also when root must not run it: whose program it is still matters
            text = _head(program)
        except OSError as exc:
            if not problems:
                problems.append(f"{program}: cannot be read ({exc.strerror or exc})")
        if text and spec.marker.search(text):
            scout_own.append(program)
            for target in dict.fromkeys(_EXEC_TARGET.findall(text)):
                problems += [f"{program} runs {p}" for p in _program_problems(target, who, trusted)]
        for problem in problems:
            message, fix = _split_fix(problem)
            consequence = (
                "every job's controller Epilog fails (logged only)"
                if spec.controller
                else f"every job's {name} fails here, and Slurm drains the node"
            )
            out.append(
                Finding(
                    name,
                    Severity.FAIL,
                    f"{message}: {consequence}",
                    fix or f"reinstall it (`scout site install`), or correct {name}= in slurm.conf",
                )
            )
    if not scout_own:
        out.append(
            Finding(
                name,
                Severity.FAIL,
                f"none of the {len(programs)} program(s) {name}= names is scout's hook "
                f"({', '.join(programs) or ', '.join(entries)})",
                f"link scout's hook into the folder {name}= names, or add its line from {SNIPPET}",
            )
        )
    elif not any(f.severity == Severity.FAIL for f in out):
        others = len(programs) - len(scout_own)
        out.append(
            Finding(
                name,
                Severity.OK,
                f"scout's hook {', '.join(scout_own)}, executable by {who.name}"
                + (f", beside {others} other program(s)" if others else ""),
            )
        )
    return out


# -- the evidence root ------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One folder of the evidence tree as lstat saw it (for the pure `tree_findings`)."""

    path: str
    kind: str  # cluster, pending, job, nodes, results
    uid: int
    gid: int
    mode: int  # st_mode, whole
    is_dir: bool


def _entry(path: str, kind: str) -> Entry | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return Entry(path, kind, st.st_uid, st.st_gid, st.st_mode, stat.S_ISDIR(st.st_mode))


def evidence_entries(root: str, cluster: str, *, jobs: int = JOBS_CHECKED) -> list[Entry]:
    """The cluster folder, pending/, and the newest `jobs` job folders with their nodes/ and
    results/ (lstat only; never following a link below the root)."""
    from scout_slurm.errors import EvidenceError
    from scout_slurm.evidence.layout import JobFolder

    try:
        any_job = JobFolder(Path(root), cluster, 1)
    except EvidenceError:
        return []
    out = [e for e in [_entry(str(any_job.cluster_dir), "cluster")] if e]
    if not out or not out[0].is_dir:
        return out
    pending = _entry(str(any_job.pending_dir), "pending/")
    if pending:
        out.append(pending)
    with os.scandir(any_job.cluster_dir) as it:
        ids = [int(e.name) for e in it if e.name.isdigit() and int(e.name) > 0]
    for job in sorted(ids, reverse=True)[:jobs]:
        folder = JobFolder(Path(root), cluster, job)
        e = _entry(str(folder.path), "job")
        if e is None:
            continue
        out.append(e)
        if e.is_dir:
            below = ((folder.nodes_dir, "nodes/"), (folder.results_dir, "results/"))
            out += [x for x in (_entry(str(p), kind) for p, kind in below) if x]
    return out


_OWNER_OF = {
    "cluster": "root",
    "job": "root",
    "nodes/": "root",
    "pending/": "slurm",
    "results/": "slurm",
}
_MODE_OF = {"cluster": "755", "job": "755", "nodes/": "755", "pending/": "750", "results/": "755"}
_WHO_WRITES = {
    "cluster": "root hooks only",
    "job": "root hooks only",
    "nodes/": "root hooks only: the node evidence the controller trusts",
    "pending/": "the controller Epilog only: markers of incidents being handled",
    "results/": "the controller Epilog only: verdicts, actions, resume instructions",
}


def tree_findings(entries: Sequence[Entry], slurm: Runner, root: str) -> list[Finding]:
    """The evidence tree's folders owned and writable as the design says (pure): the cluster, job
    and nodes/ folders root's, pending/ and results/ SlurmUser's, none writable by group or
    others (a job's user would then forge what judges it), and all but pending/ readable and
    enterable by others (the job's tasks reach run-N/ through them, the rerun reads its
    resume-N.json in results/, `scout show` and the task read the node maps)."""
    bad: dict[str, list[tuple[str, str]]] = {}
    handed: list[str] = []
    for e in entries:
        owner = slurm.uid if _OWNER_OF[e.kind] == "slurm" else 0
        problem = ""
        if not e.is_dir:
            problem = "not a folder (a link or a file: planted?)"
        elif e.mode & 0o022:
            problem = f"writable by group or others (mode {stat.S_IMODE(e.mode):04o})"
        elif e.uid not in (owner, 0):
            problem = f"owned by uid {e.uid}"
        elif _MODE_OF[e.kind] == "755" and e.mode & 0o005 != 0o005:
            problem = (
                f"not readable and enterable by others (mode {stat.S_IMODE(e.mode):04o}): the "
                "jobs cannot reach what they read or write below it"
            )
        elif e.uid != owner and _OWNER_OF[e.kind] == "slurm":
            handed.append(e.path)
        if problem:
            bad.setdefault(e.kind, []).append((e.path, problem))
    out = []
    for kind, lines in bad.items():
        owner = slurm.name if _OWNER_OF[kind] == "slurm" else "root"
        first = lines[0][0]
        out.append(
            Finding(
                "evidence",
                Severity.FAIL,
                f"{len(lines)} {kind} folder(s) not as the design needs ({_WHO_WRITES[kind]}): "
                + "; ".join(f"{path} {problem}" for path, problem in lines[:3])
                + (f"; and {len(lines) - 3} more" if len(lines) > 3 else ""),
                f"chown {owner}: {first} && chmod {_MODE_OF[kind]} {first} (each one listed); "
                "find out who changed it",
            )
        )
    if handed:
        out.append(
            Finding(
                "evidence",
                Severity.WARN,
                f"{len(handed)} folder(s) still root's that SlurmUser should own ({handed[0]}): "
                "the controller Epilog cannot write there",
                f"chown {slurm.name}: {handed[0]} (the next Prolog of that job would hand it over)",
            )
        )
    if not out:
        jobs = sum(e.kind == "job" for e in entries)
        out.append(
            Finding(
                "evidence",
                Severity.OK,
                f"{root}: cluster folder, pending/ and {jobs} job folder(s) owned and writable "
                "as the design says"
                if entries
                else f"{root}: no cluster folder yet (the first Prolog lays it out)",
            )
        )
    return out


def root_findings(root: str, cfg_path: Path) -> list[Finding]:
    """The evidence root itself: present, a folder every job user and SlurmUser may enter, root's
    and writable by no one else, as is every folder above it (root follows the path)."""
    fix_path = f"set [evidence] root in {cfg_path} to storage every node sees"
    try:
        real, st = resolve_trusted(root, frozenset({0}), follow_last=True)
    except FileNotFoundError:
        return [
            Finding(
                "evidence",
                Severity.FAIL,
                f"evidence root {root} does not exist (unmounted?): no hook writes evidence",
                f"mkdir -p {root} && chown root:root {root} && chmod 755 {root} on the shared "
                f"storage, or {fix_path}",
            )
        ]
    except UntrustedPath as exc:
        message, fix = _split_fix(str(exc))
        return [
            Finding(
                "evidence",
                Severity.FAIL,
                f"evidence root {root}: {message}",
                fix or fix_path,
            )
        ]
    if problem := directory_problem(real, st, frozenset({0}), sticky_ok=False):
        message, fix = _split_fix(problem)
        return [
            Finding(
                "evidence",
                Severity.FAIL,
                f"evidence root: {message}: a job's user could replace the folders root writes",
                fix or fix_path,
            )
        ]
    if not st.st_mode & 0o001:
        return [
            Finding(
                "evidence",
                Severity.FAIL,
                f"evidence root {root} (mode {stat.S_IMODE(st.st_mode):04o}) cannot be entered "
                "by others: the jobs cannot write their records, nor SlurmUser read them",
                f"chmod 755 {real}",
            )
        ]
    return [
        Finding(
            "evidence",
            Severity.OK,
            f"evidence root {root}: root's, mode {stat.S_IMODE(st.st_mode):04o}, every folder "
            "above it root's",
        )
    ]


# -- NVML and the kernel log ------------------------------------------------------------------


def nvml_finding(result: dict | None, *, timed_out: bool, error: str) -> Finding:
    """What NVML answered in its bounded child (pure)."""
    from scout_slurm.hwmap import nvml

    if timed_out:
        return Finding(
            "nvml",
            Severity.FAIL,
            f"NVML did not answer within {NVML_BOUND_S:g} s: the Prolog's map stalls on its "
            "budget here",
            "check the driver (nvidia-smi; dmesg for Xid); reboot or drain the node",
        )
    if result is None:
        return Finding("nvml", Severity.FAIL, f"the NVML check failed: {error}", "see the error")
    status = result["status"]
    # the library installed on a node without a GPU driver loaded: a CPU node, not a broken one
    if status == nvml.STATUS_NO_LIBRARY or (
        status.startswith("error: nvmlInit:") and "Driver Not Loaded" in status
    ):
        return Finding("nvml", Severity.OK, "no NVIDIA driver: GPU evidence off on this host")
    if status == nvml.STATUS_NO_GPU:
        return Finding("nvml", Severity.OK, "NVML works and counts no GPU: GPU evidence off")
    if status == nvml.STATUS_OK:
        return Finding(
            "nvml",
            Severity.OK,
            f"{result['gpus']} GPU(s), driver {result['driver'] or '?'}: GPU evidence on",
        )
    return Finding(
        "nvml",
        Severity.FAIL,
        f"NVML answers with errors ({status}): the hardware map lacks what failed",
        "check the driver and the GPUs (nvidia-smi -q); drain the node if a GPU is broken",
    )


def _nvml_probe(report: Callable[..., None]) -> dict:
    from scout_slurm.hwmap import nvml

    gpus, status, _ = nvml.read_gpus()
    return {
        "status": status,
        "gpus": len(gpus),
        "driver": gpus[0].driver_version if gpus else "",
    }


def check_nvml() -> Finding:
    from scout_slurm.hooks.bounded import TIMED_OUT, run_bounded

    run = run_bounded(_nvml_probe, NVML_BOUND_S, name="site-check-nvml")
    return nvml_finding(run.result, timed_out=run.status == TIMED_OUT, error=run.error)


def check_kernel_log(cfg: SiteConfig, *, kmsg: str = "/dev/kmsg") -> Finding:
    """The node Epilog reads the kernel's log from /dev/kmsg (as root): opened here read-only,
    never blocking."""
    if cfg.drain.test_kernel_log:
        return Finding(
            "kernel-log",
            Severity.WARN,
            f"[drain] test_kernel_log = {cfg.drain.test_kernel_log!r}: a TEST DOUBLE is read "
            "instead of the kernel's log (for the lab only)",
            "remove [drain] test_kernel_log from the site config",
        )
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, PermissionError) and os.geteuid() != 0:
            return Finding(
                "kernel-log",
                Severity.WARN,
                f"{kmsg}: {exc.strerror}: this check is not root, the node Epilog is",
                "run `scout site check` as root",
            )
        return Finding(
            "kernel-log",
            Severity.FAIL,
            f"{kmsg}: {exc.strerror}: the node Epilog records no Xid or machine check",
            "give root on the nodes /dev/kmsg (a container needs it passed in; check "
            "kernel.dmesg_restrict and the security module's policy)",
        )
    try:
        os.read(fd, 8192)
    except BlockingIOError:
        pass
    except OSError as exc:
        if exc.errno != 32:  # EPIPE: a record was overwritten, the log reads
            return Finding("kernel-log", Severity.FAIL, f"{kmsg}: {exc.strerror}", "see the error")
    finally:
        os.close(fd)
    return Finding("kernel-log", Severity.OK, f"{kmsg} readable: Xid and machine checks recorded")


# -- all of it ---------------------------------------------------------------------------------


def running_daemons(proc: str = "/proc") -> frozenset[str]:
    """Which of slurmctld and slurmd run on this host (from /proc/<pid>/comm)."""
    found = set()
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            comm = Path(proc, name, "comm").read_text().strip()
        except OSError:
            continue
        if comm in ("slurmctld", "slurmd"):
            found.add(comm)
    return frozenset(found)


def _bounded_evidence(root: str, cluster: str, cfg_path: Path, slurm: Runner) -> list[Finding]:
    from scout_slurm.hooks.bounded import TIMED_OUT, run_bounded

    def probe(report: Callable[..., None]) -> list[dict]:
        found = root_findings(root, cfg_path)
        if not any(f.severity == Severity.FAIL for f in found) and cluster:
            found += tree_findings(evidence_entries(root, cluster), slurm, root)
        return [{**asdict(f), "severity": f.severity.value} for f in found]

    run = run_bounded(probe, EVIDENCE_BOUND_S, name="site-check-evidence")
    if run.status == TIMED_OUT:
        return [
            Finding(
                "evidence",
                Severity.FAIL,
                f"evidence root {root} did not answer within {EVIDENCE_BOUND_S:g} s: a hung "
                "mount? The hooks give up on it at their budgets, so no evidence is written",
                "check the mount (mount, dmesg); the hooks log evidence_root_hung meanwhile",
            )
        ]
    if run.result is None:
        return [Finding("evidence", Severity.FAIL, f"the check failed: {run.error}", "")]
    return [Finding(**{**f, "severity": Severity(f["severity"])}) for f in run.result]


def run_checks(
    config: str | Path | None,
    environ: Mapping[str, str],
    *,
    show_config: Callable[[SiteConfig], SlurmSettings],
    daemons: frozenset[str] | None = None,
) -> Report:
    """Every check, in the order an administrator fixes things. `show_config` asks Slurm (the
    door's `scontrol show config`); `daemons` which of slurmctld and slurmd run here (default:
    looked up; neither found: both checked)."""
    path = config_path(config, environ)
    findings, cfg, trusted = check_config(path)
    findings.append(observe_only_finding(cfg, trusted))
    settings: SlurmSettings | None = None
    try:
        settings = show_config(cfg)
    except ScoutError as exc:
        findings.append(
            Finding(
                "slurm",
                Severity.FAIL,
                "`scontrol show config` failed: "
                + "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()),
                "run this on a host with Slurm's commands and slurm.conf (SLURM_CONF), with "
                "slurmctld up; or set [slurm] bin_dir",
            )
        )
    here = running_daemons() if daemons is None else daemons
    if not here:
        here = frozenset({"slurmctld", "slurmd"})
    slurm_name = settings.slurm_user if settings else cfg.evidence.slurm_user
    slurm = _runner(slurm_name, settings.slurm_user_uid if settings else None)
    if settings is not None:
        findings += slurm_findings(
            settings, cfg, slurm_user_here=_runner(slurm_name, None) is not None
        )
        root = Runner("root", 0, frozenset({0}))
        for spec in HOOK_SPECS:
            entries = {
                "Prolog": settings.prolog,
                "Epilog": settings.epilog,
                "EpilogSlurmctld": settings.epilog_slurmctld,
            }[spec.parameter]
            findings += hook_findings(
                spec,
                entries,
                slurm if spec.controller else root,
                here=("slurmctld" if spec.controller else "slurmd") in here,
            )
    findings += _bounded_evidence(
        cfg.evidence.root,
        settings.cluster_name if settings else "",
        path,
        slurm or Runner(slurm_name, -1, frozenset()),
    )
    findings.append(check_nvml())
    findings.append(check_kernel_log(cfg))
    if os.geteuid() != 0:
        findings.append(
            Finding(
                "check",
                Severity.WARN,
                f"run as uid {os.geteuid()}, not root: what root alone may read was not checked",
                "run `scout site check` as root",
            )
        )
    return Report(tuple(findings))
