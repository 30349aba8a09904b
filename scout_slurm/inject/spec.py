"""Parse a fault specification (pure):
`KIND[,rank=R|all][,step=S][,seconds=X][,code=C][,restart=N|any]`.

Kinds for process faults: sleep, spin, stop, skip_allreduce, exit, sigkill, segv, raise.
The fault fires after optimizer step S (1-based) on rank R. Numerical faults may recur
(`every=N`: at S, S+N, ...; `until=U`: every step from S to U) and target weights, optimizer
state, or computation: `activations` (the output of layer `layer=NAME` on that rank) and
`gradients` (the gradient entering that layer's backward), which models broken hardware and so
also corrupts that rank's in-situ replay of the layer (`transient=1`: in training only, a one-off
upset), and `local_gradients` (that rank's own gradient of the layer's first weight, before the
all-reduce: noise, a bit, or `scale,factor=2` for a gradient counted twice). `update`: what this
rank's optimizer step writes (element `element` of its first parameter, changed as the step ends,
before scout signs anything): a fault in the update's compute, which also corrupts the rank's
recomputation of updates (scout's update replay) unless `transient=1`.
"""

from __future__ import annotations

from dataclasses import dataclass

from scout_slurm.errors import ConfigError

PROCESS_FAULTS = ("sleep", "spin", "stop", "skip_allreduce", "exit", "sigkill", "segv", "raise")
# timing faults (seconds= required): `delay` sleeps that long after every step from S on (a compute
# straggler; `every`/`until` narrow it), `input_stall` once after step S (a data loader stall)
TIMING_FAULTS = ("delay", "input_stall")
# numerical faults: change one element of a tensor the replicas must share
NUMERIC_FAULTS = ("bitflip", "scale", "sign", "nan", "inf", "noise")
STATE_TARGETS = ("weights", "optimizer")
# corrupt what a layer computes, not what it stores; local_gradients: this rank's own gradient of
# the
# layer's first weight, before the all-reduce (a noisy or doubled local gradient; replay never sees
# it)
COMPUTE_TARGETS = ("activations", "gradients", "local_gradients")
# what the optimizer step computes on this rank (fired as the step ends, before scout's seal)
UPDATE_TARGET = "update"
TARGETS = STATE_TARGETS + COMPUTE_TARGETS + (UPDATE_TARGET,)
KINDS = PROCESS_FAULTS + NUMERIC_FAULTS + TIMING_FAULTS


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int | None  # None: every rank
    step: int
    seconds: float = 3600.0
    code: int = 3
    restart: int | None = (
        0  # fire only in this run (SLURM_RESTART_COUNT), so a rerun is clean; None: every run
    )
    bit: int = (
        0  # bitflip: which bit of the element (0: lowest mantissa bit of float32; 30: exponent)
    )
    factor: float = 2.0  # scale: multiply the element by this
    target: str = "weights"  # numerical faults: "weights" or "optimizer" (its state, e.g. momentum)
    element: int = 0  # which element of the first parameter (flattened)
    sigma: float = 1e-3  # noise: standard deviation of the gaussian noise added to every element
    every: int = 0  # recurring: fire at step, step+every, ... (0: once, unless `until`)
    until: int | None = None  # recurring: last step it may fire (None: no end when `every` is set)
    layer: str = (
        ""  # activations/gradients: the layer's name in the model ("": the first with weights)
    )
    transient: bool = (
        False  # activations/gradients: in training only, never in scout's replay (a one-off upset)
    )

    def applies(self, rank: int, step: int, restart: int) -> bool:
        if not (
            (self.rank is None or self.rank == rank)
            and (self.restart is None or restart == self.restart)
        ):
            return False
        if step == self.step:
            return True
        period = self.every or (1 if self.until is not None else 0)
        return (
            period > 0
            and step > self.step
            and (step - self.step) % period == 0
            and (self.until is None or step <= self.until)
        )

    @property
    def is_compute(self) -> bool:
        return self.kind in NUMERIC_FAULTS and self.target in COMPUTE_TARGETS


