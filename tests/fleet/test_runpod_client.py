"""The RunPod client over real HTTP against a fake RunPod GraphQL server, faults included."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from fleet import actions
from fleet.providers.errors import (
    AuthenticationFailed,
    InstanceNotFound,
    MalformedResponse,
    OfferUnavailable,
    OutcomeUnknown,
    ProviderUnavailable,
    RateLimited,
)
from fleet.providers.records import RentRequest
from fleet.providers.runpod import QueryRefused, RunPodClient, parse_pod, pod_status

from .runpod_server import RUNPOD_KEY, FakeRunPod

H200_SECURE = "NVIDIA H200:SECURE:1"


@pytest.fixture
def fake():
    server = FakeRunPod(boot_polls=None, read_only_keys={"read-only-key"}).start()
    yield server
    server.stop()


@pytest.fixture
def runpod(fake):
    sleeps: list[float] = []
    client = RunPodClient(fake.base_url, RUNPOD_KEY, max_retries=3, backoff_s=0.01, timeout_s=5,
                          sleep=sleeps.append)
    client.sleeps = sleeps
    yield client
    client.close()


def _rent(runpod, offer_id=H200_SECURE, **kwargs):
    return runpod.rent(RentRequest(offer_id=offer_id, image="ghcr.io/example/worker:cuda12.8", disk_gb=250,
                                   label="moe-fleet-17", env={"RUN": "17"}, **kwargs))


# -- offers ---------------------------------------------------------------------------------------------------


def test_it_lists_each_gpu_type_per_cloud_with_decimal_prices(runpod):
    offers = runpod.search_offers()
    by_id = {o.offer_id: o for o in offers}
    assert {"NVIDIA H200:SECURE:1", "NVIDIA H200:COMMUNITY:1", "NVIDIA B200:SECURE:1"} <= set(by_id)
    assert "NVIDIA B200:COMMUNITY:1" not in by_id  # B200 is in Secure Cloud only
    assert not any("RTX 3070" in o.offer_id for o in offers)  # listed in neither cloud
    h200 = by_id[H200_SECURE]
    assert h200.provider == "runpod" and h200.gpu_name == "H200" and h200.num_gpus == 1
    assert h200.gpu_ram_gb == 141.0 and h200.compute_capability == 90
    assert h200.total_usd_per_hour == h200.gpu_usd_per_hour == Decimal("3.99")
    assert h200.min_bid_usd_per_hour == Decimal("2.29")
    assert h200.rentable and not h200.is_bid and h200.verified
    assert by_id["NVIDIA H200:COMMUNITY:1"].total_usd_per_hour == Decimal("3.59")
    prices = [o.total_usd_per_hour for o in offers]
    assert prices == sorted(prices) and all(isinstance(p, Decimal) for p in prices)


def test_it_says_an_offer_is_rentable_only_where_its_cloud_has_a_machine_free(runpod, fake):
    """RunPod keeps listing a type's prices when none is free; its stockStatus, asked per cloud, says so."""
    fake.capacity_gone("NVIDIA H200", cloud="SECURE")
    by_id = {o.offer_id: o for o in runpod.search_offers()}
    secure, community = by_id[H200_SECURE], by_id["NVIDIA H200:COMMUNITY:1"]
    assert not secure.rentable and secure.total_usd_per_hour == Decimal("3.99")  # still priced, not free now
    assert community.rentable
    fake.capacity_gone("NVIDIA H200")
    assert not any(o.rentable for o in runpod.search_offers() if o.offer_id.startswith("NVIDIA H200:"))


def test_it_makes_no_offer_above_a_clouds_own_gpu_count_limit(runpod, fake):
    def limits(data):
        for gpu_type in data.get("gpuTypes") or []:
            if gpu_type["id"] == "NVIDIA H200":
                gpu_type["maxGpuCountCommunityCloud"], gpu_type["minPodGpuCount"] = 2, 2
        return data

    fake.corrupt_answers(limits)
    ids = {o.offer_id for o in runpod.search_offers({"gpu_counts": [1, 2, 8]})}
    assert "NVIDIA H200:SECURE:1" not in ids and "NVIDIA H200:COMMUNITY:1" not in ids  # under its minimum
    assert {"NVIDIA H200:SECURE:2", "NVIDIA H200:COMMUNITY:2", "NVIDIA H200:SECURE:8"} <= ids
    assert "NVIDIA H200:COMMUNITY:8" not in ids


