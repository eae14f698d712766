"""Alerts and their webhook deliveries: each a row before anything is sent, a delivery sent only by the worker that
claimed it (docs/fleet.md, "fleet/alerts/notify.py")."""

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from fleet import demo, enqueue
from fleet.alerts import webhooks
from fleet.models import Alert, Instance, WebhookDelivery, WebhookEndpoint

log = logging.getLogger(__name__)
State = WebhookDelivery.State
DUE_STATES = (State.PENDING, State.RETRYING)


def raise_alert(kind: str, message: str, *, instance: Instance | None = None, now=None) -> Alert:
    now = now or timezone.now()
    with transaction.atomic():
        alert = Alert.objects.create(kind=kind, message=message, instance=instance, created_at=now)
        endpoints = [endpoint for endpoint in WebhookEndpoint.objects.filter(enabled=True) if endpoint.wants(kind)]
        _queue_deliveries(alert, endpoints, now)
    return alert


def _queue_deliveries(alert: Alert, endpoints, now: datetime) -> list[WebhookDelivery]:
    deliveries = WebhookDelivery.objects.bulk_create([
        WebhookDelivery(endpoint=endpoint, alert=alert, message_id=f"msg_{uuid.uuid4().hex}", created_at=now)
        for endpoint in endpoints
    ])
    for delivery in deliveries:
        # robust: a broker outage must not fail the action that raised the alert; retry_webhooks picks it up.
        transaction.on_commit(partial(enqueue.deliver_webhook, delivery.pk), robust=True)
    return deliveries


@dataclass(frozen=True)
class Delivered:
    """What one call of `deliver` did: `state` of the row afterwards (None: not ours to send now), and in how many
    seconds it is due again when it waits for a retry."""

    state: str | None
    retry_in_s: float | None = None


def _lease() -> timedelta:
    # While sending, next_attempt_at holds the lease: past it, retry_webhooks takes the attempt as lost.
    return timedelta(seconds=2 * settings.WEBHOOK_TIMEOUT_S + 30)


def deliver(delivery_id: int, *, now: datetime | None = None) -> Delivered:
    """Makes the delivery's next attempt if it is due and nobody else has claimed it."""
    now = now or timezone.now()
    # A disabled endpoint's waiting deliveries fail without an attempt.
    WebhookDelivery.objects.filter(pk=delivery_id, state__in=DUE_STATES, endpoint__enabled=False).update(
        state=State.FAILED, finished_at=now, next_attempt_at=None, last_error="endpoint disabled")
    claimed = (WebhookDelivery.objects.filter(pk=delivery_id, state__in=DUE_STATES)
               .filter(Q(next_attempt_at=None) | Q(next_attempt_at__lte=now))
               .update(state=State.SENDING, attempts=F("attempts") + 1, next_attempt_at=now + _lease()))
    if not claimed:
        row = WebhookDelivery.objects.filter(pk=delivery_id).values("state", "next_attempt_at").first()
        if row and row["state"] == State.RETRYING and row["next_attempt_at"]:
            return Delivered(None, max((row["next_attempt_at"] - now).total_seconds(), 0.0))
        return Delivered(None)

    delivery = WebhookDelivery.objects.select_related("endpoint", "alert__instance").get(pk=delivery_id)
    endpoint = delivery.endpoint
    body = webhooks.body(delivery.alert, slack=endpoint.slack)
    timestamp = int(now.timestamp())  # the attempt's time, as the spec says; the event's is in the body
    attempt = webhooks.post(endpoint.url, webhooks.headers(endpoint.secret, delivery.message_id, timestamp, body),
                            body, timeout_s=settings.WEBHOOK_TIMEOUT_S, allow_private=_allow_private(endpoint.url))
    return _record(delivery, attempt, now)


