#!/usr/bin/env bash
# Runs every benchmarks/*.py in turn with the project's virtual environment and prints what each
# prints. Goes on after a failure and exits non-zero if any failed. PYTHON=... overrides the
# interpreter. The figures depend on the machine and on what else runs on it: see docs/MEASUREMENTS.md.
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$(dirname "$here")/.venv/bin/python}"
if [[ ! -x "$python" ]]; then
    echo "run_all.sh: no interpreter at $python: create the project's .venv first, or set PYTHON" >&2
    exit 2
fi

failed=()
summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT
for bench in "$here"/bench_*.py; do
    name="$(basename "$bench")"
    echo "=== $name  ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
    start=$SECONDS
    # each benchmark prints its headline figures as "SUMMARY<TAB>what<TAB>figure<TAB>target" lines
    if "$python" "$bench" | tee >(grep '^SUMMARY' >>"$summary"); then
        echo "=== $name: done in $((SECONDS - start)) s"
    else
        echo "=== $name: FAILED (exit $?) after $((SECONDS - start)) s"
        failed+=("$name")
    fi
    echo
done
sleep 0.2   # the last tee's grep may still be writing
echo "=== summary ($(nproc) CPUs, no GPU unless one is listed)"
echo "| what | figure | target |"
echo "|---|---|---|"
awk -F'\t' '/^SUMMARY/ { printf "| %s | %s | %s |\n", $2, $3, $4 }' "$summary"
if ((${#failed[@]})); then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi
