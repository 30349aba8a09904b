"""In-situ replay inside the training process. Compute corruption (an activation or gradient the
hardware got wrong) spreads through the all-reduce into every replica's state, so state votes
cannot see it. Every K optimizer steps one rank (rotating) captures one layer's input (forward
pre-hook), the gradient of its output (tensor hook) and the RNG state (CPU, and the layer's GPU);
scout's side group (never a training communicator) broadcasts them as CPU tensors; every rank moves
them to the device of its layer and recomputes its forward and backward there with its own live
weights under deterministic algorithms, the job's RNG streams forked around it (CPU and that
GPU), and the signatures of output, input
gradient and weight gradient vote by strict majority. The replay runs just before the optimizer
step, so the weights are those the step's forward used. Only layers whose recomputation can be
exact are replayed (bootstrap.determinism), and a mismatch ends a rank only on a layer that has
agreed on every rank before: a first one on a layer that never agreed leaves it out instead.

The models themselves (wrappers, replicas, compiled or not) are bootstrap.frameworks'. Imports
torch; runs only in the job's Python.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scout_slurm.bootstrap.exitpolicy import Ending, end, ends
from scout_slurm.bootstrap.frameworks import (
    inner,
    is_compiled,
    is_dtensor,
    is_fsdp,
    megatron_tensor_parallel,
    parameterised_leaves,
    replica_layout,
    say,
)
from scout_slurm.bootstrap.replicas import GroupVote, replay_plan, shard_group, vote_group
from scout_slurm.bootstrap.signing import state_signature
from scout_slurm.evidence.records import VoteOutcome
from scout_slurm.jobconfig import REPLAY_MAX_BYTES

DEFAULT_MAX_BYTES = REPLAY_MAX_BYTES  # SCOUT_REPLAY_MAX_BYTES (scout_slurm.jobconfig)


# ---- replay -----------------------------------------------------------------------------------


class Replay:
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
        current_step: Callable[[], int],
        max_bytes: int = DEFAULT_MAX_BYTES,
        offset: int = 0,
        sdc_policy: str = "exit",
    ) -> None:
        self.every, self.rank, self.world, self.side = every, rank, world, side
        self.sdc_policy = (
            sdc_policy  # SCOUT_SDC_POLICY: "exit" ends an outvoted rank (bootstrap.exitpolicy)
        )
        self.run_dir, self.node = run_dir, node
        self.broadcast, self.all_gather = originals["broadcast"], originals["all_gather"]
        self.barrier = originals["barrier"]
        self.current_step = current_step
        self.max_bytes = max_bytes
        self.offset = offset
        self.roots: list[Any] = []
        self.layers: list[tuple[str, Any]] | None = None
        self.tied: set[int] = set()  # ids of parameters two layers share
        self.groups: list[tuple[int, ...]] = []
        self.said: set[tuple[str, ...]] = set()  # what was said in the job's output once already
        self.layer_clean: dict[int, int] = {}  # layer index -> the last step a replay of it passed
        self.failed_rounds = 0  # rounds in which some rank could not recompute
        self.replaying = False
        self.cap_step = -1
        self.cap: dict[str, Any] | None = None
        self.cap_reason = ""
        self.replays = 0
        self.trusted: set[tuple[int, str]] = (
            set()
        )  # (layer, "output"/"weight gradient") seen agreeing once
        # differences seen before their layer was trusted: (layer, what) -> {source: first step},
        # named
        # when a later comparison on that layer agrees (see `trust`; the same on every rank)
        self.pending: dict[tuple[int, str], dict[int, int]] = {}
        self.last_clean = -1
        self.ready_from = 0  # the capture hooks attach at the first step: replays start at the next
        self.handles: list[Any] = []  # the capture hooks set for the coming step (`_arm`)
        self.next_call = (
            0  # the next step whose `before_step` has work (the caller skips the others)
        )
        self.compiled = ""  # which model runs compiled ("": none): nothing is replayed then
        # layers whose recomputations matched on every rank at least once in this run: only there
        # does a mismatch end a rank (a kernel that differs by rank looks like a fault at first)
        self.agreed: set[int] = set()
        # layer index -> why it is not replayed (the same on every rank: decided on gathered
        # values): the determinism policy's verdict at the first round, or a first mismatch
        self.excluded: dict[int, str] = {}
        self.policy_applied = False
        self.guard: Any = None  # the runtime's guard (bootstrap.guard), around the capture hooks

    def add_root(self, root: Any, *, compiled: bool = False) -> None:
        """A model the job trains; `compiled`: the job runs it through torch.compile."""
        if self.layers is None and all(root is not r for r in self.roots):
            self.roots.append(root)
            if compiled or any(is_compiled(m) for m in inner(root).modules()):
                self.compiled = f"{type(inner(root)).__name__} runs compiled (torch.compile)"

    def compiled_reason(self) -> str:
        """Why no layer is replayed in a compiled model ("": not compiled): its layers' inputs exist
        only
        inside the compiled graph, and a hook of scout's there would change the job's graph."""
        if not self.compiled:
            return ""
        return (
            f"{self.compiled}: its layers' inputs exist only inside the compiled graph, and "
            "capturing them "
            "would change the job's graph; state votes and timing votes still run"
        )

    # which layers can be replayed: decided once, the same on every rank (same model)
    def _prepare(self, step: int) -> None:
        if self.layers is not None or not self.roots:
            return
        self.ready_from = step + 1
        self.layers = []
        if self.compiled:
            if self.rank == 0:
                say(f"in-situ replay not run: {self.compiled_reason()}")
            return
        self.groups = replica_layout(self.roots, self.world)[0]
        skipped = []
        leaves = parameterised_leaves(self.roots)
        # tied weights (an embedding and the output layer sharing one): the training-time weight
        # gradient sums every use, so it is not set against one layer's recomputation
        holders: dict[int, list[str]] = {}
        for name, m in leaves:
            for p in m.parameters(recurse=False):
                holders.setdefault(id(p), []).append(name)
        self.tied = {i for i, names in holders.items() if len(names) > 1}
        tied_names = sorted({"/".join(n) for n in holders.values() if len(n) > 1})
        for name, m in leaves:
            params = list(m.parameters(recurse=False))
            nbytes = 2 * sum(
                p.numel() * p.element_size() for p in params
            )  # full weights and their gradients
            bad = [
                p
                for p in params
                if is_dtensor(p)
                and not all(
                    pl.is_replicate() or (pl.is_shard() and pl.dim == 0) for pl in p.placements
                )
            ]
            tp = megatron_tensor_parallel(m)
            if is_fsdp(m):
                skipped.append(
                    f"{name} (an FSDP unit itself: calling it would all-gather on the "
                    "training group)"
                )
            elif tp > 1:
                skipped.append(
                    f"{name} (a Megatron tensor-parallel layer over {tp} ranks: its "
                    "recomputation would "
                    "run collectives on the training's tensor-parallel group, and each rank "
                    "holds a "
                    "different slice of its weights)"
                )
            elif any(hasattr(p, "ds_tensor") for p in params):
                skipped.append(
                    f"{name} (DeepSpeed ZeRO-3 partitioned weights: not gathered for a replay)"
                )
            elif bad:
                skipped.append(f"{name} (sharded other than along dim 0)")
            elif nbytes > self.max_bytes:
                skipped.append(
                    f"{name} ({nbytes} bytes of weights and gradients > cap {self.max_bytes})"
                )
            else:
                self.layers.append((name, m))
        if self.rank == 0:
            say(
                f"in-situ replay every {self.every} steps over layers {[n for n, _ in self.layers]}"
                + (f"; not replayed: {'; '.join(skipped)}" if skipped else "")
                + (
                    f"; tied weights ({', '.join(tied_names)}): replayed, their training-time "
                    "weight gradient (the sum of every use) not compared with one layer's"
                    if tied_names
                    else ""
                )
            )

    def _apply_determinism_policy(self) -> None:
        """Leave out the layers whose recomputation cannot repeat training's bits
        (bootstrap.determinism), on every rank alike: each rank decides on its own settings and
        GPU, the decisions are gathered over the side group, and a layer any rank cannot recompute
        exactly is replayed nowhere. Run at the first replay round, where every rank meets scout's
        side group anyway (not at the first step: a rank stuck there would leave its peers in
        scout's exchange rather than the job's), with the job's switches as training set them.
        Said once per reason, by rank 0; the layers keep their turns in the rotation (its order
        is the same on every rank from the first step on)."""
        import torch

        from scout_slurm.bootstrap.determinism import (
            inexact_reason,
            multiprocessor_count,
            read_settings,
        )

        layers = self.layers or []
        devices = [layer_device(m, {}) for _, m in layers]
        sm = max((multiprocessor_count(d) for d in devices), default=0)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        self.all_gather(counts, torch.tensor([sm], dtype=torch.int64), group=self.side)
        settings = read_settings(tuple(int(c) for c in counts if int(c) > 0))
        mine = [inexact_reason(m, d.type, settings) for (_, m), d in zip(layers, devices)]
        flags = torch.tensor([1 if r else 0 for r in mine] + [0], dtype=torch.int64)
        gathered = [torch.zeros_like(flags) for _ in range(self.world)]
        self.all_gather(gathered, flags, group=self.side)
        by_reason: dict[str, list[str]] = {}
        for i, (name, _) in enumerate(layers):
            others = [r for r in range(self.world) if int(gathered[r][i])]
            if others:
                why = mine[i] or f"not exact on rank(s) {others} (their settings or GPUs)"
                self.excluded[i] = why
                by_reason.setdefault(why, []).append(name)
        if self.rank == 0:
            for why, names in by_reason.items():
                self._say_once(
                    ("inexact", why),
                    f"in-situ replay: layer(s) {names} not replayed: their recomputation cannot "
                    f"repeat training's bits ({why})",
                )

    def not_checked(self) -> tuple[str, ...]:
        """The layers the replay does not check, with why (for the run's coverage record)."""
        names = [n for n, _ in self.layers or ()]
        return tuple(f"{names[i]}: {why}" for i, why in sorted(self.excluded.items()))

    def _say_once(self, key: tuple[str, ...], msg: str) -> None:
        if key not in self.said:
            self.said.add(key)
            say(msg)

    def _plan(self, step: int):
        return replay_plan(step, self.every, len(self.layers or ()), self.world)

    def _pre_hook(self, idx: int) -> Callable:
        def capture_input(module, args, kwargs):
            if self.replaying:
                return None
            step = self.current_step()
            plan = self._plan(step)
            if (
                plan is None
                or plan.layer_index != idx
                or plan.source != self.rank
                or self.cap_step == step
            ):
                # not this layer's turn, or already captured (a layer called twice per step)
                return None
            import torch

            self.cap_step, self.cap, self.cap_reason = step, None, ""
            tensors: list[Any] = []
            try:
                spec = _placeholders((tuple(args), dict(kwargs)), tensors)
            except TypeError as exc:
                self.cap_reason = f"its inputs cannot be sent to the replicas ({exc})"
                return None
            if not tensors:
                self.cap_reason = "its inputs hold no tensor"
                return None
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            if 2 * nbytes > self.max_bytes:
                self.cap_reason = f"its inputs ({nbytes} bytes) and output gradients exceed the cap"
                return None
            self.cap = {
                "spec": spec,
                "x": [t.detach().clone() for t in tensors],
                "rng": torch.get_rng_state(),
                "rng_cuda": _cuda_rng_state(tensors[0].device),
                "gy": None,
                "idx": idx,
                "calls": 0,
                "gw": {},
                "autocast": _autocast_on(tensors),
            }
            return None

        return capture_input

    def _post_hook(self, idx: int) -> Callable:
        def capture_output_gradient(module, args, output):
            cap = self.cap
            if (
                self.replaying
                or cap is None
                or self.cap_step != self.current_step()
                or cap["idx"] != idx
            ):
                return None
            cap["calls"] += 1  # a layer called twice a step sums two calls in its weights' gradient
            if "hooked" in cap:
                return None
            cap["hooked"] = True
            outs = output_tensors(output)
            # the source as a witness: what its hardware computed in training, to set against the
            # recomputations of the same input (its own included)
            cap["out_sig"] = _pos(state_signature((f"out{i}", o) for i, o in enumerate(outs)))
            cap["gy"] = [None] * len(outs)  # one per tensor output; None where no gradient arrives
            for i, o in enumerate(outs):
                # not a leaf: a layer may return one of its own parameters (Megatron's bias with
                # skip_bias_add), and a hook on a parameter would stay on it for good
                if getattr(o, "requires_grad", False) and o.grad_fn is not None:

                    def keep(g, i=i):
                        if cap["gy"][i] is None:
                            cap["gy"][i] = g.detach().clone()

                    o.register_hook(self._guarded(keep))
            return None

        return capture_output_gradient

    def _grad_hook(self, idx: int, pname: str) -> Callable:
        def capture_weight_gradient(g):
            cap = self.cap
            if self.replaying or cap is None or self.cap_step != self.current_step():
                return None
            plan = self._plan(self.cap_step)
            if plan is None or plan.layer_index != idx:
                return None
            # this rank's own gradient, before any reduction: every arrival of this step, kept
            cap["gw"].setdefault(pname, []).append(g.detach().clone())
            return None

        return capture_weight_gradient

    def _training_signatures(self, layer: Any, cap: dict | None) -> tuple[int, int, str]:
        """The source's training-time output and weight-gradient signatures (0: not comparable,
        with why): its own values from the step, to set against the recomputations."""
        if cap is None or "out_sig" not in cap:
            return 0, 0, "no training-time output captured"
        if cap["autocast"]:
            return 0, 0, "the layer ran under autocast in training (the replay does not)"
        if cap["calls"] != 1:
            return (
                cap["out_sig"],
                0,
                f"the layer ran {cap['calls']} times in the step (its weight gradient sums them)",
            )
        import torch

        params = [(n, p) for n, p in layer.named_parameters(recurse=False) if p.requires_grad]
        if any(id(p) in self.tied for _, p in params):
            return (
                cap["out_sig"],
                0,
                "its weight is tied to another layer's (the gradient sums both)",
            )
        if not params or any(is_dtensor(p) for _, p in params):
            return (
                cap["out_sig"],
                0,
                "sharded weights (their gradients are reduced before they are seen)",
            )
        grads = cap["gw"]
        if not grads or any(len(grads.get(n, ())) > 1 for n, _ in params):
            return cap["out_sig"], 0, "the weight gradient did not arrive once, whole"
        none = torch.zeros(0)
        sig = state_signature((n, grads[n][0] if n in grads else none) for n, _ in params)
        return cap["out_sig"], _pos(sig), ""

    def _exchange(
        self, plan: Any, cap: dict | None
    ) -> tuple[Any, list[Any], list[Any], Any] | None:
        """The source's captured call (argument structure, input tensors, output gradients, RNG
        state), on every rank, in two broadcasts; None when the source has nothing to send this
        round."""
        import pickle

        from scout_slurm.bootstrap.wire import PackError, broadcast_packed

        src = plan.source
        blob, tensors = None, []
        if self.rank == src and cap is not None:
            gy = cap["gy"] or []
            blob = pickle.dumps((cap["spec"], [g is not None for g in gy], len(cap["x"])))
            tensors = [*cap["x"], *(g for g in gy if g is not None), cap["rng_cuda"], cap["rng"]]
        try:
            got = broadcast_packed(self.broadcast, self.side, self.rank, src, blob, tensors)
        except PackError as exc:  # the others were told there is nothing to replay
            self._say_once(
                ("unsent", str(plan.layer_index)),
                f"replay at step {plan.step}: the captured inputs cannot be sent ({exc})",
            )
            return None
        if got is None:
            return None
        raw, sent, _ = got
        spec, has_gy, n_x = pickle.loads(raw)
        xs, rest = sent[:n_x], iter(sent[n_x:-2])
        gys = [next(rest) if present else None for present in has_gy]
        # a copy: torch.set_rng_state crashed the process (SIGSEGV) on a view into the payload
        return spec, xs, gys, (sent[-1].clone(), sent[-2].clone())

    def _arm(self, step: int) -> None:
        """The capture hooks for step `step`: on the layer whose source this rank is then, on no
        layer otherwise (a hook's Python would run at every call of every layer, and a module with
        hooks leaves torch's fast call path). Set before that step's forward, removed after it."""
        for h in self.handles:
            h.remove()
        self.handles = []
        plan = self._plan(step) if self.layers and step >= self.ready_from else None
        if plan is None or plan.source != self.rank or plan.layer_index in self.excluded:
            return
        idx = plan.layer_index
        m = self.layers[idx][1]
        self.handles = [
            m.register_forward_pre_hook(self._guarded(self._pre_hook(idx)), with_kwargs=True),
            m.register_forward_hook(self._guarded(self._post_hook(idx))),
        ]
        for pname, p in m.named_parameters(recurse=False):
            if p.requires_grad and not is_dtensor(
                p
            ):  # FSDP2 reduces its unsharded copies: not seen here
                self.handles.append(p.register_hook(self._guarded(self._grad_hook(idx, pname))))

    def _guarded(self, hook: Callable) -> Callable:
        """A capture hook runs inside the job's forward and backward: inside the runtime's guard
        (bootstrap.guard), a failure of scout's switches the replay off and returns None (the job's
        tensors unchanged), never into the job's call."""
        guard = self.guard
        if guard is None:
            return hook

        def guarded(*args: Any) -> Any:
            if not guard.on("in-situ replay"):
                return None
            return guard.run("in-situ replay", hook, *args)

        return guarded

    def due(self, step: int) -> bool:
        """Whether `before_step(step)` does more than set the capture hooks."""
        return self.layers is None or (
            bool(self.layers) and step >= self.ready_from and self._plan(step) is not None
        )

    def before_step(self, step: int) -> None:
        """Called before optimizer step `step` on every rank; replays when the schedule says so,
        then sets the capture hooks for the next step."""
        try:
            self._before_step(step)
        finally:
            if self.every > 0 and self.layers:
                self._arm(step + 1)
            self.next_call = self._next_call(step)

    def _next_call(self, step: int) -> float:
        """After `before_step(step)`: the next step with work. Every step until the layers are known
        or while capture hooks are set (they come off at the next call); else the next replay step
        or the step before it (which sets the hooks), whichever comes first; never with no
        layers."""
        e = self.every
        if self.layers is None or self.handles:
            return step + 1
        if e <= 0 or not self.layers:
            return float("inf")
        replay_at = step + e - step % e
        return replay_at - 1 if replay_at - 1 > step else replay_at

    def _before_step(self, step: int) -> None:
        self._prepare(step)
        plan = self._plan(step) if self.layers and step >= self.ready_from else None
        if plan is not None and not self.policy_applied:
            self.policy_applied = True
            self._apply_determinism_policy()
        if plan is None or plan.layer_index in self.excluded:
            return
        import torch

        t0 = time.perf_counter()
        name, layer = self.layers[plan.layer_index]
        cap = None
        if self.rank == plan.source:
            cap = self.cap if self.cap_step == step else None
            if cap is None:
                why = self.cap_reason or "the layer did not run in this step"
                self._say_once(
                    ("skipped", name, why),
                    f"replay of layer {name!r} at step {step} skipped: {why}",
                )
        sent = self._exchange(plan, cap)
        self.cap = None
        if sent is None:
            return
        spec, xs, gys, rng = sent
        has_gy = any(g is not None for g in gys)
        weights = {n: self._full(p) for n, p in layer.named_parameters(recurse=False)}
        mine = torch.zeros(7, dtype=torch.int64)
        if self.rank == plan.source:
            train_out, train_gw, why = self._training_signatures(layer, cap)
            mine[5], mine[6] = train_out, train_gw
            if (
                why and has_gy and self.rank == 0
            ):  # once a reason for the job, not once a source and layer
                self._say_once(
                    ("witness", why),
                    f"replay of layer {name!r} (and of any layer alike): the source's "
                    f"training-time {'values not' if not train_out else 'output only'} "
                    f"compared ({why})",
                )
        # the layer's stored weights (this rank's shard): replicas must agree on them first
        mine[4] = _pos(state_signature(layer.named_parameters(recurse=False)))
        try:
            sig_out, sig_gx, sig_gw = self._recompute(layer, weights, spec, xs, gys, rng)
            mine[0], mine[1], mine[2], mine[3] = 1, sig_out, sig_gx, sig_gw
        except Exception as exc:
            error = repr(exc)[:300]
        else:
            error = ""
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        self.all_gather(gathered, mine, group=self.side)
        self.replays += 1
        failed = [r for r, g in enumerate(gathered) if int(g[0]) != 1]
        if failed:
            self.failed_rounds += 1
            if (
                self.rank == failed[0]
            ):  # one line for the whole job, the first time this layer fails
                self._say_once(
                    ("failed", name),
                    f"replay of layer {name!r} at step {step}: rank(s) {failed} could "
                    "not recompute it "
                    f"({'rank ' + str(self.rank) + ': ' + error if error else 'no error'}); "
                    "no vote on this layer (said once; later rounds are counted in the evidence)",
                )
            return
        stored = [int(g[4]) for g in gathered]
        if any(len(g) >= 2 and len({stored[r] for r in g}) > 1 for g in self.groups):
            # corrupted state, not compute: the state vote names it (with the right component)
            if self.rank == 0:
                self._say_once(
                    ("stored", name),
                    f"replay of layer {name!r} at step {step}: the layer's stored "
                    "weights differ among replicas; left to the state vote",
                )
            return
        group = tuple(
            range(self.world)
        )  # same full layer everywhere: every rank is a replica of the compute
        votes = [
            vote_group(what, group, [int(g[i]) for g in gathered])
            for i, what in ((1, "output"), (2, "input gradient"), (3, "weight gradient"))
            if has_gy or i == 1
        ]
        differs, agrees = source_witness(
            [tuple(int(v) for v in g) for g in gathered], plan.source, has_gy
        )
        # a training-time value is trusted to equal the recomputation once it has, for this layer:
        # compiled or fused kernels may compute it differently every time, and that is not a fault
        untrusted = [w for w in differs if (plan.layer_index, w) not in self.trusted]
        late = trust(
            self.trusted, self.pending, plan.layer_index, plan.source, step, untrusted, agrees
        )
        if untrusted and self.rank == 0:
            self._say_once(
                ("untrusted", name),
                f"replay of layer {name!r} at step {step}: the source's training-time "
                f"{' and '.join(untrusted)} differs from every recomputation, but no earlier "
                "comparison on "
                "this layer agreed (compiled or fused kernels may compute it otherwise): "
                "named only if a "
                "later comparison on this layer agrees",
            )
        witness = [w for w in differs if w not in untrusted]
        # a layer whose recomputations have not yet matched on every rank is not known to compute
        # alike everywhere (different GPUs, a kernel non-deterministic in ways the policy does not
        # list): its first mismatch is evidence, written as before, but ends no rank, and the layer
        # is replayed no more (decided on gathered values: the same on every rank)
        agreed_before = plan.layer_index in self.agreed
        if all(v.outcome is VoteOutcome.AGREE for v in votes):
            self.agreed.add(plan.layer_index)
        elif not agreed_before:
            why = (
                f"did not reproduce before it ever agreed (step {step}): treated as "
                "non-deterministic, not as a fault"
            )
            self.excluded[plan.layer_index] = why
            if self.rank == 0:
                self._say_once(
                    ("unreproduced", name),
                    f"replay of layer {name!r} at step {step}: the ranks' recomputations differ "
                    f"and no earlier replay of it agreed on every rank: it {why}; no rank is "
                    f"ended for it and layer {name!r} is no longer replayed",
                )
        self._conclude(
            votes,
            plan,
            name,
            step,
            [tuple(int(v) for v in g[1:4]) for g in gathered],
            time.perf_counter() - t0,
            witness,
            late,
            agreed_before,
        )

    def _full(self, p: Any) -> Any:
        """This rank's full parameter: itself (DDP), or its shard group's local shards gathered over
        scout's side group (FSDP2/HSDP; every rank calls this for the same parameters in order)."""
        import torch

        if not is_dtensor(p):
            return p.detach()
        local = p.to_local().detach().contiguous()
        shard_dims = [d for d, pl in enumerate(p.placements) if pl.is_shard()]
        if not shard_dims:
            return local
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        self.all_gather(sizes, torch.tensor([local.shape[0]], dtype=torch.int64), group=self.side)
        longest = max(int(s) for s in sizes)
        padded = torch.zeros((longest, *p.shape[1:]), dtype=local.dtype)
        padded[: local.shape[0]] = local
        chunks = [torch.empty_like(padded) for _ in range(self.world)]
        self.all_gather(chunks, padded, group=self.side)
        mine = shard_group(p.device_mesh.mesh.tolist(), shard_dims[0], self.rank)
        # gathered on the CPU (scout's side group is gloo); recomputed where the layer lives
        return torch.cat([chunks[r][: int(sizes[r])] for r in mine]).to(local.device)

    def _recompute(
        self,
        layer: Any,
        weights: dict[str, Any],
        spec: Any,
        xs: list[Any],
        gys: list[Any],
        rng: Any,
    ) -> tuple[int, int, int]:
        """The layer's forward (and backward, with the captured output gradients) on these inputs
        with this rank's weights: signatures of every tensor output, every input gradient and the
        weight gradients."""
        import torch
        from torch.func import functional_call

        was, warn = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        # the captured inputs arrive as CPU tensors: onto the device of the layer that recomputes
        dev = layer_device(layer, weights)
        xs = [x.to(dev) for x in xs]
        gys = [g.to(dev) if g is not None else None for g in gys]
        rng_cpu, rng_cuda = rng
        cuda = [dev] if dev.type == "cuda" else []  # the job's CUDA stream of random numbers too
        with torch.random.fork_rng(devices=cuda, device_type="cuda"):
            torch.set_rng_state(rng_cpu)
            if cuda and rng_cuda.numel():
                torch.cuda.set_rng_state(rng_cuda, dev)
            torch.use_deterministic_algorithms(True, warn_only=True)
            self.replaying = True
            try:
                with torch.enable_grad():
                    # detached aliases of the weights, not copies: autograd.grad only reads them
                    # (their
                    # own leaves: no .grad, none of the job's or DDP's hooks)
                    params = {
                        n: w.detach().requires_grad_(w.is_floating_point())
                        for n, w in weights.items()
                    }
                    xin = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]
                    args, kwargs = _filled(spec, xin)
                    outs = output_tensors(functional_call(layer, params, tuple(args), dict(kwargs)))
                    sig_out = state_signature((f"out{i}", o) for i, o in enumerate(outs))
                    pairs = [(o, g) for o, g in zip(outs, gys) if g is not None and o.requires_grad]
                    if not pairs:
                        return _pos(sig_out), 0, 0
                    xg = [x for x in xin if x.requires_grad]
                    pg = [(n, p) for n, p in params.items() if p.requires_grad]
                    grads = torch.autograd.grad(
                        [o for o, _ in pairs],
                        xg + [p for _, p in pg],
                        grad_outputs=[g for _, g in pairs],
                        allow_unused=True,
                    )
                    none = torch.zeros(0)
                    sig_gx = state_signature(
                        (f"in{i}", g if g is not None else none)
                        for i, g in enumerate(grads[: len(xg)])
                    )
                    sig_gw = state_signature(
                        (n, g if g is not None else none) for (n, _), g in zip(pg, grads[len(xg) :])
                    )
                    return _pos(sig_out), _pos(sig_gx), _pos(sig_gw)
            finally:
                self.replaying = False
                torch.use_deterministic_algorithms(was, warn_only=warn)

    def _conclude(
        self,
        votes: list[GroupVote],
        plan: Any,
        name: str,
        step: int,
        sigs: list[tuple[int, ...]],
        dt: float,
        witness: list[str] = (),
        late: list[tuple[int, int, str]] = (),
        agreed_before: bool = True,
    ) -> None:
        gstep = step + self.offset
        confirmed = sorted(
            {r for v in votes if v.outcome is VoteOutcome.SDC for r in v.outliers}
            | ({plan.source} if witness else set())
            | {r for r, _, _ in late}
        )
        unsure = [v for v in votes if v.outcome is VoteOutcome.INCONCLUSIVE]
        if not confirmed and not unsure:
            self.last_clean = gstep
            self.layer_clean[plan.layer_index] = gstep
            return
        writer = min((r for r in range(self.world) if r not in confirmed), default=0)
        if self.rank == writer:
            self._write(
                votes,
                confirmed,
                unsure,
                plan,
                name,
                gstep,
                sigs,
                dt,
                witness,
                [(r, st + self.offset, w) for r, st, w in late],
                agreed_before,
            )
        # the finding is on disk before the outlier leaves: the Epilogs act on it
        self.barrier(group=self.side)
        # outvoted on a layer that never agreed: named above, not ended (see `_before_step`); the
        # source's own values differing are compared only once trusted (`trust`): they end it
        voted = agreed_before and any(
            self.rank in v.outliers for v in votes if v.outcome is VoteOutcome.SDC
        )
        own = (witness and self.rank == plan.source) or any(r == self.rank for r, _, _ in late)
        if (voted or own) and ends(Ending.SDC, self.sdc_policy):
            first = min([at for r, at, _ in late if r == self.rank] or [step])
            why = (
                f"rank {self.rank}'s recomputation of layer {name!r} differs from the "
                "replicas' majority at step "
                f"{step}"
                if voted
                else f"rank {self.rank}'s training-time values of layer {name!r} differed from "
                f"every recomputation at step {first}"
            )
            say(f"{why}; ending this rank (exit {Ending.SDC.code})")
            end(Ending.SDC)

    def _write(
        self,
        votes,
        confirmed,
        unsure,
        plan,
        name,
        step,
        sigs,
        dt,
        witness=(),
        late=(),
        agreed_before=True,
    ) -> None:
        if self.run_dir is None:
            return
        from scout_slurm.bootstrap.evidencewrites import write_record
        from scout_slurm.evidence.records import Finding, FindingKind

        now = time.time()
        per_rank = "; ".join(
            f"rank {r}: " + "/".join(f"{s:016x}" for s in sig) for r, sig in enumerate(sigs)
        )
        # the onset: only a replay of this same layer that passed clears it (a replay of another
        # layer,
        # or a state vote, says nothing of this layer's compute: a corrupt gradient spreads to every
        # replica)
        cleared = self.layer_clean.get(plan.layer_index, -1)
        since = cleared + 1 if cleared >= 0 else self.offset + 1
        bound = (
            f"onset bound: the last replay of layer {name!r} that passed was at step {cleared}"
            if cleared >= 0
            else f"onset bound: no earlier replay of layer {name!r} passed in this run (from step "
            f"{since})"
        )
        common = (
            f"in-situ replay of layer {name!r}, input captured on rank {plan.source} at step "
            f"{step}",
            f"signatures (output/input gradient/weight gradient) {per_rank}",
            f"replay took {dt * 1000:.1f} ms",
            bound,
            f"last clean replay of any layer at step {self.last_clean}",
        )
        records = []
        for r, at, w in late:  # named now for a difference seen before this layer was trusted
            records.append(
                (
                    f"sdc-compute-rank-{r}-step-{at}-{w.replace(' ', '-')}",
                    Finding(
                        rank=r,
                        node=self.node if r == self.rank else "",
                        kind=FindingKind.SDC,
                        at=now,
                        summary=(
                            f"rank {r}'s training-time {w} of layer {name!r} at step {at} "
                            "differed from every "
                            f"recomputation of the same input (all {self.world} ranks "
                            "agreeing): a transient fault in its "
                            f"compute, or a corrupted local gradient; named at step {step}, "
                            "when a comparison on this "
                            f"layer (rank {plan.source}'s values) agreed, so the layer's "
                            "kernels do compute alike"
                        ),
                        details=(
                            f"in-situ replay of layer {name!r}: the difference at step {at}, "
                            f"with rank {r} the source, "
                            "came before any comparison on this layer had agreed",
                            *common[2:],
                        ),
                        step=at,
                        since_step=at,
                        component="compute",
                    ),
                )
            )
        for r in confirmed:
            what = [v.what for v in votes if r in v.outliers]
            if not what and not (witness and r == plan.source):
                continue  # named above, for an earlier step
            if (
                not what
            ):  # named by its own training-time values alone: a transient fault, at this step
                records.append(
                    (
                        f"sdc-compute-rank-{r}-step-{step}",
                        Finding(
                            rank=r,
                            node=self.node if r == self.rank else "",
                            kind=FindingKind.SDC,
                            at=now,
                            summary=(
                                f"rank {r}'s training-time {' and '.join(witness)} of layer "
                                f"{name!r} at step {step} "
                                "differs from every recomputation of the same input "
                                f"({self.world} ranks, its own "
                                "included, agree): a transient fault in its compute, or a "
                                "corrupted local gradient"
                            ),
                            details=common,
                            step=step,
                            since_step=step,
                            component="compute",
                        ),
                    )
                )
                continue
            records.append(
                (
                    f"sdc-compute-rank-{r}-step-{step}",
                    Finding(
                        rank=r,
                        node=self.node if r == self.rank else "",
                        kind=FindingKind.SDC,
                        at=now,
                        summary=(
                            f"rank {r}'s recomputation of layer {name!r} ({', '.join(what)}) "
                            "differs from the majority of "
                            f"{self.world} replicas at step {step}: compute corruption, which "
                            "may have begun as early "
                            f"as step {since} ({bound.split(': ', 1)[1]})"
                            + (
                                ""
                                if agreed_before
                                else "; no earlier replay of this layer had agreed on every "
                                "rank, so a kernel that computes otherwise on that rank (another "
                                "GPU, a non-deterministic kernel) would look the same: the rank "
                                "was not ended and the layer is no longer replayed"
                            )
                        ),
                        details=common,
                        step=step,
                        since_step=since,
                        component="compute",
                    ),
                )
            )
        for v in unsure:
            records.append(
                (
                    f"inconclusive-compute-{v.what.replace(' ', '-')}-step-{step}",
                    Finding(
                        rank=0,
                        node="",
                        kind=FindingKind.NO_MAJORITY,
                        at=now,
                        summary=f"replay of layer {name!r} at step {step}: inconclusive: "
                        f"{v.explanation}",
                        details=common,
                        step=step,
                        since_step=since,
                        component="compute",
                    ),
                )
            )
        from scout_slurm.evidence.layout import RunFolder

        for name, finding in records:
            try:
                write_record(RunFolder(self.run_dir).finding_path(name), finding)
            except Exception as exc:
                say(f"finding not written: {exc!r}")


