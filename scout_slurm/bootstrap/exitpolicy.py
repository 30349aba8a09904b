"""The in-job exit policy: when a check's verdict ends this rank, and the one function that ends
it (`end`), with the codes of `scout_slurm.task.exitcodes`. Imports only the standard library
and that module of constants, so it works in the user's Python."""

from __future__ import annotations

import enum
import os
import sys
from typing import NoReturn

from scout_slurm.task import exitcodes


class Ending(enum.Enum):
    """Why scout ends a rank from inside the job: the value is the exit code the Epilogs read."""

    SDC = exitcodes.SDC_CULPRIT  # the replicas' majority outvoted this rank's numbers
    STRAGGLER = exitcodes.STRAGGLER_ENDED  # timing votes confirmed this rank as a straggler
    RESUME_MISMATCH = (
        exitcodes.RESUME_MISMATCH
    )  # the restored state differs from its checkpoint record

    @property
    def code(self) -> int:
        return int(self.value)


# the policy value (SCOUT_SDC_POLICY, SCOUT_TIMING_POLICY, SCOUT_RESUME_MISMATCH) that ends the rank
_ENDS_ON = {Ending.SDC: "exit", Ending.STRAGGLER: "exit", Ending.RESUME_MISMATCH: "fatal"}


def ends(why: Ending, policy: str) -> bool:
    """Does this policy end the rank for this verdict? (pure)"""
    return str(getattr(policy, "value", policy)) == _ENDS_ON[why]


def end(why: Ending, message: str = "") -> NoReturn:
    """End this rank now with `why`'s code. The finding is on disk already (the caller waited on
    the side group's barrier); what the job wrote is flushed; no atexit handler or `finally` runs:
    a rank whose state is wrong must not save a checkpoint or join another collective."""
    if message:
        sys.stderr.write(f"scout: {message}\n")
    flush_and_exit(why.code)


def flush_and_exit(code: int) -> NoReturn:
    """What the job wrote reaches its output, then the process ends with `code` at once: no
    interpreter teardown (nor any atexit handler not already run). scout's own held records (a
    finding just written) get a bounded flush first: a hung evidence root delays the end by
    FLUSH_AT_EXIT_S at most."""
    from scout_slurm.bootstrap import evidencewrites

    evidencewrites.flush()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing more can reach it
            pass
    os._exit(code)
