"""In-situ replay and replica discovery in real multi-rank jobs of the frameworks users train with
(CPU, gloo, no Slurm): layers that take keyword arguments and return tuples or dataclasses,
Megatron-Core's parallel layers (`(output, bias)`), a DeepSpeed ZeRO engine. The frameworks are an
optional extra (`.[frameworks]`, `.[titan]`): without one, its tests skip, saying so."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the bootstrap tests' helpers to run ranks
from test_bootstrap import JOBS, run_ranks, scout_env

pytestmark = [pytest.mark.torch]


def _needs(module: str, extra: str = "frameworks") -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        importlib.util.find_spec(module.split(".")[0]) is None,
        reason=f"{module} is not installed (pip install -e '.[{extra}]')",
    )


def _run(
    tmp_path: Path,
    job: str,
    world: int,
    *,
    steps: int = 12,
    extra: tuple[str, ...] = (),
    **scout: str,
):
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    env = scout_env(
        run_dir,
        SCOUT_RUN_DIR=str(run_dir),
        SCOUT_CONSENSUS_EVERY="5",
        SCOUT_REPLAY_EVERY="2",
        **scout,
    )
    runs = run_ranks(
        [str(JOBS / job), "--steps", str(steps), "--step-sleep", "0", "--timeout", "60", *extra],
        env,
        cwd=run_dir,
        world=world,
        deadline_s=240,
    )
    return run_dir, runs


def _coverage(run_dir: Path) -> dict:
    return json.loads((run_dir / "votes.json").read_text())


def _sdc_compute(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "findings").glob("sdc-compute-rank-*.json"))


@pytest.mark.timeout(200)
def test_tuple_dataclass_and_keyword_layers_are_replayed(tmp_path):
    run_dir, runs = _run(tmp_path, "train_structured.py", 3)
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
        assert "could not recompute" not in r.stderr and "skipped" not in r.stderr, r.stderr[-3000:]
    assert "over layers ['gate', 'head']" in runs[0].stderr
    cov = _coverage(run_dir)
    assert cov["replay_rounds"] == 6 and cov["replay_failed_rounds"] == 0, cov
    assert _sdc_compute(run_dir) == []


@pytest.mark.timeout(200)
def test_corrupt_tuple_output_is_named_by_replay(tmp_path):
    run_dir, runs = _run(
        tmp_path,
        "train_structured.py",
        3,
        SCOUT_INJECT="scale,factor=1.5,rank=1,step=3,every=1,target=activations,layer=gate",
    )
    assert [r.returncode for r in runs][1] == 88, runs[1].stderr[-3000:]
    assert "recomputation of layer 'gate' differs" in runs[1].stderr
    assert _sdc_compute(run_dir) and all(
        n.startswith("sdc-compute-rank-1-") for n in _sdc_compute(run_dir)
    )


@_needs("megatron.core")
@pytest.mark.timeout(240)
def test_megatron_parallel_layers_replay_finds_planted_activation_corruption(tmp_path):
    run_dir, runs = _run(
        tmp_path,
        "train_megatron.py",
        3,
        SCOUT_INJECT="scale,factor=1.5,rank=1,step=3,every=1,target=activations,layer=fc1",
    )
    assert "Megatron-Core parallel_state tp=1 pp=1 cp=1 dp=3" in runs[0].stderr, runs[0].stderr[
        -3000:
    ]
    assert "over layers ['fc1', 'fc2']" in runs[0].stderr
    assert runs[1].returncode == 88, runs[1].stderr[-3000:]
    assert all("could not recompute" not in r.stderr for r in runs)
    assert _sdc_compute(run_dir) and all(
        n.startswith("sdc-compute-rank-1-") for n in _sdc_compute(run_dir)
    )


@_needs("deepspeed")
@pytest.mark.timeout(240)
@pytest.mark.parametrize("zero", [1, 2])
def test_deepspeed_zero_engine_is_found_and_votes_its_weights(tmp_path, zero):
    run_dir, runs = _run(tmp_path, "train_deepspeed.py", 2, extra=("--zero", str(zero)))
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    banner = next(
        line for line in runs[0].stderr.splitlines() if line.startswith("scout: framework: ")
    )
    assert f"DeepSpeed engine, ZeRO-{zero}" in banner and "replica groups [[0, 1]]" in banner, (
        banner
    )
    assert f"optimizer state not voted: DeepSpeed ZeRO-{zero} partitions it" in banner, banner
    cov = _coverage(run_dir)
    assert (
        cov["votes"] >= 2 and cov["last_clean_step"] == 12 and cov["replay_failed_rounds"] == 0
    ), cov


@_needs("torchtitan", "titan")
@pytest.mark.timeout(240)
def test_torchtitan_debug_model_fsdp2_and_mesh_discovery_on_cpu(tmp_path):
    """TorchTitan's debug Llama-3 built, its ParallelDims mesh (dp_replicate x dp_shard = 2 x 2),
    FSDP2 over it, and scout's replica groups read from the mesh by dimension name."""
    from test_bootstrap import bare_env

    env = dict(bare_env(), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    runs = run_ranks(
        [str(JOBS / "titan_mesh.py")], env, cwd=tmp_path / "titan", world=4, deadline_s=200
    )
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
        said = json.loads(
            next(line for line in r.stdout.splitlines() if line.startswith("TITAN "))[6:]
        )
        assert said["fsdp"] and said["mesh"] == ["dp_replicate", "dp_shard"], said
        assert said["groups"] == [[0, 2], [1, 3]], said
        assert "dimensions ('dp_replicate', 'dp_shard')" in said["how"], said


@pytest.mark.timeout(200)
def test_tied_embedding_layers_are_replayed_and_a_clean_run_names_nobody(tmp_path):
    """The output layer shares the embedding's weight (GPT-2's wte and lm_head): both are
    replayed; their training-time weight gradient, the sum of both uses, is not set against one
    layer's recomputation (it was, and said to differ 'by compiled or fused kernels')."""
    run_dir, runs = _run(tmp_path, "train_tied.py", 2)
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
        assert "compiled or fused" not in r.stderr and "could not recompute" not in r.stderr, (
            r.stderr[-3000:]
        )
    said = runs[0].stderr
    assert "over layers ['wte', 'mix', 'lm_head']" in said, said[-3000:]
    assert "tied weights (wte/lm_head): replayed" in said, said[-3000:]
    cov = _coverage(run_dir)
    assert cov["replay_rounds"] == 6 and cov["replay_failed_rounds"] == 0, cov
    assert _sdc_compute(run_dir) == []
