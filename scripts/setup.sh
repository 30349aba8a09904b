#!/usr/bin/env bash
# Installs what scout-slurm needs on a fresh Debian machine, idempotently: Slurm 22.05 and munge
# from Debian (their daemons are not started: the lab starts its own), mmdebstrap (the labs of
# Slurm 24.11 and 26.05 run from Debian roots it builds on first use), Chromium for the report
# test, and a virtual environment in .venv with the pinned CPU torch and this package.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=0
for bin in slurmctld slurmd sbatch scontrol munged mungekey chromium runuser mmdebstrap bindfs fusermount3; do
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
  # bindfs, fuse3: the hung-evidence-root tests freeze a FUSE mount (tests/frozenfs.py)
  # mmdebstrap: builds the Debian roots of the other Slurm releases (lab --slurm 24.11|26.05), once, into /var/cache/scout-slurm/roots
  apt-get install -y -qq --no-install-recommends slurm-wlm slurmctld slurmd slurm-client munge procps iproute2 python3-venv \
    chromium chromium-driver fonts-dejavu-core mmdebstrap bindfs fuse3 >/dev/null
  [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

# The lab runs its controller hook as the `slurm` user and jobs as an unprivileged user: both must
# be able to run this interpreter. Debian's /usr/bin/python3 is; one under root's home (pyenv) is
# not (/root is mode 0700). A .venv made from such an interpreter is made again.
python="${PYTHON:-}"
if [ -z "$python" ]; then
  python=python3
  [ -x /usr/bin/python3 ] && python=/usr/bin/python3
fi
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && [ -x /usr/bin/python3 ] \
   && ! grep -qx "home = /usr/bin" .venv/pyvenv.cfg 2>/dev/null; then
  echo "setup: .venv was made from $(sed -n 's/^home = //p' .venv/pyvenv.cfg); making it again from /usr/bin/python3" >&2
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv from $python" >&2
  "$python" -m venv .venv
fi
# the pinned CPU build (on this machine's disk; an unpinned torch downloads several GB of CUDA)
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[job,test]'
# The training frameworks for the framework tests and examples/ (the `frameworks` extra; about 15 s
# from a warm pip cache): pip must not change the pinned torch, so it is held by a constraint.
# DS_BUILD_OPS=0: DeepSpeed compiles none of its C++ ops at install.
constraint="$(mktemp)"
echo "torch==2.13.0" > "$constraint"
DS_BUILD_OPS=0 .venv/bin/python -m pip install -q --disable-pip-version-check -c "$constraint" -e '.[frameworks]'
rm -f "$constraint"
