"""The version-2 checkpoint record: round trip, version 1 still read, the replicas' agreement, the
statuses it leads to, the comparison of a restored state with it, and DCP folder checks (pure or
on plain files in tmp_path)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from scout_slurm.bootstrap.ckptstate import combined_sha, dcp_path, files_of
from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.checkfiles import file_problem
from scout_slurm.evidence.store import read_record, write_record
from scout_slurm.remediation.eligibility import CheckpointStatus, assess, recovery_point
from scout_slurm.remediation.records import (
    CheckpointFile,
    CheckpointNote,
    CoverageSince,
    SoftwareVersions,
    StateSignature,
)
from scout_slurm.remediation.signatures import agree, agreement_text, compare, expected, short


def sig(component, per_rank, saved=None, groups=None):
    majority, agreed, _ = agree(per_rank, groups)
    return StateSignature(
        component=component,
        saved=per_rank[0] if saved is None else saved,
        per_rank=tuple(per_rank),
        majority=majority,
        agreed=agreed,
    )


def v2(step=10, *, signatures=(), agreement="agreed", at_save=False, rank=0, path=None):
    return CheckpointNote(
        path=path or f"/ck/step-{step}.pt",
        step=step,
        rank=rank,
        restart=0,
        saved_at=1000.0 + step,
        size_bytes=10,
        sha256="ab",
        versions="python 3.11",
        saver="torch.save",
        files=(CheckpointFile(name="", size_bytes=10, sha256="ab"),),
        world=4,
        ranks_saved=(0,),
        signatures=tuple(signatures),
        agreement=agreement,
        exchanged_at_save=at_save,
        data_position="step",
        software=SoftwareVersions("3.11.7", "2.13.0", None, None, "0.1.0"),
        coverage=CoverageSince(2, 0, 10, 10, "clean; no replay coverage recorded"),
    )


def test_version_2_round_trip(tmp_path):
    n = v2(signatures=[sig("model", ["aa"] * 4), sig("rng_cpu", ["1", "2", "1", "1"])])
    write_record(tmp_path / "n.json", n)
    assert read_record(tmp_path / "n.json", CheckpointNote) == n


def test_version_1_record_is_still_read_with_defaults(tmp_path):
    old = {
        "record_kind": "checkpoint-note",
        "schema_version": 1,
        "path": "/ck/step-5.pt",
        "step": 5,
        "rank": 0,
        "restart": 0,
        "saved_at": 1.0,
        "size_bytes": 3,
        "sha256": "ab",
        "versions": "python 3.11",
    }
    (tmp_path / "old.json").write_text(json.dumps(old))
    n = read_record(tmp_path / "old.json", CheckpointNote)
    assert (n.schema_version, n.signatures, n.agreement, n.software, n.files) == (
        1,
        (),
        "",
        None,
        (),
    )
    # and it is assessed as before: no agreement says nothing either way
    a = assess([n], {}, {}, lambda _: None)[0]
    assert a.status == CheckpointStatus.CANDIDATE


def test_a_newer_version_is_refused_with_what_to_do(tmp_path):
    obj = json.loads(
        json.dumps(
            {
                "record_kind": "checkpoint-note",
                "schema_version": 99,
                "path": "/x",
                "step": 1,
                "rank": 0,
                "restart": 0,
                "saved_at": 1.0,
                "size_bytes": 1,
            }
        )
    )
    (tmp_path / "new.json").write_text(json.dumps(obj))
    with pytest.raises(EvidenceError, match="newer than this scout"):
        read_record(tmp_path / "new.json", CheckpointNote)


@pytest.mark.parametrize(
    "values, groups, want",
    [
        (["a", "a", "a", "a"], None, ("a", True, ())),
        (["a", "b", "a", "a"], None, ("a", False, (1,))),
        (["a", "b"], None, ("", False, (0, 1))),  # two replicas, two values: no majority
        (["a", "", "a", "a"], None, ("a", True, ())),  # a rank with no value takes no part
        (
            ["a", "b", "c", "d"],
            [[0], [1], [2], [3]],
            ("a", True, ()),
        ),  # groups of one compare nothing
        (["a", "a", "b", "c"], [[0, 1], [2, 3]], ("a", False, (2, 3))),
    ],
)
def test_agree(values, groups, want):
    assert agree(values, groups) == want


def test_agreement_text_rejects_replicated_state_only():
    rng = sig("rng_cpu", ["1", "2", "1", "1"])
    assert agreement_text([sig("model", ["a"] * 4), rng]).startswith(
        "agreed (per-rank RNG streams: rng_cpu differs on rank 1"
    )
    text = agreement_text([sig("model", ["a", "a", "b", "a"]), sig("optimizer", ["o"] * 4)])
    assert text == "disagreed: model differs on rank 2"


def test_statuses_from_the_record():
    agreed = v2(5, signatures=[sig("model", ["a"] * 4)], agreement="agreed")
    disagreed = v2(
        10,
        signatures=[sig("model", ["a", "a", "b", "a"])],
        agreement="disagreed: model differs on rank 2",
    )
    unexchanged = v2(15, agreement="not exchanged: one rank: nothing to compare")
    out = {a.note.step: a for a in assess([agreed, disagreed, unexchanged], {}, {}, lambda _: None)}
    assert out[5].status == CheckpointStatus.ELIGIBLE and "agreed at the save" in out[5].reason
    assert (
        out[10].status == CheckpointStatus.REJECTED and "model differs on rank 2" in out[10].reason
    )
    assert out[15].status == CheckpointStatus.CANDIDATE and "not exchanged" in out[15].reason
    # the rule: the newest eligible, not the newer disagreeing one
    chosen, why = recovery_point(list(out.values()), -1)
    assert chosen.note.step == 5 and "newest eligible" in why
    # a changed file is rejected even when the replicas agreed
    bad = assess([agreed], {}, {}, lambda _: "sha256 differs: changed on disk after its record")[0]
    assert bad.status == CheckpointStatus.REJECTED


def test_compare_restored_state():
    note = v2(
        signatures=[
            sig("model", ["m"] * 4),
            sig("optimizer", ["o"] * 4),
            sig("rng_cpu", ["r0", "r1", "r2", "r3"]),
            sig("data", ["d"] * 4),
        ],
        rank=0,
    )
    same, bad, unchecked = compare(
        note, 0, {"model": "m", "optimizer": "o", "rng_cpu": "r0", "data": "d"}
    )
    assert (same, bad, unchecked) == (["model", "optimizer", "rng_cpu", "data"], [], [])
    # another rank's RNG was not saved by the saving rank: it cannot be checked, and says so
    same, bad, unchecked = compare(
        note, 2, {"model": "m", "optimizer": "o", "rng_cpu": "r2", "data": "d"}
    )
    assert bad == [] and unchecked == ["rng_cpu"]
    same, bad, _ = compare(note, 1, {"model": "X", "optimizer": "o", "rng_cpu": "r1", "data": "d"})
    assert bad == ["model: restored X, recorded m"]
    # a scheduler the record has but the resumed run lacks is a mismatch too
    note2 = dataclasses.replace(note, signatures=note.signatures + (sig("scheduler", ["s"] * 4),))
    assert compare(note2, 0, {"model": "m", "optimizer": "o", "rng_cpu": "r0", "data": "d"})[1] == [
        "scheduler: restored nothing, recorded s"
    ]


def test_expected_after_a_collective_save_is_per_rank():
    note = v2(
        signatures=[sig("model", ["a", "b", "c", "d"], groups=[[0], [1], [2], [3]])], at_save=True
    )
    assert [expected(note, r, "model") for r in range(4)] == ["a", "b", "c", "d"]
    assert expected(note, 0, "scheduler") == ""


def test_short_form():
    assert (
        short([sig("model", ["0123456789abcdef"] * 2), sig("rng_cpu", ["aa", "bb"], saved="aa")])
        == "model=01234567 rng_cpu=aa!"
    )


def test_dcp_folder_digests_and_changes(tmp_path):
    ck = tmp_path / "step-10"
    (ck / "sub").mkdir(parents=True)
    (ck / ".metadata").write_bytes(b"meta")
    (ck / "__0_0.distcp").write_bytes(b"rank0")
    (ck / "sub" / "__1_0.distcp").write_bytes(b"rank1")
    files, size, sha = files_of(str(ck))
    assert [f.name for f in files] == [
        ".metadata",
        "__0_0.distcp",
        os.path.join("sub", "__1_0.distcp"),
    ]
    assert size == 4 + 5 + 5 and sha == combined_sha(files)
    note = dataclasses.replace(
        v2(path=str(ck)), files=files, size_bytes=size, sha256=sha, saver="dcp.save"
    )
    assert file_problem(note) is None
    (ck / "extra").write_bytes(b"x")
    assert "'extra' was not there" in file_problem(note)
    # a step folder recorded from one rank's per-file saves lists that rank's parts only: another
    # rank's part (the HF Trainer's rng_state_1.pth) or a JSON written without torch is no change
    for saver in ("torch.save", "safetensors"):
        assert file_problem(dataclasses.replace(note, saver=saver)) is None
    os.unlink(ck / "extra")
    (ck / "sub" / "__1_0.distcp").write_bytes(b"rank!")
    assert "changed on disk after its record" in file_problem(note)
    os.unlink(ck / "sub" / "__1_0.distcp")
    assert "gone" in file_problem(note)
    planted = dataclasses.replace(note, files=(CheckpointFile("../../etc/passwd", 1, "ab"),))
    assert "leaves the checkpoint folder" in file_problem(planted)


def test_dcp_path_from_the_call():
    class Writer:
        path = "/ck/w"

    assert dcp_path(({},), {"checkpoint_id": "/ck/a"}, "storage_writer") == "/ck/a"
    assert dcp_path(({},), {"storage_writer": Writer()}, "storage_writer") == "/ck/w"
    assert (
        dcp_path(({}, Writer()), {}, "storage_writer") == "/ck/w"
    )  # save_state_dict(state, writer)
    assert dcp_path(({},), {}, "storage_writer") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="the checks record counts only when root owns it")
def test_scout_checkpoints_lists_the_new_fields_and_old_records(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from scout_slurm.cli import main
    from scout_slurm.evidence.layout import JobFolder

    folder = JobFolder(tmp_path / "evidence", "lab", 7)
    folder.run_dir(0).mkdir(parents=True)
    folder.checkpoints_dir.mkdir(parents=True)
    good = tmp_path / "step-5.pt"
    good.write_bytes(b"0123456789")
    import hashlib

    digest = hashlib.sha256(b"0123456789").hexdigest()
    agreed = dataclasses.replace(
        v2(
            5,
            signatures=[
                sig("model", ["0123456789abcdef"] * 4),
                sig("rng_cpu", ["aa", "bb", "aa", "aa"]),
            ],
            agreement="agreed (per-rank RNG streams: rng_cpu differs on rank 1)",
            path=str(good),
        ),
        sha256=digest,
        files=(CheckpointFile("", 10, digest),),
    )
    disagreed = v2(
        10,
        signatures=[sig("model", ["a", "a", "b", "a"])],
        agreement="disagreed: model differs on rank 2",
        path=str(good),
    )
    disagreed = dataclasses.replace(
        disagreed, sha256=digest, files=(CheckpointFile("", 10, digest),)
    )
    write_record(folder.checkpoints_dir / "run-0-step-5-rank-0.json", agreed)
    write_record(folder.checkpoints_dir / "run-0-step-10-rank-0.json", disagreed)
    old = {
        "record_kind": "checkpoint-note",
        "schema_version": 1,
        "path": str(good),
        "step": 2,
        "rank": 0,
        "restart": 0,
        "saved_at": 1.0,
        "size_bytes": 10,
        "sha256": digest,
        "versions": "python 3.11",
    }
    (folder.checkpoints_dir / "run-0-step-2-rank-0.json").write_text(json.dumps(old))
    # the command (root here) checks the files as the owner of the job's checkpoints folder, in a
    # child
    monkeypatch.setenv("SCOUT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    monkeypatch.delenv("SCOUT_CONFIG", raising=False)
    res = CliRunner().invoke(main, ["checkpoints", "7"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "signatures: model=01234567 rng_cpu=aa!" in out
    assert (
        "saved by torch.save on rank 0 of 4; 1 file(s); replicas: agreed (per-rank RNG streams"
        in out
    )
    assert "versions: python 3.11.7, torch 2.13.0, cuda -, nccl -, scout 0.1.0" in out
    assert (
        "coverage since the previous record: 2 vote(s), 0 replay round(s): clean; no replay "
        "coverage recorded" in out
    )
    assert "why: the replicas' state signatures disagreed: model differs on rank 2" in out
    assert "(schema version 1 record: no signatures or replicas' agreement)" in out
    assert "recovery rule: newest eligible checkpoint (first suspect step unknown): step 5" in out
    res = CliRunner().invoke(main, ["checkpoints", "7", "--json"])
    rows = {c["step"]: c for c in json.loads(res.output)["checkpoints"]}
    assert (
        rows[10]["status"] == "rejected"
        and rows[5]["status"] == "eligible"
        and rows[2]["schema_version"] == 1
    )
    assert rows[5]["signatures"]["rng_cpu"] == {"value": "aa", "agreed": False}
    assert rows[5]["software"]["torch"] == "2.13.0" and rows[5]["coverage"]["votes"] == 2


def test_dcp_folder_digest_budget_is_shared_by_its_files(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    for i in range(3):
        (ck / f"__{i}_0.distcp").write_bytes(bytes([i]) * 100)
    files, size, sha = files_of(str(ck))
    note = dataclasses.replace(v2(path=str(ck)), files=files, size_bytes=size, sha256=sha)
    # a same-size rewrite of the last file: caught with a budget for all three; with one for two the
    # third is not hashed, and a file a hook could hash is not passed unhashed
    (ck / "__2_0.distcp").write_bytes(b"\x07" * 100)
    assert "changed on disk" in file_problem(note, full_digest_limit=300)
    assert "the hashing budget was spent" in file_problem(note, full_digest_limit=200)


def test_resume_mismatch_policy_in_the_site_config(tmp_path):
    from scout_slurm.config import ConfigError, load_config, parse_config

    assert parse_config({}).remediation.on_resume_mismatch == "warn"
    assert (
        parse_config(
            {"remediation": {"on_resume_mismatch": "fatal"}}
        ).remediation.on_resume_mismatch
        == "fatal"
    )
    with pytest.raises(
        ConfigError, match="on_resume_mismatch must be 'warn' or 'fatal', got 'kill'"
    ):
        parse_config({"remediation": {"on_resume_mismatch": "kill"}}, source="site.toml")
    env = {"SCOUT_CONFIG": str(tmp_path / "absent.toml")}
    (tmp_path / "absent.toml").write_text("")
    env["SCOUT_REMEDIATION_ON_RESUME_MISMATCH"] = "fatal"
    assert load_config(env).remediation.on_resume_mismatch == "fatal"


def test_coverage_since_the_previous_record(tmp_path):
    from scout_slurm.bootstrap.ckptstate import CheckpointWatch
    from scout_slurm.remediation.records import VoteCoverage

    w = CheckpointWatch(
        rank=0,
        world=4,
        side=None,
        notes_dir=None,
        run_dir=tmp_path,
        restart=0,
        offset=0,
        all_gather=None,
        all_reduce=None,
        groups=lambda: None,
        completed_steps=lambda: 0,
    )
    assert w._coverage().verdicts.startswith("no state votes recorded")
    write_record(
        tmp_path / "votes.json",
        VoteCoverage(restart=0, votes=2, last_clean_step=20, last_vote_step=20, replay_rounds=2),
    )
    first = w._coverage()
    assert (first.votes, first.replay_rounds, first.last_clean_step, first.verdicts) == (
        2,
        2,
        20,
        "clean",
    )
    write_record(
        tmp_path / "votes.json",
        VoteCoverage(restart=0, votes=3, last_clean_step=20, last_vote_step=30, replay_rounds=3),
    )
    second = w._coverage()
    assert (second.votes, second.replay_rounds) == (1, 1)
    assert second.verdicts == "not clean: the last vote at step 30, the last clean one at step 20"
    third = w._coverage()  # no vote since
    assert third.votes == 0 and third.verdicts.startswith("no vote since the previous record")
    write_record(
        tmp_path / "votes.json",
        VoteCoverage(restart=0, votes=4, last_clean_step=40, last_vote_step=40),
    )
    assert w._coverage().verdicts == "clean; replay off: no replay coverage"
