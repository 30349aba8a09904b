"""The one door to Slurm, with the real Slurm binaries and no cluster: a private slurm.conf
whose controller is a closed port, or a listener on 127.0.0.1 that never answers."""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from scout_slurm.errors import SlurmError, SlurmNotInstalled, SlurmTimeout
from scout_slurm.slurm.door import SLURM_COMMANDS, resolve_binary, run_slurm

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        shutil.which("scontrol", path=os.environ.get("PATH", "") + ":/usr/bin") is None,
        reason="the Slurm client is not installed",
    ),
]


def _slurm_conf(tmp_path: Path, port: int) -> Path:
    # auth/none: no munge needed; MessageTimeout=1 keeps a silent controller to about 2 s
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"""ClusterName=doortest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={port}
AuthType=auth/none
CredType=cred/none
MessageTimeout=1
NodeName=x1 NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES
""")
    return conf


@pytest.fixture()
def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def no_controller_env(tmp_path, closed_port) -> dict[str, str]:
    """SLURM_CONF set (so no DNS lookups), pointing at a port nothing listens on."""
    return dict(os.environ, SLURM_CONF=str(_slurm_conf(tmp_path, closed_port)))


@pytest.fixture()
def silent_controller_env(tmp_path):
    """A 'controller' on 127.0.0.1 that accepts connections (the kernel does) and never answers."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield dict(os.environ, SLURM_CONF=str(_slurm_conf(tmp_path, listener.getsockname()[1])))
    finally:
        listener.close()


@pytest.mark.parametrize("command", ["scontrol", "sinfo", "squeue"])
def test_version_runs_and_is_logged(command, no_controller_env):
    with capture_logs() as logs:
        res = run_slurm(command, ["--version"], timeout=20, env=no_controller_env)
    assert res.returncode == 0
    assert re.match(r"slurm(-wlm)? \d+\.\d+\.\d+", res.stdout), res.stdout
    assert os.path.isabs(res.argv[0]) and os.path.basename(res.argv[0]) == command
    assert res.argv[1:] == ("--version",)
    assert 0 <= res.duration_s < 20
    (entry,) = [e for e in logs if e["event"] == "slurm.call"]
    assert entry["argv"] == list(res.argv) and entry["returncode"] == 0
    assert entry["log_level"] == "info" and entry["duration_s"] >= 0


def test_binary_is_resolved_to_an_absolute_path_once():
    first = resolve_binary("scontrol")
    assert os.path.isabs(first) and os.access(first, os.X_OK)
    assert resolve_binary("scontrol") == first
    assert resolve_binary("scontrol", bin_dir=os.path.dirname(first)) == first


def test_missing_binary_names_the_package(tmp_path):
    with pytest.raises(SlurmNotInstalled) as err:
        run_slurm("scontrol", ["--version"], timeout=5, bin_dir=str(tmp_path))
    msg = str(err.value)
    assert "'scontrol' was not found" in msg and str(tmp_path) in msg
    assert "apt-get install slurm-client" in msg and "[slurm] bin_dir" in msg


def test_non_executable_file_is_not_a_binary(tmp_path):
    (tmp_path / "sinfo").write_text("#!/bin/sh\necho fake\n")
    (tmp_path / "sinfo").chmod(0o644)
    with pytest.raises(SlurmNotInstalled):
        resolve_binary("sinfo", bin_dir=str(tmp_path))


def test_failing_command_reports_argv_exit_code_and_stderr(no_controller_env):
    with capture_logs() as logs:
        with pytest.raises(SlurmError) as err:
            run_slurm("scontrol", ["show", "job", "99999"], timeout=20, env=no_controller_env)
    exc = err.value
    assert type(exc) is SlurmError
    assert exc.argv[1:] == ("show", "job", "99999") and os.path.basename(exc.argv[0]) == "scontrol"
    assert exc.returncode == 1
    assert "Unable to contact slurm controller" in exc.stderr
    msg = str(exc)
    assert msg.startswith("scontrol failed")
    assert f"command: {exc.argv[0]} show job 99999" in msg and "exit code: 1" in msg
    assert "stderr: slurm_load_jobs error: Unable to contact slurm controller" in msg
    assert [e["returncode"] for e in logs if e["event"] == "slurm.call"] == [1]


def test_failing_command_without_check_returns_the_result(no_controller_env):
    res = run_slurm(
        "scontrol", ["show", "job", "99999"], timeout=20, env=no_controller_env, check=False
    )
    assert res.returncode == 1 and "Unable to contact slurm controller" in res.stderr


def test_arguments_are_never_seen_by_a_shell(no_controller_env, tmp_path):
    marker = tmp_path / "pwned"
    hostile = f"n1;touch {marker};$(touch {marker})`touch {marker}`"
    res = run_slurm(
        "scontrol", ["show", "node", hostile], timeout=20, env=no_controller_env, check=False
    )
    assert res.argv[-1] == hostile and res.returncode != 0
    assert not marker.exists()


@pytest.mark.parametrize(
    "command", ["bash", "sh", "rm", "sacctmgr", "/usr/bin/scontrol", "scontrol ", "", "SCONTROL"]
)
def test_non_slurm_command_is_refused(command):
    with pytest.raises(
        SlurmError, match="is not a Slurm command scout runs; known: sacct, sbatch, scancel"
    ):
        run_slurm(command, ["--version"], timeout=5)


def test_known_commands():
    assert SLURM_COMMANDS == {"scontrol", "squeue", "sinfo", "sacct", "srun", "sbatch", "scancel"}


@pytest.mark.parametrize("arg", ["\x00", "n1\x00; rm -rf /", "a\x00b"])
def test_nul_byte_is_refused(arg, no_controller_env):
    with capture_logs() as logs:
        with pytest.raises(SlurmError, match="NUL byte"):
            run_slurm("scontrol", ["show", "node", arg], timeout=5, env=no_controller_env)
    assert not [e for e in logs if e["event"] == "slurm.call"]  # nothing was run


@pytest.mark.parametrize("arg", [3, None, b"n1", ["n1"]])
def test_non_str_argument_is_refused(arg):
    with pytest.raises(TypeError, match="must be a str"):
        run_slurm("scontrol", ["show", "node", arg], timeout=5)  # type: ignore[list-item]


def test_timeout_is_required_and_keyword_only():
    with pytest.raises(TypeError):
        run_slurm("scontrol", ["--version"])  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        run_slurm("scontrol", ["--version"], 5)  # type: ignore[misc]


def test_silent_controller_times_out(silent_controller_env):
    t0 = time.monotonic()
    with capture_logs() as logs:
        with pytest.raises(SlurmTimeout) as err:
            run_slurm("scontrol", ["show", "job", "99999"], timeout=0.5, env=silent_controller_env)
    elapsed = time.monotonic() - t0
    assert 0.5 <= elapsed < 1.9  # scontrol itself gives up after about 2 s: we did not wait for it
    exc = err.value
    assert exc.argv[1:] == ("show", "job", "99999") and exc.returncode is None
    assert "scontrol did not answer within 0.5 s; is slurmctld up?" in str(exc)
    (entry,) = [e for e in logs if e["event"] == "slurm.timeout"]
    assert entry["timeout_s"] == 0.5 and entry["argv"] == list(exc.argv)


def test_silent_controller_without_our_timeout_is_scontrols_own_error(silent_controller_env):
    # the same silent controller, given time: scontrol's MessageTimeout ends it, as a plain failure
    res = run_slurm(
        "scontrol", ["show", "job", "99999"], timeout=20, env=silent_controller_env, check=False
    )
    assert res.returncode == 1 and "Socket timed out on send/recv operation" in res.stderr
