"""Start, stop and inspect a real Slurm cluster on one machine, for tests and demos.

Every node is a `slurmd -N <name>` on 127.0.0.1 with its own port, so no traffic leaves loopback.
Everything lives under one state folder; `down()` stops only processes whose pid files are there
(or that hold files open there), by their ids. The rim function that reaches outside is `_spawn`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scout_slurm.config import EpilogConfig, EvidenceConfig, RemediationConfig, SiteConfig, SlurmConfig, WatchdogConfig, render_toml
from scout_slurm.errors import LabError, SlurmError
from scout_slurm.log import get_logger

log = get_logger("scout.lab")

DEFAULT_STATE_DIR = Path(os.environ.get("SCOUT_LAB_DIR", "/tmp/scout-lab"))
DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")
REQUIRED_BINARIES = {
    "slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "scontrol": "slurm-client",
    "munged": "munge", "mungekey": "munge",
}
CLUSTER_NAME = "scoutlab"


@dataclass(frozen=True)
class LabSpec:
    state_dir: Path = DEFAULT_STATE_DIR
    nodes: int = 4
    port_base: int = 16800
    cpus_per_node: int = 8
    hooks: bool = True
    python: str = sys.executable
    site: SiteConfig | None = None  # None: the lab's defaults (short timeouts)

    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]


@dataclass(frozen=True)
class LabPaths:
    root: Path

    @property
    def etc(self) -> Path: return self.root / "etc"
    @property
    def slurm_conf(self) -> Path: return self.etc / "slurm.conf"
    @property
    def scout_conf(self) -> Path: return self.etc / "scout.toml"
    @property
    def munge_dir(self) -> Path: return self.root / "munge"
    @property
    def munge_socket(self) -> Path: return self.munge_dir / "munge.socket"
    @property
    def run(self) -> Path: return self.root / "run"
    @property
    def logs(self) -> Path: return self.root / "log"
    @property
    def spool(self) -> Path: return self.root / "spool"
    @property
    def evidence(self) -> Path: return self.root / "evidence"
    @property
    def hooks(self) -> Path: return self.root / "hooks"
    @property
    def lab_json(self) -> Path: return self.root / "lab.json"
    @property
    def work(self) -> Path: return self.root / "work"


def lab_site_config(spec: LabSpec) -> SiteConfig:
    """Defaults for the lab: evidence inside the state folder, short waits, everything enabled."""
    if spec.site is not None:
        return spec.site
    return SiteConfig(
        evidence=EvidenceConfig(root=str(LabPaths(spec.state_dir).evidence)),
        slurm=SlurmConfig(timeout_s=20.0, retries=3, retry_wait_s=1.0),
        watchdog=WatchdogConfig(stall_floor_s=8.0, stall_factor=10.0, poll_interval_s=0.2,
                                publish_interval_s=0.5, grace_s=3.0, startup_grace_s=300.0),
        epilog=EpilogConfig(time_budget_s=60.0, wait_for_nodes_s=5.0),
        remediation=RemediationConfig(min_confidence=0.8, max_drain_fraction=0.5, restart_limit=2),
    )


def check_binaries() -> dict[str, str]:
    found, missing = {}, []
    for name, pkg in REQUIRED_BINARIES.items():
        p = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin")
        if p:
            found[name] = p
        else:
            missing.append(f"{name} (Debian package {pkg})")
    if missing:
        raise LabError("Slurm or munge is not installed: missing " + ", ".join(missing) +
                       ". Install with: apt-get install -y --no-install-recommends slurm-wlm slurmctld slurmd "
                       "slurm-client munge")
    return found


def render_slurm_conf(spec: LabSpec, paths: LabPaths, *, controller_host: str, first_job_id: int) -> str:
    """slurm.conf for the lab (pure)."""
    hooks = ""
    if spec.hooks:
        hooks = (f"Prolog={paths.hooks / 'prolog'}\nEpilog={paths.hooks / 'epilog'}\n"
                 f"EpilogSlurmctld={paths.hooks / 'epilog-slurmctld'}\n")
    lines = [
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={controller_host}(127.0.0.1)",
        f"SlurmctldPort={spec.port_base}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={paths.munge_socket},cred_expire=5",
        f"StateSaveLocation={paths.spool / 'ctld'}",
        f"SlurmdSpoolDir={paths.spool / 'nodes' / '%n'}",
        f"SlurmctldPidFile={paths.run / 'slurmctld.pid'}",
        f"SlurmdPidFile={paths.run / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={paths.logs / 'slurmctld.log'}",
        f"SlurmdLogFile={paths.logs / 'slurmd-%n.log'}",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt", f"JobCompLoc={paths.logs / 'jobcomp.txt'}",
        "MpiDefault=none", "SwitchType=switch/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "PrologFlags=Alloc",
        "SchedulerType=sched/backfill", "SchedulerParameters=bf_interval=1,sched_interval=1",
        "MinJobAge=300", "ReturnToService=2", "JobRequeue=1",
        f"FirstJobId={first_job_id}",
        "KillWait=3", "InactiveLimit=0", "Waittime=0", "MessageTimeout=10",
        "SlurmctldTimeout=30", "SlurmdTimeout=300", "UnkillableStepTimeout=30",
        "PrologEpilogTimeout=180",
        hooks.rstrip("\n"),
    ]
    for i, name in enumerate(spec.node_names(), start=1):
        lines.append(f"NodeName={name} NodeHostname={controller_host} NodeAddr=127.0.0.1 "
                     f"Port={spec.port_base + i} CPUs={spec.cpus_per_node} RealMemory=4000 State=UNKNOWN")
    lines.append(f"PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(line for line in lines if line) + "\n"


def render_hook(python: str, module: str, paths: LabPaths) -> str:
    """A hook wrapper: Slurm gives hooks no PATH, and controller hooks no SLURM_CONF."""
    path = ":".join([os.path.dirname(python), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    return ("#!/bin/sh\n"
            f"export PATH='{path}'\n"
            f"export SLURM_CONF='{paths.slurm_conf}'\n"
            f"export SCOUT_CONFIG='{paths.scout_conf}'\n"
            f"exec '{python}' -m {module} >>'{paths.logs}/hooks.log' 2>&1\n")


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
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
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


def _port_in_use(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port (SO_REUSEADDR: a TIME_WAIT leftover is not a clash)."""
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


