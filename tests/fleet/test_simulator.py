"""The simulated vast.ai marketplace, over real HTTP, as a vast.ai client sees it."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fleet.simulator import InstanceHooks, Market, SimulatedMarketplace
from fleet.simulator.market import Settings

KEY = "test-key"
IMAGE = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sim():
    # speed 0: only advance() moves the clock, so every charge below is exact.
    with SimulatedMarketplace(api_key=KEY, seed=7, speed=0, boot_delay_s=90, charges_min_interval_s=0) as sim:
        yield sim


@pytest.fixture
def api(sim):
    with httpx.Client(base_url=sim.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=5) as client:
        yield client


@pytest.fixture
def control(sim):
    with httpx.Client(base_url=sim.control_url, timeout=5) as client:
        yield client


def v1(api, **params):
    """The instance list where vast.ai keeps it now, /api/v1/instances/ (the v0 list answers 410)."""
    origin = str(api.base_url).rstrip("/").removesuffix("/api/v0")
    return api.get(f"{origin}/api/v1/instances/", params={"limit": 25, **params})


def search(api, **query):
    response = api.post("/bundles/", json={"limit": 1000, **query})
    assert response.status_code == 200, response.text
    return response.json()["offers"]


def healthy_offer(api, sim, **filters):
    """The cheapest offer matching the filters whose host has no hidden death date and runs CUDA 12.8 images."""
    doomed = {o["id"] for o in sim.offers() if o["dies_after_s"]}
    query = {"cuda_max_good": {"gte": 12.8}, "disk_space": {"gte": 100}, "order": [["dph_total", "asc"]], **filters}
    offers = search(api, **query)
    return next(o for o in offers if o["id"] not in doomed)


def rent(api, offer_id, **body):
    return api.put(f"/asks/{offer_id}/", json={"client_id": "me", "image": IMAGE, "disk": 100, "label": "t", **body})


def rented(api, offer_id, **body):
    response = rent(api, offer_id, **body)
    assert response.status_code == 200, response.text
    assert response.json()["success"] is True
    return response.json()["new_contract"]


def instance(api, instance_id):
    response = api.get(f"/instances/{instance_id}/")
    assert response.status_code == 200, response.text
    return response.json()["instances"]


def charge_report(api, **filters):
    """vast.ai's charge report over the last day and the next: a result per instance, its lines as items."""
    now = time.time()
    day = {"day": {"gte": int(now - 86400), "lte": int(now + 86400)}}
    return api.get("/charges/", params={"select_filters": json.dumps({**day, **filters}), "limit": 100})


def quantities(sim, instance_id):
    """Hours, GB-hours and GB billed, as the simulation keeps them (the report gives them in words)."""
    return {line["type"]: line["quantity"] for line in sim.market.charges() if line["instance_id"] == instance_id}


def charges_of(api, instance_id):
    response = charge_report(api)
    assert response.status_code == 200, response.text
    (result,) = [r for r in response.json()["results"] if r["source"] == f"instance-{instance_id}"]
    return {item["type"]: item for item in result["items"]}


def hidden(control, instance_id):
    return next(i for i in control.get("/state").json()["instances"] if i["id"] == instance_id)


def test_it_rejects_a_wrong_or_missing_key(sim):
    for headers in ({"Authorization": "Bearer wrong"}, {}, {"Authorization": KEY}):
        response = httpx.get(sim.base_url + "/instances/?owner=me", headers=headers)
        assert response.status_code == 401
        assert response.json()["success"] is False
        assert response.json()["error"] == "invalid_user_key"
    assert httpx.get(sim.origin + "/api/v1/instances/", params={"api_key": KEY}).status_code == 200


def test_it_lists_a_realistic_catalogue(api):
    offers = search(api)
    assert len(offers) == 300
    by_name = {}
    for offer in offers:
        by_name.setdefault(offer["gpu_name"], []).append(offer)
    assert {"RTX PRO 6000 WS", "H100 SXM", "H100 NVL", "H200", "H200 NVL", "B200", "A100 SXM4", "A100 PCIE"} <= set(
        by_name
    )
    pro = by_name["RTX PRO 6000 WS"][0]
    assert (pro["gpu_ram"], pro["compute_cap"], pro["gpu_total_ram"]) == (97887, 1200, 97887 * pro["num_gpus"])
    assert {o["compute_cap"] for o in by_name["H200"]} == {900}
    assert {o["num_gpus"] for o in offers} == {1, 2, 4, 8}
    assert {o["is_bid"] for o in offers} == {False}
    assert all(0.90 <= o["reliability"] <= 0.999 and 20 <= o["inet_down"] <= 5000 for o in offers)
    assert all(o["dph_base"] < o["dph_total"] and "dies_after_s" not in o for o in offers)
    assert {"535", "570", "580"} <= {o["driver_version"].split(".")[0] for o in offers}
    assert {(o["driver_version"][:3], o["cuda_max_good"]) for o in offers} >= {("535", 12.2), ("570", 12.8),
                                                                                ("580", 13.0)}
    countries = {o["geolocation"].rsplit(", ", 1)[1] for o in offers}
    assert {"US", "SE"} <= countries and countries & {"DE", "NL", "FR", "NO", "FI"}

    # The cheap tier sits below reliability 0.99; a 0.99 floor leaves only the $1.90-2.50 boxes.
    single_pro = [o for o in by_name["RTX PRO 6000 WS"] if o["num_gpus"] == 1]
    cheap = [o for o in single_pro if 1.00 <= o["dph_total"] <= 1.25]
    assert cheap and all(o["reliability"] < 0.99 for o in cheap)
    reliable = [o for o in single_pro if o["reliability"] >= 0.99]
    assert reliable and all(1.90 <= o["dph_total"] <= 2.50 for o in reliable)
    assert all(3.80 * o["num_gpus"] * 0.95 <= o["dph_base"] <= 5.20 * o["num_gpus"] for o in by_name["B200"])


