"""Storing what a marketplace lists: upsert the offers a search returned, retire the ones it no longer lists, skipping
(with the reason) a record the database cannot hold."""

import functools
import logging
from dataclasses import dataclass, field, fields

from django.db import transaction
from django.utils import timezone

from fleet.columns import column_of
from fleet.models import Offer, OfferRefresh
from fleet.models.offers import PRICE_FLOAT_FIELDS
from fleet.providers import fields as offer_fields
from fleet.providers.errors import ProviderError
from fleet.providers.records import OfferRecord
from fleet.providers.registry import get_provider

log = logging.getLogger(__name__)

_RECORD_FIELDS = [f.name for f in fields(OfferRecord)]
_KEY_FIELDS = ("provider", "offer_id", "is_bid")
_REFRESHED_FIELDS = [name for name in _RECORD_FIELDS if name not in _KEY_FIELDS] + PRICE_FLOAT_FIELDS + [
    "last_seen_at", "available"]


@dataclass
class StoredOffers:
    stored: int = 0
    skipped: list[str] = field(default_factory=list)  # one reason per record not stored, naming the field


@functools.cache
def offer_columns() -> dict[str, offer_fields.Column]:
    """What each Offer column a record fills can hold, read from the model and the database's integer ranges."""
    return {name: column_of(Offer._meta.get_field(name)) for name in _RECORD_FIELDS}


def storage_problem(record: OfferRecord) -> str | None:
    """Why the record cannot be stored, naming the first field that does not fit its column; None if it fits."""
    for name, column in offer_columns().items():
        problem = offer_fields.column_problem(getattr(record, name), column)
        if problem:
            return f"{name} {problem}"
    return None


def _storable(records: list[OfferRecord]) -> tuple[list[OfferRecord], list[str]]:
    """The records that fit their columns, each key once (the first listing wins), and a reason for every other."""
    keep, skipped, seen = [], [], set()
    for record in records:
        name = f"offer {offer_fields.label(record.offer_id)}{' (bid)' if record.is_bid is True else ''}"
        problem = storage_problem(record)
        key = (record.provider, record.offer_id, record.is_bid)
        if problem is None and key in seen:
            problem = "listed twice; the first listing kept"
        if problem:
            skipped.append(f"{name}: {problem}")
            continue
        seen.add(key)
        keep.append(record)
    return keep, skipped


def store_offers(provider: str, records: list[OfferRecord], now=None) -> StoredOffers:
    now = now or timezone.now()
    keep, skipped = _storable(records)
    if skipped:
        log.warning("Not storing %d %s offers: %s", len(skipped), provider, "; ".join(skipped[:5]))
    rows = [Offer(**Offer.field_values(r), first_seen_at=now, last_seen_at=now, available=True) for r in keep]
    with transaction.atomic():
        if rows:
            Offer.objects.bulk_create(
                rows,
                batch_size=500,
                update_conflicts=True,
                unique_fields=_KEY_FIELDS,
                update_fields=_REFRESHED_FIELDS,
            )
        Offer.objects.filter(provider=provider, available=True, last_seen_at__lt=now).update(available=False)
    return StoredOffers(stored=len(rows), skipped=skipped)


def refresh_offers(provider_name: str = "vast") -> OfferRefresh:
    """Fetches the provider's current on-demand and bid offers and stores them; the refresh row says how it went.

    Provider errors are recorded on the row and raised again so that the task's retry policy sees them.
    """
    refresh = OfferRefresh.objects.create(provider=provider_name, started_at=timezone.now())
    try:
        with get_provider(provider_name) as provider:
            on_demand = provider.search_offers()
            bids = provider.search_offers(bid=True)
    except ProviderError as exc:
        refresh.error = str(exc)
        refresh.finished_at = timezone.now()
        refresh.save(update_fields=["error", "finished_at"])
        raise
    stored = store_offers(provider_name, list(on_demand) + list(bids), now=refresh.started_at)
    refresh.offers_seen = stored.stored
    refresh.offers_skipped = len(on_demand.skipped) + len(bids.skipped) + len(stored.skipped)
    refresh.finished_at = timezone.now()
    refresh.save(update_fields=["offers_seen", "offers_skipped", "finished_at"])
    return refresh