class Lab:
    """One lab cluster, identified by its state folder."""

    def __init__(self, spec: LabSpec) -> None:
        self.spec = spec
        self.paths = LabPaths(Path(spec.state_dir).resolve())

    # -- environment for clients -------------------------------------------------------
    def client_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.paths.slurm_conf)
        env["SCOUT_CONFIG"] = str(self.paths.scout_conf)
        env["PATH"] = os.path.dirname(self.spec.python) + ":" + env.get("PATH", "/usr/bin:/bin")
        return env

    # -- lifecycle ----------------------------------------------------------------------
    def up(self, *, wait_s: float = 60.0) -> None:
        bins = check_binaries()
        self.down()
        p = self.paths
        # a daemon that cannot bind dies after forking, and our clients would reach whatever
        # holds the port instead: refuse up front
        ports = range(self.spec.port_base, self.spec.port_base + self.spec.nodes + 1)
        busy = [port for port in ports if _port_in_use(port)]
        if busy:
            raise LabError(f"lab: port(s) {', '.join(map(str, busy))} on 127.0.0.1 are in use by another "
                           f"program (another lab?); choose another --port-base than {self.spec.port_base}")
        for d in (p.etc, p.munge_dir, p.run, p.logs, p.spool / "ctld", p.evidence, p.hooks, p.work,
                  p.root / "cgroup-empty"):
            d.mkdir(parents=True, exist_ok=True)
        for name in self.spec.node_names():
            (p.spool / "nodes" / name).mkdir(parents=True, exist_ok=True)
        os.chmod(p.root, 0o755)
        os.chmod(p.munge_dir, 0o711)  # munge clients must reach the socket: o+x
        os.chmod(p.evidence, 0o755)
        os.chmod(p.work, 0o1777)
        host = socket.gethostname().split(".")[0]
        conf = render_slurm_conf(self.spec, p, controller_host=host, first_job_id=self._next_job_id())
        p.slurm_conf.write_text(conf)
        (p.etc / "cgroup.conf").write_text(f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={p.root / 'cgroup-empty'}\n"
                                           "ConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n")
        p.scout_conf.write_text(render_toml(lab_site_config(self.spec)))
        for name, module in (("prolog", "scout_slurm.hooks.prolog"), ("epilog", "scout_slurm.hooks.epilog"),
                             ("epilog-slurmctld", "scout_slurm.hooks.controller")):
            hook = p.hooks / name
            hook.write_text(render_hook(self.spec.python, module, p))
            hook.chmod(0o755)
        key = p.munge_dir / "munge.key"
        if not key.exists():
            subprocess.run([bins["mungekey"], "--create", f"--keyfile={key}", "--force"], check=True,
                           capture_output=True, timeout=30)
        os.chmod(key, 0o400)
        self._spawn([bins["munged"], "--force", f"--socket={p.munge_socket}", f"--key-file={key}",
                     f"--pid-file={p.run / 'munged.pid'}", f"--log-file={p.logs / 'munged.log'}",
                     f"--seed-file={p.munge_dir / 'munged.seed'}"], "munged")
        self._wait_for(lambda: p.munge_socket.exists(), 10, "munged socket")
        os.chmod(p.munge_socket, 0o777)
        env = self.client_env()
        self._spawn([bins["slurmctld"], "-c", "-f", str(p.slurm_conf)], "slurmctld", env=env)
        self._wait_for(lambda: _read_pid(p.run / "slurmctld.pid") is not None, 15, "slurmctld pid file")
        for name in self.spec.node_names():
            self._spawn([bins["slurmd"], "-N", name, "-f", str(p.slurm_conf)], f"slurmd {name}", env=env)
        p.lab_json.write_text(json.dumps({"nodes": self.spec.node_names(), "port_base": self.spec.port_base,
                                          "slurm_conf": str(p.slurm_conf), "started": time.time()}))
        self._wait_for(self._all_idle, wait_s, "all nodes idle")
        log.info("lab.up", state_dir=str(p.root), nodes=self.spec.node_names())

    def down(self) -> list[int]:
        """Stop every lab process; returns the pids that were stopped."""
        p = self.paths
        if p.slurm_conf.exists() and _read_pid(p.run / "slurmctld.pid") and _pid_alive(_read_pid(p.run / "slurmctld.pid")):
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
                nodes = [{"name": n.name, "state": n.state_text, "reason": n.reason}
                         for n in ops.list_nodes(timeout=10, env=self.client_env())]
            except SlurmError as exc:
                nodes = [{"error": str(exc)}]
        return {"state_dir": str(p.root), "slurm_conf": str(p.slurm_conf), "daemons": daemons, "nodes": nodes}

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
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise LabError(f"could not start {what}: {' '.join(argv)} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[:1000]} (see {self.paths.logs})")

    def _wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except Exception:  # noqa: BLE001 - a daemon that is still starting may not answer yet
                pass
            time.sleep(0.1)
        raise LabError(f"lab: timed out after {timeout:.0f} s waiting for {what}; logs in {self.paths.logs}")

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
        """Job ids continue above any already in the evidence folder, so evidence never collides."""
        top = 0
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
