"""A scripted clock for the watchdog's real loop (tests/unit): time moves only when the watchdog
sleeps, and the scripted events (a rank advancing, peers publishing, the child ending) run as the
clock passes them."""

from __future__ import annotations


class Script:
    def __init__(
        self, events: list[tuple[float, object]], *, wall0: float, limit_s: float = 60.0
    ) -> None:
        self.t = 0.0
        self.events = sorted(events, key=lambda e: e[0])
        self.wall0, self.limit_s = wall0, limit_s

    def clock(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.wall0 + self.t

    def sleep(self, dt: float) -> None:
        assert dt > 0
        self.t = round(self.t + dt, 6)
        while self.events and self.events[0][0] <= self.t:
            self.events.pop(0)[1]()
        assert self.t < self.limit_s, "the watchdog never returned"
