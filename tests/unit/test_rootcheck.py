"""The root checks of hooks/rootcheck.py: the self-test's reference, the parsers of what NVML,
dcgmi and the InfiniBand counters say, which findings corroborate which verdict, and the
orchestration within its budget (on this machine: whatever it has, each outcome recorded)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from scout_slurm.evidence.records import Suspect, Verdict, VerdictKind
from scout_slurm.evidence.store import read_record, write_record
from scout_slurm.hooks import rootcheck as rc


def _verdict(kind=VerdictKind.CRASH) -> Verdict:
    return Verdict(
        job_id=5,
        restart=0,
        kind=kind,
        suspects=(Suspect(1, "n1", kind, 0.9),),
        confidence=0.9,
        reasoning=(),
        first_failure_at=0.0,
        first_suspect_step=-1,
        world_size=2,
        created_at=0.0,
    )


def test_the_self_test_computes_the_reference_signature_here():
    """The reference was computed the same way; a sound machine reproduces it bit for bit."""
    assert rc.compute_signature() == rc.REFERENCE_SIGNATURE
    out = rc.check_signature()
    assert out.status == "clean" and out.findings == ()


def test_a_different_workload_gives_a_different_signature():
    """The digest depends on every round: the check could fail (a wrong result is seen)."""
    assert rc.compute_signature(rounds=rc.SIGNATURE_ROUNDS - 1) != rc.REFERENCE_SIGNATURE
    assert rc.compute_signature(nbytes=rc.SIGNATURE_BYTES // 2) != rc.REFERENCE_SIGNATURE


def test_nvml_findings_from_readings():
    gpus = [
        {
            "index": 0,
            "uuid": "GPU-a",
            "serial": "1320",
            "ecc_volatile": 3,
            "ecc_aggregate": 0,
            "retired_pending": 0,
            "retired_dbe": 2,
            "remap_pending": 0,
            "remap_failed": 1,
            "pcie_replay": 5,
            "throttle": 0x1,
        },
        {
            "index": 1,
            "uuid": "GPU-b",
            "serial": "1321",
            "ecc_volatile": 0,
            "ecc_aggregate": None,
            "retired_pending": 0,
            "retired_dbe": 0,
            "remap_pending": 0,
            "remap_failed": 0,
            "pcie_replay": 500,
            "throttle": 0x40 | 0x4,
        },
    ]
    got = [(f.category, f.gpu_serial) for f in rc.nvml_findings(gpus)]
    assert got == [
        (rc.ECC, "1320"),
        (rc.RETIRED, "1320"),
        (rc.REMAPPED, "1320"),
        (rc.PCIE_REPLAY, "1321"),
        (rc.THROTTLE, "1321"),
    ]


# `dcgmi diag -r 1` as it prints (DCGM 3.x table; the Fail row as a failing GPU shows it)
DCGMI_OUT = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.3.5                                          |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | Fail - GPU 0                                   |
| Graphics Processes        | Pass                                           |
+---------------------------+------------------------------------------------+
"""


def test_dcgmi_failures_name_the_failed_test():
    got = rc.dcgmi_failures(DCGMI_OUT)
    assert [f.detail for f in got] == ["Page Retirement/Row Remap Fail - GPU 0"]
    assert rc.dcgmi_failures(DCGMI_OUT.replace("Fail - GPU 0", "Pass")) == ()


def test_ib_deltas_only_counters_that_grew():
    before = {"mlx5_0/1/symbol_error": 4, "mlx5_0/1/link_downed": 1, "mlx5_0/1/port_rcv_errors": 0}
    after = {
        "mlx5_0/1/symbol_error": 4,
        "mlx5_0/1/link_downed": 3,
        "mlx5_0/1/port_rcv_errors": 0,
        "mlx5_1/1/link_downed": 9,
    }  # a port not read at the start has no delta
    assert [f.detail for f in rc.ib_deltas(before, after)] == ["mlx5_0/1/link_downed +2"]


