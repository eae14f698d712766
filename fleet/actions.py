"""The only code that rents or destroys machines: renting in two steps (a row, then the provider call), destroying
verified by the sync, and every failure ending in `fail` (docs/fleet.md, "fleet/actions.py")."""

import json
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TypeGuard

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from fleet import hooks, volumes
from fleet.instances import bids, ledger, waiting
from fleet.alerts.notify import raise_alert
from fleet.models import Alert, Instance, InstanceEvent, Offer
from fleet.offers.ranked import rank_stored_offers, rent_settings
from fleet.providers.registry import get_provider
from fleet.providers.base import InstanceList
from fleet.providers.errors import InstanceNotFound, OfferUnavailable, OutcomeUnknown, ProviderError, RequestRefused
from fleet.providers.records import InstanceRecord, RentRequest
from fleet.ranking import OfferFilters, Workload, best_offer
from fleet.ranking.price import per_hour, rental_price

log = logging.getLogger(__name__)
State = Instance.State

DEAD_STATUSES = {"exited", "stopped", "offline"}


def record_event(instance: Instance, kind: str, message: str, now: datetime | None = None) -> None:
    InstanceEvent.objects.create(instance=instance, kind=kind, message=message, at=now or timezone.now())


def label_for(instance: Instance) -> str:
    return f"{settings.INSTANCE_LABEL_PREFIX}-{instance.pk}"


def pk_from_label(label: str) -> int | None:
    match = re.fullmatch(rf"{re.escape(settings.INSTANCE_LABEL_PREFIX)}-(\d+)", label or "")
    return int(match.group(1)) if match else None


# -- renting ---------------------------------------------------------------------------------------------------------


def request_rent(*, offer: Offer, idempotency_key: str, requested_by=None, image: str | None = None,
                 disk_gb: int | None = None, purpose: str = "manual", bid_cap_usd_per_hour: Decimal | None = None,
                 volume: dict | None = None, now: datetime | None = None) -> tuple[Instance, bool]:
    """Records the intent to rent the offer; the same key returns the same row, so a retried request rents once.
    `bid_cap_usd_per_hour`: for a bid, the rental's price cap an outbid box may raise its bid up to. `volume`: the
    account's volume the box mounts (fleet.volumes.pinned), kept on the row for the rent."""
    now = now or timezone.now()
    bid = None
    if offer.is_bid:
        bid = max(offer.min_bid_usd_per_hour or Decimal(0), offer.gpu_usd_per_hour)
    disk_gb = disk_gb or settings.RENT_DISK_GB
    price = rental_price(offer, disk_gb).usd_per_hour
    with transaction.atomic():
        instance, created = Instance.objects.get_or_create(idempotency_key=idempotency_key, defaults=dict(
            provider=offer.provider, offer_id=offer.offer_id, gpu_name=offer.gpu_name, num_gpus=offer.num_gpus,
            machine_id=offer.machine_id,
            image=image or settings.WORKER_IMAGE, disk_gb=disk_gb, is_bid=offer.is_bid,
            bid_usd_per_hour=bid, usd_per_hour=price, requested_by=requested_by,
            bid_cap_usd_per_hour=bid_cap_usd_per_hour if offer.is_bid else None,
            volume={"id": volume["id"], "mount_path": volume["mount_path"],
                    "data_center_id": volume.get("data_center_id") or ""} if volume else {},
            requested_at=now, purpose=purpose))
        if created:
            instance.label = label_for(instance)
            instance.save(update_fields=["label"])
            who = requested_by.get_username() if requested_by else "the product"
            record_event(instance, "requested",
                         f"{who} asked for offer {offer.offer_id}: {offer.num_gpus}x {offer.gpu_name} at "
                         f"{per_hour(price)}, {'bid (interruptible)' if offer.is_bid else 'on-demand'}"
                         f", {instance.disk_gb} GB disk, image {instance.image}"
                         + (f", volume {volume['id']} mounted at {volume['mount_path']}" if volume else ""), now)
    return instance, created


def rent(instance_id: int, *, now: datetime | None = None, env: dict[str, str] | None = None,
         onstart: str = "") -> Instance:
    """Calls the provider for a requested instance, at most once per row whatever retries the task gets. `env`
    reaches the box only (it may hold a run's agent token): it is not stored."""
    now = now or timezone.now()
    # The claim is stamped with the clock, not the caller's `now`: a pass that rents several boxes under one `now`
    # (or waits out a 429 first) would otherwise start a later rent's grace (_rent_settled) before its call was made.
    claimed = Instance.objects.filter(pk=instance_id, state=State.REQUESTED, rent_attempted_at=None).update(
        rent_attempted_at=timezone.now())
    instance = Instance.objects.get(pk=instance_id)
    if not claimed:
        return instance
    request = RentRequest(offer_id=instance.offer_id, image=instance.image, disk_gb=instance.disk_gb,
                          label=instance.label, env={**(env or {}), "FLEET_INSTANCE": instance.label},
                          onstart=onstart, bid_usd_per_hour=instance.bid_usd_per_hour,
                          volume=volumes.rent_mount(instance.volume))
    try:
        with get_provider(instance.provider) as provider:
            provider_id = provider.rent(request)
    except OutcomeUnknown as exc:
        # The grace for its machine to be listed counts from this answer, however long the call took.
        Instance.objects.filter(pk=instance_id, state=State.REQUESTED, provider_instance_id=None).update(
            rent_attempted_at=timezone.now())
        record_event(instance, "rent-unknown", f"{exc} The next sync looks for label {instance.label}.", now)
        return Instance.objects.get(pk=instance_id)
    except ProviderError as exc:
        reason = f"Rent failed, nothing was rented: {without_secrets(str(exc), request.env)}"
        if isinstance(exc, OfferUnavailable):
            _offer_taken(instance, reason, now)
        else:
            _fail_refused_rent(instance, reason, now)
        return Instance.objects.get(pk=instance_id)
    _attach(instance, provider_id, now, how=f"rented as {instance.provider} instance {provider_id}")
    return Instance.objects.get(pk=instance_id)


