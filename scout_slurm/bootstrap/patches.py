"""scout's patches of torch inside the training process: torch.distributed's Python collectives,
init/destroy_process_group, DDP, the optimizer step, torch.save/load and renames. Each patch only
forwards the event to the in-job runtime (bootstrap.runtime), inside its guard: whatever fails in
scout's part, the user's call proceeds as without scout. scout's parts stay out of torch.compile's
graphs. Installing keeps the originals; `InstalledHooks.remove()` restores them; installing twice
is a no-op. Imports only the standard library and torch (lazily)."""

from __future__ import annotations

import faulthandler
import functools
import io
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scout_slurm.bootstrap import evidencewrites, selfcost
from scout_slurm.bootstrap.guard import ScoutFault
from scout_slurm.bootstrap.importhook import PatchAfterImport
from scout_slurm.bootstrap.runtime import Runtime, say
from scout_slurm.bootstrap.selfcost import COST
from scout_slurm.jobconfig import JobConfig
from scout_slurm.task import progress as progress_mod

# what the bootstrap swallows to keep the job running, for a debugging session (stdlib logging: the
# job's Python may lack structlog, and configuring it here would change the job's own logging)
_log = logging.getLogger("scout.bootstrap")

STACK_SIGNAL = signal.SIGRTMIN + 5
# torch.distributed's Python collectives (those a torch lacks are skipped). FSDP2 on torch 2.13
# calls
# all_gather_single and reduce_scatter_single; all_gather_into_tensor and reduce_scatter_tensor
# forward
# to them there: a collective called from inside another's wrapper is the outer one's, recorded
# once.
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "all_gather_object",
    "broadcast_object_list",
)
# Set while a user's DDP comm hook runs: the collectives it calls are the bucket's own, already
# counted as one ddp_bucket_all_reduce, so the wrappers pass them through untouched.
_IN_USER_COMM_HOOK = threading.local()
# Set while a wrapped collective runs on this thread: one torch forwards to (all_gather_into_tensor
# to
# all_gather_single, all_gather_object to all_gather) is part of it, not a second collective.
_IN_COLLECTIVE = threading.local()
_INSTALL_LOCK = threading.Lock()
# the runtime of this process, once installed (None: scout is not watching this process)
RUNTIME: Runtime | None = None


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
        global RUNTIME
        for owner, name, old in reversed(self._restore):
            setattr(owner, name, old)
        self._restore.clear()
        for fn in self._removers:
            fn()
        self._removers.clear()
        RUNTIME = None


def _outside_graphs(fn: Callable) -> Callable:
    """`fn` (scout's own part of a patched call) run as it is, never traced into a compiled
    graph.
    """
    import torch

    return torch.compiler.disable(fn) if hasattr(torch, "compiler") else fn


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


def _group_size(rt: Runtime, group: Any) -> int:
    try:
        if group is not None and hasattr(group, "size"):
            return int(group.size())
    except (
        AttributeError,
        TypeError,
        ValueError,
        RuntimeError,
    ) as exc:  # a group torch no longer knows
        _log.debug("size of group %r unknown: %r", group, exc)
    return rt.world


def _pg_seq(rt: Runtime) -> int:
    pg = rt.default_pg
    if pg is None:
        return -1
    try:
        return int(pg._get_sequence_number_for_group())
    except (
        AttributeError,
        TypeError,
        ValueError,
        RuntimeError,
    ) as exc:  # private API; progress works without it
        _log.debug("no sequence number from the default group: %r", exc)
        return -1


# -- collectives -----------------------------------------------------------------------------------


