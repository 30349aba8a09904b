"""Slurm drains a node whose Prolog or Epilog exits non-zero. Each hook's real entry point
(`python -m scout_slurm.hooks.X`, as slurm.conf runs it) is started with a crafted environment
and a broken world: bad config, missing or full evidence storage, planted links and files, a
garbage job id, no Slurm commands. It must exit 0 and say why in its log. Only the Epilog may
exit 1, and only for a local hardware error on a site that asked for it (tested in-process
through its `collect` seam)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from scout_slurm.config import EpilogConfig
from scout_slurm.evidence.records import ExitRecord, RankPlace
from scout_slurm.evidence.store import read_record, record_to_bytes
from scout_slurm.hooks import epilog
from scout_slurm.hooks.nodeevidence import KernelLine, NodeEvidence
from scout_slurm.remediation.records import ActionKind, ActionsRecord, PlanStatus

HOOKS = ("prolog", "epilog", "controller")
CLUSTER = "lab"
JOB = 4711
T0 = 1_700_000_000.0
# what a hook logs when it gives up on purpose; "*.bug"/"unexpected_error" mean an exception
# nobody expected reached the last-resort handler
GIVE_UP = {
    "prolog": (
        "prolog.bad_config",
        "prolog.bad_environment",
        "prolog.folder_failed",
        "prolog.job_folders_failed",
        "prolog.write_failed",
    ),
    "epilog": ("epilog.failed",),
    "controller": ("controller.failed",),
}
UNEXPECTED = ("prolog.unexpected_error", "epilog.bug", "controller.bug")


# -------------------------------------------------------------------------------------------
# Running a hook as Slurm does
# -------------------------------------------------------------------------------------------


@dataclass
class HookRun:
    hook: str
    returncode: int
    logs: list[dict]
    stderr: str

    def events(self, name: str) -> list[dict]:
        return [r for r in self.logs if r.get("event") == name]

    def logged(self, *needles: str, events: tuple[str, ...] | None = None) -> dict:
        """The first log line (of `events`, if given) whose text contains every needle."""
        for rec in self.logs:
            if events is not None and rec.get("event") not in events:
                continue
            text = json.dumps(rec, ensure_ascii=False)
            if all(n in text for n in needles):
                return rec
        raise AssertionError(
            f"{self.hook}: no log line {'in ' + str(events) if events else ''} with "
            f"{needles!r}; stderr:\n{self.stderr[-4000:]}"
        )


def run_hook(hook: str, env: dict[str, str], *, timeout: float = 60) -> HookRun:
    proc = subprocess.run(
        [sys.executable, "-m", f"scout_slurm.hooks.{hook}"],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    logs = []
    for line in proc.stderr.splitlines():
        if line.startswith("{"):
            try:
                logs.append(json.loads(line))
            except ValueError:
                pass
    run = HookRun(hook, proc.returncode, logs, proc.stderr)
    bugs = [r for r in logs if r.get("event") in UNEXPECTED]
    assert not bugs, f"{hook} hit an unexpected error:\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert proc.returncode == 0, (
        f"{hook} exited {proc.returncode}: Slurm would drain the node\n{proc.stderr[-4000:]}"
    )
    return run


@dataclass
class Site:
    """A site as one hook run sees it: config file, evidence root, an empty bin dir."""

    tmp: Path
    root: Path
    config: Path
    nobin: Path

    def write_config(
        self, extra: str = "", *, localise_on: str = "controller", root: Path | None = None
    ) -> None:
        self.config.write_text(
            f'[evidence]\nroot = "{root or self.root}"\n'
            f'hook_log_dir = "{self.tmp / "hook-log"}"\n'
            f'[slurm]\nbin_dir = "{self.nobin}"\ntimeout_s = 5\nretries = 0\n'
            f"[prolog]\ntime_budget_s = 8\n"
            f'[epilog]\ntime_budget_s = 20\nwait_for_nodes_s = 0\nlocalise_on = "{localise_on}"\n'
            + extra
        )

    @property
    def job_dir(self) -> Path:
        return self.root / CLUSTER / str(JOB)

    def env(self, hook: str, **changes: str | None) -> dict[str, str]:
        env = {
            # no Slurm command on PATH, and none in [slurm] bin_dir; SLURM_CONF names nothing,
            # so that even a fallback to /usr/bin could not reach a real cluster
            "PATH": str(self.nobin),
            "SLURM_CONF": str(self.tmp / "no-slurm.conf"),
            "SCOUT_CONFIG": str(self.config),
            "LANG": "C.UTF-8",
            "SLURM_JOB_ID": str(JOB),
            "SLURM_JOB_UID": "0",
            "SLURM_JOB_USER": "root",
            "SLURM_CLUSTER_NAME": CLUSTER,
            "SLURM_JOB_RESTART_COUNT": "0",
            "SLURM_JOB_PARTITION": "debug",
            "SLURM_JOB_WORK_DIR": str(self.tmp),
        }
        if hook == "prolog":
            env.update(
                SLURMD_NODENAME="n1", SLURM_NODELIST="n[1-2]", SLURM_SCRIPT_CONTEXT="prolog_slurmd"
            )
        elif hook == "epilog":
            env.update(
                SLURMD_NODENAME="n1",
                SLURM_NODELIST="n[1-2]",
                SLURM_SCRIPT_CONTEXT="epilog_slurmd",
                SLURM_JOB_EXIT_CODE="256",
                SLURM_JOB_EXIT_CODE2="1:0",
            )
        else:
            env.update(
                SLURM_JOB_NODELIST="n[1-2]",
                SLURM_JOB_NAME="train",
                SLURM_SCRIPT_CONTEXT="epilog_slurmctld",
                SLURM_JOB_EXIT_CODE="256",
                SLURM_JOB_EXIT_CODE2="1:0",
            )
        if os.environ.get("PYTHONPATH"):  # the tree under test, when it is not the installed one
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        for key, value in changes.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env


@pytest.fixture()
def site(tmp_path) -> Site:
    s = Site(tmp_path, tmp_path / "evidence", tmp_path / "scout.toml", tmp_path / "nobin")
    s.root.mkdir()
    s.nobin.mkdir()
    s.write_config()
    return s


# -------------------------------------------------------------------------------------------
# Evidence of a failed job: rank 2 on n2 crashed, the others failed because of it
# -------------------------------------------------------------------------------------------


def place(rank: int) -> RankPlace:
    return RankPlace(
        job_id=JOB,
        restart=0,
        rank=rank,
        local_rank=rank % 2,
        world_size=4,
        node=f"n{rank // 2 + 1}",
        hostname="host",
        task_pid=100 + rank,
        child_pid=200 + rank,
        gpu_uuids=(),
        cuda_visible_devices="",
        nic="lo",
        master_addr="127.0.0.1",
        master_port=29500,
        started_at=T0,
    )


def exit_record(rank: int) -> ExitRecord:
    if rank == 2:
        return ExitRecord(
            rank=2,
            node="n2",
            pid=202,
            exit_code=-1,
            signal=11,
            core_dumped=False,
            at=T0 + 30,
            killed_by_scout=False,
            last_progress=None,
        )
    return ExitRecord(
        rank=rank,
        node=f"n{rank // 2 + 1}",
        pid=200 + rank,
        exit_code=1,
        signal=0,
        core_dumped=False,
        at=T0 + 31,
        killed_by_scout=False,
        last_progress=None,
        stderr_tail=("RuntimeError: Connection closed by peer",),
    )


def write_job_tree(job_dir: Path) -> None:
    run = job_dir / "run-0"
    for sub in ("ranks", "progress", "findings", "stacks"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    for n in ("n1", "n2"):
        (job_dir / "nodes" / n).mkdir(parents=True, exist_ok=True)
    (job_dir / "checkpoints").mkdir(exist_ok=True)
    for r in range(4):
        (run / "ranks" / f"rank-{r}.json").write_bytes(record_to_bytes(place(r)))
        (run / "ranks" / f"exit-{r}.json").write_bytes(record_to_bytes(exit_record(r)))


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def actions(site: Site) -> ActionsRecord:
    return read_record(site.job_dir / "results" / "actions-0.json", ActionsRecord, root=site.root)


# -------------------------------------------------------------------------------------------
# The site config
# -------------------------------------------------------------------------------------------


def _config_missing(site: Site) -> None:
    site.config.unlink()


def _config_is_a_directory(site: Site) -> None:
    site.config.unlink()
    site.config.mkdir()


def _config_malformed(site: Site) -> None:
    site.config.write_text("[evidence\nroot = /var/lib/scout\n")


def _config_not_utf8(site: Site) -> None:
    site.config.write_bytes(b'[evidence]\nroot = "\xff\xfe"\n')


def _config_unknown_key(site: Site) -> None:
    site.write_config("drain_everything = true\n")  # lands in [epilog]


def _config_wrong_type(site: Site) -> None:
    site.config.write_text('[epilog]\ntime_budget_s = "soon"\n')


def _config_unreadable(site: Site) -> None:
    # root reads any mode; an unreadable config is one whose read fails: here, a file too large
    site.config.write_bytes(b"# " + b"x" * (1024 * 1024 + 10) + b"\n")


CONFIG_CASES = {
    "missing": (_config_missing, "site config not found"),
    "a directory": (
        _config_is_a_directory,
        "is a directory (owner uid 0, mode 0755), not a regular file",
    ),
    "malformed TOML": (_config_malformed, "cannot read the site config"),
    "not UTF-8": (_config_not_utf8, "cannot read the site config"),
    "unknown key": (_config_unknown_key, "unknown key(s) drain_everything in [epilog]"),
    "wrong type": (_config_wrong_type, "[epilog] time_budget_s: expected a number"),
    "over 1 MiB": (_config_unreadable, "more than the 1048576 allowed"),
}


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_broken_site_config_is_logged_and_exits_0(site, hook, case):
    write_job_tree(site.job_dir)
    breaker, reason = CONFIG_CASES[case]
    breaker(site)
    run = run_hook(hook, site.env(hook))
    # refused like sshd refuses a bad config of its own: logged, exit 0, safe defaults (observe
    # only)
    run.logged(str(site.config), reason, events=(f"{hook}.config_refused",))


# -------------------------------------------------------------------------------------------
# The evidence storage
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hook", HOOKS)
def test_a_missing_evidence_root_is_logged_and_not_created(site, hook):
    gone = site.tmp / "not-mounted" / "evidence"
    site.write_config(root=gone)
    run = run_hook(hook, site.env(hook))
    run.logged(str(gone), "does not exist")
    assert not gone.parent.exists(), (
        "a hook created the evidence root: the shared file system is not mounted?"
    )


@pytest.mark.parametrize("hook", HOOKS)
def test_a_job_folder_planted_as_a_link_is_not_followed(site, hook):
    elsewhere = site.tmp / "elsewhere"
    write_job_tree(elsewhere)
    before = listing(elsewhere)
    (site.root / CLUSTER).mkdir()
    site.job_dir.symlink_to(elsewhere)
    run = run_hook(hook, site.env(hook))
    run.logged(str(site.job_dir), "symbolic link")
    assert listing(elsewhere) == before, "a hook wrote through the planted link"


@pytest.mark.parametrize("hook", HOOKS)
def test_a_run_folder_planted_as_a_link_is_not_followed(site, hook):
    elsewhere = site.tmp / "elsewhere"
    write_job_tree(elsewhere)
    write_job_tree(site.job_dir)
    shutil.rmtree(site.job_dir / "run-0")
    (site.job_dir / "run-0").symlink_to(elsewhere / "run-0")
    before = listing(elsewhere)
    site.write_config(localise_on="batch-host" if hook == "epilog" else "controller")
    run = run_hook(hook, site.env(hook))
    run.logged("run-0", "symbolic link")
    assert listing(elsewhere) == before


def plant_bad_records(job_dir: Path, outside: Path) -> dict[str, str]:
    """Files a job could leave for a root hook; returns name -> what the hook must say of it."""
    ranks, progress, findings = (job_dir / "run-0" / d for d in ("ranks", "progress", "findings"))
    (ranks / "rank-5.json").write_bytes(b'{"record_kind": "rank-place", "rank": ')
    with open(ranks / "exit-6.json", "wb") as fh:  # sparse: 5 MiB without writing them
        fh.truncate(5 * 1024 * 1024)
    os.mkfifo(ranks / "rank-7.json")
    (ranks / "exit-8.json").symlink_to("/etc/passwd")
    secret = outside / "secret.json"
    secret.write_bytes(record_to_bytes(place(3)))
    os.link(secret, ranks / "rank-9.json")
    (progress / "rank-0.json").write_bytes(b"[" * 200_000)
    (progress / "rank-1.json").write_bytes(b'{"record_kind": "progress", "rank": 1e999}')
    (findings / "evil.json").mkdir()
    (findings / "nul.json").write_bytes(
        b'{"record_kind": "finding", "rank": 0, "summary": "a\x00b"' + b"}" * 3
    )
    return {
        "rank-5.json": "not valid JSON",
        "exit-6.json": "limit",
        "rank-7.json": "FIFO",
        "exit-8.json": "symbolic link",
        "rank-9.json": "hard links",
        "progress/rank-0.json": "nested deeper",
        "findings/evil.json": "directory",
    }


@pytest.mark.parametrize("hook", ("controller", "epilog"))
def test_planted_records_are_refused_by_name_and_the_crash_is_still_found(site, hook):
    write_job_tree(site.job_dir)
    outside = site.tmp / "outside"
    outside.mkdir()
    expected = plant_bad_records(site.job_dir, outside)
    site.write_config(localise_on="batch-host" if hook == "epilog" else "controller")
    run = run_hook(hook, site.env(hook), timeout=60)
    for name, reason in expected.items():
        run.logged(name, reason)
    verdict = json.loads((site.job_dir / "results" / "verdict-0.json").read_text())
    assert verdict["kind"] == "crash" and [(s["rank"], s["node"]) for s in verdict["suspects"]] == [
        (2, "n2")
    ]


def test_the_prolog_ignores_planted_records(site):
    write_job_tree(site.job_dir)
    outside = site.tmp / "outside"
    outside.mkdir()
    plant_bad_records(site.job_dir, outside)
    run = run_hook("prolog", site.env("prolog"))
    run.logged("hardware-map.json", events=("prolog.map_written",))


@contextlib.contextmanager
def full_tmpfs(where: Path):
    where.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)
        if os.path.ismount(where):
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(fs: Path) -> None:
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.parametrize("hook", HOOKS)
def test_a_full_evidence_file_system_is_logged_and_exits_0(site, hook):
    with full_tmpfs(site.tmp / "full") as fs:
        root = fs / "evidence"
        root.mkdir()
        site.root = root
        write_job_tree(site.job_dir)
        site.write_config()
        fill(fs)
        run = run_hook(hook, site.env(hook))
        run.logged("No space left on device", events=GIVE_UP[hook])


# -------------------------------------------------------------------------------------------
# The environment Slurm gives the hook
# -------------------------------------------------------------------------------------------

GARBAGE_JOB_IDS = {
    "letters": ("abc", "is not an integer"),
    "array task": ("4711_3", "is not an integer"),
    "zero": ("0", "invalid job id"),
    "negative": ("-5", "invalid job id"),
    "non-ASCII digits": ("\u0664\u0667\u0661\u0661", "is not an integer"),
    "5000 digits": ("1" * 5000, "SLURM_JOB_ID"),
    "unset": (None, "SLURM_JOB_ID is not set"),
}


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("case", list(GARBAGE_JOB_IDS))
def test_a_garbage_job_id_is_logged_and_exits_0(site, hook, case):
    value, reason = GARBAGE_JOB_IDS[case]
    run = run_hook(hook, site.env(hook, SLURM_JOB_ID=value))
    run.logged(reason, events=GIVE_UP[hook])
    assert listing(site.root) == []


@pytest.mark.parametrize("hook", ("controller", "epilog"))
def test_without_slurm_commands_the_plan_is_kept_pending(site, hook):
    """No scontrol on PATH and an empty [slurm] bin_dir: nothing may reach any Slurm (not even
    /usr/bin's), the drain stays pending in the actions file for a later retry. (The old drain
    rule, so that the job's own evidence plans a drain: tests/unit/test_drain_rule.py has the
    new.)"""
    write_job_tree(site.job_dir)
    site.write_config(
        '[drain]\ndrain_on = "job-evidence"\n',
        localise_on="batch-host" if hook == "epilog" else "controller",
    )
    run = run_hook(hook, site.env(hook))
    run.logged("scontrol", "was not found", str(site.nobin), events=("controller.job_info_failed",))
    assert not run.events("slurm.call"), run.events("slurm.call")
    record = actions(site)
    assert record.status == PlanStatus.PENDING
    assert [(a.kind, a.target) for a in record.actions] == [(ActionKind.DRAIN, "n2")]
    assert [(r.kind, r.ok) for r in record.results] == [(ActionKind.DRAIN, False)]
    assert "was not found" in record.results[0].message


# -------------------------------------------------------------------------------------------
# The one non-zero exit: the Epilog on a local hardware error, when the site asks for it
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hardware_error,drain,expected",
    [
        (True, True, 1),
        (True, False, 0),
        (False, True, 0),
        (False, False, 0),
    ],
)
def test_epilog_exit_status_decision(hardware_error, drain, expected):
    assert (
        epilog.exit_status(hardware_error, EpilogConfig(drain_on_local_hardware_error=drain))
        == expected
    )


def node_evidence(node: str, job_id: int, *, hardware_error: bool) -> NodeEvidence:
    lines = (
        KernelLine(
            12.5, "nvidia-xid", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
        ),
    )
    return NodeEvidence(
        node=node,
        job_id=job_id,
        kernel_lines=lines if hardware_error else (),
        gpu_errors=(),
        leftover=(),
        hardware_error=hardware_error,
        collected_at=T0,
        problems=(),
    )


@pytest.mark.parametrize(
    "hardware_error,drain,expected",
    [
        (True, True, 1),
        (True, False, 0),
        (False, True, 0),
    ],
)
def test_epilog_main_drains_only_for_a_hardware_error_when_asked(
    site, hardware_error, drain, expected
):
    write_job_tree(site.job_dir)
    site.write_config(f"drain_on_local_hardware_error = {'true' if drain else 'false'}\n")

    def collect(node, job_id, *, job_started_wall):
        return node_evidence(node, job_id, hardware_error=hardware_error)

    assert epilog.main(environ=site.env("epilog"), collect=collect) == expected
    # collected in the Epilog's bounded child: what it wrote says for which node and job
    written = read_record(
        site.job_dir / "nodes" / "n1" / "epilog.json", NodeEvidence, root=site.root
    )
    assert (written.node, written.job_id) == ("n1", JOB)
    assert written.hardware_error is hardware_error


def test_epilog_drains_for_a_hardware_error_even_when_the_evidence_cannot_be_written(site):
    """The node's own hardware verdict does not depend on the shared storage."""
    site.write_config("drain_on_local_hardware_error = true\n", root=site.tmp / "not-mounted")
    assert (
        epilog.main(
            environ=site.env("epilog"),
            collect=lambda n, j, *, job_started_wall: node_evidence(n, j, hardware_error=True),
        )
        == 1
    )


def test_epilog_never_drains_when_it_cannot_tell(site):
    """A bad environment means no evidence was collected: no drain, whatever the config."""
    site.write_config("drain_on_local_hardware_error = true\n")
    assert (
        epilog.main(
            environ=site.env("epilog", SLURM_JOB_ID="x"),
            collect=lambda n, j, *, job_started_wall: node_evidence(n, j, hardware_error=True),
        )
        == 0
    )
