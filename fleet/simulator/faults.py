"""Faults injected into the next API requests: the 429s and 5xx a client must ride out.

Each injected failure answers exactly one request under /api/v0 (any path, or only paths containing
`path_contains`), in the order injected, before authentication, the way a proxy in front of the API would.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Failure:
    status: int  # 429, 500, 502 or 503
    retry_after_s: int | None
    path_contains: str
    retry_after: str | None = None  # the Retry-After header as sent, when a test gives it as text (an HTTP date)


class RequestFaults:
    def __init__(self):
        self._queue: list[Failure] = []

    def add(self, status: int, count: int, retry_after_s: int | None = None, path_contains: str = "",
            retry_after: str | None = None) -> None:
        if status not in (429, 500, 502, 503):
            raise ValueError(f"status {status} is not one the marketplace answers with (429, 500, 502, 503)")
        self._queue.extend(Failure(status, retry_after_s, path_contains, retry_after) for _ in range(count))

    def take(self, path: str) -> Failure | None:
        for i, failure in enumerate(self._queue):
            if failure.path_contains in path:
                return self._queue.pop(i)
        return None

    def pending(self) -> list[dict]:
        return [vars(f) for f in self._queue]
