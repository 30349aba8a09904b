"""Timing faults in SCOUT_INJECT: `delay` recurs every step from S, `input_stall` fires once;
both need seconds.
"""

from __future__ import annotations

import pytest

from scout_slurm.errors import ConfigError
from scout_slurm.inject.spec import parse_fault


def test_delay_recurs_every_step_from_s():
    f = parse_fault("delay,rank=3,step=6,seconds=0.25")
    assert (f.kind, f.rank, f.seconds) == ("delay", 3, 0.25)
    assert [s for s in range(1, 12) if f.applies(3, s, 0)] == [6, 7, 8, 9, 10, 11]
    assert not f.applies(2, 7, 0)
    assert not f.applies(3, 7, 1)  # a rerun is clean


def test_delay_every_and_until_narrow_it():
    f = parse_fault("delay,rank=all,step=2,seconds=0.1,every=3,until=9")
    assert [s for s in range(1, 15) if f.applies(0, s, 0)] == [2, 5, 8]


def test_input_stall_fires_once():
    f = parse_fault("input_stall,rank=0,step=2,seconds=1.5")
    assert [s for s in range(1, 20) if f.applies(0, s, 0)] == [2]


@pytest.mark.parametrize(
    "text, word",
    [
        ("delay,rank=1,step=3", "seconds"),
        ("input_stall,rank=1", "seconds"),
        ("delay,seconds=-1", "0..3600"),
        ("delay,seconds=7200", "0..3600"),
    ],
)
def test_timing_faults_refuse_bad_specs(text, word):
    with pytest.raises(ConfigError, match=word):
        parse_fault(text)
