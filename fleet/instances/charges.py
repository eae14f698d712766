"""Reconciling the ledger with what the provider says it charged (vast.ai /charges/)."""

from collections import defaultdict
from decimal import Decimal

from django.utils import timezone

from fleet.models import Instance
from fleet.providers.registry import get_provider

TRAFFIC_KINDS = ("bwu", "bwd")


def reconcile(provider_name: str = "vast", *, now=None) -> int:
    """Stores each instance's traffic charges and the provider's total, so its page can show our ledger against the
    provider's bill. Returns how many instances were matched."""
    now = now or timezone.now()
    with get_provider(provider_name) as provider:
        lines = provider.charges()
    totals: dict[str, Decimal] = defaultdict(Decimal)
    traffic: dict[str, Decimal] = defaultdict(Decimal)
    for line in lines:
        totals[line.instance_id] += line.amount_usd
        if line.kind in TRAFFIC_KINDS:
            traffic[line.instance_id] += line.amount_usd
    matched = 0
    for instance in Instance.objects.filter(provider=provider_name, provider_instance_id__in=list(totals)):
        instance.traffic_usd = traffic[instance.provider_instance_id]
        instance.provider_charged_usd = totals[instance.provider_instance_id]
        instance.charges_reconciled_at = now
        instance.save(update_fields=["traffic_usd", "provider_charged_usd", "charges_reconciled_at"])
        matched += 1
    return matched
