"""Webhooks as the Standard Webhooks spec says: secrets, signatures, bodies, the retry schedule, and one POST.

Everything here but `post` is pure; the database side (claiming a delivery, recording its outcome) is in
fleet/alerts.py.
"""

import base64
import hashlib
import hmac
import json
import random
import secrets
from dataclasses import dataclass

import httpx

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24  # the spec's minimum for HMAC-SHA256 keys


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key: the base64-decoded part after "whsec_"."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, message_id, timestamp, body),
    }


def instance_record(instance) -> dict | None:
    if instance is None:
        return None
    return {"id": instance.pk, "label": instance.label, "provider": instance.provider,
            "provider_instance_id": instance.provider_instance_id, "gpu_name": instance.gpu_name,
            "num_gpus": instance.num_gpus, "state": instance.state}


def body(alert, *, slack: bool) -> bytes:
    """The bytes that are signed and sent: minified JSON, so what is signed is exactly what goes out."""
    if slack:
        where = f" ({alert.instance.label})" if alert.instance_id and alert.instance else ""
        payload = {"text": f"[{alert.kind}] {alert.message}{where}"}
    else:
        payload = {
            "type": alert.kind,
            "timestamp": alert.created_at.isoformat().replace("+00:00", "Z"),
            "data": {"message": alert.message, "instance": instance_record(alert.instance), "alert_id": alert.pk},
        }
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def backoff_s(attempts: int, *, base_s: float, factor: float, max_s: float, rand=random.random) -> float:
    """Delay after the `attempts`-th failed attempt: exponential, capped, with "equal jitter" (half to all of it)."""
    delay = min(max_s, base_s * factor ** max(attempts - 1, 0))
    return delay / 2 + rand() * delay / 2


SENT, GONE, RETRY, FAILED = "sent", "gone", "retry", "failed"


def decide(status_code: int | None, attempts: int, max_attempts: int) -> str:
    """What one attempt's result means. Only 2xx succeeds; 410 asks us to stop; everything else is retried."""
    if status_code is not None and 200 <= status_code < 300:
        return SENT
    if status_code == 410:
        return GONE
    return RETRY if attempts < max_attempts else FAILED


@dataclass(frozen=True)
class Attempt:
    status_code: int | None
    error: str  # empty on 2xx


def post(url: str, headers: dict[str, str], body: bytes, *, timeout_s: float) -> Attempt:
    """One POST. Redirects are not followed (a 3xx is a failure, as the spec recommends)."""
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=timeout_s, follow_redirects=False)
    except httpx.TimeoutException as exc:
        return Attempt(None, f"timed out after {timeout_s:g} s ({type(exc).__name__})")
    except httpx.HTTPError as exc:
        return Attempt(None, f"{type(exc).__name__}: {exc}"[:500])
    if 200 <= response.status_code < 300:
        return Attempt(response.status_code, "")
    error = f"HTTP {response.status_code}"
    if response.is_redirect:
        error += " redirect not followed"
    return Attempt(response.status_code, error)
