"""What a broker outage or a provider outage leaves behind, on PostgreSQL and the simulated marketplace: no reaped box
bills outside the rules, no rent asked for is lost or rented twice, and one provider down does not stop the others."""

import re
from datetime import timedelta

import pytest
from celery import Celery
from django.conf import settings as django_settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from fleet import actions, enqueue, tasks
from fleet.instances import waiting
from fleet.models import Alert, Instance, Offer
from fleet.offers.refresh import refresh_offers
from fleet.providers.records import RentRequest
from fleet.providers.registry import get_provider
from fleet.reaper import sweep
from tests.waiting import wait_until


State = Instance.State


def _unreachable_broker() -> Celery:
    """A Celery app whose broker refuses connections, sending as the product's app does."""
    app = Celery("unreachable", broker="redis://127.0.0.1:1/0", set_as_current=False)  # the suite keeps its own
    app.conf.task_publish_retry_policy = django_settings.CELERY_TASK_PUBLISH_RETRY_POLICY
    return app


def _offer() -> Offer:
    return Offer.objects.filter(available=True, is_bid=False, cuda_max__gte=12.8, disk_gb__gte=100).order_by(
        "total_usd_per_hour").first()


def _running(offer, key, **fields) -> Instance:
    instance, _ = actions.request_rent(offer=offer, idempotency_key=key, disk_gb=100)
    actions.rent(instance.pk)
    Instance.objects.filter(pk=instance.pk).update(state=State.RUNNING, **fields)
    instance.refresh_from_db()
    return instance


def _listed(label: str) -> list:
    with get_provider() as provider:
        return [i for i in provider.list_instances() if i.label == label]


# -- the reaper's hand-over ------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_destroys_a_reaped_box_whose_hand_over_the_broker_lost(frozen_market, monkeypatch, settings):
    refresh_offers()
    now = timezone.now()
    idle = _running(_offer(), "idle", running_at=now - timedelta(minutes=45))
    monkeypatch.setattr(enqueue, "current_app", _unreachable_broker())
    assert sweep.reap(now=now).acted == [idle.pk]
    idle.refresh_from_db()
    assert idle.state == State.STOPPING and idle.destroy_attempts == 0  # reaped, and no destroy got out
    actions.sync(now=now + timedelta(seconds=settings.DESTROY_VERIFY_S))  # the sync destroys what should be gone
    actions.sync(now=now + timedelta(seconds=settings.DESTROY_VERIFY_S + 15))
    idle.refresh_from_db()
    assert idle.state == State.DESTROYED and _listed(idle.label) == []
    assert not idle.cost_segments.filter(ended_at=None).exists()
    assert idle.events.filter(kind="destroy-unsent").exists()
    assert not Alert.objects.filter(kind=Alert.Kind.DESTROY_UNCONFIRMED).exists()  # nothing failed at the provider


def test_it_hands_over_again_a_reaped_box_that_still_bills(frozen_market, celery_worker):
    refresh_offers()
    now = timezone.now()
    # Reaped by a pass whose hand-over was lost before reaped rows moved to stopping at once.
    stale = _running(_offer(), "stale", running_at=now - timedelta(hours=2), reaped_at=now - timedelta(hours=1),
                     reap_reason="no training or serving process 45 min after start")
    sweep.reap(now=now)
    wait_until(lambda: Instance.objects.get(pk=stale.pk).destroy_attempts == 1, "a second destroy attempt",
               timeout_s=15)
    stale.refresh_from_db()
    assert stale.state == State.STOPPING and stale.destroy_reason.startswith("reaped: no training")
    assert sweep.reap(now=now).handed_over_again == []  # once
    actions.sync(now=now)
    stale.refresh_from_db()
    assert stale.state == State.DESTROYED and _listed(stale.label) == []