def without_secrets(message: str, env: dict[str, str]) -> str:
    """A provider's error with every environment value the box was to get blanked out: a marketplace may echo the
    request it refused ("invalid args: {...}"), and the environment holds the run's agent token and presigned URLs,
    which must reach no row, alert or webhook."""
    forms = set()
    for value in (str(v) for v in env.values()):
        if len(value) >= 8:  # as sent, as JSON quotes it (a GraphQL error's "got invalid value"), as Python's repr
            forms |= {value, json.dumps(value)[1:-1], repr(value)[1:-1]}
    for form in sorted(forms, key=len, reverse=True):
        message = message.replace(form, "[redacted]")
    for form in forms:  # a message cut short (to its column, by the client) may end inside a value
        for cut in range(len(form) - 1, 11, -1):
            if message.endswith(form[:cut]):
                message = message[:-cut] + "[redacted]"
                break
    return message


def _attach(instance: Instance, provider_id: str, now: datetime, *, how: str) -> None:
    """Links a row to the machine the provider made for it and starts billing it, destroying it at once if the row was
    cancelled or failed meanwhile; the attach hooks run in the same transaction."""
    with transaction.atomic():
        Instance.objects.filter(pk=instance.pk).update(provider_instance_id=provider_id)
        Instance.objects.filter(pk=instance.pk, state=State.REQUESTED).update(state=State.PROVISIONING)
        instance.refresh_from_db()  # a person's destroy or a give-up may have landed while the rent call was out
        ledger.bill(instance, instance.usd_per_hour, now)
        record_event(instance, "rented", how, now)
        raise_alert(Alert.Kind.INSTANCE_RENTED, f"{instance.label}: {how} ({instance.num_gpus}x {instance.gpu_name}, "
                    f"${instance.usd_per_hour:.3f}/h)", instance=instance, now=now)
        if instance.state == State.PROVISIONING:
            hooks.attached(instance, now)
    if instance.state in (State.STOPPING, State.FAILED):
        # Cancelled or given up on while the rent was in flight: it must not bill.
        Instance.objects.filter(pk=instance.pk).update(
            state=State.STOPPING, destroy_requested_at=now,
            destroy_reason=instance.destroy_reason or "it appeared after its rent had been cancelled or given up on")
        _send_destroy(instance, now)


# -- failing and destroying --------------------------------------------------------------------------------------------
# One function per path: `request_destroy` (a person's: recorded at once, its call queued), `destroy` (the product's
# own, and the queued call behind a person's or a reaper's claim), `fail` (a failure, then the product's destroy),
# `_cancel_unrented` (nothing was rented), `_finish_destroy` (the sync's, for a destroy unsent or not carried out).
# Each claims the row with a conditional UPDATE and acts only if the count says it won.

CLAIMABLE = (State.REQUESTED, State.PROVISIONING, State.RUNNING)  # live, and no destroy asked for yet
ENDED = (State.DESTROYED, State.FAILED)


def fail(instance: Instance, reason: str, *, now: datetime | None = None) -> Instance:
    """Every failure of a box ends here: the reason is recorded and alerted once, and the machine is destroyed unless
    a person asked to keep it for debugging and that time has not passed. A rent whose outcome is unknown is torn
    down like a machine, once a sync finds it."""
    now = now or timezone.now()
    _record_failure(instance, reason, now)
    return destroy(instance, reason=reason, now=now)


def _fail_refused_rent(instance: Instance, reason: str, now: datetime) -> None:
    """A rent the provider refused outright: failed with its reason, and no machine to destroy."""
    _record_failure(instance, reason, now)
    _end(instance, State.FAILED, now)


def _offer_taken(instance: Instance, reason: str, now: datetime) -> None:
    """The offer was taken or withdrawn since it was listed: nothing was rented, and it is not ranked again until a
    refresh lists it. A run or a replica rents the next offer by itself: an event, not an alert; a person's own
    rent still alerts."""
    Offer.objects.filter(provider=instance.provider, offer_id=instance.offer_id, is_bid=instance.is_bid).update(
        available=False)
    if instance.requested_by_id is not None or instance.purpose == "manual":
        _fail_refused_rent(instance, reason, now)
        return
    Instance.objects.filter(pk=instance.pk, failure_reason="").update(failure_reason=reason)
    record_event(instance, "offer-taken", f"{reason} The next offer is rented instead.", now)
    _end(instance, State.FAILED, now)


