"""The per-step non-finite check inside the job (bootstrap.finite.FiniteWatch) on real tensors: each
backward's roots are checked, the flags read at the vote, and the first non-finite step is the
one whose loss was NaN or Inf, under gradient accumulation too."""

from __future__ import annotations

import pytest

from scout_slurm.bootstrap.finite import NONE, FiniteWatch

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch]


def _steps(watch: FiniteWatch, losses_per_step: list[list[float]]) -> int:
    for step, losses in enumerate(losses_per_step, start=1):
        for v in losses:
            watch._note(
                torch.tensor(v, requires_grad=True) * 1.0
            )  # as the patched backward sees its root
        watch.after_step(step)
    return watch.resolve()


def test_the_first_non_finite_step_is_found():
    assert _steps(FiniteWatch(), [[1.0], [2.0], [3.0]]) == NONE
    assert _steps(FiniteWatch(), [[1.0], [float("nan")], [float("nan")]]) == 2
    assert (
        _steps(FiniteWatch(offset=100), [[1.0], [float("inf")]]) == 102
    )  # counted across restarts


def test_gradient_accumulation_every_micro_batch_is_checked():
    many = [1.0] * 200  # many backward calls in one step
    assert _steps(FiniteWatch(), [[1.0], many[:-1] + [float("nan")]]) == 2
    assert _steps(FiniteWatch(), [[1.0], [float("nan")] + many]) == 2
    # tuples of roots, a multi-element root, a root too large to be a loss (not checked: cost)
    w = FiniteWatch()
    w._note((torch.ones(3), torch.tensor([1.0, float("nan")])))
    w.after_step(1)
    w._note(torch.full((10_000,), float("nan")))
    w.after_step(2)
    assert w.resolve() == 1
