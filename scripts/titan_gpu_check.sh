#!/usr/bin/env bash
# Device check (not part of the suite): TorchTitan's debug model trained for 20 steps with FSDP2 on
# the GPUs of one machine, with scout's in-job checks (the bootstrap: framework banner, state votes,
# in-situ replay, progress record), in under 5 minutes. Needs a Python with a CUDA torch,
# torchtitan, triton and this package (PYTHON=..., default .venv/bin/python). With Slurm on the
# machine (`sinfo` answers) it runs under scout-srun through examples/torchtitan/run.sbatch;
# without, it runs the same script under torchrun with the bootstrap on PYTHONPATH, as scout-task
# would put it there. Prints PASS or FAIL and why; exit 0 only on PASS.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
gpus="$("$python" -c 'import torch; print(torch.cuda.device_count())')"
[ "${gpus:-0}" -ge 1 ] || { echo "FAIL: no CUDA device visible to $python"; exit 1; }
out="${OUT:-$(mktemp -d)}"
run_dir="$out/run"; mkdir -p "$run_dir/progress" "$run_dir/findings"
start=$(date +%s)
if command -v sinfo >/dev/null 2>&1 && sinfo >/dev/null 2>&1; then
  job=$(sbatch --parsable --output="$out/job.out" --ntasks-per-node="$gpus" --gpus-per-node="$gpus" \
        examples/torchtitan/run.sbatch) || { echo "FAIL: sbatch refused the job"; exit 1; }
  while squeue -h -j "$job" 2>/dev/null | grep -q .; do sleep 5; [ $(( $(date +%s) - start )) -lt 300 ] || break; done
  log="$out/job.out"
  "$(dirname "$python")/scout" show "$job" > "$out/show.txt" 2>&1 && cat "$out/show.txt"
else
  PYTHONPATH="$PWD/scout_slurm/bootstrap/site" SCOUT_PACKAGE_DIR="$PWD" SCOUT_PROGRESS_DIR="$run_dir/progress" \
  SCOUT_RUN_DIR="$run_dir" SCOUT_CONSENSUS_EVERY=5 SCOUT_REPLAY_EVERY=5 \
    timeout 300 "$python" -m torch.distributed.run --standalone --nproc-per-node "$gpus" \
    examples/torchtitan/train.py --steps 20 > "$out/job.out" 2>&1
  log="$out/job.out"
fi
took=$(( $(date +%s) - start ))
echo "figures: $gpus GPU(s), $took s, output in $log"
grep -q "rank 0: done" "$log" || { echo "FAIL: training did not finish"; tail -40 "$log"; exit 1; }
grep -q "scout: framework: FSDP2" "$log" || { echo "FAIL: no scout banner naming FSDP2"; tail -40 "$log"; exit 1; }
if grep -q "could not recompute" "$log"; then echo "FAIL: a replay failed"; grep "could not recompute" "$log"; exit 1; fi
grep "scout: framework:" "$log"
[ -f "$run_dir/votes.json" ] && cat "$run_dir/votes.json" && echo
echo "PASS: TorchTitan debug model, $gpus GPU(s), $took s"