def _wrap_collective(rt: Runtime, name: str, fn: Callable) -> Callable:
    guard = rt.guard

    def enter(args: tuple, kwargs: dict) -> int:
        return rt.writer.enter(
            name, _nbytes(args[0]) if args else 0, _group_size(rt, kwargs.get("group")), _pg_seq(rt)
        )

    @functools.wraps(fn)
    def scout_collective(*args, **kwargs):
        w = rt.writer
        if (
            w is None
            or rt.is_compiling()
            or getattr(_IN_USER_COMM_HOOK, "active", False)
            or getattr(_IN_COLLECTIVE, "active", False)
            or not guard.on("collective record")
        ):
            return fn(*args, **kwargs)
        inj = rt.injector
        if name == "all_reduce" and inj is not None and inj.skip_next_all_reduce:
            inj.skip_next_all_reduce = False
            return None  # injected desync: this rank silently skips one all_reduce
        group = kwargs.get("group")
        if group is not None and type(group).__name__ == "RecordingGroup":
            kwargs["group"] = (
                group.wrapped
            )  # `ddp.process_group` passed by the job: recorded here, once
        timed = COST.sample()
        t0 = selfcost.clock() if timed else 0
        seq = guard.run("collective record", enter, args, kwargs)
        t1 = selfcost.clock() if timed else 0
        _IN_COLLECTIVE.active = True
        try:
            return fn(*args, **kwargs)
        finally:
            _IN_COLLECTIVE.active = False
            t2 = selfcost.clock() if timed else 0
            if seq is not None:
                guard.run("collective record", w.leave, seq)
            if timed:
                COST.sampled_ns += t1 - t0 + selfcost.clock() - t2

    scout_collective.__scout_original__ = fn
    return scout_collective


def _scout_side(rt: Runtime, fn: Callable) -> Callable:
    """scout's own collectives on its side group, in the progress record as `scout_vote`: when a
    rank never arrives, the ranks waiting there are seen inside a collective and the missing one
    behind. Called from scout's code only (already inside the guard)."""

    @functools.wraps(fn)
    def scout_side_collective(*args, **kwargs):
        w = rt.writer
        if w is None:
            return fn(*args, **kwargs)
        seq = w.enter(
            "scout_vote", _nbytes(args[0]) if args else 0, _group_size(rt, kwargs.get("group"))
        )
        try:
            return fn(*args, **kwargs)
        finally:
            w.leave(seq)

    scout_side_collective.__scout_original__ = fn
    return scout_side_collective


