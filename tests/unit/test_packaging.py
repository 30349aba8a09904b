"""What each host imports: the Slurm hooks and the operator commands run on every node and on the
slurmctld host, as root; they must not pull torch, numpy or the lab/acceptance/injection code, and
every third-party module they import must be one of the package's core dependencies (the in-job
part's are the `job` extra)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The packages whose every module a hook or an operator command may import.
HOST_PACKAGES = (
    "scout_slurm.hooks",
    "scout_slurm.report",
    "scout_slurm.localise",
    "scout_slurm.remediation",
    "scout_slurm.evidence",
    "scout_slurm.slurm",
    "scout_slurm.hwmap",
    "scout_slurm.site",
)
HOST_MODULES = (
    "scout_slurm.cli",
    "scout_slurm.config",
    "scout_slurm.jobenv",
    "scout_slurm.trust",
    "scout_slurm.log",
    "scout_slurm.launcher.srun",
    "scout_slurm.task.shim",
)
# import name -> distribution in pyproject's core dependencies
CORE_IMPORTS = {"click": "click", "structlog": "structlog", "pynvml": "nvidia-ml-py"}
NEVER_ON_HOSTS = (
    "torch",
    "numpy",
    "xxhash",
    "scout_slurm.lab.",
    "scout_slurm.acceptance",
    "scout_slurm.inject",
    "scout_slurm.bootstrap",
)

# third-party modules are counted where scout's own modules import them (an `import` statement in
# a scout_slurm module): a core dependency's own optional imports (structlog imports rich when it is
# installed, as the frameworks extra's transformers brings it) are not the hosts' dependencies
_PROBE = r"""
import builtins, importlib, json, pkgutil, sys
before = set(sys.modules)
direct = set()
_import = builtins.__import__
def _seen(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and str((globals or {}).get("__name__", "")).startswith("scout_slurm"):
        direct.add(name.split(".")[0])
    return _import(name, globals, locals, fromlist, level)
builtins.__import__ = _seen
names = list(MODULES)
for pkg in PACKAGES:
    mod = importlib.import_module(pkg)
    names += [pkg + "." + m.name for m in pkgutil.iter_modules(mod.__path__)]
for name in names:
    importlib.import_module(name)
loaded = sorted(set(sys.modules) - before)
third = sorted({m for m in direct if m not in sys.stdlib_module_names
                and not m.startswith(("scout_slurm", "_"))})
print(json.dumps({"names": names, "loaded": loaded, "third_party": third}))
"""


def _probe() -> dict:
    code = _PROBE.replace("MODULES", repr(HOST_MODULES)).replace("PACKAGES", repr(HOST_PACKAGES))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def test_host_modules_import_neither_torch_nor_the_lab():
    seen = _probe()
    assert len(seen["names"]) > 40, seen["names"]  # the walk found the packages' modules
    bad = [
        m
        for m in seen["loaded"]
        if m.startswith(NEVER_ON_HOSTS) or m in ("scout_slurm.lab.cluster",)
    ]
    assert not bad, f"host-side modules import {bad}"


def test_host_third_party_imports_are_core_dependencies():
    seen = _probe()
    assert set(seen["third_party"]) <= set(CORE_IMPORTS), (
        f"host-side modules import {sorted(set(seen['third_party']) - set(CORE_IMPORTS))}, "
        "not core dependencies"
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]}
    assert set(CORE_IMPORTS.values()) == core, (
        f"core dependencies {core} differ from what the hosts import"
    )
    job = {d.split(">")[0].split("=")[0].strip() for d in project["optional-dependencies"]["job"]}
    assert {"torch", "xxhash"} <= job and not job & core
