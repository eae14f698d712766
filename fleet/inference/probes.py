"""Probing the inference fleet: every serving box's /v1/models, all at once, in one round, and only at the instance's
own public IP and mapped port (docs/fleet.md, "fleet/inference/probes.py")."""

import asyncio
import ipaddress
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

import httpx
from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from fleet.addresses import address_refusal
from fleet.alerts.notify import raise_alert
from fleet.inference import adapters
from fleet.models import Alert, Instance, ProbeResult

log = logging.getLogger(__name__)

MODELS_PATH = "/v1/models"
MAX_BODY_BYTES = 1_000_000  # a models list is a few KB; a box that sends more is not a vLLM
ERROR_CHARS = 300  # ProbeResult.error's length
DEFAULT_CONTAINER_PORT = 8000  # vLLM's, for a serving box without a model row


# -- where a probe may go (pure; the address guard is fleet/addresses.py) -------------------------------------------


def public_port(ports: dict, container_port: int) -> int | None:
    """The public port the provider maps to this container port, from Instance.ports ({"8000/tcp": 41234})."""
    value = (ports or {}).get(f"{container_port}/tcp")  # the provider clients store it normalised
    if value is None:
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def probe_url(public_ip: str, ports: dict, container_port: int, *, allow_private: bool) -> tuple[str, str]:
    """(url, "") for the box's own /v1/models, or ("", why not)."""
    if not public_ip:
        return "", "no public address reported yet"
    refusal = address_refusal(public_ip, allow_private=allow_private)
    if refusal:
        return "", f"refused: {refusal}"
    port = public_port(ports, container_port)
    if port is None:
        return "", f"no public port mapped to container port {container_port}/tcp"
    ip = ipaddress.ip_address(public_ip.strip())
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"http://{host}:{port}{MODELS_PATH}", ""


def models_in(body: bytes) -> list[str]:
    """The model ids of an OpenAI models list ({"object": "list", "data": [{"id": ...}]}); ValueError otherwise."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("the body is not JSON") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise ValueError("the body is not an OpenAI models list (no data list)")  # noqa: TRY004 (a bad body)
    if payload.get("object", "list") != "list":
        raise ValueError(f"the body's object is {payload.get('object')!r}, not 'list'")
    ids = []
    for item in payload["data"]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise ValueError("an entry of the models list has no id")
        ids.append(item["id"])
    return ids


# -- one round over the network --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    instance_id: int
    url: str  # "" when refused
    refusal: str = ""
    expected_model: str = ""  # the model the box is meant to serve; "" for any
    adapter_base: str = ""  # for an adapter model, the base vLLM must list it on (fleet/inference/adapters.py)


@dataclass
class Outcome:
    instance_id: int
    ok: bool
    latency_ms: float | None = None
    status_code: int | None = None
    error: str = ""
    models_served: list[str] = field(default_factory=list)


async def _probe(client: httpx.AsyncClient, limit: asyncio.Semaphore, target: Target, timeout_s: float,
                 round_deadline: float) -> Outcome:
    if not target.url:
        return Outcome(target.instance_id, ok=False, error=target.refusal)
    queued = limit.locked()
    async with limit:
        started = time.perf_counter()
        # A probe that had a slot from the start ends timeout_s after the round began, not after the event loop got
        # round to opening its connection (hundreds of them take a loaded 2-core worker a good part of a second);
        # one that queued for a slot gets its whole timeout from the moment it has one.
        deadline = asyncio.get_running_loop().time() + timeout_s if queued else round_deadline
        outcome = Outcome(target.instance_id, ok=False)
        try:
            # httpx's timeout is per socket operation; this bounds the whole probe, a server that drips included.
            async with asyncio.timeout_at(deadline):
                async with client.stream("GET", target.url) as response:
                    outcome.status_code = response.status_code
                    body = b""
                    if response.status_code == 200:
                        async for chunk in response.aiter_bytes():
                            body += chunk
                            if len(body) > MAX_BODY_BYTES:
                                raise ValueError(f"the body is over {MAX_BODY_BYTES} bytes")
        except TimeoutError:
            outcome.error = f"timed out after {timeout_s:g} s"
        except httpx.TimeoutException as exc:
            outcome.error = f"timed out after {timeout_s:g} s ({type(exc).__name__})"
        except httpx.HTTPError as exc:
            outcome.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except ValueError as exc:
            outcome.error = str(exc)
        outcome.latency_ms = round((time.perf_counter() - started) * 1000, 2)
    if outcome.error:
        return outcome
    if response.is_redirect:
        outcome.error = f"HTTP {response.status_code} redirected to {response.headers.get('location', '?')} " \
                        "(redirects are not followed)"
    elif response.status_code != 200:
        outcome.error = f"HTTP {response.status_code}"
    else:
        try:
            outcome.models_served = models_in(body)
        except ValueError as exc:
            outcome.error = f"HTTP 200 but {exc}"
        else:
            if not outcome.models_served:
                outcome.error = "HTTP 200 but no model is loaded"
            elif target.adapter_base and (problem := adapters.listing_problem(body, target.expected_model,
                                                                              target.adapter_base)):
                outcome.error = problem
            elif target.expected_model and target.expected_model not in outcome.models_served:
                outcome.error = f"serves {', '.join(outcome.models_served)} but not {target.expected_model}"
            else:
                outcome.ok = True
    outcome.error = outcome.error[:ERROR_CHARS]
    return outcome


async def probe_targets(targets: list[Target], *, timeout_s: float, concurrency: int) -> list[Outcome]:
    """Probes every target concurrently; one Outcome per target, in order, whatever fails. With at least as many
    slots as targets, every probe is over within timeout_s of the round's start: when its client is ready (making
    one loads the TLS context, tens of milliseconds that would otherwise come off the first probes' timeout)."""
    limit = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    # trust_env=False: a proxy from the worker's environment must not carry (or see) the probes.
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, follow_redirects=False, trust_env=False,
                                 headers={"accept": "application/json"}) as client:
        round_deadline = asyncio.get_running_loop().time() + timeout_s
        return list(await asyncio.gather(*(_probe(client, limit, t, timeout_s, round_deadline) for t in targets)))


