"""The shape of the package as a maintainer reads it: the largest modules, the longest functions,
which modules read the process environment, and how long the Slurm hooks take to start with
nothing to do. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/code_figures.py [--top 10] [--startup-runs 10]
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "scout_slurm"


def modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def functions(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(
                (
                    node.end_lineno - node.lineno + 1,
                    f"{path.relative_to(ROOT)}:{node.lineno} {node.name}",
                )
            )
    return out


def reads_environment(path: Path) -> int:
    """Reads of os.environ / os.getenv in the module (attribute uses, calls and subscripts)."""
    tree = ast.parse(path.read_text(), str(path))
    count = 0
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in ("environ", "getenv")
        ):
            count += 1
    return count


def startup(command: list[str], runs: int) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SCOUT_"))}
    with tempfile.TemporaryDirectory() as tmp:
        env["SCOUT_CONFIG"] = str(Path(tmp) / "absent.toml")
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
            )
            times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--startup-runs", type=int, default=10)
    args = ap.parse_args()
    mods = modules()
    sizes = sorted(
        ((len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in mods), reverse=True
    )
    print(f"modules: {len(mods)}, lines: {sum(n for n, _ in sizes)}")
    print(f"largest modules (top {args.top}):")
    for n, name in sizes[: args.top]:
        print(f"  {n:5d}  {name}")
    funcs = sorted((f for p in mods for f in functions(p)), reverse=True)
    print(
        f"longest functions (top {args.top}; {sum(1 for n, _ in funcs if n > 60)} of "
        f"{len(funcs)} over 60 lines):"
    )
    for n, name in funcs[: args.top]:
        print(f"  {n:5d}  {name}")
    env = [(reads_environment(p), str(p.relative_to(ROOT))) for p in mods]
    env = sorted((e for e in env if e[0]), reverse=True)
    boot = sum(n for n, name in env if "/bootstrap/" in name)
    print(
        f"modules reading os.environ: {len(env)} ({sum(n for n, _ in env)} reads; under "
        f"bootstrap/: {boot})"
    )
    for n, name in env:
        print(f"  {n:5d}  {name}")
    bindir = Path(sys.executable).parent
    for hook in ("scout-epilog", "scout-prolog", "scout-epilog-slurmctld"):
        exe = bindir / hook
        if not exe.exists():
            print(f"{hook}: not installed in {bindir}")
            continue
        med, best = startup([str(exe)], args.startup_runs)
        print(
            f"SUMMARY {hook} start-up with nothing to do: median {med * 1000:.0f} ms, best "
            f"{best * 1000:.0f} ms "
            f"({args.startup_runs} runs)"
        )
    for mod in ("scout_slurm.hooks.epilog", "scout_slurm.hooks.controller", "scout_slurm.cli"):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys, {mod}; "
                "print(sorted({m.split('.')[0] for m in sys.modules} & "
                "{'torch','numpy','scout_slurm.lab'}), "
                "sorted(m for m in sys.modules if "
                "m.startswith(('scout_slurm.lab','scout_slurm.acceptance','scout_slurm.inject'))))",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        print(f"imports of {mod}: heavy={out.stdout.strip() or out.stderr.strip()[-200:]}")


if __name__ == "__main__":
    main()
