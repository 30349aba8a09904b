"""Fuzzing every parser the privileged hooks run over input they do not control: evidence records
(random bytes, and valid records mutated: keys dropped, duplicated or retyped, huge numbers, deep
nesting, NaN, NUL and newlines in strings), the hook environment, kernel log records, hostlists
and node names, and whole job folders of random records through the localiser.

Each fuzz states its number of examples; each test counts the examples it really ran, prints the
count and asserts it reached the stated number. Only the module's own error may escape.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import shutil
import time
import types
import typing
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scout_slurm.config import RemediationConfig
from scout_slurm.errors import ConfigError, EvidenceError, SlurmError
from scout_slurm.evidence import records as ev_records
from scout_slurm.evidence.gather import MAX_WORLD, gather_evidence
from scout_slurm.evidence.kernlog import CATEGORY_CORROBORATES
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import (
    ExitRecord,
    Finding,
    ProgressSnapshot,
    RankPlace,
    StallDecision,
)
from scout_slurm.evidence.store import (
    KIND_KEY,
    MAX_RECORD_BYTES,
    read_record,
    record_to_bytes,
    record_to_obj,
)
from scout_slurm.hooks.nodeevidence import MAX_LINES, NodeEvidence, parse_kmsg
from scout_slurm.hwmap.records import HardwareMap
from scout_slurm.jobenv import HOOK_TABLE, HookContext, hook_context
from scout_slurm.localise.verdict import localise
from scout_slurm.remediation import records as rem_records
from scout_slurm.remediation.plan import JobFacts, build_plan
from scout_slurm.slurm import ops
from scout_slurm.slurm.hostlist import MAX_HOSTS, compress_hostlist, expand_hostlist

# once each: remediation.records re-exports the checkpoint records and VoteCoverage it used to hold
RECORD_TYPES = tuple(
    dict.fromkeys(
        cls
        for module in (ev_records, rem_records)
        for cls in vars(module).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and "KIND" in vars(cls)
    )
) + (HardwareMap, NodeEvidence)
FUZZ = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

RANDOM_BYTES_EXAMPLES = 100
MUTATION_EXAMPLES = 200
ENV_EXAMPLES = 500
KMSG_EXAMPLES = 400
HOSTLIST_EXAMPLES = 500
EXCLUSION_EXAMPLES = 300
FOLDER_EXAMPLES = 150


def test_every_record_type_is_fuzzed():
    """Found by their KIND tag, so that a record type added later is fuzzed too."""
    names = {cls.__name__ for cls in RECORD_TYPES}
    assert names >= {
        "RankPlace",
        "ProgressSnapshot",
        "ExitRecord",
        "Finding",
        "StallDecision",
        "Verdict",
        "ActionsRecord",
        "ResumeInstruction",
        "CheckpointNote",
        "HardwareMap",
        "NodeEvidence",
    }


def ran(what: str, count: int, stated: int) -> None:
    print(f"\n{what}: {count} examples (stated {stated})")
    assert count >= stated, f"{what}: only {count} of {stated} examples ran"


# -------------------------------------------------------------------------------------------
# Valid records of any type, from their type hints
# -------------------------------------------------------------------------------------------

INTS = st.one_of(st.integers(-3, 12), st.sampled_from([0, 2**31, 2**63 - 1, -(2**63)]))
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
STRS = st.one_of(
    st.sampled_from(["n1", "n2", "", "?", "../../etc/shadow", "n1\nn2", "a\x00b", "GPU-1", "🙂"]),
    st.text(max_size=12),
)


def value_of(tp, name: str, overrides: dict) -> st.SearchStrategy:
    if name in overrides:
        return overrides[name]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return INTS
    if tp is float:
        return FLOATS
    if tp is str:
        return STRS
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return records_of(tp, overrides)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(value_of(args[0], "", overrides), max_size=3).map(tuple)
    if origin is tuple:
        return st.tuples(*(value_of(a, "", overrides) for a in args))
    if origin is dict:
        return st.dictionaries(STRS, value_of(args[1], "", overrides), max_size=3)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(
            *(st.none() if a is type(None) else value_of(a, name, overrides) for a in args)
        )
    raise TypeError(f"no strategy for {tp!r}")


def records_of(cls, overrides: dict | None = None) -> st.SearchStrategy:
    overrides = overrides or {}
    hints = typing.get_type_hints(cls)
    return st.builds(
        cls,
        **{
            f.name: value_of(hints[f.name], f.name, overrides)
            for f in dataclasses.fields(cls)
            if f.init and f.name != "schema_version"
        },
    )


# -------------------------------------------------------------------------------------------
# JSON text with what json.dumps cannot write: repeated keys, verbatim tokens
# -------------------------------------------------------------------------------------------


class Raw(str):
    """A JSON token written verbatim."""


class Obj(list):
    """A JSON object as (key, value) pairs; a key may repeat."""


def to_tree(v):
    if isinstance(v, dict):
        return Obj((k, to_tree(x)) for k, x in v.items())
    if isinstance(v, list):
        return [to_tree(x) for x in v]
    return v


def dump(v) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, Obj):
        return "{" + ",".join(json.dumps(k) + ":" + dump(x) for k, x in v) + "}"
    if isinstance(v, list):
        return "[" + ",".join(dump(x) for x in v) + "]"
    return json.dumps(v)  # NaN, Infinity, lone surrogates as \ud800 escapes


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["a\x00b", "line\nbreak", "\ud800", "x\udfff", "\u2028", "🙂", "", " " * 3]),
    st.sampled_from(
        [
            Raw("1" * 5000),
            Raw("-" + "9" * 400),
            Raw("1e999"),
            Raw("-Infinity"),
            Raw("NaN"),
            Raw("1" + "0" * 20 + ".5"),
            Raw('"\\ud800"'),
            Raw('"\\x41"'),
            Raw('"\\u00"'),
        ]
    ),
    st.integers(1, 40).map(lambda d: Raw("[" * d + "1" + "]" * d)),
    st.integers(1, 40).map(lambda d: Raw('{"a":' * d + "1" + "}" * d)),
    st.just(Raw("[" * 60_000 + "]" * 60_000)),
    st.just(Raw('"' + '\\"' * 60_000)),  # a string that never ends, of escaped quotes
    st.lists(st.integers(), max_size=3),
    st.builds(Obj),
    st.builds(lambda: Obj([("a", 1), ("a", 2)])),  # fresh each time: the tree is mutated
)
# ([1] is built afresh each time: a shared list constant would be changed in place by later
# mutations,
#  and hypothesis would see its data depend on earlier examples)
VERSIONS = st.one_of(
    st.sampled_from([0, -1, 2, 99, "1", 1.0, True, None, 2**70, Raw("1" * 5000)]),
    st.builds(lambda: [1]),
)
KEYS = st.one_of(
    st.sampled_from([KIND_KEY, "schema_version", "rank", "node", "", "\x00", "Rank", "rank "]),
    st.text(max_size=8),
)


def slots(tree, out=None):
    """Every place a value sits: (container, index)."""
    out = [] if out is None else out
    if isinstance(tree, Obj):
        for i, (_, v) in enumerate(tree):
            out.append((tree, i))
            slots(v, out)
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out.append((tree, i))
            slots(v, out)
    return out


def objects(tree, out=None):
    out = [] if out is None else out
    if isinstance(tree, Obj):
        out.append(tree)
        for _, v in tree:
            objects(v, out)
    elif isinstance(tree, list):
        for v in tree:
            objects(v, out)
    return out


def put(slot, value) -> None:
    container, i = slot
    if isinstance(container, Obj):
        container[i] = (container[i][0], value)
    else:
        container[i] = value


def get(slot):
    container, i = slot
    return container[i][1] if isinstance(container, Obj) else container[i]


TREE_OPS = ("drop", "duplicate", "retype", "add", "nest", "version", "kind")
TEXT_OPS = ("truncate", "splice", "bom", "trailing", "utf16", "none")


def mutated(data, record) -> tuple[bytes, list[str]]:
    tree = to_tree(record_to_obj(record))
    done = []
    for _ in range(data.draw(st.integers(0, 4), label="mutations")):
        op = data.draw(st.sampled_from(TREE_OPS), label="op")
        objs = [o for o in objects(tree) if o]
        places = slots(tree)
        if op in ("drop", "duplicate") and objs:
            obj = data.draw(st.sampled_from(objs), label="object")
            i = data.draw(st.integers(0, len(obj) - 1), label="key")
            if op == "drop":
                del obj[i]
            else:
                obj.append(
                    (obj[i][0], data.draw(st.one_of(st.just(obj[i][1]), HOSTILE), label="dup"))
                )
        elif op == "retype" and places:
            put(data.draw(st.sampled_from(places), label="slot"), data.draw(HOSTILE, label="value"))
        elif op == "add":
            obj = (
                data.draw(st.sampled_from(objects(tree)), label="object") if objects(tree) else tree
            )
            if isinstance(obj, Obj):
                obj.append((data.draw(KEYS, label="new key"), data.draw(HOSTILE, label="value")))
        elif op == "nest" and places:
            slot = data.draw(st.sampled_from(places), label="slot")
            v = get(slot)
            for _ in range(data.draw(st.integers(1, 40), label="depth")):
                v = [v] if data.draw(st.booleans(), label="list") else Obj([("x", v)])
            put(slot, v)
        elif op in ("version", "kind") and isinstance(tree, Obj):
            key = "schema_version" if op == "version" else KIND_KEY
            value = data.draw(
                VERSIONS
                if op == "version"
                else st.one_of(
                    st.sampled_from([c.KIND for c in RECORD_TYPES if hasattr(c, "KIND")]), HOSTILE
                ),
                label=op,
            )
            hits = [i for i, (k, _) in enumerate(tree) if k == key]
            if hits:
                tree[hits[0]] = (key, value)
            else:
                tree.append((key, value))
        else:
            continue
        done.append(op)
    text = dump(tree)
    op = data.draw(st.sampled_from(TEXT_OPS), label="text op")
    if op == "truncate":
        text = text[: data.draw(st.integers(0, len(text)), label="cut")]
    elif op == "splice":
        at = data.draw(st.integers(0, len(text)), label="at")
        text = text[:at] + data.draw(st.text(max_size=4), label="splice") + text[at:]
    elif op == "bom":
        text = "\ufeff" + text
    elif op == "trailing":
        text += data.draw(st.sampled_from(["x", "\n{}", "\x00", ",", "]"]), label="trailing")
    done.append(op)
    try:
        raw = text.encode("utf-16" if op == "utf16" else "utf-8", "surrogatepass")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "replace")
    return raw, done


def read_or_refuse(path: Path, cls, root: Path) -> object | None:
    """The record, or None when refused; any error other than EvidenceError fails the test."""
    try:
        rec = read_record(path, cls, root=root)
    except EvidenceError as exc:
        assert str(exc), "an EvidenceError must say what is wrong"
        return None
    assert isinstance(rec, cls)
    # what scout accepted it can write back: a record it read must never make its own writer fail
    assert read_record_roundtrip(rec, cls)
    return rec


def read_record_roundtrip(rec, cls) -> bool:
    obj = json.loads(record_to_bytes(rec))
    return obj == record_to_obj(rec)


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.__name__)
def test_read_record_on_random_bytes(cls, tmp_path):
    count = Counter()
    path = tmp_path / "record.json"

    @settings(max_examples=RANDOM_BYTES_EXAMPLES, **FUZZ)
    @given(
        st.one_of(
            st.binary(max_size=512),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                lambda kids: (
                    st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(max_size=6), kids, max_size=4)
                ),
                max_leaves=12,
            ).map(lambda v: dump(to_tree(v)).encode("utf-8", "surrogatepass")),
        )
    )
    def check(data):
        path.write_bytes(data)
        count["accepted" if read_or_refuse(path, cls, tmp_path) is not None else "refused"] += 1

    check()
    ran(
        f"read_record({cls.__name__}) random bytes {dict(count)}",
        sum(count.values()),
        RANDOM_BYTES_EXAMPLES,
    )


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.__name__)
def test_read_record_on_mutated_records(cls, tmp_path):
    count = Counter()
    ops_seen = Counter()
    path = tmp_path / "record.json"

    @settings(max_examples=MUTATION_EXAMPLES, **FUZZ)
    @given(st.data())
    def check(data):
        record = data.draw(records_of(cls), label="valid record")
        raw, done = mutated(data, record)
        ops_seen.update(done)
        path.write_bytes(raw)
        count["accepted" if read_or_refuse(path, cls, tmp_path) is not None else "refused"] += 1

    check()
    ran(
        f"read_record({cls.__name__}) mutations {dict(count)} ops {dict(ops_seen)}",
        sum(count.values()),
        MUTATION_EXAMPLES,
    )
    assert count["refused"] > 0


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.__name__)
def test_a_valid_record_of_each_type_is_accepted(cls, tmp_path):
    """The fuzz above is not vacuous: unmutated records read back equal."""
    path = tmp_path / "record.json"

    @settings(max_examples=20, **FUZZ)
    @given(records_of(cls))
    def check(record):
        path.write_bytes(record_to_bytes(record))
        assert read_record(path, cls, root=tmp_path) == record

    check()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text",
    [
        '"' + '\\"' * (MAX_RECORD_BYTES // 2 - 1),  # one string that never ends, of escaped quotes
        '["' + '\\"' * (MAX_RECORD_BYTES // 2 - 2),
        ('"\\' + '"') * (MAX_RECORD_BYTES // 3),
    ],
    ids=["unterminated", "unterminated-in-list", "quote-backslash-quote"],
)
def test_a_4_mib_record_that_never_closes_its_string_is_refused_quickly(tmp_path, text):
    """The nesting check used to rescan the rest of the file from every quote: hours of a root
    hook's time for one 4 MiB file."""
    path = tmp_path / "exit-0.json"
    path.write_bytes(text.encode()[:MAX_RECORD_BYTES])
    t0 = time.monotonic()
    with pytest.raises(EvidenceError):
        read_record(path, ExitRecord, root=tmp_path)
    assert time.monotonic() - t0 < 5


