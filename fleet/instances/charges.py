"""Reconciling the ledger with what the provider says it charged (vast.ai /charges/, RunPod's per-pod billing)."""

import logging
from collections import defaultdict
from decimal import Decimal

from django.utils import timezone

from fleet.columns import column_of
from fleet.models import Instance
from fleet.providers import fields
from fleet.providers.registry import get_provider

log = logging.getLogger(__name__)

TRAFFIC_KINDS = ("bwu", "bwd")


def reconcile(provider_name: str = "vast", *, now=None) -> int:
    """Stores each instance's traffic charges and the provider's total, and returns how many instances were matched; one
    whose charges could not all be read is left unreconciled for the next pass."""
    now = now or timezone.now()
    with get_provider(provider_name) as provider:
        lines = provider.charges()
    unreadable = lines.unreadable
    totals: dict[str, Decimal] = defaultdict(Decimal)
    traffic: dict[str, Decimal] = defaultdict(Decimal)
    for line in lines:
        totals[line.instance_id] += line.amount_usd
        if line.kind in TRAFFIC_KINDS:
            traffic[line.instance_id] += line.amount_usd
    matched = 0
    for instance in Instance.objects.filter(provider=provider_name,
                                            provider_instance_id__in=list(totals) + list(unreadable)):
        provider_id = instance.provider_instance_id
        values = {"traffic_usd": traffic[provider_id], "provider_charged_usd": totals[provider_id]}
        problem = unreadable.get(provider_id) or _storage_problem(values)
        if problem:
            log.error("%s: %s charges not reconciled, tried again next time: %s", instance.label, provider_name,
                      problem)
            continue
        for name, value in values.items():
            setattr(instance, name, value)
        instance.charges_reconciled_at = now
        instance.save(update_fields=[*values, "charges_reconciled_at"])
        matched += 1
    return matched


def _storage_problem(values: dict[str, Decimal]) -> str | None:
    for name, value in values.items():
        problem = fields.column_problem(value, column_of(Instance._meta.get_field(name)))
        if problem:
            return f"its {name} {problem}"
    return None
