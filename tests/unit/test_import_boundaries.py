"""The pure core stays pure: a static walk (ast, no import is executed) of the imports of the
modules that take records and return records. A pure module may not import the rim (what reads
or writes files, calls Slurm, or runs as a hook), read the environment, or import subprocess,
torch.distributed or pynvml; nor may anything that importing it runs (the scout_slurm modules
it imports, followed transitively).

What is checked where:
- a pure module: every import statement in it, function-level ones included (a call could run
  them), and every use of os.environ / os.getenv / os.putenv;
- a scout_slurm module a pure module reaches that is not itself listed pure: the imports that
  importing it runs (module level, class bodies, top-level if/try; not inside functions). What
  such a module does inside a function the pure code does not call is its own business, which a
  static walk cannot see.
A rim module that is listed in PURE is allowed: it is then checked by the same rules.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "scout_slurm"

# The pure modules, each with why it is in the list. localise/ is taken whole (glob below).
PURE_NAMED = {
    "scout_slurm.remediation.plan": "drain/requeue decisions: a verdict and notes in, planned "
    "actions out",
    "scout_slurm.remediation.eligibility": "checkpoint eligibility: notes and a verdict in, a "
    "status out",
    "scout_slurm.remediation.signatures": "state signatures compared: notes in, mismatches out",
    "scout_slurm.remediation.records": "typed records only",
    "scout_slurm.bootstrap.replicas": "the majority vote tallies (the torch calls around them "
    "live elsewhere)",
    "scout_slurm.evidence.records": "typed records only",
    "scout_slurm.evidence.codec": "records <-> JSON, no I/O (the I/O is evidence/safeio.py)",
    "scout_slurm.evidence.contract": "the list of record types, who writes them and where",
    "scout_slurm.evidence.cascade": "stderr text -> does it name a peer's failure",
    "scout_slurm.hwmap.records": "typed records only",
    "scout_slurm.slurm.hostlist": "hostlist text <-> names",
    "scout_slurm.slurm.parse": "Slurm's text and JSON -> records (the door that gets them is "
    "slurm/door.py)",
    "scout_slurm.task.exitcodes": "the exit code table (constants) the localiser reads exits by",
    "scout_slurm.incident.localise": "the incident's localise stage: evidence in, a verdict out",
    "scout_slurm.incident.decide": "the incident's decide stage: named nodes and history in, "
    "decisions out",
    "scout_slurm.incident.plan": "the incident's plan stage: decisions in, the plan and its "
    "records out",
}
# Looked at and left out, with the reason (so that a later reader does not add them unthinking):
NOT_PURE = {
    "scout_slurm.hwmap.join": "reads rank places and hardware maps (evidence.store) and asks NVML "
    "for UUIDs",
    "scout_slurm.remediation.apply": "the executor: applies actions through the door, writes "
    "records",
    "scout_slurm.remediation.verifyuser": "opens the checkpoints a job named, as the job's user",
    "scout_slurm.remediation.checkpoint_assessment": "reads a job's notes and records",
}

# Importing any of these (or a module below them) from the pure core is a violation.
RIM = (
    "scout_slurm.evidence.store",
    "scout_slurm.evidence.safeio",
    "scout_slurm.evidence.gather",
    "scout_slurm.evidence.digest",
    "scout_slurm.evidence.checkfiles",
    "scout_slurm.slurm.door",
    "scout_slurm.slurm.ops",
    "scout_slurm.hooks",
    "scout_slurm.incident.gather",
    "scout_slurm.incident.apply",
    "scout_slurm.incident.report",
    "scout_slurm.incident.run",
    "scout_slurm.incident.pending",
    "scout_slurm.incident.history",
    "scout_slurm.task",
    "scout_slurm.launcher",
    "scout_slurm.lab",
    "scout_slurm.acceptance",
    "scout_slurm.inject",
    "scout_slurm.cli",
    "scout_slurm.site",
)
FORBIDDEN_EXTERNAL = ("subprocess", "torch.distributed", "pynvml")
ENV_ATTRS = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


def pure_modules() -> list[str]:
    localise = sorted(
        f"scout_slurm.localise.{p.stem}"
        for p in (PACKAGE_DIR / "localise").glob("*.py")
        if p.stem != "__init__"
    )
    return localise + sorted(PURE_NAMED)


# --------------------------------------------------------------------------------------------
# The checker
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    what: str
    via: tuple[str, ...] = ()  # the pure module, then the modules that led here

    def __str__(self) -> str:
        chain = f" (reached from {' -> '.join(self.via)})" if len(self.via) > 1 else ""
        return f"{self.path}:{self.line}: {self.what}{chain}"


Sources = Callable[
    [str], "tuple[str, str, bool] | None"
]  # module -> (shown path, text, is package)


def package_sources(extra: dict[str, tuple[str, str]] | None = None) -> Sources:
    """The source of a scout_slurm module from the package folder, `extra` (planted modules)
    first; None for what is not a scout_slurm module."""
    extra = extra or {}

    def get(module: str) -> tuple[str, str, bool] | None:
        if module in extra:
            shown, text = extra[module]
            return shown, text, False
        if module != "scout_slurm" and not module.startswith("scout_slurm."):
            return None
        parts = module.split(".")[1:]
        candidates = [(PACKAGE_DIR.joinpath(*parts, "__init__.py"), True)]
        if parts:
            candidates.append((PACKAGE_DIR.joinpath(*parts[:-1], parts[-1] + ".py"), False))
        for path, is_pkg in candidates:
            if path.is_file():
                return str(path.relative_to(PACKAGE_DIR.parent)), path.read_text(), is_pkg
        return None

    return get


def _within(name: str, prefixes: Iterable[str]) -> str | None:
    for p in prefixes:
        if name == p or name.startswith(p + "."):
            return p
    return None


def _imports(
    tree: ast.Module, module: str, is_pkg: bool, sources: Sources, *, function_level: bool
) -> list[tuple[int, str]]:
    """(line, module name) of each import; `from a import b` gives a.b when that is a module."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if (
                isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                and not function_level
            ):
                continue
            if isinstance(child, ast.Import):
                out.extend((child.lineno, a.name) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = module.split(".")
                    keep = len(parts) - child.level + (1 if is_pkg else 0)
                    base = ".".join(parts[:keep] + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    out.append(
                        (
                            child.lineno,
                            sub
                            if a.name != "*"
                            and (sources(sub) is not None or _within(sub, FORBIDDEN_EXTERNAL))
                            else base,
                        )
                    )
            visit(child)

    visit(tree)
    return out


def _env_uses(tree: ast.Module) -> list[tuple[int, str]]:
    """Reads of the environment, and torch.distributed reached as an attribute of torch."""
    os_names = {"os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {a.asname for a in node.names if a.name == "os" and a.asname}
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ENV_ATTRS
            and isinstance(node.value, ast.Name)
            and node.value.id in os_names
        ):
            found.append((node.lineno, f"reads the environment (os.{node.attr})"))
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "distributed"
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        ):
            found.append((node.lineno, "uses torch.distributed (forbidden in the pure core)"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            for a in node.names:
                if a.name in ENV_ATTRS:
                    found.append((node.lineno, f"reads the environment (from os import {a.name})"))
    return found


def check(
    pure: Iterable[str], sources: Sources, *, also_pure: Iterable[str] = ()
) -> list[Violation]:
    """Every violation of the pure modules `pure`, each once, by path and line. `also_pure`:
    modules that count as pure when reached (checked by the same rules then) without being
    walked from."""
    pure = list(pure)
    pure_set = set(pure) | set(also_pure)
    violations: list[Violation] = []
    seen_violation: set[tuple[str, int, str]] = set()

    def add(v: Violation) -> None:
        key = (v.path, v.line, v.what)
        if key not in seen_violation:
            seen_violation.add(key)
            violations.append(v)

    for root in pure:
        found = sources(root)
        if found is None:
            raise AssertionError(
                f"pure module {root} has no source under {PACKAGE_DIR}: "
                "fix the list in tests/unit/test_import_boundaries.py"
            )
        todo = [(root, (root,))]
        visited: set[str] = set()
        while todo:
            module, via = todo.pop()
            if module in visited:
                continue
            visited.add(module)
            got = sources(module)
            if got is None:
                continue
            shown, text, is_pkg = got
            tree = ast.parse(text, filename=shown)
            is_pure = module in pure_set
            if is_pure:
                for line, what in _env_uses(tree):
                    add(Violation(shown, line, what, via))
            for line, name in _imports(tree, module, is_pkg, sources, function_level=is_pure):
                external = _within(name, FORBIDDEN_EXTERNAL)
                if external:
                    add(
                        Violation(
                            shown,
                            line,
                            f"imports {name} (forbidden in the pure core: {external})",
                            via,
                        )
                    )
                    continue
                rim = _within(name, RIM)
                if rim and name not in pure_set:
                    add(Violation(shown, line, f"imports {name} (the rim: {rim})", via))
                    continue
                # what importing `name` runs: its packages' __init__ first, then itself
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = ".".join(parts[:i])
                    if sources(target) is not None and target not in visited:
                        todo.append((target, via + (target,)))
    return violations


# --------------------------------------------------------------------------------------------
# The core as it is
# --------------------------------------------------------------------------------------------


def test_the_pure_core_imports_no_rim_no_environment_no_subprocess():
    violations = check(pure_modules(), package_sources())
    assert not violations, "pure modules reach outside:\n" + "\n".join(map(str, violations))


def test_the_lists_name_real_modules():
    sources = package_sources()
    for module in [*pure_modules(), *NOT_PURE]:
        assert sources(module) is not None, module
    assert "scout_slurm.localise.verdict" in pure_modules()
    assert not set(PURE_NAMED) & set(NOT_PURE)


# --------------------------------------------------------------------------------------------
# The checker itself, on planted sources
# --------------------------------------------------------------------------------------------

PLANTED = "scout_slurm.localise.planted"


def planted(text: str, **more: str) -> list[str]:
    extra = {PLANTED: ("scout_slurm/localise/planted.py", text)}
    extra |= {name: (name.replace(".", "/") + ".py", src) for name, src in more.items()}
    return [str(v) for v in check([PLANTED], package_sources(extra), also_pure=pure_modules())]


def test_a_clean_planted_module_passes():
    assert (
        planted(
            "import re\nfrom scout_slurm.evidence.records import Verdict\n"
            "from scout_slurm.localise import verdict\nfrom scout_slurm.remediation import plan\n"
        )
        == []
    )


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("import json\nimport subprocess\n", 2, "imports subprocess"),
        ("def f():\n    import subprocess\n    return subprocess.run\n", 2, "imports subprocess"),
        ("import torch.distributed as dist\n", 1, "imports torch.distributed"),
        ("from torch import distributed\n", 1, "imports torch.distributed"),
        ("import pynvml\n", 1, "imports pynvml"),
        (
            "import torch\n\ndef f():\n    return torch.distributed.get_rank()\n",
            4,
            "uses torch.distributed",
        ),
        ("import os\n\nLEVEL = os.environ.get('X')\n", 3, "reads the environment (os.environ)"),
        (
            "import os as o\ndef f():\n    return o.getenv('X')\n",
            3,
            "reads the environment (os.getenv)",
        ),
        ("from os import environ\n", 1, "reads the environment (from os import environ)"),
        (
            "from scout_slurm.evidence import store\n",
            1,
            "imports scout_slurm.evidence.store (the rim",
        ),
        (
            "from scout_slurm.evidence.safeio import read_at\n",
            1,
            "imports scout_slurm.evidence.safeio (the rim",
        ),
        (
            "def f():\n    from scout_slurm.hooks.controller import run\n",
            2,
            "imports scout_slurm.hooks.controller",
        ),
        ("from ..slurm import door\n", 1, "imports scout_slurm.slurm.door (the rim"),
        ("import scout_slurm.cli\n", 1, "imports scout_slurm.cli (the rim"),
    ],
)
def test_a_planted_violation_is_reported_by_module_and_line(text, line, words):
    found = planted(text)
    assert len(found) == 1, found
    assert found[0].startswith(f"scout_slurm/localise/planted.py:{line}: {words}"), found


def test_a_violation_reached_through_another_module_names_the_chain():
    helper = "scout_slurm.planted_helper"
    found = planted(
        "from scout_slurm.planted_helper import thing\n",
        **{helper: "import re\nimport pynvml\n\ndef thing():\n    import subprocess\n"},
    )
    # pynvml runs on import; the function-level subprocess does not, and is not the pure module's
    assert found == [
        f"scout_slurm/planted_helper.py:2: imports pynvml (forbidden in the pure core: pynvml) "
        f"(reached from {PLANTED} -> {helper})"
    ]


def test_the_real_rim_reached_through_a_real_module_is_found():
    # hwmap.join imports evidence.store at module level: a pure module importing it is caught
    found = planted("from scout_slurm.hwmap.join import join_with_map\n")
    assert any("scout_slurm/hwmap/join.py" in v and "evidence.store" in v for v in found), found


if __name__ == "__main__":  # a report of the whole core, for a person
    for v in check(pure_modules(), package_sources()):
        print(v)
    sys.exit(0)