# -- counting failures (pure) ----------------------------------------------------------------------------------------


def failures_after(previous: int, ok: bool, *, counts: bool) -> int:
    """Consecutive failures after one probe: reset by a success, counted up by a failure that counts."""
    if ok:
        return 0
    return previous + 1 if counts else previous


def failure_counts(*, ever_answered: bool, running_at: datetime | None, now: datetime, grace: timedelta) -> bool:
    """A box that has never answered is still loading its model for a while after it starts running; its failures
    then are recorded but not counted, or every new replica would be reaped while vLLM loads the weights."""
    return ever_answered or running_at is None or now - running_at >= grace


def reaches_failing(previous: int, now_failures: int, threshold: int) -> bool:
    """The one round that crosses the threshold alerts; later failing rounds do not."""
    return previous < threshold <= now_failures


# -- a round against the database -----------------------------------------------------------------------------------


@dataclass
class ProbeRound:
    probed: int = 0
    ok: int = 0
    failed: int = 0
    refused: int = 0
    alerted: list[str] = field(default_factory=list)
    skipped: bool = False  # another round held the lock
    round_s: float = 0.0

    def to_dict(self) -> dict:
        return {"probed": self.probed, "ok": self.ok, "failed": self.failed, "refused": self.refused,
                "alerted": self.alerted, "skipped": self.skipped, "round_s": round(self.round_s, 3)}


def serving_instances():
    """The boxes a round probes: serving boxes the provider reports running."""
    return Instance.objects.filter(Q(purpose="serving") | Q(serving_model__isnull=False),
                                   state=Instance.State.RUNNING).order_by("pk")


def target_for(instance: Instance, *, allow_private: bool) -> Target:
    model = instance.serving_model
    url, refusal = probe_url(instance.public_ip, instance.ports, model.port if model else DEFAULT_CONTAINER_PORT,
                             allow_private=allow_private)
    return Target(instance.pk, url, refusal, model.name if model else "",
                  model.base_model if model and model.serves_adapter else "")


_LOCK_KEY = 0x70726F6265  # "probe": one round at a time, so a failure is counted (and alerted) once


class _RoundLock:
    """A PostgreSQL advisory lock for the round; on another database rounds simply are not overlapped by beat."""

    def __enter__(self):
        self.held = True
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [_LOCK_KEY])
                self.held = cursor.fetchone()[0]
        return self

    def __exit__(self, *exc):
        if self.held and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_KEY])


def probe_serving_instances(*, now: datetime | None = None, instances=None) -> ProbeRound:
    """One probe round over every serving box: probes concurrently, then writes in bulk."""
    started = time.perf_counter()
    report = ProbeRound()
    with _RoundLock() as lock:
        if not lock.held:
            report.skipped = True
            return report
        boxes = list((instances if instances is not None else serving_instances()).select_related("serving_model"))
        if not boxes:
            return report
        allow_private = settings.PROBE_ALLOW_PRIVATE_ADDRESSES
        targets = [target_for(box, allow_private=allow_private) for box in boxes]
        outcomes = asyncio.run(probe_targets(targets, timeout_s=settings.PROBE_TIMEOUT_S,
                                             concurrency=settings.PROBE_CONCURRENCY))
        record_round(boxes, targets, outcomes, now or timezone.now(), report)
    report.round_s = time.perf_counter() - started
    return report