def trust(
    trusted: set[tuple[int, str]],
    pending: dict[tuple[int, str], dict[int, int]],
    layer: int,
    source: int,
    step: int,
    untrusted: list[str],
    agrees: list[str],
) -> list[tuple[int, int, str]]:
    """Update which of a layer's training-time values are trusted to equal the recomputation (pure
    but
    for the two containers it updates; the same on every rank) and return (source, step, what) for a
    difference seen before the layer was trusted that this round's agreement now makes a finding.
    Kernels that compute a layer otherwise in training (compiled, fused) differ whoever the source
    is;
    a fault differs for one source. So a held difference is named only when it is one source's (its
    first step), and another round on that layer, from any source, agreed; differences held for
    several sources are dropped (at most one entry a source is kept)."""
    for w in untrusted:
        pending.setdefault((layer, w), {}).setdefault(source, step)
    late = []
    for w in agrees:
        if (layer, w) not in trusted:
            trusted.add((layer, w))
            held = pending.pop((layer, w), {})
            if len(held) == 1:
                ((r, at),) = held.items()
                late.append((r, at, w))
    return late


def source_witness(
    gathered: list[tuple[int, ...]], source: int, has_gy: bool
) -> tuple[list[str], list[str]]:
    """(what of the source's training-time values differs from the recomputations, what agrees)
    (pure): each rank's row is (ok, output, input gradient, weight gradient, stored weights,
    training output, training weight gradient), the last two from the source only (0: not
    comparable). Only where every recomputation agrees: then the source alone differing is its own
    compute at that step."""
    differs, agrees = [], []
    for train_i, recompute_i, what in ((5, 1, "output"), (6, 3, "weight gradient")):
        if recompute_i == 3 and not has_gy:
            continue
        recomputed = {row[recompute_i] for row in gathered}
        mine = gathered[source][train_i]
        if mine and len(recomputed) == 1:
            (agrees if mine in recomputed else differs).append(what)
    return differs, agrees


