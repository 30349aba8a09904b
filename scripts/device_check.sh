#!/usr/bin/env bash
# The GPU check, ready for a fresh one-GPU machine with only this tree copied: no .venv, the
# machine's own Python with a CUDA torch, no network. It writes its findings into the folder
# named by its argument (default $OUT, else a new temporary folder): summary.txt, one JSON a
# check, and each check's output. About 3 to 6 minutes with a GPU; every check is bounded.
#
#   bash scripts/device_check.sh [OUT_DIR]        (PYTHON=... picks the Python; default python3)
#
# Checks, in priority order: (a) the device signature (bootstrap/devsig.py) on the GPU: throughput
# on up to 4 GiB against a device copy, every single-bit flip of a few elements of 5 dtypes;
# (b) NVML's GPUs against torch's device UUIDs, joined as scout joins a rank to its GPU; (c) two
# processes on one GPU over gloo with CUDA tensors, a DDP job under scout's bootstrap with votes,
# at-rest witness, update replay and replay every 5 steps for 50 steps: findings (expected none);
# (d) NCCL at world size 1 with a spinning kernel (torch.cuda._sleep) before an all_reduce: what
# scout's progress record and torch's Flight Recorder say meanwhile; (e) Linear bf16 / TF32,
# LayerNorm, Embedding, conv with cudnn.benchmark and sdpa computed twice: bit-equal or not;
# (f) with the time left, scout's cost a step over NCCL (benchmarks/bench_step_overhead.py).
# Without a GPU it says so in summary.txt, runs (a), (c) and (e) on the CPU (small sizes; (c)
# with SCOUT_SIGN_ON_DEVICE=1 so the CPU tensors take the GPU's signing path) and exits 0.
#
# Packages the package imports at runtime (click, structlog; xxhash and nvidia-ml-py optional):
# the ones the machine's Python lacks are installed from wheels in ./wheels (git-ignored) into a
# temporary folder put on PYTHONPATH; without wheels the check says what it goes without. Fill
# it on a machine with network, for the device's Python version (3.12 here as an example):
#   pip download -d wheels --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 click structlog xxhash nvidia-ml-py
# and carry it with the tree (the device tool's `carry: ["wheels"]`).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
out="${1:-${OUT:-}}"
[ -n "$out" ] || out=$(mktemp -d)
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary="$out/summary.txt"
: > "$summary"
py="${PYTHON:-python3}"
start=$(date +%s)
say() { echo "$*" | tee -a "$summary"; }
left() { echo $(( ${BUDGET_S:-450} - ($(date +%s) - start) )); }
# bounded: timeout SECONDS, or what is left of the budget when less
bounded() {
  local want=$1; shift
  local have; have=$(left)
  [ "$have" -lt "$want" ] && want=$have
  if [ "$want" -le 5 ]; then say "  skipped: the check's time budget is spent"; return 124; fi
  timeout -k 10 "$want" "$@"
}

say "scout device check, $(date -u +%FT%TZ), tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if ! "$py" -c 'import torch' 2>/dev/null; then
  say "no torch in $py: nothing to check"
  exit 0
fi
"$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda, "gpus", torch.cuda.device_count() if torch.cuda.is_available() else 0)' \
  | tee -a "$summary"

