"""scout's own cost: the record the bootstrap writes, what `scout show` prints of it, and the words
a checkpoint exchange made after the save leaves in the record (the eligibility rule reads them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from scout_slurm.bootstrap.ckptstate import _at_step
from scout_slurm.evidence.records import ScoutCost
from scout_slurm.evidence.store import read_record, write_record
from scout_slurm.remediation.records import Agreement, CheckpointNote
from scout_slurm.report.show import render_cost


def _cost(
    rank: int, hooks_ms: float, wrapper_ms: float, steps: int = 100, wall_s: float = 20.0
) -> ScoutCost:
    return ScoutCost(
        rank=rank,
        restart=0,
        steps=steps,
        hooks_cpu_ns=int(hooks_ms * 1e6),
        wrapper_ns=int(wrapper_ms * 1e6),
        wrapper_calls=400,
        step_wall_ns=int(wall_s * 1e9),
    )


def test_cost_record_round_trips_and_states_per_step_and_share(tmp_path: Path):
    c = _cost(3, hooks_ms=150.0, wrapper_ms=50.0)
    write_record(tmp_path / "cost-3.json", c)
    back = read_record(tmp_path / "cost-3.json", ScoutCost)
    assert back == c
    assert back.per_step_ms == 2.0
    # 100 steps in the 20 s measured (200 ms a step): 2 ms of 200
    assert abs(back.share - 0.01) < 1e-12
    assert _cost(0, 1.0, 1.0, steps=0, wall_s=0).share is None


def test_show_prints_every_rank_or_the_spread_and_costliest():
    few = render_cost([_cost(1, 30.0, 10.0), _cost(0, 20.0, 10.0)])
    assert few[1].startswith("  rank 0: 0.300 ms a step = 0.15 % of its step time over 100 steps")
    assert few[2].startswith("  rank 1: 0.400 ms a step")
    many = render_cost([_cost(r, 10.0 + r, 0.0) for r in range(12)])
    assert many[1] == "  12 ranks: 0.100 to 0.210 ms a step, median 0.160; the costliest:"
    assert many[2].startswith("  rank 11: 0.210 ms") and len(many) == 5
    assert render_cost([], ["cost-2.json: not JSON"])[0].startswith("scout's own cost: no record")
    # scout's Python on gloo's threads: said with the rank it happened on, and only there
    off = render_cost(
        [dataclasses.replace(_cost(0, 20.0, 10.0), comm_thread_calls=3), _cost(1, 20.0, 10.0)]
    )
    assert off[1].endswith(
        "for 400 collectives; scout ran 3 times on the communication library's threads)"
    )
    assert off[2].endswith("for 400 collectives)")


def _kind(text: str) -> Agreement:
    note = CheckpointNote(
        path="/c",
        step=5,
        rank=0,
        restart=0,
        saved_at=0.0,
        size_bytes=1,
        sha256="0" * 64,
        versions="",
        agreement=text,
    )
    return note.agreement_kind


def test_an_exchange_after_the_save_keeps_the_eligibility_rule_meaning():
    # at the save's own step: the words as before
    assert (
        _at_step("agreed", 5, -1) == "agreed"
        and _kind(_at_step("disagreed: model", 5, -1)) is Agreement.DISAGREED
    )
    # later: replicas agreeing at a step >= the save's make it eligible, as a clean vote there would
    later = _at_step("agreed", 5, 9)
    assert (
        later == "agreed at step 9, the first exchange after the save at step 5"
        and _kind(later) is Agreement.AGREED
    )
    # a later disagreement may have begun after the save: not the save's (the vote's verdict
    # decides)
    differ = _at_step("disagreed: model differs on rank 1", 5, 9)
    assert _kind(differ) is Agreement.NOT_EXCHANGED and "model differs on rank 1" in differ


def test_the_read_model_loads_every_ranks_cost_and_names_an_unreadable_one(tmp_path: Path):
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.report.views import load_cost

    folder = JobFolder(tmp_path / "evidence", "lab", 7)
    assert load_cost(folder, 0) == ((), ())  # no ranks folder yet: nothing, no error
    folder.ranks_dir(0).mkdir(parents=True)
    for r in (0, 1):
        write_record(folder.rank_cost_path(0, r), _cost(r, 10.0, 5.0))
    folder.rank_cost_path(0, 2).write_text("{not json")
    costs, problems = load_cost(folder, 0)
    assert [c.rank for c in costs] == [0, 1] and len(problems) == 1 and "cost-2.json" in problems[0]
    text = render_cost(list(costs), list(problems))
    assert text[1].startswith("  rank 0: 0.150 ms a step") and text[-1].startswith("  unreadable: ")