def test_it_states_the_host_floors_every_rent_sends_and_leaves_the_rest_unknown(runpod, fake):
    offers = runpod.search_offers()
    h200 = next(o for o in offers if o.offer_id == H200_SECURE)
    # RunPod lists GPU types, not hosts: an offer's CUDA, driver, disk and bandwidth are the floors the rent asks for.
    assert (h200.driver_version, h200.cuda_max, h200.disk_gb) == ("570", 12.8, 250.0)
    assert (h200.inet_up_mbps, h200.inet_down_mbps, h200.reliability, h200.geolocation) == (200.0, 250.0, 0.99, "")
    community = next(o for o in offers if o.offer_id == "NVIDIA H200:COMMUNITY:1")
    assert community.reliability == 0.95
    _rent(runpod)
    (sent,) = [p for p in fake.deploy_inputs]
    assert (sent["allowedCudaVersions"][0], sent["minDownload"], sent["minUpload"]) == ("12.8", 250, 200)
    assert "12.6" not in sent["allowedCudaVersions"] and "13.0" in sent["allowedCudaVersions"]
    assert (h200.machine_id, h200.host_id, h200.dlperf, h200.total_flops) == ("", "", None, None)
    assert h200.inet_down_usd_per_gb == h200.inet_up_usd_per_gb == 0  # RunPod does not bill traffic
    assert h200.storage_usd_per_gb_month == Decimal("0.10")


def test_it_prices_bid_offers_at_the_minimum_bid_per_machine(runpod):
    bids = runpod.search_offers({"gpu_counts": [2]}, bid=True)
    assert bids and all(o.is_bid and o.num_gpus == 2 for o in bids)
    h200 = next(o for o in bids if o.offer_id == "NVIDIA H200:COMMUNITY:2")
    assert h200.total_usd_per_hour == Decimal("3.98")  # 2 x $1.99
    assert not any(o.offer_id.startswith("NVIDIA B200") for o in bids)  # B200 takes no bids


def test_it_keeps_to_the_limit_and_refuses_vast_filters(runpod):
    assert len(runpod.search_offers(limit=3)) == 3
    with pytest.raises(ValueError, match="gpu_counts and cloud_types"):
        runpod.search_offers({"gpu_ram": {"gte": 130 * 1024}})


def test_it_skips_a_malformed_gpu_type_and_keeps_the_rest(runpod, fake):
    def mangle(data):
        for gpu_type in data.get("gpuTypes") or []:
            if gpu_type["id"] == "NVIDIA B200":
                gpu_type["memoryInGb"] = "lots"
        return data

    fake.corrupt_answers(mangle)
    offers = runpod.search_offers()
    assert H200_SECURE in {o.offer_id for o in offers}
    assert not any(o.offer_id.startswith("NVIDIA B200") for o in offers)
    assert offers.skipped == ["GPU type NVIDIA B200 x1: memoryInGb is 'lots' (a string), not a number"]


