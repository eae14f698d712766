"""The simulated clock: unix seconds that run `speed` times as fast as real time and that tests push forward."""

import time


class SimClock:
    """Not locked: the market reads and moves it under its own lock."""

    def __init__(self, speed: float = 1.0, start: float | None = None):
        if speed < 0:
            raise ValueError("speed must be >= 0 (0 freezes the clock except for advance())")
        self.speed = speed
        self._start = time.time() if start is None else start
        self._real_start = time.monotonic()
        self._advanced_s = 0.0

    def now(self) -> float:
        return self._start + (time.monotonic() - self._real_start) * self.speed + self._advanced_s

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        self._advanced_s += seconds
        return self.now()
