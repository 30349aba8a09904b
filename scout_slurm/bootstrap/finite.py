"""Where non-finite numbers began. A NaN or Inf made by one rank's compute (an activation the
hardware got wrong, or a bad input batch) reaches every replica through the next gradient
reduction, and from the following step on every rank's loss is NaN and every replica's state
agrees again: state votes see nothing, and replay only sees it if it happens to replay that very
layer at that very step. But at the step it began, only the rank that made it has a non-finite
loss: its peers computed theirs from finite weights and their own data.

So every rank notes, per optimizer step, whether the tensors it ran backward from were finite
(a check on a scalar, no copy), and the state vote exchanges each rank's first non-finite step.
The rank(s) with the earliest one, if they are a strict minority of the world, are named; if
every rank went non-finite at the same step (the training diverged) nobody is.

The decision (`first_nonfinite`) is pure. `FiniteWatch` runs in the job's Python and imports
torch lazily. On a GPU the flags are read once per vote (K small device-to-host reads at once),
not once per step.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scout_slurm.evidence.records import VoteOutcome

NONE = -1  # "this rank has seen no non-finite loss" in the exchanged vector
_MAX_CHECKED = 4096  # backward roots larger than this (not a loss) are not checked: cost


@dataclass(frozen=True)
class NonfiniteVote:
    outcome: VoteOutcome  # NONE, NAMED or INCONCLUSIVE
    step: int = NONE  # the earliest step at which any rank's loss was non-finite
    ranks: tuple[int, ...] = ()  # the ranks non-finite at that step
    explanation: str = ""


def first_nonfinite(first_steps: list[int]) -> NonfiniteVote:
    """Each rank's first non-finite step (NONE: none yet), in rank order (pure)."""
    bad = [s for s in first_steps if s != NONE]
    if not bad:
        return NonfiniteVote(VoteOutcome.NONE)
    step = min(bad)
    ranks = tuple(r for r, s in enumerate(first_steps) if s == step)
    world = len(first_steps)
    if 2 * len(ranks) < world:
        return NonfiniteVote(
            VoteOutcome.NAMED,
            step,
            ranks,
            f"at step {step} the loss was non-finite on rank(s) {list(ranks)} only; the other "
            f"{world - len(ranks)} rank(s) were finite then",
        )
    if len(ranks) == world:
        why = (
            f"every rank's loss became non-finite at the same step {step}: the training "
            "itself diverged (or "
            "corrupted state was already shared); no rank is named"
        )
    else:
        why = (
            f"{len(ranks)} of {world} ranks went non-finite at the same step {step} (not a "
            "strict minority): "
            f"ranks {list(ranks)}; no rank is named"
        )
    return NonfiniteVote(VoteOutcome.INCONCLUSIVE, step, ranks, why)


class FiniteWatch:
    """Notes, per optimizer step, whether this rank's backward roots (its losses) were finite."""

    def __init__(self, *, offset: int = 0, on_first: Callable[[int], None] | None = None) -> None:
        self.offset = offset
        self.on_first = on_first  # called once, with the global step, when this rank first sees one
        self.first_bad = NONE
        self._acc: Any = None  # this step's flags, and-ed (a bool tensor where the loss lives)
        self._steps: list[tuple[int, Any]] = []
        self._original: Any = None

    def install(self, handle: Any, guard: Any) -> None:
        """Note every backward's roots, inside `guard` (bootstrap.guard: a failure switches the
        watch off and never reaches the job's backward)."""
        import torch.autograd

        original = torch.autograd.backward
        self._original = original

        @functools.wraps(original)
        def scout_backward(tensors, *args, **kwargs):
            if guard.on("non-finite watch") and not torch.compiler.is_compiling():
                guard.run("non-finite watch", self._note, tensors)
            return original(tensors, *args, **kwargs)

        handle.patch(torch.autograd, "backward", scout_backward)

    def _note(self, tensors: Any) -> None:
        import torch

        roots = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors or ())
        for t in roots:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() <= _MAX_CHECKED:
                if (
                    t.numel() == 1 and t.device.type == "cpu"
                ):  # a CPU loss: read at once, no tensor op
                    ok: Any = math.isfinite(t.item())
                # kept as a tensor where it lives: read once per vote (no sync per step on a GPU)
                else:
                    ok = torch.isfinite(t.detach()).all()
                self._acc = ok if self._acc is None else (self._acc & ok)

    def after_step(self, step: int) -> None:
        """At the end of optimizer step `step` (this run's count); keeps the flag unread."""
        if self._acc is not None:
            if self.first_bad == NONE:
                self._steps.append((step + self.offset, self._acc))
            self._acc = None
        if len(self._steps) >= 64:  # bounded even when nothing votes
            self.resolve()

    def resolve(self) -> int:
        """Read the kept flags (one sync for all of them); the first non-finite global step, or
        NONE.
        """
        kept, self._steps = self._steps, []
        if self.first_bad == NONE:
            for gstep, flag in kept:
                if not bool(flag):
                    self.first_bad = gstep
                    if self.on_first is not None:
                        try:
                            self.on_first(gstep)
                        except Exception as exc:
                            sys.stderr.write(f"scout: non-finite note not written: {exc!r}\n")
                    break
        return self.first_bad
