"""The pure rule behind "evidence written during a full disk fails loudly in the job"."""

from __future__ import annotations

import errno

import pytest

from scout_slurm.config import ConfigError, parse_config
from scout_slurm.errors import EvidenceError
from scout_slurm.task.evidencehealth import EvidenceHealth, storage_errno


def _enospc() -> BaseException:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise EvidenceError("cannot write /ev/x.json: No space left on device") from e
    except EvidenceError as wrapped:
        return wrapped


def test_storage_errno_follows_the_cause():
    assert storage_errno(_enospc()) == errno.ENOSPC
    assert storage_errno(OSError(errno.EROFS, "ro")) == errno.EROFS
    assert storage_errno(OSError(errno.ELOOP, "link")) is None  # a planted link is not a full disk
    assert storage_errno(EvidenceError("bad record")) is None


def test_first_failure_is_logged_then_once_a_minute():
    h = EvidenceHealth(policy="fail", grace_s=60)
    assert h.failed(100.0, "/ev/a", _enospc()) is True
    assert h.failed(101.0, "/ev/a", _enospc()) is False
    assert h.failed(159.9, "/ev/a", _enospc()) is False
    assert h.failed(160.0, "/ev/a", _enospc()) is True
    assert h.failures == 4 and h.last_path == "/ev/a"


@pytest.mark.parametrize(
    "policy,at,ends", [("fail", 129.9, False), ("fail", 130.0, True), ("warn", 1e9, False)]
)
def test_the_job_ends_only_under_fail_after_the_grace(policy, at, ends):
    h = EvidenceHealth(policy=policy, grace_s=30)
    h.failed(100.0, "/ev/a", _enospc())
    assert h.should_end_job(at) is ends
    assert "SCOUT CANNOT WRITE EVIDENCE" in h.message(at)


def test_a_good_write_resets_the_grace():
    h = EvidenceHealth(policy="fail", grace_s=30)
    h.failed(100.0, "/ev/a", _enospc())
    assert h.succeeded() is True
    assert h.succeeded() is False
    assert not h.should_end_job(1000.0)
    h.failed(1000.0, "/ev/a", _enospc())
    assert not h.should_end_job(1029.0) and h.should_end_job(1030.0)


def test_config_rejects_an_unknown_policy():
    with pytest.raises(ConfigError, match="on_evidence_loss"):
        parse_config({"watchdog": {"on_evidence_loss": "ignore"}})
    assert (
        parse_config({"watchdog": {"on_evidence_loss": "warn"}}).watchdog.on_evidence_loss == "warn"
    )