def test_it_draws_the_same_catalogue_for_the_same_seed():
    def ids(seed):
        return [o["id"] for o in Market(Settings(seed=seed)).search({"limit": 1000})]

    assert ids(7) == ids(7)
    assert ids(7) != ids(8)


def test_it_filters_and_orders_offers(api):
    query = {
        "gpu_ram": {"gte": 90_000, "lte": 100_000},
        "dph_total": {"lte": 1.30},
        "reliability": {"gte": 0.95},
        "inet_down": {"gte": 250},
        "verified": {"eq": True},
        "geolocation": {"nin": ["US", "CA"]},  # two-letter country codes, as vast.ai documents it
        "order": [["dph_total", "asc"]],
    }
    offers = search(api, **query)
    assert offers
    prices = [o["dph_total"] for o in offers]
    assert prices == sorted(prices)
    for o in offers:
        assert 90_000 <= o["gpu_ram"] <= 100_000 and o["dph_total"] <= 1.30 and o["reliability"] >= 0.95
        assert o["inet_down"] >= 250 and o["verified"] is True and o["geolocation"][-4:] not in (", US", ", CA")

    hopper = search(api, gpu_name={"in": ["H200", "H200 NVL"]}, num_gpus={"neq": 1})
    assert {o["gpu_name"] for o in hopper} == {"H200", "H200 NVL"}
    assert all(o["num_gpus"] > 1 for o in hopper)

    ordered = search(api, order=[["num_gpus", "desc"], ["dph_total", "asc"]])
    keys = [(-o["num_gpus"], o["dph_total"]) for o in ordered]
    assert keys == sorted(keys)

    assert len(search(api, limit=5)) == 5
    unknown_field = api.post("/bundles/", json={"no_such_field": {"eq": 1}})
    assert unknown_field.status_code == 400  # never a filter that silently lets every offer through
    assert "'no_such_field' is not modelled by the simulated marketplace" in unknown_field.json()["msg"]
    bad = api.post("/bundles/", json={"dph_total": {"about": 1}})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_args"


def test_it_prices_bid_searches_at_the_minimum_bid(api):
    on_demand = {o["id"]: o for o in search(api)}
    bids = search(api, type="bid")
    assert {o["id"] for o in bids} == set(on_demand)
    for o in bids:
        assert o["is_bid"] is True
        assert o["dph_base"] == o["min_bid"] < on_demand[o["id"]]["dph_base"]


def test_it_takes_a_rented_offer_off_the_search(api, sim):
    offer = healthy_offer(api, sim)
    instance_id = rented(api, offer["id"])
    assert isinstance(instance_id, int)
    assert offer["id"] not in {o["id"] for o in search(api)}

    again = rent(api, offer["id"])
    assert again.status_code == 400
    assert again.json()["success"] is False and again.json()["error"] == "no_such_ask"

    assert api.delete(f"/instances/{instance_id}/").json() == {"success": True}
    assert offer["id"] in {o["id"] for o in search(api)}  # the machine is back on the market


