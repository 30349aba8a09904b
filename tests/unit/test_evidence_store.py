"""Evidence storage: typed round trips, atomic writes that survive a kill or a full disk, and
reads that refuse what a job could plant for a root hook (links, FIFOs, devices, huge or
malformed files)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence import codec, safeio
from scout_slurm.evidence.records import (
    ChildState,
    CollectiveEntry,
    ExitRecord,
    Finding,
    FindingKind,
    ProgressSnapshot,
    RankPlace,
    StallDecision,
    Suspect,
    Verdict,
    VerdictKind,
)
from scout_slurm.evidence.store import (
    KIND_KEY,
    MAX_JSON_DEPTH,
    MAX_RECORD_BYTES,
    EvidenceMissing,
    atomic_write_bytes,
    create_record_exclusive,
    list_records,
    read_record,
    record_from_obj,
    record_to_bytes,
    safe_read_bytes,
    write_record,
)

# -------------------------------------------------------------------------------------------
# Sample records
# -------------------------------------------------------------------------------------------


def progress(rank: int = 3, **changes) -> ProgressSnapshot:
    base = ProgressSnapshot(
        rank=rank,
        node="node-01",
        pid=4242,
        published_at=1_700_000_000.25,
        child_state=ChildState.RUNNING,
        coll_entered=120,
        coll_completed=119,
        in_collective=True,
        current_op="all_reduce",
        opt_steps=40,
        pg_seq=119,
        idle_s=12.5,
        step_time_s=0.75,
        recent=(
            CollectiveEntry(
                seq=119,
                op="all_reduce",
                nbytes=1 << 20,
                group_size=8,
                entered_ns=10_000,
                left_ns=12_000,
            ),
            CollectiveEntry(
                seq=120, op="broadcast", nbytes=64, group_size=8, entered_ns=13_000, left_ns=0
            ),
        ),
        bootstrap_active=False,
    )
    return dataclasses.replace(base, **changes)


SAMPLES = {
    "rank-place": RankPlace(
        job_id=1234,
        restart=0,
        rank=3,
        local_rank=1,
        world_size=8,
        node="node-01",
        hostname="node-01.cluster",
        task_pid=100,
        child_pid=101,
        gpu_uuids=("GPU-a", "GPU-b"),
        cuda_visible_devices="0,1",
        nic="ib0",
        master_addr="10.0.0.1",
        master_port=29500,
        started_at=1_700_000_000.0,
    ),
    "progress": progress(),
    "progress-defaults": ProgressSnapshot(
        rank=0,
        node="n",
        pid=1,
        published_at=0.0,
        child_state=ChildState.STARTING,
        coll_entered=0,
        coll_completed=0,
        in_collective=False,
        current_op="",
        opt_steps=0,
        pg_seq=-1,
        idle_s=0.0,
        step_time_s=0.0,
    ),
    "exit": ExitRecord(
        rank=3,
        node="node-01",
        pid=4242,
        exit_code=-1,
        signal=9,
        core_dumped=False,
        at=1_700_000_100.5,
        killed_by_scout=True,
        last_progress=progress(),
        stderr_tail=("Traceback (most recent call last):", "RuntimeError: NCCL timeout"),
    ),
    "exit-no-progress": ExitRecord(
        rank=0,
        node="node-02",
        pid=7,
        exit_code=1,
        signal=0,
        core_dumped=True,
        at=2.0,
        killed_by_scout=False,
        last_progress=None,
    ),
    "finding": Finding(
        rank=5,
        node="node-02",
        kind=FindingKind.DESYNC,
        at=3.5,
        summary="entered broadcast while others entered all_reduce",
        details=("seq 120", "majority: all_reduce"),
        step=40,
    ),
    "stall-decision": StallDecision(
        decided_by=2,
        at=4.0,
        culprits=(3, 7),
        kind=FindingKind.HANG,
        reasoning=("rank 3 is behind",),
    ),
    "verdict": Verdict(
        job_id=1234,
        restart=0,
        kind=VerdictKind.HANG,
        suspects=(
            Suspect(
                rank=3,
                node="node-01",
                kind=VerdictKind.HANG,
                confidence=0.9,
                evidence=("behind by 1 collective",),
            ),
            Suspect(rank=7, node="node-02", kind=VerdictKind.HANG, confidence=0.5),
        ),
        confidence=0.9,
        reasoning=("3 of 8 ranks agree",),
        first_failure_at=5.0,
        first_suspect_step=40,
        world_size=8,
        created_at=6.0,
    ),
}


def obj_of(record) -> dict:
    """The JSON object as written, parsed back (so tests mutate what a job could write)."""
    return json.loads(record_to_bytes(record))


def put(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def refused(excinfo, *words: str) -> None:
    message = str(excinfo.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


# -------------------------------------------------------------------------------------------
# Round trips and the JSON shape
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_record_class_round_trips_through_a_file(tmp_path, name):
    record = SAMPLES[name]
    path = tmp_path / f"{name}.json"
    write_record(path, record)
    assert read_record(path, type(record)) == record
    assert read_record(path, type(record), root=tmp_path) == record
    data = path.read_bytes()
    assert data == record_to_bytes(record) and data.endswith(b"\n") and data.count(b"\n") == 1
    assert record_from_obj(type(record), json.loads(data), source="x") == record


def test_json_shape_enums_by_value_tuples_as_lists_nested_objects_without_a_tag():
    obj = obj_of(SAMPLES["exit"])
    assert obj[KIND_KEY] == "exit" and obj["schema_version"] == 2
    assert obj["stderr_tail"] == list(SAMPLES["exit"].stderr_tail)
    nested = obj["last_progress"]
    assert KIND_KEY not in nested and nested["schema_version"] == 1
    assert nested["child_state"] == "running"
    assert nested["recent"][1] == {
        "seq": 120,
        "op": "broadcast",
        "nbytes": 64,
        "group_size": 8,
        "entered_ns": 13_000,
        "left_ns": 0,
    }
    assert obj_of(SAMPLES["exit-no-progress"])["last_progress"] is None
    finding = obj_of(SAMPLES["finding"])
    # The type tag and the Finding's own `kind` field live side by side.
    assert finding[KIND_KEY] == "finding" and finding["kind"] == "desync"
    assert record_to_bytes(SAMPLES["verdict"]) == record_to_bytes(SAMPLES["verdict"])


def test_fields_with_defaults_may_be_absent():
    obj = obj_of(SAMPLES["progress"])
    del obj["recent"], obj["bootstrap_active"]
    record = record_from_obj(ProgressSnapshot, obj, source="p.json")
    assert record.recent == () and record.bootstrap_active is True


def test_an_integer_is_accepted_for_a_float_field():
    obj = obj_of(SAMPLES["progress"])
    obj["idle_s"] = 12
    record = record_from_obj(ProgressSnapshot, obj, source="p.json")
    assert record.idle_s == 12.0 and type(record.idle_s) is float


_i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_f = st.floats(allow_nan=False, allow_infinity=False)
_s = st.text(st.characters(codec="utf-8"), max_size=30)


@settings(max_examples=150, deadline=None)
@given(
    st.builds(
        ProgressSnapshot,
        rank=_i64,
        node=_s,
        pid=_i64,
        published_at=_f,
        child_state=st.sampled_from(ChildState),
        coll_entered=_i64,
        coll_completed=_i64,
        in_collective=st.booleans(),
        current_op=_s,
        opt_steps=_i64,
        pg_seq=_i64,
        idle_s=_f,
        step_time_s=_f,
        bootstrap_active=st.booleans(),
        recent=st.lists(
            st.builds(
                CollectiveEntry,
                seq=_i64,
                op=_s,
                nbytes=_i64,
                group_size=_i64,
                entered_ns=_i64,
                left_ns=_i64,
            ),
            max_size=4,
        ).map(tuple),
    )
)
def test_any_progress_snapshot_round_trips(record):
    assert (
        record_from_obj(ProgressSnapshot, json.loads(record_to_bytes(record)), source="p") == record
    )


@settings(max_examples=150, deadline=None)
@given(
    st.builds(
        Verdict,
        job_id=_i64,
        restart=_i64,
        kind=st.sampled_from(VerdictKind),
        confidence=_f,
        suspects=st.lists(
            st.builds(
                Suspect,
                rank=_i64,
                node=_s,
                kind=st.sampled_from(VerdictKind),
                confidence=_f,
                evidence=st.lists(_s, max_size=3).map(tuple),
            ),
            max_size=4,
        ).map(tuple),
        reasoning=st.lists(_s, max_size=4).map(tuple),
        first_failure_at=_f,
        first_suspect_step=_i64,
        world_size=_i64,
        created_at=_f,
    )
)
def test_any_verdict_round_trips(record):
    assert record_from_obj(Verdict, json.loads(record_to_bytes(record)), source="v") == record


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _f | _s,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_s, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(obj_of(SAMPLES["exit"]))), _json, max_size=6))
def test_mangled_objects_only_ever_raise_evidence_error(changes):
    obj = obj_of(SAMPLES["exit"])
    obj.update(changes)
    try:
        record_from_obj(ExitRecord, obj, source="exit-3.json")
    except EvidenceError as e:
        assert str(e).startswith("exit-3.json: ")


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=200) | _json.map(lambda v: json.dumps(v).encode()))
def test_arbitrary_file_contents_only_ever_raise_evidence_error(tmp_path, data):
    path = put(tmp_path / "rank-0.json", data)
    try:
        read_record(path, ProgressSnapshot, root=tmp_path)
    except EvidenceError as e:
        assert str(path) in str(e)


def test_the_writer_refuses_a_record_it_could_not_read_back(tmp_path):
    path = tmp_path / "p.json"
    with pytest.raises(EvidenceError) as bad_type:
        write_record(path, progress(rank="3"))
    refused(
        bad_type,
        "ProgressSnapshot to be written: field rank: expected an integer, got '3'",
        "a bug in the code that built the record; nothing was written",
    )
    with pytest.raises(EvidenceError) as nan:
        write_record(path, progress(idle_s=float("nan")))
    refused(nan, "field idle_s: expected a finite number")
    with pytest.raises(EvidenceError) as nested:
        write_record(path, progress(recent=(CollectiveEntry(1, "x", True, 2, 3, 4),)))
    refused(nested, "field recent[0].nbytes: expected an integer, got true")
    assert not path.exists() and os.listdir(tmp_path) == []


# -------------------------------------------------------------------------------------------
# Validation of what a job wrote
# -------------------------------------------------------------------------------------------


def _mutate(path_keys, value):
    def apply(obj):
        target = obj
        for key in path_keys[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path_keys[-1]]
        else:
            target[path_keys[-1]] = value
        return obj

    return apply


VALIDATION_CASES = [
    ("wrong kind", _mutate([KIND_KEY], "progress"), "is a 'progress' record, expected 'exit'"),
    ("no kind", _mutate([KIND_KEY], KeyError), "has no 'record_kind'"),
    (
        "newer schema",
        _mutate(["schema_version"], 3),
        "schema_version 3 is newer than this scout understands (2); upgrade scout",
    ),
    (
        "newer schema, new fields",
        lambda o: {**o, "schema_version": 3, "cgroup": "x"},
        "schema_version 3 is newer than this scout understands (2); upgrade scout",
    ),
    (
        "newer nested schema",
        _mutate(["last_progress", "schema_version"], 9),
        "field last_progress: ProgressSnapshot schema_version 9 is newer",
    ),
    (
        "schema not int",
        _mutate(["schema_version"], "1"),
        "schema_version must be a positive integer, got '1'",
    ),
    ("schema zero", _mutate(["schema_version"], 0), "schema_version must be a positive integer"),
    ("no schema", _mutate(["schema_version"], KeyError), "has no schema_version"),
    ("unknown key", _mutate(["hostname"], "x"), "unknown field 'hostname' (valid: at, "),
    (
        "unknown nested key",
        _mutate(["last_progress", "extra"], 1),
        "unknown field 'extra' in field last_progress",
    ),
    (
        "tag in nested",
        _mutate(["last_progress", KIND_KEY], "progress"),
        "unknown field 'record_kind' in field last_progress",
    ),
    ("missing field", _mutate(["pid"], KeyError), "field pid: missing"),
    (
        "nested wrong type",
        _mutate(["last_progress", "coll_entered"], "abc"),
        "field last_progress.coll_entered: expected an integer, got 'abc'",
    ),
    ("bool as int", _mutate(["signal"], True), "field signal: expected an integer, got true"),
    ("float as int", _mutate(["exit_code"], 1.0), "field exit_code: expected an integer, got 1.0"),
    ("int too big", _mutate(["pid"], 2**63), "field pid: expected an integer, got"),
    ("int as bool", _mutate(["core_dumped"], 1), "field core_dumped: expected true or false"),
    ("string as float", _mutate(["at"], "1.0"), "field at: expected a number, got '1.0'"),
    ("huge int as float", _mutate(["at"], 10**400), "field at: expected a finite number"),
    (
        "bad enum",
        _mutate(["last_progress", "child_state"], "zombie"),
        "field last_progress.child_state: expected one of 'starting', 'running'",
    ),
    (
        "tuple element",
        _mutate(["last_progress", "recent", 1, "seq"], None),
        "field last_progress.recent[1].seq: expected an integer, got null",
    ),
    ("tuple not list", _mutate(["stderr_tail"], "oops"), "field stderr_tail: expected a list"),
    (
        "tuple of str",
        _mutate(["stderr_tail"], ["ok", 3]),
        "field stderr_tail[1]: expected a string, got 3",
    ),
    (
        "optional wrong",
        _mutate(["last_progress"], []),
        "field last_progress: expected a JSON object (ProgressSnapshot), got a list",
    ),
    ("surrogate", _mutate(["node"], "\ud800"), "field node: expected a string"),
]


@pytest.mark.parametrize(
    "mutate,expected", [c[1:] for c in VALIDATION_CASES], ids=[c[0] for c in VALIDATION_CASES]
)
def test_malformed_records_are_refused_naming_the_file_and_field(tmp_path, mutate, expected):
    obj = mutate(obj_of(SAMPLES["exit"]))
    path = put(tmp_path / "exit-3.json", json.dumps(obj))
    with pytest.raises(EvidenceError) as excinfo:
        read_record(path, ExitRecord, root=tmp_path)
    refused(excinfo, f"{path}: ", expected)


def test_a_record_that_is_not_an_object_is_refused():
    with pytest.raises(EvidenceError) as excinfo:
        record_from_obj(Finding, [1, 2], source="finding-1.json")
    refused(excinfo, "finding-1.json: expected a JSON object (Finding), got a list")


# -------------------------------------------------------------------------------------------
# Bounded JSON parsing
# -------------------------------------------------------------------------------------------

TEXT_CASES = [
    ("deep array", b"[" * 100_000 + b"]" * 100_000, f"nested deeper than {MAX_JSON_DEPTH}"),
    ("deep object", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "nested deeper than"),
    ("unclosed deep", b"[" * 1_000_000, "nested deeper than"),
    ("invalid utf-8", b'{"node":"\xff\xfe"}', "not valid UTF-8 (byte 9)"),
    ("invalid json", b'{"rank": 1,,}', "not valid JSON"),
    ("empty", b"", "not valid JSON"),
    ("nan", b'{"idle_s": NaN}', "not valid JSON (non-finite number NaN"),
    ("duplicate key", b'{"rank": 1, "rank": 2}', "not valid JSON (duplicate key 'rank')"),
    ("huge int", b'{"rank": ' + b"9" * 5000 + b"}", "not valid JSON"),
]


@pytest.mark.parametrize(
    "data,expected", [c[1:] for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES]
)
def test_unparseable_files_are_refused_naming_the_file(tmp_path, data, expected):
    path = put(tmp_path / "rank-0.json", data)
    with pytest.raises(EvidenceError) as excinfo:
        read_record(path, ProgressSnapshot)
    refused(excinfo, f"{path}: ", expected)


def test_nesting_limit_is_exact_and_ignores_brackets_inside_strings():
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert codec.parse_json(ok.encode(), "x") is not None
    with pytest.raises(EvidenceError, match="nested deeper"):
        codec.parse_json(("[" + ok + "]").encode(), "x")
    quoted = json.dumps({"s": "[{" * 10_000 + '\\"[[['})
    assert codec.parse_json(quoted.encode(), "x") == json.loads(quoted)


# -------------------------------------------------------------------------------------------
# What a job could plant for a root hook
# -------------------------------------------------------------------------------------------


@pytest.fixture()
def job_tree(tmp_path):
    """<root>/lab/77/run-0/progress with one good record; returns (root, progress dir)."""
    root = tmp_path / "evidence"
    progress_dir = root / "lab" / "77" / "run-0" / "progress"
    progress_dir.mkdir(parents=True)
    write_record(progress_dir / "rank-0.json", progress(rank=0))
    return root, progress_dir


def test_a_symlink_as_the_file_is_refused(job_tree, tmp_path):
    root, pdir = job_tree
    secret = put(tmp_path / "secret.json", record_to_bytes(progress(rank=9)))
    link = pdir / "rank-1.json"
    link.symlink_to(secret)
    for kwargs in ({}, {"root": root}):
        with pytest.raises(EvidenceError) as excinfo:
            read_record(link, ProgressSnapshot, **kwargs)
        refused(excinfo, f"{link}: is a symbolic link", "the job may have planted it")


def test_a_symlink_as_an_intermediate_directory_is_refused_under_a_root(job_tree, tmp_path):
    root, pdir = job_tree
    elsewhere = tmp_path / "elsewhere" / "progress"
    write_record(put(elsewhere / "x", b"").parent / "rank-5.json", progress(rank=5))
    (root / "lab" / "77" / "run-1").symlink_to(elsewhere.parent)
    path = root / "lab" / "77" / "run-1" / "progress" / "rank-5.json"
    with pytest.raises(EvidenceError) as excinfo:
        read_record(path, ProgressSnapshot, root=root)
    refused(excinfo, f"{path}: component {root}/lab/77/run-1 is a symbolic link")
    # Without a root only the last component is checked: the caller trusts the directories.
    assert read_record(path, ProgressSnapshot).rank == 5


def test_the_root_itself_may_be_a_symlink(job_tree, tmp_path):
    root, pdir = job_tree
    (tmp_path / "alias").symlink_to(root)
    path = tmp_path / "alias" / pdir.relative_to(root) / "rank-0.json"
    assert read_record(path, ProgressSnapshot, root=tmp_path / "alias").rank == 0


def test_a_dotdot_escape_from_the_root_is_refused(job_tree, tmp_path):
    root, pdir = job_tree
    outside = put(tmp_path / "outside.json", record_to_bytes(progress(rank=8)))
    path = pdir / ".." / ".." / ".." / ".." / ".." / "outside.json"
    assert path.resolve() == outside.resolve()
    with pytest.raises(EvidenceError) as excinfo:
        read_record(path, ProgressSnapshot, root=root)
    refused(excinfo, f"{path}: is outside the evidence root {root}")
    with pytest.raises(EvidenceError, match="outside the evidence root"):
        safe_read_bytes(root, root=root)
    # `..` that stays inside the root is plain path arithmetic.
    inside = pdir / ".." / "progress" / "rank-0.json"
    assert read_record(inside, ProgressSnapshot, root=root).rank == 0


def test_a_hard_link_is_refused(job_tree, tmp_path):
    root, pdir = job_tree
    secret = put(tmp_path / "root-only.json", record_to_bytes(progress(rank=9)))
    os.link(secret, pdir / "rank-2.json")
    for path in (pdir / "rank-2.json", secret):
        with pytest.raises(EvidenceError) as excinfo:
            safe_read_bytes(path)
        refused(excinfo, f"{path}: has 2 hard links", "the job may have planted it")


@pytest.mark.timeout(20)
def test_a_fifo_is_refused_without_blocking(job_tree):
    root, pdir = job_tree
    fifo = pdir / "rank-1.json"
    os.mkfifo(fifo)
    outcome = {}

    def attempt():
        try:
            safe_read_bytes(fifo, root=root)
        except EvidenceError as e:
            outcome["error"] = str(e)
        try:
            # Past the lstat, straight at the open + fstat that must not block either.
            fd = os.open(pdir, os.O_PATH | os.O_DIRECTORY)
            try:
                safeio.read_at(fd, fifo.name, str(fifo), 100)
            finally:
                os.close(fd)
        except EvidenceError as e:
            outcome["at"] = str(e)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), "reading a FIFO blocked"
    assert outcome["error"].startswith(f"{fifo}: is a FIFO (named pipe), not a regular file")
    assert "is a FIFO" in outcome["at"]


def test_a_device_node_is_refused(job_tree):
    root, pdir = job_tree
    dev = pdir / "rank-1.json"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    with pytest.raises(EvidenceError) as excinfo:
        safe_read_bytes(dev, root=root)
    refused(excinfo, f"{dev}: is a character device, not a regular file")


def test_a_socket_and_a_directory_are_refused(job_tree, monkeypatch):
    root, pdir = job_tree
    monkeypatch.chdir(pdir)  # AF_UNIX paths are short; bind by relative name
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("rank-1.json")
        with pytest.raises(EvidenceError, match="rank-1.json: is a socket"):
            safe_read_bytes(pdir / "rank-1.json", root=root)
    (pdir / "rank-2.json").mkdir()
    with pytest.raises(EvidenceError, match="rank-2.json: is a directory"):
        safe_read_bytes(pdir / "rank-2.json", root=root)


def test_an_oversized_file_is_refused(job_tree):
    root, pdir = job_tree
    big = put(pdir / "rank-1.json", b" " * 5_000_001)
    with pytest.raises(EvidenceError) as excinfo:
        read_record(big, ProgressSnapshot, root=root)
    refused(excinfo, f"{big}: is 5000001 bytes, limit {MAX_RECORD_BYTES}")
    small = pdir / "rank-0.json"
    size = small.stat().st_size
    assert len(safe_read_bytes(small, max_bytes=size)) == size
    with pytest.raises(EvidenceError, match=f"is {size} bytes, limit {size - 1}"):
        safe_read_bytes(small, max_bytes=size - 1)


def test_a_missing_file_is_evidence_missing(job_tree):
    root, pdir = job_tree
    with pytest.raises(EvidenceMissing, match="rank-9.json: does not exist"):
        read_record(pdir / "rank-9.json", ProgressSnapshot, root=root)
    with pytest.raises(EvidenceMissing, match="component .*/run-4 does not exist"):
        read_record(
            root / "lab" / "77" / "run-4" / "progress" / "rank-0.json", ProgressSnapshot, root=root
        )
    # A file where a directory should be is not "missing".
    put(root / "lab" / "78", b"")
    with pytest.raises(EvidenceError, match="component .*/78 is not a directory"):
        read_record(root / "lab" / "78" / "x.json", ProgressSnapshot, root=root)


# -------------------------------------------------------------------------------------------
# Atomic writes
# -------------------------------------------------------------------------------------------


def test_write_sets_the_mode_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "verdict-0.json"
    write_record(path, SAMPLES["verdict"], mode=0o640)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    atomic_write_bytes(path, b"{}\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_bytes() == b"{}\n"
    assert os.listdir(tmp_path) == ["verdict-0.json"]


def test_write_refuses_to_replace_a_symlink(tmp_path):
    target = put(tmp_path / "passwd", b"root:x:0:0\n")
    link = tmp_path / "verdict-0.json"
    link.symlink_to(target)
    with pytest.raises(EvidenceError) as excinfo:
        write_record(link, SAMPLES["verdict"])
    refused(excinfo, f"cannot write {link}: it is a symbolic link")
    assert link.is_symlink() and target.read_bytes() == b"root:x:0:0\n"


def test_write_into_a_missing_directory_says_so(tmp_path):
    path = tmp_path / "no" / "such" / "verdict-0.json"
    with pytest.raises(EvidenceMissing, match=f"cannot write {path}: directory .* does not exist"):
        write_record(path, SAMPLES["verdict"])


@pytest.mark.parametrize("step", ["open", "write", "chmod", "fsync", "replace"])
def test_a_failure_before_the_rename_keeps_the_old_file(tmp_path, step):
    path = tmp_path / "rank-0.json"
    write_record(path, progress(rank=0))
    old = path.read_bytes()
    with pytest.raises(EvidenceError) as excinfo:
        atomic_write_bytes(path, record_to_bytes(progress(rank=0, opt_steps=99)), _fail_at=step)
    refused(excinfo, f"cannot write {path}: injected failure at {step}")
    assert isinstance(excinfo.value.__cause__, OSError)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["rank-0.json"]


def test_a_failure_after_the_rename_reports_it_with_the_new_file_in_place(tmp_path):
    path = tmp_path / "rank-0.json"
    write_record(path, progress(rank=0))
    new = record_to_bytes(progress(rank=0, opt_steps=99))
    with pytest.raises(EvidenceError, match=f"wrote {path} but could not make the rename durable"):
        atomic_write_bytes(path, new, _fail_at="fsync_dir")
    assert path.read_bytes() == new and os.listdir(tmp_path) == ["rank-0.json"]


def _big_finding(letter: str) -> Finding:
    return Finding(
        rank=0,
        node="n",
        kind=FindingKind.INFO,
        at=1.0,
        summary=letter,
        details=tuple(letter * 1000 for _ in range(1000)),
    )


@pytest.mark.timeout(60)
def test_a_writer_killed_at_any_moment_leaves_old_or_new_never_a_part(tmp_path):
    a, b = _big_finding("a"), _big_finding("b")
    data = (record_to_bytes(a), record_to_bytes(b))
    path = tmp_path / "rank-0.json"
    atomic_write_bytes(path, data[0])
    rng = random.Random(1234)
    seen, interrupted = set(), 0
    for _ in range(50):
        pid = os.fork()
        if pid == 0:  # child: rewrite forever until killed
            try:
                i = rng.randrange(2)
                while True:
                    atomic_write_bytes(path, data[i % 2])
                    i += 1
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.02))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        record = read_record(path, Finding, root=tmp_path)
        assert record in (a, b)
        seen.add(record.summary)
        interrupted += any(n.endswith(".tmp") for n in os.listdir(tmp_path))
    assert seen == {"a", "b"}
    assert interrupted > 0, "no kill landed inside a write; the test proved nothing"
    records, errors = list_records(tmp_path, "rank-*.json", Finding, root=tmp_path)
    assert errors == [] and len(records) == 1 and records[0] in (a, b)


@pytest.fixture()
def tiny_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_disk_is_reported_and_keeps_the_old_file(tiny_fs):
    path = tiny_fs / "verdict-0.json"
    write_record(path, SAMPLES["verdict"])
    old = path.read_bytes()
    big = dataclasses.replace(SAMPLES["verdict"], reasoning=("x" * 1000,) * 200)
    with pytest.raises(EvidenceError) as excinfo:
        write_record(path, big)
    refused(excinfo, f"cannot write {path}: No space left on device", "disk full?")
    assert excinfo.value.__cause__.errno == errno.ENOSPC
    assert path.read_bytes() == old and os.listdir(tiny_fs) == ["verdict-0.json"]
    with pytest.raises(EvidenceError, match="disk full"):
        create_record_exclusive(tiny_fs / "stall-decision.json", big)
    assert os.listdir(tiny_fs) == ["verdict-0.json"]


# -------------------------------------------------------------------------------------------
# Exclusive create
# -------------------------------------------------------------------------------------------


def _decision(by: int) -> StallDecision:
    return StallDecision(
        decided_by=by,
        at=float(by),
        culprits=(3,),
        kind=FindingKind.HANG,
        reasoning=(f"decided by {by}",),
    )


def test_the_second_exclusive_create_loses_and_the_first_record_stays(tmp_path):
    path = tmp_path / "stall-decision.json"
    assert create_record_exclusive(path, _decision(1)) is True
    assert create_record_exclusive(path, _decision(2)) is False
    assert read_record(path, StallDecision, root=tmp_path) == _decision(1)
    assert os.listdir(tmp_path) == ["stall-decision.json"]


def test_the_link_fallback_is_exclusive_too(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name, content in (("t1", b"first"), ("t2", b"second")):
            put(tmp_path / name, content)
        assert safeio.publish_exclusive(fd, "t1", "d.json", use_renameat2=False) is True
        assert safeio.publish_exclusive(fd, "t2", "d.json", use_renameat2=False) is False
    finally:
        os.close(fd)
    assert (tmp_path / "d.json").read_bytes() == b"first"


def test_an_exclusive_create_does_not_take_over_a_planted_symlink(tmp_path):
    target = put(tmp_path / "elsewhere", b"keep")
    (tmp_path / "stall-decision.json").symlink_to(target)
    assert create_record_exclusive(tmp_path / "stall-decision.json", _decision(1)) is False
    assert target.read_bytes() == b"keep"


@pytest.mark.timeout(30)
def test_racing_writers_elect_exactly_one(tmp_path):
    path = tmp_path / "stall-decision.json"
    gate_r, gate_w = os.pipe()
    pids = {}
    for by in range(8):
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                os.close(gate_w)
                os.read(gate_r, 1)  # all start together when the gate closes
                code = 0 if create_record_exclusive(path, _decision(by)) else 1
            finally:
                os._exit(code)
        pids[pid] = by
    os.close(gate_r)
    os.close(gate_w)
    winners = []
    for pid, by in pids.items():
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 1)
        if os.WEXITSTATUS(status) == 0:
            winners.append(by)
    assert len(winners) == 1
    assert read_record(path, StallDecision, root=tmp_path) == _decision(winners[0])
    assert os.listdir(tmp_path) == ["stall-decision.json"]


# -------------------------------------------------------------------------------------------
# Listing a directory
# -------------------------------------------------------------------------------------------


def test_list_records_reads_good_files_and_names_each_bad_one(job_tree, tmp_path):
    root, pdir = job_tree
    for rank in (2, 10, 1):
        write_record(pdir / f"rank-{rank}.json", progress(rank=rank))
    put(pdir / "rank-3.json", b"{not json")
    (pdir / "rank-4.json").symlink_to(pdir / "rank-1.json")
    os.mkfifo(pdir / "rank-5.json")
    write_record(pdir / "rank-6.json", SAMPLES["finding"])
    put(pdir / ".rank-7.json.0123.tmp", b"partial")
    put(pdir / "notes.txt", b"ignored")
    (pdir / "rank-8.json.d").mkdir()
    put(pdir / "rank-8.json.d" / "rank-9.json", record_to_bytes(progress(rank=9)))

    records, errors = list_records(pdir, "rank-*.json", ProgressSnapshot, root=root)
    assert [r.rank for r in records] == [0, 1, 2, 10]
    assert len(errors) == 4
    assert errors[0].startswith(f"{pdir}/rank-3.json: not valid JSON")
    assert errors[1].startswith(f"{pdir}/rank-4.json: is a symbolic link")
    assert errors[2].startswith(f"{pdir}/rank-5.json: is a FIFO")
    assert errors[3].startswith(f"{pdir}/rank-6.json: is a 'finding' record, expected 'progress'")
    hidden, _ = list_records(pdir, ".rank-*.tmp", ProgressSnapshot, root=root)
    assert hidden == []


def test_list_records_bounds_the_number_of_files(tmp_path):
    for rank in range(5):
        write_record(tmp_path / f"rank-{rank}.json", progress(rank=rank))
    records, errors = list_records(tmp_path, "rank-*.json", ProgressSnapshot, max_files=3)
    assert len(records) == 3
    assert errors == [f"{tmp_path}: more than 3 files match 'rank-*.json'; only 3 were read"]


def test_list_records_refuses_an_unsafe_or_missing_directory(job_tree, tmp_path):
    root, pdir = job_tree
    run1 = root / "lab" / "77" / "run-1"
    run1.mkdir()
    (run1 / "progress").symlink_to(pdir)
    for kwargs in ({}, {"root": root}):
        with pytest.raises(EvidenceError, match="run-1/progress: is a symbolic link"):
            list_records(run1 / "progress", "rank-*.json", ProgressSnapshot, **kwargs)
    (root / "lab" / "77" / "run-2").symlink_to(pdir.parent)
    with pytest.raises(EvidenceError, match="component .*/run-2 is a symbolic link"):
        list_records(root / "lab" / "77" / "run-2" / "progress", "*", ProgressSnapshot, root=root)
    with pytest.raises(EvidenceMissing, match="does not exist"):
        list_records(root / "lab" / "77" / "run-9" / "progress", "*", ProgressSnapshot, root=root)
    with pytest.raises(EvidenceError, match="outside the evidence root"):
        list_records(tmp_path, "*", ProgressSnapshot, root=root)
    records, errors = list_records(
        root / "lab" / "77" / "run-0" / "progress", "rank-*.json", ProgressSnapshot, root=root
    )
    assert [r.rank for r in records] == [0] and errors == []
