"""The supervisor carries runs through their states on the simulated marketplace; the test plays the box's agent
through the agent API, as a rented box would."""

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from fleet import actions
from fleet.models import Alert, Instance, ThroughputCalibration
from fleet.offers.refresh import refresh_offers
from runs import supervisor, tokens
from tests.runs.conftest import stored_checkpoint

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"
State = Instance.State


class Agent:
    """What the on-box agent sends, with the token the box received in its environment."""

    def __init__(self, market, run):
        env = next(i["env"] for i in market.state()["instances"] if i["label"] == run.current_instance.label)
        assert env["FLEET_RUN_ID"] == str(run.pk)
        assert env["FLEET_MODEL_TYPE"] == run.recipe["model"]["config"]["model_type"]  # what the probe checks for
        self.token = env["FLEET_AGENT_TOKEN"]
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {self.token}")

    def post(self, path, body):
        response = self.client.post(API + path, json.dumps(body), content_type="application/json")
        assert response.status_code == 200, response.content
        return response.json()

    def starts_training(self):
        self.post("/heartbeat", {"state": "installing"})
        self.post("/events", {"kind": "probe_ok", "message": "MOE-FLEET-PROBE-OK"})
        self.post("/heartbeat", {"state": "training", "process_alive": True, "gpu_ok": True, "gpu_util_percent": 90})

    def stores_final_adapters(self, run):
        for phase in run.phases.all():
            self.post("/checkpoints", stored_checkpoint(run, phase.index, phase.steps))

    def steps(self, *steps, step_s=2.0, kernel_path="triton"):
        self.post("/metrics", {"points": [{"phase": 0, "step": s, "loss": 2.0, "step_s": step_s,
                                           "kernel_path": kernel_path} for s in steps]})


@pytest.fixture
def offers(frozen_market):
    refresh_offers()


def _supervise(run, now=None):
    supervisor.supervise(now=now or timezone.now())
    run.refresh_from_db()
    return run


def test_it_rents_the_best_box_and_follows_the_agent_into_training(launched, frozen_market, offers):
    run = _supervise(launched())
    box = run.current_instance
    assert run.state == "provisioning" and box.purpose == "training" and box.provider_instance_id
    agent = Agent(frozen_market, run)
    assert tokens.attempt_for(agent.token).instance == box  # the box's token opens its own attempt
    agent.post("/heartbeat", {"state": "installing"})
    run.refresh_from_db()
    assert run.state == "installing"
    agent.starts_training()
    agent.steps(1, 2)
    run.refresh_from_db()
    assert run.state == "training" and run.current_step == 2
    assert list(run.events.order_by("at", "id").values_list("kind", flat=True))[:4] == [
        "launched", "rented", "agent_started", "probe_ok"]


def test_it_resumes_on_a_new_host_when_the_heartbeats_stop(launched, frozen_market, offers, settings):
    run = _supervise(launched())
    first = run.current_instance
    Agent(frozen_market, run).starts_training()
    later = timezone.now() + timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S + 1)
    run = _supervise(run, later)
    second = run.current_instance
    assert run.state == "provisioning" and run.restarts == 1
    assert second.pk != first.pk and second.machine_id != first.machine_id
    assert first.machine_id in run.bad_machines
    first.refresh_from_db()
    assert first.state == State.STOPPING and "No heartbeat" in first.destroy_reason
    assert run.events.filter(kind="host_lost").count() == 1
    assert [a.instance_id for a in run.attempts.all()] == [first.pk, second.pk]


def test_it_moves_to_another_host_when_the_install_probe_fails(launched, frozen_market, offers):
    run = _supervise(launched())
    first = run.current_instance
    agent = Agent(frozen_market, run)
    agent.post("/heartbeat", {"state": "installing"})
    agent.post("/events", {"kind": "probe_failed", "message": "No module named 'peft' (no sentinel)"})
    run = _supervise(run)
    first.refresh_from_db()
    assert first.state == State.STOPPING and run.current_instance.machine_id != first.machine_id
    assert run.state == "provisioning" and run.restarts == 1