# -------------------------------------------------------------------------------------------
# The hook environment
# -------------------------------------------------------------------------------------------

HOOK_VARS = [var for _, var, _, _ in HOOK_TABLE] + [
    "SLURM_NODELIST",
    "SLURM_JOB_EXIT_CODE2",
    "PATH",
]
ENV_VALUES = st.one_of(
    st.text(max_size=20),
    st.from_regex(r"[+-]?[0-9]{1,25}", fullmatch=True),
    st.sampled_from(
        [
            "1" * 5000,
            "0",
            "-1",
            "4711_3",
            " 12 ",
            "\u0664\u0667",
            "²",
            "1e3",
            "0x10",
            "",
            "(null)",
            "n1\n",
            "-n1",
            "a..b",
            "n" * 200,
        ]
    ),
)


def test_hook_context_over_random_environments():
    count = Counter()

    @settings(max_examples=ENV_EXAMPLES, **FUZZ)
    @given(
        st.dictionaries(
            st.one_of(st.sampled_from(HOOK_VARS), st.text(max_size=6)), ENV_VALUES, max_size=14
        )
    )
    def check(environ):
        try:
            ctx = hook_context(environ)
        except ConfigError as exc:
            assert str(exc)
            count["refused"] += 1
            return
        assert isinstance(ctx, HookContext)
        for f in ("job_id", "job_uid", "restart", "exit_code_raw"):
            assert isinstance(getattr(ctx, f), int) and abs(getattr(ctx, f)) < 10**18
        count["accepted"] += 1

    check()
    ran(f"hook_context {dict(count)}", sum(count.values()), ENV_EXAMPLES)


