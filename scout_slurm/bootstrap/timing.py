"""Timing votes inside the training process: every K optimizer steps each rank's compute and
collective time per step (from the progress writer) and a timed exchange with every peer (the link
probe) are gathered on scout's side group; `localise.straggler` decides, and confirmed stragglers go
to the evidence folder at once. `Timing._vote` is the one function that reaches outside (the side
group, the findings folder). Imports only the standard library and torch."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scout_slurm.bootstrap.exitpolicy import Ending, end, ends
from scout_slurm.localise.straggler import (
    Confirmation,
    LinkProbe,
    RankTiming,
    RoundDecision,
    TimingRules,
    confirm,
    decide_round,
    link_rounds,
    median,
)

_NODE_BYTES = 64
_SMALL_REPS = 3
_MEDIUM_REPS = 2


def _original(fn: Any) -> Any:
    """torch.distributed's own function under scout's collective wrapper: scout's traffic is not
    the job's and must not count as a training collective."""
    return getattr(fn, "__scout_original__", fn)


class Timing:
    def __init__(
        self,
        *,
        rules: TimingRules,
        rank: int,
        world: int,
        side: Any,
        writer: Any,
        run_dir: Path | None,
        node: str,
        offset: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.rules = rules
        self.rank, self.world = rank, world
        self.side, self.writer = side, writer
        self.run_dir, self.node = run_dir, node
        self.offset = offset
        self.clock = clock
        self.started = False
        self.last_step = 0
        self.nodes: list[str] | None = None
        self.best_median: float | None = None
        self.state = Confirmation()
        self.rounds = 0
        # the job's time since the last round, up to the end of the last optimizer step (what
        # follows
        # the last step, a final save or an evaluation, is not a step's time)
        self.acc_idle_ns = self.acc_busy_ns = 0
        self.last_decision: RoundDecision | None = None
        self.probing = rules.probe and world <= rules.probe_max_world
        if rules.probe and not self.probing and rank == 0:
            sys.stderr.write(
                f"scout: timing votes every {rules.every} steps without the link probe: "
                f"{world} ranks "
                f"exceed SCOUT_TIMING_PROBE_MAX_WORLD={rules.probe_max_world}\n"
            )

    # -- called from the optimizer hooks ----------------------------------------------------------

    def pause(self) -> None:
        self.writer.pause_timing()

    def resume(self) -> None:
        self.writer.resume_timing()

    def due(self, step: int) -> bool:
        """Whether `step`'s end holds a round (or the start of the clock)."""
        return not self.started or (
            self.rules.every > 0 and step % self.rules.every == 0 and step > self.last_step
        )

    def after_step(self, step: int) -> None:
        """At the end of every optimizer step, after scout's other work (paused since)."""
        if (
            not self.started
        ):  # start-up (building, first forward, DDP's first buckets) is not a step's time
            self.started = True
            self.last_step = step
            self.writer.take_timing(resume=True)
            return
        if self.rules.every <= 0 or step % self.rules.every != 0 or step <= self.last_step:
            idle_ns, busy_ns = self.writer.take_timing(resume=True)
            self.acc_idle_ns += idle_ns
            self.acc_busy_ns += busy_ns
            return
        idle_ns, busy_ns = self.writer.take_timing(resume=False)
        idle_ns, busy_ns = idle_ns + self.acc_idle_ns, busy_ns + self.acc_busy_ns
        self.acc_idle_ns = self.acc_busy_ns = 0
        steps = step - self.last_step
        self.last_step = step
        # the vote is a collective of scout's: in the progress record, so that if a peer never comes
        # (a hang) the ranks waiting here are seen inside it and the one missing is seen behind
        seq = self.writer.enter("scout_vote", 0, self.world)
        try:
            self._vote(step, idle_ns / 1e9 / steps, busy_ns / 1e9 / steps, steps)
        finally:
            self.writer.leave(seq)
            self.writer.take_timing(
                resume=True
            )  # the vote's own time is neither compute nor the job's collectives

    def final_round(self, step: int) -> bool:
        """At the end of training (every rank, right after the end-of-training state vote, so all
        are
        here): the partial window since the last round is voted on too. False when there is none."""
        if not self.started or self.rules.every <= 0 or step <= self.last_step:
            return False
        steps = step - self.last_step
        idle_ns, busy_ns = self.acc_idle_ns, self.acc_busy_ns
        self.acc_idle_ns = self.acc_busy_ns = 0
        self.last_step = step
        self._vote(step, idle_ns / 1e9 / steps, busy_ns / 1e9 / steps, steps)
        return True

    # -- the vote ---------------------------------------------------------------------------------

    def _node_names(self) -> list[str]:
        import torch
        import torch.distributed.distributed_c10d as c10d

        raw = self.node.encode("utf-8", "replace")[:_NODE_BYTES].ljust(_NODE_BYTES, b"\0")
        mine = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        out = [torch.zeros(_NODE_BYTES, dtype=torch.uint8) for _ in range(self.world)]
        _original(c10d.all_gather)(out, mine, group=self.side)
        return [
            bytes(t.tolist()).rstrip(b"\0").decode("utf-8", "replace") or f"rank{r}"
            for r, t in enumerate(out)
        ]

    def _probe(self, nodes: list[str]) -> tuple[list[float], list[float]]:
        """Round trips with every peer on another node, one peer at a time (a round-robin schedule,
        so
        each rank is in one pair at once): a few bytes (latency) and a medium buffer sent both ways
        (bandwidth). Peers on this rank's own node are not probed: no link lies between them."""
        import torch
        import torch.distributed.distributed_c10d as c10d

        # the side group's own send and recv (it spans every rank: group ranks are global ranks),
        # not
        # torch.distributed's Python layer over them, whose checks and logging cost more than the
        # small exchange itself and would be timed with it
        pg = self.side if self.side is not None else c10d._get_default_group()

        def send(buf: Any, peer: int) -> None:
            pg.send([buf], peer, 0).wait()

        def recv(buf: Any, peer: int) -> None:
            pg.recv([buf], peer, 0).wait()

        small_buf = torch.zeros(2, dtype=torch.float32)
        medium_buf = torch.zeros(max(1, self.rules.probe_bytes // 4), dtype=torch.float32)
        small = [-1.0] * self.world
        medium = [-1.0] * self.world
        for pairs in link_rounds(nodes):
            for a, b in pairs:
                if self.rank not in (a, b):
                    continue
                peer, first = (b, True) if self.rank == a else (a, False)
                for buf, reps, row in (
                    (small_buf, _SMALL_REPS, small),
                    (medium_buf, _MEDIUM_REPS, medium),
                ):
                    best = float("inf")
                    for _ in range(reps):
                        t0 = self.clock()
                        if first:
                            send(buf, peer)
                            recv(buf, peer)
                        else:
                            recv(buf, peer)
                            send(buf, peer)
                        best = min(best, self.clock() - t0)
                    if first:  # the side that started measured the whole round trip
                        row[peer] = best
        return small, medium

    def _vote(self, step: int, compute_s: float, comm_s: float, steps: int) -> None:
        import torch
        import torch.distributed.distributed_c10d as c10d

        t0 = self.clock()
        if self.nodes is None:
            self.nodes = self._node_names()
        small, medium = (
            self._probe(self.nodes) if self.probing else ([-1.0] * self.world, [-1.0] * self.world)
        )
        mine = torch.tensor([compute_s, comm_s, float(steps), *small, *medium], dtype=torch.float64)
        out = [torch.zeros_like(mine) for _ in range(self.world)]
        _original(c10d.all_gather)(out, mine, group=self.side)
        rows = [t.tolist() for t in out]
        n = self.world
        timings = [RankTiming(r, row[0], row[1], int(row[2])) for r, row in enumerate(rows)]
        probe = (
            LinkProbe(
                tuple(tuple(row[3 : 3 + n]) for row in rows),
                tuple(tuple(row[3 + n : 3 + 2 * n]) for row in rows),
            )
            if self.probing
            else None
        )
        decision = decide_round(timings, self.nodes, probe, self.best_median, self.rules)
        med = median([t.compute_s for t in timings])
        self.best_median = med if self.best_median is None else min(self.best_median, med)
        outcome = confirm(self.state, decision, self.rules)
        self.state = outcome.state
        self.rounds += 1
        self.last_decision = decision
        took = self.clock() - t0
        gstep = step + self.offset
        if self.rank == 0 and self.rules.verbose:
            sys.stderr.write(
                f"scout: timing round {self.rounds} at step {gstep}: {decision.outcome} "
                f"{decision.ranks} {decision.nodes}; {'; '.join(decision.reasons)} "
                f"({took * 1000:.1f} ms)\n"
            )
        if not outcome.confirmed and not outcome.transient:
            return
        named = sorted({r for key in outcome.confirmed for r in self._ranks_of(key, decision)})
        writer = min((r for r in range(self.world) if r not in named), default=0)
        if self.rank == writer:
            for key in outcome.confirmed:
                self._write_confirmed(key, decision, timings, gstep, took)
            for key in outcome.transient:
                self._write_transient(key, gstep)
        if not named:
            return
        # the finding is on disk before a straggler leaves (policy exit): the Epilogs act on it
        _original(c10d.barrier)(group=self.side)
        if self.rank in named:
            sys.stderr.write(
                f"scout: rank {self.rank} is a confirmed straggler at step {gstep} "
                f"({decision.outcome}); policy {self.rules.policy}\n"
            )
            sys.stderr.flush()
            if ends(Ending.STRAGGLER, self.rules.policy):
                end(Ending.STRAGGLER)

    def _ranks_of(self, key: str, d: RoundDecision) -> list[int]:
        if key.startswith("compute:rank:"):
            return [int(key.rsplit(":", 1)[1])]
        if key.startswith("communication:node:"):
            node = key.split(":", 2)[2]
            return [r for r in range(self.world) if self.nodes and self.nodes[r] == node]
        return []

    def _write(self, name: str, finding: Any) -> None:
        if self.run_dir is None:
            return
        from scout_slurm.bootstrap.evidencewrites import write_record
        from scout_slurm.evidence.layout import RunFolder

        try:
            write_record(RunFolder(self.run_dir).finding_path(name), finding)
        except Exception as exc:
            sys.stderr.write(f"scout: timing finding not written: {exc!r}\n")

    def _write_confirmed(
        self, key: str, d: RoundDecision, timings: list[RankTiming], step: int, took: float
    ) -> None:
        from scout_slurm.evidence.records import Finding, FindingKind

        now = time.time()
        rounds = f"confirmed over {self.rules.confirm_rounds} rounds of {self.rules.every} steps"
        med = median([t.compute_s for t in timings])
        details = (*d.reasons, f"vote took {took * 1000:.1f} ms")
        nodes = self.nodes or []
        if key.startswith("compute:rank:"):
            r = int(key.rsplit(":", 1)[1])
            t = timings[r]
            self._write(
                f"straggler-compute-rank-{r}-step-{step}",
                Finding(
                    rank=r,
                    node=nodes[r] if r < len(nodes) else "",
                    kind=FindingKind.STRAGGLER,
                    at=now,
                    step=step,
                    component="compute",
                    details=details,
                    summary=(
                        f"rank {r} on {nodes[r] if r < len(nodes) else '?'} is a compute "
                        "straggler: "
                        f"{t.compute_s:.3f} s/step of compute against the median {med:.3f} s; "
                        f"{rounds}"
                    ),
                ),
            )
        elif key.startswith("communication:node:"):
            node = key.split(":", 2)[2]
            for r in self._ranks_of(key, d):
                self._write(
                    f"straggler-communication-rank-{r}-step-{step}",
                    Finding(
                        rank=r,
                        node=node,
                        kind=FindingKind.STRAGGLER,
                        at=now,
                        step=step,
                        component="communication",
                        details=details,
                        summary=(
                            f"node {node} (rank {r}) is a communication straggler: every link "
                            "probe to it is "
                            f"slow while compute times are alike; {rounds}"
                        ),
                    ),
                )
        else:
            what = (
                "the whole group is slower together"
                if key == "group_slow"
                else "ranks split into a slow and a fast camp"
            )
            self._write(
                f"timing-{key}-step-{step}",
                Finding(
                    rank=0,
                    node="",
                    kind=FindingKind.INFO,
                    at=now,
                    step=step,
                    component="timing",
                    details=details,
                    summary=f"timing vote at step {step}: {what}; nobody named (inconclusive); "
                    f"{rounds}",
                ),
            )

    def _write_transient(self, key: str, step: int) -> None:
        from scout_slurm.evidence.records import Finding, FindingKind

        if not key.startswith("compute:rank:"):
            return
        r = int(key.rsplit(":", 1)[1])
        nodes = self.nodes or []
        self._write(
            f"timing-transient-rank-{r}-step-{step}",
            Finding(
                rank=r,
                node=nodes[r] if r < len(nodes) else "",
                kind=FindingKind.INFO,
                at=time.time(),
                step=step,
                component="timing",
                summary=(
                    f"rank {r} was slow in one timing round only (a one-off stall, e.g. "
                    "waiting for input), "
                    f"not in the round that ended at step {step}: not a straggler"
                ),
            ),
        )


def start_timing(
    *,
    rank: int,
    world: int,
    side: Any,
    writer: Any,
    run_dir: Path | None,
    node: str,
    rules: TimingRules,
    offset: int = 0,
) -> Timing | None:
    """Timing votes per SCOUT_TIMING_* (the job's JobConfig.timing; None when off or alone)."""
    if rules.every <= 0 or world < 2 or writer is None:
        return None
    if side is None:
        import torch.distributed as dist

        side = dist.new_group(backend="gloo")  # scout's votes never use the training communicators
    return Timing(
        rules=rules,
        rank=rank,
        world=world,
        side=side,
        writer=writer,
        run_dir=run_dir,
        node=node,
        offset=offset,
    )
