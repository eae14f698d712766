"""The task layer: what Celery workers and beat run. Each task is registered under its name in `fleet.enqueue`,
through which everything else asks for it; tasks call the services, and only Celery calls the tasks."""

from celery import shared_task
from django.conf import settings

from fleet import actions, enqueue
from fleet.alerts import notify
from fleet.inference import probes, replicas
from fleet.instances import charges
from fleet.models import Instance
from fleet.offers import ranked, refresh
from fleet.providers.errors import ProviderUnavailable, RateLimited
from fleet.reaper import sweep

TRANSIENT = (ProviderUnavailable, RateLimited)


def configured_providers() -> list[str]:
    return [name for name, key in (("vast", settings.VAST_API_KEY), ("runpod", settings.RUNPOD_API_KEY)) if key]


@shared_task(
    name=enqueue.REFRESH_OFFERS,
    autoretry_for=TRANSIENT,
    retry_backoff=10,
    retry_backoff_max=120,
    max_retries=3,
    # A refresh that waits longer than its own interval is stale; the next beat tick does it again.
    expires=60,
)
def refresh_offers(provider: str = "vast") -> dict:
    done = refresh.refresh_offers(provider)
    enqueue.rank_profiles()
    return {"provider": provider, "offers": done.offers_seen, "skipped": done.offers_skipped}


@shared_task(name=enqueue.RANK_PROFILES)
def rank_profiles() -> int:
    """Ranks the fresh offers for every saved profile so the dashboard shows each one's best offer."""
    return ranked.refresh_profile_rankings()


@shared_task(name=enqueue.RENT_INSTANCE, acks_late=True)
def rent_instance(instance_id: int) -> str:
    # Safe to run twice: actions.rent claims the row and calls the provider at most once.
    return actions.rent(instance_id).state


@shared_task(name=enqueue.DESTROY_INSTANCE, acks_late=True)
def destroy_instance(instance_id: int, reason: str, force: bool = False) -> str:
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
    return sweep.reap().lines()


@shared_task(name=enqueue.MOVE_INSTANCE, acks_late=True)
def move_instance(instance_id: int, reason: str) -> int | None:
    new = actions.replace(Instance.objects.get(pk=instance_id), reason=reason)
    return new.pk if new else None


@shared_task(name=enqueue.DELIVER_WEBHOOK, acks_late=True)
def deliver_webhook(delivery_id: int) -> str | None:
    # Safe to run twice: notify.deliver claims the attempt, and only the claimer sends.
    delivered = notify.deliver(delivery_id)
    if delivered.retry_in_s is not None:
        enqueue.deliver_webhook(delivery_id, countdown_s=delivered.retry_in_s)
    return delivered.state


@shared_task(expires=60)
def retry_webhooks() -> int:
    """Picks up deliveries whose task was lost (broker outage, worker killed mid-send)."""
    due = notify.due_deliveries()
    for delivery_id in due:
        enqueue.deliver_webhook(delivery_id)
    return len(due)


@shared_task(expires=settings.PROBE_SECONDS)
def probe_serving_instances() -> dict:
    # A round that waits past the next tick is stale; one round at a time (an advisory lock), so a late one skips.
    return probes.probe_serving_instances().to_dict()


@shared_task(name=enqueue.MAINTAIN_INFERENCE_FLEET, autoretry_for=TRANSIENT, retry_backoff=10, max_retries=2,
             expires=settings.INFERENCE_FLEET_SECONDS)
def maintain_inference_fleet() -> dict:
    # Safe to retry or run twice: each replacement's key names its model, slot, day and count, so it rents once.
    return replicas.maintain().to_dict()
