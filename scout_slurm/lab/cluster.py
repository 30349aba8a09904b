"""Start, stop and inspect a real Slurm cluster on one machine, for tests and demos.

Two modes:
- default (`slurmd -N`): every node is a `slurmd -N <name>` on 127.0.0.1 with its own port, so no
  traffic leaves loopback; works unprivileged; every node shares this machine's hostname.
- `netns` (opt-in, root with CAP_NET_ADMIN and CAP_SYS_ADMIN): one network namespace per node
  (`scout-<node>`) on a private bridge (`scoutbr0`, 10.213.0.1/24, where slurmctld is reached);
  each slurmd runs with its own hostname and address (10.213.0.(10+i)) and a private /etc/hosts
  (bind-mounted in a private mount namespace, so the machine's /etc/hosts is never modified).
  Before any address comes up an `unreachable` route covers the whole range, and it stays.

Everything lives under one state folder; `down()` stops only processes whose pid files are there
(or that hold files open there, or that live in the lab's own namespaces), by their ids, and
deletes only the namespaces and links recorded in lab.json. The rim functions that reach outside
are `_spawn` and `_ip`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scout_slurm.config import (
    DrainConfig,
    EpilogConfig,
    EvidenceConfig,
    RemediationConfig,
    SiteConfig,
    SlurmConfig,
    WatchdogConfig,
    render_toml,
)
from scout_slurm.errors import LabError, SlurmError
from scout_slurm.lab import DEFAULT_PORT_BASE, default_state_dir, roots
from scout_slurm.log import get_logger
from scout_slurm.slurm.door import SLURM_ROOT_ENV

log = get_logger("scout.lab")

DEFAULT_STATE_DIR = default_state_dir()
DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")
REQUIRED_BINARIES = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "scontrol": "slurm-client",
    "munged": "munge",
    "mungekey": "munge",
}
CLUSTER_NAME = "scoutlab"

MODE_LOCAL = "slurmd-N"
MODE_NETNS = "netns"
# netns mode: fixed names and range (one netns lab per machine at a time; the bridge's alias names
# the state folder that owns it, so a second lab refuses instead of taking it over)
NETNS_RANGE = "10.213.0.0/24"
NETNS_CTL_ADDR = "10.213.0.1"
NETNS_BRIDGE = "scoutbr0"
NETNS_ROUTE_METRIC = 4000
NETNS_MAX_NODES = 64
NETNS_BINARIES = ("ip", "nsenter", "unshare", "hostname", "mount", "sh")
_NODE_NAME = re.compile(r"^n\d+$")
_IP_TIMEOUT = 15.0
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
_DEFAULT_MODE_HINT = (
    "use the default mode instead (`scout lab up` without --netns, LabSpec(netns=False)): "
    "every node a `slurmd -N` on 127.0.0.1, no privileges needed"
)


@dataclass(frozen=True)
class LabSpec:
    state_dir: Path = DEFAULT_STATE_DIR
    nodes: int = 4
    port_base: int = DEFAULT_PORT_BASE
    cpus_per_node: int = 8
    hooks: bool = True
    python: str = sys.executable
    site: SiteConfig | None = None  # None: the lab's defaults (short timeouts)
    netns: bool = False  # one network namespace, hostname and address per node (needs root)
    # As a site runs: slurmctld (so EpilogSlurmctld) as a non-root SlurmUser, jobs submitted by
    # unprivileged users; slurmd stays root. Needs root to create the users; see `Lab.users`.
    site_users: bool = True
    slurm_user: str = "slurm"
    job_users: tuple[str, ...] = ("scout-u1", "scout-u2")
    # a Slurm release other than the host's ("24.11", "26.05"): its daemons, clients and munge run
    # from a Debian root of that release (lab.roots), chrooted; "" = the host's own Slurm
    slurm: str = ""

    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def mode(self) -> str:
        return MODE_NETNS if self.netns else MODE_LOCAL


def netns_of(node: str) -> str:
    return f"scout-{node}"


# a slow link: netem delay where the kernel has it, else a token bucket that limits the rate
LINK_SHAPES = (
    ("netem", "delay", "40ms"),
    ("tbf", "rate", "8mbit", "burst", "32kbit", "latency", "1s"),
)


def shape_link(node: str) -> tuple[str, str]:
    """Slow the link of netns-lab node `node` (its eth0, inside its own namespace): (what was
    applied, "") or ("", why not). Undo with `unshape_link`."""
    if shutil.which("tc") is None:
        return "", "tc (Debian package iproute2) is not installed: no link can be shaped"
    err = ""
    for shape in LINK_SHAPES:
        res = _node_qdisc(node, "add", shape)
        if res.returncode == 0:
            return " ".join(shape), ""
        err = res.stderr.strip()
    return "", f"tc could not shape {node}'s link: {err}"


def unshape_link(node: str) -> None:
    _node_qdisc(node, "del", ())


def _node_qdisc(node: str, verb: str, shape: tuple[str, ...]) -> subprocess.CompletedProcess:
    argv = [
        "ip",
        "netns",
        "exec",
        netns_of(node),
        "tc",
        "qdisc",
        verb,
        "dev",
        "eth0",
        "root",
        *shape,
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL
    )


def veth_of(node: str) -> str:
    return f"sv-{node}"


def node_address(index: int) -> str:
    """Address of node n<index> in netns mode (pure): 10.213.0.(10+i)."""
    return str(ipaddress.ip_network(NETNS_RANGE)[10 + index])


@dataclass(frozen=True)
class LabPaths:
    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def scout_conf(self) -> Path:
        return self.etc / "scout.toml"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def evidence(self) -> Path:
        return self.root / "evidence"

    @property
    def hooks(self) -> Path:
        return self.root / "hooks"

    @property
    def lab_json(self) -> Path:
        return self.root / "lab.json"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def hosts(self) -> Path:
        return self.etc / "hosts"

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"


def lab_site_config(spec: LabSpec) -> SiteConfig:
    """Defaults for the lab: evidence inside the state folder, short waits, everything enabled."""
    if spec.site is not None:
        return spec.site
    return SiteConfig(
        evidence=EvidenceConfig(root=str(LabPaths(spec.state_dir).evidence)),
        slurm=SlurmConfig(timeout_s=20.0, retries=3, retry_wait_s=1.0),
        watchdog=WatchdogConfig(
            stall_floor_s=8.0,
            stall_factor=10.0,
            poll_interval_s=0.2,
            publish_interval_s=0.5,
            steady_publish_interval_s=2.0,
            grace_s=3.0,
            startup_grace_s=300.0,
        ),
        epilog=EpilogConfig(time_budget_s=60.0, wait_for_nodes_s=5.0),
        remediation=RemediationConfig(min_confidence=0.8, max_drain_fraction=0.5, restart_limit=2),
        # the lab's injected faults are software (no root check can honestly corroborate them), and
        # its demo and loop tests show drain, requeue and resume: the old rule here, stated in
        # docs/OPERATORS.md; tests/slurm/test_drain_rule.py switches the lab to the site default
        drain=DrainConfig(drain_on="job-evidence"),
    )


def check_binaries(view: Path | None = None) -> dict[str, list[str]]:
    """argv prefix of each daemon and tool the lab starts: the host's, or `chroot VIEW
    /usr/sbin/X`.
    """
    if view is not None:
        chroot = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/chroot"
        return {
            name: [
                chroot,
                str(view),
                f"/usr/sbin/{name}" if (view / "usr/sbin" / name).exists() else f"/usr/bin/{name}",
            ]
            for name in REQUIRED_BINARIES
        }
    found, missing = {}, []
    for name, pkg in REQUIRED_BINARIES.items():
        p = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin")
        if p:
            found[name] = [p]
        else:
            missing.append(f"{name} (Debian package {pkg})")
    if missing:
        raise LabError(
            "Slurm or munge is not installed: missing "
            + ", ".join(missing)
            + ". Install with: apt-get install -y --no-install-recommends slurm-wlm slurmctld "
            "slurmd "
            "slurm-client munge"
        )
    return found


def check_netns_binaries() -> dict[str, str]:
    found, missing = {}, []
    for name in NETNS_BINARIES:
        p = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin")
        if p:
            found[name] = p
        else:
            missing.append(name)
    if missing:
        raise LabError(
            f"lab --netns needs {', '.join(missing)} (Debian packages iproute2, util-linux, "
            "hostname, "
            f"mount); {_DEFAULT_MODE_HINT}"
        )
    return found


def render_slurm_conf(
    spec: LabSpec,
    paths: LabPaths,
    *,
    controller_host: str,
    first_job_id: int,
    slurm_user: str = "root",
) -> str:
    """slurm.conf for the lab (pure)."""
    hooks = ""
    if spec.hooks:
        # as a site with programs of its own runs scout (docs/SITE-ADMIN.md): Prolog= and Epilog=
        # name a folder glob holding scout's hook beside a stand-in for the site's own (NHC, a
        # DCGM epilog), the form every release tested takes
        hooks = (
            f"Prolog={paths.hooks / 'prolog.d'}/*\nEpilog={paths.hooks / 'epilog.d'}/*\n"
            f"EpilogSlurmctld={paths.hooks / 'epilog-slurmctld'}\n"
        )
    ctl_addr = NETNS_CTL_ADDR if spec.netns else "127.0.0.1"
    lines = [
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={controller_host}({ctl_addr})",
        f"SlurmctldPort={spec.port_base}",
        f"SlurmUser={slurm_user}",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={paths.munge_socket},cred_expire=5",
        f"StateSaveLocation={paths.spool / 'ctld'}",
        f"SlurmdSpoolDir={paths.spool / 'nodes' / '%n'}",
        f"SlurmctldPidFile={paths.run / 'slurmctld.pid'}",
        f"SlurmdPidFile={paths.run / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={paths.logs / 'slurmctld.log'}",
        f"SlurmdLogFile={paths.logs / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={paths.logs / 'jobcomp.txt'}",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "PrologFlags=Alloc",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1,sched_interval=1",
        "MinJobAge=300",
        "ReturnToService=2",
        "JobRequeue=1",
        f"FirstJobId={first_job_id}",
        "KillWait=3",
        "InactiveLimit=0",
        "Waittime=0",
        "MessageTimeout=10",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=300",
        "UnkillableStepTimeout=30",
        "PrologEpilogTimeout=180",
        hooks.rstrip("\n"),
    ]
    for i, name in enumerate(spec.node_names(), start=1):
        where = (
            f"NodeHostname={name} NodeAddr={node_address(i)}"
            if spec.netns
            else f"NodeHostname={controller_host} NodeAddr=127.0.0.1"
        )
        lines.append(
            f"NodeName={name} {where} "
            f"Port={spec.port_base + i} CPUs={spec.cpus_per_node} RealMemory=4000 State=UNKNOWN"
        )
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(line for line in lines if line) + "\n"


def render_hosts(spec: LabSpec, *, controller_host: str) -> str:
    """The private /etc/hosts every netns node sees (pure): localhost, the controller on the bridge,
    every node's address. gloo resolves its own hostname to choose an interface: this file is what
    makes torch.distributed work inside the nodes."""
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{NETNS_CTL_ADDR}\t{controller_host}",
    ]
    lines += [f"{node_address(i)}\t{name}" for i, name in enumerate(spec.node_names(), start=1)]
    return "\n".join(lines) + "\n"


def netns_plan(spec: LabSpec, root: Path) -> dict:
    """What netns mode creates (pure): recorded in lab.json before anything exists, so that
    `down()` can remove exactly it, also after a crash half-way through `up()`."""
    nodes = {}
    for i, name in enumerate(spec.node_names(), start=1):
        if not _NODE_NAME.match(name):
            raise LabError(f"lab: node name {name!r} does not match {_NODE_NAME.pattern}")
        nodes[name] = {"netns": netns_of(name), "veth": veth_of(name), "addr": node_address(i)}
    return {
        "range": NETNS_RANGE,
        "bridge": NETNS_BRIDGE,
        "bridge_addr": f"{NETNS_CTL_ADDR}/24",
        "owner": _bridge_alias(root),
        "route": f"unreachable {NETNS_RANGE} metric {NETNS_ROUTE_METRIC}",
        "nodes": nodes,
    }


def _bridge_alias(root: Path) -> str:
    return f"scout-lab:{root}"


def render_hook(python: str, module: str, paths: LabPaths, *, log_name: str = "hooks.log") -> str:
    """A hook wrapper: Slurm gives hooks no PATH, and controller hooks no SLURM_CONF."""
    path = ":".join(
        [
            os.path.dirname(python),
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ]
    )
    # the hook's wall time, measured from outside it, as one JSON line after its own (the budgets'
    # measurements read it: tests/slurm/test_load.py)
    log = f"'{paths.logs}/{log_name}'"
    return (
        "#!/bin/sh\n"
        f"export PATH='{path}'\n"
        f"export SLURM_CONF='{paths.slurm_conf}'\n"
        f"export SCOUT_CONFIG='{paths.scout_conf}'\n"
        "start=$(date +%s.%N)\n"
        f"'{python}' -m {module} >>{log} 2>&1\n"
        "rc=$?\n"
        f'echo "{{\\"event\\": \\"lab.hook_time\\", \\"hook\\": \\"{module}\\", '
        f'\\"job\\": \\"$SLURM_JOB_ID\\", \\"node\\": \\"$SLURMD_NODENAME\\", '
        f'\\"start\\": $start, \\"end\\": $(date +%s.%N), \\"rc\\": $rc}}" >>{log}\n'
        "exit $rc\n"
    )


# The lab's hook folders (Prolog=HOOKS/prolog.d/*, Epilog=HOOKS/epilog.d/*): scout's hook linked
# beside a stand-in for a site's own program, which logs each run to SITE_HOOK_LOG and exits 0
SITE_HOOK = "10-site-own"
SCOUT_HOOK_LINK = "50-scout"
SITE_HOOK_LOG = "site-hooks.log"


def render_site_hook(kind: str, paths: LabPaths) -> str:
    """The stand-in for a site's own Prolog or Epilog (NHC, a DCGM epilog): one line per run."""
    return (
        "#!/bin/sh\n"
        f'echo "{kind} job=$SLURM_JOB_ID node=$SLURMD_NODENAME" '
        f">>'{paths.logs}/{SITE_HOOK_LOG}'\n"
        "exit 0\n"
    )


# the controller Epilog runs as SlurmUser: its log is a file of its own, which that user owns
CONTROLLER_HOOK_LOG = "hooks-slurmctld.log"


def _user_ids(name: str) -> tuple[int, int] | None:
    import pwd

    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    return pw.pw_uid, pw.pw_gid


def ensure_user(name: str, *, system: bool) -> tuple[int, int]:
    """The lab's users (SlurmUser, the job users), created when missing (root only). They are
    left in place by `down()`: a user is machine configuration, not a lab process."""
    ids = _user_ids(name)
    if ids is not None:
        return ids
    useradd = shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not useradd:
        raise LabError(
            f"lab: user {name!r} is missing and useradd (Debian package passwd) is not installed"
        )
    argv = [
        useradd,
        "--user-group",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin" if system else "/bin/bash",
    ]
    if system:
        argv.append("--system")
    proc = subprocess.run(
        [*argv, name], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    ids = _user_ids(name)
    if ids is None:
        raise LabError(
            f"lab: could not create user {name!r}: {' '.join(argv)} exited {proc.returncode}: "
            f"{proc.stderr.strip()[:300]}"
        )
    log.info("lab.user_created", user=name, uid=ids[0], gid=ids[1])
    return ids


def unreachable_for(user: str, python: str) -> str:
    """Why `user` cannot run this interpreter with scout importable, or "" when it can (both the
    controller hook as SlurmUser and the jobs as their users run it)."""
    runuser = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not runuser:
        return "runuser (Debian package util-linux) is not installed"
    try:
        proc = subprocess.run(
            [runuser, "-u", user, "--", python, "-c", "import scout_slurm"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            cwd="/",
        )
    except subprocess.TimeoutExpired:
        return f"{python} did not start as {user} within 60 s"
    if proc.returncode == 0:
        return ""
    blocked = [
        str(p)
        for p in [*reversed(Path(python).parents), Path(python)]
        if p.exists() and not os.stat(p).st_mode & 0o001
    ]
    return (
        f"{python} cannot be run as {user}: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}"
        + (f"; not searchable by others: {', '.join(blocked[:3])}" if blocked else "")
        + " (make the virtual environment from a Python all users can run, e.g. /usr/bin/python3, "
        "in a folder they can read)"
    )


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _processes_using(root: Path) -> list[int]:
    """Pids of lab daemons that hold a file, cwd or socket under `root` (ours, by construction)."""
    me = os.getpid()
    rootstr = str(root.resolve())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if _comm(pid) not in DAEMONS:
            continue
        try:
            cmdline = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        hit = rootstr in cmdline
        if not hit:
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(rootstr):
                            hit = True
                            break
                    except OSError:
                        continue
            except OSError:
                continue
        if hit:
            found.append(pid)
    return found


def _processes_in_root(view: Path) -> list[int]:
    """Pids whose root directory is `view` (they were chrooted into this lab's root)."""
    target = str(view.resolve())
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.readlink(f"/proc/{entry}/root") == target:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def free_port_base(count: int, lo: int = 20000, hi: int = 30000) -> int:
    """A block of `count` free local ports in [lo, hi) for a lab's slurmctld and slurmds. Labs that
    run
    side by side (tests, benchmarks, acceptance) use separate ranges, below the ephemeral ports."""
    import random

    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(lo, hi, 10)
        if not any(_port_in_use(port) for port in range(base, base + count)):
            return base
    raise LabError(
        f"no free block of {count} local ports in {lo}..{hi}; give the lab a port base yourself"
    )


def _port_in_use(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port (SO_REUSEADDR: a TIME_WAIT leftover is not a
    clash).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _kill_and_wait(pids: list[int], *, timeout: float = 5.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.05)


# -- netns mode: the network, through `ip` with argv lists only --------------------------------


def _ip(ip: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """One `ip` command (argv list, timeout); a failure becomes a LabError that names it."""
    argv = [ip, *args]
    try:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_IP_TIMEOUT,
            check=check,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.CalledProcessError as exc:
        raise LabError(
            f"lab --netns: `{' '.join(argv)}` exited {exc.returncode}: "
            f"{(exc.stderr or '').strip()[:500]}"
        ) from None
    except subprocess.TimeoutExpired:
        raise LabError(
            f"lab --netns: `{' '.join(argv)}` did not finish within {_IP_TIMEOUT:.0f} s"
        ) from None


def _ip_json(ip: str, *args: str) -> list:
    out = _ip(ip, "-j", *args).stdout.strip()
    try:
        return json.loads(out) if out else []
    except ValueError:
        raise LabError(
            f"lab --netns: cannot read the JSON of `ip -j {' '.join(args)}`: {out[:200]!r}"
        ) from None


def _links(ip: str) -> dict[str, dict]:
    return {link["ifname"]: link for link in _ip_json(ip, "link", "show")}


def _namespaces(ip: str) -> set[str]:
    out = _ip(ip, "netns", "list").stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _check_netns_privileges() -> None:
    caps = _effective_caps()
    lacking = [
        name
        for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
        if not caps >> bit & 1
    ]
    if lacking:
        raise LabError(
            "lab --netns needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN (network "
            "namespaces, a bridge, "
            f"veth pairs, a private /etc/hosts mount); this process lacks {' and '.join(lacking)}; "
            + _DEFAULT_MODE_HINT
        )


def _range_conflicts(ip: str) -> list[str]:
    """Addresses and routes of this machine inside the lab's range that are not the lab's own
    `unreachable` route: the lab never touches them, it refuses to start instead."""
    net = ipaddress.ip_network(NETNS_RANGE)
    found = []
    for link in _ip_json(ip, "-4", "addr", "show"):
        for a in link.get("addr_info", []):
            try:
                if ipaddress.ip_address(a.get("local", "")) in net:
                    found.append(
                        f"address {a['local']}/{a.get('prefixlen')} on {link.get('ifname')}"
                    )
            except ValueError:
                continue
    for r in _ip_json(ip, "-4", "route", "show", "table", "all"):
        dst = r.get("dst", "")
        if dst == "default":
            continue
        try:
            rnet = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if r.get("type") == "unreachable" and rnet == net:
            continue
        if rnet.subnet_of(net):
            found.append(
                f"route {r.get('type', 'unicast')} {dst} dev {r.get('dev', '-')} "
                f"table {r.get('table', 'main')}"
            )
    return found


def _ensure_unreachable_route(ip: str) -> None:
    """Install `unreachable 10.213.0.0/24 metric 4000` unless it is there. It is NEVER removed (see
    `_netns_down`): while the bridge is up its connected route (metric 0) wins; once the bridge is
    gone, a stale client (a retrying srun, a leftover gloo peer) would otherwise send packets for
    the range out of the default route, off this machine."""
    for r in _ip_json(ip, "-4", "route", "show", "table", "main", "type", "unreachable"):
        if r.get("dst") == NETNS_RANGE and int(r.get("metric", 0)) == NETNS_ROUTE_METRIC:
            return
    try:
        _ip(ip, "route", "add", "unreachable", NETNS_RANGE, "metric", str(NETNS_ROUTE_METRIC))
    except LabError as exc:
        raise LabError(
            f"{exc}; without this safety route the lab brings up no address; " + _DEFAULT_MODE_HINT
        ) from None


def _netns_up(ip: str, plan: dict) -> None:
    """Route, bridge, one namespace and veth pair per node. The caller removes a half-built
    network.
    """
    _ensure_unreachable_route(ip)
    nodes = plan["nodes"]
    first = next(iter(nodes.values()))
    proc = subprocess.run(
        [ip, "netns", "add", first["netns"]],
        capture_output=True,
        text=True,
        timeout=_IP_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise LabError(
            "lab --netns: this machine refuses network namespaces (`ip netns add "
            f"{first['netns']}` "
            f"exited {proc.returncode}: {proc.stderr.strip()[:300]}); " + _DEFAULT_MODE_HINT
        )
    bridge = plan["bridge"]
    _ip(ip, "link", "add", bridge, "type", "bridge")
    _ip(ip, "link", "set", "dev", bridge, "alias", plan["owner"])
    _ip(ip, "link", "set", "dev", bridge, "addrgenmode", "none")  # no IPv6 link-local chatter
    _ip(ip, "addr", "add", plan["bridge_addr"], "dev", bridge)
    _ip(ip, "link", "set", "dev", bridge, "up")
    for n in nodes.values():
        ns, veth = n["netns"], n["veth"]
        if ns != first["netns"]:
            _ip(ip, "netns", "add", ns)
        # the inner end is created inside the namespace, already named eth0
        _ip(ip, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip(ip, "link", "set", "dev", veth, "addrgenmode", "none")
        _ip(ip, "link", "set", "dev", veth, "master", bridge)
        _ip(ip, "link", "set", "dev", veth, "up")
        _ip(ip, "-n", ns, "link", "set", "dev", "eth0", "addrgenmode", "none")
        _ip(ip, "-n", ns, "addr", "add", f"{n['addr']}/24", "dev", "eth0")
        _ip(ip, "-n", ns, "link", "set", "dev", "lo", "up")
        _ip(ip, "-n", ns, "link", "set", "dev", "eth0", "up")


def _netns_down(ip: str, plan: dict) -> list[int]:
    """Kill what still lives in the lab's namespaces (ours by construction: the lab created them),
    then delete its veths, namespaces and bridge. Only what `plan` records, and only while the
    bridge is absent or carries this lab's alias. Returns the pids killed."""
    links = _links(ip)
    bridge = links.get(plan["bridge"])
    if bridge is not None and bridge.get("ifalias", "") != plan["owner"]:
        log.warning("lab.netns_not_ours", bridge=plan["bridge"], owner=bridge.get("ifalias", ""))
        return []
    namespaces = _namespaces(ip)
    killed: list[int] = []
    for n in plan["nodes"].values():
        if n["netns"] in namespaces:
            out = _ip(ip, "netns", "pids", n["netns"]).stdout
            pids = [int(x) for x in out.split() if x.isdigit() and int(x) != os.getpid()]
            if pids:
                _kill_and_wait(pids)
                killed += pids
    for n in plan["nodes"].values():
        if n["veth"] in links:
            _ip(ip, "link", "del", "dev", n["veth"])  # takes its peer (eth0 inside) with it
    for n in plan["nodes"].values():
        if n["netns"] in namespaces:
            _ip(ip, "netns", "del", n["netns"])
    if bridge is not None:
        _ip(ip, "link", "del", "dev", plan["bridge"])
    # The `unreachable` route for the range is deliberately left in place, forever: without it,
    # once the bridge is gone, a client that still holds an address of the range (a retrying
    # srun, a stale gloo peer, a cached NodeAddr) would send its packets out of the default route
    # to the real network. It costs nothing while no lab runs and is what the next `up` expects.
    return killed


class Lab:
    """One lab cluster, identified by its state folder."""

    def __init__(self, spec: LabSpec) -> None:
        self.spec = spec
        self.paths = LabPaths(Path(spec.state_dir).resolve())

    @property
    def users(self) -> dict:
        """As whom this lab runs: {"slurm_user": ..., "job_users": [...], "why_root": ...}, read
        from
        lab.json (what `up()` could set up, not only what the spec asked for)."""
        info = self._read_lab_json().get("users")
        if isinstance(info, dict):
            return info
        return {"slurm_user": "root", "job_users": [], "why_root": "the lab is not up"}

    @property
    def job_user(self) -> str:
        """The unprivileged user that submits the lab's jobs ("" where the lab runs them as
        root).
        """
        users = self.users.get("job_users") or []
        return users[0] if users else ""

    def _site_users(self) -> dict:
        """SlurmUser and the job users for this `up()`, created if missing; falls back to root, with
        the reason recorded and logged, where that is not possible here."""
        spec = self.spec
        if not spec.site_users:
            return {"slurm_user": "root", "job_users": [], "why_root": "LabSpec(site_users=False)"}
        if os.geteuid() != 0:
            me = __import__("pwd").getpwuid(os.geteuid()).pw_name
            return {
                "slurm_user": me,
                "job_users": [],
                "why_root": "not root: the lab runs as its own user",
            }
        blocked = [
            str(p)
            for p in reversed(self.paths.root.parents)
            if p.exists() and not os.stat(p).st_mode & 0o001
        ]
        if blocked:
            why = (
                f"the state folder {self.paths.root} is under {blocked[-1]}, which other "
                "users cannot enter: "
                "slurmctld as SlurmUser and the jobs' users could not reach it"
            )
            log.warning(
                "lab.site_users_unavailable",
                reason=why,
                consequence="slurmctld and the jobs run as root",
            )
            return {"slurm_user": "root", "job_users": [], "why_root": why}
        ensure_user(spec.slurm_user, system=True)
        for user in spec.job_users:
            ensure_user(user, system=False)
        for user in (spec.slurm_user, *spec.job_users[:1]):
            why = unreachable_for(user, spec.python)
            if why:
                log.warning(
                    "lab.site_users_unavailable",
                    reason=why,
                    consequence="slurmctld and the jobs run as root in this lab",
                )
                return {"slurm_user": "root", "job_users": [], "why_root": why}
        return {"slurm_user": spec.slurm_user, "job_users": list(spec.job_users), "why_root": ""}

    # -- environment for clients -------------------------------------------------------
    def client_env(self) -> dict[str, str]:
        """What a Slurm client needs to reach this lab; with another release, SCOUT_SLURM_ROOT makes
        the door run that root's clients."""
        env = dict(os.environ)
        env.pop(SLURM_ROOT_ENV, None)
        if self._read_lab_json().get("slurm"):
            env[SLURM_ROOT_ENV] = str(self.paths.rootfs)
        env["SLURM_CONF"] = str(self.paths.slurm_conf)
        env["SCOUT_CONFIG"] = str(self.paths.scout_conf)
        env["PATH"] = os.path.dirname(self.spec.python) + ":" + env.get("PATH", "/usr/bin:/bin")
        return env

    def exports(self) -> dict[str, str]:
        """The variables a shell needs to use this lab (what `scout lab up` prints as exports)."""
        env = self.client_env()
        keys = ("SCOUT_CONFIG", "SLURM_CONF", SLURM_ROOT_ENV)
        return {k: env[k] for k in keys if k in env}

    def slurm_version(self) -> str:
        """`sinfo --version` of the running lab ("slurm 24.11.5"), through the door."""
        from scout_slurm.slurm.door import run_slurm

        return run_slurm("sinfo", ["--version"], timeout=20, env=self.client_env()).stdout.strip()

    # -- lifecycle ----------------------------------------------------------------------
    def up(self, *, wait_s: float = 60.0) -> None:
        version = roots.check_version(self.spec.slurm)
        root = roots.ensure_root(version) if version else None
        bins = check_binaries() if root is None else {}
        net_bins: dict[str, str] = {}
        if self.spec.netns:
            net_bins = check_netns_binaries()
            _check_netns_privileges()
            if not 1 <= self.spec.nodes <= NETNS_MAX_NODES:
                raise LabError(
                    f"lab --netns: at most {NETNS_MAX_NODES} nodes (got {self.spec.nodes})"
                )
            if len(_bridge_alias(self.paths.root)) > 250:
                raise LabError(f"lab --netns: state folder path too long: {self.paths.root}")
        ran_before = self._read_lab_json()
        self.down()
        p = self.paths
        if ran_before and ran_before.get("slurm", "") != version and p.spool.exists():
            # an older slurmctld cannot read a newer one's state files (it exits at once): another
            # release on this state folder starts from empty state
            shutil.rmtree(p.spool)
        # a daemon that cannot bind dies after forking, and our clients would reach whatever
        # holds the port instead: refuse up front
        ports = range(self.spec.port_base, self.spec.port_base + self.spec.nodes + 1)
        busy = [port for port in ports if _port_in_use(port)]
        if busy:
            raise LabError(
                f"lab: port(s) {', '.join(map(str, busy))} on 127.0.0.1 are in use by another "
                f"program (another lab?); choose another --port-base than {self.spec.port_base}"
            )
        for d in (
            p.etc,
            p.munge_dir,
            p.run,
            p.logs,
            p.spool / "ctld",
            p.evidence,
            p.hooks,
            p.work,
            p.root / "cgroup-empty",
        ):
            d.mkdir(parents=True, exist_ok=True)
        for name in self.spec.node_names():
            (p.spool / "nodes" / name).mkdir(parents=True, exist_ok=True)
        if root is not None:
            self._write_lab_json(
                None, started=None, slurm=version
            )  # down() unmounts even after a crash here
            binds = roots.python_paths(self.spec.python)
            if not p.root.is_relative_to("/tmp"):
                binds = roots.outermost([*binds, p.root])
            if self.spec.netns:
                p.hosts.write_text(
                    render_hosts(self.spec, controller_host=socket.gethostname().split(".")[0])
                )
            roots.mount_view(
                root,
                p.rootfs,
                binds=binds,
                hosts=p.hosts if self.spec.netns else Path("/etc/hosts"),
                python=self.spec.python,
            )
            bins = check_binaries(p.rootfs)
        os.chmod(p.root, 0o755)
        os.chmod(p.munge_dir, 0o711)  # munge clients must reach the socket: o+x
        os.chmod(p.evidence, 0o755)
        os.chmod(p.work, 0o1777)
        users = self._site_users()
        slurm_ids = _user_ids(users["slurm_user"]) or (os.geteuid(), os.getegid())
        # what slurmctld (as SlurmUser) writes: its state, its logs, its pid file, the controller
        # hook's log
        for path in (p.spool / "ctld",):
            os.chown(path, *slurm_ids)
        for name in ("slurmctld.log", "jobcomp.txt", CONTROLLER_HOOK_LOG):
            f = p.logs / name
            f.touch()
            os.chown(f, *slurm_ids)
        os.chown(p.run, *slurm_ids)
        os.chmod(p.run, 0o755)
        host = socket.gethostname().split(".")[0]
        conf = render_slurm_conf(
            self.spec,
            p,
            controller_host=host,
            first_job_id=self._next_job_id(),
            slurm_user=users["slurm_user"],
        )
        p.slurm_conf.write_text(conf)
        (p.etc / "cgroup.conf").write_text(
            f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={p.root / 'cgroup-empty'}\n"
            "ConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n"
        )
        site = lab_site_config(self.spec)
        site = dataclasses.replace(
            site, evidence=dataclasses.replace(site.evidence, slurm_user=users["slurm_user"])
        )
        p.scout_conf.write_text(render_toml(site))
        plan = None
        if self.spec.netns:
            p.hosts.write_text(render_hosts(self.spec, controller_host=host))
            plan = self._netns_setup(net_bins["ip"])
        for name, module in (
            ("prolog", "scout_slurm.hooks.prolog"),
            ("epilog", "scout_slurm.hooks.epilog"),
            ("epilog-slurmctld", "scout_slurm.hooks.controller"),
        ):
            hook = p.hooks / name
            hook.write_text(
                render_hook(
                    self.spec.python,
                    module,
                    p,
                    log_name=CONTROLLER_HOOK_LOG if name == "epilog-slurmctld" else "hooks.log",
                )
            )
            hook.chmod(0o755)
        for kind in ("prolog", "epilog"):
            folder = p.hooks / f"{kind}.d"
            folder.mkdir(exist_ok=True)
            site_hook = folder / SITE_HOOK
            site_hook.write_text(render_site_hook(kind, p))
            site_hook.chmod(0o755)
            scout_link = folder / SCOUT_HOOK_LINK
            scout_link.unlink(missing_ok=True)
            scout_link.symlink_to(p.hooks / kind)
        key = p.munge_dir / "munge.key"
        if not key.exists():
            subprocess.run(
                [*bins["mungekey"], "--create", f"--keyfile={key}", "--force"],
                check=True,
                capture_output=True,
                timeout=30,
            )
        os.chmod(key, 0o400)
        self._spawn(
            [
                *bins["munged"],
                "--force",
                f"--socket={p.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={p.run / 'munged.pid'}",
                f"--log-file={p.logs / 'munged.log'}",
                f"--seed-file={p.munge_dir / 'munged.seed'}",
            ],
            "munged",
        )
        self._wait_for(lambda: p.munge_socket.exists(), 10, "munged socket")
        os.chmod(p.munge_socket, 0o777)
        env = self.client_env()
        env.pop(SLURM_ROOT_ENV, None)  # the daemons run inside the root already
        self._spawn([*bins["slurmctld"], "-c", "-f", str(p.slurm_conf)], "slurmctld", env=env)
        self._wait_for(
            lambda: _read_pid(p.run / "slurmctld.pid") is not None, 15, "slurmctld pid file"
        )
        for name in self.spec.node_names():
            if plan is not None:
                argv = self._netns_slurmd_argv(name, plan, bins["slurmd"], net_bins)
            else:
                argv = [*bins["slurmd"], "-N", name, "-f", str(p.slurm_conf)]
            self._spawn(argv, f"slurmd {name}", env=env)
        self._users = users
        self._write_lab_json(plan, started=time.time(), slurm=version)
        self._wait_for(self._all_idle, wait_s, "all nodes idle")
        log.info(
            "lab.up",
            state_dir=str(p.root),
            nodes=self.spec.node_names(),
            mode=self.spec.mode,
            slurm_user=users["slurm_user"],
            job_users=users["job_users"],
        )

    def _write_lab_json(self, plan: dict | None, *, started: float | None, slurm: str = "") -> None:
        p = self.paths
        data = {
            "nodes": self.spec.node_names(),
            "port_base": self.spec.port_base,
            "slurm_conf": str(p.slurm_conf),
            "mode": self.spec.mode,
            "started": started,
        }
        if slurm:
            data["slurm"] = slurm
            data["rootfs"] = str(p.rootfs)
        if getattr(self, "_users", None):
            data["users"] = self._users
        if plan is not None:
            data["netns"] = plan
        tmp = p.lab_json.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(p.lab_json)

    def _read_lab_json(self) -> dict:
        try:
            data = json.loads(self.paths.lab_json.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _netns_setup(self, ip: str) -> dict:
        """Refuse on anything of the range or the names that is not ours; record the plan; build
        it.
        """
        plan = netns_plan(self.spec, self.paths.root)
        links, namespaces = _links(ip), _namespaces(ip)
        taken = []
        if plan["bridge"] in links:
            taken.append(
                f"link {plan['bridge']} (owner: "
                f"{links[plan['bridge']].get('ifalias') or 'unknown'})"
            )
        taken += [f"link {n['veth']}" for n in plan["nodes"].values() if n["veth"] in links]
        taken += [
            f"namespace {n['netns']}" for n in plan["nodes"].values() if n["netns"] in namespaces
        ]
        taken += _range_conflicts(ip)
        if taken:
            raise LabError(
                "lab --netns: already present on this machine and not this lab's to touch: "
                + "; ".join(taken)
                + ". Another netns lab? Stop it with `scout lab down --state-dir DIR` "
                "(the owner above names DIR), or " + _DEFAULT_MODE_HINT
            )
        # recorded before anything exists: a crash half-way leaves down() the full list
        self._write_lab_json(plan, started=None)
        try:
            _netns_up(ip, plan)
        except BaseException:
            try:
                _netns_down(ip, plan)
            except LabError as exc:
                log.warning("lab.netns_cleanup_failed", error=str(exc))
            raise
        return plan

    def _netns_slurmd_argv(
        self, name: str, plan: dict, slurmd: list[str], net_bins: dict[str, str]
    ) -> list[str]:
        """nsenter into the node's network namespace, then a private UTS and mount namespace where
        the
        hostname is set and the lab's hosts file is bind-mounted over /etc/hosts (the machine's own
        file is never modified: the mount exists only in that mount namespace, private
        propagation)."""
        p = self.paths
        if not _NODE_NAME.match(name) or name not in plan["nodes"]:
            raise LabError(f"lab: refusing node name {name!r}")
        for path in (p.hosts, p.slurm_conf):
            if not path.resolve().is_relative_to(p.root):
                raise LabError(f"lab: {path} is not under the state folder {p.root}")
        q = shlex.quote
        script = (
            f"{q(net_bins['hostname'])} {q(name)} && "
            f"{q(net_bins['mount'])} --bind {q(str(p.hosts))} /etc/hosts && "
            f"exec {shlex.join(slurmd)} -N {q(name)} -f {q(str(p.slurm_conf))}"
        )
        return [
            net_bins["nsenter"],
            f"--net=/run/netns/{plan['nodes'][name]['netns']}",
            net_bins["unshare"],
            "--uts",
            "--mount",
            "--propagation",
            "private",
            net_bins["sh"],
            "-c",
            script,
        ]

    def down(self) -> list[int]:
        """Stop every lab process; returns the pids that were stopped."""
        p = self.paths
        if (
            p.slurm_conf.exists()
            and _read_pid(p.run / "slurmctld.pid")
            and _pid_alive(_read_pid(p.run / "slurmctld.pid"))
        ):
            try:
                self._cancel_all_jobs()
            except Exception:  # noqa: BLE001 - cancelling is a courtesy; stopping the daemons must happen
                pass
        pids: list[int] = []
        if p.run.exists():
            for pidfile in sorted(p.run.glob("*.pid")):
                pid = _read_pid(pidfile)
                if pid and _pid_alive(pid) and _comm(pid) in DAEMONS:
                    pids.append(pid)
        # slurmd first, then the controller, then munge: each still has its peers while stopping
        order = {"slurmstepd": 0, "slurmd": 1, "slurmctld": 2, "munged": 3}
        pids.sort(key=lambda pid: order.get(_comm(pid), 9))
        stopped = list(pids)
        for group in (("slurmd", "slurmstepd"), ("slurmctld",), ("munged",)):
            _kill_and_wait([pid for pid in pids if _comm(pid) in group])
        if p.root.exists():
            leftovers = _processes_using(p.root)
            if leftovers:
                _kill_and_wait(leftovers)
                stopped += leftovers
        if p.rootfs.exists():
            # whatever runs chrooted in this lab's root (job steps, their children) is the lab's
            inside = _processes_in_root(p.rootfs)
            if inside:
                _kill_and_wait(inside)
                stopped += inside
        info = self._read_lab_json()
        plan = info.get("netns")
        if isinstance(plan, dict) and not info.get("network_removed"):
            ip = shutil.which(
                "ip", path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin"
            )
            if not ip:
                raise LabError(
                    f"lab down: {p.root} ran in netns mode and `ip` (iproute2) is missing: "
                    "cannot remove its namespaces and bridge"
                )
            stopped += _netns_down(ip, plan)
            info["network_removed"] = time.time()
            tmp = p.lab_json.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(info, indent=1))
            tmp.replace(p.lab_json)
        if roots.mounts_under(p.rootfs):
            roots.unmount_view(p.rootfs)
        if p.run.exists():
            for pidfile in p.run.glob("*.pid"):
                pidfile.unlink(missing_ok=True)
        if stopped:
            log.info("lab.down", stopped=stopped)
        return stopped

    def status(self) -> dict:
        p = self.paths
        daemons = {}
        if p.run.exists():
            for pidfile in sorted(p.run.glob("*.pid")):
                pid = _read_pid(pidfile)
                daemons[pidfile.stem] = {"pid": pid, "alive": bool(pid and _pid_alive(pid))}
        nodes = []
        if daemons.get("slurmctld", {}).get("alive"):
            try:
                from scout_slurm.slurm import ops

                nodes = [
                    {"name": n.name, "state": n.state_text, "reason": n.reason}
                    for n in ops.list_nodes(timeout=10, env=self.client_env())
                ]
            except SlurmError as exc:
                nodes = [{"error": str(exc)}]
        info = self._read_lab_json()
        out = {
            "state_dir": str(p.root),
            "slurm_conf": str(p.slurm_conf),
            "daemons": daemons,
            "nodes": nodes,
            "mode": info.get("mode", MODE_LOCAL),
        }
        plan = info.get("netns")
        if isinstance(plan, dict):
            out["network"] = self._netns_status(plan, removed=bool(info.get("network_removed")))
        return out

    @staticmethod
    def _netns_status(plan: dict, *, removed: bool) -> dict:
        net = {
            "range": plan.get("range"),
            "controller": plan.get("bridge_addr"),
            "bridge": plan.get("bridge"),
            "removed": removed,
            "nodes": {
                name: {"netns": n["netns"], "addr": n["addr"]}
                for name, n in plan.get("nodes", {}).items()
            },
        }
        ip = shutil.which("ip", path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin")
        try:
            if not ip:
                raise LabError("`ip` is missing")
            links, namespaces = _links(ip), _namespaces(ip)
            net["bridge_present"] = plan.get("bridge") in links
            for name, n in plan.get("nodes", {}).items():
                net["nodes"][name]["present"] = n["netns"] in namespaces and n["veth"] in links
        except LabError as exc:
            net["error"] = str(exc)
        return net

    def running_pids(self) -> list[int]:
        """Every live lab process: by pid file and by files held under the state folder."""
        pids = set()
        if self.paths.run.exists():
            for pidfile in self.paths.run.glob("*.pid"):
                pid = _read_pid(pidfile)
                if pid and _pid_alive(pid):
                    pids.add(pid)
        if self.paths.root.exists():
            pids.update(_processes_using(self.paths.root))
        return sorted(pids)

    # -- helpers ------------------------------------------------------------------------
    def _spawn(self, argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, env=env, stdin=subprocess.DEVNULL
        )
        if proc.returncode != 0:
            raise LabError(
                f"could not start {what}: {' '.join(argv)} exited {proc.returncode}: "
                f"{proc.stderr.strip()[:1000]} (see {self.paths.logs})"
            )

    def _wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except Exception:  # noqa: BLE001 - a daemon that is still starting may not answer yet
                pass
            time.sleep(0.1)
        raise LabError(
            f"lab: timed out after {timeout:.0f} s waiting for {what}; logs in {self.paths.logs}"
        )

    def _all_idle(self) -> bool:
        from scout_slurm.slurm import ops

        nodes = ops.list_nodes(timeout=5, env=self.client_env())
        names = {n.name for n in nodes if n.is_idle}
        return names >= set(self.spec.node_names())

    def _cancel_all_jobs(self) -> None:
        from scout_slurm.slurm import ops

        env = self.client_env()
        try:
            jobs = [j for j in ops.list_jobs(timeout=5, env=env) if not j.is_finished]
            for job in jobs:
                ops.cancel_job(job.job_id, timeout=5, env=env)
            deadline = time.monotonic() + 10
            while jobs and time.monotonic() < deadline:
                jobs = [j for j in ops.list_jobs(timeout=5, env=env) if not j.is_finished]
                time.sleep(0.2)
        except SlurmError as exc:
            log.warning("lab.cancel_failed", error=str(exc))

    def _next_job_id(self) -> int:
        """Job ids continue above any already in the evidence folder, so evidence never collides.
        A fresh lab starts at its port base: labs side by side on one machine (parallel test
        sessions) then differ in job ids, hence in scout's /dev/shm folders and MASTER_PORTs."""
        top = self.spec.port_base - 1
        cluster_dir = self.paths.evidence / CLUSTER_NAME
        if cluster_dir.is_dir():
            for entry in cluster_dir.iterdir():
                if entry.name.isdigit():
                    top = max(top, int(entry.name))
        jobcomp = self.paths.logs / "jobcomp.txt"
        if jobcomp.exists():
            for line in jobcomp.read_text(errors="replace").splitlines():
                if line.startswith("JobId="):
                    try:
                        top = max(top, int(line.split()[0].split("=", 1)[1]))
                    except ValueError:
                        pass
        return top + 1
