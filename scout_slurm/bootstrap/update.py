"""The optimizer update as a witness: a rank's update of its own state recomputed by every rank.

Where a shard has fewer than three replicas (pure FSDP, HSDP 2x2, DDP over two ranks) a wrong
update has nobody to outvote it: the at-rest witness signs what the update left, and a vote between
two replicas has no majority. So every K optimizer steps one rank (rotating) keeps, just before its
step, a slice of what its optimizer reads (parameters, gradients, state tensors; at most
`max_bytes` of parameters a round, the slice moving on each round over all the rank's parameters)
and, right after the step, the signature of what the step wrote there. Scout's side group
broadcasts the slice; every rank, the source included, runs the same update on it with a fresh
optimizer of the same class and hyperparameters, and the signatures vote:

- recomputations that differ from the majority of recomputations: that rank computes updates
  wrongly (a persistent fault); named.
- every recomputation agreeing and the source's training-time result differing: the source's
  update was wrong when it ran in training (a transient fault, or a persistent one on the source
  alone, which its own recomputation repeats: then it is also outvoted above); named.
- no majority among the recomputations (two ranks that differ): inconclusive, both said.

Only optimizers whose update of an element reads that element's own parameter, gradient and state
and a few scalars (torch.optim's SGD, Adam, AdamW, RMSprop, Adagrad): a slice recomputed alone
then gives the same bits (checked on CPU for every one of them at unaligned slices; the fused
kernels need slices aligned to their vector width: slices start at multiples of ALIGN elements).
Others (DeepSpeed's and Megatron's optimizers, LAMB-like norms over a tensor) are said once and not
replayed. A difference seen before any round agreed is held, not named: a job that changes its
gradients inside the step in a way scout does not see (a per-instance pre-hook registered after
scout's) would differ on every source; once a round agrees, held differences are named.
Imports torch; runs only in the job's Python."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scout_slurm.bootstrap.exitpolicy import Ending, end, ends
from scout_slurm.bootstrap.frameworks import say

ELEMENTWISE = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad")
ALIGN = 1024  # slice starts, in elements (fused Adam's vector path differs on a misaligned slice)
MAX_SEGMENTS = 64  # slices of parameters a round (small tensors: one each)
DEFAULT_MAX_BYTES = 1 << 20
_SCALARS = (int, float, bool, str, type(None))


def local(t: Any) -> Any:
    """This rank's own part of a tensor (a DTensor's shard), as a plain tensor."""
    return t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t


def hyperparameters(group: dict) -> dict | None:
    """A parameter group's settings as JSON values, or None when one is not (a tensor lr)."""
    out = {}
    for k, v in group.items():
        if k == "params":
            continue
        if isinstance(v, (list, tuple)) and all(isinstance(x, _SCALARS) for x in v):
            v = list(v)
        elif not isinstance(v, _SCALARS):
            return None
        out[k] = v
    return out


def plan_segments(
    sizes: list[int], cursor: int, budget: int
) -> tuple[list[tuple[int, int, int]], int]:
    """(param index, lo, hi) slices of the rank's parameters (flat element counts `sizes`) from
    `cursor` (an offset over all of them), at most `budget` elements (at least one slice, at most
    every element once), slice starts aligned to ALIGN within their tensor; and the next cursor
    (pure)."""
    total = sum(sizes)
    if total == 0:
        return [], 0
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    cursor %= total
    i = next(i for i in range(len(sizes)) if starts[i] <= cursor < starts[i] + sizes[i])
    lo = (cursor - starts[i]) // ALIGN * ALIGN
    out: list[tuple[int, int, int]] = []
    left, covered = max(budget, 1), 0
    while left > 0 and len(out) < MAX_SEGMENTS and covered < total:
        n = sizes[i]
        if n > lo:
            hi = n if n - lo <= left else min(n, lo + max(ALIGN, left // ALIGN * ALIGN))
            out.append((i, lo, hi))
            left, covered = left - (hi - lo), covered + hi - lo
            if hi < n:
                return out, starts[i] + hi
        i, lo = (i + 1) % len(sizes), 0
    return out, starts[i] + lo


def decide(recomputed: list[int | None], training: int, source: int) -> tuple[list[int], str]:
    """(ranks named, why inconclusive) from each rank's recomputation signature (None: it could not
    recompute) and the source's training-time one (pure). A strict majority of the recomputations
    is the right result; ranks outside it computed wrongly, and so did the source in training if
    its result is not it."""
    votes = [(r, s) for r, s in enumerate(recomputed) if s is not None]  # training 0: not known
    counts: dict[int, int] = {}
    for _, s in votes:
        counts[s] = counts.get(s, 0) + 1
    best = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
    if best[1] * 2 <= len(votes):
        if len(counts) <= 1 and training in (0, best[0]):
            return [], ""
        return [], (
            f"the {len(votes)} recomputations of rank {source}'s update split "
            f"{sorted(counts.values(), reverse=True)}: no majority tells which is right"
        )
    right = best[0]
    named = {r for r, s in votes if s != right}
    if training and training != right:
        named.add(source)
    return sorted(named), ""


class UpdateReplay:
    def __init__(
        self,
        *,
        every: int,
        rank: int,
        world: int,
        side: Any,
        run_dir: Path | None,
        node: str,
        originals: dict[str, Any],
        offset: int = 0,
        sdc_policy: str = "exit",
        max_bytes: int = DEFAULT_MAX_BYTES,
        mode: str = "auto",
        layout: Callable[[], list[tuple[int, ...]]] | None = None,
        corrupt: Callable[[int, int, int, Any], None] | None = None,
    ) -> None:
        self.every, self.rank, self.world, self.side = every, rank, world, side
        self.run_dir, self.node, self.offset, self.sdc_policy = run_dir, node, offset, sdc_policy
        self.broadcast, self.all_gather = originals["broadcast"], originals["all_gather"]
        self.barrier = originals["barrier"]
        self.max_bytes, self.mode, self.layout, self.corrupt = max_bytes, mode, layout, corrupt
        self.decided = mode != "auto"  # auto: on where some shard has fewer than 3 replicas
        self.off = "" if mode != "off" else "SCOUT_UPDATE_REPLAY=off"
        self.cursor = 0
        self.cap: dict[str, Any] | None = None
        self.cuda_device: Any = None  # the GPU this rank's optimizer updates on (None: CPU)
        self.trusted = False
        self.pending: dict[
            int, int
        ] = {}  # source -> first step its difference was seen, before trust
        self.clean_for: dict[int, int] = {}  # source -> the last step its update passed
        self.rounds = 0
        self.bytes_moved = 0
        self.said: set[str] = set()

    def _say_once(self, key: str, msg: str) -> None:
        if key not in self.said:
            self.said.add(key)
            if self.rank == 0:
                say(msg)

    def due(self, step: int) -> bool:
        return self.every > 0 and not self.off and step % self.every == 0 and self.world >= 2

    def source(self, step: int) -> int:
        return (step // self.every) % self.world

    def _decide_mode(self) -> None:
        if self.decided:
            return
        self.decided = True
        groups = self.layout() if self.layout is not None else []
        smallest = min((len(g) for g in groups), default=1)
        if (
            smallest >= 3
        ):  # not said in the job's output (the common case); the coverage record omits it
            self.off = (
                f"every shard has {smallest} or more replicas: their state votes name a wrong "
                "update; "
                "SCOUT_UPDATE_REPLAY=on replays it anyway"
            )
        else:
            self._say_once(
                "on",
                f"optimizer update replay every {self.every} steps (shards with {smallest} "
                f"replica{'s' if smallest != 1 else ''}: no majority for a state vote), at most "
                f"{self.max_bytes} bytes of parameters a round, rotating over the ranks",
            )

    # ---- the source, around its own step -----------------------------------------------------

    def before_step(self, step: int, optimizer: Any) -> None:
        """Right before optimizer step `step`: the source keeps the slice its step will read."""
        self.cap = None
        if not self.due(step):
            return
        # where this rank's own update runs: the recomputation of the source's runs there too
        self.cuda_device = next(
            (p.device for g in optimizer.param_groups for p in g["params"] if p.is_cuda), None
        )
        self._decide_mode()
        if self.off or self.source(step) != self.rank:
            return
        try:
            self.cap = self._capture(step, optimizer)
        except Exception as exc:
            self.cap = {"why": f"capture failed: {exc!r}"}

    def _capture(self, step: int, optimizer: Any) -> dict:
        import torch

        name = type(optimizer).__name__
        if name not in ELEMENTWISE or not type(optimizer).__module__.startswith("torch.optim"):
            return {
                "why": f"optimizer {type(optimizer).__module__}.{name} is not one scout recomputes "
                f"(torch.optim's {', '.join(ELEMENTWISE)})"
            }
        params = [
            (gi, p)
            for gi, g in enumerate(optimizer.param_groups)
            for p in g["params"]
            if p.grad is not None
        ]
        groups = [hyperparameters(g) for g in optimizer.param_groups]
        if any(g is None for g in groups):
            return {"why": "a parameter group setting is not a number (a tensor learning rate)"}
        sizes = [local(p).numel() for _, p in params]
        item = max(local(p).element_size() for _, p in params) if params else 4
        segments, self.cursor = plan_segments(sizes, self.cursor, max(1, self.max_bytes // item))
        segs, tensors = [], []
        with torch.no_grad():
            for i, lo, hi in segments:
                gi, p = params[i]
                lp = local(p)
                state = {}
                for k, v in sorted(optimizer.state.get(p, {}).items()):
                    if isinstance(v, torch.Tensor):
                        lv = local(v)
                        if lv.numel() == lp.numel() and lv.numel() > 1:
                            state[k] = ("slice", lv.detach().reshape(-1)[lo:hi])
                        elif lv.numel() == 1:
                            state[k] = ("whole", lv.detach())
                        else:
                            return {
                                "why": f"optimizer state {k!r} is neither per element nor a scalar"
                            }
                    elif isinstance(v, _SCALARS):
                        state[k] = ("value", v)
                    else:
                        return {"why": f"optimizer state {k!r} is a {type(v).__name__}"}
                seg = {"param": i, "group": gi, "lo": lo, "hi": hi, "state": {}}
                for label, t in (
                    ("p", lp.detach().reshape(-1)[lo:hi]),
                    ("g", local(p.grad).detach().reshape(-1)[lo:hi]),
                ):
                    seg[label] = len(tensors)
                    tensors.append(t)
                for k, (how, v) in state.items():
                    if how == "value":
                        seg["state"][k] = ["value", v]
                    else:
                        seg["state"][k] = [how, len(tensors)]
                        tensors.append(v)
                segs.append(seg)
            # copies on the CPU (scout's side group is gloo), each with the device type it came from
            devices = [t.device.type for t in tensors]
            tensors = [t.to("cpu", copy=True).contiguous() for t in tensors]
        return {
            "step": step,
            "cls": name,
            "groups": groups,
            "segments": segs,
            "tensors": tensors,
            "devices": devices,
            "params": [params[i][1] for i, _, _ in segments],
            "opt": optimizer,
        }

    def _training_signature(self, cap: dict) -> int:
        """What the step wrote over the captured slice, signed (the source, right after its
        step).
        """
        from scout_slurm.bootstrap.signing import state_signature

        opt = cap["opt"]
        out = []
        for seg, p in zip(cap["segments"], cap["params"]):
            lo, hi = seg["lo"], seg["hi"]
            out.append((f"{seg['param']}.p", local(p).detach().reshape(-1)[lo:hi]))
            st = opt.state.get(p, {})
            for k in sorted(st):
                v = st[k]
                if hasattr(v, "numel"):
                    lv = local(v)
                    out.append(
                        (f"{seg['param']}.{k}", lv.reshape(-1)[lo:hi] if lv.numel() > 1 else lv)
                    )
        return _pos(state_signature(out))

    # ---- every rank, right after the step ----------------------------------------------------

    def after_step(self, step: int, optimizer: Any) -> None:
        if not self.due(step) or self.off:
            return
        import torch

        src = self.source(step)
        cap, self.cap = self.cap, None
        training = 0
        if self.rank == src and cap is not None and "why" not in cap:
            try:
                training = self._training_signature(cap)
            except Exception as exc:
                self._say_once("sig", f"rank {self.rank}'s update not signed: {exc!r}")
        got = self._exchange(src, cap)
        if got is None:
            return
        meta, tensors = got
        try:
            mine, err = self._recompute(step, meta, tensors), ""
        except Exception as exc:
            mine, err = None, repr(exc)
        row = torch.tensor([1 if mine is not None else 0, mine or 0, training], dtype=torch.int64)
        rows = [torch.zeros_like(row) for _ in range(self.world)]
        self.all_gather(rows, row, group=self.side)
        self.rounds += 1
        if err:
            self._say_once(
                "err", f"rank {self.rank} could not recompute an optimizer update: {err}"
            )
        recomputed = [int(r[1]) if int(r[0]) else None for r in rows]
        named, why = decide(recomputed, int(rows[src][2]), src)
        self._conclude(step, src, named, why, recomputed, int(rows[src][2]), meta)

    def _exchange(self, src: int, cap: dict | None) -> tuple[dict, list[Any]] | None:
        from scout_slurm.bootstrap.wire import PackError, broadcast_packed

        blob = None
        if self.rank == src:
            if (
                cap is not None and "why" in cap
            ):  # said by the source, once: every rank turns it off
                say(f"optimizer update replay off: {cap['why']}")
                self.off = cap["why"]
            elif cap is not None:
                blob = json.dumps(
                    {
                        "cls": cap["cls"],
                        "groups": cap["groups"],
                        "segments": cap["segments"],
                        "devices": cap["devices"],
                    }
                ).encode()
        try:
            got = broadcast_packed(
                self.broadcast, self.side, self.rank, src, blob, cap["tensors"] if blob else ()
            )
        except PackError as exc:  # the others were told there is nothing: they turn off below
            say(f"optimizer update replay off: its slice cannot be sent ({exc})")
            self.off = f"the slice cannot be sent ({exc})"
            return None
        if got is None:
            if self.rank != src:
                self.off = f"rank {src}'s optimizer cannot be recomputed (it said why)"
            return None
        raw, tensors, nbytes = got
        self.bytes_moved += nbytes
        return json.loads(raw), tensors

    def _recompute(self, step: int, meta: dict, tensors: list[Any]) -> int:
        """The source's update of its slice run here with a fresh optimizer; its result signed."""
        import inspect

        import torch

        from scout_slurm.bootstrap.signing import state_signature

        if meta["cls"] not in ELEMENTWISE:
            raise ValueError(f"optimizer {meta['cls']!r} is not one scout recomputes")
        cls = getattr(torch.optim, meta["cls"])
        cuda = None
        if "cuda" in meta["devices"]:  # this rank's GPU, not the process's current one (GPU 0)
            cuda = self.cuda_device or torch.device("cuda", torch.cuda.current_device())
        tensors = [t.to(cuda) if kind == "cuda" else t for t, kind in zip(tensors, meta["devices"])]
        by_group: dict[int, list[tuple[dict, Any]]] = {}
        for seg in meta["segments"]:
            q = torch.nn.Parameter(tensors[seg["p"]].clone(), requires_grad=True)
            q.grad = tensors[seg["g"]].clone()
            by_group.setdefault(seg["group"], []).append((seg, q))
        done = []
        for gi, items in sorted(by_group.items()):
            hyper = {
                k: (tuple(v) if isinstance(v, list) else v) for k, v in meta["groups"][gi].items()
            }
            accepted = inspect.signature(cls.__init__).parameters
            opt = cls(
                [q for _, q in items],
                **{k: v for k, v in hyper.items() if k in accepted and k != "params"},
            )
            opt.param_groups[0].update(
                hyper
            )  # the group's other keys too (a scheduler's initial_lr)
            for seg, q in items:
                state = {
                    k: (v if how == "value" else tensors[v].clone())
                    for k, (how, v) in seg["state"].items()
                }
                if state:
                    opt.state[q] = state
            # the step as the class defines it, without optimizer hooks (scout's own, the job's
            # global ones)
            step_fn = getattr(type(opt).step, "__wrapped__", type(opt).step)
            with torch.no_grad():
                step_fn(opt)
            for seg, q in items:
                if (
                    self.corrupt is not None
                ):  # the fault injector's persistent update fault, on this rank
                    self.corrupt(step, seg["param"], seg["lo"], q.data)
                done.append((seg, q, opt))
        # signed as the source signs its training-time result: segment by segment, parameter then
        # state
        order = {id(seg): i for i, seg in enumerate(meta["segments"])}
        out = []
        for seg, q, opt in sorted(done, key=lambda d: order[id(d[0])]):
            out.append((f"{seg['param']}.p", q.detach()))
            st = opt.state.get(q, {})
            for k in sorted(st):
                if isinstance(st[k], torch.Tensor):
                    out.append((f"{seg['param']}.{k}", st[k]))
        return _pos(state_signature(out))

    def _conclude(
        self,
        step: int,
        src: int,
        named: list[int],
        why: str,
        recomputed: list[int | None],
        training: int,
        meta: dict,
    ) -> None:
        gstep = step + self.offset
        late: list[tuple[int, int]] = []
        if not named and not why:
            self.clean_for[src] = gstep
            if not self.trusted:
                self.trusted = True
                late = sorted(self.pending.items())
                self.pending.clear()
            if not late:
                return
        elif not self.trusted and not why and named == [src]:
            # the source alone, before any round agreed: held (see the module's docstring)
            self.pending.setdefault(src, gstep)
            self._say_once(
                f"held:{src}",
                f"rank {src}'s optimizer update at step {gstep} differs from every "
                "recomputation of it; held until a round agrees (the job may change "
                "gradients inside its step where scout does not see)",
            )
            return
        confirmed = sorted(set(named) | {r for r, _ in late})
        writer = min((r for r in range(self.world) if r not in confirmed), default=0)
        if self.rank == writer:
            self._write(step, src, named, why, recomputed, training, meta, late)
        self.barrier(group=self.side)  # the finding is on disk before the rank leaves
        if self.rank in confirmed and ends(Ending.SDC, self.sdc_policy):
            say(
                f"rank {self.rank}'s optimizer update differs from the recomputations of it; "
                f"ending this rank (exit {Ending.SDC.code})"
            )
            end(Ending.SDC)

    def _write(self, step, src, named, why, recomputed, training, meta, late) -> None:
        if self.run_dir is None:
            return
        from scout_slurm.bootstrap.evidencewrites import write_record
        from scout_slurm.evidence.records import Finding, FindingKind

        gstep, now = step + self.offset, time.time()
        elements = sum(s["hi"] - s["lo"] for s in meta["segments"])
        sigs = "; ".join(
            f"rank {r}: " + (f"{s:016x}" if s is not None else "none")
            for r, s in enumerate(recomputed)
        )
        details = (
            f"optimizer update replay: {meta['cls']} over {elements} elements of rank {src}'s "
            "parameters "
            f"({len(meta['segments'])} slices), kept before its step {gstep} and recomputed by all "
            f"{self.world} ranks",
            f"recomputations {sigs}; rank {src}'s training-time result {training:016x}",
        )
        records = []
        if why:
            records.append(
                (
                    f"inconclusive-update-rank-{src}-step-{gstep}",
                    Finding(
                        rank=src,
                        node="",
                        kind=FindingKind.NO_MAJORITY,
                        at=now,
                        summary=f"optimizer update of rank {src} at step {gstep}: inconclusive: "
                        f"{why}",
                        details=details,
                        step=gstep,
                        since_step=gstep,
                        component="optimizer",
                    ),
                )
            )
        for r in named:
            last = self.clean_for.get(r, -1)
            since = last + 1 if last >= 0 else self.offset + 1
            if (
                r == src
                and recomputed[r] is not None
                and recomputed[r]
                == next((s for q, s in enumerate(recomputed) if q != r and s is not None), None)
            ):
                what = (
                    f"rank {r}'s optimizer update at step {gstep} differs from every "
                    "recomputation of it "
                    f"(all {self.world} ranks, its own included, agree): a fault in its "
                    "update as it ran "
                    "in training"
                )
            elif r == src:
                what = (
                    f"rank {r}'s optimizer update at step {gstep} and its own recomputation "
                    "of it differ "
                    "from the other ranks' recomputations: a fault in its update, repeated"
                )
            else:
                what = (
                    f"rank {r}'s recomputation of rank {src}'s optimizer update at step "
                    f"{gstep} differs from "
                    "the majority of the ranks': a fault in its compute, which its own "
                    "updates share"
                )
            records.append(
                (
                    f"sdc-update-rank-{r}-step-{gstep}",
                    Finding(
                        rank=r,
                        node=self.node if r == self.rank else "",
                        kind=FindingKind.SDC,
                        at=now,
                        summary=what
                        + (
                            f"; its state may be wrong since step {since} (its last update "
                            "replay that "
                            f"passed was at step {last})"
                            if last >= 0
                            else "; no earlier update replay of it passed in this run (from step "
                            f"{since})"
                        ),
                        details=details,
                        step=gstep,
                        since_step=since,
                        component="optimizer",
                    ),
                )
            )
        for r, at in late:
            records.append(
                (
                    f"sdc-update-rank-{r}-step-{at}",
                    Finding(
                        rank=r,
                        node=self.node if r == self.rank else "",
                        kind=FindingKind.SDC,
                        at=now,
                        summary=(
                            f"rank {r}'s optimizer update at step {at} differed from every "
                            "recomputation of it; "
                            f"named at step {gstep}, when a round agreed (the recomputation "
                            "is faithful)"
                        ),
                        details=details,
                        step=at,
                        since_step=at,
                        component="optimizer",
                    ),
                )
            )
        from scout_slurm.evidence.layout import RunFolder

        for name, finding in records:
            try:
                write_record(RunFolder(self.run_dir).finding_path(name), finding)
            except Exception as exc:
                say(f"finding not written: {exc!r}")


def _pos(sig: int) -> int:
    """A 64-bit signature as a positive int64 (0 is kept for 'none')."""
    return (sig & 0x7FFF_FFFF_FFFF_FFFF) or 1