def _autocast_on(tensors: list[Any]) -> bool:
    import torch

    try:
        return any(torch.is_autocast_enabled(t.device.type) for t in tensors[:1])
    except TypeError:  # an older torch: no device argument
        return torch.is_autocast_enabled()


class _Slot:
    """Where the n-th captured tensor goes back into a layer's arguments."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self):
        return (_Slot, (self.index,))


_PLAIN = (type(None), bool, int, float, str, bytes)


def layer_device(layer: Any, weights: dict[str, Any]) -> Any:
    """Where a layer computes: its (gathered) weights' device, else its parameters' or
    buffers' (a layer without its own weights), else the CPU."""
    import torch

    for t in weights.values():
        return t.device
    for t in (*layer.parameters(), *layer.buffers()):
        return t.device
    return torch.device("cpu")


def _cuda_rng_state(device: Any) -> Any:
    """The CUDA generator's state of `device` (a CPU uint8 tensor), empty for any other device:
    a replay restores it so that dropout on the GPU draws what it drew in training."""
    import torch

    if device.type != "cuda":
        return torch.zeros(0, dtype=torch.uint8)
    return torch.cuda.get_rng_state(device)


def _placeholders(value: Any, tensors: list[Any]) -> Any:
    """The layer's arguments with every tensor replaced by a slot (the tensors appended to
    `tensors`), so the structure can be sent as bytes; other values must be plain."""
    import torch

    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, (tuple, list)):
        return type(value)(_placeholders(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _placeholders(v, tensors) for k, v in value.items()}
    if isinstance(value, _PLAIN) or isinstance(value, (torch.dtype, torch.device)):
        return value
    raise TypeError(f"an argument of type {type(value).__name__}")


def _filled(spec: Any, tensors: list[Any]) -> Any:
    if isinstance(spec, _Slot):
        return tensors[spec.index]
    if isinstance(spec, (tuple, list)):
        return type(spec)(_filled(v, tensors) for v in spec)
    if isinstance(spec, dict):
        return {k: _filled(v, tensors) for k, v in spec.items()}
    return spec


def output_tensors(output: Any) -> list[Any]:
    """Every tensor in a layer's output, in a fixed order: a tensor, a tuple or list (Megatron's
    `(output, bias)`), a dict, or a dataclass (fields in order)."""
    import dataclasses

    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for v in output for t in output_tensors(v)]
    if isinstance(output, dict):
        return [t for k in output for t in output_tensors(output[k])]
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return [
            t for f in dataclasses.fields(output) for t in output_tensors(getattr(output, f.name))
        ]
    return []


def _pos(sig: int) -> int:
    return sig & 0x7FFFFFFFFFFFFFFF  # fits an int64 tensor