# -------------------------------------------------------------------------------------------
# Kernel log records
# -------------------------------------------------------------------------------------------

KMSG_FIELD = st.one_of(
    st.from_regex(r"[0-9]{1,12}", fullmatch=True),
    st.integers(0, 7).map(str),  # the kernel's facility: the only records that can count
    st.text(max_size=6),
    st.sampled_from(["²", "\u0664\u0667", "9" * 5000, "-5", "", " 1"]),
)
KMSG_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "NVRM: Xid (PCI:0000:3b:00): 79",
            "mce: [Hardware Error]: Machine check events logged",
            "EDAC MC0: 1 UE",
            "EDAC MC0: 1 UE memory read error on DIMM#0 (channel:1 slot:0)",
            "NVRM: Xid 79[16715]: segfault at 0 ip 0 sp 0 error 4",
            "Out of memory: Killed process 1 (python)",
            "x" * 2000,
            "NVRM: Xid\nsecond line",
            "GPU has fallen off the bus",
        ]
    ),
)
KMSG_RECORD = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda p, s, u, f, t: f"{p},{s},{u},{f};{t}",
        KMSG_FIELD,
        KMSG_FIELD,
        KMSG_FIELD,
        st.text(max_size=3),
        KMSG_TEXT,
    ),
)


def test_parse_kmsg_over_random_text():
    count = Counter()
    categories = set(CATEGORY_CORROBORATES)

    @settings(max_examples=KMSG_EXAMPLES, **FUZZ)
    @given(st.lists(KMSG_RECORD, max_size=30), st.floats(0, 1e7))
    def check(records, since):
        lines = parse_kmsg(records, since_boot_s=since)
        assert len(lines) <= MAX_LINES
        for line in lines:
            assert line.category in categories and line.seconds_since_boot >= since - 1e-6
            assert "\n" not in line.text and len(line.text) <= 500
        count["with lines" if lines else "nothing"] += 1

    check()
    ran(f"parse_kmsg {dict(count)}", sum(count.values()), KMSG_EXAMPLES)


