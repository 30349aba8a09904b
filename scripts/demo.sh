#!/usr/bin/env bash
# The main job end to end: a local multi-node Slurm cluster, a DDP training job under scout-srun,
# an injected fault, the verdict, the drain, the requeue and the resumed run. Options pass to
# `scout demo` (e.g. --fault hang, --keep, --slurm 24.11).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/scout demo --state-dir /tmp/scout-demo "$@"
