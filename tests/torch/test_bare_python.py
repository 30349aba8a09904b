"""A job whose Python has torch and nothing else, as docs/USERS.md allows for a site's own torch
(`scout-slurm` installed without the `job` extra: no xxhash, no numpy): scout's bootstrap watches a
real 2-rank gloo job there and never harms it. Its checkpoints (a plain torch.save and an atomic
save renamed into place) are recorded with signatures, and the state votes run.

The interpreter is .venv-bare (torch==2.13.0 and this package, nothing else), made by
scripts/test.sh. Without it the test skips, saying so; with it, xxhash or numpy importable there is
a failure (the test would no longer prove anything)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scout_slurm.evidence.store import read_record
from scout_slurm.remediation.records import Agreement, CheckpointNote

sys.path.insert(
    0, str(Path(__file__).resolve().parent)
)  # the rank runner of test_bootstrap.py, one copy
from test_bootstrap import JOBS, run_ranks, scout_env

pytestmark = [pytest.mark.torch]

BARE_PYTHON = Path(__file__).resolve().parents[2] / ".venv-bare" / "bin" / "python"
# what scout says on stderr when all is well: the announcements of what it checks (anything else
# it says there is a check switched off or a record not written)
ANNOUNCED = (
    "scout: framework: ",
    "scout: in-situ replay every ",
    "scout: state votes every ",
    "scout: optimizer update replay every ",
)


def _bare_python() -> Path:
    if not BARE_PYTHON.exists():
        pytest.skip(
            f"{BARE_PYTHON} does not exist: scripts/test.sh makes it (torch and scout-slurm "
            "without the "
            "job extra)"
        )
    probe = (
        "import importlib.util, json; from scout_slurm.bootstrap import signing; "
        "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in ('xxhash', "
        "'numpy', 'torch')} "
        "| {'hash': signing.HASH_NAME}))"
    )
    out = subprocess.run(
        [str(BARE_PYTHON), "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {"xxhash": False, "numpy": False, "torch": True, "hash": "blake2b-64"}, (
        f"{BARE_PYTHON} is not bare (or scout does not sign with the stdlib hash there): {found}"
    )
    return BARE_PYTHON


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_job_without_numpy_or_xxhash_saves_checkpoints_that_scout_records_and_votes_on(tmp_path):
    python = _bare_python()
    run_dir = tmp_path / "run"
    for sub in ("findings", "ranks"):  # scout-task makes them in a real job
        (run_dir / sub).mkdir(parents=True)
    env = scout_env(
        run_dir,
        SCOUT_CHECKPOINTS_DIR=str(tmp_path / "notes"),
        SCOUT_RUN_DIR=str(run_dir),
        SCOUT_CONSENSUS_EVERY="4",
    )
    ckpt = tmp_path / "ckpt"
    runs = run_ranks(
        [
            str(JOBS / "train_bare.py"),
            "--steps",
            "12",
            "--plain-save-at",
            "4",
            "--atomic-save-at",
            "8",
            "--ckpt-dir",
            str(ckpt),
        ],
        env,
        cwd=run_dir,
        python=str(python),
        deadline_s=90,
    )
    for r in runs:
        assert r.returncode == 0, f"rank {r.rank} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert f"rank {r.rank}: done" in r.stdout
        said = [
            line
            for line in r.stderr.splitlines()
            if "scout:" in line and not line.startswith(ANNOUNCED)
        ]
        assert said == [], r.stderr
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "step-4.pt",
        "step-8.pt",
    ]  # the .tmp was renamed away

    notes = {
        n.step: n
        for n in (
            read_record(p, CheckpointNote) for p in sorted((tmp_path / "notes").glob("*.json"))
        )
    }
    assert sorted(notes) == [4, 8]
    assert notes[4].saved_as == "" and notes[8].saved_as == str(ckpt / "step-8.pt.tmp")
    for step, note in notes.items():
        assert (note.saver, note.path, note.ranks_saved, note.world) == (
            "torch.save",
            str(ckpt / f"step-{step}.pt"),
            (0,),
            2,
        )
        sigs = {s.component: s for s in note.signatures}
        assert {"model", "optimizer", "rng_cpu", "rng_python", "data"} <= set(sigs)
        assert "rng_numpy" not in sigs or sigs["rng_numpy"].per_rank == (
            "",
            "",
        )  # numpy was never imported
        for c in (
            "model",
            "optimizer",
            "rng_cpu",
            "data",
        ):  # the replicas' state (Python's random: unseeded)
            assert sigs[c].agreed and len(set(sigs[c].per_rank)) == 1 and sigs[c].per_rank[0], (
                c,
                sigs[c],
            )
        assert note.agreement_kind is Agreement.AGREED, note.agreement
    assert notes[4].signatures != notes[8].signatures  # signed at each save, not a constant

    votes = json.loads((run_dir / "votes.json").read_text())
    # votes at steps 4, 8, 12 (and the end-of-training one), all clean; replay and update replay ran
    assert votes["votes"] >= 3 and votes["last_clean_step"] == 12 and votes["replicas"] == 2, votes
    assert votes["replay_rounds"] and votes["replay_failed_rounds"] == 0, votes


_SIGN = """
import json, sys, torch
from scout_slurm.bootstrap import signing
torch.manual_seed(11)
g = torch.Generator().manual_seed(3)
ts = {"step": torch.tensor(5.0), "t": torch.randn(6, 4, generator=g).t(),
      "bf16": torch.randn(9, generator=g).bfloat16(),
      "bool": torch.randn(5, generator=g) > 0, "slice": torch.arange(40).reshape(5, 8)[1:, ::3]}
print(json.dumps({"numpy": "numpy" in sys.modules, "hash": signing.HASH_NAME,
                  "each": {k: signing.tensor_signature(t) for k, t in ts.items()},
                  "state": signing.state_signature(ts.items()),
                  "rng": signing.bytes_sig([signing.byte_view(torch.get_rng_state())])}))
"""


@pytest.mark.timeout(60)
def test_signatures_without_numpy_equal_those_made_through_numpy(tmp_path, monkeypatch):
    """The same state signs the same with and without numpy (the stdlib hasher on both sides): a
    checkpoint recorded by one environment is checked by the other without a false mismatch."""
    pytest.importorskip("numpy", reason="this interpreter has no numpy to compare with")
    out = subprocess.run(
        [str(_bare_python()), "-c", _SIGN], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    bare = json.loads(out.stdout.strip().splitlines()[-1])
    assert (bare["numpy"], bare["hash"]) == (False, "blake2b-64")

    import torch

    from scout_slurm.bootstrap import signing

    monkeypatch.setattr(signing, "new_hasher", signing._Blake2b64)

    def numpy_sig(t, h=None):  # the signature as scout made it before signing.py: over numpy's view
        own, h = h is None, h or signing._Blake2b64()
        x = t.contiguous()
        h.update(f"{x.dtype}|{tuple(x.shape)}|".encode())
        if x.numel():
            h.update(memoryview(x.reshape(-1).view(torch.uint8).numpy()))
        return h.intdigest() if own else 0

    g = torch.Generator().manual_seed(3)
    ts = {
        "step": torch.tensor(5.0),
        "t": torch.randn(6, 4, generator=g).t(),
        "bf16": torch.randn(9, generator=g).bfloat16(),
        "bool": torch.randn(5, generator=g) > 0,
        "slice": torch.arange(40).reshape(5, 8)[1:, ::3],
    }
    assert bare["each"] == {k: numpy_sig(t) for k, t in ts.items()}
    h = signing._Blake2b64()
    for name, t in ts.items():
        h.update(name.encode() + b"\0")
        numpy_sig(t, h)
    assert bare["state"] == h.intdigest()
    torch.manual_seed(11)  # the subprocess's default generator, as it seeded it
    assert bare["rng"] == signing.bytes_sig([torch.get_rng_state().numpy().tobytes()])
