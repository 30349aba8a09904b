"""The two container shapes run for real against another root: a minimal image (this host's /usr
read-only: a Python with the stdlib alone, no scout, no structlog) entered with unshare and chroot
as the runtimes do. pyxis is stood in for by mounting what scout-srun adds to --container-mounts
and running its start words in the image; Apptainer by a stand-in that does what `apptainer exec`
does with -B and APPTAINERENV_* under --cleanenv. Both show scout's bootstrap active in the
image's Python. Root only (mounts); every mount is in a private mount namespace that ends with
the test's processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scout_slurm.evidence.layout import JobFolder
from scout_slurm.launcher import containers, srun
from scout_slurm.task import apptainer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0
        or shutil.which("unshare") is None
        or shutil.which("chroot") is None
        or not os.path.exists("/usr/bin/python3"),
        reason="needs root, unshare, chroot and a system python3 for the image",
    ),
]

# what the training command prints inside the image: are scout's hooks in this Python?
CHILD = (
    "import os, sys; print('hooks', 'scout_slurm.bootstrap.patches' in sys.modules, "
    "type(sys.meta_path[0]).__name__, os.environ.get('SCOUT_PACKAGE_DIR'), sys.prefix)"
)
# mount what each "src dst flags" line of stdin names into $R, then chroot into it; a private
# mount namespace: nothing here is seen outside it, and it all goes when the command ends
ENTER = r"""set -e
R=$1; shift
mount --bind /usr "$R/usr"; mount -o remount,bind,ro "$R/usr"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
while read -r src dst flags; do
  if [ -d "$src" ]; then mkdir -p "$R$dst"; else mkdir -p "$(dirname "$R$dst")"; touch "$R$dst"; fi
  mount --bind "$src" "$R$dst"
  case "$flags" in ro*) mount -o remount,bind,ro "$R$dst";; esac
done
exec "$(command -v chroot || echo /usr/sbin/chroot)" "$R" "$@"
"""


def make_image(path: Path) -> Path:
    for d in ("usr", "proc", "dev", "tmp", "etc"):
        (path / d).mkdir(parents=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        (path / link).symlink_to(f"usr/{link}")
    return path


def slurm_env(config: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_NTASKS": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "node1",
        "SLURM_STEP_NODELIST": "node1",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURM_CLUSTER_NAME": "lab",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29555",
        "SCOUT_CONFIG": str(config),
    }


@pytest.fixture
def site(tmp_path):
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    config = tmp_path / "scout.toml"
    config.write_text(f'[evidence]\nroot = "{evidence}"\n')
    return evidence, config


def test_pyxis_shape_the_shim_and_the_bootstrap_run_in_the_images_python(tmp_path, site):
    evidence, config = site
    image = make_image(tmp_path / "image")
    # scout-srun's own plan for this step, from this install
    install = containers.scout_install(str(evidence), str(config))
    plan = srun.split_args(["--container-image=img", "python3", "-c", CHILD])
    args = srun.srun_argv(plan, sys.executable, install, {})
    mounts_at = next(i for i, a in enumerate(args) if a.startswith("--container-mounts="))
    mounts = containers.parse_mounts(args[mounts_at].split("=", 1)[1])
    start = args[mounts_at + 1 :]
    lines = "".join(f"{m.src} {m.dst} {m.flags}\n" for m in mounts)
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", ENTER, "pyxis", str(image)]
        + start,
        input=lines,
        env=slurm_env(config),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # the bootstrap's hooks in the image's own Python (/usr), scout found at the mount
    assert out.stdout.split() == [
        "hooks",
        "True",
        "PatchAfterImport",
        f"{containers.IN_CONTAINER_LIB}/scout_slurm",
        "/usr",
    ], out.stderr
    # and the shim, run by the image's Python, recorded the rank's place in the evidence root
    folder = JobFolder(evidence, "lab", 42)
    assert folder.rank_place_path(0, 0).is_file(), out.stderr


def test_pyxis_shape_an_image_without_scouts_mounts_runs_the_task_unwatched(tmp_path, site):
    evidence, config = site
    image = make_image(tmp_path / "image")
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", ENTER, "pyxis", str(image)]
        + ["/bin/sh", "-c", containers.SH_START, "scout-task", containers.ENTRY]
        + ["python3", "-c", "import os; print('rank', os.environ['RANK'])"],
        input="",
        env=slurm_env(config),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "rank 0\n"
    assert "scout cannot start in this container image" in out.stderr


# `apptainer exec [-B spec]... [--cleanenv] IMAGE CMD...` as far as scout relies on it: binds,
# APPTAINERENV_* set inside (the rest of the environment dropped under --cleanenv), CMD in IMAGE
FAKE_APPTAINER = r"""
import os, subprocess, sys
args = sys.argv[1:]
assert args[0] == "exec", args
i, binds, clean = 1, [], False
while args[i].startswith("-"):
    if args[i] == "-B":
        binds += args[i + 1].split(","); i += 2; continue
    clean = clean or args[i] in ("--cleanenv", "-e", "--containall", "-C"); i += 1
image, command = args[i], args[i + 1:]
env = {} if clean else dict(os.environ)
env.update({k[len("APPTAINERENV_"):]: v for k, v in os.environ.items()
            if k.startswith("APPTAINERENV_")})
env.setdefault("PATH", "/usr/bin:/bin")
lines = ""
for spec in binds:
    parts = spec.split(":")
    lines += f"{parts[0]} {parts[1] if len(parts) > 1 else parts[0]} {''.join(parts[2:])}\n"
sys.exit(subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                         os.environ["ENTER"], "apptainer", image, *command],
                        input=lines, text=True, env={**env, "ENTER": os.environ["ENTER"]}
                        ).returncode)
"""


def test_apptainer_shape_the_shim_on_the_host_and_the_bootstrap_in_the_containers_python(
    tmp_path, site
):
    evidence, config = site
    image = make_image(tmp_path / "image")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "apptainer"
    fake.write_text(f"#!{sys.executable}\n{FAKE_APPTAINER}")
    fake.chmod(0o755)
    env = slurm_env(config)
    env["PATH"] = f"{bindir}:/usr/bin:/bin"
    env["ENTER"] = ENTER
    out = subprocess.run(
        [sys.executable, "-m", "scout_slurm.task.shim", "--", "apptainer", "exec", "--cleanenv"]
        + [str(image), "python3", "-c", CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "hooks",
        "True",
        "PatchAfterImport",
        apptainer.IN_CONTAINER_PACKAGE,
        "/usr",
    ], out.stderr
    assert "bootstrap not installed" not in out.stderr
