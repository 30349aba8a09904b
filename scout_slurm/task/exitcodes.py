"""Exit codes of `scout-task`, chosen outside the range commonly used by training scripts and
below 128 (which means "killed by a signal"). The Epilogs read them from the job's exit code."""

WATCHDOG_FAILED = (
    85  # scout-task could not start the command (bad environment, no evidence folder, or
)
# SCOUT_* settings not valid under [watchdog] on_bad_setting = "fail")
STALL_CULPRIT = 86  # the watchdogs agreed this rank stopped first; scout ended it
STALL_PEER = 87  # a peer stopped; scout ended this healthy rank so the step ends
SDC_CULPRIT = 88  # the replicas' majority says this rank's numbers are wrong
EVIDENCE_LOST = (
    89  # the evidence folder refused writes (full disk) for longer than the grace period
)
STRAGGLER_ENDED = 91  # timing votes confirmed this rank as a straggler and SCOUT_TIMING_POLICY=exit
RESUME_MISMATCH = (
    90  # the resumed state differs from its checkpoint record and SCOUT_RESUME_MISMATCH=fatal
)

ALL = {
    STRAGGLER_ENDED: "a confirmed straggler (timing votes), ended under SCOUT_TIMING_POLICY=exit",
    WATCHDOG_FAILED: "scout-task failed to start the command",
    STALL_CULPRIT: "this rank stalled first (ended by scout)",
    STALL_PEER: "a peer stalled (ended by scout)",
    SDC_CULPRIT: "this rank's numbers differ from the replicas' majority",
    EVIDENCE_LOST: "scout could not write evidence (full or read-only evidence file system); job "
    "ended",
    RESUME_MISMATCH: "the restored state differs from its checkpoint record "
    "(SCOUT_RESUME_MISMATCH=fatal)",
}