def test_it_boots_an_instance_through_created_loading_running(api, sim, control):
    offer = healthy_offer(api, sim)
    env = {"-p 8000:8000": "1", "RUN_ID": "42"}
    instance_id = rented(api, offer["id"], env=env, onstart="bash /start.sh", label="sft-1")
    rented_at = control.get("/state").json()["clock"]

    first = instance(api, instance_id)
    assert (first["actual_status"], first["intended_status"]) == ("created", "running")
    assert first["start_date"] == pytest.approx(rented_at)
    assert (first["label"], first["env"], first["onstart"], first["image_uuid"]) == ("sft-1", env, "bash /start.sh",
                                                                                      IMAGE)
    assert (first["machine_id"], first["gpu_name"], first["is_bid"]) == (offer["machine_id"], offer["gpu_name"], False)

    sim.advance(30)
    loading = instance(api, instance_id)
    assert loading["actual_status"] == "loading" and IMAGE in loading["status_msg"]
    assert loading["gpu_util"] == 0

    assert control.post("/advance", json={"seconds": 60}).status_code == 200
    running = instance(api, instance_id)
    assert (running["actual_status"], running["cur_state"], running["next_state"]) == ("running",) * 3
    assert running["gpu_util"] > 50
    assert set(running["ports"]) == {"22/tcp", "8000/tcp"}
    assert running["ports"]["22/tcp"][0]["HostPort"] == str(running["ssh_port"])
    listed = v1(api).json()["instances"]
    assert [i["id"] for i in listed] == [instance_id]


def test_it_bills_gpu_and_disk_per_second(api, sim):
    offer = healthy_offer(api, sim)
    instance_id = rented(api, offer["id"], disk=100)
    sim.advance(45)  # still pulling its image: vast.ai bills its storage from creation, its GPU from "running"
    assert instance(api, instance_id)["actual_status"] == "loading"
    assert quantities(sim, instance_id)["gpu"] == 0 and quantities(sim, instance_id)["disk"] > 0
    sim.advance(1755)
    lines = charges_of(api, instance_id)
    running_h = (1800 - 90) / 3600  # the 90 s boot bills no GPU time
    assert lines["gpu"]["amount"] == pytest.approx(offer["dph_base"] * running_h, abs=1e-6)
    assert quantities(sim, instance_id)["gpu"] == pytest.approx(running_h, abs=1e-6)
    # $/GB/month over a 30-day month: 100 GB for half an hour, the boot included.
    assert lines["disk"]["amount"] == pytest.approx(offer["storage_cost"] * 100 * 0.5 / 720, abs=1e-6)
    assert lines["gpu"]["end"] - lines["gpu"]["start"] == pytest.approx(1800 - 90)
    assert lines["disk"]["end"] - lines["disk"]["start"] == pytest.approx(1800)


def test_it_bills_a_bid_at_the_bid_price(api, sim):
    offer = next(o for o in search(api, type="bid", min_bid={"lte": 1.0}, disk_space={"gte": 100}))
    instance_id = rented(api, offer["id"], price=1.20)
    assert instance(api, instance_id)["is_bid"] is True
    sim.advance(1800)
    assert charges_of(api, instance_id)["gpu"]["amount"] == 0.57  # $1.20/h for 1710 s: from "running" on

    too_low = rent(api, search(api, type="bid", min_bid={"gte": 0.5})[0]["id"], price=0.01)
    assert too_low.status_code == 400 and too_low.json()["error"] == "invalid_args"


@pytest.mark.parametrize("body", [
    {"env": {"FLEET_ADAPTER": "x" * 300}},
    {"env": {f"V{i}": "x" * 200 for i in range(200)}},
    {"onstart": "x" * 4097},
    {"label": "l" * 257},
    {"price": 500.0},
])
def test_it_refuses_a_rent_past_vasts_documented_limits_and_rents_nothing(api, sim, body):
    offer = healthy_offer(api, sim)
    refused = rent(api, offer["id"], **body)
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_args"
    assert rent(api, offer["id"]).status_code == 200  # still there to rent


def test_it_stops_billing_when_destroyed_and_404s_a_second_destroy(api, sim):
    offer = healthy_offer(api, sim)
    instance_id = rented(api, offer["id"])
    sim.advance(600)
    assert api.delete(f"/instances/{instance_id}/").json() == {"success": True}
    sim.advance(3600)

    lines = charges_of(api, instance_id)  # a destroyed instance's charges stay
    assert lines["gpu"]["amount"] == pytest.approx(offer["dph_base"] * (600 - 90) / 3600, abs=1e-6)
    assert api.get(f"/instances/{instance_id}/").json() == {"instances": None}  # as vast.ai: no 404 on a GET
    second = api.delete(f"/instances/{instance_id}/")
    assert second.status_code == 404 and second.json()["success"] is False
    assert v1(api).json()["instances"] == []


def test_it_bills_disk_but_not_gpu_while_stopped(api, sim):
    offer = healthy_offer(api, sim)
    instance_id = rented(api, offer["id"])
    sim.advance(600)
    assert api.put(f"/instances/{instance_id}/", json={"state": "stopped"}).json() == {"success": True}
    stopped = instance(api, instance_id)
    assert (stopped["actual_status"], stopped["intended_status"]) == ("stopped", "stopped")
    sim.advance(3000)
    assert set(charges_of(api, instance_id)) == {"gpu", "disk"}
    billed = quantities(sim, instance_id)
    assert billed["gpu"] == pytest.approx((600 - 90) / 3600, abs=1e-6)
    assert billed["disk"] == pytest.approx(100 * 3600 / 3600, abs=1e-6)  # GB-hours, stopped time included

    api.put(f"/instances/{instance_id}/", json={"state": "running"})
    assert instance(api, instance_id)["actual_status"] in ("created", "loading")
    sim.advance(90)
    assert instance(api, instance_id)["actual_status"] == "running"