# -------------------------------------------------------------------------------------------
# Hostlists and node names
# -------------------------------------------------------------------------------------------

NUMBER = st.one_of(
    st.integers(0, 300).map(str),
    st.integers(0, 300).map(lambda n: f"{n:03d}"),
    st.sampled_from(["9" * 5000, "1" * 25, "²", "\u0664", "", "-", "10000000"]),
)
RANGE = st.one_of(NUMBER, st.builds(lambda a, b: f"{a}-{b}", NUMBER, NUMBER))
HOSTLIST = st.one_of(
    st.text(alphabet="n0123456789[]-,._ \n\x00ñ²", max_size=40),
    st.text(max_size=20),
    st.builds(
        lambda pre, rs, suf, more: f"{pre}[{','.join(rs)}]{suf}{more}",
        st.sampled_from(["n", "gpu", "", "rack1-n", "ñ", "a b", "n\n"]),
        st.lists(RANGE, min_size=1, max_size=4),
        st.sampled_from(["", "-ib", "[", "]", ".x"]),
        st.sampled_from(["", ",login1", ",n[1-2]", "x[1-3]", ",,", "[1-2]"]),
    ),
)
NAME_OK = "^[A-Za-z0-9._-]+$"


def test_expand_hostlist_over_hostile_expressions():
    count = Counter()

    @settings(max_examples=HOSTLIST_EXAMPLES, **FUZZ)
    @given(HOSTLIST)
    def check(expr):
        try:
            hosts = expand_hostlist(expr)
        except SlurmError:
            count["refused"] += 1
            return
        import re

        assert len(hosts) == len(set(hosts)) <= MAX_HOSTS
        assert all(re.fullmatch(NAME_OK, h) for h in hosts), hosts[:5]
        # whatever was read back compresses to an expression that expands to the same hosts
        assert set(expand_hostlist(compress_hostlist(hosts))) == set(hosts)
        count["expanded"] += 1

    check()
    ran(f"expand_hostlist {dict(count)}", sum(count.values()), HOSTLIST_EXAMPLES)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "expr",
    [
        "a[0-999999]b[0-999999]",  # 10^12 names: once a hang and all the memory
        "n[" + ",".join(["0-999999"] * 50) + "]",  # 5*10^7 names before the duplicates went
        "n[0-" + "9" * 5000 + "]",
        "n[" + "9" * 5000 + "-" + "9" * 5001 + "]",
    ],
)
def test_hostlists_too_large_are_refused_quickly(expr):
    t0 = time.monotonic()
    with pytest.raises(SlurmError):
        expand_hostlist(expr)
    assert time.monotonic() - t0 < 10


