"""Checkpoint records in real 2-rank gloo jobs (CPU, no Slurm): torch.distributed.checkpoint saves
seen without editing the script, the replicas' signatures exchanged and agreed (or not), and the
resumed run's restored state compared with the record (verified, or a loud mismatch)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from scout_slurm.evidence.checkfiles import file_problem
from scout_slurm.evidence.store import read_record
from scout_slurm.remediation.eligibility import CheckpointStatus, assess
from scout_slurm.remediation.records import Agreement, CheckpointNote

sys.path.insert(
    0, str(Path(__file__).resolve().parent)
)  # the rank runner of test_bootstrap.py, one copy
from test_bootstrap import JOBS, TRAIN, run_ranks, scout_env

pytestmark = [pytest.mark.torch]

DCP_JOB = JOBS / "train_dcp.py"
DEADLINE_S = 150  # two ranks starting torch on a loaded 2-core machine (a CI run saw > 60 s)


def _env(base: Path, name: str, **extra: str) -> dict[str, str]:
    run_dir = base / name
    (run_dir / "findings").mkdir(parents=True, exist_ok=True)  # scout-task makes it in a real job
    return scout_env(
        run_dir, SCOUT_CHECKPOINTS_DIR=str(base / "notes"), SCOUT_RUN_DIR=str(run_dir), **extra
    )


def _ok(runs) -> None:
    for r in runs:
        assert r.returncode == 0, f"rank {r.rank} exited {r.returncode}\n{r.stdout}\n{r.stderr}"


def _findings(run_dir: Path) -> dict[str, dict]:
    return {
        p.name: json.loads(p.read_text())
        for p in sorted((run_dir / "findings").glob("resume-*.json"))
    }


def _notes(base: Path) -> list[CheckpointNote]:
    return [read_record(p, CheckpointNote) for p in sorted((base / "notes").glob("*.json"))]


@pytest.mark.timeout(120)
def test_dcp_save_is_one_record_of_every_file_and_its_resume_is_verified(tmp_path):
    ck = tmp_path / "ck"
    _ok(run_ranks([str(DCP_JOB), "--ckpt", str(ck)], _env(tmp_path, "a"), cwd=tmp_path / "a"))
    [note] = _notes(tmp_path)
    on_disk = sorted(str(p.relative_to(ck)) for p in ck.rglob("*") if p.is_file())
    assert (note.saver, note.path, note.step, note.ranks_saved, note.world) == (
        "dcp.save",
        str(ck),
        4,
        (0, 1),
        2,
    )
    assert (
        sorted(f.name for f in note.files) == on_disk and len(on_disk) >= 3
    )  # .metadata + one file per rank
    assert note.exchanged_at_save and note.agreement == "agreed"
    sigs = {s.component: s for s in note.signatures}
    assert {"model", "optimizer", "rng_cpu", "rng_python", "rng_numpy", "data"} <= set(sigs)
    assert all(s.agreed and len(set(s.per_rank)) == 1 for s in sigs.values())
    assert (
        note.software.torch == torch.__version__ and note.software.cuda is None
    )  # CPU build: no CUDA, no NCCL
    assert file_problem(note) is None
    assert assess([note], {}, {}, file_problem)[0].status == CheckpointStatus.ELIGIBLE

    runs = run_ranks(
        [str(DCP_JOB), "--ckpt", str(ck), "--resume"],
        _env(
            tmp_path,
            "b",
            SCOUT_RESUME_CHECKPOINT=str(ck),
            SCOUT_STEP_OFFSET="4",
            SLURM_RESTART_COUNT="1",
        ),
        cwd=tmp_path / "b",
    )
    _ok(runs)
    found = _findings(tmp_path / "b")
    assert sorted(found) == ["resume-verified-rank-0.json", "resume-verified-rank-1.json"], found
    assert (
        "model, optimizer, rng_cpu, rng_python, rng_numpy, data equal the record"
        in found["resume-verified-rank-1.json"]["summary"]
    )
    # a shard rewritten after the record: the folder's check names it
    shard = next(p for p in ck.iterdir() if p.suffix == ".distcp")
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert "changed on disk after its record" in file_problem(note)


@pytest.mark.timeout(120)
def test_replicas_that_disagree_at_the_save_reject_the_checkpoint(tmp_path):
    # rank 1's weights get one flipped bit at step 3 and no vote ends it: at the save (step 4) the
    # two replicas' model signatures differ
    env = _env(
        tmp_path, "a", SCOUT_INJECT="bitflip,bit=20,rank=1,step=3", SCOUT_CONSENSUS_EVERY="0"
    )
    _ok(run_ranks([str(DCP_JOB), "--ckpt", str(tmp_path / "ck")], env, cwd=tmp_path / "a"))
    [note] = _notes(tmp_path)
    sigs = {s.component: s for s in note.signatures}
    assert not sigs["model"].agreed and sigs["model"].per_rank[0] != sigs["model"].per_rank[1]
    assert sigs["data"].agreed
    assert note.agreement.startswith("disagreed: model differs on ranks 0, 1")
    a = assess([note], {}, {}, file_problem)[0]
    assert a.status == CheckpointStatus.REJECTED and "disagreed" in a.reason


@pytest.mark.timeout(150)
def test_torch_save_resume_is_verified_bit_for_bit_and_an_altered_file_is_a_loud_mismatch(tmp_path):
    ckpt = tmp_path / "ckpt"
    train = [
        str(TRAIN),
        "--steps",
        "12",
        "--step-sleep",
        "0",
        "--timeout",
        "30",
        "--ckpt-dir",
        str(ckpt),
        "--ckpt-every",
        "5",
        "--sched",
        "--momentum",
        "0.9",
    ]
    _ok(
        run_ranks(
            [*train, "--out", str(tmp_path / "a.txt")], _env(tmp_path, "a"), cwd=tmp_path / "a"
        )
    )
    notes = {n.step: n for n in _notes(tmp_path)}
    assert sorted(notes) == [5, 10]
    five = notes[5]
    # one rank saved; every rank signed its state at the next exchange (no vote in 12 steps at K =
    # 50: the
    # one at destroy_process_group, after step 12) and the replicas agreed there, at a step >= the
    # save's
    assert (five.saver, five.ranks_saved, five.exchanged_at_save) == ("torch.save", (0,), False)
    assert five.agreement == "agreed at step 12, the first exchange after the save at step 5"
    assert five.agreement_kind is Agreement.AGREED
    assert {s.component for s in five.signatures} >= {
        "model",
        "optimizer",
        "scheduler",
        "rng_cpu",
        "data",
    }
    assert all(
        s.agreed and len(set(s.per_rank)) == 1
        for s in five.signatures
        if not s.component.startswith("rng")
    )
    assert assess([five], {}, {}, file_problem)[0].status == CheckpointStatus.ELIGIBLE

    resume = dict(
        SCOUT_RESUME_CHECKPOINT=str(ckpt / "step-5.pt"),
        SCOUT_STEP_OFFSET="5",
        SLURM_RESTART_COUNT="1",
    )
    b = run_ranks(
        [*train, "--out", str(tmp_path / "b.txt")],
        _env(tmp_path, "b", **resume),
        cwd=tmp_path / "b",
    )
    _ok(b)
    found = _findings(tmp_path / "b")
    assert sorted(found) == ["resume-verified-rank-0.json", "resume-verified-rank-1.json"], found
    assert "scheduler" in found["resume-verified-rank-0.json"]["summary"]
    # parameters, optimizer state, learning rate, scheduler and RNG streams after 12 steps: the same
    # bits
    assert (tmp_path / "b.txt").read_text() == (tmp_path / "a.txt").read_text()

    # the same file rewritten, still a readable checkpoint, one weight changed: the resumed run says
    # so
    altered = tmp_path / "altered.pt"
    shutil.copy(ckpt / "step-5.pt", altered)
    state = torch.load(altered, weights_only=True)
    first = next(iter(state["model"]))
    state["model"][first].view(-1)[0] += 1e-3
    torch.save(state, ckpt / "step-5.pt")
    assert "changed on disk after its record" in file_problem(five)
    c = run_ranks(
        train, _env(tmp_path, "c", SCOUT_RESUME_MISMATCH="fatal", **resume), cwd=tmp_path / "c"
    )
    for r in c:
        assert r.returncode == 90, f"rank {r.rank} exited {r.returncode}\n{r.stderr}"
        assert (
            "RESUME MISMATCH" in r.stderr
            and "model: restored" in r.stderr
            and "SCOUT_RESUME_MISMATCH=fatal" in r.stderr
        )
    found = _findings(tmp_path / "c")
    assert sorted(found) == ["resume-mismatch-rank-0.json", "resume-mismatch-rank-1.json"]
    assert "differs from its record" in found["resume-mismatch-rank-0.json"]["summary"]


@pytest.mark.timeout(120)
def test_sharded_dcp_save_is_not_called_a_disagreement_and_each_shard_is_verified(tmp_path):
    # FSDP2: every rank holds a different shard; no state vote has told scout the replica groups
    ck = tmp_path / "ck"
    _ok(
        run_ranks(
            [str(DCP_JOB), "--fsdp", "--ckpt", str(ck)],
            _env(tmp_path, "a", SCOUT_CONSENSUS_EVERY="0"),
            cwd=tmp_path / "a",
        )
    )
    [note] = _notes(tmp_path)
    model = {s.component: s for s in note.signatures}["model"]
    assert model.per_rank[0] != model.per_rank[1]  # two shards
    assert note.agreement.startswith("not exchanged: sharded parameters (DTensor)")
    assert assess([note], {}, {}, file_problem)[0].status == CheckpointStatus.CANDIDATE
    runs = run_ranks(
        [str(DCP_JOB), "--fsdp", "--ckpt", str(ck), "--resume"],
        _env(
            tmp_path,
            "b",
            SCOUT_CONSENSUS_EVERY="0",
            SCOUT_RESUME_CHECKPOINT=str(ck),
            SCOUT_STEP_OFFSET="4",
            SLURM_RESTART_COUNT="1",
        ),
        cwd=tmp_path / "b",
    )
    _ok(runs)
    found = _findings(tmp_path / "b")
    assert sorted(found) == ["resume-verified-rank-0.json", "resume-verified-rank-1.json"], found
    assert "model, optimizer" in found["resume-verified-rank-0.json"]["summary"]


@pytest.mark.timeout(120)
def test_a_dcp_folder_renamed_after_the_save_is_recorded_and_resumed_under_its_final_name(tmp_path):
    # saved into ck.tmp/, then rank 0 renames the folder to ck/ (after a barrier): the record
    # follows
    ck = tmp_path / "ck"
    _ok(
        run_ranks(
            [str(DCP_JOB), "--ckpt", str(ck), "--rename-from-tmp"],
            _env(tmp_path, "a"),
            cwd=tmp_path / "a",
        )
    )
    assert not (tmp_path / "ck.tmp").exists()
    [note] = _notes(tmp_path)
    assert (note.path, note.saved_as, note.saver, note.agreement) == (
        str(ck),
        f"{ck}.tmp",
        "dcp.save",
        "agreed",
    )
    assert sorted(f.name for f in note.files) == sorted(
        str(p.relative_to(ck)) for p in ck.rglob("*") if p.is_file()
    )
    assert file_problem(note) is None
    assert assess([note], {}, {}, file_problem)[0].status == CheckpointStatus.ELIGIBLE
    runs = run_ranks(
        [str(DCP_JOB), "--ckpt", str(ck), "--resume"],
        _env(
            tmp_path,
            "b",
            SCOUT_RESUME_CHECKPOINT=str(ck),
            SCOUT_STEP_OFFSET="4",
            SLURM_RESTART_COUNT="1",
        ),
        cwd=tmp_path / "b",
    )
    _ok(runs)
    found = _findings(tmp_path / "b")
    assert sorted(found) == ["resume-verified-rank-0.json", "resume-verified-rank-1.json"], found
    assert f"restored {ck} (step 4)" in found["resume-verified-rank-1.json"]["summary"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("atomic", ["replace", "hidden"])
def test_an_atomic_torch_save_is_recorded_under_its_final_name_and_resumed_bit_for_bit(
    tmp_path, atomic
):
    # NAME.tmp (or the hidden .NAME.tmp, not a checkpoint until renamed) then os.replace to NAME
    ckpt = tmp_path / "ckpt"
    train = [
        str(TRAIN),
        "--steps",
        "12",
        "--step-sleep",
        "0",
        "--timeout",
        "30",
        "--ckpt-dir",
        str(ckpt),
        "--ckpt-every",
        "5",
        "--sched",
        "--momentum",
        "0.9",
        "--atomic-save",
        atomic,
    ]
    _ok(
        run_ranks(
            [*train, "--out", str(tmp_path / "a.txt")], _env(tmp_path, "a"), cwd=tmp_path / "a"
        )
    )
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-10.pt", "step-5.pt"]
    notes = {n.step: n for n in _notes(tmp_path)}
    assert sorted(notes) == [5, 10]
    tmp_name = {"replace": "step-5.pt.tmp", "hidden": ".step-5.pt.tmp"}[atomic]
    five = notes[5]
    assert (five.path, five.saved_as, five.agreement_kind) == (
        str(ckpt / "step-5.pt"),
        str(ckpt / tmp_name),
        Agreement.AGREED,
    )
    assert file_problem(five) is None
    assert assess([five], {}, {}, file_problem)[0].status == CheckpointStatus.ELIGIBLE
    resume = dict(SCOUT_RESUME_CHECKPOINT=five.path, SCOUT_STEP_OFFSET="5", SLURM_RESTART_COUNT="1")
    _ok(
        run_ranks(
            [*train, "--out", str(tmp_path / "b.txt")],
            _env(tmp_path, "b", **resume),
            cwd=tmp_path / "b",
        )
    )
    found = _findings(tmp_path / "b")
    assert sorted(found) == ["resume-verified-rank-0.json", "resume-verified-rank-1.json"], found
    assert (
        f"restored {ckpt / 'step-5.pt'} (step 5)" in found["resume-verified-rank-0.json"]["summary"]
    )
    assert (tmp_path / "b.txt").read_text() == (tmp_path / "a.txt").read_text()


@pytest.mark.timeout(360)
def test_a_rank_with_nothing_to_compare_is_not_called_verified(tmp_path):
    """The saving rank's values stand for the others only where the replicas agreed: with no
    agreement on record, rank 1 has nothing to compare, and says so instead of 'verified'."""
    ckpt = tmp_path / "ckpt"
    train = [str(TRAIN), "--steps", "6", "--step-sleep", "0", "--timeout", "30"]
    train += ["--ckpt-dir", str(ckpt), "--ckpt-every", "5"]
    _ok(run_ranks(train, _env(tmp_path, "a"), cwd=tmp_path / "a", deadline_s=DEADLINE_S))
    (path,) = [p for p in (tmp_path / "notes").glob("*.json") if read_record(p, CheckpointNote)]
    doc = json.loads(path.read_text())
    for sig in doc["signatures"]:
        sig["agreed"] = False  # as if the exchange after the save had not agreed
    path.write_text(json.dumps(doc))
    resume = dict(SCOUT_RESUME_CHECKPOINT=str(ckpt / "step-5.pt"), SCOUT_STEP_OFFSET="5")
    _ok(
        run_ranks(
            train,
            _env(tmp_path, "b", SLURM_RESTART_COUNT="1", **resume),
            cwd=tmp_path / "b",
            deadline_s=DEADLINE_S,
        )
    )
    found = _findings(tmp_path / "b")
    assert sorted(found) == ["resume-unchecked-rank-1.json", "resume-verified-rank-0.json"], found
    summary = found["resume-unchecked-rank-1.json"]["summary"]
    assert summary.startswith("resume not checked: rank 1 restored") and "verified" not in summary


@pytest.mark.timeout(360)
def test_a_step_folder_of_several_files_is_one_checkpoint_and_a_part_loaded_by_file_object_counts(
    tmp_path,
):
    """As the HF Trainer saves: five files in `checkpoint-4/` at step 4 are one record naming the
    folder, with every part (not the last file written); the resumed run loads the parts through
    file objects, which counts as loading the resume checkpoint."""
    ckpt = tmp_path / "ckpt"
    job = [str(JOBS / "train_step_folder.py"), "--ckpt", str(ckpt), "--save-at", "4"]
    _ok(run_ranks(job, _env(tmp_path, "a"), cwd=tmp_path / "a", deadline_s=DEADLINE_S))
    notes = _notes(tmp_path)
    assert len(notes) == 1, [n.path for n in notes]
    (note,) = notes
    assert (note.path, note.step) == (str(ckpt / "checkpoint-4"), 4)
    assert sorted(f.name for f in note.files) == [
        "model.pt",
        "optimizer.pt",
        "rng_state_0.pth",
        "scheduler.pt",
        "training_args.bin",
    ]
    assert file_problem(note) is None  # the folder's parts as recorded
    resume = dict(SCOUT_RESUME_CHECKPOINT=note.path, SCOUT_STEP_OFFSET="4")
    job_b = [*job, "--resume", note.path]
    _ok(
        run_ranks(
            job_b,
            _env(tmp_path, "b", SLURM_RESTART_COUNT="1", **resume),
            cwd=tmp_path / "b",
            deadline_s=DEADLINE_S,
        )
    )
    found = _findings(tmp_path / "b")
    assert "resume-verified-rank-0.json" in found, found
    assert not any("did not load" in f["summary"] for f in found.values()), found


@pytest.mark.timeout(360)
def test_lightnings_own_checkpoints_are_recorded_and_its_resume_is_seen(tmp_path):
    """Lightning's ModelCheckpoint saves into memory and has fsspec write the bytes to a temporary
    file moved into place; its resume loads through an fsspec file object. Both are seen: one
    record per saved step under the final name, and the resumed rank 0 verified."""
    pytest.importorskip("lightning", reason="pip install -e '.[frameworks]' (scripts/setup.sh)")
    ckpt = tmp_path / "ck"
    job = [str(JOBS / "train_lightning.py"), "--steps", "12", "--every", "4", "--ckpt", str(ckpt)]
    _ok(run_ranks(job, _env(tmp_path, "a"), cwd=tmp_path, deadline_s=DEADLINE_S))
    notes = {n.step: n for n in _notes(tmp_path)}
    assert sorted(notes) == [4, 8, 12], [n.path for n in notes.values()]
    eight = notes[8]
    assert eight.path == str(ckpt / "epoch=0-step=8.ckpt"), eight.path
    assert eight.saver == "torch.save (into memory, then written)"
    assert file_problem(eight) is None
    resume = dict(SCOUT_RESUME_CHECKPOINT=eight.path, SCOUT_STEP_OFFSET="8")
    job_b = [*job[:-1], str(tmp_path / "ck2"), "--resume", eight.path]
    _ok(
        run_ranks(
            job_b,
            _env(tmp_path, "b", SLURM_RESTART_COUNT="1", **resume),
            cwd=tmp_path,
            deadline_s=DEADLINE_S,
        )
    )
    found = _findings(tmp_path / "b")
    assert found["resume-verified-rank-0.json"]["summary"].startswith(
        f"resume verified: rank 0 restored {eight.path} (step 8); model, optimizer"
    ), found
    assert not any("did not load" in f["summary"] for f in found.values()), found


@pytest.mark.timeout(360)
def test_a_reruns_state_votes_follow_the_global_step(tmp_path):
    """A rerun from step 20 with votes every 25 steps votes at global step 25 (its own 5th step),
    as the first run would have, and at its end: 2 votes, not only the end-of-training one."""
    job = [str(TRAIN), "--steps", "10", "--step-sleep", "0", "--timeout", "30"]
    rerun = dict(SCOUT_STEP_OFFSET="20", SLURM_RESTART_COUNT="1", SCOUT_CONSENSUS_EVERY="25")
    _ok(run_ranks(job, _env(tmp_path, "a", **rerun), cwd=tmp_path, deadline_s=DEADLINE_S))
    cov = json.loads((tmp_path / "a" / "votes.json").read_text())
    assert (cov["votes"], cov["steps"], cov["last_vote_step"]) == (2, 30, 30), cov


@pytest.mark.timeout(360)
def test_lightnings_closure_step_turns_the_replay_off_once_and_the_banner_sees_its_ddp(tmp_path):
    """Lightning steps with optimizer.step(closure): the forward runs inside the step. The replay
    says once why it does not run; the framework line, said after the first step, names the DDP
    model Lightning built (it said 'no model seen' when said before the closure ran)."""
    pytest.importorskip("lightning", reason="pip install -e '.[frameworks]' (scripts/setup.sh)")
    job = [str(JOBS / "train_lightning.py"), "--steps", "12", "--every", "100"]
    runs = run_ranks(
        [*job, "--ckpt", str(tmp_path / "ck")],
        _env(tmp_path, "a", SCOUT_CONSENSUS_EVERY="5", SCOUT_REPLAY_EVERY="2"),
        cwd=tmp_path,
        deadline_s=DEADLINE_S,
    )
    _ok(runs)
    said = runs[0].stderr
    assert said.count("in-situ replay not run: the job steps with optimizer.step(closure)") == 1
    assert "no DDP, FSDP2 or DeepSpeed model seen" not in said, said[-3000:]
    assert "scout: framework: torch DDP" in said, said[-3000:]
    cov = json.loads((tmp_path / "a" / "votes.json").read_text())
    assert cov["votes"] >= 2 and "in-situ replay" in str(cov["checks_off"]), cov


@pytest.mark.timeout(420)
def test_the_hf_trainers_own_checkpoint_folders_are_recorded_whole_and_its_resume_is_verified(
    tmp_path,
):
    """The Hugging Face Trainer itself (transformers 5, a small GPT-2 with tied weights, 2 ranks
    over gloo): each `checkpoint-N/` is one record per rank naming the folder, `model.safetensors`
    among its parts (written by safetensors, not torch.save); the resumed run, through the
    Trainer's own `resume_from_checkpoint`, is verified; the tied embedding's replay names
    nobody."""
    pytest.importorskip("transformers", reason="pip install -e '.[frameworks]' (scripts/setup.sh)")
    out = tmp_path / "out"
    job = [str(JOBS / "train_hf.py"), "--steps", "20", "--save-every", "10", "--out", str(out)]
    _ok(run_ranks(job, _env(tmp_path, "a"), cwd=tmp_path, deadline_s=DEADLINE_S))
    notes = [n for n in _notes(tmp_path) if n.rank == 0]
    assert sorted((n.step, n.path) for n in notes) == [
        (10, str(out / "checkpoint-10")),
        (20, str(out / "checkpoint-20")),
    ], [(n.step, n.path, n.rank) for n in _notes(tmp_path)]
    ten = next(n for n in notes if n.step == 10)
    parts = sorted(f.name for f in ten.files)
    for part in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth"):
        assert part in parts, parts
    assert file_problem(ten) is None
    assert not list((tmp_path / "a" / "findings").glob("sdc-*")), "a clean run named a rank"
    resume = dict(SCOUT_RESUME_CHECKPOINT=ten.path, SCOUT_STEP_OFFSET="10")
    _ok(
        run_ranks(
            [*job[:-1], str(tmp_path / "out2")],
            _env(tmp_path, "b", SLURM_RESTART_COUNT="1", **resume),
            cwd=tmp_path,
            deadline_s=DEADLINE_S,
        )
    )
    found = _findings(tmp_path / "b")
    assert found["resume-verified-rank-0.json"]["summary"].startswith(
        f"resume verified: rank 0 restored {ten.path} (step 10)"
    ), found
    # the Trainer restores torch's generator before its first step, whose dropout then draws from
    # it: the state it restored is what is compared (it read "RNG streams differ ... not restored
    # by the script" when the state at the first optimizer step was)
    assert "rng_cpu" in found["resume-verified-rank-0.json"]["details"][0], found
    assert "differ" not in found["resume-verified-rank-0.json"]["summary"], found
    assert not any("did not load" in f["summary"] for f in found.values()), found
