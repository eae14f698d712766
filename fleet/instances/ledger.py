"""The cost ledger: an instance bills per second at the provider's own hourly price over its cost segments; one
segment per price, closed when the price changes or the instance stops billing. Money is Decimal throughout."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from fleet.models import CostSegment, Instance

SECONDS_PER_HOUR = Decimal(3600)


def segment_cost(usd_per_hour: Decimal, start: datetime, end: datetime) -> Decimal:
    seconds = max(0.0, (end - start).total_seconds())
    return usd_per_hour * Decimal(str(seconds)) / SECONDS_PER_HOUR


def cost_in_window(segments, window_start: datetime | None, window_end: datetime) -> Decimal:
    """What (usd_per_hour, started_at, ended_at-or-None) segments billed between the two times."""
    total = Decimal(0)
    for usd_per_hour, started_at, ended_at in segments:
        start = started_at if window_start is None else max(started_at, window_start)
        end = window_end if ended_at is None else min(ended_at, window_end)
        if end > start:
            total += segment_cost(usd_per_hour, start, end)
    return total


@dataclass(frozen=True)
class AccountCost:
    this_hour_usd: Decimal
    today_usd: Decimal
    burn_usd_per_hour: Decimal  # what the open segments bill per hour right now
    at: datetime


def committed_usd_per_hour() -> Decimal:
    """What the boxes the reaper's spend cap counts bill per hour, with those asked for and not yet billing (they
    will be counted the moment they are)."""
    live = (Instance.State.REQUESTED, Instance.State.PROVISIONING, Instance.State.RUNNING)
    counted = Q(state__in=live, reaped_at__isnull=True) | destroy_overdue(timezone.now())
    prices = Instance.objects.filter(counted).values_list("usd_per_hour", flat=True)
    return sum(prices, Decimal(0))


def destroy_overdue(now: datetime) -> Q:
    """Rows asked to stop whose machine is known to bill still: a destroy sent and found listed afterwards (the sync
    then sends another, so more than one attempt), or one not sent DESTROY_VERIFY_S after it was asked for."""
    return Q(state=Instance.State.STOPPING, provider_instance_id__isnull=False) & (
        Q(destroy_attempts__gte=2) | Q(destroy_attempts=0, destroy_requested_at__lte=now - timedelta(
            seconds=settings.DESTROY_VERIFY_S)))


def over_spend_cap(committed_usd_per_hour: Decimal, usd_per_hour: Decimal, cap_usd_per_hour: Decimal) -> bool:
    """Whether one more box at this price puts the account over the cap (0: no cap), so the reaper destroys the
    newest boxes, this one first, at its next pass."""
    return cap_usd_per_hour > 0 and committed_usd_per_hour + usd_per_hour > cap_usd_per_hour


def reprice_from_start(instance: Instance, usd_per_hour: Decimal) -> None:
    """The provider's first word on the price applies from the rent on, not from when we first heard it."""
    instance.cost_segments.filter(ended_at__isnull=True).update(usd_per_hour=usd_per_hour)


def bill(instance: Instance, usd_per_hour: Decimal, at: datetime) -> None:
    """Bills the instance at this price from `at` on: opens a segment, closing one at another price first."""
    current = instance.cost_segments.filter(ended_at__isnull=True).first()
    if current is not None:
        if current.usd_per_hour == usd_per_hour:
            return
        current.ended_at = max(at, current.started_at)
        current.save(update_fields=["ended_at"])
    CostSegment.objects.create(instance=instance, usd_per_hour=usd_per_hour, started_at=at)


def stop_billing(instance: Instance, at: datetime) -> None:
    for segment in instance.cost_segments.filter(ended_at__isnull=True):
        segment.ended_at = max(at, segment.started_at)
        segment.save(update_fields=["ended_at"])


def billing_rates(instances) -> dict[int, Decimal]:
    """What each instance bills per hour right now (its open segment's price; 0 when none is open), one query."""
    rates = {i.pk: Decimal(0) for i in instances}
    for pk, rate in CostSegment.objects.filter(instance_id__in=list(rates), ended_at__isnull=True).values_list(
            "instance_id", "usd_per_hour"):
        rates[pk] += rate
    return rates


def instance_cost(instance: Instance, now: datetime) -> Decimal:
    segments = [(s.usd_per_hour, s.started_at, s.ended_at) for s in instance.cost_segments.all()]
    return cost_in_window(segments, None, now) + instance.traffic_usd


def instance_costs(instances, now: datetime) -> dict[int, Decimal]:
    """Cost so far of many instances with one query."""
    ids = [i.pk for i in instances]
    totals = {i.pk: i.traffic_usd for i in instances}
    for s in CostSegment.objects.filter(instance_id__in=ids):
        totals[s.instance_id] += cost_in_window([(s.usd_per_hour, s.started_at, s.ended_at)], None, now)
    return totals


def account_cost(now: datetime) -> AccountCost:
    hour_start = now.replace(minute=0, second=0, microsecond=0)
    day_start = hour_start.replace(hour=0)
    rows = list(CostSegment.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=day_start), started_at__lt=now)
                .values_list("usd_per_hour", "started_at", "ended_at"))
    return AccountCost(
        this_hour_usd=cost_in_window(rows, hour_start, now),
        today_usd=cost_in_window(rows, day_start, now),
        burn_usd_per_hour=sum((rate for rate, _, ended in rows if ended is None), Decimal(0)),
        at=now,
    )