def _record_failure(instance: Instance, reason: str, now: datetime) -> None:
    if Instance.objects.filter(pk=instance.pk, failure_reason="").update(failure_reason=reason):  # said once
        record_event(instance, "failed", reason, now)
        raise_alert(Alert.Kind.INSTANCE_FAILED, f"{instance.label}: {reason}", instance=instance, now=now)


def _rent_settled(instance: Instance, now: datetime) -> bool:
    """Whether a rent that may or may not have happened has had time to show up in the provider's list."""
    if instance.rent_attempted_at is None:
        return True
    return now - instance.rent_attempted_at >= timedelta(seconds=settings.RENT_OUTCOME_GRACE_S)


class KeepRefused(ValueError):
    """The machine can no longer be kept: the provider was already asked to destroy it, or it is gone."""


def keep_for_debugging(instance: Instance, hours: float, *, by=None, now: datetime | None = None,
                       then_destroy: str = "") -> Instance:
    """Keeps the machine until now + hours and returns the row as kept; `then_destroy` is why the box is done with,
    acted on when the keep expires (docs/fleet.md, "Keeps and destroys")."""
    now = now or timezone.now()
    hours = min(float(hours), settings.MAX_KEEP_FOR_DEBUG_HOURS)
    who = by.get_username() if by else "the product"
    with transaction.atomic():
        row = Instance.objects.select_for_update().get(pk=instance.pk)
        if row.state in ENDED or (
                row.state == State.STOPPING and (row.destroy_attempts or row.provider_instance_id is None)):
            raise KeepRefused(f"{row.label} cannot be kept: it is {row.state} (destroy already sent or no machine).")
        row.keep_until = now + timedelta(hours=hours)
        fields = ["keep_until"]
        if then_destroy and not row.failure_reason:
            row.failure_reason = then_destroy
            fields.append("failure_reason")
        if row.state == State.STOPPING:
            record_event(row, "destroy-withdrawn", f"{who} keeps it: the destroy not yet sent ({row.destroy_reason}) "
                                                   "is withdrawn.", now)
            row.state = State.RUNNING if row.running_at else State.PROVISIONING
            row.destroy_requested_at, row.destroy_reason = None, ""
            row.reaped_at, row.reap_reason = None, ""  # judged again, and counted by the spend cap, once kept
            fields += ["state", "destroy_requested_at", "destroy_reason", "reaped_at", "reap_reason"]
        row.save(update_fields=fields)
        record_event(row, "kept", f"{who} keeps it for debugging until {row.keep_until:%Y-%m-%d %H:%M} UTC "
                                  "(destroyed then if it has failed)", now)
    return row


def request_destroy(instance: Instance, *, reason: str, by=None, now: datetime | None = None) -> Instance:
    """A person's destroy, recorded (the row stopping, its keep cleared) before its provider call is queued; a row
    nothing was rented for is cancelled here (docs/fleet.md, "Keeps and destroys")."""
    now = now or timezone.now()
    instance.refresh_from_db()  # the page's copy may be minutes old
    if instance.state in ENDED:
        return instance
    if _never_rented(instance) and _cancel_unrented(instance, reason, now):
        return _as_now(instance)
    # A rent may have claimed the row since the read above: then it stops like any other, its machine destroyed on
    # arrival.
    if Instance.objects.filter(pk=instance.pk, state__in=CLAIMABLE).update(
            state=State.STOPPING, destroy_reason=reason, destroy_requested_at=now, keep_until=None):
        who = f" by {by.get_username()}" if by else ""
        record_event(instance, "destroying", f"Destroy requested{who}: {reason}", now)
    return _as_now(instance)


def destroy(instance: Instance, *, reason: str, now: datetime | None = None) -> Instance:
    """The product's destroy (a run done with its box, a replacement, a failure, an expired keep), idempotent: a keep
    for debugging wins. It is also the queued call behind a person's or a reaper's destroy, which move the row to
    stopping themselves: it sends that row's first destroy call."""
    now = now or timezone.now()
    instance.refresh_from_db()  # the caller's copy may be a pass old
    if instance.state in ENDED:
        return instance
    if _kept(instance, now):
        record_event(instance, "kept", f"Not destroyed ({reason}): kept for debugging until "
                                       f"{instance.keep_until:%Y-%m-%d %H:%M} UTC.", now)
        return instance
    if _never_rented(instance) and _cancel_unrented(instance, reason, now):
        return _as_now(instance)
    claimed = Instance.objects.filter(  # a keep that committed since the read above still wins
        Q(keep_until__isnull=True) | Q(keep_until__lte=now), pk=instance.pk, state__in=CLAIMABLE,
    ).update(state=State.STOPPING, destroy_reason=reason, destroy_requested_at=now)
    if claimed:
        record_event(instance, "destroying", f"Destroy requested: {reason}", now)
    if instance.provider_instance_id is None:
        instance.refresh_from_db()  # its rent was in flight: the machine may have been attached since
    if instance.provider_instance_id is not None:
        if claimed:
            _send_destroy(instance, now)
        else:  # already stopping: this may be the call a person's or the reaper's destroy queued
            _send_first_destroy(instance, now)
    return _as_now(instance)


