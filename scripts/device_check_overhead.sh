#!/usr/bin/env bash
# Device check for issue 24 (prepared, to run when a GPU machine is lent; not run in this session):
# scout's per-step cost with NCCL on one GPU, and DDP's bits under scout equal to plain DDP's.
#   bash scripts/device_check_overhead.sh        (from the repository root, .venv with a CUDA torch)
# Two NCCL ranks cannot share one GPU (NCCL refuses a duplicate device), so on one GPU the ratio is
# taken with 2 ranks when the machine has 2 GPUs, else with 1 rank (DDP still reduces through the
# recording wrapper: the wrapper's and the hooks' cost are measured; the vote has no peer to compare).
# Writes its figures to ${OUT:-/tmp}/device-overhead-*.txt; about 6 minutes on an H200.
set -u
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp}
GPUS=$($PY -c 'import torch; print(torch.cuda.device_count())')
echo "GPUs: $GPUS; torch $($PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())')"
WORLD=1
[ "$GPUS" -ge 2 ] && WORLD=2
# ranks on their own GPU when there are 2 (LOCAL_RANK picks it), else both on cuda:0
DEVICE=cuda:0
[ "$WORLD" -ge 2 ] && DEVICE=cuda
for width in 4096 1024; do
  timeout 280 $PY benchmarks/bench_step_overhead.py --backend nccl --device "$DEVICE" --world "$WORLD" \
      --width "$width" --batch 256 --repeats 3 --steps 100 --vote-steps-min 100 --ks 50 \
      > "$OUT/device-overhead-$width.txt" 2> "$OUT/device-overhead-$width.err"
  echo "width $width: exit $?"; grep -E "^(bare|scout)|SUMMARY" "$OUT/device-overhead-$width.txt"
done
