"""The parsers over recorded real Slurm 22.05.8 output, their errors, and that hostile input
raises nothing but SlurmError. Every expected value below was read from the fixture files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.errors import SlurmError
from scout_slurm.slurm import ops
from scout_slurm.slurm.hostlist import expand_hostlist
from scout_slurm.slurm.parse import (
    JobInfo,
    NodeInfo,
    format_reason,
    parse_sacct_state,
    parse_scontrol_job,
    parse_scontrol_node,
    parse_scontrol_oneliner,
    parse_sinfo_json,
    parse_squeue_json,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm-22.05"
HOSTILE = 'scout: "quoted" it\'s; rm -rf / $(x) `y` ' + "A" * 440


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def by_id(jobs: list[JobInfo]) -> dict[int, JobInfo]:
    return {j.job_id: j for j in jobs}


def by_name(nodes: list[NodeInfo]) -> dict[str, NodeInfo]:
    return {n.name: n for n in nodes}


# -- squeue --json --------------------------------------------------------------------------


def test_squeue_running():
    (job,) = parse_squeue_json(fixture("squeue-running.json"))
    assert job == JobInfo(
        job_id=1,
        name="wrap",
        state="RUNNING",
        nodes=("n1", "n2"),
        batch_host="n1",
        excluded_nodes=(),
        restart_count=0,
        requeue=True,
        exit_code=0,
        comment="",
        user_id=0,
        reason="None",
    )
    assert not job.is_finished


def test_squeue_completed():
    (job,) = parse_squeue_json(fixture("squeue-completed.json"))
    assert (job.job_id, job.state, job.nodes, job.batch_host, job.exit_code) == (
        1,
        "COMPLETED",
        ("n1", "n2"),
        "n1",
        0,
    )
    assert job.is_finished


def test_squeue_failed_has_raw_wait_status():
    jobs = by_id(parse_squeue_json(fixture("squeue-failed.json")))
    assert sorted(jobs) == [1, 2]
    assert jobs[1].state == "COMPLETED"
    failed = jobs[2]
    assert failed == JobInfo(
        job_id=2,
        name="wrap",
        state="FAILED",
        nodes=("n1",),
        batch_host="n1",
        excluded_nodes=("n4",),
        restart_count=0,
        requeue=True,
        exit_code=768,
        comment="",
        user_id=0,
        reason="NonZeroExitCode",
    )
    assert failed.exit_code >> 8 == 3 and failed.exit_code & 0x7F == 0
    assert failed.is_finished


# -- sinfo --json ---------------------------------------------------------------------------


def test_sinfo_allocated():
    nodes = by_name(parse_sinfo_json(fixture("sinfo-allocated.json")))
    assert list(nodes) == ["n1", "n2", "n3", "n4"]
    assert [nodes[n].state for n in nodes] == ["MIXED", "MIXED", "IDLE", "IDLE"]
    assert all(n.flags == () and n.reason == "" for n in nodes.values())
    assert all((n.hostname, n.address) == ("vm", "127.0.0.1") for n in nodes.values())
    assert [n.is_idle for n in nodes.values()] == [False, False, True, True]
    assert not any(n.is_drained for n in nodes.values())


def test_sinfo_drained_keeps_hostile_and_multiline_reasons_exactly():
    nodes = by_name(parse_sinfo_json(fixture("sinfo-drained.json")))
    n2, n3 = nodes["n2"], nodes["n3"]
    assert (n2.state, n2.flags, n2.state_text) == ("IDLE", ("DRAIN",), "IDLE+DRAIN")
    assert n2.reason == HOSTILE and len(n2.reason) == 480
    assert n2.is_drained and not n2.is_idle
    assert (n3.state, n3.flags, n3.reason) == ("IDLE", ("DRAIN",), "line1\nline2")
    assert nodes["n1"].is_idle and nodes["n4"].is_idle
    assert nodes["n1"].reason == nodes["n4"].reason == ""


# -- scontrol show job -o ---------------------------------------------------------------------


def test_scontrol_job_running():
    (job,) = parse_scontrol_job(fixture("scontrol-job-running.txt"))
    assert job == JobInfo(
        job_id=1,
        name="wrap",
        state="RUNNING",
        nodes=("n1", "n2"),
        batch_host="n1",
        excluded_nodes=(),
        restart_count=0,
        requeue=True,
        exit_code=0,
        comment="",
        user_id=0,
        reason="None",
    )


def test_scontrol_job_failed():
    (job,) = parse_scontrol_job(fixture("scontrol-job-failed.txt"))
    assert job == JobInfo(
        job_id=2,
        name="wrap",
        state="FAILED",
        nodes=("n1",),
        batch_host="n1",
        excluded_nodes=("n4",),
        restart_count=0,
        requeue=True,
        exit_code=768,
        comment="",
        user_id=0,
        reason="NonZeroExitCode",
    )


def test_scontrol_job_requeued_keeps_exclusion_order():
    (job,) = parse_scontrol_job(fixture("scontrol-job-requeued.txt"))
    assert (job.job_id, job.state, job.restart_count) == (2, "FAILED", 1)
    assert job.excluded_nodes == ("n4", "n1")
    assert (job.nodes, job.batch_host, job.exit_code) == (("n2",), "n2", 768)


def test_scontrol_job_pending_after_requeue_has_no_nodes():
    # recorded after `scontrol requeue 3; scontrol update jobid=3 excnodelist=n[1,4]`
    (job,) = parse_scontrol_job(fixture("scontrol-job-pending-requeued.txt"))
    assert (job.job_id, job.state, job.restart_count, job.exit_code) == (3, "PENDING", 1, 768)
    assert (job.nodes, job.batch_host) == ((), "")
    assert job.excluded_nodes == ("n1", "n4")
    assert not job.is_finished


def test_scontrol_and_squeue_agree_on_the_failed_job():
    from_json = by_id(parse_squeue_json(fixture("squeue-failed.json")))[2]
    (from_text,) = parse_scontrol_job(fixture("scontrol-job-failed.txt"))
    assert from_text == from_json


@pytest.mark.parametrize(
    "exit_field, raw", [("0:0", 0), ("3:0", 768), ("0:9", 9), ("1:15", 271), ("x", 0)]
)
def test_scontrol_exit_code_as_raw_wait_status(exit_field, raw):
    (job,) = parse_scontrol_job(
        f"JobId=7 JobName=a JobState=FAILED ExitCode={exit_field} NodeList=(null)"
    )
    assert job.exit_code == raw
    assert job.nodes == () and job.user_id == -1


def test_scontrol_job_skips_other_lines():
    text = "\n" + fixture("scontrol-job-running.txt") + "\nslurm_load_jobs error: whatever\n\n"
    assert [j.job_id for j in parse_scontrol_job(text)] == [1]


# -- scontrol show node -o --------------------------------------------------------------------


def test_scontrol_node_allocated():
    nodes = by_name(parse_scontrol_node(fixture("scontrol-node-allocated.txt")))
    assert list(nodes) == ["n1", "n2", "n3", "n4"]
    assert [n.state_text for n in nodes.values()] == ["MIXED", "MIXED", "IDLE", "IDLE"]
    assert all((n.hostname, n.address, n.reason) == ("vm", "127.0.0.1", "") for n in nodes.values())


def test_scontrol_node_drained_drops_the_stamp_and_rebuilds_lines():
    nodes = by_name(parse_scontrol_node(fixture("scontrol-node-drained.txt")))
    assert nodes["n2"].flags == ("DRAIN",) and nodes["n2"].state == "IDLE"
    assert nodes["n2"].reason == HOSTILE  # " [root@2026-11-30T14:52:21]" dropped
    assert nodes["n3"].reason == "line1\nline2"  # printed as "line1 [root@...]        line2"
    assert nodes["n1"].is_idle and nodes["n4"].reason == ""


def test_scontrol_and_sinfo_agree_on_drained_nodes():
    assert parse_scontrol_node(fixture("scontrol-node-drained.txt")) == parse_sinfo_json(
        fixture("sinfo-drained.json")
    )


def test_oneliner_value_runs_until_next_key():
    kv = parse_scontrol_oneliner("NodeName=n1 State=IDLE+DRAIN Reason=a b  c=d [root@t]")
    assert kv == {"NodeName": "n1", "State": "IDLE+DRAIN", "Reason": "a b  c=d [root@t]"}


# -- later Slurm versions' JSON forms, which the parsers also accept ----------------------------


def test_wrapped_numbers_and_list_states():
    text = json.dumps(
        {
            "jobs": [
                {
                    "job_id": {"set": True, "number": 5},
                    "job_state": ["FAILED"],
                    "exit_code": {"set": True, "number": 256},
                    "restart_cnt": {"set": False},
                    "user_id": "12",
                    "nodes": "n[1-2]",
                }
            ]
        }
    )
    (job,) = parse_squeue_json(text)
    assert (job.job_id, job.state, job.exit_code, job.restart_count, job.user_id, job.nodes) == (
        5,
        "FAILED",
        256,
        0,
        12,
        ("n1", "n2"),
    )
    (node,) = parse_sinfo_json(json.dumps({"nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"]}]}))
    assert (node.state, node.flags) == ("IDLE", ("DRAIN",))


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("parser", [parse_squeue_json, parse_sinfo_json])
@pytest.mark.parametrize(
    "text, words",
    [
        ("", "not JSON"),
        ("slurm_load_jobs error: Unable to contact slurm controller", "not JSON"),
        ('{"jobs": [', "not JSON"),
        ("[" * 100_000, "not JSON"),  # json.loads raises RecursionError on this
        ("[]", "expected a JSON object, got list"),
        ('"jobs"', "expected a JSON object, got str"),
        (
            '{"errors": [{"error": "Invalid user", "errno": 2}], "jobs": [], "nodes": []}',
            "Slurm reported errors",
        ),
    ],
)
def test_json_errors(parser, text, words):
    with pytest.raises(SlurmError, match=words):
        parser(text)


@pytest.mark.parametrize("text", ['{"errors": []}', '{"jobs": null}', '{"jobs": {"1": {}}}'])
def test_squeue_without_jobs_list(text):
    with pytest.raises(SlurmError, match="no 'jobs' list"):
        parse_squeue_json(text)


def test_sinfo_without_nodes_list():
    with pytest.raises(SlurmError, match="no 'nodes' list"):
        parse_sinfo_json(fixture("squeue-running.json"))


def test_bad_hostlist_in_json_is_a_slurm_error():
    with pytest.raises(SlurmError, match="not a valid host name"):
        parse_squeue_json(json.dumps({"jobs": [{"job_id": 1, "nodes": "n1;rm -rf /"}]}))


def test_empty_lists_are_fine():
    assert parse_squeue_json('{"errors": [], "jobs": []}') == []
    assert parse_sinfo_json('{"nodes": [1, "x", null]}') == []
    assert parse_scontrol_job("") == [] and parse_scontrol_node("") == []


# -- format_reason ------------------------------------------------------------------------------


def test_format_reason():
    assert format_reason("a\nb\tc\x00d") == "a b c d"
    assert format_reason("x" * 2000) == "x" * 1000
    assert format_reason("x" * 50, limit=10) == "x" * 10
    assert format_reason(HOSTILE) == HOSTILE


# -- hostile input raises only SlurmError -----------------------------------------------------

_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.sampled_from(["n[1-2]", "n[2-1]", "²", "--5", "(null)", "n1;x", "IDLE"]),
)
_json_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=15,
)
_JOB_KEYS = [
    "job_id",
    "name",
    "job_state",
    "nodes",
    "batch_host",
    "excluded_nodes",
    "restart_cnt",
    "requeue",
    "exit_code",
    "comment",
    "user_id",
    "state_reason",
]
_NODE_KEYS = ["name", "state", "state_flags", "reason", "hostname", "address"]
_job = st.dictionaries(st.sampled_from(_JOB_KEYS), _json_value, max_size=len(_JOB_KEYS))
_node = st.dictionaries(st.sampled_from(_NODE_KEYS), _json_value, max_size=len(_NODE_KEYS))


def _only_slurm_error(fn, arg):
    try:
        fn(arg)
    except SlurmError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.lists(_job, max_size=3).map(lambda js: {"jobs": js}),
        st.dictionaries(st.sampled_from(["jobs", "errors", "meta"]), _json_value),
    )
)
def test_squeue_parser_raises_only_slurm_error(data):
    _only_slurm_error(parse_squeue_json, json.dumps(data))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.lists(_node, max_size=3).map(lambda ns: {"nodes": ns}),
        st.dictionaries(st.sampled_from(["nodes", "errors", "meta"]), _json_value),
    )
)
def test_sinfo_parser_raises_only_slurm_error(data):
    _only_slurm_error(parse_sinfo_json, json.dumps(data))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_json_parsers_on_any_text_raise_only_slurm_error(text):
    _only_slurm_error(parse_squeue_json, text)
    _only_slurm_error(parse_sinfo_json, text)


_KV_WORDS = [
    "JobId=",
    "NodeName=",
    "JobState=",
    "ExitCode=",
    "NodeList=",
    "ExcNodeList=",
    "Restarts=",
    "UserId=",
    "State=",
    "Reason=",
    "Requeue=",
    "=",
    " ",
    "  ",
    "[root@t]",
    "        ",
    "\n",
    ":",
    "(",
    ")",
    "²",
    "-",
    "n[1-2]",
    "n[",
    "x=y",
    "3:0",
    "a",
]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.text(max_size=200), st.lists(st.sampled_from(_KV_WORDS), max_size=30).map("".join))
)
def test_scontrol_parsers_raise_only_slurm_error(text):
    for line in text.splitlines() or [text]:
        kv = parse_scontrol_oneliner(line)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in kv.items())
    _only_slurm_error(parse_scontrol_job, text)
    _only_slurm_error(parse_scontrol_node, text)
    _only_slurm_error(parse_scontrol_job, "JobId=" + text)
    _only_slurm_error(parse_scontrol_node, "NodeName=" + text)


# -- ops.merged_exclusion (pure) --------------------------------------------------------------


@pytest.mark.parametrize(
    "current, add, merged",
    [
        ((), ["n1"], "n1"),
        (("n4",), ["n1"], "n[1,4]"),
        (("n4", "n1"), ["n1"], "n[1,4]"),
        (("n1", "n2"), ["n3"], "n[1-3]"),
        (("n1",), [], "n1"),
        ((), [], ""),
        (("gpu01",), ["gpu02", "login"], "gpu[01-02],login"),
    ],
)
def test_merged_exclusion(current, add, merged):
    assert ops.merged_exclusion(current, add) == merged
    assert set(expand_hostlist(merged)) == {*current, *add}


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "n1;x",
        "n 1",
        "n1,n2",
        "n[1-2]",
        "$(x)",
        "n1\n",
        "n\u0661",
        "\u00e9t\u00e9",
        "n\uff11",
        "n" * 256,
    ],
)  # non-ASCII digits/letters, too long
def test_merged_exclusion_refuses_bad_names(bad):
    with pytest.raises(SlurmError, match="refusing node name"):
        ops.merged_exclusion(("n1",), [bad])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.from_regex(r"\An[0-9]{1,3}\Z"), max_size=10),
    st.lists(st.from_regex(r"\An[0-9]{1,3}\Z"), max_size=5),
)
def test_merged_exclusion_is_the_union(current, add):
    merged = ops.merged_exclusion(current, add)
    assert set(expand_hostlist(merged)) == set(current) | set(add)


def test_a_cancelled_job_while_its_epilogs_run():
    """Recorded inside EpilogSlurmctld on 22.05.8 for job 27453, cancelled by its user: scontrol and
    squeue --json both say COMPLETING (ExitCode 0:15), so the base state must come from accounting
    (ops.job_end_state: sacct, else sacct -c), whose record `sacct -c` printed as below."""
    scontrol = parse_scontrol_job(fixture("scontrol-show-job-cancelled-in-epilogslurmctld.txt"))
    assert [(j.job_id, j.state, j.exit_code, j.is_finished) for j in scontrol] == [
        (27453, "COMPLETING", 15, False)
    ]
    squeue = by_id(parse_squeue_json(fixture("squeue-json-cancelled-in-epilogslurmctld.json")))
    assert squeue[27453].state == "COMPLETING" and not squeue[27453].is_finished
    assert squeue[27451].state == "CANCELLED"  # an earlier cancelled job, its Epilogs done
    assert parse_sacct_state(fixture("sacct-c-cancelled.txt"), 27453) == "CANCELLED"


@pytest.mark.parametrize(
    "text,job,state",
    [
        ("27453|CANCELLED\n", 27453, "CANCELLED"),
        ("27453|CANCELLED by 1001\n27453.batch|CANCELLED\n", 27453, "CANCELLED"),
        ("27450|FAILED\n27450|COMPLETED\n", 27450, "COMPLETED"),  # requeued: the newest record
        ("27450|FAILED\n", 27451, ""),
        ("27450.0|TIMEOUT\n", 27450, ""),
        ("", 1, ""),
        ("garbage without bars\n", 1, ""),
        ("1|\n", 1, ""),
    ],
)
def test_sacct_state(text, job, state):
    assert parse_sacct_state(text, job) == state
