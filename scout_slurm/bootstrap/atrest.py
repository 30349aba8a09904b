"""The at-rest witness: a rank's own state, signed right after an optimizer step and signed again
right before the next one. Between the two nothing of the job's should change what the optimizer
holds (its parameters, which are the rank's own shard under FSDP2/ZeRO, and its state tensors):
forward and backward read them. A difference is memory corruption on that rank, named without
any replica, so it covers what no vote can: pure FSDP, ZeRO-3, the distributed optimizer.

One window every `every` steps (the vote period): it watches one step's forward and backward in
`every`, at the cost of two signatures of the rank's state per `every` steps (one of them the
state vote's own, when the vote signs the same tensors). Where every replica group has three or
more ranks and the votes sign everything the optimizer holds, a change at rest persists into the
next vote, which names the rank by majority: there, in mode auto, the witness stops after its
first window, decided in that window's exchange so that every rank stops together, and the vote
signs the state itself. Whether a job changes its weights between steps on purpose (weight
clipping, a rollback) is told by every rank seeing a change at once: then the witness says so
once and stops. Imports only the standard library and torch."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from scout_slurm.bootstrap.exitpolicy import Ending, end, ends


def own_state(optimizer: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """What the optimizer holds on this rank: (parameters, state tensors)."""
    from scout_slurm.bootstrap.signing import optimizer_tensors

    params = [
        (f"g{gi}.p{pi}", p)
        for gi, g in enumerate(optimizer.param_groups)
        for pi, p in enumerate(g["params"])
    ]
    return params, optimizer_tensors(optimizer)


def changed_ranks(changed: list[int]) -> tuple[list[int], bool]:
    """(ranks named, the job's own doing) from each rank's changed flag (pure): when every rank
    changed, it is the job's code, not a fault (corruption does not strike every rank at once)."""
    ranks = [r for r, c in enumerate(changed) if c]
    if len(changed) >= 2 and len(ranks) == len(changed):
        return [], True
    return (ranks if len(changed) >= 2 else []), False


class AtRest:
    def __init__(
        self,
        *,
        every: int,
        rank: int,
        world: int,
        side: Any,
        run_dir: Path | None,
        node: str,
        offset: int = 0,
        sdc_policy: str = "exit",
        voted: Any = None,
        mode: str = "on",
        covered: Any = None,
    ) -> None:
        self.every, self.rank, self.world, self.side = every, rank, world, side
        self.run_dir, self.node, self.offset, self.sdc_policy = run_dir, node, offset, sdc_policy
        # the state vote's parameters as it names them (Consensus.voted_parameters), or None
        self.voted = voted
        # auto: `covered()` says why the votes name any change at rest ("": they do not), then the
        # first window decides
        self.mode, self.covered = mode, covered
        self.decided = mode != "auto"
        # (step, id(optimizer), weights sig, state sig, signed as the vote signs, the weights
        # signed)
        self.sealed: tuple[int, int, int, int, bool, list[tuple[str, Any]]] | None = None
        self.checks = 0
        self.off = ""  # why the witness stopped ("": it runs)
        self.seconds = 0.0  # its own cost, for the evidence

    def _params(self, optimizer: Any) -> tuple[list[tuple[str, Any]], bool]:
        """What of the optimizer's the seal signs as weights, and whether it is the state vote's own
        list: when the optimizer holds exactly the voted parameters (a plain optimizer over the
        model; not DeepSpeed's flat master copies) they are signed under the vote's names, so the
        vote of the same step can take the signatures instead of signing the same bytes again."""
        params = own_state(optimizer)[0]
        voted = self.voted() if self.voted is not None else None
        if (
            voted
            and len(voted) == len(params)
            and all(a is b for (_, a), (_, b) in zip(voted, params))
        ):
            return voted, True
        return params, False

    def seal(self, step: int, optimizer: Any) -> None:
        """Right after optimizer step `step` (before anything else of scout's at that step)."""
        if self.off or self.every <= 0 or step % self.every != 0:
            return
        from scout_slurm.bootstrap.signing import optimizer_tensors, state_signature

        t0 = time.perf_counter()
        params, shared = self._params(optimizer)
        self.sealed = (
            step,
            id(optimizer),
            state_signature(params),
            state_signature(optimizer_tensors(optimizer)),
            shared,
            params,
        )
        self.seconds += time.perf_counter() - t0

    def signed_at(self, step: int, optimizer: Any) -> tuple[int, int] | None:
        """The seal of step `step` as the state vote signs (weights, state), if there is one."""
        sealed = self.sealed
        if sealed is None or sealed[0] != step or sealed[1] != id(optimizer) or not sealed[4]:
            return None
        return sealed[2], sealed[3]

    def check(
        self, step: int, optimizer: Any, original_all_gather: Any, original_barrier: Any
    ) -> None:
        """Right before optimizer step `step`: compare with the seal of step `step - 1`."""
        sealed = self.sealed
        if sealed is None or sealed[1] != id(optimizer):
            return
        self.sealed = None
        if sealed[0] != step - 1:  # a step went by unseen (another optimizer's count): no window
            return
        import torch

        t0 = time.perf_counter()
        from scout_slurm.bootstrap.signing import optimizer_tensors, state_signature

        w, s = (
            state_signature(sealed[5]),
            state_signature(optimizer_tensors(optimizer)),
        )  # signed as sealed
        covered = "" if self.decided or not sealed[4] or self.covered is None else self.covered()
        mine = torch.tensor(
            [int(w != sealed[2]), int(s != sealed[3]), int(not covered)], dtype=torch.int64
        )
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        original_all_gather(gathered, mine, group=self.side)
        self.checks += 1
        gstep = sealed[0] + self.offset
        named_w, job_w = changed_ranks([int(g[0]) for g in gathered])
        named_s, job_s = changed_ranks([int(g[1]) for g in gathered])
        if not self.decided:  # every rank sees the same flags: they stop together, or none does
            self.decided = True
            if not any(int(g[2]) for g in gathered):
                self.off = (
                    f"{covered}; SCOUT_AT_REST=on keeps it"  # after this window's findings, below
                )
        self.seconds += time.perf_counter() - t0
        if job_w or job_s:
            self.off = (
                f"every rank's {'weights' if job_w else 'optimizer state'} changed between "
                "optimizer steps "
                f"{gstep} and {gstep + 1}: the job's own code (e.g. weight clipping), not a fault"
            )
            if self.rank == 0:
                sys.stderr.write(f"scout: at-rest witness off: {self.off}\n")
            return
        named = sorted(set(named_w) | set(named_s))
        if not named:
            return
        if self.rank in named:
            what = [
                n
                for n, rs in (("weights", named_w), ("optimizer state", named_s))
                if self.rank in rs
            ]
            self._write(what, gstep)
        original_barrier(group=self.side)  # the finding is on disk before the rank leaves
        if self.rank in named and ends(Ending.SDC, self.sdc_policy):
            end(
                Ending.SDC,
                f"rank {self.rank}'s {' and '.join(what)} changed at rest after step {gstep}; "
                f"ending this rank (exit {Ending.SDC.code})",
            )

    def _write(self, what: list[str], gstep: int) -> None:
        sys.stderr.write(
            f"scout: rank {self.rank}'s {' and '.join(what)} changed at rest between "
            "optimizer steps "
            f"{gstep} and {gstep + 1}\n"
        )
        if self.run_dir is None:
            return
        from scout_slurm.bootstrap.evidencewrites import write_record
        from scout_slurm.evidence.layout import RunFolder
        from scout_slurm.evidence.records import Finding, FindingKind

        for w in what:
            finding = Finding(
                rank=self.rank,
                node=self.node,
                kind=FindingKind.SDC,
                at=time.time(),
                summary=(
                    f"rank {self.rank}'s {w} changed at rest: signed after optimizer step "
                    f"{gstep} and again "
                    f"before step {gstep + 1}, with no step in between (other ranks' "
                    "unchanged): memory "
                    "corruption on this rank, seen without any replica"
                ),
                details=("at-rest witness: the rank's own state against itself, not a vote",),
                # a checkpoint saved after step `gstep` may hold the change: it is not eligible
                step=gstep + 1,
                since_step=gstep,
                component=w.split()[0],
            )
            try:
                write_record(
                    RunFolder(self.run_dir).finding_path(
                        f"sdc-at-rest-{w.split()[0]}-rank-{self.rank}-step-{gstep}"
                    ),
                    finding,
                )
            except Exception as exc:
                sys.stderr.write(f"scout: finding not written: {exc!r}\n")
