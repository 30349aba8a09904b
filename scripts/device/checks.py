"""The checks of scripts/device_check.sh that run in one process, one per subcommand; each writes
`<out>/<name>.json` and prints one line `RESULT <name> <ok|differs|skipped|failed> <what>`.
Runs with the machine's own torch and this tree on PYTHONPATH; nothing here needs the .venv.

    python scripts/device/checks.py sig|uuid|stall|recompute OUT_DIR [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path


def _write(out: Path, name: str, status: str, what: str, data: dict) -> int:
    (out / f"{name}.json").write_text(
        json.dumps({"status": status, "what": what, **data}, indent=1)
    )
    print(f"RESULT {name} {status} {what}", flush=True)
    return 0 if status in ("ok", "differs", "skipped") else 1


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _best(fn, device: str, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def check_sig(out: Path, device: str) -> int:
    """(a) the device signature on the device: throughput against a device copy, and every
    single-bit flip of a few elements (and random ones) of several dtypes detected there."""
    import random

    import torch

    from scout_slurm.bootstrap import devsig

    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        nbytes = min(4 << 30, int(free * 0.3))  # the tensor, its clone, the lanes' temporaries
    else:
        nbytes = 64 << 20
    n = nbytes // 4
    t = torch.randn(n, device=device)
    lanes_s = _best(lambda: devsig.lane_sums(t).tolist(), device)
    clone_s = _best(lambda: t.clone(), device)
    small = t[: 3 * devsig.BLOCK + 7]
    same_as_cpu = devsig.lane_sums(small).tolist() == devsig.lane_sums(small.cpu()).tolist()
    t = small = None  # the big tensor freed before the flips
    missed, tried = [], 0
    rng = random.Random(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8):
        x = (torch.randn(devsig.BLOCK + 5, device=device) * 100).to(dtype)
        base = devsig.lane_sums(x).tolist()
        u8 = x.view(torch.uint8)
        size = x.element_size()
        elems = {0, x.numel() - 1, devsig.BLOCK} | {rng.randrange(x.numel()) for _ in range(4)}
        for e in sorted(elems):
            for b in range(size * 8):
                i = e * size + b // 8
                u8[i] ^= 1 << (b % 8)
                tried += 1
                if any(a == c for a, c in zip(devsig.lane_sums(x).tolist(), base, strict=True)):
                    missed.append((str(dtype), e, b))
                u8[i] ^= 1 << (b % 8)
        if devsig.lane_sums(x).tolist() != base:
            missed.append((str(dtype), "restored tensor signs differently"))
    gbs = nbytes / lanes_s / 1e9
    cgbs = nbytes / clone_s / 1e9
    ok = not missed and same_as_cpu
    what = (
        f"{nbytes / 2**30:.2f} GiB float32 on {device}: lanes {gbs:.1f} GB/s "
        f"({lanes_s * 1e3:.1f} ms), clone {cgbs:.1f} GB/s ({clone_s * 1e3:.1f} ms); "
        f"{tried} single-bit flips, {len(missed)} missed; equal to the CPU's sums: {same_as_cpu}"
    )
    data = {"bytes": nbytes, "lanes_s": lanes_s, "clone_s": clone_s, "flips": tried}
    return _write(out, "sig", "ok" if ok else "failed", what, {**data, "missed": missed[:20]})


def check_uuid(out: Path, device: str) -> int:
    """(b) NVML's view of the GPUs against torch's device UUIDs, joined as scout joins them."""
    import torch

    from scout_slurm.hwmap.join import uuid_on_map
    from scout_slurm.hwmap.nvml import read_gpus

    if not device.startswith("cuda"):
        return _write(out, "uuid", "skipped", "no GPU", {})
    gpus, status, problems = read_gpus()
    rows, bad = [], 0
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        uuid = str(p.uuid)
        found = uuid_on_map(uuid, gpus)
        bus = (
            f"{getattr(p, 'pci_domain_id', 0):04x}:{getattr(p, 'pci_bus_id', 0):02x}:"
            f"{getattr(p, 'pci_device_id', 0):02x}.0"
        )
        nv = next((g for g in gpus if g.uuid == found), None)
        agree = nv is not None and nv.pci_bus_id.lower() == bus.lower()
        bad += not agree
        rows.append(
            {
                "cuda_index": i,
                "torch_uuid": uuid,
                "torch_bus": bus,
                "nvml_uuid": found,
                "nvml_index": nv.index if nv else None,
                "nvml_bus": nv.pci_bus_id if nv else None,
                "agree": agree,
            }
        )
    what = (
        f"NVML {status}, {len(gpus)} GPU(s); torch {len(rows)} device(s), "
        f"{len(rows) - bad} found in NVML's map by UUID with the same PCI bus"
    )
    data = {"rows": rows, "problems": list(problems)}
    return _write(out, "uuid", "ok" if not bad and status == "ok" else "failed", what, data)


def check_stall(out: Path, device: str) -> int:
    """(d) NCCL at world size 1 under scout's bootstrap: a GPU kernel that stalls before an
    all_reduce; what scout's progress record and torch's Flight Recorder say while it runs."""
    import torch
    import torch.distributed as dist

    from scout_slurm.task import progress

    if not device.startswith("cuda"):
        return _write(out, "stall", "skipped", "no GPU (NCCL needs one)", {})
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    seen: dict = {}
    rec = Path(os.environ.get("SCOUT_PROGRESS_DIR", "")) / "rank-0.bin"

    def look() -> None:
        time.sleep(3.0)
        v = progress.read(rec) if rec.exists() else None
        seen["progress"] = (
            None
            if v is None
            else {
                "coll_entered": v.coll_entered,
                "coll_completed": v.coll_completed,
                "in_collective": v.in_collective,
                "current_op": v.current_op,
                "pg_seq": v.pg_seq,
            }
        )
        try:
            c10d = torch._C._distributed_c10d
            dump = getattr(c10d, "_dump_nccl_trace_json", None) or c10d._dump_fr_trace_json
            try:
                fr = json.loads(dump())
            except TypeError:  # older signatures take (include collectives, only active)
                fr = json.loads(dump(True, False))
            seen["fr_entries"] = [
                {k: e.get(k) for k in ("collective_seq_id", "profiling_name", "state")}
                for e in fr.get("entries", [])[-4:]
            ]
            seen["fr_pg_status"] = fr.get("pg_status")
        except Exception as exc:  # noqa: BLE001 - what the build offers is part of the finding
            seen["fr_error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=look)
    t.start()
    torch.cuda._sleep(int(2e10))  # about 10 s of a spinning kernel (cycles) on the stream
    t0 = time.perf_counter()
    dist.all_reduce(x)
    seen["all_reduce_returned_s"] = time.perf_counter() - t0
    t.join()
    torch.cuda.synchronize()
    seen["completed_after_s"] = time.perf_counter() - t0
    dist.destroy_process_group()
    p = seen.get("progress") or {}
    what = (
        f"all_reduce returned after {seen['all_reduce_returned_s']:.3f} s, completed after "
        f"{seen['completed_after_s']:.1f} s; during the stall scout's record said entered "
        f"{p.get('coll_entered')} completed {p.get('coll_completed')} in_collective "
        f"{p.get('in_collective')}; Flight Recorder: "
        f"{seen.get('fr_entries', seen.get('fr_error'))}"
    )
    return _write(out, "stall", "ok", what, seen)


def _layers(device: str):
    import torch
    import torch.nn.functional as F

    def linear(dtype, tf32):
        def run(g):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            m = torch.nn.Linear(1024, 1024, device=device, dtype=dtype)
            x = torch.randn(512, 1024, device=device, dtype=dtype, generator=g, requires_grad=True)
            return m, (x,), lambda *a: m(*a)

        return run

    def layernorm(g):
        m = torch.nn.LayerNorm(1024, device=device)
        x = torch.randn(512, 1024, device=device, generator=g, requires_grad=True)
        return m, (x,), lambda *a: m(*a)

    def embedding(g):
        m = torch.nn.Embedding(5000, 256, device=device)
        idx = torch.randint(0, 50, (4096,), device=device, generator=g)  # repeats: atomics
        return m, (idx,), lambda *a: m(*a)

    def conv(g):
        torch.backends.cudnn.benchmark = True
        m = torch.nn.Conv2d(64, 64, 3, padding=1, device=device)
        x = torch.randn(16, 64, 32, 32, device=device, generator=g, requires_grad=True)
        return m, (x,), lambda *a: m(*a)

    def sdpa(g):
        dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
        q, k, v = (
            torch.randn(4, 8, 256, 64, device=device, dtype=dt, generator=g, requires_grad=True)
            for _ in range(3)
        )
        return None, (q, k, v), lambda *a: F.scaled_dot_product_attention(*a, is_causal=True)

    return {
        "linear_bf16": linear(torch.bfloat16, False),
        "linear_fp32_tf32": linear(torch.float32, True),
        "layernorm": layernorm,
        "embedding": embedding,
        "conv_cudnn_benchmark": conv,
        "sdpa": sdpa,
    }


def check_recompute(out: Path, device: str) -> int:
    """(e) common layers computed twice from the same weights and input: forward output and
    gradients compared bit for bit by the device signature."""
    import torch

    from scout_slurm.bootstrap import signing

    signing.DEVICE_ON_CPU = True
    rows = {}
    for name, build in _layers(device).items():
        sigs = []
        for _ in range(2):
            g = torch.Generator(device=device).manual_seed(1)
            torch.manual_seed(0)
            m, args, fwd = build(g)
            y = fwd(*args)
            y.float().square().sum().backward()
            grads = [(f"in{i}", a.grad) for i, a in enumerate(args) if a.grad is not None]
            if m is not None:
                grads += [(n, p.grad) for n, p in m.named_parameters()]
            _sync(device)
            sigs.append((signing.state_signature([("y", y)]), signing.state_signature(grads)))
        rows[name] = {
            "forward_equal": sigs[0][0] == sigs[1][0],
            "backward_equal": sigs[0][1] == sigs[1][1],
        }
    differ = [n for n, r in rows.items() if not (r["forward_equal"] and r["backward_equal"])]
    what = f"{len(rows)} layers on {device}; differ between two runs: {differ or 'none'}"
    return _write(out, "recompute", "differs" if differ else "ok", what, {"layers": rows})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("check", choices=["sig", "uuid", "stall", "recompute"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    fn = {"sig": check_sig, "uuid": check_uuid, "stall": check_stall}.get(a.check, check_recompute)
    try:
        return fn(a.out, a.device)
    except Exception as exc:  # noqa: BLE001 - a failed check is a finding, written down
        import traceback

        return _write(
            a.out,
            a.check,
            "failed",
            f"{type(exc).__name__}: {exc}",
            {"trace": traceback.format_exc()},
        )


if __name__ == "__main__":
    sys.exit(main())
