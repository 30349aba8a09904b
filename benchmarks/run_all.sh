#!/usr/bin/env bash
# Runs every benchmarks/*.py in turn with the project's virtual environment and prints what each
# prints. Goes on after a failure and exits non-zero if any failed. PYTHON=... overrides the
# interpreter. The figures depend on the machine and on what else runs on it: see README.md.
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$(dirname "$here")/.venv/bin/python}"
if [[ ! -x "$python" ]]; then
    echo "run_all.sh: no interpreter at $python: create the project's .venv first, or set PYTHON" >&2
    exit 2
fi

failed=()
for bench in "$here"/*.py; do
    name="$(basename "$bench")"
    echo "=== $name  ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
    start=$SECONDS
    if "$python" "$bench"; then
        echo "=== $name: done in $((SECONDS - start)) s"
    else
        echo "=== $name: FAILED (exit $?) after $((SECONDS - start)) s"
        failed+=("$name")
    fi
    echo
done
if ((${#failed[@]})); then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi
