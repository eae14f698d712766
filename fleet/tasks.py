from celery import shared_task
from django.conf import settings

from fleet import actions, charges, offer_ranking, offers
from fleet.providers.errors import ProviderUnavailable, RateLimited

TRANSIENT = (ProviderUnavailable, RateLimited)


def configured_providers() -> list[str]:
    return [name for name, key in (("vast", settings.VAST_API_KEY), ("runpod", settings.RUNPOD_API_KEY)) if key]


@shared_task(
    autoretry_for=TRANSIENT,
    retry_backoff=10,
    retry_backoff_max=120,
    max_retries=3,
    # A refresh that waits longer than its own interval is stale; the next beat tick does it again.
    expires=60,
)
def refresh_offers(provider: str = "vast") -> dict:
    refresh = offers.refresh_offers(provider)
    rank_profiles.delay()
    return {"provider": provider, "offers": refresh.offers_seen, "skipped": refresh.offers_skipped}


@shared_task
def rank_profiles() -> int:
    """Ranks the fresh offers for every saved profile so the dashboard shows each one's best offer."""
    return offer_ranking.refresh_profile_rankings()


@shared_task(acks_late=True)
def rent_instance(instance_id: int) -> str:
    # Safe to run twice: actions.rent claims the row and calls the provider at most once.
    return actions.rent(instance_id).state


@shared_task(acks_late=True)
def destroy_instance(instance_id: int, reason: str, force: bool = False) -> str:
    from fleet.models import Instance

    return actions.destroy(Instance.objects.get(pk=instance_id), reason=reason, force=force).state


@shared_task(autoretry_for=TRANSIENT, retry_backoff=5, max_retries=2, expires=30)
def sync_instances() -> dict:
    reports = {}
    for provider in configured_providers():
        report = actions.sync(provider)
        reports[provider] = {"seen": report.seen, "adopted": report.adopted, "gone": report.gone,
                             "destroyed": report.destroyed, "failed": report.failed}
    return reports


@shared_task(autoretry_for=TRANSIENT, retry_backoff=30, max_retries=2)
def reconcile_charges() -> int:
    return charges.reconcile("vast") if settings.VAST_API_KEY else 0


@shared_task(expires=60)
def reap_instances() -> list[str]:
    from fleet import reaping

    return reaping.reap().lines()


@shared_task(acks_late=True)
def move_instance(instance_id: int, reason: str) -> int | None:
    from fleet.models import Instance

    new = actions.replace(Instance.objects.get(pk=instance_id), reason=reason)
    return new.pk if new else None


@shared_task(acks_late=True)
def deliver_webhook(delivery_id: int) -> str | None:
    # Safe to run twice: alerts.deliver claims the attempt, and only the claimer sends.
    from fleet import alerts

    delivered = alerts.deliver(delivery_id)
    if delivered.retry_in_s is not None:
        deliver_webhook.apply_async((delivery_id,), countdown=delivered.retry_in_s)
    return delivered.state


@shared_task(expires=60)
def retry_webhooks() -> int:
    """Picks up deliveries whose task was lost (broker outage, worker killed mid-send)."""
    from fleet import alerts

    due = alerts.due_deliveries()
    for delivery_id in due:
        deliver_webhook.delay(delivery_id)
    return len(due)


@shared_task(expires=settings.PROBE_SECONDS)
def probe_serving_instances() -> dict:
    # A round that waits past the next tick is stale; one round at a time (an advisory lock), so a late one skips.
    from fleet import probes

    return probes.probe_serving_instances().to_dict()


@shared_task(autoretry_for=TRANSIENT, retry_backoff=10, max_retries=2, expires=settings.INFERENCE_FLEET_SECONDS)
def maintain_inference_fleet() -> dict:
    # Safe to retry or run twice: each replacement's key names its model, slot, day and count, so it rents once.
    from fleet import inference

    return inference.maintain().to_dict()