NODE = st.one_of(
    st.sampled_from(
        [
            "n1",
            "n2",
            "gpu01",
            "gpu10",
            "n" + "9" * 5000,
            "n" + "1" * 20,
            "",
            "-",
            "a b",
            "n1\n",
            "ñ1",
            "n²",
            "\x00",
            "n[1-2]",
            "n,1",
            "..",
            "a" * 300,
        ]
    ),
    st.text(alphabet="n0123456789._-ñ²[], ", max_size=12),
)


def test_merged_exclusion_with_hostile_node_names():
    count = Counter()

    @settings(max_examples=EXCLUSION_EXAMPLES, **FUZZ)
    @given(st.lists(NODE, max_size=4), st.lists(NODE, max_size=4))
    def check(current, add):
        try:
            merged = ops.merged_exclusion(current, add)
        except SlurmError as exc:
            assert str(exc)
            count["refused"] += 1
            return
        assert set(expand_hostlist(merged)) == set(current) | set(add)
        count["merged"] += 1

    check()
    ran(f"merged_exclusion {dict(count)}", sum(count.values()), EXCLUSION_EXAMPLES)


# -------------------------------------------------------------------------------------------
# Whole job folders of random records, through gather_evidence and the localiser
# -------------------------------------------------------------------------------------------

