"""The HTTP rules every marketplace client shares: timeouts on every call, no redirects followed, retries with
jittered exponential backoff on 429 (honouring Retry-After), 5xx and network failures, a clear error for a refused
key, and never a retry of a call that may have rented something."""

import email.utils
import json
import logging
import math
import random
import re
import time
from datetime import UTC, datetime

import httpx

from .errors import AuthenticationFailed, MalformedResponse, OutcomeUnknown, ProviderUnavailable, RateLimited

log = logging.getLogger(__name__)


class RetryingClient:
    def __init__(self, *, provider: str, key_variable: str, api_key: str, base_url: str = "",
                 timeout_s: float = 20.0, max_retries: int = 4, backoff_s: float = 0.5, max_wait_s: float = 30.0,
                 rate_limit_wait_s: float = 3.0, sleep=time.sleep, transport: httpx.BaseTransport | None = None):
        if not api_key:
            raise AuthenticationFailed(f"No {provider} API key is configured: set {key_variable}.")
        self.provider, self.key_variable = provider, key_variable
        self.max_retries, self.backoff_s, self.max_wait_s = max_retries, backoff_s, max_wait_s
        # A 429 without Retry-After waits at least this: vast.ai limits each endpoint to a minimum interval (a rent
        # about 4.5 s, with a 12 s penalty for one too soon) and says nothing of it in the answer.
        self.rate_limit_wait_s = rate_limit_wait_s
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, url: str, *, what: str, idempotent: bool = True,
                rate_limit_wait_s: float | None = None, **kwargs) -> httpx.Response:
        """Sends a request, retrying 429s, 5xx and network failures with backoff; a call that is not idempotent raises
        OutcomeUnknown where the marketplace may have acted (docs/fleet.md, "Retrying requests")."""
        for attempt in range(self.max_retries + 1):
            last_attempt = attempt == self.max_retries
            try:
                response = self._http.request(method, url, **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if last_attempt:
                    raise ProviderUnavailable(f"{what}: cannot connect ({type(exc).__name__}).") from None
                self._sleep(self._backoff(attempt))
                continue
            except httpx.DecodingError:  # an answer came, its body undecodable (a Content-Encoding it does not have)
                if not idempotent:
                    raise OutcomeUnknown(f"{what}: its answer could not be decoded; it may have happened.") from None
                raise MalformedResponse(f"{what}: the answer's body could not be decoded.") from None
            except httpx.TransportError as exc:
                if not idempotent:
                    raise OutcomeUnknown(f"{what}: {type(exc).__name__} after sending; it may have happened.") from None
                if last_attempt:
                    raise ProviderUnavailable(f"{what}: {type(exc).__name__} after {attempt + 1} tries.") from None
                self._sleep(self._backoff(attempt))
                continue

            status = response.status_code
            if status == 401 or (status == 403 and not _refuses_request(response)):
                raise AuthenticationFailed(
                    f"{self.provider} refused the API key (HTTP {status}): check {self.key_variable}.")
            if status == 429:
                floor = self.rate_limit_wait_s if rate_limit_wait_s is None else rate_limit_wait_s
                wait_s = retry_after_s(response) or max(floor, threshold_s(response) or 0.0, self._backoff(attempt))
                if last_attempt or wait_s > self.max_wait_s:
                    raise RateLimited(f"{what}: rate limited (HTTP 429).", retry_after_s=wait_s)
                log.info("%s rate limited; waiting %.1f s", what, wait_s)
                self._sleep(wait_s)
                continue
            if status >= 500:
                if not idempotent:
                    raise OutcomeUnknown(f"{what}: HTTP {status} after sending; it may have happened.")
                wait_s = retry_after_s(response) or self._backoff(attempt)
                if last_attempt:
                    raise ProviderUnavailable(f"{what}: HTTP {status} after {attempt + 1} tries.")
                if wait_s > self.max_wait_s:  # a worker must not sleep for however long an answer asks
                    raise ProviderUnavailable(f"{what}: HTTP {status}, asked to retry in {wait_s:.0f} s.")
                self._sleep(wait_s)
                continue
            return response
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int) -> float:
        # Exponential with jitter so that several workers do not retry in step.
        return min(self.max_wait_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)


AUTH_ERROR_CODES = {"auth_error", "invalid_user_key", "unauthorized", "forbidden"}  # an answer's `error` for a bad key


def _refuses_request(response: httpx.Response) -> bool:
    """A 403 that names an error of the request, not of the key: vast.ai answers {"success": false, "error":
    "invalid_args", "msg": "... is not your own ..."} for an offer one may not rent. Its caller reads it."""
    try:
        data = json.loads(response.content)
    except ValueError:
        return False
    error = data.get("error") if isinstance(data, dict) else None
    return isinstance(error, str) and bool(error) and error.lower() not in AUTH_ERROR_CODES


_THRESHOLD = re.compile(r"threshold\s*=\s*([0-9]+(?:\.[0-9]+)?)")


def threshold_s(response: httpx.Response) -> float | None:
    """The minimum interval a 429 names ("API requests too frequent endpoint threshold=4.5", as text or in a JSON
    field), in seconds; vast.ai sends no Retry-After, only this. None where it names none (or an absurd one)."""
    found = _THRESHOLD.search(response.text[:1000])
    if found is None:
        return None
    seconds = float(found.group(1))
    return seconds if 0 < seconds <= 3600 else None


def retry_after_s(response: httpx.Response) -> float | None:
    """Retry-After in seconds, given as seconds or as an HTTP date (a date without a zone read as UTC); None when
    absent or unreadable (text, NaN, an infinity, a date no calendar holds)."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" in RFC 2822 means UTC with no claim about local time
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