def _kept(instance: Instance, now: datetime) -> bool:
    return instance.keep_until is not None and instance.keep_until > now


def _never_rented(instance: Instance) -> bool:
    return instance.provider_instance_id is None and instance.rent_attempted_at is None


def _cancel_unrented(instance: Instance, reason: str, now: datetime) -> bool:
    """A requested row whose rent was never attempted: failed, with no machine to call about. False where a rent
    claimed it first: the caller stops it as a rented one."""
    if Instance.objects.filter(pk=instance.pk, state=State.REQUESTED, rent_attempted_at=None).update(
            state=State.FAILED, ended_at=now, destroy_reason=reason):
        record_event(instance, "cancelled", f"Cancelled before it was rented: {reason}", now)
        return True
    return False


def _send_destroy(instance: Instance, now: datetime) -> None:
    """Asks the provider to destroy a stopping row's machine: right after its claim, or again (the sync's retry)."""
    _call_destroy(instance, now, Instance.objects.filter(pk=instance.pk, state=State.STOPPING))


def _send_first_destroy(instance: Instance, now: datetime) -> None:
    """The call behind a destroy claimed elsewhere (a person's, the reaper's), unless one was sent already."""
    _call_destroy(instance, now, Instance.objects.filter(pk=instance.pk, state=State.STOPPING, destroy_attempts=0))


def _call_destroy(instance: Instance, now: datetime, attempt) -> None:
    """One provider call, made only if `attempt` (the row, still stopping: a keep may have withdrawn it) claims it."""
    if not attempt.update(destroy_attempts=F("destroy_attempts") + 1, destroy_requested_at=now):
        return
    try:
        with get_provider(instance.provider) as provider:
            existed = provider.destroy(instance.provider_instance_id)
    except ProviderError as exc:
        record_event(instance, "destroy-error", f"Destroy call failed, retried by the next sync: {exc}", now)
        return
    if not existed:
        _end(instance, State.DESTROYED, now, "The provider no longer had it: destroyed.")
    else:
        ledger.stop_billing(instance, now)  # the provider stops charging when it accepts the destroy
        record_event(instance, "destroy-sent", "The provider accepted the destroy; the next sync verifies it.", now)


def _end(instance: Instance, state: str, now: datetime, message: str = "") -> None:
    with transaction.atomic():
        Instance.objects.filter(pk=instance.pk).update(state=state, ended_at=now)
        ledger.stop_billing(instance, now)
        if message:
            record_event(instance, state, message, now)
        if state == State.DESTROYED:
            raise_alert(Alert.Kind.INSTANCE_DESTROYED, f"{instance.label}: {message}", instance=instance, now=now)


def _as_now(instance: Instance) -> Instance:
    """The row as the action left it, read into the caller's copy too."""
    instance.refresh_from_db()
    return instance


# -- sync --------------------------------------------------------------------------------------------------------------


@dataclass
class SyncReport:
    seen: int = 0
    adopted: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    destroy_retried: list[str] = field(default_factory=list)


def sync(provider_name: str = "vast", *, now: datetime | None = None) -> SyncReport:
    """Brings every row in line with what the provider lists, adopting our labelled machines it has and we lack; one
    row's trouble is logged and the others go on."""
    now = now or timezone.now()
    with get_provider(provider_name) as provider:
        records = provider.list_instances()
    report = SyncReport(seen=len(records))
    by_id = {r.instance_id: r for r in records}
    rows = Instance.objects.filter(provider=provider_name, provider_instance_id__isnull=False)
    known = set(rows.values_list("provider_instance_id", flat=True))
    for record in records:
        if record.instance_id not in known and pk_from_label(record.label) is not None:
            _isolated(f"instance {record.instance_id}", _adopt, provider_name, record, now, report)
    for instance in rows.filter(state__in=[State.DESTROYED, State.FAILED], provider_instance_id__in=list(by_id)):
        record = by_id[instance.provider_instance_id]
        if is_listed_again(instance.pk, instance.label, instance.started_at, record):
            _isolated(instance.label, _listed_again, instance, record, now, report)
        else:  # an ended row's history is its own: a later box that came by its id never changes it
            log.warning("sync: %s instance %s (%s) is a later box given the id %s ended with, not its machine: "
                        "left alone, and %s keeps its history", provider_name, record.instance_id,
                        record.label or "no label", instance.label, instance.label)
    for instance in Instance.objects.filter(provider=provider_name, state__in=Instance.LIVE_STATES):
        _isolated(instance.label, _sync_row, provider_name, instance, records, by_id, now, report)
    return report


