"""Whether the watchdog can still write evidence, and what to do when it cannot (pure: the clock
is passed in). A full or read-only evidence file system must never be silent: without evidence a
failure of this job cannot be localised, so the job is told loudly, and by default ended once the
loss has lasted longer than a grace period (`[watchdog] on_evidence_loss = "fail" | "warn"`)."""

from __future__ import annotations

import errno
from dataclasses import dataclass

# errors that mean "the storage refuses writes", as opposed to a bad record or a planted file
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})
REPEAT_LOG_S = 60.0


def storage_errno(exc: BaseException) -> int | None:
    """The storage errno behind an exception (following __cause__/__context__), or None."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        if isinstance(cur, OSError) and cur.errno in STORAGE_ERRNOS:
            return cur.errno
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


@dataclass
class EvidenceHealth:
    policy: str  # "fail" or "warn"
    grace_s: float
    failing_since: float | None = None
    last_logged: float | None = None
    failures: int = 0
    last_error: str = ""
    last_path: str = ""

    def failed(self, now: float, path: str, exc: BaseException) -> bool:
        """Note a failed write; True when it should be logged now (first failure, then once a
        minute).
        """
        self.failures += 1
        self.last_error, self.last_path = str(exc), path
        if self.failing_since is None:
            self.failing_since = now
        if self.last_logged is None or now - self.last_logged >= REPEAT_LOG_S:
            self.last_logged = now
            return True
        return False

    def succeeded(self) -> bool:
        """Note a good write; True when this ends a period of failures (worth saying so)."""
        recovered = self.failing_since is not None
        self.failing_since = None
        self.last_logged = None
        return recovered

    def lost_for(self, now: float) -> float:
        return 0.0 if self.failing_since is None else now - self.failing_since

    def should_end_job(self, now: float) -> bool:
        return (
            self.policy == "fail"
            and self.failing_since is not None
            and self.lost_for(now) >= self.grace_s
        )

    def message(self, now: float) -> str:
        then = (
            "the job will be ended"
            if self.policy == "fail"
            else 'the job goes on ([watchdog] on_evidence_loss = "warn")'
        )
        return (
            f"SCOUT CANNOT WRITE EVIDENCE for {self.lost_for(now):.0f} s ({self.failures} "
            "failed writes; last: "
            f"{self.last_path}: {self.last_error}). A failure of this job could not be "
            "localised. Free space on "
            f"the evidence file system or fix its permissions; after {self.grace_s:.0f} s "
            "without evidence "
            f"{then}."
        )
