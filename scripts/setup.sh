#!/usr/bin/env bash
# Installs what scout-slurm needs on a fresh Debian machine, idempotently: Slurm 22.05 and munge
# from Debian (their daemons are not started: the lab starts its own), Chromium for the report
# test, and a virtual environment in .venv with the pinned CPU torch and this package.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=0
for bin in slurmctld slurmd sbatch scontrol munged mungekey chromium; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || missing=1
done
if [ "$missing" = 1 ]; then
  echo "setup: installing Slurm, munge and Chromium (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    # keep Debian's init scripts from starting system-wide daemons during the install
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && created_policy=1
  fi
  apt-get update -qq
  # iproute2: ip netns for the netns lab, tc for its slow-link test; chromium: the incident page's test renders it headless (fonts-dejavu-core: text needs one font)
  apt-get install -y -qq --no-install-recommends slurm-wlm slurmctld slurmd slurm-client munge procps iproute2 \
    chromium chromium-driver fonts-dejavu-core >/dev/null
  [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "${PYTHON:-python3}" -m venv .venv
fi
# the pinned CPU build (on this machine's disk; an unpinned torch downloads several GB of CUDA)
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