def _isolated(what: str, step, *args) -> None:
    try:
        step(*args)
    except Exception:  # logged with its traceback; the other rows must still be synced
        log.exception("sync: %s failed for %s; the other rows go on", step.__name__, what)


def _sync_row(provider_name: str, instance: Instance, records: InstanceList, by_id: dict, now: datetime,
              report: SyncReport) -> None:
    record = by_id.get(instance.provider_instance_id) if instance.provider_instance_id else None
    if record is None and instance.provider_instance_id is not None:
        if instance.state != State.STOPPING and instance.last_synced_at is None and not _rent_settled(instance, now):
            return  # rented seconds ago and never listed yet: the provider's list may not show it yet
        # Not in the list: a host lost, a destroy done, or a list cut short or late (an entry it could not read).
        # Only the machine's own lookup says it is gone; a stopping one still there is destroyed as below.
        record = _look_up(provider_name, instance, now)
        if record is _UNKNOWN:
            return
    if record is not None:
        _apply(instance, record, now, report)
    elif instance.provider_instance_id is not None:
        if instance.state == State.STOPPING:
            _end(instance, State.DESTROYED, now, "Destroy verified: the provider no longer lists it.")
            report.destroyed.append(instance.label)
        else:
            _end(instance, State.FAILED, now, "Gone: the provider no longer lists it (host lost or removed).")
            fail(instance, "The provider no longer lists it (host lost or removed).", now=now)
            report.gone.append(instance.label)
    elif instance.rent_attempted_at is not None and _rent_settled(instance, now):
        if records.may_hide(instance.label):
            # Its machine may be the entry the list could not read: taken for never rented, it would bill unseen
            # and its work would rent another box. It waits for a list that reads whole.
            log.error("sync: %s (rent outcome unknown) left as it was: %s listed a machine it could not read, which "
                      "may be this one", instance.label, provider_name)
            return
        _end(instance, State.FAILED, now,
             f"Never rented: no instance labelled {instance.label} appeared within "
             f"{settings.RENT_OUTCOME_GRACE_S} s.")
        report.failed.append(instance.label)


# How far apart two readings of one machine's start may lie (a provider that gives an uptime, not a date).
SAME_START_SLACK = timedelta(minutes=1)


def is_listed_again(row_pk: int, row_label: str, row_started_at: datetime | None, record: InstanceRecord) -> bool:
    """Whether a listing under an ended row's id is that row's own machine, still billing, rather than a later box a
    marketplace gave the same id: one labelled for another of our rows, or one started after the machine the row
    knew and not under its label."""
    if record.label == row_label:
        return True
    if pk_from_label(record.label) not in (None, row_pk):
        return False
    started_later = (row_started_at is not None and record.started_at is not None
                     and record.started_at - row_started_at > SAME_START_SLACK)
    return not started_later


def _listed_again(instance: Instance, record: InstanceRecord, now: datetime, report: SyncReport) -> None:
    """A machine whose row ended (destroyed, or gone from an earlier list) is listed again: it bills, and no rule
    would ever look at its row again. It is destroyed like any other, with an alert."""
    was = instance.state
    if was == State.FAILED and _kept(instance, now):
        # Kept for debugging, and taken for gone on a false answer: a user asked for this box, so it is watched
        # again (billed, and destroyed when its keep expires) rather than destroyed under them.
        if Instance.objects.filter(pk=instance.pk, state=State.FAILED).update(state=State.RUNNING, ended_at=None):
            ledger.bill(instance, instance.usd_per_hour, now)
            until = f"{instance.keep_until:%Y-%m-%d %H:%M} UTC"
            record_event(instance, "listed-again", f"{instance.label} was failed as gone, but {instance.provider} "
                                                   f"lists it again; it is kept until {until} as asked, and watched "
                                                   "again.", now)
        return
    if not Instance.objects.filter(pk=instance.pk, state__in=[State.DESTROYED, State.FAILED]).update(
            state=State.STOPPING, ended_at=None, destroy_requested_at=now,
            destroy_reason=instance.destroy_reason or instance.failure_reason or "listed again after it ended"):
        return
    ledger.bill(instance, instance.usd_per_hour, now)
    message = (f"{instance.label} was {was}, but {instance.provider} lists it again "
               f"({record.status or 'no status'}): it bills, so it is destroyed now.")
    record_event(instance, "listed-again", message, now)
    raise_alert(Alert.Kind.DESTROY_UNCONFIRMED, message, instance=instance, now=now)
    _send_destroy(instance, now)
    report.destroy_retried.append(instance.label)


def say_sync_failing(provider_name: str, exc: Exception, *, now: datetime | None = None) -> None:
    """An alert, at most once an hour per provider, that its machines are not being watched: while its sync fails
    no destroy is verified or retried and no lost host is noticed, and its boxes bill all the same."""
    now = now or timezone.now()
    prefix = f"Syncing {provider_name} failed"
    if Alert.objects.filter(kind=Alert.Kind.PROVIDER_FAILING, message__startswith=prefix,
                            created_at__gte=now - timedelta(hours=1)).exists():
        return
    raise_alert(Alert.Kind.PROVIDER_FAILING, f"{prefix} ({exc}): its machines are not watched until it answers "
                                             "again (the next sync tries every few seconds).", now=now)