def _record(delivery: WebhookDelivery, attempt: webhooks.Attempt, now: datetime) -> Delivered:
    outcome = webhooks.decide(attempt.status_code, delivery.attempts, settings.WEBHOOK_MAX_ATTEMPTS)
    after = max(timezone.now(), now)
    fields: dict[str, object] = {"last_status_code": attempt.status_code, "last_error": attempt.error[:500]}
    retry_in_s = None
    if outcome == webhooks.SENT:
        state = State.SENT
        fields.update(finished_at=after, next_attempt_at=None)
    elif outcome == webhooks.RETRY:
        retry_in_s = webhooks.backoff_s(delivery.attempts, base_s=settings.WEBHOOK_BACKOFF_BASE_S,
                                        factor=settings.WEBHOOK_BACKOFF_FACTOR, max_s=settings.WEBHOOK_BACKOFF_MAX_S)
        state = State.RETRYING
        fields.update(next_attempt_at=after + timedelta(seconds=retry_in_s))
    else:
        if outcome == webhooks.GONE:
            fields["last_error"] = "HTTP 410 Gone: the endpoint asked to stop; it is disabled"
            reason = f"answered 410 Gone to {delivery.message_id} at {after:%Y-%m-%d %H:%M} UTC"
            endpoint = WebhookEndpoint.objects.filter(pk=delivery.endpoint_id, enabled=True)
            endpoint.update(enabled=False, disabled_reason=reason)
        elif attempt.error:
            fields["last_error"] = f"gave up after {delivery.attempts} attempts; last: {attempt.error}"[:500]
        state = State.FAILED
        fields.update(finished_at=after, next_attempt_at=None)
    # Only the attempt we claimed may be recorded: a lease taken back meanwhile means a later attempt owns the row.
    recorded = WebhookDelivery.objects.filter(pk=delivery.pk, state=State.SENDING, attempts=delivery.attempts).update(
        state=state, **fields)
    log.info("webhook %s to endpoint %s (%s): attempt %d -> %s %s", delivery.message_id, delivery.endpoint_id,
             delivery.endpoint.name, delivery.attempts, state, attempt.error)
    if not recorded:
        return Delivered(None)
    return Delivered(state, retry_in_s)


def due_deliveries(*, now: datetime | None = None) -> list[int]:
    """Deliveries whose task was lost: pending or retrying and overdue by a beat interval; and attempts whose lease
    ran out (a worker died while sending), which count as failed attempts and are retried if any are left."""
    now = now or timezone.now()
    max_attempts = settings.WEBHOOK_MAX_ATTEMPTS
    stale = WebhookDelivery.objects.filter(state=State.SENDING, next_attempt_at__lte=now)
    stale.filter(attempts__gte=max_attempts).update(
        state=State.FAILED, finished_at=now, next_attempt_at=None, last_error="no result from the last attempt")
    recovered = list(stale.values_list("pk", flat=True))
    stale.filter(pk__in=recovered).update(state=State.RETRYING, next_attempt_at=now,
                                          last_error="no result from the attempt (worker lost?)")
    overdue = now - timedelta(seconds=settings.WEBHOOK_RETRY_SECONDS)
    waiting = Q(state=State.PENDING, created_at__lte=overdue) | Q(state=State.RETRYING, next_attempt_at__lte=overdue)
    lost = (WebhookDelivery.objects
            .filter(waiting)
            .order_by("next_attempt_at", "id").values_list("pk", flat=True)[:500])
    return recovered + [pk for pk in lost if pk not in recovered]


def _allow_private(url: str) -> bool:
    """Private addresses where the settings allow them; otherwise only the enabled simulated marketplace's own demo
    receivers, at exactly its address (it runs on this machine)."""
    simulator = demo.simulator_url()
    return settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES or bool(simulator) and webhooks.is_demo_receiver(url, simulator)


# -- endpoints (the Alerts page calls these) ----------------------------------------------------------------------


def create_endpoint(*, name: str, url: str, events: list[str], slack: bool, by=None) -> WebhookEndpoint:
    """A new endpoint with a fresh secret. The caller shows the secret once. A URL whose host the address guard
    refuses raises ValueError with the reason."""
    why = webhooks.url_refusal(url, allow_private=_allow_private(url))
    if why:
        raise ValueError(f"This URL is not allowed: {why}.")
    return WebhookEndpoint.objects.create(name=name, url=url, events=sorted(events), slack=slack,
                                          secret=webhooks.new_secret(), created_by=by)


def set_enabled(endpoint: WebhookEndpoint, enabled: bool, *, by=None) -> None:
    reason = "" if enabled else f"disabled by {by.get_username() if by else 'someone'}"
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(enabled=enabled, disabled_reason=reason)
    endpoint.refresh_from_db()


def endpoint_for(url: str) -> WebhookEndpoint | None:
    """The endpoint, enabled or not, that posts to the same receiver as `url` (webhooks.destination)."""
    wanted = webhooks.destination(url)
    return next((e for e in WebhookEndpoint.objects.order_by("id") if webhooks.destination(e.url) == wanted), None)


def send_test(endpoint: WebhookEndpoint, *, by=None, now: datetime | None = None) -> WebhookDelivery:
    """A test alert to this endpoint only, whatever kinds it takes, through the same delivery rows and retries as
    any other. Its kind is "test", so neither the receiver nor the alert log takes it for something that happened."""
    now = now or timezone.now()
    who = by.get_username() if by else "someone"
    with transaction.atomic():
        alert = Alert.objects.create(kind=Alert.Kind.TEST, created_at=now,
                                     message=f"Test alert to {endpoint.name}, sent by {who}; nothing happened.")
        [delivery] = _queue_deliveries(alert, [endpoint], now)
    return delivery
