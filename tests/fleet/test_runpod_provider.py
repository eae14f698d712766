"""RunPod as a whole provider of the product, against the RunPod stand-in over HTTP with PostgreSQL and Redis: its
offers refreshed on the beat and ranked beside vast.ai's, a pod rented, synced, stopped by its user or by RunPod,
serving on its public port, stopping itself, and reaped."""

import json
import os
import secrets
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from fleet import actions, tasks
from fleet.inference.probes import probe_url
from fleet.instances import ledger
from fleet.models import Instance, Offer
from fleet.offers.ranked import for_worker_image, rank_stored_offers
from fleet.ranking.filters import OfferFilters
from fleet.ranking.workload import Workload
from fleet.reaper import sweep
from tests.waiting import wait_until
from training.agent.self_stop import stop_machine

from .runpod_server import RUNPOD_KEY

ROOT = Path(__file__).resolve().parents[2]
State = Instance.State
H200 = "NVIDIA H200:SECURE:1"


def _beat_schedule(tmp_path, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "RUNPOD_API_KEY")}
    clean.update(DATA_DIR=str(tmp_path), SECRET_KEY=secrets.token_urlsafe(50), **env)
    code = ("import django, json, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings'; django.setup(); "
            "from django.conf import settings; print(json.dumps(settings.CELERY_BEAT_SCHEDULE))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_runpod_key_puts_runpods_offer_refresh_on_the_beat_beside_vasts(tmp_path):
    with_key = _beat_schedule(tmp_path, RUNPOD_API_KEY="rp-key")
    assert with_key["refresh-offers-runpod"]["task"] == with_key["refresh-offers"]["task"] == \
        "fleet.tasks.refresh_offers"
    assert with_key["refresh-offers-runpod"]["args"] == ["runpod"]
    assert with_key["refresh-offers-runpod"]["schedule"] == with_key["refresh-offers"]["schedule"]
    assert "refresh-offers-runpod" not in _beat_schedule(tmp_path)


@pytest.mark.django_db
def test_runpods_offers_are_ranked_beside_vasts(market, runpod_market):
    assert tasks.refresh_offers("vast")["provider"] == "vast"
    assert tasks.refresh_offers("runpod")["offers"] > 0
    ranking = rank_stored_offers(Workload(), for_worker_image(OfferFilters(max_usd_per_hour=None)))
    providers = [entry.offer.provider for entry in ranking.entries]
    assert {"vast", "runpod"} <= set(providers)
    # With the default price cap RunPod's H200 is left out for its price alone, nothing it does not say.
    capped = rank_stored_offers(Workload(), for_worker_image(OfferFilters()))
    h200 = capped.find(H200, provider="runpod", is_bid=False)
    # $3.99 for the machine and its 250 GB of disk at $0.10/GB-month: the rental's price, as for vast.ai's offers
    assert h200.reasons == ("$4.025/h > cap $1.30/h",)


def _rented_pod(runpod_market, key: str, purpose: str = "training") -> Instance:
    tasks.refresh_offers("runpod")
    offer = Offer.objects.get(provider="runpod", offer_id=H200, is_bid=False)
    instance, _ = actions.request_rent(offer=offer, idempotency_key=key, disk_gb=100, purpose=purpose)
    instance = actions.rent(instance.pk)
    assert instance.provider_instance_id in runpod_market.pods
    return instance


@pytest.mark.django_db
def test_a_pod_is_rented_synced_running_and_serving_on_its_public_port(runpod_market, settings):
    settings.VAST_API_KEY = ""
    instance = _rented_pod(runpod_market, "rp-serve", purpose="serving")
    assert tasks.sync_instances()["runpod"]["failed"] == []
    assert Instance.objects.get(pk=instance.pk).state == State.PROVISIONING
    runpod_market.advance()
    tasks.sync_instances()
    instance.refresh_from_db()
    pod = runpod_market.pods[instance.provider_instance_id]
    assert instance.state == State.RUNNING and instance.provider_status == "running"
    assert instance.ports["8000/tcp"] == pod.public_ports[(8000, "tcp")] and instance.ssh_port
    url, why = probe_url(instance.public_ip, instance.ports, 8000, allow_private=True)
    assert (url, why) == (f"http://{pod.public_ip}:{pod.public_ports[(8000, 'tcp')]}/v1/models", "")


@pytest.mark.django_db
def test_a_pod_its_user_stopped_reads_as_stopped_and_one_runpod_stopped_as_failed(runpod_market, settings):
    settings.VAST_API_KEY = ""
    stopped, dropped = _rented_pod(runpod_market, "rp-stop"), _rented_pod(runpod_market, "rp-drop")
    runpod_market.advance()
    tasks.sync_instances()
    runpod_market.stop_pod(stopped.provider_instance_id)  # the user, from RunPod's console or SDK
    runpod_market.set_pod(dropped.provider_instance_id, desired_status="EXITED", running=False,
                          last_status_change="Exited by Runpod: host down")
    report = tasks.sync_instances()["runpod"]
    assert report["failed"] == [dropped.label]
    stopped.refresh_from_db()
    dropped.refresh_from_db()
    assert (stopped.state, stopped.provider_status, stopped.failure_reason) == (State.RUNNING, "exited", "")
    # Stopped without a volume, it bills nothing until it runs again (RunPod bills a stopped pod's volume only).
    assert ledger.billing_rates([stopped])[stopped.pk] == 0
    assert stopped.status_msg.startswith("Exited by User")
    # RunPod stopped it unasked: failed, with why, and on its way out.
    assert dropped.state in (State.STOPPING, State.FAILED) and "exited on its own" in dropped.failure_reason


@pytest.mark.django_db
def test_a_box_that_stops_its_own_pod_is_not_taken_for_a_failure(runpod_market, settings, monkeypatch):
    settings.VAST_API_KEY = ""
    instance = _rented_pod(runpod_market, "rp-self-stop")
    runpod_market.advance()
    tasks.sync_instances()
    for name in ("FLEET_SELF_STOP", "CONTAINER_ID", "CONTAINER_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RUNPOD_POD_ID", instance.provider_instance_id)  # what RunPod gives every pod
    monkeypatch.setenv("RUNPOD_API_KEY", RUNPOD_KEY)
    monkeypatch.setenv("FLEET_RUNPOD_API_URL", runpod_market.base_url)
    stop_machine()
    assert tasks.sync_instances()["runpod"]["failed"] == []
    instance.refresh_from_db()
    assert (instance.state, instance.provider_status) == (State.RUNNING, "exited")


def test_the_reaper_terminates_a_pod_past_its_age(runpod_market, celery_worker, settings):
    settings.VAST_API_KEY = ""
    instance = _rented_pod(runpod_market, "rp-old")
    runpod_market.advance()
    tasks.sync_instances()
    Instance.objects.filter(pk=instance.pk).update(running_at=timezone.now() - timedelta(hours=13),
                                                   last_process_at=timezone.now())
    assert sweep.reap().lines() == [f"destroy {instance.label}: age 13h00m > max 12h"]
    wait_until(lambda: runpod_market.count("podTerminate") == 1, "the pod's terminate")
    assert instance.provider_instance_id not in runpod_market.pods
    tasks.sync_instances()
    assert Instance.objects.get(pk=instance.pk).state == State.DESTROYED
