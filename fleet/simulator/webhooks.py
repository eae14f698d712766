"""A webhook receiver the simulated marketplace hosts for demos: POST /_sim/webhooks/<name> keeps what landed, GET lists
it with each delivery's Standard Webhooks signature checked against the secret the request gives."""

import base64
import hashlib
import hmac
import json
import re
import threading
import time
from collections import deque

NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
KEPT_PER_NAME = 50
KEPT_NAMES = 20
SECRET_HEADER = "webhook-secret"  # the listing's: the endpoint's whsec_ secret, as the dashboard showed it once
TOLERANCE_S = 300  # the spec's: a timestamp further from the receiver's clock is refused, however well signed


def signature_problem(secret: str, headers: dict[str, str], body: bytes, now: float) -> str:
    """Why a delivery's signature does not hold (the spec's check, done apart from the sender's code), or ""."""
    message_id, timestamp = headers.get("webhook-id", ""), headers.get("webhook-timestamp", "")
    if not message_id or not timestamp.isdigit():
        return "no webhook-id or webhook-timestamp header"
    if abs(now - int(timestamp)) > TOLERANCE_S:
        return f"timestamp {timestamp} is more than {TOLERANCE_S} s from now"
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except ValueError:
        return "the secret given is not whsec_ and base64"
    expected = base64.b64encode(hmac.new(key, f"{message_id}.{timestamp}.".encode() + body,
                                         hashlib.sha256).digest()).decode()
    given = [s.partition(",")[2] for s in headers.get("webhook-signature", "").split() if s.startswith("v1,")]
    if not any(hmac.compare_digest(expected, s) for s in given):
        return "no v1 signature matches the secret"
    return ""


class Receivers:
    """The newest deliveries each receiver name got, in memory: a demo's, not a record."""

    def __init__(self):
        self._landed: dict[str, deque] = {}
        self._lock = threading.Lock()

    def receive(self, name: str, headers: dict[str, str], body: bytes) -> None:
        wanted = {k: headers[k] for k in ("webhook-id", "webhook-timestamp", "webhook-signature") if k in headers}
        with self._lock:
            if name not in self._landed and len(self._landed) >= KEPT_NAMES:
                self._landed.pop(next(iter(self._landed)))
            self._landed.setdefault(name, deque(maxlen=KEPT_PER_NAME)).append((time.time(), wanted, body))

    def listing(self, name: str, secret: str) -> dict:
        """What landed for `name`, newest first; each signature checked when `secret` is given."""
        with self._lock:
            landed = list(self._landed.get(name, ()))
        deliveries = []
        for received_at, headers, body in reversed(landed):
            if not secret:
                verdict = f"not checked: give the endpoint's secret in a {SECRET_HEADER} header"
            else:
                verdict = signature_problem(secret, headers, body, received_at) or "valid"
            try:
                payload = json.loads(body)
            except ValueError:
                payload = body.decode("utf-8", "replace")
            deliveries.append({"received_at": round(received_at, 3), "webhook-id": headers.get("webhook-id", ""),
                               "signature": verdict, "body": payload})
        return {"name": name, "deliveries": deliveries}
