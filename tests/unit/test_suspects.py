"""`scout suspects` and `scout incidents --gpu`: the drain decisions of past incidents, read back
across jobs (incident/history.py), and what the drain rule counts from them."""

from __future__ import annotations

import json

from click.testing import CliRunner

from scout_slurm.cli import main
from scout_slurm.evidence.records import VerdictKind
from scout_slurm.evidence.store import write_record
from scout_slurm.incident.history import list_suspects, past_incidents
from scout_slurm.remediation.plan import DrainDecisions, NodeOutcome


def _decisions(root, job, user, at, *rows) -> None:
    path = root / "c" / str(job) / "results" / "drain-decisions-0.json"
    path.parent.mkdir(parents=True)
    write_record(
        path,
        DrainDecisions(
            job_id=job,
            restart=0,
            user=user,
            uid=1000,
            kind=VerdictKind.CRASH,
            at=at,
            drain_on="corroborated",
            nodes=tuple(rows),
        ),
    )


def _tree(root):
    # GPU 1320 named on n2 by alice's job 7 (watched), then on n5 (moved) by bob's job 9 (drained)
    _decisions(
        root,
        7,
        "alice",
        1000.0,
        NodeOutcome(
            "n2",
            ("1320",),
            "watch",
            "only the job's own evidence",
            ("kernel-log: clean", "nvml: clean"),
            (),
        ),
    )
    _decisions(
        root,
        9,
        "bob",
        2000.0,
        NodeOutcome(
            "n5",
            ("1320",),
            "drain",
            "2 incidents from 2 users",
            ("nvml: found",),
            ("gpu-ecc: GPU 0: 3 uncorrected volatile ECC errors",),
        ),
    )
    _decisions(
        root,
        11,
        "bob",
        3000.0,
        NodeOutcome("n3", (), "held", "confidence below the minimum", (), ()),
    )


def test_suspects_lists_nodes_and_gpus_with_users_kinds_and_root_checks(tmp_path):
    _tree(tmp_path)
    rows = {(r.what, r.name): r for r in list_suspects(tmp_path)}
    assert set(rows) == {("node", "n2"), ("node", "n5"), ("node", "n3"), ("gpu", "1320")}
    assert rows[("node", "n2")].status == "watch" and rows[("node", "n5")].status == "drained"
    assert rows[("node", "n3")].status == "held"
    gpu = rows[("gpu", "1320")]
    assert gpu.status == "drained" and gpu.users == ("alice", "bob")
    assert [i.job_id for i in gpu.incidents] == [9, 7]  # newest first
    assert gpu.incidents[0].root_findings == ("gpu-ecc: GPU 0: 3 uncorrected volatile ECC errors",)


def test_the_rule_counts_only_incidents_it_ruled_on_within_the_window(tmp_path):
    _tree(tmp_path)
    got = sorted((p.job_id, p.node, p.user) for p in past_incidents(tmp_path, "c", since=500.0))
    assert got == [(7, "n2", "alice"), (9, "n5", "bob")]  # job 11 was held by a guard: not counted
    assert [p.job_id for p in past_incidents(tmp_path, "c", since=1500.0)] == [9]


def test_cli_incidents_gpu_and_suspects(tmp_path):
    _tree(tmp_path)
    conf = tmp_path / "scout.toml"
    conf.write_text(f'[evidence]\nroot = "{tmp_path}"\n')
    runner = CliRunner()
    res = runner.invoke(main, ["incidents", "--gpu", "1320", "--config", str(conf)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(
        "gpu 1320: drained; 2 incident(s) from 2 user(s) (alice, bob); kinds crash"
    )
    assert "job 7 run 0 alice crash: watch: only the job's own evidence" in res.output
    assert "root found: gpu-ecc: GPU 0: 3 uncorrected volatile ECC errors" in res.output
    res = runner.invoke(main, ["incidents", "--gpu", "9999", "--config", str(conf)])
    assert "no incident named GPU serial 9999" in res.output
    res = runner.invoke(main, ["suspects", "--json", "--config", str(conf)])
    assert {(r["what"], r["name"], r["status"]) for r in json.loads(res.stdout)} == {
        ("node", "n2", "watch"),
        ("node", "n5", "drained"),
        ("node", "n3", "held"),
        ("gpu", "1320", "drained"),
    }


def test_a_node_returned_to_service_since_its_drain_says_so(tmp_path):
    from scout_slurm.incident.history import render_suspects
    from scout_slurm.slurm.parse import NodeInfo

    _tree(tmp_path)
    states = {
        "n5": NodeInfo("n5", "IDLE", (), "", "n5", "n5"),  # `scout undrain n5` since
        "n2": NodeInfo("n2", "IDLE", ("DRAIN",), "scout: crash rank 1 job 7", "n2", "n2"),
    }
    rows = {(r.what, r.name): r for r in list_suspects(tmp_path, node_states=states)}
    assert rows[("node", "n5")].status == "undrained"
    assert rows[("node", "n5")].slurm_state == "IDLE"
    assert rows[("node", "n2")].status == "watch"  # drained by someone else: not scout's word
    assert rows[("gpu", "1320")].status == "drained"  # a GPU has no Slurm state of its own
    assert "node n5: undrained (Slurm: IDLE);" in render_suspects(list(rows.values()))
