"""Issue: a real site's conditions. slurmctld (so the controller Epilog) runs as a non-root
SlurmUser, jobs come from unprivileged users, and people cancel jobs: on the real lab cluster."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest
import scoutjobs as sj

from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]


def _as_site(lab) -> None:
    users = lab.users
    if users["slurm_user"] == "root" or not users["job_users"]:
        pytest.skip(f"the lab could not run as a site here: {users['why_root']}")


def _drained(lab) -> dict[str, str]:
    return {
        n.name: n.reason for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained
    }


def _write_as(user: str, path) -> int:
    """errno of creating or overwriting `path` as `user` (0: it worked)."""
    code = (
        "import errno, sys\n"
        "try:\n    open(sys.argv[1], 'w').write('forged')\nexcept OSError as e:\n    "
        "sys.exit(e.errno)\n"
    )
    return subprocess.run(
        ["runuser", "-u", user, "--", sys.executable, "-c", code, str(path)], timeout=60, cwd="/"
    ).returncode


def _owner(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


@pytest.fixture()
def hooks_from_the_wheel(lab, tmp_path_factory):
    """A site laid out from the wheel alone, as docs/SITE-ADMIN.md says: the wheel built from this
    tree, installed into a fresh virtual environment (no source tree on its path), `scout site
    install --prefix` run from it, the lab's site config copied in; the lab's Prolog, Epilog and
    controller Epilog pointed at the layout's wrappers for the test, then back. The lab's hook
    folders keep their stand-in for a site's own Prolog and Epilog beside scout's."""
    import pwd
    import shutil

    from scout_slurm.lab.cluster import SCOUT_HOOK_LINK

    _as_site(lab)
    base = lab.paths.root / f"site-{time.time_ns()}"
    base.mkdir(mode=0o755)
    wheels = base / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(wheels), str(_TREE)],
        check=True,
        timeout=300,
        cwd=base,
    )
    (wheel,) = wheels.glob("scout_slurm-*.whl")
    venv = base / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    # the hooks' dependencies only (click, structlog, nvidia-ml-py: from the package index)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        + ["--disable-pip-version-check", str(wheel)],
        check=True,
        timeout=600,
        cwd=base,
    )
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import scout_slurm; print(scout_slurm.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd="/",
    ).stdout.strip()
    assert where.startswith(f"{venv}/lib/") and "site-packages" in where, where
    prefix = base / "site"
    subprocess.run(
        [str(venv / "bin" / "scout"), "site", "install", "--prefix", str(prefix)]
        + ["--slurm-conf", str(lab.paths.slurm_conf)],
        check=True,
        timeout=120,
        cwd="/",
    )
    shutil.copyfile(lab.paths.scout_conf, prefix / "etc" / "scout" / "scout.toml")
    ctl_log = prefix / "var" / "log" / "scout" / "scout-epilog-slurmctld.log"
    ctl_log.touch()
    slurm = pwd.getpwnam(lab.users["slurm_user"])
    os.chown(ctl_log, slurm.pw_uid, slurm.pw_gid)
    wrappers = prefix / "libexec" / "scout"
    swaps = {
        lab.paths.hooks / "prolog.d" / SCOUT_HOOK_LINK: wrappers / "scout-prolog",
        lab.paths.hooks / "epilog.d" / SCOUT_HOOK_LINK: wrappers / "scout-epilog",
        lab.paths.hooks / "epilog-slurmctld": wrappers / "scout-epilog-slurmctld",
    }
    kept = {}
    try:
        for i, (path, target) in enumerate(swaps.items()):
            os.link(path, base / f"kept-{i}", follow_symlinks=False)
            kept[path] = base / f"kept-{i}"
            tmp = path.with_name(f".{path.name}.swap")
            tmp.symlink_to(target)
            os.replace(tmp, path)
        yield prefix
    finally:
        for path, old in kept.items():
            os.replace(old, path)


_TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(600)
def test_crash_loop_as_a_site_and_the_job_cannot_write_what_judges_it(
    lab, clean_drains, hooks_from_the_wheel
):
    """slurmctld runs as `slurm`, the job as an unprivileged user, the hooks are the ones `scout
    site install` laid out from the wheel, beside a site's own Prolog and Epilog: the controller
    Epilog (as slurm) reads the job's evidence, localises, drains, requeues and resumes exactly as
    before, the site's programs run on every node of both runs, and the job's user gets EACCES on
    the verdict, the actions, the node records and the results folder."""
    import pwd

    prefix = hooks_from_the_wheel
    slurm_uid = pwd.getpwnam(lab.users["slurm_user"]).pw_uid
    ctld = int((lab.paths.run / "slurmctld.pid").read_text())
    assert _owner(ctld) == slurm_uid, "slurmctld does not run as SlurmUser"
    user = lab.job_user
    ckpt = lab.paths.work / f"ckpt-site-{time.time_ns()}"
    script = sj.batch_script(
        lab,
        train_args=f"--steps 40 --ckpt-dir {ckpt} --ckpt-every 10 --momentum 0.9",
        scout_args="--scout-stall-floor=4 --scout-inject=exit,rank=2,step=25,code=3",
    )
    job = sj.submit(lab, script)
    sj.wait_finished(lab, job, restart=0)
    assert ops.job_info(job, timeout=10, env=lab.client_env()).user_id == pwd.getpwnam(user).pw_uid
    f = sj.folder(lab, job)
    node = sj.places(lab, job, 0)[2].node
    v = sj.verdict(lab, job, 0)
    assert v.kind.value == "crash" and [(s.rank, s.node) for s in v.suspects] == [(2, node)], v
    assert list(_drained(lab)) == [node]
    info = sj.wait_completed(lab, job)
    assert info.state == "COMPLETED" and info.restart_count == 1, (
        info,
        sj.output(lab, job)[-3000:],
    )
    assert sj.output(lab, job).count(f"resumed from {ckpt}/step-20.pt at step 20") == 4
    # who owns what: the job's records are the user's (SlurmUser's group reads them), the outcome
    # SlurmUser's
    assert os.stat(f.rank_place_path(0, 0)).st_uid == pwd.getpwnam(user).pw_uid
    for p in (f.verdict_path(0), f.actions_path(0), f.report_path(0), f.resume_path(1)):
        assert os.stat(p).st_uid == slurm_uid, p
    # the job's user can write none of it (EACCES), nor plant anything beside it
    for p in (
        f.verdict_path(0),
        f.actions_path(0),
        f.resume_path(1),
        f.results_dir / "verdict-9.json",
        f.node_dir(node) / "epilog.json",
        f.node_dir(node) / "hardware-map.json",
        f.node_digest_path(0, node),
        f.path / "planted.json",
        f.pending_path(0),
    ):
        assert _write_as(user, p) == errno.EACCES, p
    # and the controller's own log is where SlurmUser writes it, the layout's log, with the plan
    # applied; the lab's own hook wrappers did not run for this job (they log each run's time)
    logs = prefix / "var" / "log" / "scout"
    ctl_log = (logs / "scout-epilog-slurmctld.log").read_text(errors="replace")
    assert f'"job": {job}, "verdict": "crash", "status": "applied"' in ctl_log
    for name in ("scout-prolog.log", "scout-epilog.log"):
        assert f"{job}" in (logs / name).read_text(errors="replace"), name
    for name in ("hooks.log", "hooks-slurmctld.log"):
        lab_log = lab.paths.logs / name
        text = lab_log.read_text(errors="replace") if lab_log.exists() else ""
        assert f'"job": "{job}"' not in text, name
    # the site's own Prolog and Epilog ran beside scout's on every node of both runs (the job was
    # requeued once: each node of run 0 and of run 1, Prolog and Epilog)
    nodes = {sj.places(lab, job, r)[k].node for r in (0, 1) for k in range(4)}
    ran = sj.hook_nodes(lab, job)
    assert ran == {"site-prolog": nodes, "site-epilog": nodes}, (ran, nodes)


def _running_scout_job(lab, *, scout_args: str = "", steps: int = 100000) -> int:
    script = sj.batch_script(
        lab, train_args=f"--steps {steps} --step-sleep 0.05", scout_args=scout_args
    )
    job = sj.submit(lab, script)
    sj.wait_progress(lab, job, 0, steps=5)
    return job


def _assert_cancelled_untouched(lab, job: int) -> None:
    info = sj.wait_completed(lab, job)
    sj.wait_finished(lab, job, restart=0)  # the controller Epilog has written its verdict
    assert info.state == "CANCELLED" and info.restart_count == 0, info
    assert _drained(lab) == {}
    acts = sj.actions(lab, job, 0)
    assert acts is not None and acts.actions == (), acts
    assert any("the job was cancelled" in h for h in acts.held_back), acts.held_back
    time.sleep(3)  # a requeue would show by now
    info = ops.job_info(job, timeout=10, env=lab.client_env())
    assert info.state == "CANCELLED" and info.restart_count == 0, info


@pytest.mark.timeout(240)
def test_scancel_by_the_user_of_a_healthy_job_drains_nothing_and_does_not_requeue(
    lab, clean_drains
):
    _as_site(lab)
    job = _running_scout_job(lab)
    ops.cancel_job(job, timeout=20, env=lab.client_env(), user=lab.job_user)
    _assert_cancelled_untouched(lab, job)


@pytest.mark.timeout(240)
def test_scancel_after_a_rank_already_failed_drains_nothing_and_does_not_requeue(lab, clean_drains):
    """Rank 1 is stopped (a real fault scout would otherwise answer with a drain and a requeue), and
    the user cancels the job before the stall threshold: the cancellation wins."""
    _as_site(lab)
    job = _running_scout_job(
        lab, scout_args="--scout-stall-floor=120 --scout-inject=stop,rank=1,step=15"
    )
    sj.wait_progress(lab, job, 0, steps=15)
    time.sleep(2)
    ops.cancel_job(job, timeout=20, env=lab.client_env(), user=lab.job_user)
    _assert_cancelled_untouched(lab, job)
    v = sj.verdict(lab, job, 0)  # the verdict is kept for the record
    assert v.kind.value != "clean", v


@pytest.mark.timeout(300)
def test_a_job_that_reaches_its_time_limit_is_recorded_not_drained_nor_requeued(lab, clean_drains):
    _as_site(lab)
    script = sj.batch_script(lab, train_args="--steps 100000 --step-sleep 0.05")
    job = sj.submit(lab, script, extra=("--time=1",))
    info = sj.wait_completed(lab, job, timeout=280)
    sj.wait_finished(lab, job, restart=0)
    assert info.state == "TIMEOUT" and info.restart_count == 0, info
    assert _drained(lab) == {}
    acts = sj.actions(lab, job, 0)
    assert (
        acts is not None and acts.actions == () and any("time limit" in h for h in acts.held_back)
    ), acts


@pytest.mark.timeout(240)
def test_a_job_whose_config_points_elsewhere_is_told_so_in_its_output(lab, clean_drains):
    """SCOUT_CONFIG naming the user's own config with another evidence root: the job runs, and its
    output says at start, once a node, that the site's hooks will not see its evidence, and why."""
    _as_site(lab)
    own = lab.paths.work / f"own-{time.time_ns()}"
    own.mkdir(mode=0o777)
    os.chmod(own, 0o777)
    conf = own / "scout.toml"
    conf.write_text(f'[evidence]\nroot = "{own}"\n')
    script = sj.batch_script(lab, train_args="--steps 10", pre=f"export SCOUT_CONFIG={conf}")
    job = sj.submit(lab, script)
    assert sj.wait_completed(lab, job).state == "COMPLETED"
    out = sj.output(lab, job)
    warnings = [line for line in out.splitlines() if "scout: WARNING on" in line]
    assert len(warnings) == 2, out[-3000:]  # 2 nodes, local rank 0 of each
    # the first node's shim may already have made the folder (as the user) when the second looks
    assert all(
        "the site's hooks will not see this job's evidence: " in w
        and str(conf) in w
        and ("no Prolog laid out" in w or "is not a root-owned folder" in w)
        for w in warnings
    ), warnings


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["mode 666", "owned by the job's user", "a FIFO", "a symlink"])
def test_a_site_config_root_must_not_trust_is_refused_and_the_hooks_only_observe(
    lab, clean_drains, how
):
    """The site config made writable by a user (or replaced by a FIFO or a link): every hook refuses
    it with a logged reason, exits 0 (Slurm drains nothing: `sinfo -R` stays empty) and falls back
    to safe defaults, so a failing job is neither drained for nor requeued."""
    import pwd
    import shutil
    import stat

    _as_site(lab)
    conf = lab.paths.scout_conf
    saved = conf.read_bytes()
    st = os.stat(conf)
    before = {
        name: (lab.paths.logs / name).stat().st_size
        for name in ("hooks.log", "hooks-slurmctld.log")
    }
    try:
        if how == "mode 666":
            os.chmod(conf, 0o666)
        elif how == "owned by the job's user":
            os.chown(conf, pwd.getpwnam(lab.job_user).pw_uid, -1)
        elif how == "a FIFO":
            conf.unlink()
            os.mkfifo(conf, 0o644)
        else:
            real = conf.with_name("scout-real.toml")
            real.write_bytes(saved)
            conf.unlink()
            conf.symlink_to(real)
        script = sj.batch_script(
            lab, train_args="--steps 40", scout_args="--scout-inject=exit,rank=2,step=5,code=3"
        )
        # the job's own tasks read the config too (as the user, for their defaults): give them a
        # copy
        job = sj.submit(
            lab, script.replace("scout-srun", f"SCOUT_CONFIG={saved_copy(lab, saved)} scout-srun")
        )
        info = sj.wait_completed(lab, job)
        time.sleep(3)  # the controller Epilog runs after the job's end
    finally:
        if conf.is_symlink() or stat.S_ISFIFO(os.lstat(conf).st_mode):
            conf.unlink()
        conf.write_bytes(saved)
        os.chown(conf, st.st_uid, st.st_gid)
        os.chmod(conf, 0o644)
        shutil.rmtree(conf.with_name("scout-real.toml"), ignore_errors=True)
    assert info.state == "FAILED" and info.restart_count == 0, info
    assert _drained(lab) == {}, "a hook exited non-zero, or the refused config was acted on"
    logs = {
        name: (lab.paths.logs / name).read_text(errors="replace")[before[name] :]
        for name in ("hooks.log", "hooks-slurmctld.log")
    }
    for event in ("prolog.config_refused", "epilog.config_refused"):
        assert event in logs["hooks.log"] and str(conf) in logs["hooks.log"], logs["hooks.log"][
            -2000:
        ]
    assert "controller.config_refused" in logs["hooks-slurmctld.log"], logs["hooks-slurmctld.log"][
        -2000:
    ]
    assert "safe defaults (observe only" in logs["hooks-slurmctld.log"]


