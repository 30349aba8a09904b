"""The timing votes' link probe in a real gloo job (CPU, no Slurm): ranks of one node do not probe
each other, every pair across nodes is measured by one of its two ends, and the ranks' schedules
meet (no rank left waiting for a peer busy elsewhere)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_bootstrap import JOBS, bare_env, run_ranks

pytestmark = [pytest.mark.torch]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nodes", ["a,a,b,b", "a,b,a,c,b"])
def test_the_probe_measures_each_pair_across_nodes_and_none_within_one(tmp_path, nodes):
    names = nodes.split(",")
    world = len(names)
    runs = run_ranks(
        [str(JOBS / "link_probe.py"), "--nodes", nodes],
        bare_env(),
        cwd=tmp_path,
        world=world,
        deadline_s=90,
    )
    assert [r.returncode for r in runs] == [0] * world, [r.stderr[-2000:] for r in runs]
    got = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
    assert all(g["nodes"] == names for g in got)
    for kind in ("small", "medium"):
        for a in range(world):
            for b in range(world):
                there, back = got[a][kind][b], got[b][kind][a]
                if a == b or names[a] == names[b]:
                    assert there == back == -1.0, (kind, a, b, there, back)
                else:  # measured once, by the end that started the round trip
                    assert (there > 0) != (back > 0) and max(there, back) < 5.0, (
                        kind,
                        a,
                        b,
                        there,
                        back,
                    )