RANKS = st.one_of(st.integers(-2, 7), st.sampled_from([2**31, 2**63 - 1, -(2**63)]))
WORLDS = st.integers(0, 30).flatmap(
    lambda k: (
        st.sampled_from([MAX_WORLD, MAX_WORLD + 1, 2**63 - 1]) if k == 0 else st.integers(-1, 8)
    )
)
COUNTS = st.one_of(st.integers(0, 50), st.sampled_from([-1, 2**62, 2**63 - 1]))
FIELDS = {
    "rank": RANKS,
    "world_size": WORLDS,
    "decided_by": RANKS,
    "culprits": st.lists(RANKS, max_size=4).map(tuple),
    "node": st.sampled_from(["n1", "n2", "n3", "n9", "?", "", "../x", "n1\n"]),
    "opt_steps": COUNTS,
    "step_offset": COUNTS,
    "coll_entered": COUNTS,
    "coll_completed": COUNTS,
    "stderr_tail": st.lists(
        st.sampled_from(["Connection closed by peer", "Segmentation fault", "boom", ""]), max_size=2
    ).map(tuple),
    "recent": st.just(()),
}
ALLOCATION = ("n1", "n2")


def _files(cls, pattern: str):
    return st.lists(st.tuples(st.integers(0, 9), records_of(cls, FIELDS)), max_size=6).map(
        lambda items: [(pattern.format(i), record_to_bytes(r)) for i, r in items]
    )


JOB_FOLDER = st.tuples(
    _files(RankPlace, "ranks/rank-{}.json"),
    _files(ExitRecord, "ranks/exit-{}.json"),
    _files(ProgressSnapshot, "progress/rank-{}.json"),
    _files(Finding, "findings/f-{}.json"),
    st.lists(records_of(StallDecision, FIELDS), max_size=1).map(
        lambda ds: [("progress/stall-decision.json", record_to_bytes(d)) for d in ds]
    ),
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "ranks/rank-8.json",
                    "ranks/exit-8.json",
                    "progress/rank-8.json",
                    "findings/junk.json",
                ]
            ),
            st.binary(max_size=64),
        ),
        max_size=2,
    ),
)


