"""The incident's time: a budget counted from when the hook began, on an injected clock, and the
one bounded wait for evidence that another hook writes (a node's epilog.json, its root checks,
the controller's verdict). Tests pass a clock whose sleep advances it: none sleeps to pass time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.2  # how often a wait looks again: files on shared storage, written once


@dataclass(frozen=True)
class Clock:
    """Where time comes from: `monotonic` for budgets and waits, `wall` for records' times."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep


def wait_until(
    look: Callable[[], T],
    done: Callable[[T], bool],
    *,
    seconds: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    poll_s: float = POLL_S,
) -> T:
    """What `look()` found once `done` holds of it, or when `seconds` have passed on `clock`
    (whichever comes first; `look` runs at least once, and once more after the last sleep)."""
    deadline = clock() + seconds
    while True:
        found = look()
        if done(found) or clock() >= deadline:
            return found
        sleep(poll_s)


@dataclass(frozen=True)
class Budget:
    """The hook's time budget: `seconds` from `started` (on `clock.monotonic`)."""

    started: float
    seconds: float
    clock: Clock = field(default_factory=Clock)

    @property
    def deadline(self) -> float:
        return self.started + self.seconds

    def left(self, margin_s: float = 0.0) -> float:
        """Seconds left before the deadline, `margin_s` kept back; never below 0."""
        return max(0.0, self.deadline - self.clock.monotonic() - margin_s)

    def elapsed(self) -> float:
        return round(self.clock.monotonic() - self.started, 3)

    def wait_until(self, look: Callable[[], T], done: Callable[[T], bool], *, seconds: float) -> T:
        """`wait_until` on this budget's clock, for at most `seconds`."""
        return wait_until(
            look, done, seconds=seconds, clock=self.clock.monotonic, sleep=self.clock.sleep
        )