def test_it_skips_each_gpu_type_with_junk_in_a_field_and_names_the_field(runpod, fake):
    junk = {
        "NVIDIA H100 80GB HBM3": ("securePrice", float("inf")),  # JSON 1e400
        "NVIDIA B200": ("secureCloud", "true"),  # a flag as a string
        "NVIDIA A100 80GB PCIe": ("maxGpuCount", 1.5),
        "NVIDIA GeForce RTX 3070": ("memoryInGb", float("nan")),
    }

    def mangle(data):
        for gpu_type in data.get("gpuTypes") or []:
            if gpu_type["id"] in junk:
                field, value = junk[gpu_type["id"]]
                gpu_type[field] = value
        return data

    fake.corrupt_answers(mangle)
    offers = runpod.search_offers()
    assert {o.offer_id.split(":")[0] for o in offers} == {"NVIDIA H200",
                                                          "NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert all(o.total_usd_per_hour.is_finite() for o in offers)
    assert offers.skipped == [
        "GPU type NVIDIA H100 80GB HBM3 x1: securePrice is inf, not a finite number",
        "GPU type NVIDIA B200 x1: secureCloud is 'true' (a string), not true or false",
        "GPU type NVIDIA A100 80GB PCIe x1: maxGpuCount is 1.5, not a whole number",
        "GPU type NVIDIA GeForce RTX 3070 x1: memoryInGb is nan, not a finite number",
    ]


# -- rent, follow, destroy ------------------------------------------------------------------------------------


def test_it_rents_on_demand_and_follows_the_pod_from_created_to_running(runpod, fake):
    pod_id = _rent(runpod)
    assert fake.count("podFindAndDeployOnDemand") == 1
    pod = runpod.get_instance(pod_id)
    assert (pod.provider, pod.label, pod.status, pod.intended_status) == ("runpod", "moe-fleet-17", "created",
                                                                          "running")
    assert pod.started_at is None and pod.ports == {} and pod.gpu_util_percent is None
    assert pod.usd_per_hour == Decimal("3.99") and not pod.is_bid and pod.gpu_name == "H200"

    fake.advance(pod_id)
    pod = runpod.get_instance(pod_id)
    assert pod.status == "running"
    assert set(pod.ports) == {"22/tcp", "8000/tcp"}  # the HTTP proxy port is not a public mapping
    assert pod.public_ip == pod.ssh_host == "203.0.113.10" and pod.ssh_port == pod.ports["22/tcp"]
    assert pod.gpu_util_percent == 87.0
    assert abs(pod.started_at - datetime.now(UTC)) < timedelta(seconds=5)
    assert [i.instance_id for i in runpod.list_instances()] == [pod_id]


def test_it_boots_a_pod_after_the_configured_number_of_polls(fake, runpod):
    fake.boot_polls = 2
    pod_id = _rent(runpod)
    assert [runpod.get_instance(pod_id).status for _ in range(3)] == ["created", "created", "running"]


def test_it_sends_the_request_as_runpod_wants_it(runpod, fake):
    pod_id = _rent(runpod, onstart="python -m agent --run 17")
    pod = fake.pods[pod_id]
    assert (pod.gpu_type_id, pod.cloud_type, pod.gpu_count, pod.image) == ("NVIDIA H200", "SECURE", 1,
                                                                           "ghcr.io/example/worker:cuda12.8")
    assert pod.env == [{"key": "RUN", "value": "17"}]
    assert pod.docker_args == "bash -c 'python -m agent --run 17'"  # RunPod has no on-start script
    assert pod.ports == "22/tcp,8000/tcp"


def test_it_rents_a_bid_per_gpu(runpod, fake):
    pod_id = _rent(runpod, "NVIDIA H200:COMMUNITY:2", bid_usd_per_hour=Decimal("4.20"))
    assert fake.count("podRentInterruptable") == 1
    pod = runpod.get_instance(pod_id)
    assert pod.is_bid and pod.num_gpus == 2 and pod.usd_per_hour == Decimal("4.2")  # $2.10 per GPU


def test_it_reports_a_bid_below_the_minimum_in_runpods_words(runpod):
    with pytest.raises(QueryRefused, match="below the minimum bid"):
        _rent(runpod, "NVIDIA H200:COMMUNITY:1", bid_usd_per_hour=Decimal("0.50"))


def test_it_destroys_once_and_then_reports_gone(runpod):
    pod_id = _rent(runpod)
    assert runpod.destroy(pod_id) is True
    assert runpod.destroy(pod_id) is False  # already gone: not an error
    with pytest.raises(InstanceNotFound):
        runpod.get_instance(pod_id)
    assert runpod.list_instances() == []


def test_it_sees_a_dead_host_as_a_pod_that_is_gone(runpod, fake):
    pod_id = _rent(runpod)
    fake.advance()
    fake.kill_pod(pod_id)
    with pytest.raises(InstanceNotFound):
        runpod.get_instance(pod_id)
    assert runpod.list_instances() == []
    assert runpod.destroy(pod_id) is False


def test_it_speaks_vasts_status_words(runpod, fake):
    pod_id = _rent(runpod)
    fake.advance()
    fake.set_pod(pod_id, desired_status="EXITED", running=False, last_status_change="Exited by Runpod: host down")
    pod = runpod.get_instance(pod_id)
    assert (pod.status, pod.intended_status, pod.status_msg) == ("exited", "running", "Exited by Runpod: host down")
    # RunPod stopped it, nobody asked: the sync takes it for a failed box.
    assert actions.failure_of(pod) == "The host exited on its own: Exited by Runpod: host down"
    fake.set_pod(pod_id, desired_status="RUNNING", running=True)
    fake.stop_pod(pod_id)  # as the SDK's stop_pod, RunPod's console or the box's own self-stop does it
    pod = runpod.get_instance(pod_id)
    assert (pod.status, pod.intended_status) == ("exited", "stopped") and pod.status_msg.startswith("Exited by User")
    assert actions.failure_of(pod) == ""  # stopped on purpose, not failed
    fake.set_pod(pod_id, desired_status="RUNNING", running=False)
    assert runpod.get_instance(pod_id).status == "loading"  # RUNNING but the container is not up yet
    fake.set_pod(pod_id, desired_status="TERMINATED")
    with pytest.raises(InstanceNotFound):
        runpod.get_instance(pod_id)
    assert [pod_status(s, r) for s, r in [("CREATED", False), ("RUNNING", True), ("PAUSED", False)]] == [
        "created", "running", "stopped"]


# -- keys ------------------------------------------------------------------------------------------------------


def test_it_says_the_key_is_wrong(fake):
    with RunPodClient(fake.base_url, "not-the-key") as client:
        with pytest.raises(AuthenticationFailed, match=r"refused the API key \(HTTP 401\): check RUNPOD_API_KEY"):
            client.search_offers()
    assert fake.operations == []


def test_it_says_the_key_cannot_rent(fake):
    with RunPodClient(fake.base_url, "read-only-key") as client:
        assert client.search_offers()
        with pytest.raises(AuthenticationFailed, match="read-only.*check RUNPOD_API_KEY"):
            _rent(client)
    assert fake.pods == {}


def test_it_refuses_to_start_without_a_key(fake):
    with pytest.raises(AuthenticationFailed, match="set RUNPOD_API_KEY"):
        RunPodClient(fake.base_url, "")


def test_it_keeps_the_key_out_of_its_repr_and_url(fake, runpod, caplog):
    fake.inject_faults(http_429=1, retry_after_s=1)
    with caplog.at_level("DEBUG"):
        runpod.search_offers()
    assert RUNPOD_KEY not in repr(runpod) and RUNPOD_KEY not in runpod.api_url
    assert RUNPOD_KEY not in caplog.text


# -- retries and faults ----------------------------------------------------------------------------------------


def test_a_429_without_retry_after_waits_the_rate_limit_floor(runpod, fake):
    fake.inject_faults(http_429=2)
    assert runpod.search_offers()
    assert runpod.sleeps == [3.0, 3.0]  # not a 0.25 s backoff that lands inside the provider's own interval


def test_it_waits_out_a_429_as_retry_after_says(runpod, fake):
    fake.inject_faults(http_429=2, retry_after_s=3)
    assert runpod.search_offers()
    assert runpod.sleeps == [3.0, 3.0]
    assert fake.count("gpuTypes") == 3


def test_it_gives_up_when_retry_after_is_too_long(runpod, fake):
    fake.inject_faults(http_429=1, retry_after_s=600)
    with pytest.raises(RateLimited) as caught:
        runpod.list_instances()
    assert caught.value.retry_after_s == 600 and runpod.sleeps == []


def test_it_retries_5xx_with_backoff(runpod, fake):
    fake.inject_faults(http_5xx=2, status_5xx=502)
    assert runpod.list_instances() == []
    assert len(runpod.sleeps) == 2 and runpod.sleeps[1] > runpod.sleeps[0] * 0.9


def test_it_stops_retrying_5xx_after_its_budget(runpod, fake):
    fake.inject_faults(http_5xx=10, status_5xx=503)
    with pytest.raises(ProviderUnavailable, match="HTTP 503 after 4 tries"):
        runpod.list_instances()
    assert fake.count("myself") == 4


def test_it_says_so_when_runpod_cannot_be_reached():
    client = RunPodClient("http://127.0.0.1:9/graphql", "key", max_retries=1, sleep=lambda s: None)
    with pytest.raises(ProviderUnavailable, match="cannot connect"):
        client.list_instances()


def test_it_reports_capacity_gone_between_search_and_rent(runpod, fake):
    assert H200_SECURE in {o.offer_id for o in runpod.search_offers()}
    fake.capacity_gone("NVIDIA H200")
    with pytest.raises(OfferUnavailable, match=f"Offer {H200_SECURE} can no longer be rented.*no longer any"):
        _rent(runpod)
    assert fake.pods == {}


def test_it_never_retries_a_rent_that_may_have_happened(runpod, fake):
    fake.inject_faults(http_5xx=1, status_5xx=504, apply_5xx=True)
    with pytest.raises(OutcomeUnknown, match="HTTP 504 after sending"):
        _rent(runpod)
    assert fake.count("podFindAndDeployOnDemand") == 1  # one deploy sent, not two
    # It did rent: the label finds the pod, which is how the caller reconciles.
    assert [i.label for i in runpod.list_instances()] == ["moe-fleet-17"]


def test_it_retries_a_rent_that_was_rate_limited(runpod, fake):
    fake.inject_faults(http_429=1, retry_after_s=2)
    assert _rent(runpod) in fake.pods
    assert fake.count("podFindAndDeployOnDemand") == 2 and len(fake.pods) == 1


def test_it_retries_a_destroy_after_a_5xx(runpod, fake):
    pod_id = _rent(runpod)
    fake.inject_faults(http_5xx=1)
    assert runpod.destroy(pod_id) is True and fake.pods == {}


# -- malformed answers ----------------------------------------------------------------------------------------


def test_it_says_so_when_the_body_is_not_json(runpod, fake):
    fake.inject_faults(non_json=1)
    with pytest.raises(MalformedResponse, match="not JSON"):
        runpod.search_offers()


def test_it_says_so_when_data_is_missing(runpod, fake):
    fake.inject_faults(no_data=1)
    with pytest.raises(MalformedResponse, match="without a 'data' object"):
        runpod.list_instances()


def test_it_treats_an_unreadable_rent_answer_as_an_unknown_outcome(runpod, fake):
    fake.inject_faults(non_json=1)
    with pytest.raises(OutcomeUnknown, match="reconcile by label") as caught:
        _rent(runpod)
    assert isinstance(caught.value, MalformedResponse)


def test_it_refuses_an_offer_id_that_is_not_runpods(runpod, fake):
    with pytest.raises(OfferUnavailable, match="not a RunPod offer"):
        _rent(runpod, "101")
    assert fake.operations == []


def test_a_pod_with_a_broken_price_is_kept_with_its_price_unknown():
    pod = parse_pod({"id": "abc", "name": "moe-fleet-3", "desiredStatus": "RUNNING", "costPerHr": "a lot",
                     "gpuCount": 1.5, "runtime": "junk"})
    assert (pod.instance_id, pod.label, pod.status) == ("abc", "moe-fleet-3", "loading")
    assert pod.usd_per_hour is None and pod.num_gpus == 0  # unknown, never a price of 0
    assert sorted(pod.problems) == ["costPerHr is 'a lot' (a string), not a number",
                                    "gpuCount is 1.5, not a whole number", "runtime is 'junk', not an object"]
    with pytest.raises(MalformedResponse, match="without an id"):
        parse_pod({"id": 17, "desiredStatus": "RUNNING"})


def test_one_unreadable_pod_neither_hides_nor_stops_the_others(runpod, fake):
    kept, broken, nameless = (_rent(runpod) for _ in range(3))

    def mangle(data):
        for pod in (data.get("myself") or {}).get("pods") or []:
            if pod["id"] == broken:
                pod["costPerHr"] = "0.44"
            elif pod["id"] == nameless:
                pod["id"] = None
        return data

    fake.corrupt_answers(mangle)
    listed = runpod.list_instances()
    assert {p.instance_id for p in listed} == {kept, broken} and listed.unreadable == 1
    (odd,) = [p for p in listed if p.instance_id == broken]
    assert odd.usd_per_hour is None and odd.label == "moe-fleet-17" and "costPerHr" in odd.problems[0]


def test_it_terminates_a_pod_whose_listing_it_cannot_read(runpod, fake):
    pod_id = _rent(runpod)

    def mangle(data):
        if isinstance(data.get("pod"), dict):
            data["pod"]["id"] = 12  # not the string RunPod's schema promises
        return data

    fake.corrupt_answers(mangle)
    assert runpod.destroy(pod_id) is True
    assert fake.count("podTerminate") == 1 and pod_id not in fake.pods


def test_a_port_asked_the_vast_ai_way_is_opened_on_the_pod_and_not_sent_as_a_variable(runpod, fake):
    pod_id = runpod.rent(RentRequest(offer_id=H200_SECURE, image="vllm/vllm-openai:v0.26.0", disk_gb=250,
                                     label="moe-fleet-18", env={"-p 8011:8011": "1", "FLEET_TOKEN": "t"}))
    sent = fake.deploy_inputs[-1]
    assert sent["ports"] == "22/tcp,8000/tcp,8011/tcp"
    assert sent["env"] == [{"key": "FLEET_TOKEN", "value": "t"}]
    fake.advance()
    assert set(runpod.get_instance(pod_id).ports) == {"22/tcp", "8000/tcp", "8011/tcp"}