def test_gather_and_localise_over_folders_of_random_records(tmp_path):
    count = Counter()
    root = tmp_path / "evidence"
    folder = JobFolder(root, "lab", 4711)

    @settings(max_examples=FOLDER_EXAMPLES, **FUZZ)
    @given(JOB_FOLDER, st.sampled_from([-1, 0, 256, 9, 35072]))
    def check(groups, exit_code):
        shutil.rmtree(root, ignore_errors=True)
        for sub in ("ranks", "progress", "findings"):
            (folder.run_dir(0) / sub).mkdir(parents=True)
        for files in groups:
            for name, data in files:
                (folder.run_dir(0) / name).write_bytes(data)
        ev = gather_evidence(folder, 0, job_exit_code=exit_code)
        assert 0 <= ev.world_size <= MAX_WORLD
        verdict = localise(ev, now=1.7e9)
        assert all(0 <= s.rank < ev.world_size for s in verdict.suspects), verdict.suspects
        record_to_bytes(verdict)  # the controller must be able to write what it concluded
        plan = build_plan(
            verdict,
            JobFacts(4711, ALLOCATION, (), True, 0, ("n1", "n2", "n3", "n4")),
            RemediationConfig(),
            evidence_path=str(folder.path),
        )
        drained = {a.target for a in plan.actions if a.kind.value == "drain"}
        assert drained <= set(ALLOCATION)
        count[verdict.kind.value] += 1

    check()
    ran(f"gather_evidence+localise verdicts {dict(count)}", sum(count.values()), FOLDER_EXAMPLES)


def _write(folder: JobFolder, name: str, record) -> None:
    path = folder.run_dir(0) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(record_to_bytes(record))


def _exit(rank: int, node: str = "n1", **changes) -> ExitRecord:
    base = ExitRecord(
        rank=rank,
        node=node,
        pid=1,
        exit_code=-1,
        signal=11,
        core_dumped=False,
        at=1.7e9,
        killed_by_scout=False,
        last_progress=None,
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.timeout(30)
def test_a_rank_number_near_2_63_does_not_make_the_world_that_large(tmp_path):
    """Without places, the world was the highest rank + 1: an exit record of rank 2**63-1 made the
    localiser count to 2**63, and the controller never finished."""
    folder = JobFolder(tmp_path, "lab", 4711)
    _write(folder, "ranks/exit-0.json", _exit(0))
    _write(folder, "ranks/exit-1.json", _exit(2**63 - 1, exit_code=1, signal=0))
    ev = gather_evidence(folder, 0, job_exit_code=256)
    assert ev.world_size <= MAX_WORLD
    verdict = localise(ev, now=1.7e9)
    record_to_bytes(verdict)


def test_a_step_past_2_63_leaves_the_verdict_writable(tmp_path):
    """The step is the job's progress plus the checkpoint's offset, both from the job's files: their
    sum may leave the 64-bit range, and the verdict could not be written at all."""
    folder = JobFolder(tmp_path, "lab", 4711)
    place = RankPlace(
        job_id=4711,
        restart=0,
        rank=0,
        local_rank=0,
        world_size=2,
        node="n1",
        hostname="h",
        task_pid=1,
        child_pid=2,
        gpu_uuids=(),
        cuda_visible_devices="",
        nic="",
        master_addr="",
        master_port=1,
        started_at=1.7e9,
        step_offset=2**63 - 1,
    )
    snap = ProgressSnapshot(
        rank=0,
        node="n1",
        pid=2,
        published_at=1.7e9,
        child_state=ev_records.ChildState.EXITED,
        coll_entered=3,
        coll_completed=3,
        in_collective=False,
        current_op="",
        opt_steps=2**63 - 1,
        pg_seq=-1,
        idle_s=0.0,
        step_time_s=0.0,
    )
    _write(folder, "ranks/rank-0.json", place)
    _write(
        folder, "ranks/rank-1.json", dataclasses.replace(place, rank=1, node="n2", step_offset=0)
    )
    _write(folder, "ranks/exit-0.json", _exit(0, last_progress=snap))
    _write(
        folder,
        "ranks/exit-1.json",
        _exit(1, node="n2", exit_code=1, signal=0, stderr_tail=("Connection closed by peer",)),
    )
    verdict = localise(gather_evidence(folder, 0, job_exit_code=256), now=1.7e9)
    assert [(s.rank, s.node) for s in verdict.suspects] == [(0, "n1")]
    record_to_bytes(verdict)