def test_it_destroys_the_box_alerts_and_calibrates_when_the_run_finishes(launched, frozen_market, offers):
    run = _supervise(launched())
    box = run.current_instance
    agent = Agent(frozen_market, run)
    agent.starts_training()
    agent.steps(*range(1, 5), step_s=1.5)
    agent.stores_final_adapters(run)
    agent.post("/events", {"kind": "finished", "message": "all 5 phases done"})
    run = _supervise(run)
    box.refresh_from_db()
    assert run.state == "finished" and run.current_instance is None
    assert box.state == State.STOPPING
    assert Alert.objects.filter(kind=Alert.Kind.RUN_FINISHED).count() == 1
    # The tiny example measures nothing the ranking prices (tests/fleet/test_calibration_sources.py): the run says
    # so and the table is left alone.
    assert not ThroughputCalibration.objects.exists()
    assert run.events.get(kind="calibration").message.startswith("Not recorded in the calibration table: ")
    _supervise(run)
    assert Alert.objects.filter(kind=Alert.Kind.RUN_FINISHED).count() == 1  # once


def test_it_fails_and_tears_down_after_its_restarts(launched, frozen_market, offers, settings):
    run = _supervise(launched(max_restarts=0))
    box = run.current_instance
    Agent(frozen_market, run).starts_training()
    run = _supervise(run, timezone.now() + timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S + 1))
    assert run.state == "failed" and "1 restarts > the maximum 0" in run.state_reason
    assert not Instance.objects.filter(state__in=[State.PROVISIONING, State.RUNNING]).exists()
    box.refresh_from_db()
    assert box.state == State.STOPPING
    assert Alert.objects.filter(kind=Alert.Kind.RUN_FAILED).exists()


def test_it_stops_at_its_budget(launched, frozen_market, offers):
    run = _supervise(launched(budget=Decimal("0.50")))
    box = run.current_instance
    run = _supervise(run, timezone.now() + timedelta(hours=2))
    assert run.state == "failed" and "budget" in run.state_reason
    box.refresh_from_db()
    assert box.state == State.STOPPING


def test_it_tears_down_a_cancelled_run(launched, frozen_market, offers, client, staff):
    from django.contrib.auth.models import Permission

    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    run = _supervise(launched())
    box = run.current_instance
    client.force_login(staff)
    client.post(f"/runs/{run.pk}/cancel/")
    run = _supervise(run)
    box.refresh_from_db()
    assert run.state == "cancelled" and box.state == State.STOPPING


def test_it_takes_over_the_reapers_move_of_its_hung_box(launched, frozen_market, offers):
    run = _supervise(launched())
    box = run.current_instance
    Agent(frozen_market, run).starts_training()
    assert actions.replace(box, reason="GPU not responding for 7 min") is None
    run.refresh_from_db()
    assert run.state == "recovering" and not Instance.objects.filter(replaces=box).exists()
    run = _supervise(run)
    assert run.state == "provisioning" and run.current_instance.pk != box.pk


def test_it_judges_a_hung_box_by_the_reapers_rule(launched, frozen_market, offers, settings):
    settings.AGENT_HEARTBEAT_TIMEOUT_S = 3600  # the box keeps reporting: only the hung rule can fire
    run = _supervise(launched())
    agent = Agent(frozen_market, run)
    agent.starts_training()
    agent.steps(1)
    agent.post("/heartbeat", {"state": "training", "process_alive": True, "gpu_ok": True, "gpu_util_percent": 0})
    later = timezone.now() + timedelta(minutes=2)
    assert _supervise(run, later).state == "training"  # 2 min idle is within REAPER_NO_PROGRESS_MIN (30)
    settings.REAPER_NO_PROGRESS_MIN = 1
    box = run.current_instance
    run = _supervise(run, later)
    assert run.state == "provisioning" and run.current_instance != box  # left the hung box, rented another
    assert run.events.filter(kind="hung", message__contains="GPU idle 2 min and no step progress").exists()


