"""A recording ProcessGroup for DDP: DDP reduces its buckets through it with its own C++ path
(gradients scaled while they are copied into the bucket, no comm hook), and every bucket's
all-reduce lands in the progress record as `ddp_bucket_all_reduce`, entered at launch and left
when gloo/NCCL completes it. A rank stuck inside backward is therefore still seen inside a
collective, as with the comm hook this replaces, without the hook's extra pass over the gradients.

Python subclasses of torch's ProcessGroup are accepted by DDP (torchft does the same): the
reducer calls `allreduce` on the object it was given, which reaches the override below.

Every other collective is passed on from Python too, never left to torch's C++ base class. Called
from C++ (DDP's `_rebuild_buckets` and `_broadcast_coalesced`, which release the GIL), torch's
trampoline takes the GIL to look for a Python override and, finding none, runs the base collective
still holding it; the base enqueues on gloo, which takes gloo's work-queue lock. A gloo worker
thread frees each finished work under that same lock, and freeing a work launched from Python (a
tensor whose Python object the work now owns) takes the GIL: each waits for the other. Measured:
jobs stuck at their second step, every rank in `_rebuild_buckets`, one gloo thread with a Python
thread state and no frame (false hang kills on the lab); tests/torch/test_ddp_identical.py
reproduces it in seconds through the base path. The group's own Python methods release the GIL
before gloo's lock is taken. Imported only after torch.distributed (patches._patch_ddp)."""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch._C._distributed_c10d import ProcessGroup, _create_work_from_future

from scout_slurm.bootstrap.selfcost import COST, clock
from scout_slurm.task.progress import ProgressWriter

# why DDP may not get a wrapper: then scout falls back to its comm hook (patches._patch_ddp)
_BACKENDS = {"gloo": ProcessGroup.BackendType.GLOO, "nccl": ProcessGroup.BackendType.NCCL}


class RecordingGroup(ProcessGroup):
    """Wraps one of the job's groups for DDP; `writer()` gives the progress record (None: not yet),
    `passing()` is true while a user's comm hook runs (its collectives are counted by that hook)."""

    def __init__(self, pg: Any, writer: Callable[[], ProgressWriter | None], passing: Callable[[], bool]) -> None:
        super().__init__(pg.rank(), pg.size())
        self._pg = pg
        self._writer = writer
        self._passing = passing
        self._size = pg.size()
        for device in ("cpu", "cuda"):
            dev = torch.device(device)
            try:
                backend = pg._get_backend(dev)
            except RuntimeError:  # no backend for that device in this group
                continue
            self._register_backend(dev, _BACKENDS.get(backend.name(), ProcessGroup.BackendType.CUSTOM), backend)
        self._set_default_backend(_BACKENDS.get(pg._get_backend_name(), ProcessGroup.BackendType.CUSTOM))

    @property
    def wrapped(self) -> Any:
        return self._pg

    def name(self) -> str:
        return self._pg.name()

    def allreduce(self, tensors, opts=None):  # noqa: ANN001 - the reducer's call, passed on unchanged
        inner = self._pg.allreduce(tensors, opts) if opts is not None else self._pg.allreduce(tensors)
        w = self._writer()  # from here on scout's own work: the launch above is the job's
        if w is None or self._passing():
            return inner
        timed = COST.sample()
        t0 = clock() if timed else 0
        t = tensors[0]
        seq = w.enter("ddp_bucket_all_reduce", t.numel() * t.element_size(), self._size,
                      self._pg._get_sequence_number_for_group())
        # The reducer waits on the returned work's future: one that completes only after the leave is
        # recorded, so a rank past its backward never shows a bucket still open in its record.
        fut = inner.get_future().then(lambda f, w=w, seq=seq, timed=timed: _left(f, w, seq, timed))
        if timed:
            COST.sampled_ns += clock() - t0
        return _create_work_from_future(fut)


# The collectives torch's trampoline (PyProcessGroup) looks up as Python overrides, by the names it
# looks for (newer and older spellings): each is passed on to the wrapped group. `allreduce` is above.
_PASSED_ON = ("allgather", "all_gather_single", "_allgather_base", "all_gather_single_coalesced",
              "allgather_into_tensor_coalesced", "allgather_coalesced", "allreduce_coalesced",
              "all_to_all_single", "alltoall_base", "alltoall", "barrier", "broadcast", "reduce", "gather",
              "scatter", "reduce_scatter", "reduce_scatter_single", "_reduce_scatter_base",
              "reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced", "send", "recv",
              "recv_anysource", "monitored_barrier")


def _passed_on(name: str) -> Callable[..., Any]:
    def collective(self: RecordingGroup, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._pg, name)(*args, **kwargs)
    collective.__name__ = collective.__qualname__ = name
    return collective


for _name in _PASSED_ON:
    if hasattr(ProcessGroup, _name):
        setattr(RecordingGroup, _name, _passed_on(_name))


def _start_coalescing(self: RecordingGroup, device: Any) -> None:
    self._pg._start_coalescing(device)


def _end_coalescing(self: RecordingGroup, device: Any) -> Any:
    return self._pg._end_coalescing(device)


# the trampoline's names for them; Python callers use the underscored ones
RecordingGroup.start_coalescing = RecordingGroup._start_coalescing = _start_coalescing  # type: ignore[attr-defined]
RecordingGroup.end_coalescing = RecordingGroup._end_coalescing = _end_coalescing  # type: ignore[attr-defined]


def _left(f: Any, w: ProgressWriter, seq: int, timed: bool) -> Any:
    """Runs on gloo's thread when the all-reduce completed: the record's leave, then the result
    (the reduced tensors, or the all-reduce's error, raised again) for the reducer."""
    t0 = clock() if timed else 0
    try:
        w.leave(seq)
    except Exception:  # noqa: BLE001 - the record is evidence; the job's gradients come first
        pass
    if timed:
        COST.sampled_ns += clock() - t0
    return f.value()


_RECORDING: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id of a wrapped group -> its wrapper


def recording(pg: Any) -> RecordingGroup | None:
    """The wrapper made for `pg`, while it lives."""
    return _RECORDING.get(id(pg))


def wrap(pg: Any, writer: Callable[[], ProgressWriter | None], passing: Callable[[], bool]) -> Any:
    """The recording wrapper around `pg`: one per group, shared by every DDP built on it."""
    if isinstance(pg, RecordingGroup):
        return pg
    group = recording(pg)
    if group is None or group.wrapped is not pg:  # (an id outlives its group only when the wrapper did not)
        group = RecordingGroup(pg, writer, passing)
        _register_like(group, pg)
        _RECORDING[id(pg)] = group
    return group


def _register_like(group: Any, pg: Any) -> None:
    """torch.distributed's tables know the wrapper as the group it wraps, so a user's comm hook or
    code calling dist.* with `ddp.process_group` works as with the group it passed."""
    from torch.distributed import distributed_c10d as c10d
    world = c10d._world
    # not pg_names: destroy_process_group shuts down every group named there, and the wrapped one is
    # shut down once, as itself
    for table in (world.pg_map, world.pg_group_ranks, world.pg_backend_config):
        if pg in table:
            table[group] = table[pg]