def parse_fault(text: str) -> FaultSpec:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError("SCOUT_INJECT is empty; expected e.g. 'sleep,rank=1,step=5'")
    kind = parts[0]
    if kind not in KINDS:
        raise ConfigError(
            f"SCOUT_INJECT={text!r}: unknown fault kind {kind!r}; valid: {', '.join(KINDS)}"
        )
    values: dict[str, str] = {}
    for p in parts[1:]:
        if "=" not in p:
            raise ConfigError(f"SCOUT_INJECT={text!r}: {p!r} is not key=value")
        k, v = p.split("=", 1)
        values[k.strip()] = v.strip()
    valid = {
        "rank",
        "step",
        "seconds",
        "code",
        "restart",
        "bit",
        "factor",
        "target",
        "element",
        "sigma",
        "every",
        "until",
        "layer",
        "transient",
    }
    unknown = set(values) - valid
    if unknown:
        raise ConfigError(
            f"SCOUT_INJECT={text!r}: unknown key(s) {sorted(unknown)}; valid: "
            f"{', '.join(sorted(valid))}"
        )
    try:
        rank = None if values.get("rank", "all") == "all" else int(values["rank"])
        step = int(values.get("step", "1"))
        seconds = float(values.get("seconds", "3600"))
        code = int(values.get("code", "3"))
        restart = None if values.get("restart", "0") == "any" else int(values.get("restart", "0"))
        bit = int(values.get("bit", "0"))
        factor = float(values.get("factor", "2.0"))
        element = int(values.get("element", "0"))
        sigma = float(values.get("sigma", "1e-3"))
        every = int(values.get("every", "0"))
        until = int(values["until"]) if "until" in values else None
        transient = bool(int(values.get("transient", "0")))
    except ValueError as exc:
        raise ConfigError(f"SCOUT_INJECT={text!r}: {exc}") from None
    target = values.get("target", "weights")
    if step < 1:
        raise ConfigError(f"SCOUT_INJECT={text!r}: step must be >= 1")
    if not 0 <= bit <= 63:
        raise ConfigError(f"SCOUT_INJECT={text!r}: bit must be within 0..63")
    if target not in TARGETS:
        raise ConfigError(f"SCOUT_INJECT={text!r}: target must be one of {', '.join(TARGETS)}")
    if element < 0:
        raise ConfigError(f"SCOUT_INJECT={text!r}: element must be >= 0")
    if every < 0:
        raise ConfigError(f"SCOUT_INJECT={text!r}: every must be >= 0 (0: fire once)")
    if until is not None and until < step:
        raise ConfigError(f"SCOUT_INJECT={text!r}: until={until} is before step={step}")
    if not sigma >= 0:
        raise ConfigError(f"SCOUT_INJECT={text!r}: sigma must be >= 0")
    if target in (*COMPUTE_TARGETS, UPDATE_TARGET) and kind not in NUMERIC_FAULTS:
        raise ConfigError(
            f"SCOUT_INJECT={text!r}: target {target} takes a numerical kind "
            f"({', '.join(NUMERIC_FAULTS)}), not {kind!r}"
        )
    if kind in TIMING_FAULTS:
        if "seconds" not in values:
            raise ConfigError(
                f"SCOUT_INJECT={text!r}: {kind} needs seconds=X (its length per firing)"
            )
        if not 0 <= seconds <= 3600:
            raise ConfigError(f"SCOUT_INJECT={text!r}: seconds must be within 0..3600 for {kind}")
        if kind == "delay" and every == 0 and until is None:
            every = 1  # a straggler is slow every step, not once
    return FaultSpec(
        kind=kind,
        rank=rank,
        step=step,
        seconds=seconds,
        code=code,
        restart=restart,
        bit=bit,
        factor=factor,
        target=target,
        element=element,
        sigma=sigma,
        every=every,
        until=until,
        layer=values.get("layer", ""),
        transient=transient,
    )