def saved_copy(lab, data: bytes):
    """A copy of the site config the job's own tasks may read (they run as the user)."""
    p = lab.paths.work / "scout-user-copy.toml"
    p.write_bytes(data)
    os.chmod(p, 0o644)
    return p


def _hook_events(lab, name: str, event: str, job: int) -> list[dict]:
    import json

    out = []
    for line in (lab.paths.logs / name).read_text(errors="replace").splitlines():
        if f'"event": "{event}"' in line and f"{job}" in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


@pytest.mark.timeout(300)
def test_checkpoint_records_naming_what_root_could_open_are_checked_as_the_user_within_budget(
    lab, clean_drains
):
    """A failing job plants checkpoint records naming /proc/kmsg, a FIFO, /etc/shadow and another
    user's file (both with their real digests) and a 1 GiB sparse file twelve times: the batch
    host's
    Epilog checks them as the job's user within its budget, the controller opens none of them and
    finishes within its own, no plan or resume instruction names any, and no node is drained by
    Slurm for a hook overrunning (the only drain is scout's own, of the crashed rank's node)."""
    import pwd

    _as_site(lab)
    pre, planted = sj.hostile_checkpoints(lab, "ctl")
    script = sj.batch_script(
        lab,
        train_args="--steps 40",
        scout_args="--scout-inject=exit,rank=2,step=5,code=3",
        pre=pre,
        post=sj.PLANT,
    )
    job = sj.submit(lab, script)
    sj.wait_finished(lab, job, restart=0, timeout=240)
    assert "planted 16 checkpoint records" in sj.output(lab, job)
    f = sj.folder(lab, job)
    acts = sj.actions(lab, job, 0)
    assert acts is not None and acts.status.value == "applied", acts
    for a in acts.actions:
        assert not any(p in a.target or p in a.describe() for p in planted), a
    if f.resume_path(1).exists():
        assert not any(p in f.resume_path(1).read_text() for p in planted)
    report = f.report_path(0).read_text()
    assert not any(f"resume from {p}" in report or f"checkpoint {p}" in report for p in planted), (
        report[-3000:]
    )
    # the checks: on the batch host, root-owned, as the job's user, none verified, within budget
    from scout_slurm.evidence.checkfiles import find_checkpoint_checks

    # the batch host's Epilog runs beside the controller's (both start at once on every release):
    # its
    # checks may land after the plan, as on 24.11, where they took 8.7 s and ended 3 s after the
    # plan
    deadline = time.monotonic() + 60
    while (checks := find_checkpoint_checks(f, 0)) is None and time.monotonic() < deadline:
        time.sleep(1)
    assert checks is not None and checks.checked_as_uid == pwd.getpwnam(lab.job_user).pw_uid
    assert os.stat(f.checkpoint_checks_path(0, checks.node)).st_uid == 0
    assert len(checks.results) == 16 and not [r for r in checks.results if r.verified], (
        checks.results
    )
    by_path = {r.path: r.problem for r in checks.results}
    assert (
        "Permission denied" in by_path["/proc/kmsg"]
        and "Permission denied" in by_path["/etc/shadow"]
    )
    assert (
        "Permission denied" in by_path[planted[3]] and "not a regular file" in by_path[planted[1]]
    )
    epilog = _hook_events(lab, "hooks.log", "epilog.checkpoint_checks", job)
    assert epilog and epilog[0]["seconds"] <= 15 + 1, epilog
    done = _hook_events(lab, "hooks-slurmctld.log", "controller.done", job)
    assert done and done[0]["seconds"] < 60, done
    print(
        f"\nplanted checkpoints: batch host's check {epilog[0]['seconds']} s, controller "
        f"{done[0]['seconds']} s"
    )
    node = sj.places(lab, job, 0)[2].node
    assert {n: r[:6] for n, r in _drained(lab).items()} == {node: "scout:"}
    ops.cancel_job(job, timeout=20, env=lab.client_env())
