"""Parse a fault specification (pure): `KIND[,rank=R|all][,step=S][,seconds=X][,code=C][,restart=N|any]`.

Kinds for process faults: sleep, spin, stop, skip_allreduce, exit, sigkill, segv, raise.
The fault fires after optimizer step S (1-based) on rank R.
"""

from __future__ import annotations

from dataclasses import dataclass

from scout_slurm.errors import ConfigError

PROCESS_FAULTS = ("sleep", "spin", "stop", "skip_allreduce", "exit", "sigkill", "segv", "raise")


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int | None          # None: every rank
    step: int
    seconds: float = 3600.0
    code: int = 3
    restart: int | None = 0   # fire only in this run (SLURM_RESTART_COUNT), so a rerun is clean; None: every run

    def applies(self, rank: int, step: int, restart: int) -> bool:
        return ((self.rank is None or self.rank == rank) and step == self.step
                and (self.restart is None or restart == self.restart))


def parse_fault(text: str) -> FaultSpec:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError("SCOUT_INJECT is empty; expected e.g. 'sleep,rank=1,step=5'")
    kind = parts[0]
    if kind not in PROCESS_FAULTS:
        raise ConfigError(f"SCOUT_INJECT={text!r}: unknown fault kind {kind!r}; valid: {', '.join(PROCESS_FAULTS)}")
    values: dict[str, str] = {}
    for p in parts[1:]:
        if "=" not in p:
            raise ConfigError(f"SCOUT_INJECT={text!r}: {p!r} is not key=value")
        k, v = p.split("=", 1)
        values[k.strip()] = v.strip()
    unknown = set(values) - {"rank", "step", "seconds", "code", "restart"}
    if unknown:
        raise ConfigError(f"SCOUT_INJECT={text!r}: unknown key(s) {sorted(unknown)}; valid: rank, step, seconds, code, restart")
    try:
        rank = None if values.get("rank", "all") == "all" else int(values["rank"])
        step = int(values.get("step", "1"))
        seconds = float(values.get("seconds", "3600"))
        code = int(values.get("code", "3"))
        restart = None if values.get("restart", "0") == "any" else int(values.get("restart", "0"))
    except ValueError as exc:
        raise ConfigError(f"SCOUT_INJECT={text!r}: {exc}") from None
    if step < 1:
        raise ConfigError(f"SCOUT_INJECT={text!r}: step must be >= 1")
    return FaultSpec(kind=kind, rank=rank, step=step, seconds=seconds, code=code, restart=restart)