_UNKNOWN = object()


def _look_up(provider_name: str, instance: Instance, now: datetime):
    """The provider's record of one machine, None when it has none, or _UNKNOWN when it cannot say."""
    try:
        with get_provider(provider_name) as provider:
            return provider.get_instance(instance.provider_instance_id)
    except InstanceNotFound:
        return None
    except ProviderError as exc:
        log.warning("%s: not in the list and its own lookup failed (%s); left for the next sync", instance.label, exc)
        return _UNKNOWN


def _adopt(provider_name: str, record: InstanceRecord, now: datetime, report: SyncReport) -> None:
    pk = pk_from_label(record.label)
    row = Instance.objects.filter(pk=pk, provider=provider_name, provider_instance_id__isnull=True).first()
    if row is not None:
        _attach(row, record.instance_id, now, how=f"Found on {provider_name} by its label as instance "
                                                  f"{record.instance_id} after the rent call's outcome was lost.")
        report.adopted.append(row.label)
        return
    # A price the provider does not give is not taken as free: the spend cap counts the box at a ceiling until a
    # sync reads its price (the first one read then bills from the start, ledger.reprice_from_start).
    price = record.usd_per_hour
    known_price = price is not None and (price == 0 or _plausible_price(price))
    if price is None or not known_price:
        price = settings.UNKNOWN_PRICE_USD_PER_HOUR
    adopted = Instance.objects.create(
        provider=provider_name, provider_instance_id=record.instance_id, idempotency_key=f"adopted-{provider_name}-"
        f"{record.instance_id}", state=State.PROVISIONING, purpose="adopted", offer_id="",
        num_gpus=min(record.num_gpus or 1, 32767), image="", disk_gb=0, is_bid=record.is_bid,
        usd_per_hour=price, requested_at=now, **_fitted(label=record.label, gpu_name=record.gpu_name))
    ledger.bill(adopted, price, record.started_at or now)
    message = (f"{provider_name} instance {record.instance_id} carries our label {record.label} but no row knew it: "
               "adopted, so it is reaped like any other.")
    if not known_price:
        message += f" Its price is unknown: counted at {per_hour(price)} until the provider gives one."
    record_event(adopted, "adopted", message, now)
    raise_alert(Alert.Kind.INSTANCE_ADOPTED, message, instance=adopted, now=now)
    report.adopted.append(record.label)


def _apply(instance: Instance, record: InstanceRecord, now: datetime, report: SyncReport) -> None:
    status = record.status
    changes = _fitted(provider_status=status, status_msg=record.status_msg[:2000], public_ip=record.public_ip,
                      ssh_host=record.ssh_host)
    changes.update(ports=record.ports, ssh_port=record.ssh_port if _fits_port(record.ssh_port) else None,
                   started_at=record.started_at, last_synced_at=now)
    if record.gpu_util_percent is not None:  # the provider's silence leaves the agent's reading in place
        changes["gpu_util_percent"] = record.gpu_util_percent
    if _plausible_price(record.usd_per_hour):
        changes["usd_per_hour"] = record.usd_per_hour
        if instance.last_synced_at is None:
            ledger.reprice_from_start(instance, _billing_rate(record, record.usd_per_hour))
    Instance.objects.filter(pk=instance.pk).update(**changes)
    if status == "running":
        Instance.objects.filter(pk=instance.pk, state=State.PROVISIONING).update(state=State.RUNNING, running_at=now)
    instance.refresh_from_db()  # with what a person, the reaper or a destroy did meanwhile
    if instance.state == State.STOPPING:
        _finish_destroy(instance, now, report)
        return
    ledger.bill(instance, _billing_rate(record, instance.usd_per_hour), now)
    if instance.failure_reason and instance.keep_until and instance.keep_until <= now:
        destroy(instance, reason=f"keep-for-debugging expired at {instance.keep_until:%Y-%m-%d %H:%M} UTC after: "
                                 f"{instance.failure_reason}", now=now)
        report.destroyed.append(instance.label)
        return
    # An outbid box whose provider names the bid to beat may raise its bid; any other stop is failure_of's to judge.
    outbid = record.outbid and record.min_bid_usd_per_hour is not None
    reason = _answer_outbid(instance, record, now) if outbid else failure_of(record)
    if reason:
        fail(instance, reason, now=now)
        report.failed.append(instance.label)


def _answer_outbid(instance: Instance, record: InstanceRecord, now: datetime) -> str:
    """An outbid box raises its bid within its cap ("": it waits to resume on its machine) or moves: the reason the
    sync fails it with, so that its work rents another box. Either is said as an event."""
    to_beat = record.min_bid_usd_per_hour
    if instance.bid_usd_per_hour is not None and to_beat is not None and instance.bid_usd_per_hour > to_beat:
        return ""  # raised already: the provider starts it again
    disk = max(Decimal(0), instance.usd_per_hour - (instance.bid_usd_per_hour or Decimal(0)))
    answer = bids.answer_outbid(bid=instance.bid_usd_per_hour, bid_to_beat=to_beat,
                                cap=instance.bid_cap_usd_per_hour, disk_usd_per_hour=disk)
    if answer.bid_usd_per_hour is not None:
        try:
            change_bid(instance, answer.bid_usd_per_hour, now=now)
        except ProviderError as exc:
            answer = bids.Rebid(None, f"{answer.message} The provider refused the new bid ({exc}): the work moves.")
        else:
            record_event(instance, "bid-raised", answer.message, now)
            return ""
    record_event(instance, "outbid-moved", answer.message, now)
    return answer.message