def test_ib_counters_read_from_a_sysfs_tree(tmp_path):
    c = tmp_path / "mlx5_0" / "ports" / "1" / "counters"
    c.mkdir(parents=True)
    (c / "symbol_error").write_text("7\n")
    (c / "link_downed").write_text("0\n")
    assert rc.ib_counters(tmp_path) == {"mlx5_0/1/symbol_error": 7, "mlx5_0/1/link_downed": 0}
    assert rc.ib_counters(tmp_path / "absent") == {}


def _checks(*findings: rc.RootFinding) -> rc.RootChecks:
    return rc.RootChecks(
        node="n1",
        job_id=5,
        restart=0,
        verdict_kind=VerdictKind.CRASH,
        started_at=0.0,
        seconds=0.1,
        outcomes=(rc.CheckOutcome("kernel-log", "found", 0.0, tuple(findings)),),
    )


@pytest.mark.parametrize(
    "category,kind,corroborates",
    [
        ("nvidia-xid-bus", VerdictKind.CRASH, True),  # Xid 79: fallen off the bus
        ("nvidia-xid-bus", VerdictKind.SDC, False),  # a GPU gone computes no wrong numbers
        ("nvidia-xid-memory", VerdictKind.SDC, True),
        ("nvidia-xid-application", VerdictKind.CRASH, False),  # Xid 13, 31, 43, 45
        ("nvidia-xid-driver", VerdictKind.HANG, False),
        ("nvidia-xid-unknown", VerdictKind.CRASH, False),
        ("nvidia-xid-memory-corrected", VerdictKind.SDC, False),
        ("edac-corrected", VerdictKind.CRASH, False),
        ("edac-corrected", VerdictKind.STRAGGLER, True),
        ("process-fault", VerdictKind.CRASH, False),
        ("oom-killer", VerdictKind.CRASH, False),
        ("machine-check", VerdictKind.SDC, True),
        (rc.SIGNATURE, VerdictKind.SDC, True),
        ("link-down", VerdictKind.CRASH, False),  # a link flap explains a hang, not a crash
        ("link-down", VerdictKind.HANG, True),
        (rc.IB_ERRORS, VerdictKind.INFRA, True),
        (rc.THROTTLE, VerdictKind.CRASH, False),
        (rc.THROTTLE, VerdictKind.STRAGGLER, True),
        ("nvidia-xid-bus", VerdictKind.INCONCLUSIVE, False),
    ],
)
def test_which_root_findings_corroborate_which_verdict(category, kind, corroborates):
    found = rc.corroborating(_checks(rc.RootFinding(category, "x")), kind)
    assert bool(found) is corroborates
    assert rc.corroborating(None, kind) == ()


EDAC_UE = "EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0)"


