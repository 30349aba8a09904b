"""The in-job runtime: the one object scout keeps inside a training process. Built once from the
job's settings (`JobConfig`) and completed with the job's place (rank, world, groups) when
torch.distributed starts; the torch patches (bootstrap.patches) only forward events to it. It
holds the witnesses in their order and runs each inside the guard (bootstrap.guard), writes the
run's coverage record, makes the end-of-training vote and fires injected faults
(scout_slurm.inject)."""

from __future__ import annotations

import atexit
import dataclasses
import gc
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scout_slurm.bootstrap import evidencewrites, selfcost
from scout_slurm.bootstrap.guard import Guard
from scout_slurm.bootstrap.selfcost import COST
from scout_slurm.bootstrap.witnesses import (
    AtRestWitness,
    CheckpointWitness,
    FiniteWitness,
    ReplayWitness,
    StateVoteWitness,
    TimingWitness,
    UpdateWitness,
    Witness,
)
from scout_slurm.jobconfig import JobConfig
from scout_slurm.task import progress as progress_mod

if TYPE_CHECKING:
    from scout_slurm.bootstrap.consensus import Consensus
    from scout_slurm.bootstrap.finite import FiniteWatch
    from scout_slurm.bootstrap.frameworks import RootTracker
    from scout_slurm.bootstrap.replay import Replay
    from scout_slurm.bootstrap.timing import Timing
    from scout_slurm.inject.fire import Injector

_log = logging.getLogger("scout.bootstrap")