def test_it_bills_reported_traffic(api, sim, control):
    offer = healthy_offer(api, sim)
    instance_id = rented(api, offer["id"])
    traffic = {"instance_id": instance_id, "upload_gb": 7.4, "download_gb": 67}
    assert control.post("/traffic", json=traffic).status_code == 200
    lines = charges_of(api, instance_id)
    assert lines["bwu"]["amount"] == pytest.approx(7.4 * offer["inet_up_cost"], abs=1e-6)
    assert lines["bwd"]["amount"] == pytest.approx(67 * offer["inet_down_cost"], abs=1e-6)
    assert quantities(sim, instance_id)["bwd"] == 67


def test_it_answers_injected_429s_with_retry_after(api, control):
    assert control.post("/faults", json={"http_429": 2, "retry_after_s": 7}).status_code == 200
    for _ in range(2):
        refused = v1(api)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "7"
    assert v1(api).status_code == 200


def test_it_answers_injected_server_errors(api, sim, control):
    control.post("/faults", json={"http_5xx": 1, "status_5xx": 502})
    bad_gateway = v1(api)
    assert bad_gateway.status_code == 502 and "Bad Gateway" in bad_gateway.text
    assert v1(api).status_code == 200

    control.post("/faults", json={"http_5xx": 1, "status_5xx": 500, "path_contains": "/asks/"})
    offer = healthy_offer(api, sim)  # searches pass; only the rent fails
    assert rent(api, offer["id"]).status_code == 500
    assert rent(api, offer["id"]).status_code == 200


def test_it_fails_a_rent_when_the_offer_went_between_search_and_rent(api, sim, control):
    first, second, third = search(api, order=[["dph_total", "asc"]])[:3]
    control.post("/faults", json={"offers_gone": [first["id"]]})
    gone = rent(api, first["id"])
    assert gone.status_code == 400 and gone.json()["error"] == "no_such_ask"
    assert first["id"] not in {o["id"] for o in search(api)}

    sim.inject_faults(fail_next_rents=1)
    assert rent(api, second["id"]).json()["error"] == "no_such_ask"
    assert rent(api, third["id"]).status_code == 200


def test_it_kills_a_host(api, sim, control):
    offer = healthy_offer(api, sim)
    instance_id = rented(api, offer["id"])
    sim.advance(100)
    assert control.post(f"/instances/{instance_id}/kill", json={}).status_code == 200

    dead = instance(api, instance_id)
    assert (dead["actual_status"], dead["intended_status"], dead["gpu_util"]) == ("exited", "running", 0)
    assert dead["status_msg"].startswith("Host offline")
    sim.advance(3600)
    assert api.get(f"/instances/{instance_id}/").json() == {"instances": None}  # vanished 600 s after death
    assert v1(api).json()["instances"] == []
    assert set(charges_of(api, instance_id)) == {"gpu", "disk"}
    billed = quantities(sim, instance_id)
    assert billed["gpu"] == pytest.approx((100 - 90) / 3600, abs=1e-6)
    assert billed["disk"] == pytest.approx(100 * 700 / 3600, abs=1e-6)  # disk bills until it vanished
    assert offer["id"] not in {o["id"] for o in search(api)}


def test_it_kills_the_hosts_of_offers_with_a_hidden_death_date(api, sim):
    doomed = next(o for o in sim.offers() if o["dies_after_s"] and o["disk_space"] >= 100)
    assert doomed["id"] in {o["id"] for o in search(api)}
    instance_id = rented(api, doomed["id"], image="ubuntu:22.04")
    sim.advance(doomed["dies_after_s"] - 1)
    assert instance(api, instance_id)["actual_status"] == "running"
    sim.advance(2)
    assert instance(api, instance_id)["actual_status"] == "exited"
    assert quantities(sim, instance_id)["gpu"] == pytest.approx((doomed["dies_after_s"] - 90) / 3600, abs=1e-6)


def test_it_hangs_a_host(api, sim, control):
    offer = healthy_offer(api, sim)
    instance_id = rented(api, offer["id"])
    sim.advance(100)
    assert instance(api, instance_id)["gpu_util"] > 0
    control.post(f"/instances/{instance_id}/hang")
    sim.advance(1000)

    hung = instance(api, instance_id)
    assert (hung["actual_status"], hung["gpu_util"]) == ("running", 0)
    assert "hung" not in hung
    assert hidden(control, instance_id)["hung"] is True
    assert quantities(sim, instance_id)["gpu"] == pytest.approx((1100 - 90) / 3600, abs=1e-6)  # still billing


