"""Fires the fault a job asked for (SCOUT_INJECT) inside the training process: a registry of what
each kind does, called by the in-job runtime at the end of optimizer steps. A fault stands for
something that happens to the job (a hang, a crash, a bit flip), so it runs outside scout's guard:
an injected exception reaches the job exactly as a user's would. Imports torch lazily."""

from __future__ import annotations

import atexit
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from scout_slurm.inject.spec import NUMERIC_FAULTS, TIMING_FAULTS, FaultSpec


class Injector:
    """One job's fault: where and when it fires, said and recorded once. `record(fault)` writes the
    injection finding (the moment, to measure detection latency); `first_weight(optimizer)` is the
    tensor a weight fault changes (the model's own under DeepSpeed ZeRO)."""

    def __init__(
        self,
        fault: FaultSpec,
        *,
        rank: int,
        restart: int,
        record: Callable[[FaultSpec], None],
        first_weight: Callable[[Any], Any],
        say: Callable[[str], None],
    ) -> None:
        self.fault, self.rank, self.restart = fault, rank, restart
        self.record, self.first_weight, self.say = record, first_weight, say
        self.fired_step = -1  # the optimizer step after which the fault last fired
        self.skip_next_all_reduce = False
        self.timing_said = False  # a recurring delay: said and recorded at its first firing only
        self.update_said = False
        self.compute_fired = 0
        # the workers torchrun restarted (--max-restarts) are the same Slurm run's second attempt
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.torchrun_attempt = int(attempt) if attempt.isdigit() else 0

    def applies(self, step: int) -> bool:
        if self.torchrun_attempt > 0 and self.fault.restart is not None:
            return False  # a fault of one run fires in torchrun's first attempt (restart=any: all)
        return self.fault.applies(self.rank, step, self.restart)

    # -- at the end of an optimizer step -------------------------------------------------------

    def update_fault(self, step: int, optimizer: Any) -> None:
        """A fault in what this rank's optimizer step wrote: changed before scout signs anything."""
        fault = self.fault
        if fault.target != "update" or not self.applies(step):
            return
        from scout_slurm.inject.corrupt import corrupt_

        self.fired_step = step
        what = corrupt_(
            optimizer.param_groups[0]["params"][0], fault, seed=1_000_003 * self.rank + step
        )
        if not self.update_said:
            self.update_said = True
            self.say(
                f"scout: injecting fault {fault.kind} into the optimizer update on rank "
                f"{self.rank} at step "
                f"{step}: param0{what}"
            )
            self.record(fault)

    def process_fault(self, step: int, optimizer: Any) -> None:
        """A process, timing or state fault after step `step`."""
        fault = self.fault
        if fault.is_compute or fault.target == "update" or not self.applies(step):
            return
        self.fired_step = step
        if fault.kind in TIMING_FAULTS and self.timing_said:
            time.sleep(fault.seconds)
            return
        self.timing_said = fault.kind in TIMING_FAULTS
        self.say(f"scout: injecting fault {fault.kind} on rank {self.rank} at step {fault.step}")
        self.record(fault)
        FIRE[fault.kind](self, optimizer)

    # -- compute faults (fired by hooks on a layer, bootstrap.replay.attach_compute_fault)
    # -----------

    def compute_fired_once(self, what: str, step: int) -> None:
        self.compute_fired += 1
        if self.compute_fired == 1:  # a recurring fault fires every step: said and recorded once
            self.say(
                f"scout: injecting fault {self.fault.kind} into {self.fault.target} on rank "
                f"{self.rank} at step "
                f"{step}: {what}"
            )
            self.record(self.fault)

    def corrupt_recomputed_update(self, step: int, param: int, lo: int, t: Any) -> None:
        """The same fault in this rank's recomputation of an update (scout's update replay), unless
        it
        is transient: a faulty unit computes every update wrongly, its own and others' alike."""
        fault = self.fault
        if fault.target != "update" or fault.transient or param != 0 or not self.applies(step):
            return
        from scout_slurm.inject.corrupt import corrupt_

        if fault.kind == "noise" or lo <= fault.element < lo + t.numel():
            corrupt_(
                t,
                dataclasses.replace(fault, element=max(0, fault.element - lo)),
                seed=7 + 1_000_003 * self.rank + step,
            )