def say(line: str) -> None:
    """One line of scout's in the job's output (its stderr)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (
        OSError,
        ValueError,
    ):  # a closed or broken stream: nothing more can reach the job's output
        pass


class Runtime:
    """scout inside one training process. `originals` holds torch's own collectives for scout's
    side-group exchanges (recorded as `scout_vote`, bootstrap.patches fills it)."""

    def __init__(
        self, config: JobConfig, *, progress_dir: Path | None, checkpoints_dir: Path | None
    ) -> None:
        self.config = config
        self.progress_dir, self.checkpoints_dir = progress_dir, checkpoints_dir
        self.restart = config.restart
        self.rank, self.world = -1, 0
        self.guard = Guard(say=say, rank=lambda: self.rank, broken=config.break_checks)
        self.guard.record = self._record_check_off
        self.writer: progress_mod.ProgressWriter | None = None
        self.default_pg: Any = None  # the job's default ProcessGroup (for its sequence number)
        self.originals: dict[str, Any] = {}
        self.consensus: Consensus | None = None
        self.replay: Replay | None = None
        self.timing: Timing | None = None
        self.finite: FiniteWatch | None = None
        self.atrest: Any = None
        self.update: Any = None
        self.root_tracker: RootTracker | None = None
        self.closure_steps = False  # the job steps with optimizer.step(closure) (Lightning)
        self.witnesses: list[Witness] = []
        self.checkpoint_watch: Any = None  # bootstrap.ckptstate's watch, once installed
        self.injector: Injector | None = None
        self.coverage_written: tuple | None = None
        self.final_vote = ""  # what the end-of-training vote did ("": not reached yet)
        self.banner_said = False
        self.step_count_known = False  # a rerun's first step read the optimizer's own count
        self.device_known = False  # the first step recorded the GPU the rank's parameters are on
        self.busy_depth = 0  # nested checkpoint saves/loads (the record's busy mark)
        self.busy_lock = threading.Lock()
        self.installed: Any = None  # the patches' handle (bootstrap.patches.InstalledHooks)
        self.pending_off: list[
            tuple[str, str, bool]
        ] = []  # checks switched off before the rank was known
        self.is_compiling: Any = lambda: (
            False
        )  # torch.compiler.is_compiling once torch.distributed started

    # -- the job's place, once torch.distributed has started -------------------------------------

    def open(self, rank: int, world: int, default_pg: Any) -> None:
        """init_process_group returned: the progress record, then the witnesses (each in the
        guard).
        """
        self.default_pg = default_pg
        if self.progress_dir is not None and self.writer is None:
            path = self.progress_dir / f"rank-{rank}.bin"
            if not path.exists():
                progress_mod.create(path)
            self.writer = progress_mod.ProgressWriter(path, rank=rank, world_size=world)
            self.rank, self.world = rank, world
            atexit.register(self.writer.deactivate)
            atexit.register(self.at_exit)  # runs first (last registered)
            pending, self.pending_off = self.pending_off, []
            for off in pending:
                self.guard.run("coverage record", self._record_check_off, *off)
        if self.injector is None and self.config.inject is not None:
            from scout_slurm.inject.fire import Injector

            self.injector = Injector(
                self.config.inject,
                rank=self.rank,
                restart=self.restart,
                record=self.record_injection,
                first_weight=self.first_weight,
                say=say,
            )
        self.guard.run("state vote", self._start_consensus)
        self.guard.run("timing votes", self._start_timing)
        self.guard.run("model tracker", self._start_root_tracker)
        self.guard.run("collective record", self._start_flight_recorder_dumps)
        self.order_witnesses()

    def _start_flight_recorder_dumps(self) -> None:
        """A thread of scout's that writes torch's Flight Recorder dump into the run's evidence when
        the watchdog asks (with the stacks, before it ends a stall): the dump is taken while the
        training thread is blocked inside a collective (the wait releases the GIL). Quietly nothing
        where torch has no Flight Recorder or the run has no evidence folder."""
        try:
            import torch

            c10d = torch._C._distributed_c10d
            with_stacks = getattr(c10d, "_dump_fr_trace", None)
            as_json = getattr(c10d, "_dump_fr_trace_json", None)
        except (ImportError, AttributeError):
            return
        if with_stacks is None and as_json is None:
            return
        if self.progress_dir is None or self.config.run_dir is None:
            return

        def dump() -> Any:
            # torch's pickle with the stack traces (collectives on, not only active ones: the
            # peers' position needs the completed ones too); its JSON where the pickle fails
            if with_stacks is not None:
                try:
                    return with_stacks(True, True, False)
                except Exception:
                    if as_json is None:
                        raise
            return as_json()

        from scout_slurm.bootstrap.evidencewrites import write_bytes
        from scout_slurm.evidence.layout import RunFolder
        from scout_slurm.task.progress import flight_recorder_request

        request = flight_recorder_request(self.progress_dir, self.rank)
        dest = RunFolder(self.config.run_dir).flight_recorder_path(self.rank)

        def serve() -> None:
            while True:
                time.sleep(0.5)
                if not os.path.exists(request):
                    continue
                try:
                    data = dump()
                    write_bytes(dest, data if isinstance(data, bytes) else data.encode())
                    os.unlink(request)
                except Exception:  # evidence only: a dump that fails is not the job's problem
                    return

        threading.Thread(target=serve, name="scout-flight-recorder", daemon=True).start()

    def _side_ops(self) -> tuple[Any, Any]:
        return self.originals["all_gather"], self.originals["barrier"]

    def _start_consensus(self) -> None:
        cfg = self.config
        if cfg.consensus_every <= 0 or self.world < 2 or self.consensus is not None:
            return
        from scout_slurm.bootstrap.consensus import Consensus

        common = dict(
            rank=self.rank,
            world=self.world,
            run_dir=cfg.run_dir,
            node=cfg.node,
            offset=cfg.step_offset,
            sdc_policy=cfg.sdc_policy.value,
        )
        c = Consensus(every=cfg.consensus_every, restart=cfg.restart, **common)
        c.on_vote = self.write_coverage
        self.consensus = c
        if cfg.sign_on_device:
            from scout_slurm.bootstrap import signing

            signing.DEVICE_ON_CPU = True
            if self.rank == 0:
                say("scout: CPU tensors signed by the device path (SCOUT_SIGN_ON_DEVICE)")
        self._agree_on_hasher(c.side)
        if cfg.at_rest != "off":
            self.guard.run("at-rest witness", self._start_atrest, common)
        if cfg.update_replay != "off":
            self.guard.run("update replay", self._start_update, common)
        if cfg.replay_every > 0:
            self.guard.run("in-situ replay", self._start_replay, common)
        if cfg.finite_check:
            self.guard.run("non-finite watch", self._start_finite)

    def _agree_on_hasher(self, side: Any) -> None:
        """Every rank signs with the same hasher: xxh3 where every rank has xxhash, else blake2b-64
        on all (a rank without xxhash would otherwise differ from every vote and be called
        corrupt)."""
        import torch

        from scout_slurm.bootstrap import signing

        mine = torch.tensor([1 if signing.HASH_NAME == "xxh3_64" else 0], dtype=torch.int64)
        every = [torch.zeros_like(mine) for _ in range(self.world)]
        # torch's own call, not in the progress record: every rank has just left the rendezvous, and
        # the
        # record's collective numbers stay the job's own from its first collective on
        gather = self.originals["all_gather"]
        getattr(gather, "__scout_original__", gather)(every, mine, group=side)
        if signing.HASH_NAME == "xxh3_64" and not all(int(t.item()) for t in every):
            signing.use_fallback()
            if self.rank == 0:
                say(
                    "scout: not every rank has xxhash: every rank signs with blake2b-64 "
                    "(exact, slower)"
                )

    def _start_atrest(self, common: dict) -> None:
        from scout_slurm.bootstrap.atrest import AtRest

        c = self.consensus
        self.atrest = AtRest(
            every=self.config.consensus_every,
            side=c.side,
            voted=c.voted_parameters,
            mode=self.config.at_rest,
            covered=self.votes_cover_rest,
            **common,
        )
        c.presigned = self.presigned

    def _start_update(self, common: dict) -> None:
        from scout_slurm.bootstrap.frameworks import replica_layout
        from scout_slurm.bootstrap.update import UpdateReplay

        c = self.consensus
        injector = self.injector
        self.update = UpdateReplay(
            every=self.config.consensus_every,
            side=c.side,
            originals=self.originals,
            max_bytes=self.config.update_max_bytes,
            mode=self.config.update_replay,
            layout=lambda: replica_layout(c.modules, self.world)[0],
            corrupt=injector.corrupt_recomputed_update if injector is not None else None,
            **common,
        )

    def _start_replay(self, common: dict) -> None:
        from scout_slurm.bootstrap.replay import Replay

        self.replay = Replay(
            every=self.config.replay_every,
            side=self.consensus.side,
            originals=self.originals,
            current_step=self.current_step,
            max_bytes=self.config.replay_max_bytes,
            **common,
        )
        self.replay.guard = self.guard

    def _start_finite(self) -> None:
        from scout_slurm.bootstrap.finite import FiniteWatch

        finite = FiniteWatch(offset=self.consensus.offset, on_first=self._note_first_nonfinite)
        if self.installed is not None:
            finite.install(self.installed, self.guard)
        self.finite = finite
        self.consensus.first_nonfinite = finite.resolve

    def _start_timing(self) -> None:
        if self.timing is not None or self.world < 2:
            return
        from scout_slurm.bootstrap.timing import start_timing

        cfg = self.config
        self.timing = start_timing(
            rank=self.rank,
            world=self.world,
            side=self.consensus.side if self.consensus is not None else None,
            writer=self.writer,
            run_dir=cfg.run_dir,
            node=cfg.node,
            rules=cfg.timing,
            offset=cfg.step_offset,
        )

    def _start_root_tracker(self) -> None:
        if (
            self.root_tracker is None
        ):  # also without votes: the banner names the framework, forwards beat
            from scout_slurm.bootstrap.frameworks import RootTracker

            self.root_tracker = RootTracker(self.on_root)

    def order_witnesses(self) -> None:
        """Their order at a step's end: the at-rest seal first (the state exactly as the optimizer
        left it), the update replay, the non-finite note, the state vote, the timing vote last (the
        others' work is not the job's time). Before a step: the at-rest check, the update's inputs,
        the replay (while the weights are those this step's forward used), the checkpoint watch."""
        w: list[Witness] = []
        if self.atrest is not None:
            w.append(AtRestWitness(self.atrest, self._side_ops))
        if self.update is not None:
            w.append(UpdateWitness(self.update))
        if self.replay is not None:
            w.append(ReplayWitness(self.replay))
        if self.finite is not None:
            w.append(FiniteWitness(self.finite))
        if self.consensus is not None:
            w.append(StateVoteWitness(self.consensus, self._side_ops))
        if self.timing is not None:
            w.append(TimingWitness(self.timing))
        if self.checkpoint_watch is not None:
            w.append(CheckpointWitness(self.checkpoint_watch))
        self.witnesses = w

    # -- optimizer steps
    # -----------------------------------------------------------------------------

    def before_step(self, optimizer: Any, *, closure: bool = False) -> None:
        if closure and not self.closure_steps:
            self.closure_steps = True
            self.guard.run("in-situ replay", self._closure_steps)
        if not self.banner_said and not self.closure_steps:
            self.banner_said = True
            self.guard.run("banner", self.model_banner)
        if self.writer is None:
            return
        if not self.step_count_known:
            self.guard.run("optimizer hooks", self._adopt_step_count, optimizer)
        step = self.writer.steps + 1
        timing = self.timing if self.guard.on("timing votes") else None
        for w in self.witnesses:
            if not self.guard.on(w.name):
                continue
            paused = timing is not None and w.works_before(step)
            if paused:  # scout's own work is not the job's compute
                timing.pause()
            self.guard.run(w.name, w.before_step, step, optimizer)
            if paused:
                timing.resume()

    def _adopt_step_count(self, optimizer: Any) -> None:
        """A rerun that loaded its state as the script decided (no resume instruction, so no step
        offset): its first step continues the optimizer's own count, so that every record of the
        job counts steps one way. Once, at the first real step (not DCP's state-creating one)."""
        from scout_slurm.bootstrap import ckptstate

        if ckptstate._state_init_step(optimizer):
            return
        self.step_count_known = True
        if self.writer is None or self.writer.steps > 0 or self.restart <= 0:
            return
        if self.config.step_offset > 0:  # the controller's resume instruction said where
            return
        done = optimizer_step_count(optimizer)
        if done <= 0:
            return
        self.config = dataclasses.replace(self.config, step_offset=done)
        for w in (self.consensus, self.replay, self.timing, self.finite, self.atrest, self.update):
            if w is not None and hasattr(w, "offset"):
                w.offset = done
        if self.checkpoint_watch is not None:
            self.checkpoint_watch.offset = done
        run_dir = self.config.run_dir
        # the verdict reads the offset from the rank's place record (read here on the training
        # thread, once a rerun: not while the root is known to hang)
        if run_dir is not None and evidencewrites.answering():
            from scout_slurm.errors import ScoutError
            from scout_slurm.evidence.layout import JobFolder
            from scout_slurm.evidence.records import RankPlace
            from scout_slurm.evidence.store import read_record

            try:
                folder, restart = JobFolder.of_run_dir(run_dir)
                path = folder.rank_place_path(restart, self.rank)
                place = read_record(path, RankPlace)
            except ScoutError:  # no place record of the evidence tree's (a hand-run job): nothing
                return
            evidencewrites.write_record(path, dataclasses.replace(place, step_offset=done))

    def _closure_steps(self) -> None:
        """optimizer.step(closure) (Lightning's loop): the step's forward and backward run inside
        the step, after scout's pre-step hook, so the in-situ replay (which recomputes at that
        hook what the step's forward computed, with the same weights) has nothing of this step to
        recompute; it is off, said once. The banner waits for the end of the first step, when
        the model has run its first forward (inside the closure)."""
        if self.replay is not None and self.guard.on("in-situ replay"):
            why = (
                "the job steps with optimizer.step(closure) (Lightning): its forward runs inside "
                "the step, after the moment the replay recomputes it"
            )
            self.guard.off["in-situ replay"] = why
            if self.rank == 0:
                say(f"scout: in-situ replay not run: {why}; state votes and the rest run")

    def after_step(self, optimizer: Any) -> None:
        if not self.banner_said:  # optimizer.step(closure): the model ran inside the first step
            self.banner_said = True
            self.guard.run("banner", self.model_banner)
        w = self.writer
        if w is None:
            return
        step = w.step()
        live = [x for x in self.witnesses if self.guard.on(x.name)]
        timing = self.timing if self.guard.on("timing votes") else None
        if timing is not None and any(x.works_after(step) for x in live):
            timing.pause()  # resumed by the timing witness, last
        inj = self.injector
        if inj is not None:  # outside the guard: an injected fault is the job's, not scout's
            inj.update_fault(step, optimizer)
        for x in live:
            if not x.sees_faults:
                self.guard.run(x.name, x.after_step, step, optimizer)
        COST.stepped(w.last_step_ns)
        if step % selfcost.COST_EVERY == 0:
            selfcost.write(self.config.run_dir, self.rank, self.restart)
        if self.root_tracker is not None:  # the models have run their first forward by now
            self.guard.run("model tracker", self.root_tracker.remove)
            self.root_tracker = None
        if not self.device_known:  # the model is on its device by the first step
            self.device_known = True
            self.guard.run("device identity", self._record_device, optimizer)
        if inj is not None:
            inj.process_fault(step, optimizer)
        for x in live:
            if x.sees_faults:
                self.guard.run(x.name, x.after_step, step, optimizer)
        if self.rank == 0:
            self.write_coverage()

    def current_step(self) -> int:
        """The optimizer step being computed now (1-based): forward, backward, and the replay
        before it.
        """
        return self.writer.steps + 1 if self.writer is not None else 0

    # -- the models
    # ----------------------------------------------------------------------------------

    def on_root(self, module: Any) -> None:
        """A model (DDP or FSDP2 root) ran its first forward: votes, replay and compute faults
        attach.
        """
        w = self.writer
        if (
            w is not None
        ):  # a forward is progress: an evaluation loop without collectives is not idle
            from scout_slurm.bootstrap.frameworks import inner

            inner(module).register_forward_pre_hook(_beat_hook(w))
        if self.consensus is not None:
            self.guard.run("state vote", self.consensus.track, module)
        if self.replay is not None:
            tracker = self.root_tracker
            compiled = tracker is not None and any(module is m for m in tracker.compiled)
            self.guard.run("in-situ replay", self.replay.add_root, module, compiled=compiled)
        inj = self.injector
        if (
            inj is not None
            and inj.fault.is_compute
            and (inj.fault.rank is None or inj.fault.rank == self.rank)
        ):
            from scout_slurm.inject.fire import attach_compute_fault

            said = attach_compute_fault(
                module,
                inj.fault,
                self.rank,
                self.restart,
                self.current_step,
                lambda what: inj.compute_fired_once(what, self.current_step()),
                lambda: self.replay is not None and self.replay.replaying,
            )
            say(f"scout: {said}")

    def _record_device(self, optimizer: Any) -> None:
        """The UUID of the GPU this rank's parameters are on, into its place record (nothing on
        a CPU)."""
        from scout_slurm.bootstrap import deviceid

        try:
            weight = self.first_weight(optimizer)
        except (IndexError, KeyError, StopIteration):  # an optimizer of no parameters: nothing
            return
        uuid = deviceid.device_uuid(weight)
        if uuid and self.config.run_dir is not None:
            deviceid.record(self.config.run_dir, self.rank, uuid)

    def first_weight(self, optimizer: Any) -> Any:
        """The first parameter of the model this rank holds: under DeepSpeed ZeRO the optimizer's
        parameters are this rank's flat partition (held by no other rank), so the model's own."""
        from scout_slurm.bootstrap.frameworks import inner, is_deepspeed

        for root in self.consensus.modules if self.consensus is not None else []:
            if is_deepspeed(root):
                return next(inner(root).parameters())
        return optimizer.param_groups[0]["params"][0]

    def votes_cover_rest(self) -> str:
        """Why the state votes name any change at rest by majority ("": they do not): every replica
        group has 3 or more ranks and the optimizer state is voted. The same on every rank."""
        c = self.consensus
        smallest = min((len(g) for g in c.groups or ()), default=1) if c is not None else 1
        if smallest < 3 or c.optimizer_skipped:
            return ""
        return (
            f"left to the state votes: every replica group has {smallest} or more ranks, so a "
            "change at rest "
            "persists into the next vote, which names the rank by majority"
        )

    def presigned(self, step: int, optimizer: Any) -> tuple[int, int] | None:
        """The at-rest seal of `step`, for the state vote of the same step: unless the fault
        injector
        fired in between (it changes the state after the seal, before the vote, on purpose)."""
        fired = self.injector.fired_step if self.injector is not None else -1
        if self.atrest is None or fired == step or not self.guard.on("at-rest witness"):
            return None
        return self.atrest.signed_at(step, optimizer)

    def model_banner(self) -> None:
        from scout_slurm.bootstrap.banner import model_banner

        line = model_banner(self)
        if line:
            say(line)

    # -- evidence
    # ------------------------------------------------------------------------------------

    def _finding(self, name: str, kind: Any, summary: str, step: int = -1) -> None:
        run_dir = self.config.run_dir
        if not run_dir:
            return
        from scout_slurm.evidence.layout import RunFolder
        from scout_slurm.evidence.records import Finding

        evidencewrites.write_record(
            RunFolder(run_dir).finding_path(name),
            Finding(
                rank=self.rank,
                node=self.config.node,
                kind=kind,
                at=time.time(),
                summary=summary,
                step=step,
            ),
        )

    def _record_check_off(self, check: str, why: str, exchange: bool) -> None:
        """A check switched off: in the lowest rank's coverage record; a failure of scout's own code
        also as a finding of the rank (an exchange that failed because a peer ended is the peer's
        evidence, found elsewhere)."""
        if (
            self.rank < 0
        ):  # before the rank is known (a patch at install): recorded once it is (`open`)
            self.pending_off.append((check, why, exchange))
            return
        if self.rank == 0:
            self.write_coverage(force=True)
        if exchange:
            return
        from scout_slurm.evidence.records import FindingKind

        slug = "".join(ch if ch.isalnum() else "-" for ch in check)
        self._finding(
            f"check-off-{slug}-rank-{self.rank}",
            FindingKind.CHECK_OFF,
            f"{check} not run from step {self.current_step()} on rank {self.rank}: it failed "
            "inside "
            f"scout ({why})",
            step=self.current_step(),
        )

    def record_injection(self, fault: Any) -> None:
        """An INFO finding with the moment of injection, so detection latency can be measured."""
        from scout_slurm.evidence.records import FindingKind

        try:
            self._finding(
                f"injected-rank-{self.rank}-{int(time.time() * 1000)}",
                FindingKind.FAULT_INJECTED,
                f"fault injected: {fault.kind}",
                step=fault.step,
            )
            # the fault may end this process at once (SIGKILL, a segfault): the record lands
            # first, within a bound, as it did when evidence writes were synchronous
            evidencewrites.flush(INJECTION_FLUSH_S)
        except Exception as exc:
            say(f"scout: injection not recorded: {exc!r}")

    def _note_first_nonfinite(self, gstep: int) -> None:
        """This rank's own note (evidence, not a verdict): the vote decides who was first."""
        from scout_slurm.evidence.records import FindingKind

        say(f"scout: rank {self.rank}'s loss is non-finite (NaN/Inf) since step {gstep}")
        self._finding(
            f"nonfinite-rank-{self.rank}",
            FindingKind.INFO,
            f"rank {self.rank}'s loss is non-finite since step {gstep}",
            step=gstep,
        )

    def write_coverage(self, *, force: bool = False) -> None:
        """The lowest rank's record of which checks ran in this run (runs/N/votes.json), written
        when
        a count changed: after a vote, a replay or a timing round, and at the end of training."""
        if self.rank == 0:
            self.guard.run("coverage record", self._write_coverage, force)

    def _write_coverage(self, force: bool) -> None:
        # what each check did, also one the guard switched off (up to then); `checks_off` says which
        # stopped
        g = self.guard
        c, r, t, u, a = self.consensus, self.replay, self.timing, self.update, self.atrest
        at_rest_stopped = (a.off if a is not None else "") or (
            f"switched off by scout's guard ({g.off['at-rest witness']})"[:200]
            if "at-rest witness" in g.off
            else ""
        )
        key = (
            c.votes if c else 0,
            r.replays if r else None,
            r.failed_rounds if r else 0,
            t.rounds if t else 0,
            self.final_vote,
            u.rounds if u is not None and not (u.off and not u.rounds) else None,
            a.checks if a is not None else None,
            at_rest_stopped,
            tuple(sorted(g.off)),
            r.not_checked() if r else (),
        )
        if key == self.coverage_written and not force:
            return
        self.coverage_written = key
        run_dir = self.config.run_dir
        if not run_dir:
            return
        from scout_slurm.evidence.layout import RunFolder
        from scout_slurm.evidence.records import VoteCoverage

        evidencewrites.write_record(
            RunFolder(run_dir).coverage_path,
            VoteCoverage(
                restart=self.restart,
                votes=key[0],
                last_clean_step=c.last_clean if c else -1,
                last_vote_step=c.last_vote_step if c else -1,
                replay_rounds=key[1],
                replay_failed_rounds=key[2],
                timing_rounds=key[3],
                votes_every=c.every if c else 0,
                replay_every=r.every if r else 0,
                timing_every=t.rules.every if t else 0,
                steps=(self.writer.steps + self.config.step_offset)
                if self.writer is not None
                else -1,
                final_vote=self.final_vote,
                replicas=max((len(x) for x in c.groups), default=0)
                if c is not None and c.groups
                else 0,
                update_rounds=key[5],
                at_rest_windows=key[6],
                at_rest_stopped=key[7],
                checks_off=tuple(f"{name}: {why}"[:300] for name, why in sorted(g.off.items())),
                replay_not_checked=tuple(why[:300] for why in key[9]),
            ),
        )

    # -- the end
    # ---------------------------------------------------------------------------------------

    def end_of_training(self, where: str = "destroy_process_group") -> None:
        """At destroy_process_group, or at Lightning's Trainer teardown after a fit with the group
        still up (`where`, every rank): the replicas vote on their state once more, so the final
        model is checked even in a run shorter than K steps; the coverage record says what ran.
        Not while an exception is being raised (a `finally:` after a failure: no collective
        then)."""
        c = self.consensus if self.guard.on("state vote") else None
        raised = sys.exc_info()[0]
        if raised is not None:
            self.final_vote = f"not made: {where} ran while {raised.__name__} was raised"
        elif c is None:
            self.final_vote = (
                (
                    "not made: state votes are off"
                    if self.consensus is None
                    else "not made: the state vote failed inside scout"
                )
                if self.world >= 2
                else "not made: one rank"
            )
        else:
            timing = self.timing if self.guard.on("timing votes") else None
            if timing is not None:
                timing.pause()
            try:
                self.final_vote = c.final_vote(
                    *self._side_ops(), timeout_s=self.config.final_vote_timeout_s
                )
            except Exception as exc:
                self.final_vote = f"not made: {exc!r}"[:200]
            # every rank is here only when this vote gathered them and none is leaving: then the
            # timing of
            # the steps since the last round counts too
            if (
                timing is not None
                and self.final_vote.startswith("at step")
                and "disagreed" not in self.final_vote
            ):
                last = timing.last_step
                try:
                    if timing.final_round(c.steps):
                        self.final_vote += f"; a last timing round over steps {last + 1}-{c.steps}"
                except Exception as exc:
                    self.final_vote += f"; the last timing round failed: {exc!r}"[:200]
        self.write_coverage(force=True)
        selfcost.write(self.config.run_dir, self.rank, self.restart)
        # the models and optimizer scout held for this vote: freed before the groups go (a DDP
        # object
        # alive during destroy_process_group can deadlock gloo's teardown: TORCH-FACTS)
        if self.consensus is not None:
            self.consensus.optimizer, self.consensus.modules = None, []
        if self.replay is not None:
            self.replay.roots, self.replay.layers = [], []
        gc.collect()

    def release_side_groups(self) -> None:
        """After destroy_process_group(): drop scout's references to its side groups and free them
        now, while the interpreter is whole. A gloo group still referenced at interpreter exit is
        torn
        down during finalisation, where its worker threads can abort the process (SIGABRT,
        pytorch/pytorch#179291). A later init_process_group starts votes, replay and timing
        afresh."""
        self.consensus = self.replay = self.timing = self.atrest = self.update = None
        self.witnesses = []
        self.default_pg = None
        from scout_slurm.bootstrap import ckptstate

        if ckptstate.WATCH is not None:
            ckptstate.WATCH.side = None
        gc.collect()

    def at_exit(self) -> None:
        """The interpreter ends: a script that never called destroy_process_group got no final
        vote.
        """
        if not self.final_vote and self.writer is not None:
            self.final_vote = "not made: the process ended without reaching destroy_process_group"
            self.write_coverage(force=True)
            selfcost.write(self.config.run_dir, self.rank, self.restart)


INJECTION_FLUSH_S = 2.0  # how long an injection waits for its own record to land


def _beat_hook(writer: progress_mod.ProgressWriter) -> Any:
    import torch

    is_compiling = torch.compiler.is_compiling

    def scout_beat(_module: Any, _args: Any) -> None:
        # inside a compiled model the hook is traced: nothing of scout's goes into the graph (and no
        # graph break); the collectives and optimizer steps still show progress
        if not is_compiling():
            writer.beat()

    return scout_beat


def optimizer_step_count(optimizer: Any) -> int:
    """The optimizer's own count of the steps it has taken (Adam's and most others' `step` in each
    parameter's state, restored by load_state_dict), 0 when it keeps none (plain SGD)."""
    best = 0
    for state in getattr(optimizer, "state", {}).values():
        step = state.get("step") if isinstance(state, dict) else None
        if step is None:
            continue
        try:
            best = max(best, int(float(step)))
        except (TypeError, ValueError, RuntimeError):
            continue
    return best
