"""The agent's one way of trying again: waits that double from a first one up to a cap, each jittered so that the
boxes a blip failed together do not all come back at the same instant."""

import random
import time

JITTER = 0.2  # each wait is its nominal length give or take this fraction


def backoff_s(attempt: int, first_s: float, cap_s: float) -> float:
    """The wait after the `attempt`-th failure (from 1): first_s, doubled each time, at most cap_s, jittered."""
    return min(cap_s, first_s * 2 ** (attempt - 1)) * random.uniform(1 - JITTER, 1 + JITTER)


def retried(action, *, tries: int, first_s: float, cap_s: float, retry_on: tuple[type[Exception], ...],
            on_failure=None, sleep=time.sleep):
    """What `action()` returns, tried up to `tries` times while it raises one of `retry_on` (the last such error is
    raised); any other error is raised at once. `on_failure(attempt, error)` hears of each failure before the wait."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, not {tries}")
    for attempt in range(1, tries + 1):
        try:
            return action()
        except retry_on as error:
            if on_failure is not None:
                on_failure(attempt, error)
            if attempt == tries:
                raise
            sleep(backoff_s(attempt, first_s, cap_s))
