"""The evidence contract (scout_slurm/evidence/contract.py) lists every versioned record type
exactly
once, with versions that are the classes' own; docs/HOW-IT-WORKS.md's table is rendered from it;
evidence/ reads and writes records without importing the layers above it."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from scout_slurm.evidence import layout
from scout_slurm.evidence.contract import RECORDS, Writer, render_markdown

PACKAGE = Path(__file__).resolve().parents[2] / "scout_slurm"
HOW_IT_WORKS = PACKAGE.parent / "docs" / "HOW-IT-WORKS.md"
BLOCK = re.compile(r"<!-- evidence-records:begin -->\n(.*?)<!-- evidence-records:end -->", re.S)


def versioned_dataclasses() -> list[str]:
    """ "module:Class" of every dataclass in scout_slurm with a `schema_version` field that has a
    default: the version the class writes. (A field without one, report/views.py's CheckpointRow,
    only carries the version of the record it shows.)"""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            if not any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                continue
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.target.id == "schema_version"
                    and stmt.value is not None
                ):
                    found.append(f"{module}:{node.name}")
    return found


def test_every_versioned_record_is_in_the_contract_once():
    listed = [r.name for r in RECORDS]
    twice = sorted({n for n in listed if listed.count(n) > 1})
    assert not twice, f"listed more than once in evidence/contract.py: {twice}"
    in_code = versioned_dataclasses()
    missing = sorted(set(in_code) - set(listed))
    assert not missing, (
        f"versioned records not in scout_slurm/evidence/contract.py's RECORDS: {missing}; add each "
        "with who writes it and where it lives"
    )
    gone = sorted(set(listed) - set(in_code))
    assert not gone, f"evidence/contract.py names records that are not in the code: {gone}"


def test_each_entry_loads_with_its_versions():
    for r in RECORDS:
        cls = r.cls()
        assert dataclasses.is_dataclass(cls), r.name
        assert r.class_name == cls.__name__, r.name
        version, oldest = r.schema_version(), r.oldest_readable()
        assert isinstance(version, int) and 1 <= oldest <= version, (r.name, oldest, version)


def test_the_paths_it_names_are_built_by_the_folder_objects():
    for r in RECORDS:
        if r.writer is Writer.TOOLS:
            assert not r.built_by, f"{r.name}: outside the evidence folder, yet a layout path"
            continue
        if r.file.startswith("in "):
            parent = r.file[3:]
            assert any(p.class_name == parent for p in RECORDS), (r.name, parent)
            continue
        assert r.built_by, f"{r.name}: no layout method builds {r.file}"
        for name in r.built_by.split(", "):
            owner, _, method = name.rpartition(".")
            holder = getattr(layout, owner) if owner else layout
            assert callable(getattr(holder, method, None)) or isinstance(
                getattr(holder, method, None), property
            ), f"{r.name}: evidence/layout.py has no {name}"


def test_the_job_writes_into_its_runs_and_checkpoints_only():
    for r in RECORDS:
        if r.file.startswith("in "):
            continue
        if r.writer is Writer.JOB:
            assert r.file.startswith(("run-N/", "checkpoints/")), r
        elif r.writer is Writer.NODE_HOOKS:
            assert r.file.startswith("nodes/<node>/"), r
        elif r.writer is Writer.INCIDENT:
            assert r.file.startswith(("results/", "../pending/")), r


def test_how_it_works_shows_the_contract_as_rendered():
    found = BLOCK.search(HOW_IT_WORKS.read_text())
    assert found, f"{HOW_IT_WORKS}: no <!-- evidence-records:begin --> ... end block"
    assert found.group(1) == render_markdown(), (
        "docs/HOW-IT-WORKS.md's evidence-records block differs from "
        "scout_slurm/evidence/contract.py: paste the output of "
        "`python -c 'from scout_slurm.evidence.contract import render_markdown as r; "
        'print(r(), end="")\'`'
    )


# The layers evidence/ may import from: itself and the leaves everything uses.
EVIDENCE_MAY_IMPORT = ("scout_slurm.evidence", "scout_slurm.errors", "scout_slurm.trust")

# TEMPORARY: evidence/checkfiles.py's `assess_job` forwards to remediation/checkpoint_assessment.py
# for hooks/controller.py alone, which another change is moving into the incident package right now.
# The merger points that import at remediation.checkpoint_assessment, deletes the forwarding
# function and empties this list.
UPWARD_IMPORTS_PENDING_MOVE: set[tuple[str, str]] = set()


def test_evidence_imports_nothing_above_it():
    wrong = []
    for path in sorted((PACKAGE / "evidence").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if not name.startswith("scout_slurm"):
                    continue
                if name.startswith(EVIDENCE_MAY_IMPORT):
                    continue
                if (path.name, name) in UPWARD_IMPORTS_PENDING_MOVE:
                    continue
                wrong.append(f"scout_slurm/evidence/{path.name}:{node.lineno}: imports {name}")
    assert not wrong, "evidence/ imports from the layers above it:\n" + "\n".join(wrong)