def _corrupt_state(inj: Injector, optimizer: Any) -> None:
    """Change one element of the first parameter (or of the optimizer's first state tensor)."""
    from scout_slurm.bootstrap.signing import optimizer_tensors
    from scout_slurm.inject.corrupt import corrupt_

    fault = inj.fault
    if fault.target == "optimizer":
        tensors = optimizer_tensors(optimizer)
        if not tensors:
            inj.say(
                "scout: corrupted nothing: the optimizer has no state tensors (e.g. SGD "
                "without momentum)"
            )
            return
        name, t = tensors[0]
    else:
        name, t = "param0", inj.first_weight(optimizer)
    inj.say(
        f"scout: corrupted {fault.target} {name}"
        + corrupt_(t, fault, seed=1_000_003 * inj.rank + fault.step)
    )


def _sleep(inj: Injector, optimizer: Any) -> None:
    time.sleep(inj.fault.seconds)


def _spin(inj: Injector, optimizer: Any) -> None:
    deadline = time.monotonic() + inj.fault.seconds
    x = 0
    while time.monotonic() < deadline:
        x += 1


def _stop(inj: Injector, optimizer: Any) -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def _skip_allreduce(inj: Injector, optimizer: Any) -> None:
    inj.skip_next_all_reduce = True  # the collective wrapper skips the job's next all_reduce


def _exit(inj: Injector, optimizer: Any) -> NoReturn:
    """The process ends with the code asked: its atexit handlers run as at sys.exit (scout's close
    the progress record and write the coverage), and then it stops there. The interpreter's
    teardown after them, with gloo's threads still running, sometimes aborted the process in
    torch's C++ destructors (SIGABRT): the fault asked for an exit code, not a signal."""
    from scout_slurm.bootstrap.exitpolicy import flush_and_exit

    atexit._run_exitfuncs()
    flush_and_exit(inj.fault.code)


def _sigkill(inj: Injector, optimizer: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _segv(inj: Injector, optimizer: Any) -> None:
    import ctypes

    ctypes.string_at(0)


def _raise(inj: Injector, optimizer: Any) -> NoReturn:
    """An exception in the job's step: marked as the job's, so scout's guard lets it through."""
    from scout_slurm.bootstrap.guard import JOBS_OWN

    exc = RuntimeError(f"scout injected exception at step {inj.fault.step}")
    setattr(exc, JOBS_OWN, True)
    raise exc


# what each kind of fault does, by name (inject.spec lists the kinds)
FIRE: dict[str, Callable[[Injector, Any], None]] = {
    **{kind: _corrupt_state for kind in NUMERIC_FAULTS},
    **{kind: _sleep for kind in ("sleep", *TIMING_FAULTS)},
    "spin": _spin,
    "stop": _stop,
    "skip_allreduce": _skip_allreduce,
    "exit": _exit,
    "sigkill": _sigkill,
    "segv": _segv,
    "raise": _raise,
}


def say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def attach_compute_fault(
    root: Any,
    fault: Any,
    rank: int,
    restart: int,
    current_step: Callable[[], int],
    on_fire: Callable[[str], None],
    replaying: Callable[[], bool] = lambda: False,
) -> str:
    """Hang the fault's forward hook on the named layer (default: the first with weights)."""
    from scout_slurm.bootstrap.frameworks import parameterised_leaves
    from scout_slurm.inject.corrupt import compute_fault_hook, local_gradient_fault_hook

    leaves = parameterised_leaves([root])
    if not leaves:
        return "no layer with weights: compute fault not attached"
    if fault.layer:
        match = [(n, m) for n, m in leaves if n == fault.layer]
        if not match:
            return (
                f"compute fault: layer {fault.layer!r} not found; layers with weights: "
                f"{', '.join(n for n, _ in leaves)}"
            )
        name, layer = match[0]
    else:
        name, layer = leaves[0]
    if fault.target == "local_gradients":
        weight = next((p for p in layer.parameters(recurse=False) if p.requires_grad), None)
        if weight is None:
            return f"compute fault: layer {name!r} has no trainable weight"
        weight.register_hook(local_gradient_fault_hook(fault, rank, restart, current_step, on_fire))
    else:
        layer.register_forward_hook(
            compute_fault_hook(fault, rank, restart, current_step, on_fire, replaying)
        )
    return f"compute fault ({fault.kind} into {fault.target}) attached to layer {name!r}"
