"""Containers: the pyxis step's options (scout's mounts beside the user's, refusals) and start
line; the Apptainer command line (found, binds, variables) and the host pid of a process in its
own PID namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from scout_slurm.errors import ScoutError
from scout_slurm.launcher import containers, srun
from scout_slurm.launcher.containers import IN_CONTAINER_LIB, Mount, parse_mounts
from scout_slurm.task import apptainer
from scout_slurm.task.watchdog import host_pid

INSTALL = containers.ScoutInstall(
    (("scout_slurm", "/venv/sp/scout_slurm"), ("structlog", "/venv/sp/structlog")),
    "/etc/scout/scout.toml",
    "/shared/scout",
)
OURS = (
    f"/venv/sp/scout_slurm:{IN_CONTAINER_LIB}/scout_slurm:ro,"
    f"/venv/sp/structlog:{IN_CONTAINER_LIB}/structlog:ro,"
    "/etc/scout/scout.toml:/etc/scout/scout.toml:ro,/shared/scout:/shared/scout"
)


def argv(*words: str, environ: dict[str, str] | None = None) -> list[str]:
    return srun.srun_argv(srun.split_args(list(words)), "/venv/bin/python", INSTALL, environ)


def options_and_start(args: list[str]) -> tuple[list[str], list[str]]:
    at = args.index("/bin/sh")
    return args[:at], args[at:]


# ---- pyxis


def test_pyxis_value_options_are_not_taken_for_the_command():
    plan = srun.split_args(
        ["--container-image", "nvcr.io#nvidia/pytorch:24.05-py3", "--container-workdir", "/w"]
        + ["--container-env", "NCCL_DEBUG", "python", "train.py"]
    )
    assert plan.command == ("python", "train.py")
    assert plan.srun_options[1] == "nvcr.io#nvidia/pytorch:24.05-py3"


def test_a_step_without_container_options_is_unchanged():
    assert argv("-N", "2", "python", "train.py") == [
        "-N",
        "2",
        "/venv/bin/python",
        "-m",
        "scout_slurm.task.shim",
        "--",
        "python",
        "train.py",
    ]


def test_a_pyxis_step_gets_scouts_mounts_and_the_shim_in_the_image():
    opts, start = options_and_start(argv("-N2", "--container-image=img", "python", "train.py"))
    assert opts == ["-N2", "--container-image=img", f"--container-mounts={OURS}"]
    assert start[:4] == ["/bin/sh", "-c", containers.SH_START, "scout-task"]
    assert start[4] == containers.ENTRY
    assert start[5:] == ["python", "train.py"]


def test_a_named_container_is_a_container_step_too():
    opts, _ = options_and_start(argv("--container-name", "mine", "python", "t.py"))
    assert opts[-1] == f"--container-mounts={OURS}"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["--container-mounts=/data:/data:ro"], [f"--container-mounts=/data:/data:ro,{OURS}"]),
        (["--container-mounts", "/data:/data"], ["--container-mounts", f"/data:/data,{OURS}"]),
        (
            ["--container-mounts=/a,/b:/c:ro+rprivate,"],
            [f"--container-mounts=/a,/b:/c:ro+rprivate,{OURS}"],
        ),
        (
            ["--container-mounts=/a", "--container-mounts=/b"],
            ["--container-mounts=/a", f"--container-mounts=/b,{OURS}"],
        ),
    ],
)
def test_the_users_mounts_are_kept(given, expected):
    opts, _ = options_and_start(argv("--container-image", "img", *given, "python", "t.py"))
    assert opts == ["--container-image", "img", *expected]


def test_pyxis_variables_make_a_container_step_and_their_mounts_are_kept():
    environ = {"PYXIS_CONTAINER_IMAGE": "img", "PYXIS_CONTAINER_MOUNTS": "/data:/data,"}
    opts, start = options_and_start(argv("-N2", "python", "t.py", environ=environ))
    # pyxis reads PYXIS_CONTAINER_MOUNTS only where no --container-mounts is: carried over
    assert opts == ["-N2", f"--container-mounts=/data:/data,{OURS}"]
    assert start[-2:] == ["python", "t.py"]
    opts, _ = options_and_start(
        argv("--container-mounts=/x:/x", "python", environ={"PYXIS_CONTAINER_NAME": "n"})
    )
    assert opts == [f"--container-mounts=/x:/x,{OURS}"]


def test_a_user_mount_of_the_same_evidence_root_replaces_scouts():
    opts, _ = options_and_start(
        argv("--container-image=img", "--container-mounts=/shared/scout:/shared/scout", "python")
    )
    mounts = parse_mounts(opts[-1].split("=", 1)[1])
    assert [m for m in mounts if m.dst == "/shared/scout"] == [
        Mount("/shared/scout", "/shared/scout")
    ]


@pytest.mark.parametrize(
    ("mounts", "words"),
    [
        ("/mine:/opt/scout-slurm/lib", "/opt/scout-slurm"),
        ("/mine:/opt", "/opt/scout-slurm"),
        ("/scratch:/shared/scout", "evidence root"),
        ("/other.toml:/etc/scout/scout.toml", "site config"),
        ("/a:/b:ro:extra", "SRC:DST:FLAGS"),
    ],
)
def test_a_mount_that_would_hide_scouts_is_refused_by_name(mounts, words):
    with pytest.raises(ScoutError) as err:
        argv("--container-image=img", f"--container-mounts={mounts}", "python")
    assert words in str(err.value)
    assert "--container-mounts" in str(err.value) or "SRC" in str(err.value)


def test_an_install_path_pyxis_cannot_name_is_refused():
    bad = containers.ScoutInstall((("scout_slurm", "/a,b/scout_slurm"),), "", "/shared/scout")
    plan = srun.split_args(["--container-image=img", "python"])
    with pytest.raises(ScoutError, match="without ',' or ':'"):
        srun.srun_argv(plan, "py", bad)


def test_scout_off_leaves_a_container_step_alone():
    assert argv("--container-image=img", "--scout-off", "python") == [
        "--container-image=img",
        "python",
    ]


def test_scout_install_finds_the_shims_packages():
    install = containers.scout_install("/shared/scout", "")
    names = dict(install.packages)
    assert set(names) == set(containers.SHIM_PACKAGES)
    assert os.path.isfile(os.path.join(names["scout_slurm"], "task", "shim.py"))


def test_entry_compiles():
    compile(containers.ENTRY, "<entry>", "exec")


def test_an_image_without_python3_runs_the_command_unwatched(tmp_path):
    out = subprocess.run(
        ["/bin/sh", "-c", containers.SH_START, "scout-task", containers.ENTRY]
        + ["/bin/echo", "trained"],
        env={"PATH": str(tmp_path), "SLURM_LOCALID": "0"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0
    assert out.stdout == "trained\n"
    assert "no python3" in out.stderr and "unwatched" in out.stderr


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs a system python3")
def test_an_image_whose_python_cannot_import_scout_runs_the_command_unwatched(tmp_path):
    # the system Python stands for an image where /opt/scout-slurm/lib is not mounted
    out = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", containers.ENTRY, "--"]
        + ["/bin/sh", "-c", 'echo "rank $RANK of $WORLD_SIZE"'],
        env={"PATH": "/usr/bin:/bin", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0
    assert out.stdout == "rank 3 of 4\n"
    assert "scout cannot start in this container image" in out.stderr


# ---- Apptainer / Singularity


@pytest.mark.parametrize(
    ("command", "verb_at", "inner", "pid"),
    [
        (["apptainer", "exec", "--nv", "img.sif", "python", "t.py"], 1, ("python", "t.py"), False),
        (
            ["/usr/bin/apptainer", "exec", "-B", "/d:/d", "--env", "A=1", "i.sif", "python", "-e"],
            1,
            ("python", "-e"),
            False,
        ),
        (["singularity", "--debug", "exec", "--containall", "i", "python"], 2, ("python",), True),
        (["apptainer", "-c", "/etc/a.conf", "run", "-eC", "i", "x"], 3, ("x",), True),
        (
            ["apptainer", "exec", "--pid=false", "-B/d", "i", "torchrun", "t.py"],
            1,
            ("torchrun", "t.py"),
            False,
        ),
        (["apptainer", "exec", "-p", "--bind=/d", "i", "python"], 1, ("python",), True),
    ],
)
def test_an_apptainer_command_is_found(command, verb_at, inner, pid):
    found = apptainer.parse_exec(command)
    assert found is not None
    assert (found.verb_at, found.inner, found.pid_namespace) == (verb_at, inner, pid)


@pytest.mark.parametrize(
    "command",
    [
        ["python", "train.py"],
        ["apptainer", "shell", "img"],
        ["apptainer", "build", "x.sif", "docker://y"],
        ["apptainer"],
        ["docker", "run", "img"],
    ],
)
def test_other_commands_are_not(command):
    assert apptainer.parse_exec(command) is None


SHIM_ENV = {
    "PATH": "/usr/bin",
    "PYTHONPATH": "/venv/sp/scout_slurm/bootstrap/site:/home/u/lib",
    "SCOUT_PACKAGE_DIR": "/venv/sp/scout_slurm",
    "SCOUT_PROGRESS_DIR": "/dev/shm/scout-c-1-0-0-0",
    "RANK": "0",
}
ENVIRON = {"PATH": "/usr/bin", "PYTHONPATH": "/home/u/lib"}


def launch(command, environ=ENVIRON, package_dir="/venv/sp/scout_slurm"):
    return apptainer.with_bootstrap(
        apptainer.parse_exec(command),
        command,
        package_dir=package_dir,
        binds_rw=["/shared/scout/c/1", "/dev/shm/scout-c-1-0-0-0"],
        shim_env=SHIM_ENV,
        environ=environ,
    )


def test_the_bootstrap_is_bound_after_the_verb_and_its_variables_passed():
    got = launch(["apptainer", "exec", "--cleanenv", "--nv", "img.sif", "python", "t.py"])
    assert got.problem == ""
    assert got.command == (
        "apptainer",
        "exec",
        "-B",
        f"/venv/sp/scout_slurm:{apptainer.IN_CONTAINER_PACKAGE}:ro,"
        "/shared/scout/c/1:/shared/scout/c/1,/dev/shm/scout-c-1-0-0-0:/dev/shm/scout-c-1-0-0-0",
        "--cleanenv",
        "--nv",
        "img.sif",
        "python",
        "t.py",
    )
    assert got.env == {
        "APPTAINERENV_PYTHONPATH": f"{apptainer.IN_CONTAINER_BOOTSTRAP}:/home/u/lib",
        "APPTAINERENV_SCOUT_PACKAGE_DIR": apptainer.IN_CONTAINER_PACKAGE,
        "APPTAINERENV_SCOUT_PROGRESS_DIR": "/dev/shm/scout-c-1-0-0-0",
        "APPTAINERENV_RANK": "0",
    }


def test_the_users_own_container_variables_win_and_their_pythonpath_is_kept():
    environ = {**ENVIRON, "SINGULARITYENV_RANK": "7", "SINGULARITYENV_PYTHONPATH": "/in/lib"}
    got = launch(["singularity", "exec", "img", "python"], environ=environ)
    assert "SINGULARITYENV_RANK" not in got.env
    assert got.env["SINGULARITYENV_PYTHONPATH"] == f"{apptainer.IN_CONTAINER_BOOTSTRAP}:/in/lib"


def test_a_path_that_cannot_be_bound_leaves_the_command_as_it_was():
    command = ["apptainer", "exec", "img", "python"]
    got = launch(command, package_dir="/a:b/scout_slurm")
    assert got.command == tuple(command) and got.env == {}
    assert "exit only" in got.problem


def _fake_proc(root, pid, ppid, nspid):
    d = root / str(pid)
    d.mkdir()
    (d / "status").write_text(f"Name:\tx\nNSpid:\t{nspid}\n")
    (d / "stat").write_text(f"{pid} (x y) S {ppid} 0 0\n")


def test_host_pid_translates_a_namespaced_pid_among_the_runtimes_descendants(tmp_path):
    _fake_proc(tmp_path, 100, 1, "100")  # the runtime (the shim's child)
    _fake_proc(tmp_path, 101, 100, "101\t1")  # the container's init
    _fake_proc(tmp_path, 102, 101, "102\t7")  # the training Python, pid 7 inside
    _fake_proc(tmp_path, 7, 1, "7")  # a stranger that is pid 7 on the host
    _fake_proc(tmp_path, 300, 1, "300\t7")  # pid 7 of another container
    assert host_pid(7, 100, proc=str(tmp_path)) == 102
    assert host_pid(9, 100, proc=str(tmp_path)) is None


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
def test_host_pid_finds_a_real_process_in_its_own_pid_namespace():
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", "sleep 30 & echo started; wait"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "started\n"
        # sh is pid 1 inside, sleep pid 2; its fork may not have run exec yet (a loaded machine:
        # the command line is still sh's for a moment)
        deadline, argv0 = time.monotonic() + 10, b""
        while argv0 != b"sleep" and time.monotonic() < deadline:
            found = host_pid(2, proc.pid)
            assert found is not None
            with open(f"/proc/{found}/cmdline", "rb") as fh:
                argv0 = fh.read().split(b"\0")[0]
            time.sleep(0.05)
        assert argv0 == b"sleep"
    finally:
        proc.kill()  # --kill-child: the namespace's init and its sleep go with it
        proc.wait()
