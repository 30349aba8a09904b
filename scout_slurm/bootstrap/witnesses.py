"""scout's in-job witnesses behind one protocol: each says at which steps it works and does its
part before and after an optimizer step. The runtime (bootstrap.runtime) holds them in an ordered
list and calls each inside the guard under its name; what each does lives in its own module
(consensus, atrest, update, replay, finite, timing). Imports nothing of torch itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Witness(Protocol):
    """One check of scout's inside the training process. `step` is the optimizer step about to be
    computed (before) or just completed (after), this run's count from 1. `works_*` says whether
    the call does scout's own work at that step (the timing votes pause their clock around it).
    `sees_faults`: its end-of-step part runs after an injected fault fires (it must see what the
    fault did); the others run before (the state exactly as the optimizer left it)."""

    name: str
    sees_faults: bool

    def works_before(self, step: int) -> bool: ...
    def before_step(self, step: int, optimizer: Any) -> None: ...
    def works_after(self, step: int) -> bool: ...
    def after_step(self, step: int, optimizer: Any) -> None: ...


class _Quiet:
    """Defaults: no work on either side of a step."""

    name = ""
    sees_faults = False

    def works_before(self, step: int) -> bool:
        return False

    def before_step(self, step: int, optimizer: Any) -> None:
        return None

    def works_after(self, step: int) -> bool:
        return False

    def after_step(self, step: int, optimizer: Any) -> None:
        return None


def _every(every: int, step: int) -> bool:
    return every > 0 and step % every == 0


class AtRestWitness(_Quiet):
    """Seals each rank's own state after a step in K and re-signs it before the next one."""

    name = "at-rest witness"

    def __init__(self, atrest: Any, side_ops: Callable[[], tuple[Any, Any]]) -> None:
        self.atrest, self.side_ops = atrest, side_ops

    def works_before(self, step: int) -> bool:
        return self.atrest.sealed is not None

    def before_step(self, step: int, optimizer: Any) -> None:
        if self.atrest.sealed is not None:
            self.atrest.check(step, optimizer, *self.side_ops())

    def works_after(self, step: int) -> bool:
        return _every(self.atrest.every, step)

    def after_step(self, step: int, optimizer: Any) -> None:
        if _every(
            self.atrest.every, step
        ):  # first after the step: the state as the optimizer left it
            self.atrest.seal(step, optimizer)


class UpdateWitness(_Quiet):
    """One rank's update of a slice of its state, recomputed by every rank."""

    name = "update replay"

    def __init__(self, update: Any) -> None:
        self.update = update

    def works_before(self, step: int) -> bool:
        return _every(self.update.every, step)

    def before_step(self, step: int, optimizer: Any) -> None:
        if _every(self.update.every, step):
            self.update.before_step(step, optimizer)  # a slice of the update's inputs

    def works_after(self, step: int) -> bool:
        return _every(self.update.every, step)

    def after_step(self, step: int, optimizer: Any) -> None:
        if _every(self.update.every, step):
            self.update.after_step(step, optimizer)


class ReplayWitness(_Quiet):
    """In-situ replay: before the step, while the weights are those this step's forward used."""

    name = "in-situ replay"

    def __init__(self, replay: Any) -> None:
        self.replay = replay

    def works_before(self, step: int) -> bool:
        return self.replay.due(step)

    def before_step(self, step: int, optimizer: Any) -> None:
        if (
            step >= self.replay.next_call
        ):  # only at the steps where it has work (the replay says which)
            self.replay.before_step(step)


class FiniteWitness(_Quiet):
    """Where this rank's loss first became NaN/Inf (kept unread until the next vote)."""

    name = "non-finite watch"
    sees_faults = True

    def __init__(self, finite: Any) -> None:
        self.finite = finite

    def after_step(self, step: int, optimizer: Any) -> None:
        self.finite.after_step(step)


class StateVoteWitness(_Quiet):
    """The replicas' signatures of weights and optimizer state, compared by strict majority."""

    name = "state vote"
    sees_faults = True

    def __init__(self, consensus: Any, side_ops: Callable[[], tuple[Any, Any]]) -> None:
        self.consensus, self.side_ops = consensus, side_ops

    def works_after(self, step: int) -> bool:
        # on the job's global step: a rerun from step 20 votes at 50 as the first run would have
        return _every(self.consensus.every, step + self.consensus.offset)

    def after_step(self, step: int, optimizer: Any) -> None:
        self.consensus.maybe_vote(step, optimizer, *self.side_ops())


class TimingWitness(_Quiet):
    """Step timing voted among ranks (stragglers); last, after every other witness's work."""

    name = "timing votes"
    sees_faults = True

    def __init__(self, timing: Any) -> None:
        self.timing = timing

    def works_after(self, step: int) -> bool:
        return self.timing.due(step)

    def after_step(self, step: int, optimizer: Any) -> None:
        self.timing.after_step(step)


class CheckpointWitness(_Quiet):
    """Before each step: a checkpoint saved since the last one is exchanged among the replicas
    (their signatures at the save agree or not: bootstrap.ckptstate). Last before a step."""

    name = "checkpoint watch"

    def __init__(self, watch: Any) -> None:
        self.watch = watch

    def before_step(self, step: int, optimizer: Any) -> None:
        self.watch.before_step(optimizer)
