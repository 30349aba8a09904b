#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs pytest (extra arguments pass through).
# The tests marked slurm_release also run on the Slurm releases in SCOUT_SLURM_RELEASES (default
# 24.11,26.05; "none" skips them), one lab each, from Debian roots built once (cached).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# .venv-bare: a job's Python as docs/USERS.md allows for a site's own torch: the pinned torch and this
# package without the `job` extra (so no xxhash, no numpy). tests/torch/test_bare_python.py runs a
# job under it. About 20 to 40 s when made (the torch wheel is on this machine's disk), 2 s after.
bare_python="${PYTHON:-python3}"
[ -z "${PYTHON:-}" ] && [ -x /usr/bin/python3 ] && bare_python=/usr/bin/python3
is_bare() { ! .venv-bare/bin/python -c 'import xxhash' 2>/dev/null && ! .venv-bare/bin/python -c 'import numpy' 2>/dev/null; }
if [ -x .venv-bare/bin/python ] && ! is_bare; then
  echo "test.sh: .venv-bare has xxhash or numpy installed; making it again" >&2
  rm -rf .venv-bare
fi
bare_t0=$SECONDS
[ -x .venv-bare/bin/python ] || "$bare_python" -m venv .venv-bare
.venv-bare/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv-bare/bin/python -m pip install -q --disable-pip-version-check -e .
if ! is_bare; then
  echo "test.sh: .venv-bare can import xxhash or numpy (pulled in by a dependency?): it proves nothing" >&2
  exit 1
fi
echo "test.sh: .venv-bare (torch, scout-slurm without the job extra; no xxhash, no numpy) ready in $((SECONDS - bare_t0)) s" >&2
# the formatter and the linter first (pyproject.toml [tool.ruff]): seconds, and a failure names the
# file and line (`.venv/bin/ruff format .` fixes the formatting)
.venv/bin/ruff format --check --quiet . || { echo "test.sh: files not formatted: run .venv/bin/ruff format ." >&2; exit 1; }
.venv/bin/ruff check --quiet . || { echo "test.sh: ruff check found the problems above" >&2; exit 1; }
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
