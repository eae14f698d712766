"""Webhooks as the Standard Webhooks spec says: secrets, signatures, bodies, the retry schedule, and one guarded POST
(docs/fleet.md, "fleet/alerts/webhooks.py")."""

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import json
import random
import re
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from fleet import hooks
from fleet.addresses import host_refusal, resolve

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
    payload: dict[str, object]
    if slack:
        where = f" ({alert.instance.label})" if alert.instance_id and alert.instance else ""
        payload = {"text": slack_text(f"[{alert.kind}] {alert.message}{where}")}
    else:
        payload = {
            "type": alert.kind,
            "timestamp": alert.created_at.isoformat().replace("+00:00", "Z"),
            "data": {"message": alert.message, "instance": instance_record(alert.instance), "alert_id": alert.pk,
                     **hooks.alert_data(alert)},  # a run's evaluation: its numbers (fleet.hooks.on_alert_data)
        }
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def slack_text(text: str) -> str:
    """Text as Slack shows it literally: its message format reads <!channel>, <@user> and <url|label> as commands and
    links, and an alert carries what a box or a marketplace wrote. Slack asks for &, < and > escaped, no more."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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


def shown_host(url: str) -> str:
    """The receiver as a page may show it: host and port, never the credentials or the (secret) path."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


def destination(url: str) -> tuple:
    """What makes two URLs one receiver: the scheme and host in any case, the default port written or not, the same
    path and query."""
    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    port = port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").rstrip("."), port, parts.path or "/", parts.query


DEMO_RECEIVER_PATH = re.compile(r"/_sim/webhooks/[A-Za-z0-9_-]{1,40}/?")  # fleet/simulator/webhooks.py's


def is_demo_receiver(url: str, simulator_url: str) -> bool:
    """Whether `url` is a demo receiver of the simulated marketplace at `simulator_url` (http://host:port): its scheme,
    host and port exactly, a receiver's path, no credentials, query or fragment."""
    parts, simulator = urlsplit(url.strip()), urlsplit(simulator_url)
    try:
        port = parts.port
    except ValueError:
        return False
    return (parts.scheme == "http" == simulator.scheme and parts.hostname == simulator.hostname
            and port == simulator.port and not parts.username and not parts.password and not parts.query
            and not parts.fragment and "?" not in url and "#" not in url
            and bool(DEMO_RECEIVER_PATH.fullmatch(parts.path)))


class Refused(ValueError):
    """The address guard, or the URL itself, does not let a webhook go there; the message says why."""


class Unresolved(Refused):
    """The receiver's name resolves to nothing right now."""


def _where(url: str, *, allow_private: bool) -> tuple[str, str]:
    """(the URL to connect to, with the checked address in place of the name; the Host header), or Refused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused("not an http(s) URL with a host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise Refused("the port is not a number") from None
    try:
        addresses = resolve(parts.hostname, port)
    except OSError as exc:
        raise Unresolved(f"{parts.hostname} does not resolve ({exc})") from None
    why = host_refusal(parts.hostname, addresses, allow_private=allow_private)
    if why:
        raise Refused(why)
    ip = ipaddress.ip_address(addresses[0])
    pinned = f"[{ip}]" if ip.version == 6 else str(ip)
    return urlunsplit((parts.scheme, f"{pinned}:{port}", parts.path or "/", parts.query, "")), shown_host(url)


def url_refusal(url: str, *, allow_private: bool) -> str:
    """Why a webhook URL may not be saved, or "": an address the guard refuses, now. A name that does not resolve
    yet is accepted here (each attempt checks it again)."""
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        return "a URL holds no spaces or control characters"
    try:
        _where(url, allow_private=allow_private)
    except Unresolved:
        return ""
    except Refused as exc:
        return str(exc)
    return ""


def post(url: str, headers: dict[str, str], body: bytes, *, timeout_s: float, allow_private: bool) -> Attempt:
    """One POST to the checked address, within `timeout_s` in all. Redirects are not followed (a 3xx is a failure,
    as the spec recommends)."""
    try:
        connect, host = _where(url, allow_private=allow_private)
    except Refused as exc:
        return Attempt(None, f"refused: {exc}"[:500])
    hostname = urlsplit(url).hostname or ""  # _where has refused a URL without one
    try:
        status = asyncio.run(asyncio.wait_for(_send(connect, {**headers, "Host": host}, body, hostname, timeout_s),
                                              timeout_s))
    except (TimeoutError, httpx.TimeoutException) as exc:
        return Attempt(None, f"timed out: no answer within {timeout_s:g} s in all ({type(exc).__name__})")
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL: a control character the form let through
        return Attempt(None, f"{type(exc).__name__}: {exc}"[:500])
    if 200 <= status < 300:
        return Attempt(status, "")
    error = f"HTTP {status}"
    if 300 <= status < 400:
        error += " redirect not followed"
    return Attempt(status, error)


async def _send(connect: str, headers: dict[str, str], body: bytes, hostname: str, timeout_s: float) -> int:
    async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False, trust_env=False) as client:
        # The answer's status is all that counts: its body is never read.
        async with client.stream("POST", connect, content=body, headers=headers,
                                 extensions={"sni_hostname": hostname}) as response:
            return response.status_code