def _patch_distributed(rt: Runtime, handle: InstalledHooks, dist: Any) -> None:
    c10d = dist.distributed_c10d
    original_init = c10d.init_process_group
    original_all_reduce = c10d.all_reduce
    rt.originals.update(
        all_gather=_scout_side(rt, c10d.all_gather),
        barrier=_scout_side(rt, c10d.barrier),
        all_reduce=_scout_side(rt, original_all_reduce),
        broadcast=_scout_side(rt, c10d.broadcast),
    )
    late_done: list[bool] = []

    def opened() -> None:
        import torch

        # torch.compile traces a collective it meets into a functional one: scout's part is left out
        # (a constant while tracing, so the graph holds torch's own call alone). Bound here: torch
        # is
        # whole by now (torch.distributed is patched while torch itself is still being imported)
        rt.is_compiling = torch.compiler.is_compiling
        rt.open(c10d.get_rank(), c10d.get_world_size(), c10d._get_default_group())
        if not late_done:
            late_done.append(True)
            for check, patch in (
                ("DDP hooks", lambda: _patch_ddp(rt, handle, original_all_reduce)),
                ("optimizer hooks", lambda: _patch_optimizer(rt, handle)),
                ("checkpoint record", lambda: _patch_save(rt, handle)),
                ("busy mark", lambda: _patch_busy(rt, handle)),
            ):
                rt.guard.run(check, patch)

    @functools.wraps(original_init)
    def scout_init_process_group(*args, **kwargs):
        # before the rendezvous: the watchdogs start a peer's start-up clock from here
        # (task/stallclock.py)
        rt.guard.run("process group start", progress_mod.mark_entering_init, rt.progress_dir)
        result = original_init(*args, **kwargs)
        rt.guard.run("process group start", opened)
        return result

    original_destroy = c10d.destroy_process_group

    @functools.wraps(original_destroy)
    def scout_destroy_process_group(*args, **kwargs):
        everything = (not args or args[0] is None) and kwargs.get("group") is None
        if everything:
            rt.guard.run("end of training", _ending, rt)
        result = original_destroy(*args, **kwargs)
        if everything:
            # not switched off with the end of training: a side group left to the interpreter's
            # teardown can
            # abort a finished process (release_side_groups says why)
            try:
                rt.release_side_groups()
            except Exception as exc:
                say(f"scout: side groups not released: {exc!r}")
        return result

    for owner in (dist, c10d):
        handle.patch(owner, "init_process_group", scout_init_process_group)
        handle.patch(owner, "destroy_process_group", scout_destroy_process_group)
    for name in COLLECTIVES:
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        wrapped = _wrap_collective(rt, name, fn)
        handle.patch(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            handle.patch(dist, name, wrapped)


# Lightning's Trainer, in both of its packages: a fit ends in `Trainer._teardown` on every rank
LIGHTNING_TRAINERS = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")


def _patch_lightning(rt: Runtime, handle: InstalledHooks, module: Any) -> None:
    """Lightning with gloo never calls destroy_process_group, so its end-of-training vote is made
    when the Trainer tears a fit down: before Lightning unwraps its DDP model, with the group still
    up. Once per run: a later destroy_process_group (or a second fit) finds the vote made."""
    trainer = getattr(module, "Trainer", None)
    original = getattr(trainer, "_teardown", None)
    if original is None:
        # a Lightning without this private method: said, and the end-of-training check stays on
        # for destroy_process_group
        say(
            f"scout: {module.__name__}.Trainer has no _teardown: no end-of-training vote when a "
            "fit ends (only at destroy_process_group)"
        )
        return

    @functools.wraps(original)
    def scout_trainer_teardown(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt.guard.run("end of training", _lightning_ending, rt, self)
        return original(self, *args, **kwargs)

    handle.patch(trainer, "_teardown", scout_trainer_teardown)


def _lightning_ending(rt: Runtime, trainer: Any) -> None:
    fn = getattr(getattr(trainer, "state", None), "fn", None)
    # validate, test and predict end here too: only the end of a fit is the end of training
    if rt.final_vote or getattr(fn, "value", fn) != "fit":
        return
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return
    # the progress record stays active (not as at destroy_process_group): the script may go on to
    # trainer.test() and its collectives, still watched for stalls
    rt.end_of_training(where="Lightning's Trainer teardown")


def _ending(rt: Runtime) -> None:
    if rt.writer is not None:
        rt.writer.deactivate()  # done with collectives: the watchdog stops watching for stalls
    if not rt.final_vote:
        rt.end_of_training()


# -- DDP -------------------------------------------------------------------------------------------


def _default_comm_hook(rt: Runtime, original_all_reduce: Callable) -> Callable:
    """DDP's all-reduce of a bucket, recorded: for a DDP whose group scout could not wrap."""
    guard = rt.guard

    def scout_default_hook(state, bucket):  # no annotations: DDP checks them
        w = rt.writer if guard.on("DDP hooks") else None
        group = state if state is not None else rt.default_pg
        tensor = bucket.buffer()
        size = _group_size(rt, group)
        # as DDP's built-in path does (gradient times 1/size while filling the bucket), not div_:
        # x / 3 and x * (1/3) round differently, and the job must get the same bits as without scout
        tensor.mul_(1.0 / size)
        seq = (
            guard.run(
                "DDP hooks", w.enter, "ddp_bucket_all_reduce", _nbytes(tensor), size, _pg_seq(rt)
            )
            if w is not None
            else None
        )
        fut = original_all_reduce(tensor, group=state, async_op=True).get_future()

        def done(f):
            if seq is not None:
                guard.run("DDP hooks", w.leave, seq)
            return f.value()[0]

        return fut.then(done)

    return scout_default_hook


def _recorded_user_hook(rt: Runtime, hook: Callable) -> Callable:
    """A job's own DDP comm hook, its bucket recorded as one collective (the collectives the hook
    calls pass the wrappers untouched)."""
    guard = rt.guard

    def composed(st, bucket):
        w = rt.writer if guard.on("DDP hooks") else None
        seq = (
            guard.run(
                "DDP hooks",
                w.enter,
                "ddp_bucket_all_reduce",
                _nbytes(bucket.buffer()),
                rt.world,
                _pg_seq(rt),
            )
            if w is not None
            else None
        )
        _IN_USER_COMM_HOOK.active = True
        try:
            fut = hook(st, bucket)
        finally:
            _IN_USER_COMM_HOOK.active = False

        def done(f):
            if seq is not None:
                guard.run("DDP hooks", w.leave, seq)
            return f.value()

        return fut.then(done)

    return composed


def _patch_ddp(rt: Runtime, handle: InstalledHooks, original_all_reduce: Callable) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    guard = rt.guard
    scout_default_hook = _default_comm_hook(rt, original_all_reduce)
    original_register = DDP.register_comm_hook

    @functools.wraps(original_register)
    def scout_register_comm_hook(self, state, hook):
        self._scout_hooked = True
        from scout_slurm.bootstrap import pgwrap

        pgwrap.USER_HOOKS = (
            True  # the recording wrapper asks whether a bucket is this hook's from now on
        )
        return original_register(self, state, _recorded_user_hook(rt, hook))

    def wrapped_group(kwargs: dict) -> None:
        # DDP reduces through a recording wrapper of its group: its own C++ path stays (no comm
        # hook, no
        # extra pass over the gradients) and each bucket still lands in the progress record (pgwrap)
        from scout_slurm.bootstrap import pgwrap

        group = kwargs.get("process_group") or rt.default_pg
        kwargs["process_group"] = pgwrap.wrap(
            group,
            recording_writer,
            _in_user_comm_hook,
            lambda exc: guard.fail("collective record", exc),
        )

    def recording_writer() -> Any:
        # the recording group runs on DDP's hot path with the guard's rule inlined (pgwrap):
        # SCOUT_BREAK
        # reaches it here, so the chaos test covers that path too
        if "collective record" in guard.broken:
            raise ScoutFault("SCOUT_BREAK made 'collective record' fail")
        return rt.writer

    original_init = DDP.__init__

    @functools.wraps(original_init)
    def scout_ddp_init(self, module, *args, **kwargs):
        if rt.writer is not None and kwargs.get("device_mesh") is None and len(args) < 6:
            given = dict(kwargs)
            guard.run("DDP hooks", wrapped_group, kwargs)
            if "process_group" not in given and kwargs.get("process_group") is None:
                kwargs.pop("process_group", None)  # as the job called it
        original_init(self, module, *args, **kwargs)

    def before_forward(ddp: Any) -> None:
        if rt.consensus is not None and guard.on("state vote"):
            guard.run("state vote", rt.consensus.track, ddp)
        settle = getattr(ddp.process_group, "settle", None)  # the recording wrapper (pgwrap)
        if settle is not None:
            settle()
        if not getattr(ddp, "_scout_hooked", False):
            ddp._scout_hooked = True
            if rt.writer is not None and type(ddp.process_group).__name__ != "RecordingGroup":
                original_register(ddp, ddp.process_group, scout_default_hook)

    # out of compiled graphs: torch.compile traces DDP.forward (the inner module is compiled on its
    # own)
    scout_before_forward = _outside_graphs(lambda ddp: guard.run("DDP hooks", before_forward, ddp))
    original_forward = DDP.forward

    @functools.wraps(original_forward)
    def scout_forward(self, *args, **kwargs):
        if guard.on("DDP hooks"):
            scout_before_forward(self)
        return original_forward(self, *args, **kwargs)

    handle.patch(DDP, "register_comm_hook", scout_register_comm_hook)
    handle.patch(DDP, "forward", scout_forward)
    handle.patch(DDP, "__init__", scout_ddp_init)


def _in_user_comm_hook() -> bool:
    return getattr(_IN_USER_COMM_HOOK, "active", False)


# -- the optimizer step ----------------------------------------------------------------------------


def _patch_optimizer(rt: Runtime, handle: InstalledHooks) -> None:
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    @selfcost.timed
    def scout_pre_step_hook(optimizer, args, kwargs):
        # optimizer.step(closure): the forward and backward run inside the step (Lightning)
        closure = kwargs.get("closure", args[0] if args else None)
        rt.guard.run("optimizer hooks", rt.before_step, optimizer, closure=callable(closure))

    @selfcost.timed
    def scout_step_hook(optimizer, args, kwargs):
        rt.guard.run("optimizer hooks", rt.after_step, optimizer)

    h = register_optimizer_step_post_hook(_outside_graphs(scout_step_hook))
    handle.on_remove(h.remove)
    h_pre = register_optimizer_step_pre_hook(_outside_graphs(scout_pre_step_hook))
    handle.on_remove(h_pre.remove)


# -- checkpoints -----------------------------------------------------------------------------------


def note_checkpoint(
    path: str | os.PathLike, *, step: int | None = None, saver: str = "note"
) -> None:
    """Tell scout that a checkpoint was written (the explicit call for custom savers). The
    note goes to the job's evidence folder; the recovery rule picks among these."""
    rt = RUNTIME
    if rt is not None:
        rt.guard.run("checkpoint record", _note_checkpoint, rt, path, step, saver)


def _note_checkpoint(rt: Runtime, path: str | os.PathLike, step: int | None, saver: str) -> None:
    notes_dir = rt.checkpoints_dir
    if notes_dir is None:
        return
    from scout_slurm.bootstrap import ckptstate

    if ckptstate.WATCH is not None:  # the full record: signatures, replicas' agreement, coverage
        ckptstate.WATCH.saved(os.fspath(path), saver=saver, step=step)
        return
    from scout_slurm.evidence.layout import checkpoint_note_path
    from scout_slurm.evidence.records import CheckpointNote

    target = os.path.abspath(os.fspath(path))
    try:
        size, sha = ckptstate.digest_from_storage(target)
    except OSError:
        return
    if step is None:
        # steps of this run, counted from the checkpoint it resumed from
        step = (rt.writer.steps + rt.config.step_offset) if rt.writer is not None else -1
    note = CheckpointNote(
        path=target,
        step=int(step),
        rank=rt.rank,
        restart=rt.restart,
        saved_at=time.time(),
        size_bytes=size,
        sha256=sha,
        versions=ckptstate._versions_text(),
    )
    evidencewrites.mkdir(notes_dir)
    evidencewrites.write_record(
        checkpoint_note_path(notes_dir, rt.restart, int(step), rt.rank), note
    )


def _patch_save(rt: Runtime, handle: InstalledHooks) -> None:
    import torch

    original_save = torch.save

    def noted(f: Any, saver: str = "torch.save") -> None:
        from scout_slurm.bootstrap import ckptstate

        if not os.path.basename(os.fspath(f)).startswith("."):
            _note_checkpoint(rt, f, None, saver)
        elif ckptstate.WATCH is not None:
            # a save to a hidden name (".NAME.tmp"): no checkpoint yet; recorded when renamed to a
            # visible name
            ckptstate.WATCH.saved_hidden(f, saver=saver)

    def in_memory(f: Any) -> None:
        from scout_slurm.bootstrap import ckptstate

        if ckptstate.WATCH is not None:
            ckptstate.WATCH.saved_in_memory(f.tell())

    @functools.wraps(original_save)
    def scout_save(obj, f, *args, **kwargs):
        result = original_save(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)):
            rt.guard.run("checkpoint record", noted, f)
        elif isinstance(f, io.BytesIO):
            # into memory: Lightning and fsspec write the bytes to a temporary file and move it
            rt.guard.run("checkpoint record", in_memory, f)
        return result

    handle.patch(torch, "save", scout_save)
    _patch_safetensors(rt, handle, noted)
    from scout_slurm.bootstrap import (
        ckptstate,
    )  # DCP saves, loads, schedulers, the replicas' agreement

    rt.guard.run("checkpoint watch", ckptstate.install, handle, rt)


def _patch_safetensors(rt: Runtime, handle: InstalledHooks, noted: Callable[..., None]) -> None:
    """safetensors' `save_file` (Hugging Face's `model.safetensors`; `save_model` calls it) is
    recorded as torch.save is: a part of the step's checkpoint. Patched in safetensors.torch and
    under every name an imported module bound it to, or when safetensors.torch is imported."""

    def patch(module: Any) -> None:
        original = getattr(module, "save_file", None)
        if original is None:
            return

        @functools.wraps(original)
        def scout_save_file(tensors, filename, *args, **kwargs):
            result = original(tensors, filename, *args, **kwargs)
            if isinstance(filename, (str, os.PathLike)):
                rt.guard.run("checkpoint record", noted, filename, "safetensors")
            return result

        handle.patch(module, "save_file", scout_save_file)
        # a module that imported it before scout's hooks went in holds its own name for it
        # (transformers: `from safetensors.torch import save_file as safe_save_file`)
        for name, mod in list(sys.modules.items()):
            if name == module.__name__ or not isinstance(getattr(mod, "__dict__", None), dict):
                continue
            for attr, value in list(mod.__dict__.items()):
                if value is original:
                    handle.patch(mod, attr, scout_save_file)

    if "safetensors.torch" in sys.modules:
        patch(sys.modules["safetensors.torch"])
        return
    from scout_slurm.bootstrap.importhook import PatchAfterImport

    finder = PatchAfterImport({"safetensors.torch": patch})
    sys.meta_path.insert(0, finder)
    handle.on_remove(lambda: finder in sys.meta_path and sys.meta_path.remove(finder))


def _patch_busy(rt: Runtime, handle: InstalledHooks) -> None:
    """torch.save and torch.load mark the progress record busy while they run: a rank writing or
    reading a large checkpoint is busy, not hung (the watchdog gives it the start-up limit,
    task/stallclock.py). Outermost, so scout's own re-read of a saved file counts too."""
    import torch

    guard = rt.guard

    def mark(delta: int) -> None:
        w = rt.writer
        with rt.busy_lock:  # saves may run in several threads (asynchronous checkpointing)
            rt.busy_depth += delta
            if rt.busy_depth == (1 if delta > 0 else 0):
                w.set_busy(delta > 0)

    def busy(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def scout_busy(*args, **kwargs):
            if rt.writer is None or not guard.on("busy mark"):
                return fn(*args, **kwargs)
            guard.run("busy mark", mark, 1)
            try:
                return fn(*args, **kwargs)
            finally:
                guard.run("busy mark", mark, -1)

        return scout_busy

    handle.patch(torch, "save", busy(torch.save))
    handle.patch(torch, "load", busy(torch.load))


def _patch_renames(rt: Runtime, handle: InstalledHooks) -> None:
    """os.rename, os.replace and shutil.move (pathlib's rename and replace call os's): a checkpoint
    written under one name and renamed (the atomic save) keeps its record under the name it ends up
    with. Patched at install, before the script runs, so that a script's `from os import replace`
    gets the patched one too."""
    import shutil

    handle.patch(os, "rename", _following_renames(rt, os.rename, returns_dest=False))
    handle.patch(os, "replace", _following_renames(rt, os.replace, returns_dest=False))
    handle.patch(shutil, "move", _following_renames(rt, shutil.move, returns_dest=True))


def _following_renames(rt: Runtime, fn: Callable, *, returns_dest: bool) -> Callable:
    from scout_slurm.bootstrap import ckptstate

    def follow(args: tuple, kwargs: dict, result: Any) -> None:
        watch = ckptstate.WATCH
        if watch is None or not (watch.names or watch.in_memory):  # nothing to follow
            return
        src = args[0] if args else kwargs["src"]
        dst = (
            result
            if returns_dest and isinstance(result, (str, bytes, os.PathLike))
            else (args[1] if len(args) > 1 else kwargs["dst"])
        )
        if not kwargs or (kwargs.get("src_dir_fd") is None and kwargs.get("dst_dir_fd") is None):
            watch.moved(
                src, dst
            )  # relative to a folder descriptor (scout's own records): not followed

    @functools.wraps(fn)
    def scout_rename(*args, **kwargs):
        result = fn(*args, **kwargs)  # the job's rename: its result and its errors, untouched
        if ckptstate.WATCH is not None:
            rt.guard.run("checkpoint record", follow, args, kwargs, result)
        return result

    scout_rename.__scout_original__ = fn
    return scout_rename


# -- installing ------------------------------------------------------------------------------------


def install(
    progress_dir: Path | None,
    *,
    restart: int = 0,
    checkpoints_dir: Path | None = None,
    config: JobConfig | None = None,
) -> InstalledHooks:
    """Install the hooks (idempotent). torch.distributed is patched now if already imported,
    else right after it is imported. `config`: the job's settings (default: scout's defaults)."""
    global RUNTIME
    import dataclasses

    with _INSTALL_LOCK:
        if RUNTIME is not None:
            return RUNTIME.installed
        cfg = config if config is not None else JobConfig()
        if cfg.restart != restart and restart:
            cfg = dataclasses.replace(cfg, restart=restart)
        rt = Runtime(cfg, progress_dir=progress_dir, checkpoints_dir=checkpoints_dir)
        handle = InstalledHooks()
        rt.installed = handle
        RUNTIME = rt
    if checkpoints_dir is not None:
        rt.guard.run("checkpoint record", _patch_renames, rt, handle)

    def on_distributed(dist: Any) -> None:
        if dist.is_available():
            rt.guard.run("process group start", _patch_distributed, rt, handle, dist)

    targets = {}
    if "torch.distributed" in sys.modules:
        on_distributed(sys.modules["torch.distributed"])
    else:
        targets["torch.distributed"] = on_distributed
    if progress_dir is not None:
        # this Python may be torchrun's agent: its workers' ranks, pids and exits, from the agent
        def on_agent(module: Any) -> None:
            from scout_slurm.bootstrap.agent import watch_agent

            rt.guard.run("torchrun agent record", watch_agent, module, progress_dir, rt.guard)

        name = "torch.distributed.elastic.agent.server.local_elastic_agent"
        if name in sys.modules:
            on_agent(sys.modules[name])
        else:
            targets[name] = on_agent

    def on_lightning(module: Any) -> None:
        rt.guard.run("end of training", _patch_lightning, rt, handle, module)

    for name in LIGHTNING_TRAINERS:
        if name in sys.modules:
            on_lightning(sys.modules[name])
        else:
            targets[name] = on_lightning
    if targets:
        finder = PatchAfterImport(targets)
        sys.meta_path.insert(0, finder)
        handle.on_remove(lambda: finder in sys.meta_path and sys.meta_path.remove(finder))
    return handle


def install_from_config(config: JobConfig) -> InstalledHooks:
    """The bootstrap's entry (site/sitecustomize.py): the job's settings, read once by
    `scout_slurm.jobconfig.load()`, passed down from here."""
    if config.run_dir is not None:  # a real job: its evidence writes leave the training thread
        evidencewrites.start(_root_of(config.run_dir))
    if config.stacks_file is not None and not evidencewrites.probe(
        config.stacks_file, evidencewrites.STACKS_PROBE_S
    ):
        say(
            f"the evidence root does not answer: no stack dump file ({config.stacks_file}); "
            "a stall's stacks are read from outside the process"
        )
    elif config.stacks_file is not None:
        fh = open(
            config.stacks_file, "a", buffering=1
        )  # kept open for faulthandler for the process's life
        faulthandler.register(STACK_SIGNAL, file=fh, all_threads=True, chain=False)
    return install(
        config.progress_dir,
        restart=config.restart,
        checkpoints_dir=config.checkpoints_dir,
        config=config,
    )


def _root_of(run_dir: Path) -> Path:
    from scout_slurm.errors import ScoutError
    from scout_slurm.evidence.layout import JobFolder

    try:
        return JobFolder.of_run_dir(run_dir)[0].root
    except ScoutError:
        return run_dir


__all__ = [
    "InstalledHooks",
    "install",
    "install_from_config",
    "note_checkpoint",
    "say",
    "STACK_SIGNAL",
]