def change_bid(instance: Instance, usd_per_hour: Decimal, *, now: datetime | None = None) -> Instance:
    """Sets an interruptible box's bid for its machine at the provider, and its price here (the bid and the disk)."""
    now = now or timezone.now()
    disk = max(Decimal(0), instance.usd_per_hour - (instance.bid_usd_per_hour or Decimal(0)))
    with get_provider(instance.provider) as provider:
        if not hasattr(provider, "change_bid"):
            raise RequestRefused(f"{instance.provider} has no bid to change here")
        provider.change_bid(instance.provider_instance_id, usd_per_hour)
    Instance.objects.filter(pk=instance.pk).update(bid_usd_per_hour=usd_per_hour, usd_per_hour=usd_per_hour + disk)
    instance.refresh_from_db()
    return instance


def reboot(instance: Instance, *, reason: str, now: datetime | None = None) -> Instance:
    """Restarts the box's container on the same machine (it keeps its GPUs), recorded as an event."""
    now = now or timezone.now()
    with get_provider(instance.provider) as provider:
        if not hasattr(provider, "reboot"):
            raise RequestRefused(f"{instance.provider} boxes are not rebooted from here")
        provider.reboot(instance.provider_instance_id)
    record_event(instance, "rebooted", f"Rebooted on the same machine: {reason}", now)
    return instance


def _finish_destroy(instance: Instance, now: datetime, report: SyncReport) -> None:
    """A stopping row still listed DESTROY_VERIFY_S after its destroy was asked for: the call is sent, whether it was
    never sent (its queued task lost) or the provider did not carry it out."""
    if not instance.destroy_requested_at or now - instance.destroy_requested_at < timedelta(
            seconds=settings.DESTROY_VERIFY_S):
        return
    waited_s = int((now - instance.destroy_requested_at).total_seconds())
    if instance.destroy_attempts == 0:  # e.g. a reaper's hand-over lost to a broker outage
        record_event(instance, "destroy-unsent", f"No destroy was sent {waited_s} s after it was asked for "
                                                 "(its task was lost): destroying now.", now)
    else:
        message = (f"{instance.label} is still listed {waited_s} s after destroy attempt "
                   f"{instance.destroy_attempts}: destroying again.")
        record_event(instance, "destroy-unconfirmed", message, now)
        raise_alert(Alert.Kind.DESTROY_UNCONFIRMED, message, instance=instance, now=now)
    # Still there, so it billed all along: count it from the failed attempt on.
    ledger.bill(instance, instance.usd_per_hour, instance.destroy_requested_at)
    _send_destroy(instance, now)
    report.destroy_retried.append(instance.label)


# A machine's hourly price beyond this is a misread, not a price (the column holds under a million).
MAX_USD_PER_HOUR = Decimal(10_000)


def _billing_rate(record: InstanceRecord, usd_per_hour: Decimal) -> Decimal:
    """What the machine bills per hour in the state the provider lists it in: less than its price where the
    provider says so (vast.ai: storage only while the image pulls and while stopped), else its price."""
    rate = record.billing_usd_per_hour
    return rate if rate is not None and 0 <= rate <= usd_per_hour else usd_per_hour


def _plausible_price(usd_per_hour: Decimal | None) -> TypeGuard[Decimal]:
    return usd_per_hour is not None and 0 < usd_per_hour <= MAX_USD_PER_HOUR


def _fits_port(port) -> bool:
    return port is None or 0 < port < 65536


def _fitted(**texts: str) -> dict:
    """Text fields of a provider's record cut to what their columns hold: a host's 300-character status must not
    stop the update (PostgreSQL refuses it whole; SQLite would have kept it)."""
    return {name: (value or "")[:Instance._meta.get_field(name).max_length or None] for name, value in texts.items()}


def failure_of(record: InstanceRecord) -> str:
    """Why a machine the provider lists is of no use, or "" if it is fine (a pure decision over the record)."""
    if record.failed_to_start:
        return f"Failed to start: {record.status_msg}"
    if "error 803" in record.status_msg.lower() or "cuda error" in record.status_msg.lower():
        return f"CUDA failed to initialise (the host's driver is too old for the image): {record.status_msg}"
    if record.status in DEAD_STATUSES and record.intended_status == "running":
        return f"The host {record.status} on its own: {record.status_msg or 'no message'}"
    return ""


# -- moving work to a new box ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rented:
    instance: Instance
    created: bool  # False: the key's row was there already (a retried task); it was rented at most once all the same


