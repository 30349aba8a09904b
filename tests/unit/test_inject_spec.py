"""Fault specifications: what parses, what is refused with a reason, and when a fault fires."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scout_slurm.errors import ConfigError
from scout_slurm.inject.spec import KINDS, PROCESS_FAULTS, FaultSpec, parse_fault


@pytest.mark.parametrize(
    "text,expected",
    [
        ("sleep,rank=1,step=5", FaultSpec("sleep", 1, 5)),
        ("stop", FaultSpec("stop", None, 1)),
        ("exit,rank=all,step=2,code=7", FaultSpec("exit", None, 2, code=7)),
        ("spin,rank=3,step=4,seconds=2.5", FaultSpec("spin", 3, 4, seconds=2.5)),
        ("sigkill,rank=0,step=3,restart=any", FaultSpec("sigkill", 0, 3, restart=None)),
        ("segv,rank=2,restart=1", FaultSpec("segv", 2, 1, restart=1)),
        (" skip_allreduce , rank = 1 , step = 9 ", FaultSpec("skip_allreduce", 1, 9)),
        ("raise,rank=1,step=5,", FaultSpec("raise", 1, 5)),
    ],
)
def test_parse(text, expected):
    assert parse_fault(text) == expected


def test_defaults():
    spec = parse_fault("sleep")
    assert (spec.rank, spec.step, spec.seconds, spec.code, spec.restart) == (None, 1, 3600.0, 3, 0)


@pytest.mark.parametrize("kind", PROCESS_FAULTS)
def test_every_process_fault_kind_parses(kind):
    assert parse_fault(f"{kind},rank=1,step=2").kind == kind


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "empty"),
        (" , ", "empty"),
        ("explode,rank=1", "unknown fault kind 'explode'; valid: sleep, spin"),
        ("rank=1,sleep", "unknown fault kind"),
        ("sleep,rank", "'rank' is not key=value"),
        (
            "sleep,when=3",
            r"unknown key\(s\) \['when'\]; valid: .*rank, restart, seconds, sigma, step",
        ),
        ("sleep,rank=one", "SCOUT_INJECT='sleep,rank=one'"),
        ("sleep,step=2.5", "invalid literal"),
        ("sleep,seconds=soon", "could not convert"),
        ("exit,code=x", "invalid literal"),
        ("sleep,restart=first", "invalid literal"),
        ("sleep,step=0", "step must be >= 1"),
        ("sleep,step=-3", "step must be >= 1"),
    ],
)
def test_bad_spec_is_refused_with_the_reason(text, reason):
    with pytest.raises(ConfigError, match=reason):
        parse_fault(text)


def test_applies_to_one_rank_at_one_step_of_the_first_run():
    spec = parse_fault("sleep,rank=1,step=5")
    assert spec.applies(rank=1, step=5, restart=0)
    assert not spec.applies(rank=0, step=5, restart=0)
    assert not spec.applies(rank=1, step=4, restart=0)
    assert not spec.applies(rank=1, step=6, restart=0)
    assert not spec.applies(rank=1, step=5, restart=1)  # the rerun after requeue is clean


def test_rank_all_applies_to_every_rank():
    spec = parse_fault("exit,rank=all,step=2")
    assert all(spec.applies(rank=r, step=2, restart=0) for r in range(16))


def test_restart_any_applies_to_every_run():
    spec = parse_fault("stop,rank=0,step=1,restart=any")
    assert all(spec.applies(rank=0, step=1, restart=n) for n in range(5))


def test_restart_n_applies_to_that_run_only():
    spec = parse_fault("stop,rank=0,step=1,restart=2")
    assert [n for n in range(5) if spec.applies(rank=0, step=1, restart=n)] == [2]


@given(
    kind=st.sampled_from(PROCESS_FAULTS),
    rank=st.one_of(st.none(), st.integers(0, 4096)),
    step=st.integers(1, 10**6),
    code=st.integers(0, 255),
    restart=st.one_of(st.none(), st.integers(0, 99)),
)
def test_written_spec_parses_back(kind, rank, step, code, restart):
    text = (
        f"{kind},rank={'all' if rank is None else rank},step={step},code={code},"
        f"restart={'any' if restart is None else restart}"
    )
    assert parse_fault(text) == FaultSpec(kind, rank, step, code=code, restart=restart)


@given(st.text(max_size=60))
def test_any_text_parses_or_is_refused_as_config_error(text):
    try:
        spec = parse_fault(text)
    except ConfigError:
        return
    assert spec.kind in KINDS and spec.step >= 1


def test_an_update_fault_takes_a_numerical_kind_and_is_not_a_layer_fault():
    f = parse_fault("bitflip,bit=12,rank=1,step=3,target=update,every=1,transient=1")
    assert (f.target, f.bit, f.rank, f.every, f.transient, f.is_compute) == (
        "update",
        12,
        1,
        1,
        True,
        False,
    )
    with pytest.raises(ConfigError, match="target update takes a numerical kind"):
        parse_fault("sleep,target=update")
