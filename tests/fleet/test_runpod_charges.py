"""RunPod's per-pod billing (REST API v2, GET /v2/billing/pods) read by the product's client from the stand-in over
HTTP, its documented answer shape parsed strictly, and reconciled into the ledger as vast.ai's charges are."""

from decimal import Decimal

import pytest

from fleet import actions, tasks
from fleet.models import Offer
from fleet.offers.refresh import refresh_offers
from fleet.providers.errors import AuthenticationFailed, MalformedResponse
from fleet.providers.records import RentRequest
from fleet.providers.runpod import RunPodClient
from fleet.providers.runpod_billing import parse_billing

from .runpod_server import RUNPOD_KEY, FakeRunPod

# The answer RunPod's API v2 reference gives as its example for GET /v2/billing/pods.
DOCUMENTED = {
    "records": [{"startTime": "2026-06-01T00:00:00Z", "endTime": "2026-06-02T00:00:00Z", "podId": "7h9k2m4n6p",
                 "totalAmount": 12.34, "gpuAmount": 11.1, "cpuAmount": 0, "diskAmount": 1.24}],
    "metadata": {"query": {"startTime": "2026-06-01T00:00:00Z", "endTime": "2026-06-02T00:00:00Z",
                           "bucketSize": "day", "podId": "7h9k2m4n6p"},
                 "recordCount": 1, "totals": {"totalAmount": 12.34, "gpuAmount": 11.1, "cpuAmount": 0,
                                              "diskAmount": 1.24}, "uniquePodCount": 1},
}


@pytest.fixture
def fake():
    server = FakeRunPod(boot_polls=None).start()
    yield server
    server.stop()


def _rent(client: RunPodClient, label: str) -> str:
    return client.rent(RentRequest(offer_id="NVIDIA H200:SECURE:1", image="ghcr.io/example/worker:cuda12.8",
                                   disk_gb=100, label=label, env={}))


def test_it_reads_the_documented_answer_as_gpu_cpu_and_disk_lines():
    report = parse_billing(DOCUMENTED)
    assert {(line.instance_id, line.kind, line.amount_usd) for line in report} == {
        ("7h9k2m4n6p", "gpu", Decimal("11.1")), ("7h9k2m4n6p", "cpu", Decimal("0")),
        ("7h9k2m4n6p", "disk", Decimal("1.24"))}
    assert sum(line.amount_usd for line in report) == Decimal("12.34")
    assert report.unreadable == {} and report.skipped == []


def test_a_record_it_cannot_read_holds_back_that_pod_only():
    good = dict(DOCUMENTED["records"][0], podId="good")
    wrong_total = dict(good, podId="bad", totalAmount=99.0)
    bad_time = dict(good, podId="bad", startTime="yesterday")
    report = parse_billing({"records": [good, wrong_total, dict(good, podId="bad"), bad_time],
                            "metadata": {"recordCount": 4}})
    assert {line.instance_id for line in report} == {"good"}  # none of bad's lines, not even its readable one
    assert set(report.unreadable) == {"bad"} and "totalAmount" in report.unreadable["bad"]
    assert len(report.skipped) == 2


@pytest.mark.parametrize("body", [[], {"records": None}, {"records": [], "metadata": {"recordCount": 3}}])
def test_an_answer_that_cannot_be_read_whole_is_refused(body):
    with pytest.raises(MalformedResponse):
        parse_billing(body)


def test_the_client_reads_each_pods_billing_terminated_ones_too(fake):
    with RunPodClient(fake.base_url, RUNPOD_KEY, max_retries=1, timeout_s=5) as client:
        running, gone = _rent(client, "moe-fleet-1"), _rent(client, "moe-fleet-2")
        fake.advance()
        fake.elapse(2)
        client.destroy(gone)
        fake.elapse(1)
        report = client.charges()
    by_pod: dict[str, dict[str, Decimal]] = {}
    for line in report:
        by_pod.setdefault(line.instance_id, {})[line.kind] = line.amount_usd
    assert by_pod[running]["gpu"] == Decimal("11.97")  # 3 h at $3.99
    assert by_pod[gone]["gpu"] == Decimal("7.98")  # its 2 h before the terminate still billed
    # its 100 GB container disk at RunPod's $0.10/GB-month while running, no volume
    assert by_pod[running]["disk"] == Decimal(str(round(100 * 0.10 / 730 * 3, 6)))
    assert fake.count("podTerminate") == 1


def test_a_refused_key_is_said_as_such(fake):
    with RunPodClient(fake.base_url, "wrong", max_retries=0, timeout_s=5) as client, pytest.raises(
            AuthenticationFailed, match="RUNPOD_API_KEY"):
        client.charges()


@pytest.mark.django_db
def test_the_reconcile_task_stores_what_runpod_billed_each_pod(runpod_market, settings):
    settings.VAST_API_KEY = ""
    refresh_offers("runpod")
    offer = Offer.objects.get(provider="runpod", offer_id="NVIDIA H200:SECURE:1", is_bid=False)
    instance, _ = actions.request_rent(offer=offer, idempotency_key="rp-charges", disk_gb=100)
    instance = actions.rent(instance.pk)
    runpod_market.advance()
    runpod_market.elapse(1.5)
    assert tasks.reconcile_charges() == {"runpod": 1}
    instance.refresh_from_db()
    expected = Decimal("3.99") * Decimal("1.5") + Decimal(str(round(100 * 0.10 / 730 * 1.5, 6)))
    assert instance.provider_charged_usd == expected.quantize(Decimal("0.000001"))
    assert instance.traffic_usd == 0 and instance.charges_reconciled_at is not None


@pytest.mark.django_db
def test_one_providers_refused_billing_does_not_hold_back_the_others(runpod_market, market, settings):
    settings.RUNPOD_API_KEY = "a-key-runpod-refuses"
    results = tasks.reconcile_charges()
    assert results["vast"] == 0 and results["runpod"].startswith("AuthenticationFailed")
