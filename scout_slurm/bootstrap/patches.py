"""scout's hooks inside the training process: wrap torch.distributed's Python collectives,
DDP's comm hook and the optimizer step, so every collective and step lands in the progress
record. Installing keeps the originals; `InstalledHooks.remove()` restores them; installing
twice is a no-op. Imports only the standard library and torch (lazily)."""

from __future__ import annotations

import atexit
import faulthandler
import functools
import importlib.abc
import importlib.machinery
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from scout_slurm.bootstrap import selfcost
from scout_slurm.bootstrap.selfcost import COST
from scout_slurm.jobconfig import JobConfig
from scout_slurm.task import progress as progress_mod

if TYPE_CHECKING:  # the injection code is imported only when a job asks for a fault
    from scout_slurm.inject.spec import FaultSpec
    from scout_slurm.bootstrap.consensus import Consensus
    from scout_slurm.bootstrap.finite import FiniteWatch
    from scout_slurm.bootstrap.replay import Replay, RootTracker
    from scout_slurm.bootstrap.timing import Timing

# what the bootstrap swallows to keep the job running, for a debugging session (stdlib logging: the
# job's Python may lack structlog, and configuring it here would change the job's own logging)
_log = logging.getLogger("scout.bootstrap")

STACK_SIGNAL = signal.SIGRTMIN + 5
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "barrier", "all_to_all", "all_to_all_single", "reduce", "gather",
               "scatter", "send", "recv", "all_gather_object", "broadcast_object_list")


class _State:
    def __init__(self) -> None:
        self.config = JobConfig()         # the job's settings, read once (scout_slurm.jobconfig)
        self.progress_dir: Path | None = None
        self.checkpoints_dir: Path | None = None
        self.writer: progress_mod.ProgressWriter | None = None
        self.fault: FaultSpec | None = None
        self.restart = 0
        self.rank = -1
        self.world = 0
        self.skip_next_all_reduce = False
        self.default_pg: Any = None       # torch.distributed's default ProcessGroup (torch is imported lazily)
        self.installed: InstalledHooks | None = None
        self.consensus: Consensus | None = None
        self.replay: Replay | None = None            # when replay is on
        self.root_tracker: RootTracker | None = None  # sees the script's models at their first forward
        self.compute_fired = 0           # how often a compute fault corrupted a layer (training and replay)
        self.timing: Timing | None = None  # when timing votes are on
        self.timing_fault_fired = False  # delay/input_stall said and recorded once, then quiet
        self.finite: FiniteWatch | None = None  # where NaN/Inf began
        self.atrest: Any = None          # the at-rest witness (bootstrap.atrest), when on
        self.update: Any = None          # the optimizer update replay (bootstrap.update), when on
        self.update_fired = False        # an injected update fault said and recorded once, then quiet
        self.fired_step = -1             # the optimizer step after which the fault injector last fired
        self.originals: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.coverage_written: tuple | None = None  # what the run's coverage record last said
        self.final_vote = ""             # what the end-of-training vote did ("": not reached yet)
        self.banner_said = False         # the model banner, once, at the first optimizer step
        self.busy_depth = 0              # nested checkpoint saves/loads in progress (the record's busy mark)


STATE = _State()
# Set while a user's DDP comm hook runs: the collectives it calls are the bucket's own, already
# counted as one ddp_bucket_all_reduce, so the wrappers pass them through untouched.
_IN_USER_COMM_HOOK = threading.local()


class InstalledHooks:
    """A handle on everything patched: `remove()` puts the originals back."""

    def __init__(self) -> None:
        self._restore: list[tuple[Any, str, Any]] = []
        self._removers: list[Callable[[], None]] = []

    def patch(self, owner: Any, name: str, new: Any) -> None:
        self._restore.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def on_remove(self, fn: Callable[[], None]) -> None:
        self._removers.append(fn)

    def remove(self) -> None:
        for owner, name, old in reversed(self._restore):
            setattr(owner, name, old)
        self._restore.clear()
        for fn in self._removers:
            fn()
        self._removers.clear()
        STATE.installed = None


def _nbytes(obj: Any) -> int:
    try:
        if hasattr(obj, "element_size") and hasattr(obj, "numel"):
            return int(obj.numel()) * int(obj.element_size())
        if isinstance(obj, (list, tuple)):
            return sum(_nbytes(o) for o in obj[:64])
    except (AttributeError, TypeError, ValueError, RuntimeError) as exc:  # size is informative only
        _log.debug("size of a %s unknown: %r", type(obj).__name__, exc)
        return 0
    return 0


def _group_size(group: Any) -> int:
    try:
        if group is not None and hasattr(group, "size"):
            return int(group.size())
    except (AttributeError, TypeError, ValueError, RuntimeError) as exc:  # a group torch no longer knows
        _log.debug("size of group %r unknown: %r", group, exc)
    return STATE.world


def _pg_seq() -> int:
    pg = STATE.default_pg
    if pg is None:
        return -1
    try:
        return int(pg._get_sequence_number_for_group())
    except (AttributeError, TypeError, ValueError, RuntimeError) as exc:  # private API; progress works without it
        _log.debug("no sequence number from the default group: %r", exc)
        return -1