def test_a_box_that_never_trains_its_first_step_is_hung_though_it_heartbeats(launched, frozen_market, offers,
                                                                            settings):
    # A trainer stuck before its first step (loading, NCCL's start): the agent's heartbeats keep coming.
    settings.AGENT_HEARTBEAT_TIMEOUT_S = settings.REAPER_GPU_UNRESPONSIVE_MIN = 10**6  # its beats keep coming
    run = _supervise(launched())
    agent = Agent(frozen_market, run)
    agent.starts_training()
    box = run.current_instance
    beat = {"state": "training", "process_alive": True, "gpu_ok": True, "gpu_util_percent": 0}
    agent.post("/heartbeat", beat)
    assert _supervise(run, box.requested_at + timedelta(minutes=119)).state == "training"  # downloads take time
    agent.post("/heartbeat", {**beat, "gpu_util_percent": 97})
    assert _supervise(run, box.requested_at + timedelta(minutes=121)).state == "training"  # a busy GPU: not hung
    agent.post("/heartbeat", beat)
    run = _supervise(run, box.requested_at + timedelta(minutes=121))
    assert run.current_instance != box
    assert run.events.filter(kind="hung", message__contains="no first step 2h01m after it was rented").exists()


def test_it_bootstraps_a_stock_image_with_the_onstart_script(launched, frozen_market, offers, settings):
    settings.WORKER_BOOTSTRAP = "onstart"
    settings.WORKER_STOCK_IMAGE = "pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime"
    settings.TRAINING_PACKAGE = "moe-fleet @ https://example.com/moe_fleet-0.1.0-py3-none-any.whl"
    run = _supervise(launched())
    rented = next(i for i in frozen_market.state()["instances"] if i["label"] == run.current_instance.label)
    assert rented["image_uuid"] == settings.WORKER_STOCK_IMAGE
    assert rented["onstart"].startswith("#!/usr/bin/env bash") and "TRAINING_PROBE_OK" in rented["onstart"]
    assert rented["env"]["TRAINING_PACKAGE"] == settings.TRAINING_PACKAGE and rented["env"]["FLEET_AGENT_TOKEN"]


def test_a_rent_late_in_a_slow_pass_is_not_given_up_on_while_it_is_in_flight(launched, frozen_market, monkeypatch):
    # The first run's rent takes 150 s to answer (slow API, 429s); a sync runs while the second run's rent is in
    # flight. Stamped with the pass's start, the second rent would look 150 s old, "never rented", and the box it
    # made would be destroyed on arrival.
    from fleet.providers.vast import VastClient

    refresh_offers()
    launched(name="a"), launched(name="b")
    start = timezone.now()
    clock = {"now": start}
    monkeypatch.setattr(timezone, "now", lambda: clock["now"])
    real_rent, calls = VastClient.rent, []

    def slow_rent(self, request):
        calls.append(request.label)
        if len(calls) == 1:
            made = real_rent(self, request)
            refresh_offers()  # so that the second run ranks another offer
            clock["now"] = start + timedelta(seconds=150)
            return made
        actions.sync("vast")
        return real_rent(self, request)

    monkeypatch.setattr(VastClient, "rent", slow_rent)
    supervisor.supervise()
    rows = list(Instance.objects.order_by("pk"))
    assert len(rows) == 2 and len(calls) == 2
    assert [row.state for row in rows] == [Instance.State.PROVISIONING] * 2
    assert rows[1].rent_attempted_at == start + timedelta(seconds=150)


def test_a_run_no_offer_fits_fails_with_the_reason_after_waiting_its_time(launched, settings):
    settings.RUN_NO_OFFER_TIMEOUT_H = 24
    run = launched()  # no offers stored: nothing can fit it
    supervisor.supervise(now=run.created_at + timedelta(hours=1))
    run.refresh_from_db()
    assert run.state == "pending" and run.events.filter(kind="waiting").exists()
    supervisor.supervise(now=run.created_at + timedelta(hours=25))
    run.refresh_from_db()
    assert run.state == "failed" and not Instance.objects.exists()
    assert "No offer passed the run's filters for 24 h" in run.events.get(kind="no_offer").message
