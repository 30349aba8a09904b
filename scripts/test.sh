#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs pytest (extra arguments pass through).
# The tests marked slurm_release also run on the Slurm releases in SCOUT_SLURM_RELEASES (default
# 24.11,26.05; "none" skips them), one lab each, from Debian roots built once (cached).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
releases="${SCOUT_SLURM_RELEASES:-24.11,26.05}"
if [ "$releases" != "none" ]; then
  # built here, not inside a test: the build time (about 50 s per root, once) shows on its own line
  .venv/bin/python -m scout_slurm.lab.roots ${releases//,/ }
fi
set +e
.venv/bin/python -m pytest -p no:cacheprovider --durations=25 --slurm-releases "$releases" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure, not a pass" >&2
  exit 1
fi
exit "$rc"