def _wrap_collective(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def scout_collective(*args, **kwargs):
        w = STATE.writer
        if w is None or getattr(_IN_USER_COMM_HOOK, "active", False):
            return fn(*args, **kwargs)
        if name == "all_reduce" and STATE.skip_next_all_reduce:
            STATE.skip_next_all_reduce = False
            return None  # injected desync: this rank silently skips one all_reduce
        group = kwargs.get("group")
        if group is not None and type(group).__name__ == "RecordingGroup":
            kwargs["group"] = group.wrapped  # `ddp.process_group` passed by the job: recorded here, once
        timed = COST.sample()
        t0 = selfcost.clock() if timed else 0
        seq = w.enter(name, _nbytes(args[0]) if args else 0, _group_size(kwargs.get("group")), _pg_seq())
        t1 = selfcost.clock() if timed else 0
        try:
            return fn(*args, **kwargs)
        finally:
            t2 = selfcost.clock() if timed else 0
            w.leave(seq)
            if timed:
                COST.sampled_ns += t1 - t0 + selfcost.clock() - t2
    scout_collective.__scout_original__ = fn
    return scout_collective


def _scout_side(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def scout_side_collective(*args, **kwargs):
        w = STATE.writer
        if w is None:
            return fn(*args, **kwargs)
        seq = w.enter("scout_vote", _nbytes(args[0]) if args else 0, _group_size(kwargs.get("group")))
        try:
            return fn(*args, **kwargs)
        finally:
            w.leave(seq)
    scout_side_collective.__scout_original__ = fn
    return scout_side_collective


def _opened_writer(rank: int, world: int) -> None:
    if STATE.progress_dir is None or STATE.writer is not None:
        return
    path = STATE.progress_dir / f"rank-{rank}.bin"
    if not path.exists():
        progress_mod.create(path)
    STATE.writer = progress_mod.ProgressWriter(path, rank=rank, world_size=world)
    STATE.rank, STATE.world = rank, world
    atexit.register(STATE.writer.deactivate)
    atexit.register(_at_exit)  # runs first (last registered)


def _patch_distributed(handle: InstalledHooks, dist: Any) -> None:
    c10d = dist.distributed_c10d
    original_init = c10d.init_process_group
    original_all_reduce = c10d.all_reduce
    # scout's own collectives (votes, replay, checkpoint agreement) on its side group: not the job's,
    # but in the progress record as `scout_vote`, so that when a rank never arrives the ranks waiting
    # there are seen inside a collective and the missing one is seen behind
    STATE.originals.update(all_gather=_scout_side(c10d.all_gather), barrier=_scout_side(c10d.barrier),
                           all_reduce=_scout_side(original_all_reduce),
                           broadcast=_scout_side(c10d.broadcast))
    late_done: list[bool] = []

    @functools.wraps(original_init)
    def scout_init_process_group(*args, **kwargs):
        progress_mod.mark_entering_init(STATE.progress_dir)  # before the rendezvous (task/stallclock.py); never raises
        result = original_init(*args, **kwargs)
        try:
            STATE.default_pg = c10d._get_default_group()
            _opened_writer(c10d.get_rank(), c10d.get_world_size())
            _start_consensus()
            _start_timing()
            _start_root_tracker()
            if not late_done:
                late_done.append(True)
                _patch_ddp(handle, original_all_reduce=original_all_reduce)
                _patch_optimizer(handle)
                _patch_save(handle)
                _patch_busy(handle)
        except Exception as exc:  # noqa: BLE001 - never break the job
            sys.stderr.write(f"scout: cannot open the progress record: {exc!r}\n")
        return result

    original_destroy = c10d.destroy_process_group

    @functools.wraps(original_destroy)
    def scout_destroy_process_group(*args, **kwargs):
        everything = (not args or args[0] is None) and kwargs.get("group") is None
        if STATE.writer is not None and everything:
            STATE.writer.deactivate()  # done with collectives: the watchdog stops watching for stalls
        if everything and not STATE.final_vote:
            _end_of_training()
        result = original_destroy(*args, **kwargs)
        if everything:
            _release_side_groups()
        return result

    for owner in (dist, c10d):
        handle.patch(owner, "init_process_group", scout_init_process_group)
        handle.patch(owner, "destroy_process_group", scout_destroy_process_group)
    for name in COLLECTIVES:
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        wrapped = _wrap_collective(name, fn)
        handle.patch(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            handle.patch(dist, name, wrapped)


def _release_side_groups() -> None:
    """After destroy_process_group(): drop scout's references to its side groups and free them
    now, while the interpreter is whole. A gloo group still referenced at interpreter exit is torn
    down during finalisation, where its worker threads can abort the process (SIGABRT, "terminate
    called without an active exception", pytorch/pytorch#179291): a crash of scout's making on a
    job that finished. A later init_process_group starts votes, replay and timing afresh."""
    import gc
    STATE.consensus = STATE.replay = STATE.timing = STATE.atrest = STATE.update = None
    STATE.default_pg = None  # the job's own default group, held for its sequence number
    from scout_slurm.bootstrap import ckptstate
    if ckptstate.WATCH is not None:
        ckptstate.WATCH.side = None
    gc.collect()


def _patch_ddp(handle: InstalledHooks, original_all_reduce: Callable) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    def scout_default_hook(state, bucket):  # no annotations: DDP checks them
        w = STATE.writer
        group = state if state is not None else STATE.default_pg
        tensor = bucket.buffer()
        size = _group_size(group)
        # as DDP's built-in path does (gradient times 1/size while filling the bucket), not div_:
        # x / 3 and x * (1/3) round differently, and the job must get the same bits as without scout
        tensor.mul_(1.0 / size)
        seq = w.enter("ddp_bucket_all_reduce", _nbytes(tensor), size, _pg_seq()) if w else 0
        fut = original_all_reduce(tensor, group=state, async_op=True).get_future()

        def done(f):
            if w:
                w.leave(seq)
            return f.value()[0]
        return fut.then(done)

    original_register = DDP.register_comm_hook

    @functools.wraps(original_register)
    def scout_register_comm_hook(self, state, hook):
        def composed(st, bucket):
            w = STATE.writer
            seq = w.enter("ddp_bucket_all_reduce", _nbytes(bucket.buffer()), STATE.world, _pg_seq()) if w else 0
            _IN_USER_COMM_HOOK.active = True
            try:
                fut = hook(st, bucket)
            finally:
                _IN_USER_COMM_HOOK.active = False

            def done(f):
                if w:
                    w.leave(seq)
                return f.value()
            return fut.then(done)
        self._scout_hooked = True
        from scout_slurm.bootstrap import pgwrap
        pgwrap.USER_HOOKS = True   # the recording wrapper asks whether a bucket is this hook's from now on
        return original_register(self, state, composed)

    original_init = DDP.__init__

    @functools.wraps(original_init)
    def scout_ddp_init(self, module, *args, **kwargs):
        # DDP reduces through a recording wrapper of its group: its own C++ path stays (no comm hook, no
        # extra pass over the gradients) and each bucket still lands in the progress record (pgwrap;
        # its docstring says why every collective of the wrapper is passed on from Python)
        if STATE.writer is not None and kwargs.get("device_mesh") is None and len(args) < 6:
            try:
                from scout_slurm.bootstrap import pgwrap
                group = kwargs.get("process_group") or STATE.default_pg
                kwargs["process_group"] = pgwrap.wrap(group, lambda: STATE.writer, _in_user_comm_hook)
            except Exception as exc:  # noqa: BLE001 - then the comm hook at first forward records the buckets
                sys.stderr.write(f"scout: DDP's group not wrapped, its comm hook records the buckets: {exc!r}\n")
        original_init(self, module, *args, **kwargs)

    original_forward = DDP.forward

    @functools.wraps(original_forward)
    def scout_forward(self, *args, **kwargs):
        if STATE.consensus is not None:
            STATE.consensus.track(self)
        settle = getattr(self.process_group, "settle", None)   # the recording wrapper (pgwrap)
        if settle is not None:
            settle()
        if not getattr(self, "_scout_hooked", False):
            self._scout_hooked = True
            if STATE.writer is not None and type(self.process_group).__name__ != "RecordingGroup":
                try:
                    original_register(self, self.process_group, scout_default_hook)
                except Exception as exc:  # noqa: BLE001
                    sys.stderr.write(f"scout: DDP comm hook not installed: {exc!r}\n")
        return original_forward(self, *args, **kwargs)

    handle.patch(DDP, "register_comm_hook", scout_register_comm_hook)
    handle.patch(DDP, "forward", scout_forward)
    handle.patch(DDP, "__init__", scout_ddp_init)


def _in_user_comm_hook() -> bool:
    return getattr(_IN_USER_COMM_HOOK, "active", False)


def _patch_optimizer(handle: InstalledHooks) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    @selfcost.timed
    def scout_pre_step_hook(optimizer, args, kwargs):
        if not STATE.banner_said:
            STATE.banner_said = True
            try:
                _model_banner()
            except Exception as exc:  # noqa: BLE001 - never break the job for a banner
                sys.stderr.write(f"scout: model banner not printed: {exc!r}\n")
        if STATE.atrest is not None and STATE.writer is not None and STATE.atrest.sealed is not None:
            if STATE.timing is not None:
                STATE.timing.pause()
            STATE.atrest.check(STATE.writer.steps + 1, optimizer, STATE.originals["all_gather"],
                               STATE.originals["barrier"])
            if STATE.timing is not None:
                STATE.timing.resume()
        u = STATE.update
        if u is not None and STATE.writer is not None and u.every > 0 and (STATE.writer.steps + 1) % u.every == 0:
            u.before_step(STATE.writer.steps + 1, optimizer)   # a slice of the update's inputs (not due: no call)
        # replay before the step: the weights are still those this step's forward used
        r = STATE.replay
        if r is not None and STATE.writer is not None:
            step = STATE.writer.steps + 1
            if step >= r.next_call:   # only at the steps where it has work (the replay says which)
                # scout's own work is not the job's compute (in the other steps, the replay only sets hooks)
                paused = STATE.timing is not None and r.due(step)
                if paused:
                    STATE.timing.pause()
                r.before_step(step)
                if paused:
                    STATE.timing.resume()

    @selfcost.timed
    def scout_step_hook(optimizer, args, kwargs):
        w = STATE.writer
        if w is None:
            return
        step = w.step()
        c, timing = STATE.consensus, STATE.timing
        # scout's own work from here is not the job's compute: at the steps where it does any (a vote,
        # the at-rest seal, a timing round); in the others it is a few checks (and the clock reads cost)
        if timing is not None and (timing.due(step) or (c is not None and c.every > 0 and step % c.every == 0)):
            timing.pause()
        fault = STATE.fault
        if fault is not None and fault.target == "update" and fault.applies(STATE.rank, step, STATE.restart):
            _fire_update(fault, optimizer)   # a fault in the update itself: part of what the step wrote
        # the periodic witnesses are called only at their steps (a call a step costs more than its check)
        a, u = STATE.atrest, STATE.update
        if a is not None and a.every > 0 and step % a.every == 0:   # first: the state as the optimizer left it
            a.seal(step, optimizer)
        if u is not None and u.every > 0 and step % u.every == 0:
            u.after_step(step, optimizer)
        COST.stepped(w.last_step_ns)
        if step % selfcost.COST_EVERY == 0:
            selfcost.write(STATE.config.run_dir, STATE.rank, STATE.restart)
        if STATE.root_tracker is not None:  # the models have run their first forward by now
            STATE.root_tracker.remove()
            STATE.root_tracker = None
        if fault is not None and not fault.is_compute and fault.target != "update" and \
                fault.applies(STATE.rank, step, STATE.restart):
            _fire(fault, optimizer)
        if STATE.finite is not None:
            STATE.finite.after_step(step)
        if c is not None:
            c.maybe_vote(step, optimizer, STATE.originals["all_gather"], STATE.originals["barrier"])
        if timing is not None:
            timing.after_step(step)
        if STATE.rank == 0:
            _write_coverage()

    h = register_optimizer_step_post_hook(scout_step_hook)
    handle.on_remove(h.remove)
    h_pre = register_optimizer_step_pre_hook(scout_pre_step_hook)
    handle.on_remove(h_pre.remove)


def _digest_from_storage(path: str) -> str:
    """sha256 of the file as storage gives it back after fsync (not of what we meant to write)."""
    import hashlib
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return ""


def _versions() -> str:
    import platform
    try:
        import torch
        tv = torch.__version__
    except ImportError as exc:
        _log.debug("torch not importable for the versions line: %r", exc)
        tv = "?"
    import scout_slurm
    return f"python {platform.python_version()}, torch {tv}, scout {getattr(scout_slurm, '__version__', '?')}"


def note_checkpoint(path: str | os.PathLike, *, step: int | None = None, saver: str = "note") -> None:
    """Tell scout that a checkpoint was written (the explicit call for custom savers). The
    note goes to the job's evidence folder; the recovery rule picks among these."""
    notes_dir = STATE.checkpoints_dir
    if notes_dir is None:
        return
    from scout_slurm.bootstrap import ckptstate
    if ckptstate.WATCH is not None:  # the full record: signatures, replicas' agreement, coverage
        ckptstate.WATCH.saved(os.fspath(path), saver=saver, step=step)
        return
    from scout_slurm.evidence.store import write_record
    from scout_slurm.remediation.records import CheckpointNote
    target = os.path.abspath(os.fspath(path))
    try:
        size = os.stat(target).st_size
    except OSError:
        return
    if step is None:
        # steps of this run, counted from the checkpoint it resumed from
        step = (STATE.writer.steps + STATE.config.step_offset) if STATE.writer is not None else -1
    note = CheckpointNote(path=target, step=int(step), rank=STATE.rank, restart=STATE.restart,
                          saved_at=time.time(), size_bytes=size, sha256=_digest_from_storage(target),
                          versions=_versions())
    try:
        notes_dir.mkdir(parents=True, exist_ok=True)
        write_record(notes_dir / f"run-{STATE.restart}-step-{int(step)}-rank-{STATE.rank}.json", note)
    except Exception as exc:  # noqa: BLE001 - never break the job for a note
        sys.stderr.write(f"scout: checkpoint note not written: {exc!r}\n")


def _patch_save(handle: InstalledHooks) -> None:
    import torch

    original_save = torch.save

    @functools.wraps(original_save)
    def scout_save(obj, f, *args, **kwargs):
        result = original_save(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)):
            if not os.path.basename(os.fspath(f)).startswith("."):
                note_checkpoint(f, saver="torch.save")
            else:
                _saved_hidden(f)
        return result

    handle.patch(torch, "save", scout_save)
    from scout_slurm.bootstrap import ckptstate  # DCP saves, loads, schedulers, the replicas' agreement
    ckptstate.install(handle, STATE)


def _patch_busy(handle: InstalledHooks) -> None:
    """torch.save and torch.load mark the progress record busy while they run: a rank writing or
    reading a large checkpoint is busy, not hung (the watchdog gives it the start-up limit,
    task/stallclock.py). Outermost, so scout's own re-read of a saved file counts too."""
    import torch
    lock = threading.Lock()  # saves may run in several threads (asynchronous checkpointing)

    def busy(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def scout_busy(*args, **kwargs):
            w = STATE.writer
            if w is None:
                return fn(*args, **kwargs)
            with lock:
                STATE.busy_depth += 1
                if STATE.busy_depth == 1:
                    w.set_busy(True)
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    STATE.busy_depth -= 1
                    if STATE.busy_depth == 0:
                        w.set_busy(False)
        return scout_busy

    handle.patch(torch, "save", busy(torch.save))
    handle.patch(torch, "load", busy(torch.load))


def _model_banner() -> None:
    """The one line (rank 0) saying what scout found in the job and what it checks: the framework,
    the replica groups, what is voted, replayed and timed, and what is not. Said at the first
    optimizer step, the first moment the models are known (they ran their first forward), also in
    a job shorter than the vote interval. Every rank computes the groups (the same on all)."""
    from scout_slurm.bootstrap.replay import framework_seen, optimizer_not_voted, replica_layout
    roots = STATE.root_tracker.roots if STATE.root_tracker is not None else []
    groups, how = replica_layout(roots, STATE.world) if roots else ([tuple(range(STATE.world))], "")
    c, r, t = STATE.consensus, STATE.replay, STATE.timing
    skipped = optimizer_not_voted(roots)
    if c is not None and c.groups is None and roots:
        c.groups, c.optimizer_skipped = groups, skipped
    if STATE.rank != 0:
        return
    if c is None:
        voted = "state votes off" if STATE.world >= 2 else "no state votes (one rank)"
    elif not roots:
        voted = "no state votes (no model to sign)"
    elif not any(len(g) >= 2 for g in groups):
        voted = "no state votes (no two ranks hold the same state)"
    else:
        voted = (f"voted every {c.every} steps: weights, " + ("" if skipped else "optimizer state, ")
                 + "where NaN/Inf began" + (f" ({skipped})" if skipped else ""))
    replayed = ("in-situ replay off" if r is None else "nothing replayed (no model seen)" if not roots
                else f"replayed every {r.every} steps (layers below)")
    timed = (f"step timing voted every {t.rules.every} steps" if t is not None else "timing votes off")
    a = STATE.atrest
    rest = ("at-rest witness off" if a is None else
            f"at-rest witness in its first window, then left to the state votes if they sign all the optimizer "
            f"holds ({min(len(g) for g in groups)}+ replicas)"
            if a.mode == "auto" and c is not None and _votes_cover_rest() else
            f"each rank's own weights and optimizer state re-signed at rest across one step in {a.every}")
    sys.stderr.write(
        f"scout: framework: {framework_seen(roots)}; replica groups {[list(g) for g in groups]}"
        + (f" ({how})" if how else " (no model seen: all ranks taken as replicas)")
        + f"; {voted}; {replayed}; {rest}; {timed}; stalls timed from this first optimizer step on "
        "(before it, the start-up limit)\n")
    sys.stderr.flush()


def _saved_hidden(f: Any) -> None:
    """A torch.save to a hidden name (".NAME.tmp"): no checkpoint yet; recorded when renamed to a visible name."""
    from scout_slurm.bootstrap import ckptstate
    if ckptstate.WATCH is not None:
        try:
            ckptstate.WATCH.saved_hidden(f, saver="torch.save")
        except Exception as exc:  # noqa: BLE001 - never break the job for a note
            sys.stderr.write(f"scout: hidden save {os.fspath(f)!r} not followed: {exc!r}\n")


def _patch_renames(handle: InstalledHooks) -> None:
    """os.rename, os.replace and shutil.move (pathlib's rename and replace call os's): a checkpoint
    written under one name and renamed (the atomic save) keeps its record under the name it ends up
    with. Patched at install, before the script runs, so that a script's `from os import replace`
    gets the patched one too."""
    import shutil

    from scout_slurm.bootstrap import ckptstate
    handle.patch(os, "rename", _following_renames(os.rename, ckptstate, returns_dest=False))
    handle.patch(os, "replace", _following_renames(os.replace, ckptstate, returns_dest=False))
    handle.patch(shutil, "move", _following_renames(shutil.move, ckptstate, returns_dest=True))


def _following_renames(fn: Callable, ckptstate: Any, *, returns_dest: bool) -> Callable:
    @functools.wraps(fn)
    def scout_rename(*args, **kwargs):
        result = fn(*args, **kwargs)  # the job's rename: its result and its errors, untouched
        watch = ckptstate.WATCH
        if watch is not None and watch.names:  # nothing recorded yet: nothing to follow
            try:
                src = args[0] if args else kwargs["src"]
                dst = result if returns_dest and isinstance(result, (str, bytes, os.PathLike)) else (
                    args[1] if len(args) > 1 else kwargs["dst"])
                if not kwargs or (kwargs.get("src_dir_fd") is None and kwargs.get("dst_dir_fd") is None):
                    watch.moved(src, dst)  # relative to a folder descriptor (scout's own records): not followed
            except Exception as exc:  # noqa: BLE001 - never break the job for a note
                sys.stderr.write(f"scout: rename not followed in the checkpoint records: {exc!r}\n")
        return result
    scout_rename.__scout_original__ = fn
    return scout_rename


def _record_injection(fault: FaultSpec) -> None:
    """An INFO finding with the moment of injection, so detection latency can be measured."""
    run_dir = STATE.config.run_dir
    if not run_dir:
        return
    try:
        from scout_slurm.evidence.records import Finding, FindingKind
        from scout_slurm.evidence.store import write_record
        now = time.time()
        write_record(run_dir / "findings" / f"injected-rank-{STATE.rank}-{int(now * 1000)}.json",
                     Finding(rank=STATE.rank, node=STATE.config.node, kind=FindingKind.FAULT_INJECTED,
                             at=now, summary=f"fault injected: {fault.kind}", step=fault.step))
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"scout: injection not recorded: {exc!r}\n")


def _start_consensus() -> None:
    cfg = STATE.config
    if cfg.consensus_every <= 0 or STATE.world < 2 or STATE.consensus is not None:
        return
    from scout_slurm.bootstrap.consensus import Consensus
    STATE.consensus = Consensus(every=cfg.consensus_every, rank=STATE.rank, world=STATE.world,
                                run_dir=cfg.run_dir, node=cfg.node, offset=cfg.step_offset,
                                restart=cfg.restart, sdc_policy=cfg.sdc_policy.value)
    STATE.consensus.on_vote = _write_coverage
    if cfg.at_rest != "off":
        from scout_slurm.bootstrap.atrest import AtRest
        STATE.atrest = AtRest(every=cfg.consensus_every, rank=STATE.rank, world=STATE.world,
                              side=STATE.consensus.side, run_dir=cfg.run_dir, node=cfg.node,
                              offset=cfg.step_offset, sdc_policy=cfg.sdc_policy.value,
                              voted=STATE.consensus.voted_parameters, mode=cfg.at_rest, covered=_votes_cover_rest)
        STATE.consensus.presigned = _presigned
    if cfg.update_replay != "off":
        from scout_slurm.bootstrap.replay import replica_layout
        from scout_slurm.bootstrap.update import UpdateReplay
        consensus = STATE.consensus
        STATE.update = UpdateReplay(every=cfg.consensus_every, rank=STATE.rank, world=STATE.world,
                                    side=consensus.side, run_dir=cfg.run_dir, node=cfg.node,
                                    originals=STATE.originals, offset=cfg.step_offset,
                                    sdc_policy=cfg.sdc_policy.value, max_bytes=cfg.update_max_bytes,
                                    mode=cfg.update_replay,
                                    layout=lambda: replica_layout(consensus.modules, STATE.world)[0],
                                    corrupt=_corrupt_recomputed_update)
    if cfg.replay_every > 0:
        from scout_slurm.bootstrap.replay import Replay
        STATE.replay = Replay(every=cfg.replay_every, rank=STATE.rank, world=STATE.world, side=STATE.consensus.side,
                              run_dir=cfg.run_dir, node=cfg.node,
                              originals=STATE.originals, current_step=_current_step,
                              max_bytes=cfg.replay_max_bytes, offset=cfg.step_offset,
                              sdc_policy=cfg.sdc_policy.value)
    if cfg.finite_check and STATE.installed is not None:
        from scout_slurm.bootstrap.finite import FiniteWatch
        STATE.finite = FiniteWatch(offset=STATE.consensus.offset, on_first=_note_first_nonfinite)
        STATE.finite.install(STATE.installed)
        STATE.consensus.first_nonfinite = STATE.finite.resolve


def _note_first_nonfinite(gstep: int) -> None:
    """This rank's own note (evidence, not a verdict): the vote decides who was first."""
    sys.stderr.write(f"scout: rank {STATE.rank}'s loss is non-finite (NaN/Inf) since step {gstep}\n")
    run_dir = STATE.config.run_dir
    if not run_dir:
        return
    from scout_slurm.evidence.records import Finding, FindingKind
    from scout_slurm.evidence.store import write_record
    write_record(run_dir / "findings" / f"nonfinite-rank-{STATE.rank}.json",
                 Finding(rank=STATE.rank, node=STATE.config.node, kind=FindingKind.INFO,
                         at=time.time(), summary=f"rank {STATE.rank}'s loss is non-finite since step {gstep}",
                         step=gstep))


def _start_timing() -> None:
    if STATE.timing is not None or STATE.world < 2:
        return
    from scout_slurm.bootstrap.timing import start_timing
    cfg = STATE.config
    STATE.timing = start_timing(rank=STATE.rank, world=STATE.world,
                                side=STATE.consensus.side if STATE.consensus is not None else None,
                                writer=STATE.writer, run_dir=cfg.run_dir, node=cfg.node, rules=cfg.timing,
                                offset=cfg.step_offset)


def _end_of_training() -> None:
    """At destroy_process_group (every rank): the replicas vote on their state once more, so the
    final model is checked even in a run shorter than K steps; the coverage record says what ran.
    Not while an exception is being raised (a `finally:` after a failure: no collective then)."""
    c = STATE.consensus
    if sys.exc_info()[0] is not None:
        STATE.final_vote = f"not made: destroy_process_group ran while {sys.exc_info()[0].__name__} was raised"
    elif c is None:
        STATE.final_vote = "not made: state votes are off" if STATE.world >= 2 else "not made: one rank"
    else:
        timeout = STATE.config.final_vote_timeout_s  # every rank must reach destroy_process_group within it
        if STATE.timing is not None:
            STATE.timing.pause()
        try:
            STATE.final_vote = c.final_vote(STATE.originals["all_gather"], STATE.originals["barrier"],
                                            timeout_s=timeout)
        except Exception as exc:  # noqa: BLE001 - never break the job's teardown
            STATE.final_vote = f"not made: {exc!r}"[:200]
        # every rank is here only when this vote gathered them and none is leaving (not when the last
        # periodic vote made it unneeded): then the timing of the steps since the last round counts too
        if STATE.timing is not None and STATE.final_vote.startswith("at step") and "disagreed" not in STATE.final_vote:
            last = STATE.timing.last_step
            try:
                if STATE.timing.final_round(c.steps):
                    STATE.final_vote += f"; a last timing round over steps {last + 1}-{c.steps}"
            except Exception as exc:  # noqa: BLE001
                STATE.final_vote += f"; the last timing round failed: {exc!r}"[:200]
    _write_coverage(force=True)
    selfcost.write(STATE.config.run_dir, STATE.rank, STATE.restart)
    # the models and optimizer scout held for this vote: freed before the groups go (a DDP object
    # alive during destroy_process_group can deadlock gloo's teardown: TORCH-FACTS)
    if c is not None:
        c.optimizer, c.modules = None, []
    if STATE.replay is not None:
        STATE.replay.roots, STATE.replay.layers = [], []
    import gc
    gc.collect()


def _at_exit() -> None:
    """The interpreter ends: a script that never called destroy_process_group got no final vote."""
    if not STATE.final_vote and STATE.writer is not None:
        STATE.final_vote = "not made: the process ended without reaching destroy_process_group"
        _write_coverage(force=True)
        selfcost.write(STATE.config.run_dir, STATE.rank, STATE.restart)


def _write_coverage(*, force: bool = False) -> None:
    """The lowest rank's record of which checks ran in this run (runs/N/votes.json), written when
    a count changed: after a vote, a replay or a timing round, and at the end of training."""
    if STATE.rank != 0:
        return
    c, r, t = STATE.consensus, STATE.replay, STATE.timing
    u, a = STATE.update, STATE.atrest
    key = (c.votes if c else 0, r.replays if r else None, r.failed_rounds if r else 0, t.rounds if t else 0,
           STATE.final_vote, u.rounds if u is not None and not (u.off and not u.rounds) else None,
           a.checks if a is not None else None, a.off if a is not None else "")
    if key == STATE.coverage_written and not force:
        return
    STATE.coverage_written = key
    run_dir = STATE.config.run_dir
    if not run_dir:
        return
    offset = STATE.config.step_offset
    votes_every = c.every if c else STATE.config.consensus_every
    try:
        from scout_slurm.evidence.records import VoteCoverage
        from scout_slurm.evidence.store import write_record
        write_record(run_dir / "votes.json", VoteCoverage(
            restart=STATE.restart, votes=key[0], last_clean_step=c.last_clean if c else -1,
            last_vote_step=c.last_vote_step if c else -1, replay_rounds=key[1], replay_failed_rounds=key[2],
            timing_rounds=key[3], votes_every=votes_every if c else 0, replay_every=r.every if r else 0,
            timing_every=t.rules.every if t else 0,
            steps=(STATE.writer.steps + offset) if STATE.writer is not None else -1, final_vote=STATE.final_vote,
            replicas=max((len(g) for g in c.groups), default=0) if c is not None and c.groups else 0,
            update_rounds=key[5], at_rest_windows=key[6], at_rest_stopped=key[7]))
    except Exception as exc:  # noqa: BLE001 - coverage is evidence, never a reason to fail the job
        sys.stderr.write(f"scout: coverage record not written: {exc!r}\n")


def _current_step() -> int:
    """The optimizer step being computed now (1-based): forward, backward, and the replay before it."""
    return STATE.writer.steps + 1 if STATE.writer is not None else 0


def _on_root(module: Any) -> None:
    """A model (DDP or FSDP2 root) ran its first forward: votes, replay and compute faults attach."""
    w = STATE.writer
    if w is not None:  # a forward is progress: an evaluation loop without collectives is not idle
        from scout_slurm.bootstrap.replay import inner  # the user's model: also when called past its wrapper
        inner(module).register_forward_pre_hook(lambda _m, _a: w.beat())
    if STATE.consensus is not None:
        STATE.consensus.track(module)
    if STATE.replay is not None:
        STATE.replay.add_root(module)
    fault = STATE.fault
    if fault is not None and fault.is_compute and (fault.rank is None or fault.rank == STATE.rank):
        from scout_slurm.bootstrap.replay import attach_compute_fault
        said = attach_compute_fault(module, fault, STATE.rank, STATE.restart, _current_step, _compute_fired,
                                    lambda: STATE.replay is not None and STATE.replay.replaying)
        sys.stderr.write(f"scout: {said}\n")


def _compute_fired(what: str) -> None:
    STATE.compute_fired += 1
    if STATE.compute_fired == 1:  # said and recorded once: a recurring fault fires every step
        fault = STATE.fault
        sys.stderr.write(f"scout: injecting fault {fault.kind} into {fault.target} on rank {STATE.rank} at step "
                         f"{_current_step()}: {what}\n")
        _record_injection(fault)


def _start_root_tracker() -> None:
    if STATE.root_tracker is None:  # also without votes: the banner names the framework, forwards beat
        from scout_slurm.bootstrap.replay import RootTracker
        STATE.root_tracker = RootTracker(_on_root)


def _corrupt(fault: FaultSpec, optimizer: Any) -> str:
    """Change one element of the first parameter (or of the optimizer's first state tensor)."""
    from scout_slurm.inject.corrupt import corrupt_
    if fault.target == "optimizer":
        from scout_slurm.bootstrap.consensus import optimizer_tensors
        tensors = optimizer_tensors(optimizer)
        if not tensors:
            return "optimizer has no state tensors (e.g. SGD without momentum): nothing corrupted"
        name, t = tensors[0]
    else:
        name, t = "param0", _first_weight(optimizer)
    return f"{fault.target} {name}" + corrupt_(t, fault, seed=1_000_003 * STATE.rank + fault.step)


def _fire_update(fault: FaultSpec, optimizer: Any) -> None:
    """An injected fault in this rank's optimizer update: what the step wrote, changed before scout
    signs anything. Said and recorded at its first firing; a recurring one stays quiet after."""
    from scout_slurm.inject.corrupt import corrupt_
    STATE.fired_step = STATE.writer.steps if STATE.writer is not None else -1
    what = corrupt_(optimizer.param_groups[0]["params"][0], fault, seed=1_000_003 * STATE.rank + STATE.fired_step)
    if not STATE.update_fired:
        STATE.update_fired = True
        sys.stderr.write(f"scout: injecting fault {fault.kind} into the optimizer update on rank {STATE.rank} at step "
                         f"{STATE.fired_step}: param0{what}\n")
        _record_injection(fault)


def _corrupt_recomputed_update(step: int, param: int, lo: int, t: Any) -> None:
    """The same fault in this rank's recomputation of an update (scout's update replay), unless it
    is transient: a faulty unit computes every update wrongly, its own and others' alike."""
    fault = STATE.fault
    if fault is None or fault.target != "update" or fault.transient or param != 0 or \
            not fault.applies(STATE.rank, step, STATE.restart):
        return
    import dataclasses

    from scout_slurm.inject.corrupt import corrupt_
    if fault.kind == "noise" or lo <= fault.element < lo + t.numel():
        corrupt_(t, dataclasses.replace(fault, element=max(0, fault.element - lo)),
                 seed=7 + 1_000_003 * STATE.rank + step)


def _first_weight(optimizer: Any) -> Any:
    """The first parameter of the model this rank holds: under DeepSpeed ZeRO the optimizer's
    parameters are this rank's flat partition (held by no other rank), so the model's own."""
    from scout_slurm.bootstrap.replay import inner, is_deepspeed
    roots = STATE.consensus.modules if STATE.consensus is not None else []
    for root in roots:
        if is_deepspeed(root):
            return next(inner(root).parameters())
    return optimizer.param_groups[0]["params"][0]


def _votes_cover_rest() -> str:
    """Why the state votes name any change at rest by majority ("": they do not): every replica
    group has 3 or more ranks and the optimizer state is voted. The same on every rank (the groups
    and what is voted come from the models alone); the at-rest witness adds, in its first window's
    exchange, that the optimizer holds exactly the voted parameters."""
    c = STATE.consensus
    smallest = min((len(g) for g in c.groups or ()), default=1) if c is not None else 1
    if smallest < 3 or c.optimizer_skipped:
        return ""
    return (f"left to the state votes: every replica group has {smallest} or more ranks, so a change at rest persists "
            "into the next vote, which names the rank by majority")


def _presigned(step: int, optimizer: Any) -> tuple[int, int] | None:
    """The at-rest seal of `step`, for the state vote of the same step: unless the fault injector
    fired in between (it changes the state after the seal, before the vote, on purpose)."""
    if STATE.atrest is None or STATE.fired_step == step:
        return None
    return STATE.atrest.signed_at(step, optimizer)


def _exit_with(code: int) -> NoReturn:
    """The `exit` fault: the process ends with `code`, its atexit handlers run as at sys.exit
    (scout's close the progress record and write the coverage), and then it stops there. The
    interpreter's teardown after them, with gloo's threads still running, sometimes aborted the
    process in torch's C++ destructors (SIGABRT, "terminate called without an active exception";
    seen in CI on tests/torch/test_bootstrap.py): the fault asked for an exit code, not a signal."""
    from scout_slurm.bootstrap.exitpolicy import flush_and_exit
    atexit._run_exitfuncs()
    flush_and_exit(code)


def _fire(fault: FaultSpec, optimizer: Any = None) -> None:
    from scout_slurm.inject.spec import NUMERIC_FAULTS, TIMING_FAULTS
    STATE.fired_step = STATE.writer.steps if STATE.writer is not None else -1
    if fault.kind in TIMING_FAULTS and STATE.timing_fault_fired:
        time.sleep(fault.seconds)  # a recurring delay: said and recorded at its first firing only
        return
    STATE.timing_fault_fired = fault.kind in TIMING_FAULTS
    sys.stderr.write(f"scout: injecting fault {fault.kind} on rank {STATE.rank} at step {fault.step}\n")
    sys.stderr.flush()
    _record_injection(fault)
    kind = fault.kind
    if kind in NUMERIC_FAULTS:
        what = _corrupt(fault, optimizer)
        sys.stderr.write(f"scout: corrupted {what}\n")
    elif kind in ("sleep", *TIMING_FAULTS):
        time.sleep(fault.seconds)
    elif kind == "spin":
        deadline = time.monotonic() + fault.seconds
        x = 0
        while time.monotonic() < deadline:
            x += 1
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "skip_allreduce":
        STATE.skip_next_all_reduce = True
    elif kind == "exit":
        _exit_with(fault.code)
    elif kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "segv":
        import ctypes
        ctypes.string_at(0)
    elif kind == "raise":
        raise RuntimeError(f"scout injected exception at step {fault.step}")


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after a module executes, before user code sees it."""

    def __init__(self, targets: dict[str, Callable[[Any], None]]) -> None:
        self.targets = targets

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.targets:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        patch = self.targets.pop(fullname)
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            try:
                patch(module)
            except Exception as exc:  # noqa: BLE001 - never break the import
                sys.stderr.write(f"scout: cannot hook {fullname}: {exc!r}\n")
        loader.exec_module = exec_module
        return spec


def install(progress_dir: Path | None, *, fault: FaultSpec | None = None, restart: int = 0,
            checkpoints_dir: Path | None = None, config: JobConfig | None = None) -> InstalledHooks:
    """Install the hooks (idempotent). torch.distributed is patched now if already imported,
    else right after it is imported. `config`: the job's settings (default: scout's defaults)."""
    with STATE.lock:
        if STATE.installed is not None:
            return STATE.installed
        STATE.config = config if config is not None else JobConfig()
        STATE.progress_dir = progress_dir
        STATE.checkpoints_dir = checkpoints_dir
        STATE.fault = fault
        STATE.restart = restart
        handle = InstalledHooks()
        STATE.installed = handle
    if checkpoints_dir is not None:
        try:
            _patch_renames(handle)
        except Exception as exc:  # noqa: BLE001 - never break the job
            sys.stderr.write(f"scout: renames of checkpoints not followed: {exc!r}\n")

    def on_distributed(dist: Any) -> None:
        if not dist.is_available():
            return
        _patch_distributed(handle, dist)

    if "torch.distributed" in sys.modules:
        on_distributed(sys.modules["torch.distributed"])
    else:
        finder = _PatchAfterImport({"torch.distributed": on_distributed})
        sys.meta_path.insert(0, finder)
        handle.on_remove(lambda: finder in sys.meta_path and sys.meta_path.remove(finder))
    return handle


def install_from_config(config: JobConfig) -> InstalledHooks:
    """The bootstrap's entry (site/sitecustomize.py): the job's settings, read once by
    `scout_slurm.jobconfig.load()`, passed down from here."""
    if config.stacks_file is not None:
        fh = open(config.stacks_file, "a", buffering=1)  # kept open for faulthandler for the process's life
        faulthandler.register(STACK_SIGNAL, file=fh, all_threads=True, chain=False)
    return install(config.progress_dir, fault=config.inject, restart=config.restart,
                   checkpoints_dir=config.checkpoints_dir, config=config)
