"""The dashboard's agent API as the box calls it: JSON over HTTP with the box's own bearer token."""

import httpx

from .retry import retried

FIRST_WAIT_S, MAX_WAIT_S = 1.0, 8.0  # four tries span about 7 s: a blip of the dashboard is ridden out


class Refused(ValueError):
    """The dashboard answered 4xx: what we sent is wrong, or (401) this box's token no longer opens anything."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class _Unanswered(Exception):
    """No answer, or a 5xx or 429: worth another try."""


class Api:
    """The dashboard's agent API, retried with backoff; a 4xx is a bug in what we sent, not worth retrying."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0, attempts: int = 4):
        self.http = httpx.Client(base_url=base_url.rstrip("/") + "/", timeout=timeout_s,
                                 headers={"Authorization": f"Bearer {token}"})
        self.attempts = attempts

    def call(self, method: str, path: str, body=None):
        try:
            return retried(lambda: self._once(method, path, body), tries=self.attempts, first_s=FIRST_WAIT_S,
                           cap_s=MAX_WAIT_S, retry_on=(_Unanswered,))
        except _Unanswered as exc:
            raise ConnectionError(f"{method} {path}: {exc} after {self.attempts} tries") from None

    def _once(self, method: str, path: str, body):
        try:
            response = self.http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise _Unanswered(type(exc).__name__) from None
        if response.status_code < 400:
            return response.json()
        if response.status_code < 500 and response.status_code != 429:
            raise Refused(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}", response.status_code)
        raise _Unanswered(f"HTTP {response.status_code}")
