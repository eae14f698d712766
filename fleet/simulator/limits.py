"""vast.ai's rate limits, in real seconds (they protect the real server, so the simulated clock does not move them).

Clients are told apart by their IP address, as vast.ai does. A refused request does not count against the client.
"""

import math
from collections import deque


class SlidingWindowLimit:
    """At most `limit` requests in any `window_s` seconds; about 10 searches a minute on vast.ai."""

    def __init__(self, limit: int, window_s: float = 60.0):
        self.limit = limit
        self.window_s = window_s
        self._seen: dict[str, deque] = {}

    def retry_after(self, client: str, now: float) -> int | None:
        """None if this request may go (and it is counted), else whole seconds to wait."""
        seen = self._seen.setdefault(client, deque())
        while seen and seen[0] <= now - self.window_s:
            seen.popleft()
        if len(seen) >= self.limit:
            return max(1, math.ceil(seen[0] + self.window_s - now))
        seen.append(now)
        return None


class MinInterval:
    """At least `interval_s` seconds between two answered requests; vast.ai's charges endpoint refuses fast polls."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._last: dict[str, float] = {}

    def retry_after(self, client: str, now: float) -> int | None:
        last = self._last.get(client)
        if last is not None and now - last < self.interval_s:
            return max(1, math.ceil(last + self.interval_s - now))
        self._last[client] = now
        return None
