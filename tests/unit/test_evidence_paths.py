"""Every path of the evidence folder is built by its folder objects (scout_slurm/evidence/layout.py:
JobFolder, RunFolder): a folder or file name of the layout written out anywhere else in scout_slurm,
in a `/` join, a Path(...) or os.path.join(...), a listing pattern or a name constant, fails here
with its file and line."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "scout_slurm"
LAYOUT = "evidence/layout.py"

# The folders of the layout, and its file names with `{}` where a run, rank, step or node goes.
FOLDERS = frozenset(
    {
        "nodes",
        "ranks",
        "progress",
        "findings",
        "stacks",
        "tasks",
        "checkpoints",
        "results",
        "pending",
    }
)
FILES = (
    "run-{}",
    "rank-{}.json",
    "exit-{}.json",
    "cost-{}.json",
    "log-{}.jsonl",
    "history-{}.bin",
    "rank-{}.txt",
    "votes.json",
    "stall-decision.json",
    "rendezvous-step-{}.json",
    "first-collective-step-{}.json",
    "run-{}-step-{}-rank-{}.json",
    "hardware-map.json",
    "epilog.json",
    "ranks-{}.json",
    "rootcheck-{}.json",
    "ib-counters-{}.json",
    "checkpoints-{}.json",
    "verdict-{}.json",
    "actions-{}.json",
    "resume-{}.json",
    "report-{}.md",
    "report-{}.html",
    "lock-{}",
    "drain-decisions-{}.json",
)
_FILE_RX = tuple(
    re.compile("^" + ".+".join(re.escape(part) for part in f.split("{}")) + "$") for f in FILES
)
# Calls whose arguments are paths or names in a folder.
PATH_CALLS = frozenset(
    {
        "Path",
        "PurePath",
        "PosixPath",
        "join",
        "joinpath",
        "glob",
        "rglob",
        "iglob",
        "fnmatch",
        "list_records",
        "list_named_records",
        "ensure_dir",
        "open_below",
        "mkdir",
    }
)

# Pieces that are not the evidence folder's, in files that also use its names.
NOT_EVIDENCE = {
    ("lab/cluster.py", "nodes"),  # the local lab's Slurm spool (SlurmdSpoolDir), not evidence
}

# TEMPORARY: hooks/ and report/incident_history.py are being moved into the incident package by
# another change while this one lands; the merger builds these paths with the layout methods named
# against each site in the change's notes and deletes each entry as its sites go (the count must
# fall with them: a new literal in these files fails too).
PENDING_MOVE: dict[str, int] = {}


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def is_piece(text: str | None) -> bool:
    if text is None:
        return False
    if text in FOLDERS:
        return True
    return any(rx.match(text.replace("*", "{}")) for rx in _FILE_RX)


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def literal_pieces(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, piece) of each path piece of the layout written out in `source`."""
    found = set()
    for node in ast.walk(ast.parse(source, filename)):
        candidates: list[ast.AST] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            candidates = [node.left, node.right]
        elif isinstance(node, ast.Call) and _call_name(node) in PATH_CALLS:
            candidates = list(node.args)
            for arg in node.args:
                if isinstance(arg, (ast.List, ast.Tuple)):
                    candidates += arg.elts
        elif isinstance(node, ast.Assign) and _text(node.value) not in FOLDERS:
            # a name constant for a file of the layout (a bare folder word is too common a value)
            candidates = [node.value]
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            candidates = [e for e in node.elts if _text(e) in FOLDERS]
        for c in candidates:
            text = _text(c)
            if is_piece(text):
                found.add((c.lineno, text))
    return sorted(found)


def scan() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == LAYOUT:
            continue
        hits = [
            (line, piece)
            for line, piece in literal_pieces(path.read_text(), str(path))
            if (rel, piece) not in NOT_EVIDENCE
        ]
        if hits:
            out[rel] = hits
    return out


def test_no_path_piece_outside_the_folder_objects():
    found = scan()
    wrong = [
        f"scout_slurm/{rel}:{line}: {piece!r}"
        for rel, hits in found.items()
        if rel not in PENDING_MOVE
        for line, piece in hits
    ]
    assert not wrong, (
        "evidence folder paths written out instead of built by evidence/layout.py "
        "(JobFolder, RunFolder; add a method there):\n" + "\n".join(wrong)
    )


def test_the_files_waiting_for_the_move_hold_no_new_pieces():
    found = scan()
    for rel, expected in PENDING_MOVE.items():
        hits = found.get(rel, [])
        sites = "\n".join(f"  scout_slurm/{rel}:{line}: {piece!r}" for line, piece in hits)
        assert len(hits) <= expected, (
            f"scout_slurm/{rel}: {len(hits)} path pieces written out, {expected} known: build the "
            f"new ones with evidence/layout.py\n{sites}"
        )
        assert len(hits) == expected, (
            f"scout_slurm/{rel}: {expected - len(hits)} fewer path pieces than PENDING_MOVE says: "
            f"lower its count (or drop the entry)\n{sites}"
        )


def test_the_checker_finds_bypasses_and_not_words():
    source = textwrap.dedent(
        """
        write(run_dir / "findings" / name, f)
        p = folder.path / f"run-{restart}" / "ranks" / f"exit-{rank}.json"
        names = list_records(d, "rank-*.json", RankPlace)
        MAP = "hardware-map.json"
        parts = [cluster, str(job), "nodes"]
        log.info("the findings were written", where="results")
        state = "pending"
        print(f"scout: run-{restart} ended")
        status["nodes"]
        """
    )
    assert literal_pieces(source) == [
        (2, "findings"),
        (3, "exit-{}.json"),
        (3, "ranks"),
        (3, "run-{}"),
        (4, "rank-*.json"),
        (5, "hardware-map.json"),
        (6, "nodes"),
    ]
