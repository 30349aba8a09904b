"""No import cycles anywhere in scout_slurm: a static walk (ast; nothing is imported) of every
import statement in every module, at module level and inside functions alike (a function-level
import only postpones a cycle to the call that runs it). Tarjan's strongly connected components
over the graph; a component of more than one module, or a module importing itself, is a cycle."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "scout_slurm"


def module_name(path: Path, package_dir: Path) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(package_dir: Path) -> dict[str, Path]:
    return {
        module_name(p, package_dir): p
        for p in package_dir.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, known) -> set[str]:
    """The package's modules an import statement loads (the deepest known module of each name)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the importing module's package, up level - 1
            package = here.split(".") if is_package else here.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        # `from a.b import c` loads a.b.c when c is a module, else only a.b
        names = [f"{base}.{a.name}" for a in node.names]
    out = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    modules = package_modules(package_dir)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, name, path.name == "__init__.py", modules)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, and modules importing themselves
    (Tarjan, iterative so that a deep package cannot hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1 or v in graph[v]:
                        found.append(sorted(component))
    return found


def test_scout_slurm_has_no_import_cycles():
    graph = import_graph(PACKAGE_DIR)
    assert len(graph) > 100  # the walk found the package
    found = cycles(graph)
    assert not found, "import cycles (function-level imports count):\n" + "\n".join(
        "  " + " <-> ".join(c) for c in found
    )


def test_the_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "hooks").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "hooks" / "__init__.py").write_text("")
    (pkg / "hooks" / "a.py").write_text("from pkg.hooks.b import f\n")
    (pkg / "hooks" / "b.py").write_text("def f():\n    from pkg.hooks import a\n")
    (pkg / "hooks" / "c.py").write_text("from . import b\n")  # relative, and no cycle
    (pkg / "d.py").write_text("import pkg.d\n")  # a module importing itself
    graph = import_graph(pkg)
    assert graph["pkg.hooks.c"] == {"pkg.hooks.b"}
    assert cycles(graph) == [["pkg.d"], ["pkg.hooks.a", "pkg.hooks.b"]]


def test_no_cycle_is_found_in_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


if __name__ == "__main__":
    for c in cycles(import_graph(PACKAGE_DIR)):
        print(" <-> ".join(c))
    sys.exit(0)
