"""State votes inside the training process: every K optimizer steps, the replicas that must hold
identical state (DDP: every rank of the module's process group) sign their parameters and
optimizer state, exchange the signatures on scout's own gloo side group (never the training
communicators), and a strict majority names the outlier. Imports only the standard library,
torch and scout's signing (xxhash if present)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from scout_slurm.bootstrap.exitpolicy import Ending, end, ends

# the signing helpers live in signing.py (one copy for every bootstrap module); imported here for
# the votes and for callers that import them from consensus
from scout_slurm.bootstrap.signing import optimizer_tensors, state_signature, tensor_signature  # noqa: F401
from scout_slurm.evidence.records import VoteOutcome


def vote(values: list[int]) -> tuple[int | None, list[int]]:
    """Strict majority (pure): (the majority value, ranks that differ) or (None, []) when no
    value is held by more than half."""
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    best, n = max(counts.items(), key=lambda kv: kv[1])
    if n * 2 <= len(values):
        return None, []
    return best, [r for r, v in enumerate(values) if v != best]


class Consensus:
    def __init__(
        self,
        *,
        every: int,
        rank: int,
        world: int,
        run_dir: Path | None,
        node: str,
        offset: int = 0,
        restart: int = 0,
        sdc_policy: str = "exit",
    ) -> None:
        import torch.distributed as dist

        self.every = every
        self.rank, self.world = rank, world
        self.run_dir, self.node = run_dir, node
        self.side = dist.new_group(
            backend="gloo"
        )  # scout's votes never use the training communicators
        self.modules: list[Any] = []
        self.votes = 0
        self.offset, self.restart = offset, restart
        self.sdc_policy = (
            sdc_policy  # SCOUT_SDC_POLICY: "exit" ends an outvoted rank (bootstrap.exitpolicy)
        )
        self.last_clean = -1
        self.groups: list[tuple[int, ...]] | None = None  # replica groups, found at the first vote
        self.optimizer_skipped = (
            ""  # why the optimizer state is not voted ("": it is; e.g. ZeRO-1/2)
        )
        self.first_nonfinite: Any = (
            None  # a callable giving this rank's first non-finite step (bootstrap.finite)
        )
        self.nonfinite_said = False  # where non-finite numbers began is decided once per run
        self.last_vote_step = -1
        self.steps = 0  # the last optimizer step seen (this run's count)
        self.optimizer: Any = None  # the optimizer last seen (held until destroy_process_group)
        self.on_vote: Any = None  # called after every vote (bootstrap.patches writes the coverage)
        # (step, optimizer) -> (weights, optimizer state) signatures already made of this step's
        # state
        # exactly as the vote would make them (the at-rest seal), or None
        self.presigned: Any = None

    def voted_parameters(self) -> list[tuple[str, Any]]:
        """The parameters the vote signs, named as it names them."""
        from scout_slurm.bootstrap.frameworks import inner

        return [
            (f"m{mi}.{n}", p)
            for mi, m in enumerate(self.modules)
            for n, p in inner(m).named_parameters()
        ]

    def track(self, module: Any) -> None:
        if all(m is not module for m in self.modules):
            self.modules.append(module)

    def maybe_vote(
        self, step: int, optimizer: Any, original_all_gather: Any, original_barrier: Any
    ) -> None:
        if self.every <= 0 or not self.modules:
            return
        self.optimizer = (
            optimizer  # for the end-of-training vote (released at destroy_process_group)
        )
        self.steps = step
        if (step + self.offset) % self.every != 0:  # the global step's schedule (a rerun's too)
            return
        self._vote(step, optimizer, original_all_gather, original_barrier)

    def final_vote(
        self, original_all_gather: Any, original_barrier: Any, *, timeout_s: float
    ) -> str:
        """The end-of-training vote (destroy_process_group, every rank): the replicas' state once
        more unless the last vote was at the last step. Every rank must arrive within `timeout_s`;
        else no vote (said). Returns what it did, in words."""
        opt = self.optimizer
        if self.every <= 0 or not self.modules or opt is None or self.steps <= 0:
            return "not made: no model or optimizer step seen"
        if self.votes and self.last_vote_step == self.steps + self.offset:
            return f"not needed: the last vote was at the last step ({self.last_vote_step})"
        try:
            self._vote(self.steps, opt, original_all_gather, original_barrier, timeout_s=timeout_s)
        except RuntimeError as exc:  # a rank did not arrive in time, or a peer is gone
            return f"not made: not every rank arrived within {timeout_s:g} s ({str(exc)[:120]})"
        if not any(len(g) >= 2 for g in self.groups or ()):
            return (
                f"at step {self.last_vote_step}: no replicas to compare (every rank holds a state "
                "of its own)"
            )
        return f"at step {self.last_vote_step}: " + (
            "every replica agreed"
            if self.last_clean == self.last_vote_step
            else "replicas disagreed (see the findings)"
        )

    def _vote(
        self,
        step: int,
        optimizer: Any,
        original_all_gather: Any,
        original_barrier: Any,
        *,
        timeout_s: float | None = None,
    ) -> None:
        import torch

        t0 = time.perf_counter()
        from scout_slurm.bootstrap.frameworks import replica_layout
        from scout_slurm.bootstrap.replicas import vote_groups

        if (
            self.groups is None
        ):  # the start banner (bootstrap.patches) set them when it saw the models
            from scout_slurm.bootstrap.frameworks import optimizer_not_voted

            self.groups, how = replica_layout(self.modules, self.world)
            self.optimizer_skipped = optimizer_not_voted(self.modules)
            if self.rank == 0:
                sys.stderr.write(f"scout: state votes every {self.every} steps: {how}\n")
        # the at-rest witness's seal of this very step signed the same tensors under the same names
        # (when nothing touched them since: the fault injector fires in between): not signed twice
        pre = (
            self.presigned(step, optimizer)
            if self.presigned is not None and timeout_s is None
            else None
        )
        if pre is not None:
            sig_w, sig_o = pre[0], 0 if self.optimizer_skipped else pre[1]
        else:
            sig_w = state_signature(self.voted_parameters())
            sig_o = 0 if self.optimizer_skipped else state_signature(optimizer_tensors(optimizer))
        from scout_slurm.bootstrap.finite import NONE, first_nonfinite

        first_bad = self.first_nonfinite() if self.first_nonfinite is not None else NONE
        mine = torch.tensor(
            [sig_w & 0x7FFFFFFFFFFFFFFF, sig_o & 0x7FFFFFFFFFFFFFFF, first_bad], dtype=torch.int64
        )
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        if timeout_s is None:
            original_all_gather(gathered, mine, group=self.side)
        else:
            import datetime

            original_all_gather(gathered, mine, group=self.side, async_op=True).wait(
                timeout=datetime.timedelta(seconds=timeout_s)
            )
        self.votes += 1
        weights = [int(g[0]) for g in gathered]
        opt = [int(g[1]) for g in gathered]
        findings = []
        for what, values in (("weights", weights), ("optimizer state", opt)):
            for gv in vote_groups(
                what, self.groups, values
            ):  # a group of one has nobody to compare with
                if gv.outcome is VoteOutcome.INCONCLUSIVE:
                    findings.append(("inconclusive", what, [], values, gv.group))
                elif gv.outcome is VoteOutcome.SDC:
                    findings.append(("sdc", what, list(gv.outliers), values, gv.group))
        nonfinite = None
        if not self.nonfinite_said:
            nonfinite = first_nonfinite([int(g[2]) for g in gathered])
            if nonfinite.outcome is VoteOutcome.NONE:
                nonfinite = None
            else:
                self.nonfinite_said = True
        dt = time.perf_counter() - t0
        gstep = step + self.offset  # counted from the start of training, across restarts
        self.last_vote_step = gstep
        if not findings and any(
            len(g) >= 2 for g in self.groups
        ):  # pure FSDP compares no state: never "clean"
            self.last_clean = gstep
        if self.on_vote is not None:
            self.on_vote()  # the run's coverage record (the lowest rank writes it)
        if not findings and nonfinite is None:
            return
        confirmed = sorted(
            {r for kind, _, rs, _, _ in findings if kind == "sdc" for r in rs}
            | set(nonfinite.ranks if nonfinite and nonfinite.outcome is VoteOutcome.NAMED else ())
        )
        majority_writer = min((r for r in range(self.world) if r not in confirmed), default=0)
        if self.rank == majority_writer:
            for kind, what, outliers, values, group in findings:
                self._write(kind, what, outliers, values, gstep, dt, group)
            if nonfinite is not None:
                self._write_nonfinite(nonfinite, [int(g[2]) for g in gathered])
        # the finding is on disk before the outlier leaves: the Epilogs act on it
        original_barrier(group=self.side)
        if self.rank in confirmed and ends(Ending.SDC, self.sdc_policy):
            why = (
                f"rank {self.rank}'s loss became non-finite first, at step {nonfinite.step}"
                if nonfinite is not None
                and self.rank in nonfinite.ranks
                and nonfinite.outcome is VoteOutcome.NAMED
                else f"rank {self.rank}'s state differs from the replicas' majority at step {step}"
            )
            end(Ending.SDC, f"{why}; ending this rank (exit {Ending.SDC.code})")

    def _write_nonfinite(self, v: Any, first_steps: list[int]) -> None:
        if self.run_dir is None:
            return
        from scout_slurm.bootstrap.evidencewrites import write_record
        from scout_slurm.evidence.layout import RunFolder
        from scout_slurm.evidence.records import Finding, FindingKind

        now = time.time()
        per_rank = ", ".join(
            f"rank {r}: {'finite' if s < 0 else f'step {s}'}" for r, s in enumerate(first_steps)
        )
        details = (v.explanation, f"first non-finite loss per rank: {per_rank}")
        if v.outcome is VoteOutcome.NAMED:
            records = [
                (
                    f"sdc-nonfinite-rank-{r}-step-{v.step}",
                    Finding(
                        rank=r,
                        node=self.node if r == self.rank else "",
                        kind=FindingKind.SDC,
                        at=now,
                        summary=(
                            f"rank {r}'s loss became non-finite at step {v.step}, before any "
                            "other rank's: the NaN/Inf "
                            "began in its compute (corrupt compute, or a non-finite input "
                            "batch on that rank)"
                        ),
                        details=details,
                        step=v.step,
                        since_step=v.step,
                        component="compute",
                    ),
                )
                for r in v.ranks
            ]
        else:
            records = [
                (
                    f"inconclusive-nonfinite-step-{v.step}",
                    Finding(
                        rank=0,
                        node="",
                        kind=FindingKind.NO_MAJORITY,
                        at=now,
                        summary=f"non-finite loss at step {v.step}: inconclusive: {v.explanation}",
                        details=details,
                        step=v.step,
                        since_step=v.step,
                        component="compute",
                    ),
                )
            ]
        for name, finding in records:
            try:
                write_record(RunFolder(self.run_dir).finding_path(name), finding)
            except Exception as exc:
                sys.stderr.write(f"scout: finding not written: {exc!r}\n")

    def _write(
        self,
        kind: str,
        what: str,
        outliers: list[int],
        values: list[int],
        step: int,
        dt: float,
        group: tuple[int, ...] = (),
    ) -> None:
        if self.run_dir is None:
            return
        from scout_slurm.bootstrap.evidencewrites import write_record
        from scout_slurm.evidence.layout import RunFolder
        from scout_slurm.evidence.records import Finding, FindingKind

        now = time.time()
        group = group or tuple(range(self.world))
        per_rank = ", ".join(f"rank {r}: {values[r]:016x}" for r in group)
        for r in outliers or [-1]:
            summary = (
                f"rank {r}'s {what} signature differs from the majority of {len(group)} "
                f"replicas at step {step}"
                if kind == "sdc"
                else f"no strict majority among {len(group)} replicas (ranks "
                f"{', '.join(map(str, group))}) for "
                f"{what} at step {step}: inconclusive"
            )
            since = (self.last_clean + 1) if self.last_clean >= 0 else self.offset + 1
            finding = Finding(
                rank=r if r >= 0 else 0,
                node=self.node if r == self.rank else "",
                kind=FindingKind.SDC if kind == "sdc" else FindingKind.NO_MAJORITY,
                at=now,
                summary=summary,
                details=(
                    per_rank,
                    f"vote took {dt * 1000:.1f} ms",
                    f"last clean vote at step {self.last_clean}",
                ),
                step=step,
                since_step=since,
                component=what.split()[0],
            )
            name = f"{kind}-{what.split()[0]}-rank-{r}-step-{step}" + (
                f"-group-{group[0]}" if r < 0 else ""
            )
            try:
                write_record(RunFolder(self.run_dir).finding_path(name), finding)
            except Exception as exc:
                sys.stderr.write(f"scout: finding not written: {exc!r}\n")