def request_best(recipe: Workload, filters: OfferFilters, *, idempotency_key: str, purpose: str,
                 image: str | None = None, disk_gb: int | None = None, avoid_machines=frozenset(),
                 avoid_offers=frozenset(), on_requested=None, volume: dict | None = None,
                 now: datetime | None = None) -> Rented | None:
    """Records a rent of the best-ranked stored offer for the recipe and filters (or returns None);
    `on_requested(instance)` runs in the recording transaction, before `rent` calls the provider. With a `volume`
    (fleet.volumes.pinned) only offers that can mount it are taken, and the box mounts it."""
    now = now or timezone.now()
    ranked = [entry.offer for entry in rank_stored_offers(recipe, filters).entries
              if volume is None or volumes.mounts(entry.offer, volume)]
    best = best_offer(ranked, avoid_machines, avoid_offers)
    if best is None:
        return None
    offer = Offer.objects.get(provider=best.provider, offer_id=best.offer_id, is_bid=best.is_bid)
    with transaction.atomic():
        instance, created = request_rent(offer=offer, idempotency_key=idempotency_key, image=image, disk_gb=disk_gb,
                                         purpose=purpose, bid_cap_usd_per_hour=filters.max_usd_per_hour,
                                         volume=volume, now=now)
        if created and on_requested is not None:
            on_requested(instance)
    return Rented(instance, created)


def rent_best(recipe: Workload, filters: OfferFilters, *, env=None, onstart: str = "", now: datetime | None = None,
              **request) -> Rented | None:
    """`request_best`, then the rent: the one way the product rents for its own work (a replacement, a run's box, an
    inference replica); None when no offer passes. `env` is what the box gets in its environment, or a function of
    the row that makes it (a token bound to the attempt)."""
    now = now or timezone.now()
    requested = request_best(recipe, filters, now=now, **request)
    if requested is None:
        return None
    instance = requested.instance
    box_env = env(instance) if callable(env) else env
    return Rented(rent(instance.pk, now=now, env=box_env, onstart=onstart), requested.created)


def rent_waiting(*, now: datetime | None = None) -> list[str]:
    """Requested rows whose rent no worker ever attempted (its task lost to a broker outage, its worker dead before
    the call): each is rented or given up on with the reason, once, since `rent` and the give-up both claim the
    untouched row. Returns what it did, a line per row."""
    now = now or timezone.now()
    grace = timedelta(seconds=settings.RENT_QUEUE_GRACE_S)
    max_wait = timedelta(seconds=settings.RENT_QUEUE_MAX_WAIT_S)
    done = []
    for instance in Instance.objects.filter(state=State.REQUESTED, rent_attempted_at=None,
                                            requested_at__lte=now - grace).order_by("requested_at"):
        verdict, reason = waiting.verdict(purpose=instance.purpose, waited=now - instance.requested_at, grace=grace,
                                          max_wait=max_wait)
        if verdict == waiting.RENT:
            record_event(instance, "rent-resumed", reason, now)
            done.append(f"{instance.label}: {rent(instance.pk, now=now).state}")
        elif verdict == waiting.GIVE_UP and _give_up_unrented(instance, reason, now):
            done.append(f"{instance.label}: given up")
    return done


def _give_up_unrented(instance: Instance, reason: str, now: datetime) -> bool:
    if not Instance.objects.filter(pk=instance.pk, state=State.REQUESTED, rent_attempted_at=None).update(
            state=State.FAILED, ended_at=now, failure_reason=reason, destroy_reason=reason):
        return False  # a rent claimed it first
    record_event(instance, "failed", reason, now)
    raise_alert(Alert.Kind.INSTANCE_FAILED, f"{instance.label}: {reason}", instance=instance, now=now)
    return True


def replace(instance: Instance, *, reason: str, now: datetime | None = None) -> Instance | None:
    """Destroys a box that cannot go on and rents the best-ranked offer on another host for the same work; the new
    row points back at the old one. Retried, it rents once (the key names the replaced row)."""
    now = now or timezone.now()
    if hooks.moved(instance, reason, now):  # the work moves itself (a run rents its own next box)
        return None
    destroy(instance, reason=reason, now=now)
    profile = instance.serving_model.profile if instance.serving_model_id else None

    def moved(new: Instance) -> None:
        Instance.objects.filter(pk=new.pk).update(replaces=instance, serving_model=instance.serving_model)
        record_event(instance, "replaced", f"Work moves to {new.label} (offer {new.offer_id}, "
                                           f"{new.num_gpus}x {new.gpu_name}): {reason}", now)

    rented = rent_best(*rent_settings(profile, instance.image), idempotency_key=f"replace-{instance.pk}",
                       purpose=instance.purpose, image=instance.image, disk_gb=instance.disk_gb or None,
                       avoid_machines={instance.machine_id} - {""}, on_requested=moved, now=now)
    if rented is None:
        message = f"{instance.label} could not be replaced: no offer passes the filters ({reason})."
        record_event(instance, "replace-failed", message, now)
        raise_alert(Alert.Kind.INSTANCE_FAILED, message, instance=instance, now=now)
        return None
    return rented.instance
