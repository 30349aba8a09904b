"""What differs between the Slurm releases scout runs on, in one place: every choice the door's
callers make by release is a field of `Dialect`, and `dialect()` says which applies.

Measured on Debian's 22.05.8, 24.11.5 and 26.05.5 (docs/SITE-ADMIN.md, "Slurm versions"):
- `sinfo --json` lists every node under "nodes" in 22.05; from 23.02 on it lists partition x state
  groups under "sinfo" instead, and the per-node list is `scontrol show node --json`
  (`scontrol --json` does not exist in 22.05).
Everything else scout reads is parsed by shape (a number or {"set", "number"}; a state or a list
of states; an exit code as a wait status or {"status", "return_code", "signal"}), not by release.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from scout_slurm.errors import SlurmError

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class Dialect:
    release: tuple[int, int]
    nodes_json: tuple[
        str, tuple[str, ...]
    ]  # (command, args) printing {"nodes": [...]}, one per node
    scontrol_json: bool  # `scontrol show ... --json` exists


def dialect_of(version_text: str) -> Dialect:
    """The dialect of the release `sinfo --version` printed ("slurm-wlm 22.05.8", "slurm
    24.11.5").
    """
    m = _VERSION.search(version_text)
    if not m:
        raise SlurmError(
            f"cannot read a Slurm release from `sinfo --version`: {version_text.strip()[:200]!r}"
        )
    release = (int(m.group(1)), int(m.group(2)))
    if release < (23, 2):
        return Dialect(release, ("sinfo", ("--json",)), scontrol_json=False)
    return Dialect(release, ("scontrol", ("show", "node", "--json")), scontrol_json=True)


_known: dict[tuple[str, str, str], Dialect] = {}


def dialect(env: Mapping[str, str] | None, bin_dir: str = "", *, timeout: float) -> Dialect:
    """The dialect of the Slurm that `env` (SLURM_CONF, SCOUT_SLURM_ROOT) and `bin_dir` reach: one
    `sinfo --version` per process and Slurm."""
    from scout_slurm.slurm.door import SLURM_ROOT_ENV, run_slurm

    e = env if env is not None else os.environ
    key = (e.get(SLURM_ROOT_ENV, ""), bin_dir, e.get("SLURM_CONF", ""))
    if key not in _known:
        res = run_slurm("sinfo", ["--version"], timeout=timeout, env=env, bin_dir=bin_dir)
        _known[key] = dialect_of(res.stdout)
    return _known[key]
