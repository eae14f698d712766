"""A serving box's dead-man switch: the box the inference fleet rents on the simulated marketplace runs a watchdog
beside vLLM that checks in with a live dashboard; when the dashboard goes silent for the window, or refuses the box,
the box stops its own machine (its own key, at the marketplace) and its GPU stops billing. A box's token opens its
own check-in only."""

import time
from datetime import timedelta
from unittest import mock

import httpx
import pytest
from django.core import signing
from django.test import Client
from django.test.testcases import LiveServerThread
from django.utils import timezone

from fleet.inference import replicas
from fleet.models import InferenceModel, Instance
from tests.marketplace import boxes_reporting_to

pytestmark = pytest.mark.django_db(transaction=True)
WINDOW_S = 8  # the dead-man window: longer than a box takes to boot here, so its first check-in is in time


class Dashboard:
    """The dashboard served over HTTP in a thread of this process, which a test can silence (nothing listens then)."""

    def __init__(self):
        self.thread = LiveServerThread("127.0.0.1", static_handler=lambda handler: handler)
        self.thread.daemon = True
        self.thread.start()
        self.thread.is_ready.wait(10)
        if self.thread.error:
            raise self.thread.error
        self.url = f"http://127.0.0.1:{self.thread.port}"

    def silence(self):
        self.thread.terminate()


@pytest.fixture
def dashboard():
    served = Dashboard()
    yield served
    served.silence()


@pytest.fixture
def market(tmp_path, settings, dashboard):
    """The simulated marketplace whose serving boxes run their start script as local processes, and the dashboard's
    settings pointed at it: a check-in a second, a dead-man window of WINDOW_S."""
    settings.PROVIDER_MAX_RETRIES, settings.AGENT_DEAD_MAN_WINDOW_S = 2, WINDOW_S
    with boxes_reporting_to(dashboard.url, settings, tmp_path / "boxes", heartbeat_timeout_s=4,
                            loopback_boxes=True) as (sim, _):
        yield sim


def _served(desired=1) -> InferenceModel:
    return InferenceModel.objects.create(name="Qwen/Qwen3-30B-A3B", image="vllm/vllm-openai:v0.11.2", port=8000,
                                         desired_replicas=desired, max_replacements_per_day=3)


def _machine(sim, box: Instance) -> dict:
    return next(i for i in sim.state()["instances"] if str(i["id"]) == box.provider_instance_id)


def _wait_for(what, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.2)
    return what()


def _checking_in(sim, desired=1) -> list[Instance]:
    """The fleet's boxes for a new model, rented, booted, and past a dead-man window while the dashboard answers."""
    replicas.maintain()
    boxes = list(Instance.objects.filter(purpose="serving").order_by("pk"))
    assert len(boxes) == desired and all(box.provider_instance_id for box in boxes)
    assert _wait_for(lambda: all(_machine(sim, b)["actual_status"] == "running" for b in boxes), 15)
    time.sleep(WINDOW_S + 2)  # longer than the window: only check-ins that were answered keep the boxes going
    return boxes


def _gpu_billed(sim, box) -> float:
    return _machine(sim, box)["billing"]["gpu"]


def test_a_serving_box_whose_dashboard_goes_silent_stops_its_own_machine_and_its_gpu_billing(market, dashboard):
    _served()
    [box] = _checking_in(market)
    assert _machine(market, box)["actual_status"] == "running", "the box stopped while its dashboard answered"
    dashboard.silence()
    stopped = _wait_for(lambda: _machine(market, box)["actual_status"] == "stopped", WINDOW_S + 10)
    assert stopped, "the box bills on with its dashboard silent past the window"
    assert _machine(market, box)["status_msg"] == "Instance stopped by user"  # by its own key, not a fault
    billed = _gpu_billed(market, box)
    time.sleep(1.5)
    assert _gpu_billed(market, box) == billed


def test_a_box_the_dashboard_no_longer_wants_is_told_to_stop(market, settings):
    settings.AGENT_DEAD_MAN_WINDOW_S = 600  # the refusal stops it, not the window
    model = _served()
    [box] = _checking_in(market)
    token = _machine(market, box)["env"]["FLEET_CHECKIN_TOKEN"]
    url = _machine(market, box)["env"]["FLEET_CHECKIN_URL"]
    answer = httpx.post(url, json={}, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200 and answer.json()["command"] == "continue" and answer.json()["token"] != token
    model.delete()  # nobody serves it any more; the box is not destroyed yet (a destroy that lags)
    answer = httpx.post(url, json={}, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 403 and "its inference model is gone" in answer.json()["detail"]
    assert _wait_for(lambda: _machine(market, box)["actual_status"] == "stopped", 10), \
        "the box bills on though the dashboard refuses it"


def test_a_box_being_destroyed_is_refused_and_a_kept_one_is_not(market, settings):
    settings.AGENT_DEAD_MAN_WINDOW_S = 600
    _served()
    [box] = _checking_in(market)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {_machine(market, box)['env']['FLEET_CHECKIN_TOKEN']}"}
    url = f"/api/serving/v1/instances/{box.pk}/checkin"
    Instance.objects.filter(pk=box.pk).update(keep_until=timezone.now() + timedelta(hours=5))
    assert Client(**headers).post(url).status_code == 200
    Instance.objects.filter(pk=box.pk).update(keep_until=None, state=Instance.State.STOPPING)
    refused = Client(**headers).post(url)
    assert refused.status_code == 403 and "it is being destroyed" in refused.json()["detail"]


def test_a_token_of_one_serving_box_cannot_check_in_for_another(market, settings):
    settings.AGENT_DEAD_MAN_WINDOW_S = 600
    _served(desired=2)
    first, second = _checking_in(market, desired=2)
    token = _machine(market, first)["env"]["FLEET_CHECKIN_TOKEN"]
    as_first = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert as_first.post(f"/api/serving/v1/instances/{first.pk}/checkin").status_code == 200
    assert as_first.post(f"/api/serving/v1/instances/{second.pk}/checkin").status_code == 401
    forged = "serve_" + signing.TimestampSigner(salt="fleet.serving-checkin.v1", key="not-the-key").sign(
        f"{second.pk}.{second.label}")
    assert Client(HTTP_AUTHORIZATION=f"Bearer {forged}").post(
        f"/api/serving/v1/instances/{second.pk}/checkin").status_code == 401
    with mock.patch("django.core.signing.time.time", return_value=time.time() + 601):  # past the window: expired
        assert as_first.post(f"/api/serving/v1/instances/{first.pk}/checkin").status_code == 401
    # Nor does a box's own key at the marketplace open another box's stop.
    key = _machine(market, first)["container_api_key"]
    stop = httpx.put(f"{market.base_url}/instances/{second.provider_instance_id}/", json={"state": "stopped"},
                     headers={"Authorization": f"Bearer {key}"})
    listing = httpx.get(f"{market.base_url}/instances/", headers={"Authorization": f"Bearer {key}"})
    assert (stop.status_code, listing.status_code) == (401, 401)
    assert _machine(market, second)["actual_status"] == "running"
