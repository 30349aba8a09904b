"""What the end-of-job gather skips to scale, and that it skips nothing the localiser needs;
the store's fast paths (listing types, no depth walk for typed records) refuse what they did."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.gather import gather_evidence
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import ProgressSnapshot
from scout_slurm.evidence.store import (
    MAX_JSON_DEPTH,
    list_records,
    read_record,
    record_to_obj,
    write_record,
)
from scout_slurm.localise.verdict import localise
from tests.unit.test_verdict import GLOO_PEER, NOW, exited, place, snap


def job(tmp_path, world=4):
    folder = JobFolder(tmp_path, "lab", 77)
    for d in (folder.ranks_dir(0), folder.progress_dir(0), folder.findings_dir(0)):
        d.mkdir(parents=True)
    for r in range(world):
        write_record(folder.rank_place_path(0, r), place(r, world))
    return folder


def test_published_snapshot_not_read_when_the_exit_carries_a_later_one(tmp_path):
    folder = job(tmp_path)
    for r in range(4):
        final = snap(r, completed=40 if r != 2 else 38)
        stderr = ("Fatal Python error: Segmentation fault",) if r == 2 else ("Traceback", GLOO_PEER)
        write_record(
            folder.rank_exit_path(0, r),
            exited(
                r, 1, signal=11 if r == 2 else 0, stderr=stderr, progress=final if r != 3 else None
            ),
        )
    # ranks 0-2 exited with their final progress: their published files are not opened (a
    # corrupt one says nothing); rank 3's exit has none, so its published snapshot is used
    for r in range(3):
        folder.progress_path(0, r).write_bytes(b"{not json")
    write_record(folder.progress_path(0, 3), snap(3, completed=40))
    ev = gather_evidence(folder, 0, job_exit_code=256)
    assert not ev.problems
    assert sorted(ev.snapshots) == [3]
    assert ev.last_progress(2).coll_completed == 38 and ev.last_progress(3).coll_completed == 40
    v = localise(ev, now=NOW)
    assert v.kind.value == "crash" and [(s.rank, s.node) for s in v.suspects] == [
        (2, ev.node_of(2))
    ]


def test_torchrun_reads_every_published_snapshot(tmp_path):
    folder = job(tmp_path, world=1)
    write_record(
        folder.rank_place_path(0, 0), dataclasses.replace(place(0, 1), launcher="torchrun")
    )
    write_record(folder.rank_exit_path(0, 0), exited(0, 1, progress=snap(0)))
    for r in range(3):
        write_record(folder.progress_path(0, r), snap(r))
    ev = gather_evidence(folder, 0, job_exit_code=256)
    assert sorted(ev.snapshots) == [0, 1, 2] and ev.world_size == 3


def test_listing_refuses_links_fifos_and_excluded_names_are_not_opened(tmp_path):
    d = tmp_path / "progress"
    d.mkdir()
    write_record(d / "rank-0.json", snap(0))
    os.symlink(d / "rank-0.json", d / "rank-1.json")
    os.mkfifo(d / "rank-2.json")
    os.mkfifo(d / "rank-3.json")  # excluded: never opened, so no complaint either
    records, errors = list_records(
        d, "rank-*.json", ProgressSnapshot, root=tmp_path, exclude={"rank-3.json"}
    )
    assert [r.rank for r in records] == [0]
    assert len(errors) == 2
    assert "rank-1.json" in errors[0] and "symbolic link" in errors[0]
    assert "rank-2.json" in errors[1] and "FIFO" in errors[1]


def test_deep_json_in_a_record_is_still_refused_as_deep(tmp_path):
    obj = record_to_obj(snap(0))
    obj["extra"] = json.loads("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(EvidenceError, match="nested deeper"):
        read_record(path, ProgressSnapshot)
    obj["extra"] = 1
    path.write_text(json.dumps(obj))
    with pytest.raises(EvidenceError, match="unknown field 'extra'"):
        read_record(path, ProgressSnapshot)


def test_file_read_in_one_call_equals_the_file_and_a_size_change_is_caught(tmp_path):
    rec = snap(5)
    path = tmp_path / "rank-5.json"
    write_record(path, rec)
    assert read_record(path, ProgressSnapshot) == rec
    path.write_bytes(b"")
    with pytest.raises(EvidenceError, match="not valid JSON"):
        read_record(path, ProgressSnapshot)