def test_it_fails_cuda_init_when_the_driver_is_too_old(api, sim, control):
    old = search(api, driver_version={"in": ["535.183.01", "535.230.02"]}, disk_space={"gte": 100})[0]
    assert old["cuda_max_good"] == 12.2
    instance_id = rented(api, old["id"])  # a CUDA 12.8 image
    sim.advance(90)
    box = instance(api, instance_id)
    assert box["actual_status"] == "running" and box["gpu_util"] == 0
    assert "CUDA error 803" in box["status_msg"]
    assert "CUDA error 803" in hidden(control, instance_id)["cuda_init_error"]

    fine = healthy_offer(api, sim, cuda_max_good={"gte": 13.0})
    control.post("/faults", json={"driver_too_old_offers": [fine["id"]]})
    instance_id = rented(api, fine["id"], image="ubuntu:22.04")
    sim.advance(90)
    assert "CUDA error 803" in instance(api, instance_id)["status_msg"]


def test_it_reclaims_an_interruptible_instance(api, sim):
    offer = search(api, type="bid", disk_space={"gte": 100})[0]
    instance_id = rented(api, offer["id"], price=offer["min_bid"])
    sim.advance(100)
    sim.reclaim(instance_id)
    box = instance(api, instance_id)
    assert (box["actual_status"], box["intended_status"]) == ("stopped", "running")
    assert "outbid" in box["status_msg"]


def test_it_refuses_charges_polled_too_fast():
    with SimulatedMarketplace(api_key=KEY, speed=0) as sim:  # the default 1 s minimum interval
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=sim.base_url, headers=headers) as api:
            assert charge_report(api).status_code == 200
            refused = charge_report(api)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert httpx.get(sim.origin + "/api/v1/instances/", headers=headers).status_code == 200


def test_it_rate_limits_searches():
    with SimulatedMarketplace(api_key=KEY, speed=0, search_limit_per_min=3) as sim:
        headers = {"Authorization": f"Bearer {KEY}"}
        for _ in range(3):
            assert httpx.post(sim.base_url + "/bundles/", json={}, headers=headers).status_code == 200
        refused = httpx.post(sim.base_url + "/bundles/", json={}, headers=headers)
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= 60


def test_it_guards_the_control_api_with_a_token():
    with SimulatedMarketplace(api_key=KEY, speed=0, control_token="secret") as sim:
        assert httpx.get(sim.control_url + "/state").status_code == 403
        assert httpx.get(sim.control_url + "/state", headers={"X-Sim-Token": "secret"}).status_code == 200


def test_it_resets_to_the_seeds_catalogue(api, sim, control):
    offer = healthy_offer(api, sim)
    rented(api, offer["id"])
    assert control.post("/reset").status_code == 200
    assert v1(api).json()["instances"] == []
    assert len(search(api)) == 300
    assert control.get("/state").json()["billing_total"] == 0


