"""`scout site install`: the layout it computes, the hook wrappers it writes (run for real with a
stand-in hook), and, from a wheel installed into a clean venv, the files a site gets without the
source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from scout_slurm import __version__
from scout_slurm.cli import main
from scout_slurm.site import layout

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = (
    "scout_slurm/site/scout.toml.example",
    "scout_slurm/site/slurm.conf.snippet.in",
    "scout_slurm/site/THREAT-MODEL.md",
)


def _layout(tmp_path: Path, scripts: Path | None = None) -> layout.SiteLayout:
    return layout.site_layout(
        tmp_path / "site",
        scripts_dir=scripts or tmp_path / "bin",
        python=tmp_path / "bin" / "python",
        slurm_conf=Path("/etc/slurm/slurm.conf"),
    )


def test_the_layout_names_this_interpreters_hooks_and_fills_every_placeholder(tmp_path):
    site = _layout(tmp_path)
    paths = {f.path.relative_to(site.prefix).as_posix() for f in site.files}
    assert paths == {
        "etc/scout/scout.toml",
        "etc/scout/slurm.conf.snippet",
        "etc/scout/prolog.d/scout-prolog",
        "etc/scout/epilog.d/scout-epilog",
        "libexec/scout/scout-prolog",
        "libexec/scout/scout-epilog",
        "libexec/scout/scout-epilog-slurmctld",
        "share/doc/scout/THREAT-MODEL.md",
    }
    snippet = next(f.text for f in site.files if f.path == site.snippet)
    assert "@" not in snippet, snippet
    active = [ln for ln in snippet.splitlines() if ln and not ln.startswith("#")]
    assert active == [
        "PrologFlags=Alloc",
        f"Prolog={site.prefix}/etc/scout/prolog.d/*",
        f"Epilog={site.prefix}/etc/scout/epilog.d/*",
        f"EpilogSlurmctld={site.prefix}/libexec/scout/scout-epilog-slurmctld",
        "MinJobAge=300",
    ]
    for hook in layout.HOOKS:
        wrapper = next(f for f in site.files if f.path == site.wrappers[hook.parameter])
        assert wrapper.mode == 0o755
        assert f"exec '{tmp_path}/bin/{hook.script}'" in wrapper.text
        assert f"export SCOUT_CONFIG='{site.config}'" in wrapper.text
        assert ("SLURM_CONF=" in wrapper.text) == hook.controller
    config = next(f for f in site.files if f.path == site.config)
    assert config.keep_existing and tomllib.loads(config.text)["remediation"]["observe_only"]


def test_a_path_that_cannot_be_quoted_is_refused(tmp_path):
    with pytest.raises(Exception, match="quote or a newline"):
        _layout(tmp_path / "it's")


def test_the_wrapper_sets_the_hooks_environment_logs_and_keeps_the_exit_status(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "scout-prolog"
    stand_in.write_text('#!/bin/sh\necho "config=$SCOUT_CONFIG path=$PATH"\nexit 3\n')
    stand_in.chmod(0o755)
    site = _layout(tmp_path, bin_dir)
    layout.write_layout(site)
    # slurmd gives a hook no PATH: run it with an empty environment, as Slurm would
    linked = site.prefix / "etc/scout/prolog.d/scout-prolog"
    run = subprocess.run(
        [str(linked)], env={}, check=False, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 3 and run.stdout == ""
    log = (site.logs / "scout-prolog.log").read_text()
    assert f"config={site.config} path={layout.HOOK_PATH}" in log
    # a log it cannot open (a folder in its place) does not stop the hook
    shutil.rmtree(site.logs)
    (site.logs / "scout-prolog.log").mkdir(parents=True)
    run = subprocess.run(
        [str(linked)], env={}, check=False, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 3 and f"config={site.config}" in run.stdout


def test_site_install_keeps_an_existing_config_and_says_what_to_add(tmp_path):
    prefix = tmp_path / "site"
    (prefix / "etc/scout").mkdir(parents=True)
    (prefix / "etc/scout/scout.toml").write_text("[evidence]\nroot = '/mine'\n")
    result = CliRunner().invoke(main, ["site", "install", "--prefix", str(prefix)])
    assert result.exit_code == 0, result.output
    assert (prefix / "etc/scout/scout.toml").read_text() == "[evidence]\nroot = '/mine'\n"
    assert f"kept (exists)  {prefix}/etc/scout/scout.toml" in result.output
    assert f"Prolog={prefix}/etc/scout/prolog.d/*" in result.output
    assert (prefix / "share/doc/scout/THREAT-MODEL.md").read_text() == (
        ROOT / "docs/THREAT-MODEL.md"
    ).read_text()
    again = CliRunner().invoke(main, ["site", "install", "--prefix", str(prefix)])
    assert again.exit_code == 0, again.output


def test_a_prefix_it_cannot_write_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(main, ["site", "install", "--prefix", str(tmp_path / "file/x")])
    assert result.exit_code == 1 and "choose another --prefix" in result.output, result.output


def test_the_packaged_files_are_the_repositorys():
    # scout_slurm/site/ links to the files where the repository keeps them; the wheel holds copies
    for name, source in {
        "scout.toml.example": "epilog/scout.toml.example",
        "THREAT-MODEL.md": "docs/THREAT-MODEL.md",
    }.items():
        assert layout.package_text(name) == (ROOT / source).read_text(), name


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_wheel_lays_out_a_site_without_the_source_tree(tmp_path):
    started = time.monotonic()
    built = _pip(Path(sys.executable), "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT))
    assert built.returncode == 0, built.stderr
    build_s = time.monotonic() - started
    (wheel,) = tmp_path.glob("scout_slurm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for name in SHIPPED:
            assert name in names, name
            assert zf.getinfo(name).external_attr >> 28 != 0o12, f"{name} is a link in the wheel"
        assert (
            zf.read("scout_slurm/site/THREAT-MODEL.md").decode()
            == (ROOT / "docs/THREAT-MODEL.md").read_text()
        )
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = zf.read(entry_points).decode()
    for script in ("scout-prolog", "scout-epilog", "scout-epilog-slurmctld", "scout", "scout-srun"):
        assert f"{script} = " in scripts, script
    print(f"wheel built in {build_s:.1f} s: {wheel.name}")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    installed = _pip(python, "install", "-q", str(wheel))
    if installed.returncode != 0:
        pytest.skip(
            "the wheel's dependencies (click, structlog, nvidia-ml-py) could not be installed "
            f"from pip's configured sources here: {installed.stderr.strip()[-300:]}"
        )
    prefix = tmp_path / "site"
    # outside the source tree, so nothing imports scout_slurm from the checkout
    run = subprocess.run(
        [str(env_dir / "bin" / "scout"), "site", "install", "--prefix", str(prefix)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert run.returncode == 0, run.stderr
    for rel in (
        "etc/scout/scout.toml",
        "etc/scout/slurm.conf.snippet",
        "share/doc/scout/THREAT-MODEL.md",
    ):
        assert (prefix / rel).is_file(), rel
    snippet = (prefix / "etc/scout/slurm.conf.snippet").read_text()
    assert f"EpilogSlurmctld={prefix}/libexec/scout/scout-epilog-slurmctld" in snippet
    wrapper = (prefix / "libexec/scout/scout-epilog-slurmctld").read_text()
    assert f"exec '{env_dir}/bin/scout-epilog-slurmctld'" in wrapper
    assert str(ROOT) not in wrapper + snippet
    version = subprocess.run(
        [str(env_dir / "bin" / "scout"), "--version"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert version.stdout.strip() == f"scout (scout-slurm) {__version__}"
    print(f"wheel to laid-out site in {time.monotonic() - started:.1f} s")
