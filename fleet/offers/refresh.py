"""Storing what a marketplace lists: upsert the offers a search returned, retire the ones it no longer lists."""

from dataclasses import fields

from django.db import transaction
from django.utils import timezone

from fleet.models import Offer, OfferRefresh
from fleet.providers.registry import get_provider
from fleet.providers.errors import ProviderError
from fleet.providers.records import OfferRecord

_KEY_FIELDS = ("provider", "offer_id", "is_bid")
_REFRESHED_FIELDS = [f.name for f in fields(OfferRecord) if f.name not in _KEY_FIELDS] + ["last_seen_at", "available"]


def store_offers(provider: str, records: list[OfferRecord], now=None) -> int:
    now = now or timezone.now()
    rows = [Offer(**Offer.field_values(r), first_seen_at=now, last_seen_at=now, available=True) for r in records]
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
    return len(rows)


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
    refresh.offers_seen = store_offers(provider_name, list(on_demand) + list(bids), now=refresh.started_at)
    refresh.offers_skipped = len(on_demand.skipped) + len(bids.skipped)
    refresh.finished_at = timezone.now()
    refresh.save(update_fields=["offers_seen", "offers_skipped", "finished_at"])
    return refresh
