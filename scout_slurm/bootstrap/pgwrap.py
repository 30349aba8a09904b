"""A recording ProcessGroup for DDP: DDP reduces its buckets through it with its own C++ path
(gradients scaled while they are copied into the bucket, no comm hook), and every bucket's
all-reduce lands in the progress record as `ddp_bucket_all_reduce`, entered at launch and left
at the end of the backward that launched it, once it completed (autograd's final callback, where
DDP waits for its buckets too). A rank stuck inside backward is therefore still seen inside a
collective, as with the comm hook this replaces, without the hook's extra pass over the gradients.

No Python of scout's runs on gloo's threads for a bucket: a callback per bucket there (a leave as
each all-reduce completed, then a new work for the reducer) took the GIL from gloo's thread while
the training thread launched the next bucket, and cost about 60 us a bucket on the reference job;
and a gloo thread that takes the GIL while the interpreter ends aborts the process (SIGABRT,
"terminate called without an active exception", pytorch/pytorch#38228): a job that finished,
failed at exit. The entries are left together instead, on the training thread: by the backward's
final callback when all completed, else by one more final callback after DDP's own, which waits
for them. What that changes: a bucket that completed before the backward's last layers were
computed is shown open until the backward ends (its time counts as collective time in the timing
votes, on every rank alike). An all-reduce launched outside a backward (DDP's join hook, a user's
call on `ddp.process_group`), or one of a backward whose DDP callback raised, is left when it
completes, by a callback on gloo's thread (counted in the rank's cost record).

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
from collections.abc import Callable
from threading import get_ident
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroup

from scout_slurm.bootstrap.selfcost import COST, SAMPLE_EVERY, clock
from scout_slurm.task.progress import ProgressWriter

# why DDP may not get a wrapper: then scout falls back to its comm hook (patches._patch_ddp)
_ENGINE = torch.autograd.Variable._execution_engine
# the running backward's graph task (-1 outside any), a cheap read; without it every bucket is left
# as it completes
_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
# set once a job registers a comm hook of its own (patches): then a bucket may be the hook's,
# counted there
USER_HOOKS = False
_BACKENDS = {"gloo": ProcessGroup.BackendType.GLOO, "nccl": ProcessGroup.BackendType.NCCL}


class RecordingGroup(ProcessGroup):
    """Wraps one of the job's groups for DDP; `writer()` gives the progress record (None: not yet),
    `passing()` is true while a user's comm hook runs (its collectives are counted by that hook)."""

    def __init__(
        self,
        pg: Any,
        writer: Callable[[], ProgressWriter | None],
        passing: Callable[[], bool],
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        super().__init__(pg.rank(), pg.size())
        self._pg = pg
        self._writer = writer
        self._passing = passing
        # scout's part failed (`_failed`): the wrapper only passes the job's collectives on from
        # then on
        self._on_error = on_error
        self._off = False
        self._size = pg.size()
        self._open: list[
            tuple[int, Any, int]
        ] = []  # (seq, work, torch's seq) entered in the running backward
        self._w: ProgressWriter | None = None  # the progress record, once there is one
        self._queued_for = (
            -1
        )  # the backward (autograd graph task) whose final callback will leave them
        self._late: list[
            tuple[int, Any, int]
        ] = []  # still in flight at that callback: left after DDP's
        for device in ("cpu", "cuda"):
            dev = torch.device(device)
            try:
                backend = pg._get_backend(dev)
            except RuntimeError:  # no backend for that device in this group
                continue
            self._register_backend(
                dev, _BACKENDS.get(backend.name(), ProcessGroup.BackendType.CUSTOM), backend
            )
        self._set_default_backend(
            _BACKENDS.get(pg._get_backend_name(), ProcessGroup.BackendType.CUSTOM)
        )

    @property
    def wrapped(self) -> Any:
        return self._pg

    def name(self) -> str:
        return self._pg.name()

    def allreduce(self, tensors, opts=None):
        inner = (
            self._pg.allreduce(tensors, opts) if opts is not None else self._pg.allreduce(tensors)
        )
        if self._off:
            return inner
        # from here on scout's own work (the launch above is the job's): never into DDP's reducer
        try:
            return self._record(tensors, inner)
        except Exception as exc:
            self._failed(exc)
            return inner

    def _failed(self, exc: Exception) -> None:
        """scout's part of this wrapper raised: off for the rest of the job, said once by the
        guard.
        """
        self._off = True
        self._open, self._late = [], []
        if self._on_error is not None:
            try:
                self._on_error(exc)
            except Exception:
                pass

    def _record(self, tensors: Any, inner: Any) -> Any:
        """The bucket's entry in the progress record, once a bucket: kept short."""
        w = self._w or self._writer()
        if w is None or (USER_HOOKS and self._passing()):
            return inner
        self._w = w
        n = COST.wrapper_calls  # COST.sample(), inline
        COST.wrapper_calls = n + 1
        timed = not n % SAMPLE_EVERY
        t0 = clock() if timed else 0
        opened = self._open
        task = _task_id()
        queued = task >= 0 and task == self._queued_for
        # torch's counter moves by one a launch on this group: read once a backward (a call into
        # torch
        # costs more than the rest of this entry here)
        pg_seq = (
            opened[-1][2] + 1 if queued and opened else self._pg._get_sequence_number_for_group()
        )
        seq = w.enter("ddp_bucket_all_reduce", tensors[0].nbytes, self._size, pg_seq)
        if queued or (task >= 0 and self._queue(task)):
            opened.append((seq, inner, pg_seq))
        else:  # not inside a backward: left when it completes (on gloo's thread)
            me = get_ident()  # the thread that entered it, bound now (the callback runs on gloo's)
            inner.get_future().add_done_callback(
                lambda _f, w=w, seq=seq, me=me: _left(w, (seq,), me)
            )
        if timed:
            COST.samples += 1
            COST.sampled_ns += clock() - t0
        return inner

    def _queue(self, task: int) -> bool:
        """Have the running backward (autograd graph task `task`) leave this group's buckets at its
        end. A backward that raised drops its final callbacks: its buckets are left with the next
        backward's (a new task) or at the next forward (`settle`)."""
        try:
            _ENGINE.queue_callback(self._backward_done)
        except RuntimeError:  # "Final callbacks can only be installed during backward pass"
            return False
        self._queued_for = task
        return True

    def _backward_done(self) -> None:
        """Autograd's final callback of the backward that launched the open buckets: they are left
        now if all completed. Else after DDP's own final callback, which was queued after this one
        (when the backward launched its last bucket) and waits for them: still on the training
        thread, so that no Python of scout's runs on gloo's threads (a gloo thread that takes the
        GIL while the interpreter ends aborts the process)."""
        try:
            self._leave_opened()
        except Exception as exc:
            self._failed(exc)

    def _leave_opened(self) -> None:
        opened, self._open = self._open, []
        if not opened or self._w is None:
            return
        t0 = clock()  # once a backward: always measured (scout's own cost, ranks/cost-R.json)
        if all(work.is_completed() for _, work, _ in opened):
            self._w.leave_many([seq for seq, _, _ in opened])
        else:
            self._late += opened
            try:
                _ENGINE.queue_callback(self._after_ddp)
            except RuntimeError:  # not inside a backward's final callbacks after all
                self._after_ddp()
        COST.hooks_cpu_ns += clock() - t0

    def _after_ddp(self) -> None:
        """The final callback after DDP's (a DDP that raised there drops it: `settle` then)."""
        late, self._late = self._late, []
        if late:
            try:
                _leave_when_done(self._w, late)
            except Exception as exc:
                self._failed(exc)

    def settle(self) -> None:
        """At DDP's next forward: buckets of a backward that raised (its final callbacks were
        dropped; a job may catch the error and go on) are left as they complete."""
        if not self._open and not self._late:
            return
        self._queued_for = -1
        opened, self._open, self._late = self._late + self._open, [], []
        _leave_when_done(self._w, opened)


def _leave_when_done(w: ProgressWriter | None, opened: list[tuple[int, Any, int]]) -> None:
    """Leave the record's entries of these all-reduces: now, those completed (the training thread);
    the others as they complete (a callback on gloo's thread: what DDP did not wait for)."""
    if w is None:
        return
    done = [work.is_completed() for _, work, _ in opened]
    if any(done):
        w.leave_many([seq for (seq, _, _), ok in zip(opened, done) if ok])
    me = get_ident()
    for (seq, work, _), ok in zip(opened, done):
        if not ok:
            work.get_future().add_done_callback(
                lambda _f, w=w, seq=seq, me=me: _left(w, (seq,), me)
            )


# The collectives torch's trampoline (PyProcessGroup) looks up as Python overrides, by the names it
# looks for (newer and older spellings): each is passed on to the wrapped group. `allreduce` is
# above.
_PASSED_ON = (
    "allgather",
    "all_gather_single",
    "_allgather_base",
    "all_gather_single_coalesced",
    "allgather_into_tensor_coalesced",
    "allgather_coalesced",
    "allreduce_coalesced",
    "all_to_all_single",
    "alltoall_base",
    "alltoall",
    "barrier",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced",
    "send",
    "recv",
    "recv_anysource",
    "monitored_barrier",
)


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


def _skipped_by_the_compiler() -> None:
    """torch.compile never traces this wrapper: the reducer calls it from C++ (its buckets, the
    broadcast of `_rebuild_buckets` inside a compiled DDP forward), and a frame of scout's traced
    there reads members torch's opaque group does not register (a hard error). Skipped frame by
    frame (no cost per call); frames they call are compiled as usual."""
    skip = getattr(getattr(getattr(torch, "_dynamo", None), "eval_frame", None), "skip_code", None)
    if skip is None:  # a torch without it: the compiler's own wrapper (a little cost per call)
        for name, fn in list(vars(RecordingGroup).items()):
            if callable(fn) and not name.startswith("__"):
                setattr(RecordingGroup, name, torch.compiler.disable(fn))
        return
    codes = {fn.__code__ for fn in vars(RecordingGroup).values() if hasattr(fn, "__code__")}
    codes |= {_passed_on("x").__code__, _left.__code__, _leave_when_done.__code__}
    for code in codes:
        skip(code)


def _left(w: ProgressWriter, seqs: tuple[int, ...] | list[int], registered_on: int) -> None:
    """On gloo's thread, as all-reduces completed (or failed: the job gets the error from DDP):
    the record's leave. Inline when they had completed already (on the thread that registered
    it)."""
    if get_ident() != registered_on:
        COST.comm_thread_calls += 1
    try:
        w.leave_many(seqs)
    except Exception:
        pass


_RECORDING: weakref.WeakValueDictionary = (
    weakref.WeakValueDictionary()
)  # id of a wrapped group -> its wrapper


def recording(pg: Any) -> RecordingGroup | None:
    """The wrapper made for `pg`, while it lives."""
    return _RECORDING.get(id(pg))


def wrap(
    pg: Any,
    writer: Callable[[], ProgressWriter | None],
    passing: Callable[[], bool],
    on_error: Callable[[Exception], None] | None = None,
) -> Any:
    """The recording wrapper around `pg`: one per group, shared by every DDP built on it.
    `on_error(exc)`: scout's part of it failed (then it only passes the job's collectives on)."""
    if isinstance(pg, RecordingGroup):
        return pg
    group = recording(pg)
    if (
        group is None or group.wrapped is not pg
    ):  # (an id outlives its group only when the wrapper did not)
        group = RecordingGroup(pg, writer, passing, on_error)
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


_skipped_by_the_compiler()