deps=$(mktemp -d)
missing=$("$py" - <<'EOF'
import importlib.util
names = {"click": "click", "structlog": "structlog", "xxhash": "xxhash", "pynvml": "nvidia-ml-py"}
print(" ".join(p for m, p in names.items() if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
  if [ -d wheels ] && ls wheels/*.whl >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    "$py" -m pip install --quiet --no-index --find-links wheels --target "$deps" $missing \
      > "$out/pip.txt" 2>&1 && say "installed from wheels/: $missing" \
      || say "pip from wheels/ failed for: $missing (see pip.txt)"
  else
    say "missing, no wheels/ folder: $missing (xxhash: blake2b signs instead; nvidia-ml-py: (b) skipped)"
  fi
fi
export PYTHONPATH="$ROOT:$deps${PYTHONPATH:+:$PYTHONPATH}"

device=cpu
if "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 1)' 2>/dev/null; then
  device=cuda
  say "GPU: $("$py" -c 'import torch; print(torch.cuda.get_device_name(0))')"
else
  say "no GPU: CUDA is not available to this torch; the CPU-runnable parts only ((a), (c), (e) on the CPU)"
fi

check() {  # check NAME SECONDS: one in-process check of scripts/device/checks.py
  local name=$1 secs=$2
  say "($name)"
  bounded "$secs" "$py" scripts/device/checks.py "$name" "$out" --device "$device" \
    > "$out/$name.out" 2>&1
  local rc=$?
  grep '^RESULT' "$out/$name.out" | sed 's/^/  /' | tee -a "$summary"
  grep -q '^RESULT' "$out/$name.out" || say "  no result (exit $rc): see $name.out"
}

check sig 120
if [ "$device" = cuda ]; then check uuid 60; else say "(uuid)"; say "  skipped: no GPU"; fi

# (c) two processes on one device over gloo, under scout's bootstrap, as scout-task starts a rank
say "(ddp)"
run="$out/ddp/run"
mkdir -p "$run/progress" "$run/findings" "$run/ranks"
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
steps=50
[ "$device" = cpu ] && steps=20
pids=()
for r in 0 1; do
  (
    export RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
      OMP_NUM_THREADS=1 PYTHONPATH="$ROOT/scout_slurm/bootstrap/site:$PYTHONPATH" \
      SCOUT_PACKAGE_DIR="$ROOT" SCOUT_PROGRESS_DIR="$run/progress" SCOUT_RUN_DIR="$run" \
      SCOUT_CONSENSUS_EVERY=5 SCOUT_REPLAY_EVERY=5 SCOUT_AT_REST=on SCOUT_UPDATE_REPLAY=on \
      SCOUT_SDC_POLICY=continue SCOUT_SIGN_ON_DEVICE=$([ "$device" = cpu ] && echo 1 || echo 0)
    dev=$device; [ "$device" = cuda ] && dev=cuda:0
    bounded 240 "$py" scripts/device/ddp_job.py --steps "$steps" --device "$dev" \
      > "$out/ddp/rank-$r.out" 2> "$out/ddp/rank-$r.err"
  ) &
  pids+=($!)
done
codes=""
for p in "${pids[@]}"; do wait "$p"; codes="$codes $?"; done
findings=$(find "$run/findings" -name '*.json' ! -name 'injected-*' 2>/dev/null | wc -l)
done_ranks=$(cat "$out"/ddp/rank-*.out 2>/dev/null | grep -c ': done')
offs=$(grep -h "stopped on\|could not" "$out"/ddp/rank-*.err 2>/dev/null | sort -u | head -5)
say "  RESULT ddp $([ "$findings" -eq 0 ] && [ "$done_ranks" -eq 2 ] && echo ok || echo failed)" \
  "$steps steps on $device, exits$codes, $done_ranks rank(s) done, $findings finding(s)" \
  "$(ls "$run/findings" 2>/dev/null | head -5 | tr '\n' ' ')"
[ -n "$offs" ] && echo "$offs" | sed 's/^/  scout said: /' | tee -a "$summary"
if [ -f "$run/votes.json" ]; then
  "$py" - "$run/votes.json" <<'EOF' | tee -a "$summary"
import json, sys
v = json.load(open(sys.argv[1]))
keys = ("votes", "at_rest_windows", "update_rounds", "replay_rounds", "replay_failed_rounds")
print("  coverage: " + ", ".join(f"{k} {v.get(k)}" for k in keys)
      + f"; checks off: {v.get('checks_off') or 'none'}")
EOF
fi

if [ "$device" = cuda ]; then
  say "(stall)"
  mkdir -p "$out/stall/progress"
  (
    export PYTHONPATH="$ROOT/scout_slurm/bootstrap/site:$PYTHONPATH" SCOUT_PACKAGE_DIR="$ROOT" \
      SCOUT_PROGRESS_DIR="$out/stall/progress" SCOUT_RUN_DIR="$out/stall" \
      TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_ENABLE_TIMING=1 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT="$port" RANK=0 WORLD_SIZE=1
    bounded 90 "$py" scripts/device/checks.py stall "$out" --device cuda > "$out/stall.out" 2>&1
  )
  grep '^RESULT' "$out/stall.out" | sed 's/^/  /' | tee -a "$summary"
  grep -q '^RESULT' "$out/stall.out" || say "  no result: see stall.out"
else
  say "(stall)"; say "  skipped: no GPU (NCCL needs one)"
fi

check recompute 120

# (f) what scout costs a step over NCCL (world size 1: the wrappers and hooks; nothing votes),
# with the time left (it was scripts/device_check_overhead.sh)
if [ "$device" = cuda ]; then
  say "(overhead)"
  bounded 200 "$py" benchmarks/bench_step_overhead.py --backend nccl --device cuda:0 --world 1 \
    --width 4096 --batch 256 --repeats 2 --steps 60 --vote-steps-min 60 --ks 50 \
    > "$out/overhead.txt" 2> "$out/overhead.err"
  say "  exit $?; $(grep -E 'SUMMARY' "$out/overhead.txt" | head -3 | tr '\n' ' ')"
fi
say "took $(( $(date +%s) - start )) s; device: $device"
rm -rf "$deps"
exit 0