def _root_owned_file(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


@pytest.mark.skipif(
    os.geteuid() != 0, reason="the test kernel log must be root's (the check trusts only root's)"
)
def test_kernel_log_test_double_is_read_since_the_job_began(tmp_path):
    d = tmp_path / "kmsg"
    d.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    log = _root_owned_file(
        d / "n1.kmsg",
        "3,1,5000000,-;NVRM: Xid (PCI:0000:04:00): 79, GPU has fallen off the bus\n"
        "3,2,9000000,-;mce: [Hardware Error]: Machine check events logged\n"
        "6,3,9500000,-;eth0: renamed\n",
    )
    out = rc.check_kernel_log(str(log), since_boot_s=8.0)
    assert out.status == "found" and "TEST DOUBLE" in out.note
    assert [f.category for f in out.findings] == ["machine-check"]  # the Xid was before the job
    os.chmod(log, 0o666)  # writable by others: not trusted, said so
    refused = rc.check_kernel_log(str(log), since_boot_s=8.0)
    assert refused.status == "error" and refused.findings == ()


def test_run_checks_records_every_check_and_keeps_its_budget(tmp_path):
    started = time.monotonic()
    out = rc.run_checks(
        "n1",
        _verdict(),
        budget_s=3.0,
        kernel_source=str(tmp_path / "none.kmsg"),
        since_boot_s=0.0,
        ib_baseline=None,
    )
    took = time.monotonic() - started
    names = [o.name for o in out.outcomes]
    assert names == ["kernel-log", "infiniband", "nvml", "dcgmi-diag", "compute-signature"]
    assert all(
        o.status in ("clean", "found", "not-available", "timed-out", "skipped", "error")
        for o in out.outcomes
    )
    assert out.outcomes[0].status == "error"  # the named source does not exist: said, not raised
    # the self-test needs 4 s of budget: with 3 s it is skipped, not run past the budget
    assert out.outcomes[-1].status == "skipped" and took < 3.0 + 1.0, (out, took)
    # the record round-trips through the evidence codec
    write_record(tmp_path / "rootcheck-0.json", out)
    assert read_record(tmp_path / "rootcheck-0.json", rc.RootChecks) == out


def test_wait_for_verdict_returns_none_when_none_appears(tmp_path):
    t = [0.0]
    got = rc.wait_for_verdict(
        tmp_path / "verdict-0.json",
        tmp_path,
        1.0,
        clock=lambda: t[0],
        sleep=lambda s: t.__setitem__(0, t[0] + s),
    )
    assert got is None and t[0] >= 1.0
    write_record(tmp_path / "verdict-0.json", _verdict())
    assert rc.wait_for_verdict(tmp_path / "verdict-0.json", tmp_path, 0.0) == _verdict()


@pytest.mark.skipif(
    os.geteuid() != 0, reason="the test kernel log must be root's (the check trusts only root's)"
)
def test_the_epilog_checks_only_a_node_the_verdict_names(tmp_path):
    """hooks/epilog.py's step after epilog.json: n1 named, its checks recorded (with what the test
    double of its kernel log says); n2 not named, nothing run or written there."""
    from scout_slurm.config import DrainConfig, SiteConfig
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.hooks.epilog import root_check_if_named

    os.chmod(tmp_path, 0o755)
    folder = JobFolder(tmp_path / "evidence", "c", 5)
    for n in ("n1", "n2"):
        folder.node_dir(n).mkdir(parents=True)
    kmsg = tmp_path / "kmsg"
    kmsg.mkdir(mode=0o755)
    _root_owned_file(kmsg / "n1.kmsg", f"3,1,5000000,-;{EDAC_UE}\n")
    cfg = SiteConfig(drain=DrainConfig(root_check_s=6.0, test_kernel_log=str(kmsg / "{node}.kmsg")))
    for node in ("n1", "n2"):
        root_check_if_named(folder, node, _verdict(), cfg, deadline=time.monotonic() + 30)
    assert not folder.rootcheck_path(0, "n2").exists()
    got = read_record(folder.rootcheck_path(0, "n1"), rc.RootChecks)
    assert got.node == "n1" and got.verdict_kind == VerdictKind.CRASH
    assert [(f.category, f.detail) for f in got.findings] == [("edac", EDAC_UE)]
    assert {o.name: o.status for o in got.outcomes}["compute-signature"] == "clean"
    assert [f.category for f in rc.corroborating(got, VerdictKind.CRASH)] == ["edac"]


def test_a_check_past_its_bound_is_cut_off_and_recorded_as_timed_out():
    """A starved self-test (or a hung driver call) costs its own bound, not the hook's budget."""

    def starved(bound):
        time.sleep(60)

    started = time.monotonic()
    out = rc.bounded_check("compute-signature", starved, 0.5)
    assert out.status == "timed-out" and "bound of 0.5 s" in out.note, out
    assert out.findings == () and time.monotonic() - started < 2.0


def test_a_bounded_checks_outcome_comes_back_whole():
    finding = rc.RootFinding(rc.ECC, "GPU 0: 2 uncorrected volatile ECC errors", "1320")
    want = rc.CheckOutcome("nvml", "found", 0.25, (finding,), note="1 GPU(s) read")
    assert rc.bounded_check("nvml", lambda bound: want, 5.0) == want
    broken = rc.bounded_check("nvml", lambda bound: 1 / 0, 5.0)
    assert broken.status == "error" and "ZeroDivisionError" in broken.note