def test_it_runs_on_a_real_clock_at_a_speed():
    with SimulatedMarketplace(api_key=KEY, speed=3600, boot_delay_s=90) as sim:
        client = httpx.Client(base_url=sim.base_url, headers={"Authorization": f"Bearer {KEY}"})
        offer = search(client)[0]
        instance_id = rent(client, offer["id"], image="ubuntu:22.04", disk=10).json()["new_contract"]
        deadline = time.monotonic() + 3
        while instance(client, instance_id)["actual_status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        client.close()


def test_it_calls_instance_hooks_in_event_order(api):
    events = []

    class Recorder(InstanceHooks):
        def on_rented(self, box): events.append(("rented", box["id"]))
        def on_running(self, box): events.append(("running", box["id"]))
        def on_hung(self, box): events.append(("hung", box["hung"]))
        def on_host_died(self, box): events.append(("died", box["actual_status"]))
        def on_destroyed(self, box): events.append(("destroyed", box["id"]))

    with SimulatedMarketplace(api_key=KEY, speed=0, hooks=Recorder()) as sim:
        offer_id = sim.market.search({"cuda_max_good": {"gte": 12.8}, "disk_space": {"gte": 100}})[0]["id"]
        instance_id = sim.market.rent(offer_id, {"image": IMAGE})
        sim.advance(90)
        sim.hang_host(instance_id)
        sim.kill_host(instance_id, vanish_after_s=60)
        sim.advance(60)
    assert events == [("rented", instance_id), ("running", instance_id), ("hung", True), ("died", "exited"),
                      ("destroyed", instance_id)]


def test_it_serves_from_the_command_line():
    env = {**os.environ, "SIMULATOR_API_KEY": KEY, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "fleet.simulator", "--port", "0", "--speed", "0", "--seed", "3"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
    )
    try:
        line = process.stdout.readline()
        base_url = re.search(r"(http://\S+/api/v0)", line).group(1)
        response = httpx.get(base_url.removesuffix("v0") + "v1/instances/", headers={"Authorization": f"Bearer {KEY}"})
        assert response.json()["instances"] == [] and response.json()["next_token"] is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
    finally:
        process.kill()
        process.wait()


# -- what other clients send: vast.ai's coercions, its v1 routes, logs and the account ------------------------


def listed(sim) -> list[dict]:
    return [o for o in sim.offers() if not o["gone"] and o["rented_by"] is None]


def test_it_coerces_query_values_given_as_strings(api, sim):
    as_numbers = {o["id"] for o in search(api, reliability={"gt": 0.98}, num_gpus={"eq": 1})}
    as_strings = {o["id"] for o in search(api, reliability={"gt": "0.98"}, num_gpus={"eq": "1"})}
    assert as_numbers and as_strings == as_numbers
    unverified = {o["id"] for o in listed(sim) if not o["verified"]}
    assert unverified
    for word in ("false", "False", False):
        assert {o["id"] for o in search(api, verified={"eq": word})} == unverified
    assert {o["id"] for o in search(api, num_gpus={"in": ["2", "4"]})} == {
        o["id"] for o in listed(sim) if o["num_gpus"] in (2, 4)}
    assert search(api, limit="5", num_gpus={"gte": "1"}) == search(api, limit=5, num_gpus={"gte": 1})


def test_it_takes_wildcards_notin_null_and_numeric_driver_versions(api, sim):
    everything = {o["id"] for o in listed(sim)}
    assert {o["id"] for o in search(api, gpu_name={"eq": "any"}, verified="*")} == everything
    without = {o["id"] for o in search(api, gpu_name={"notin": ["H200", "B200"]})}
    assert without == {o["id"] for o in listed(sim) if o["gpu_name"] not in ("H200", "B200")}
    assert search(api, gpu_name={"eq": None}) == []
    assert {o["id"] for o in search(api, gpu_name={"neq": None})} == everything

    def driver(o):
        return tuple(int(p) for p in o["driver_version"].split("."))

    new = {o["id"] for o in listed(sim) if driver(o) >= (570, 124, 6)}
    assert new and {o["id"] for o in search(api, driver_version={"gte": 570124006})} == new
    assert {o["id"] for o in search(api, driver_version={"gte": "570.124.06"})} == new


def test_it_refuses_values_that_cannot_be_the_fields_type(api):
    for query in ({"reliability": {"gt": "high"}}, {"verified": {"eq": "maybe"}}, {"driver_version": {"gt": "new"}},
                  {"num_gpus": {"gt": True}}):
        response = api.post("/bundles/", json=query)
        assert response.status_code == 400 and response.json()["error"] == "invalid_args", query


def test_it_lists_instances_in_v1_pages_with_filters_order_and_columns(api, sim):
    offers = search(api, limit=7, disk_space={"gte": 100})
    ids = [rented(api, o["id"], label=f"page-{n % 2}") for n, o in enumerate(offers)]
    v1 = httpx.Client(base_url=sim.origin + "/api/v1", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    query = {"select_filters": '{"label": {"in": ["page-0"]}}', "order_by": '[{"col": "id", "dir": "desc"}]',
             "limit": 3, "select_cols": '["id", "label"]'}
    first = v1.get("/instances/", params=query).json()
    wanted = sorted((i for n, i in enumerate(ids) if n % 2 == 0), reverse=True)
    assert first["total_instances"] == 4 and first["label_counts"] == {"page-0": 4}
    assert first["instances"] == [{"id": i, "label": "page-0"} for i in wanted[:3]]
    second = v1.get("/instances/", params={**query, "after_token": first["next_token"]}).json()
    assert [i["id"] for i in second["instances"]] == wanted[3:] and second["next_token"] is None
    assert v1.get("/instances/", params={"after_token": "forged"}).status_code == 400
    assert v1.get("/instances/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    default = v1.get("/instances/").json()  # vast.ai's page when no limit is given: 5
    assert len(default["instances"]) == 5 and default["next_token"] is not None
    assert len(v1.get("/instances/", params={"limit": 100}).json()["instances"]) == 7  # at most 25 a page anyway


def test_the_v0_instance_list_is_gone_as_on_vast_ai(api):
    gone = api.get("/instances/", params={"owner": "me"})
    assert gone.status_code == 410 and gone.json()["error"] == "deprecated_endpoint"
    assert "/api/v1/instances/" in gone.json()["msg"]


def test_it_serves_an_instance_log_through_a_result_url(api, sim):
    instance_id = rented(api, healthy_offer(api, sim)["id"], onstart="python -m training.agent")
    sim.advance(90)
    answer = api.put(f"/instances/request_logs/{instance_id}/", json={"tail": "2"}).json()
    lines = httpx.get(answer["result_url"], timeout=5).text.splitlines()  # no key: a presigned-style link
    assert [line.split(" ", 1)[1] for line in lines] == [f"Pulling image {IMAGE}",
                                                          "Container started: python -m training.agent"]
    assert httpx.get(answer["result_url"] + "x", timeout=5).status_code == 404
    assert api.put("/instances/request_logs/1/", json={}).status_code == 404


def test_it_keeps_a_log_across_stop_start_and_a_dead_host(api, sim, control):
    instance_id = rented(api, healthy_offer(api, sim)["id"])
    sim.advance(90)
    api.put(f"/instances/{instance_id}/", json={"state": "stopped"})
    api.put(f"/instances/{instance_id}/", json={"state": "running"})
    sim.advance(5)  # the restart has not pulled its image yet when the host dies
    control.post(f"/instances/{instance_id}/kill", json={})
    answer = api.put(f"/instances/request_logs/{instance_id}/", json={}).json()
    texts = [line.split(" ", 1)[1] for line in httpx.get(answer["result_url"], timeout=5).text.splitlines()]
    assert texts[:4] == [f"Creating container from {IMAGE}", f"Pulling image {IMAGE}",
                         "Container started: ssh", "Instance stopped by user"]
    assert texts[4] == "Starting container" and texts[-1].startswith("Host offline") and len(texts) == 6


def test_it_reports_the_account_as_invoices_and_charge_pages(api, sim):
    instance_id = rented(api, healthy_offer(api, sim)["id"])
    sim.advance(7200)
    total = next(i for i in sim.state()["instances"] if i["id"] == instance_id)["billing"]["total"]
    invoices = api.get("/users/me/invoices", params={"owner": "me", "inc_charges": "true"}).json()
    assert sum(r["amount"] for r in invoices["invoices"] if r["type"] == "charge") == pytest.approx(total)
    assert invoices["current"]["total"] == pytest.approx(total, abs=1e-4)
    credits_only = api.get("/users/me/invoices", params={"inc_charges": "false"}).json()["invoices"]
    assert [r["type"] for r in credits_only] == ["payment"]
    report = charge_report(api, type={"in": ["instance"]}).json()
    assert report["total"] == 1 and report["results"][0]["amount"] == pytest.approx(total)
    assert charge_report(api, type={"in": ["volume"]}).json()["total"] == 0
    refused = api.get("/charges/")  # as vast.ai: the report needs its day range
    assert refused.status_code == 400 and "'day' gte and lte" in refused.json()["msg"]
    assert api.get("/users/current").json()["credit"] == pytest.approx(1000 - total, abs=1e-3)


@contextlib.contextmanager
def saved_marketplace(state_file, hooks=None):
    """A frozen marketplace kept in `state_file`, and a client of its API."""
    with SimulatedMarketplace(api_key=KEY, seed=7, speed=0, boot_delay_s=90, charges_min_interval_s=0,
                              state_file=str(state_file), hooks=hooks) as sim, \
            httpx.Client(base_url=sim.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=5) as api:
        yield sim, api


def test_a_marketplace_started_again_never_hands_out_an_id_it_handed_out_before(tmp_path):
    with SimulatedMarketplace(api_key=KEY, seed=7, speed=0) as sim, \
            httpx.Client(base_url=sim.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=5) as api:
        given = [rented(api, healthy_offer(api, sim)["id"])]  # a run before any state file was kept
    for _ in range(2):  # the same seed twice: without the file, the second run would hand out the same ids
        with saved_marketplace(tmp_path / "state.json") as (sim, api):
            for _ in range(3):
                instance_id = rented(api, healthy_offer(api, sim)["id"])
                assert api.delete(f"/instances/{instance_id}/").status_code == 200
                given.append(instance_id)
    assert given == sorted(given) and len(set(given)) == 7


def test_a_marketplace_started_again_lists_the_same_instances_and_bills_on(tmp_path):
    with saved_marketplace(tmp_path / "state.json") as (sim, api):
        offers = search(api, cuda_max_good={"gte": 12.8}, disk_space={"gte": 100}, order=[["dph_total", "asc"]])
        doomed = {o["id"] for o in sim.offers() if o["dies_after_s"]}
        serving, stopped, gone, bid = [o["id"] for o in offers if o["id"] not in doomed][:4]
        serving = rented(api, serving, label="serving", env={"-p 8000:8000": "1", "MODEL": "m"}, onstart="run")
        stopped, gone = rented(api, stopped, label="stopped"), rented(api, gone, label="gone")
        bid = rented(api, bid, label="bid", price=5.0)
        sim.advance(600)
        assert api.put(f"/instances/{stopped}/", json={"state": "stopped"}).status_code == 200
        assert api.delete(f"/instances/{gone}/").status_code == 200
        sim.report_traffic(serving, upload_gb=2.0)
        sim.advance(300)
        before = v1(api).json()["instances"]
        charges = {i: charges_of(api, i) for i in (serving, stopped, gone, bid)}
        credit = api.get("/users/current").json()["credit"]
    with saved_marketplace(tmp_path / "state.json") as (sim, api):
        after = v1(api).json()["instances"]
        assert [row["id"] for row in after] == [serving, stopped, bid]
        assert after == before  # status, label, price, start, ssh, ports and env as they were
        assert {i: charges_of(api, i) for i in (serving, stopped, gone, bid)} == charges
        assert api.get("/users/current").json()["credit"] == credit
        assert api.get(f"/instances/{gone}/").json()["instances"] is None
        listed_ids = {o["id"] for o in search(api)}
        assert not {i["offer_id"] for i in sim.state()["instances"] if i["state"] != "destroyed"} & listed_ids
        sim.advance(3600)  # the running ones bill on from where they were
        assert charges_of(api, serving)["gpu"]["amount"] > charges[serving]["gpu"]["amount"]
        assert charges_of(api, stopped)["gpu"] == charges[stopped]["gpu"]
        assert rented(api, healthy_offer(api, sim)["id"]) > max(serving, stopped, gone, bid)


def test_a_running_box_is_started_again_with_the_marketplace(tmp_path):
    """What ran in a box went with the marketplace's process: the box's command runs again, as after a host's reboot,
    and its log says so; a hung host's box stays frozen."""
    events = []

    class Boxes(InstanceHooks):
        def on_running(self, box): events.append(("running", box["id"], box["onstart"]))
        def on_hung(self, box): events.append(("hung", box["id"], box["onstart"]))

    with saved_marketplace(tmp_path / "state.json", Boxes()) as (sim, api):
        box = rented(api, healthy_offer(api, sim)["id"], onstart="serve")
        hung = rented(api, healthy_offer(api, sim)["id"], onstart="train")
        sim.advance(90)
        sim.hang_host(hung)
    events.clear()
    with saved_marketplace(tmp_path / "state.json", Boxes()) as (sim, api):
        sim.market.tick()
        assert instance(api, box)["actual_status"] == "running"
        log_url = api.put(f"/instances/request_logs/{box}/", json={}).json()["result_url"]
        assert "Container restarted" in httpx.get(log_url).text
    assert events == [("running", box, "serve"), ("running", hung, "train"), ("hung", hung, "train")]


def test_a_state_file_cut_short_is_set_aside_and_the_marketplace_starts_afresh(tmp_path, caplog):
    state = tmp_path / "state.json"
    state.write_text('{"format": 1, "next_instance_id": 3')  # a file that was never whole
    floor = int(time.time()) // 10
    with saved_marketplace(state) as (sim, api):
        first = rented(api, healthy_offer(api, sim)["id"])
        assert v1(api).json()["instances"][0]["id"] == first
    assert first >= floor  # past any id a run before could have handed out
    assert "cannot be read" in caplog.text and (tmp_path / "state.json.unreadable").exists()
    assert json.loads(state.read_text())["next_instance_id"] > first


def test_the_command_line_marketplace_keeps_its_instances_across_a_restart(tmp_path):
    env = {**os.environ, "SIMULATOR_API_KEY": KEY, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "fleet.simulator", "--port", "0", "--speed", "0", "--seed", "3",
               "--state-file", str(tmp_path / "state.json")]
    listings = []
    for _ in range(2):
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        try:
            base_url = re.search(r"(http://\S+/api/v0)", process.stdout.readline()).group(1)
            with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=5) as api:
                if not listings:
                    offer = search(api, cuda_max_good={"gte": 12.8}, disk_space={"gte": 100})[0]
                    rented(api, offer["id"], label="kept")
                listings.append(v1(api).json()["instances"])
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=5) == 0
        finally:
            process.kill()
            process.wait()
    assert [row["label"] for row in listings[1]] == ["kept"] and listings[1] == listings[0]


def test_a_box_left_running_by_a_marketplace_killed_outright_runs_once_when_it_comes_back(tmp_path):
    """Killed outright, the marketplace could not stop what its boxes ran: started again, it ends what was left of a
    box's command before it starts it afresh, so the box never runs twice."""
    from fleet.simulator.agents import AgentProcesses

    first, second = AgentProcesses(tmp_path / "boxes"), AgentProcesses(tmp_path / "boxes")
    try:
        with saved_marketplace(tmp_path / "state.json", first) as (sim, api):
            box = rented(api, healthy_offer(api, sim)["id"], onstart="sleep 300")
            sim.advance(90)
        left = first.processes[box]  # the marketplace is gone; no stop_all ran, as after a SIGKILL
        assert left.poll() is None
        with saved_marketplace(tmp_path / "state.json", second) as (sim, api):
            sim.market.tick()
            assert left.wait(timeout=10) is not None
            assert second.processes[box].poll() is None and second.processes[box].pid != left.pid
    finally:
        first.stop_all()
        second.stop_all()