def record_round(boxes: list[Instance], targets: list[Target], outcomes: list[Outcome], now: datetime,
                 report: ProbeRound) -> None:
    threshold = settings.REAPER_PROBE_FAILURES  # the reaper destroys at the same count
    grace = timedelta(seconds=settings.PROBE_STARTUP_GRACE_S)
    results, crossed = [], []
    for box, target, outcome in zip(boxes, targets, outcomes, strict=True):
        report.probed += 1
        report.ok += outcome.ok
        report.failed += not outcome.ok
        report.refused += bool(target.refusal)
        previous = box.consecutive_probe_failures
        counts = failure_counts(ever_answered=box.last_process_at is not None, running_at=box.running_at, now=now,
                                grace=grace)
        error = outcome.error if outcome.ok or counts else f"(starting, not counted) {outcome.error}"
        results.append(_Result(box.pk, now, outcome.ok, outcome.latency_ms, outcome.status_code, error[:ERROR_CHARS],
                               outcome.models_served))
        box.consecutive_probe_failures = failures_after(previous, outcome.ok, counts=counts)
        box.last_probe_at = now
        box.last_probe_latency_ms = outcome.latency_ms
        if outcome.ok:
            box.models_served = outcome.models_served
            box.last_process_at = now
        if reaches_failing(previous, box.consecutive_probe_failures, threshold):
            crossed.append((box, outcome))
    _insert_results(results)
    # Only what answered: a failed probe must not write back a last_process_at another writer may have moved on.
    answered = [box for box, outcome in zip(boxes, outcomes, strict=True) if outcome.ok]
    _save_probe_fields(boxes, answered, now)
    for box, outcome in crossed:
        raise_alert(Alert.Kind.PROBE_FAILING,
                    f"{box.label}: {box.consecutive_probe_failures} failed probes of /v1/models in a row "
                    f"(last: {outcome.error})", instance=box, now=now)
        report.alerted.append(box.label)


class _Result(NamedTuple):
    """A ProbeResult row, in its fields' order."""

    instance_id: int
    at: datetime
    ok: bool
    latency_ms: float | None
    status_code: int | None
    error: str
    models_served: list[str]


# The round writes in bulk, and on PostgreSQL with its values as one array per column (unnest): bulk_update builds a
# CASE with one WHEN per box and field, and bulk_create prepares every value on its own; for 500 boxes the two took a
# loaded worker 0.3-0.7 s of the round. Other databases (the embedded SQLite) take the ORM's way.

def _insert_results(results: list[_Result]) -> None:
    if connection.vendor != "postgresql":
        ProbeResult.objects.bulk_create([ProbeResult(**row._asdict()) for row in results], batch_size=1000)
        return
    table, _, column = _table_and_columns(ProbeResult, "instance", *_Result._fields[1:])
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(column.values())}) SELECT * FROM unnest(%s::bigint[], "
            f"%s::timestamptz[], %s::boolean[], %s::double precision[], %s::integer[], %s::text[], %s::jsonb[])",
            [[row.instance_id for row in results], [row.at for row in results], [row.ok for row in results],
             [row.latency_ms for row in results], [row.status_code for row in results],
             [row.error for row in results], [json.dumps(row.models_served) for row in results]])


def _save_probe_fields(boxes: list[Instance], answered: list[Instance], now: datetime) -> None:
    """Every box's probe fields, and what the boxes that answered serve, in one UPDATE each."""
    if connection.vendor != "postgresql":
        Instance.objects.bulk_update(boxes, ["consecutive_probe_failures", "last_probe_at", "last_probe_latency_ms"],
                                     batch_size=500)
        Instance.objects.bulk_update(answered, ["models_served", "last_process_at"], batch_size=500)
        return
    table, pk, column = _table_and_columns(Instance, "consecutive_probe_failures", "last_probe_at",
                                           "last_probe_latency_ms", "models_served", "last_process_at")
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {column['consecutive_probe_failures']} = v.failures, {column['last_probe_at']} = %s, "
            f"{column['last_probe_latency_ms']} = v.latency_ms "
            f"FROM unnest(%s::bigint[], %s::integer[], %s::double precision[]) AS v(id, failures, latency_ms) "
            f"WHERE {table}.{pk} = v.id",
            [now, [box.pk for box in boxes], [box.consecutive_probe_failures for box in boxes],
             [box.last_probe_latency_ms for box in boxes]])
        if answered:
            cursor.execute(
                f"UPDATE {table} SET {column['models_served']} = v.models_served, {column['last_process_at']} = %s "
                f"FROM unnest(%s::bigint[], %s::jsonb[]) AS v(id, models_served) WHERE {table}.{pk} = v.id",
                [now, [box.pk for box in answered], [json.dumps(box.models_served) for box in answered]])


def _table_and_columns(model, *names: str) -> tuple[str, str, dict[str, str]]:
    quote = connection.ops.quote_name
    return (quote(model._meta.db_table), quote(model._meta.pk.column),
            {name: quote(model._meta.get_field(name).column) for name in names})
