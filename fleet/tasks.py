"""The task layer: what Celery workers and beat run, each task registered under its name in `fleet.enqueue`; only Celery
calls the tasks (docs/fleet.md, "fleet/tasks.py")."""

import logging

from celery import shared_task
from django.conf import settings

from fleet import actions, enqueue, locks
from fleet.alerts import notify
from fleet.inference import probes, replicas
from fleet.instances import charges
from fleet.models import Instance
from fleet.offers import ranked, refresh
from fleet.providers.errors import ProviderUnavailable, RateLimited
from fleet.providers.registry import configured_providers
from fleet.reaper import sweep

log = logging.getLogger(__name__)
TRANSIENT = (ProviderUnavailable, RateLimited)
ONE_OFF = {"acks_late": True, "reject_on_worker_lost": True}


@shared_task(
    name=enqueue.REFRESH_OFFERS,
    autoretry_for=TRANSIENT,
    retry_backoff=10,
    retry_backoff_max=120,
    max_retries=3,
    # A refresh that waits longer than its own interval is stale; the next beat tick does it again.
    expires=60,
    soft_time_limit=120,
    time_limit=150,
)
def refresh_offers(provider: str = "vast") -> dict:
    done = refresh.refresh_offers(provider)
    enqueue.rank_profiles()
    return {"provider": provider, "offers": done.offers_seen, "skipped": done.offers_skipped}


@shared_task(name=enqueue.RANK_PROFILES, soft_time_limit=120, time_limit=150)
def rank_profiles() -> int:
    """Ranks the fresh offers for every saved profile so the dashboard shows each one's best offer."""
    return ranked.refresh_profile_rankings()


@shared_task(name=enqueue.RENT_INSTANCE, soft_time_limit=240, time_limit=300, **ONE_OFF)
def rent_instance(instance_id: int) -> str:
    # Safe to run twice: actions.rent claims the row and calls the provider at most once.
    return actions.rent(instance_id).state


@shared_task(name=enqueue.DESTROY_INSTANCE, soft_time_limit=180, time_limit=210, **ONE_OFF)
def destroy_instance(instance_id: int, reason: str) -> str:
    return actions.destroy(Instance.objects.get(pk=instance_id), reason=reason).state


@shared_task(expires=30, soft_time_limit=240, time_limit=270)
def sync_instances() -> dict:
    """Syncs each provider on its own, skipping one whose last sync still runs (docs/fleet.md, "fleet/tasks.py")."""
    reports: dict[str, dict] = {}
    for provider in configured_providers():
        try:
            with locks.claim(f"fleet.sync.{provider}") as held:
                if not held:
                    reports[provider] = {"skipped": "its previous sync is still running"}
                    continue
                report = actions.sync(provider)
        except Exception as exc:  # said in the result, the log and an alert; the other providers go on
            log.exception("syncing %s instances failed; the next sync tries again", provider)
            reports[provider] = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                actions.say_sync_failing(provider, exc)
            except Exception:  # the alert could not be stored: the next provider is synced all the same
                log.exception("could not record that syncing %s failed", provider)
            continue
        reports[provider] = {"seen": report.seen, "adopted": report.adopted, "gone": report.gone,
                             "destroyed": report.destroyed, "failed": report.failed}
    return reports


@shared_task(expires=60, soft_time_limit=480, time_limit=540)
def rent_waiting_instances() -> list[str]:
    """Rents, or gives up on, requested rows whose rent task was lost (a broker outage, a worker that died)."""
    return actions.rent_waiting()


@shared_task(autoretry_for=TRANSIENT, retry_backoff=30, max_retries=2, soft_time_limit=120, time_limit=150)
def reconcile_charges() -> dict[str, int | str]:
    """Each configured provider's charges against the ledger (vast.ai's charge report, RunPod's pod billing): how many
    instances each matched, or why it could not; one provider's refusal does not hold back the others."""
    results: dict[str, int | str] = {}
    for provider in configured_providers():
        try:
            results[provider] = charges.reconcile(provider)
        except TRANSIENT:
            raise  # the retry runs every provider again: a reconcile is safe to repeat
        except Exception as exc:  # said in the result and the log; the next tick tries again
            log.exception("reconciling %s charges failed", provider)
            results[provider] = f"{type(exc).__name__}: {exc}"
    return results


@shared_task(expires=60, soft_time_limit=60, time_limit=90)
def reap_instances() -> list[str]:
    return sweep.reap().lines()


@shared_task(name=enqueue.MOVE_INSTANCE, soft_time_limit=420, time_limit=480, **ONE_OFF)
def move_instance(instance_id: int, reason: str) -> int | None:
    new = actions.replace(Instance.objects.get(pk=instance_id), reason=reason)
    return new.pk if new else None


@shared_task(name=enqueue.DELIVER_WEBHOOK, soft_time_limit=settings.WEBHOOK_TIMEOUT_S + 30,
             time_limit=settings.WEBHOOK_TIMEOUT_S + 60, **ONE_OFF)
def deliver_webhook(delivery_id: int) -> str | None:
    # Safe to run twice: notify.deliver claims the attempt, and only the claimer sends.
    delivered = notify.deliver(delivery_id)
    if delivered.retry_in_s is not None:
        enqueue.deliver_webhook(delivery_id, countdown_s=delivered.retry_in_s)
    return delivered.state


@shared_task(expires=60, soft_time_limit=60, time_limit=90)
def retry_webhooks() -> int:
    """Picks up deliveries whose task was lost (broker outage, worker killed mid-send)."""
    due = notify.due_deliveries()
    for delivery_id in due:
        enqueue.deliver_webhook(delivery_id)
    return len(due)


@shared_task(expires=settings.PROBE_SECONDS, soft_time_limit=120, time_limit=150)
def probe_serving_instances() -> dict:
    # A round that waits past the next tick is stale; one round at a time (an advisory lock), so a late one skips.
    return probes.probe_serving_instances().to_dict()


@shared_task(name=enqueue.MAINTAIN_INFERENCE_FLEET, autoretry_for=TRANSIENT, retry_backoff=10, max_retries=2,
             expires=settings.INFERENCE_FLEET_SECONDS, soft_time_limit=480, time_limit=540)
def maintain_inference_fleet() -> dict:
    # Safe to retry or run twice: each replacement's key names its model, slot, day and count, so it rents once.
    return replicas.maintain().to_dict()