# -- a rent asked for while the broker is down -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_keeps_a_rent_asked_for_while_the_broker_is_down_and_rents_it_once(staff, frozen_market, monkeypatch,
                                                                             settings):
    refresh_offers()
    offer = _offer()
    client = Client()
    client.force_login(staff)
    page = client.get(reverse("rent_confirm"), {"provider": "vast", "offer": offer.offer_id, "bid": "0"})
    key = re.search(r'name="idempotency_key" value="([0-9a-f]+)"', page.content.decode()).group(1)
    form = {"provider": "vast", "offer": offer.offer_id, "bid": "0", "idempotency_key": key,
            "image": "ghcr.io/example/worker:cuda12.8", "disk_gb": "100", "quoted_disk_gb": "100"}
    monkeypatch.setattr(enqueue, "current_app", _unreachable_broker())
    first = client.post(reverse("rent_confirm"), form)
    second = client.post(reverse("rent_confirm"), form)  # asked again, with the same key
    assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"]
    shown = client.get(first["Location"]).content.decode()
    assert "the task queue cannot be reached" in shown and "Nothing is lost" in shown
    instance = Instance.objects.get()
    assert instance.state == State.REQUESTED and instance.rent_attempted_at is None
    later = instance.requested_at + timedelta(seconds=settings.RENT_QUEUE_GRACE_S)
    assert actions.rent_waiting(now=later) == [f"{instance.label}: provisioning"]
    assert actions.rent_waiting(now=later) == []
    actions.rent(instance.pk)  # the lost task, delivered after all
    instance.refresh_from_db()
    assert instance.state == State.PROVISIONING and instance.events.filter(kind="rent-resumed").exists()
    assert [i["label"] for i in frozen_market.state()["instances"]] == [instance.label]


@pytest.mark.django_db(transaction=True)
def test_a_destroy_asked_for_while_the_broker_is_down_is_recorded_and_sent_by_the_sync(staff, frozen_market,
                                                                                        monkeypatch, settings):
    refresh_offers()
    box = _running(_offer(), "to-destroy")
    client = Client()
    client.force_login(staff)
    monkeypatch.setattr(enqueue, "current_app", _unreachable_broker())
    response = client.post(reverse("destroy_confirm", args=[box.pk]))
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    assert "the task queue cannot be reached right now, so the next instance sync sends the destroy" in page
    box.refresh_from_db()
    assert box.state == State.STOPPING and box.destroy_attempts == 0  # asked for, and no call got out
    assert box.destroy_reason == "destroyed by staff from the dashboard" and _listed(box.label)
    later = box.destroy_requested_at + timedelta(seconds=settings.DESTROY_VERIFY_S)
    actions.sync(now=later)
    actions.sync(now=later + timedelta(seconds=15))
    box.refresh_from_db()
    assert box.state == State.DESTROYED and _listed(box.label) == []
    assert box.events.filter(kind="destroy-unsent").exists()


@pytest.mark.django_db
def test_a_keep_asked_for_after_a_destroy_still_queued_wins(staff, frozen_market, monkeypatch):
    refresh_offers()
    box = _running(_offer(), "kept-after-all", running_at=timezone.now())
    client = Client()
    client.force_login(staff)
    queued = []
    monkeypatch.setattr(enqueue, "destroy_instance", lambda *args: queued.append(args))  # the task not yet run
    client.post(reverse("destroy_confirm", args=[box.pk]))
    box.refresh_from_db()
    assert box.state == State.STOPPING and len(queued) == 1
    client.post(reverse("keep_for_debugging", args=[box.pk]), {"hours": "2"})
    tasks.destroy_instance(*queued[0])  # the worker runs the destroy queued before the keep
    box.refresh_from_db()
    assert box.state == State.RUNNING and box.keep_until is not None and box.destroy_attempts == 0
    assert _listed(box.label)  # still there to debug
    assert box.events.filter(kind="destroy-withdrawn").exists()


@pytest.mark.django_db
def test_it_gives_up_with_the_reason_on_a_rent_that_waited_too_long(frozen_market, settings):
    refresh_offers()
    manual, _ = actions.request_rent(offer=_offer(), idempotency_key="stale-ask", disk_gb=100)
    training, _ = actions.request_rent(offer=_offer(), idempotency_key="run-box", disk_gb=100, purpose="training")
    now = manual.requested_at + timedelta(seconds=settings.RENT_QUEUE_MAX_WAIT_S + 1)
    Instance.objects.filter(pk=training.pk).update(requested_at=now - timedelta(minutes=10))
    assert actions.rent_waiting(now=now) == [f"{manual.label}: given up"]
    manual.refresh_from_db()
    training.refresh_from_db()
    assert manual.state == State.FAILED and "waited 30 min for a worker" in manual.failure_reason
    assert Alert.objects.filter(kind=Alert.Kind.INSTANCE_FAILED, instance=manual).count() == 1
    assert training.state == State.REQUESTED  # its run resumes it with the box's environment; the sweep waits
    assert frozen_market.state()["instances"] == []
    assert actions.rent_waiting(now=now) == []


def test_it_decides_which_unattempted_rents_to_take_up():
    grace, max_wait = timedelta(seconds=60), timedelta(minutes=30)
    verdict = lambda purpose, waited_s: waiting.verdict(  # noqa: E731
        purpose=purpose, waited=timedelta(seconds=waited_s), grace=grace, max_wait=max_wait)[0]
    assert verdict("manual", 30) == waiting.WAIT  # its task may still be on its way
    assert verdict("manual", 60) == waiting.RENT
    assert verdict("training", 600) == verdict("serving", 600) == waiting.WAIT  # their owners resume them
    assert verdict("manual", 1801) == verdict("training", 1801) == waiting.GIVE_UP


# -- one provider down ------------------------------------------------------------------------------------------------


def _pod(label: str) -> str:
    with get_provider("runpod") as provider:
        return provider.rent(RentRequest(offer_id="NVIDIA H200:SECURE:1", image="ghcr.io/example/worker:cuda12.8",
                                         disk_gb=250, label=label, env={}))


@pytest.mark.django_db
def test_it_syncs_every_provider_while_one_is_down(runpod_market, settings):
    settings.VAST_API_URL, settings.VAST_API_KEY = "http://127.0.0.1:1/api/v0", "some-key"  # refuses connections
    settings.PROVIDER_MAX_RETRIES = 0
    pod = _pod("moe-fleet-4242")
    reports = tasks.sync_instances()
    assert "ProviderUnavailable" in reports["vast"]["error"]
    assert reports["runpod"]["adopted"] == ["moe-fleet-4242"]
    assert Instance.objects.get(provider="runpod").provider_instance_id == pod


@pytest.mark.django_db
def test_a_marketplace_that_retired_its_api_is_alerted_once_an_hour_not_silently_logged(runpod_market, settings):
    settings.VAST_API_KEY = ""
    _pod("moe-fleet-4343")
    runpod_market.retire()
    for _ in range(3):
        reports = tasks.sync_instances()
    assert "EndpointRetired" in reports["runpod"]["error"] and "410 Gone" in reports["runpod"]["error"]
    (alert,) = Alert.objects.filter(kind=Alert.Kind.PROVIDER_FAILING)
    assert alert.message.startswith("Syncing runpod failed") and "Terminate them in RunPod's console" in alert.message


@pytest.mark.django_db
def test_a_sync_tick_skips_a_provider_whose_last_sync_still_runs(runpod_market, settings):
    import psycopg

    settings.VAST_API_KEY = ""
    _pod("moe-fleet-4444")
    db = settings.DATABASES["default"]
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"] or None,
                         dbname=db["NAME"], autocommit=True) as other:  # the slow sync, in another worker
        other.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", ["fleet.sync.runpod"])
        assert tasks.sync_instances()["runpod"] == {"skipped": "its previous sync is still running"}
        assert not Instance.objects.exists()
        other.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", ["fleet.sync.runpod"])
    assert tasks.sync_instances()["runpod"]["adopted"] == ["moe-fleet-4444"]
