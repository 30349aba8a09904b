"""The one guard around scout's code inside the training process: scout never harms the job it
watches. Every place where scout's code runs inside a user's call goes through `Guard.run`: an
unexpected exception of scout's is said once, loudly, in the job's output, the check it belongs
to is switched off for the rest of the job (and recorded, so the verdict lists it as not run), and
the user's call goes on exactly as without scout. Imports only the standard library."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

# The checks the guard knows by name: scout's entry points inside the user's calls, then the
# witnesses. A name is what the loud line, the finding and the verdict say.
ENTRY_POINTS = (
    "collective record",
    "process group start",
    "end of training",
    "DDP hooks",
    "optimizer hooks",
    "checkpoint record",
    "busy mark",
    "model tracker",
    "device identity",
    "coverage record",
    "banner",
)
WITNESSES = (
    "state vote",
    "at-rest witness",
    "update replay",
    "in-situ replay",
    "non-finite watch",
    "timing votes",
    "checkpoint watch",
)
CHECKS = ENTRY_POINTS + WITNESSES


# set on an exception that belongs to the job although raised from scout's code (an injected `raise`
# fault, scout_slurm.inject): the guard lets it through
JOBS_OWN = "__scout_jobs_own__"


class ScoutFault(RuntimeError):
    """Raised inside a check on purpose (SCOUT_BREAK): a stand-in for a bug of scout's, so tests can
    show that the guard keeps it out of the job (scout_slurm.inject)."""


class Guard:
    """Runs scout's parts of the user's calls. `say` writes one line to the job's output;
    `record(check, why)` keeps the evidence (the runtime sets it once the run folder is known);
    `broken`: checks made to fail on purpose (SCOUT_BREAK, testing only)."""

    def __init__(
        self,
        *,
        say: Callable[[str], None],
        rank: Callable[[], int] = lambda: -1,
        broken: frozenset[str] = frozenset(),
    ) -> None:
        self.off: dict[str, str] = {}  # check -> why it was switched off
        # record(check, why, exchange): keeps the evidence; `exchange`: a failed exchange with peers
        self.record: Callable[[str, str, bool], None] | None = None
        self.broken = broken
        self._say = say
        self._rank = rank
        self._lock = threading.Lock()

    def on(self, check: str) -> bool:
        return check not in self.off

    def run(self, check: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` as part of `check`: its result, or None when the check is off or
        fails now (then it is off from here on)."""
        if check in self.off:
            return None
        try:
            if check in self.broken:
                raise ScoutFault(f"SCOUT_BREAK made {check!r} fail")
            return fn(*args, **kwargs)
        except Exception as exc:
            if getattr(exc, JOBS_OWN, False):
                # the job's own (an injected fault stands for one): it reaches the job as it would
                raise
            self.fail(check, exc)
            return None

    def fail(self, check: str, exc: BaseException) -> None:
        """Switch `check` off for the rest of the job: said once, recorded once."""
        frames = traceback.extract_tb(exc.__traceback__)
        where = (
            f" at {frames[-1].filename.rsplit('/', 2)[-1]}:{frames[-1].lineno}" if frames else ""
        )
        why = f"{type(exc).__name__}: {exc}"[:300] + where
        exchange = exchange_failed(exc, frames)
        if exchange:
            why = f"its exchange with the other ranks failed ({why})"
        with self._lock:
            if check in self.off:
                return
            self.off[check] = why
        rank = self._rank()
        where_rank = f"rank {rank}" if rank >= 0 else "this process"
        if (
            exchange
        ):  # a peer ended or the network failed: not a bug of scout's, and the job will see it too
            self._say(
                f"scout: {check} stopped on {where_rank}: {why}; a rank left or the network failed"
            )
        else:
            self._say(
                f"scout: ERROR: scout's {check} failed inside scout on {where_rank} and is "
                "off for the rest of "
                f"this job; the job goes on as without it ({why})"
            )
        if self.record is not None:
            try:
                self.record(check, why, exchange)
            except Exception as rec_exc:
                self._say(f"scout: the failure of {check} was not recorded: {rec_exc!r}")


def exchange_failed(exc: BaseException, frames: traceback.StackSummary | None = None) -> bool:
    """Whether `exc` came out of one of torch.distributed's collectives (scout's exchange on its
    side group): a peer that ended or a broken connection, not a bug in scout's own code (pure)."""
    frames = frames if frames is not None else traceback.extract_tb(exc.__traceback__)
    return isinstance(exc, RuntimeError) and any(
        f.filename.replace("\\", "/").endswith("torch/distributed/distributed_c10d.py")
        for f in frames[-3:]
    )


def parse_broken(text: str) -> frozenset[str]:
    """SCOUT_BREAK's value (pure): check names separated by commas, `all` for every one."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    if "all" in names:
        return frozenset(CHECKS)
    unknown = sorted(names - set(CHECKS))
    if unknown:
        raise ValueError(
            f"SCOUT_BREAK={text!r}: unknown check(s) {unknown}; valid: all, {', '.join(CHECKS)}"
        )
    return frozenset(names)
