"""Renting, syncing and destroying instances on the simulated marketplace over HTTP, and what a crash leaves."""

import json
from datetime import timedelta
from decimal import Decimal

import pytest

from fleet import actions
from fleet.instances import charges
from fleet.instances import ledger
from fleet.models import Alert, Instance, Offer
from fleet.offers.refresh import refresh_offers
from fleet.providers.registry import get_provider
from fleet.providers.records import RentRequest

from .conftest import sim_now

pytestmark = pytest.mark.django_db
State = Instance.State


def _cheap_offer(**filters) -> Offer:
    """The cheapest on-demand offer whose driver runs the worker image (CUDA 12.8), unless told otherwise."""
    filters.setdefault("cuda_max__gte", 12.8)
    return Offer.objects.filter(available=True, is_bid=False, disk_gb__gte=100, **filters).order_by(
        "total_usd_per_hour").first()


def _provider_instances(label=None):
    with get_provider() as provider:
        listed = provider.list_instances()
    return [i for i in listed if label is None or i.label == label]


@pytest.fixture
def offer(frozen_market):
    refresh_offers()
    return _cheap_offer()


def _rent(offer, market, key="k1"):
    instance, created = actions.request_rent(offer=offer, idempotency_key=key, disk_gb=100, now=sim_now(market))
    return actions.rent(instance.pk, now=sim_now(market))


def test_it_rents_syncs_through_every_state_and_destroys(offer, frozen_market):
    instance, _ = actions.request_rent(offer=offer, idempotency_key="a", disk_gb=100, now=sim_now(frozen_market))
    assert instance.state == State.REQUESTED and instance.label == f"moe-fleet-{instance.pk}"
    instance = actions.rent(instance.pk, now=sim_now(frozen_market))
    assert instance.state == State.PROVISIONING and instance.provider_instance_id
    assert [i.label for i in _provider_instances(instance.label)] == [instance.label]

    frozen_market.advance(120)
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.RUNNING and instance.provider_status == "running"

    instance = actions.destroy(instance, reason="test done", now=sim_now(frozen_market))
    assert instance.state == State.STOPPING  # until a sync sees it gone
    report = actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.DESTROYED and report.destroyed == [instance.label]
    assert _provider_instances(instance.label) == []
    assert actions.destroy(instance, reason="again").state == State.DESTROYED  # a no-op
    kinds = list(instance.events.order_by("at", "id").values_list("kind", flat=True))
    assert kinds[:2] == ["requested", "rented"] and "destroying" in kinds and kinds[-1] == "destroyed"


def test_it_rents_once_when_the_task_is_retried(offer, frozen_market):
    first, created = actions.request_rent(offer=offer, idempotency_key="same", disk_gb=100)
    again, created_again = actions.request_rent(offer=offer, idempotency_key="same", disk_gb=100)
    assert created and not created_again and first.pk == again.pk
    actions.rent(first.pk)
    actions.rent(first.pk)  # the retried task
    assert len(_provider_instances(first.label)) == 1


def test_it_leaves_no_orphan_when_the_worker_dies_before_the_call(offer, frozen_market, settings):
    instance, _ = actions.request_rent(offer=offer, idempotency_key="dies", disk_gb=100)
    # The worker claimed the row and died before calling the provider.
    Instance.objects.filter(pk=instance.pk).update(rent_attempted_at=sim_now(frozen_market))
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.REQUESTED  # within the grace the rent may still show up
    actions.sync(now=sim_now(frozen_market) + timedelta(seconds=settings.RENT_OUTCOME_GRACE_S))
    instance.refresh_from_db()
    assert instance.state == State.FAILED and "Never rented" in instance.events.first().message
    assert _provider_instances() == []


def test_a_rent_made_late_in_a_long_pass_gets_its_whole_grace_from_its_answer(offer, frozen_market, settings):
    """A pass that rents several boxes under one `now` (or waits out a 429 first) calls a later rent long after that
    `now`: the grace for its machine to be listed runs from its own answer, so it is not "never rented" at once and
    the machine it made is not destroyed on arrival."""
    from django.utils import timezone

    instance, _ = actions.request_rent(offer=offer, idempotency_key="late-in-pass", disk_gb=100)
    pass_start = timezone.now() - timedelta(seconds=settings.RENT_OUTCOME_GRACE_S + 60)
    frozen_market.inject_faults(http_5xx=1, path_contains="/asks/")  # the rent's answer is lost
    actions.rent(instance.pk, now=pass_start)
    actions.sync(now=timezone.now())
    instance.refresh_from_db()
    assert instance.state == State.REQUESTED and instance.events.filter(kind="rent-unknown").exists()
    actions.sync(now=timezone.now() + timedelta(seconds=settings.RENT_OUTCOME_GRACE_S))
    instance.refresh_from_db()
    assert instance.state == State.FAILED and "Never rented" in instance.events.first().message


def test_a_refused_rent_whose_error_text_holds_nul_ends_failed_with_its_reason(offer, frozen_market, monkeypatch):
    """A marketplace's error text goes into the row's reason, its event and its alert: with a NUL in it (which
    PostgreSQL's text refuses) the row must still end failed with the reason, not stay requested without one."""
    from fleet.providers.errors import RequestRefused
    from fleet.providers.vast import VastClient

    def refuse(self, request):
        raise RequestRefused("vast.ai PUT /asks/1/: HTTP 400: invalid\u0000 args")

    monkeypatch.setattr(VastClient, "rent", refuse)
    instance, _ = actions.request_rent(offer=offer, idempotency_key="nul", disk_gb=100)
    actions.rent(instance.pk)
    instance.refresh_from_db()
    assert instance.state == State.FAILED and "invalid  args" in instance.failure_reason
    assert Alert.objects.filter(instance=instance, message__contains="invalid  args").exists()


def test_a_destroy_that_loses_the_race_to_a_rent_still_stops_the_box(offer, frozen_market, monkeypatch):
    """A person's destroy reads the row as never rented; the rent task claims it before the cancel lands. The destroy
    must stop the row as a rented one (its machine destroyed when it shows up), not drop it and say "Destroying"."""
    instance, _ = actions.request_rent(offer=offer, idempotency_key="race", disk_gb=100)
    read_before_the_claim = actions._never_rented
    monkeypatch.setattr(actions, "_never_rented", lambda row: True)  # what the destroy saw
    Instance.objects.filter(pk=instance.pk).update(rent_attempted_at=sim_now(frozen_market))  # the rent's claim
    actions.request_destroy(instance, reason="not needed")
    monkeypatch.setattr(actions, "_never_rented", read_before_the_claim)
    instance.refresh_from_db()
    assert instance.state == State.STOPPING and instance.destroy_reason == "not needed"
    with get_provider() as provider:  # the rent's call made its machine after all
        provider.rent(RentRequest(offer_id=offer.offer_id, image="img", disk_gb=100, label=instance.label, env={}))
    actions.sync(now=sim_now(frozen_market))
    actions.sync(now=sim_now(frozen_market))
    assert _provider_instances(instance.label) == []  # destroyed on arrival: nothing bills


def test_it_adopts_a_rent_whose_answer_was_lost(offer, frozen_market):
    instance, _ = actions.request_rent(offer=offer, idempotency_key="lost", disk_gb=100)
    Instance.objects.filter(pk=instance.pk).update(rent_attempted_at=sim_now(frozen_market))
    with get_provider() as provider:  # the provider rented, then the worker died before saving the answer
        provider_id = provider.rent(RentRequest(offer_id=offer.offer_id, image="img", disk_gb=100,
                                                label=instance.label, env={}))
    report = actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert report.adopted == [instance.label]
    assert instance.provider_instance_id == provider_id and instance.state == State.PROVISIONING
    assert instance.cost_segments.filter(ended_at=None).exists()  # it bills, so the ledger counts it


def test_it_adopts_and_reports_an_unknown_machine_with_our_label(offer, frozen_market):
    with get_provider() as provider:
        provider_id = provider.rent(RentRequest(offer_id=offer.offer_id, image="img", disk_gb=100,
                                                label="moe-fleet-9999", env={}))
    actions.sync(now=sim_now(frozen_market))
    adopted = Instance.objects.get(provider_instance_id=provider_id)
    assert adopted.purpose == "adopted" and adopted.is_live
    assert Alert.objects.filter(kind=Alert.Kind.INSTANCE_ADOPTED, instance=adopted).exists()
    # a machine without our label is someone else's: left alone
    other = _cheap_offer(gpu_name__contains="H200")
    with get_provider() as provider:
        provider.rent(RentRequest(offer_id=other.offer_id, image="img", disk_gb=100, label="not-ours", env={}))
    actions.sync(now=sim_now(frozen_market))
    assert Instance.objects.count() == 1


def test_it_destroys_a_machine_whose_rent_was_given_up_on(offer, frozen_market, settings):
    instance, _ = actions.request_rent(offer=offer, idempotency_key="late", disk_gb=100)
    Instance.objects.filter(pk=instance.pk).update(rent_attempted_at=sim_now(frozen_market))
    actions.sync(now=sim_now(frozen_market) + timedelta(seconds=settings.RENT_OUTCOME_GRACE_S + 1))
    instance.refresh_from_db()
    assert instance.state == State.FAILED
    with get_provider() as provider:  # ...and then it shows up after all
        provider.rent(RentRequest(offer_id=offer.offer_id, image="img", disk_gb=100, label=instance.label, env={}))
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.STOPPING
    actions.sync(now=sim_now(frozen_market))
    assert _provider_instances(instance.label) == []


def test_it_tears_down_a_host_that_died(offer, frozen_market):
    instance = _rent(offer, frozen_market)
    frozen_market.advance(120)
    actions.sync(now=sim_now(frozen_market))
    frozen_market.kill_host(int(instance.provider_instance_id))
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.STOPPING and "exited on its own" in instance.failure_reason
    assert Alert.objects.filter(kind=Alert.Kind.INSTANCE_FAILED, instance=instance).count() == 1
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.DESTROYED


def test_it_marks_an_instance_the_provider_lost_as_failed(offer, frozen_market, settings):
    instance = _rent(offer, frozen_market)
    frozen_market.kill_host(int(instance.provider_instance_id), vanish_after_s=0)
    frozen_market.advance(1)
    actions.sync(now=sim_now(frozen_market))  # rented a second ago: a list without it may just be late
    instance.refresh_from_db()
    assert instance.state == State.PROVISIONING
    frozen_market.advance(settings.RENT_OUTCOME_GRACE_S)
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.FAILED and "no longer lists it" in instance.failure_reason
    assert not instance.cost_segments.filter(ended_at=None).exists()


def _rent_on_an_old_driver(market, key):
    """A CUDA 12.8 image on a host whose driver is older: its CUDA init will fail with error 803."""
    refresh_offers()
    old = _cheap_offer(cuda_max__lt=12.8, cuda_max__gte=0)
    instance, _ = actions.request_rent(offer=old, idempotency_key=key, disk_gb=100,
                                       image="ghcr.io/example/worker:cuda12.8")
    actions.rent(instance.pk, now=sim_now(market))
    return instance


def test_it_destroys_a_host_whose_driver_is_too_old(frozen_market):
    instance = _rent_on_an_old_driver(frozen_market, "old")
    frozen_market.advance(120)
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert "803" in instance.failure_reason and instance.state == State.STOPPING


def test_it_keeps_a_failed_instance_for_debugging_until_the_time_passes(frozen_market):
    instance = _rent_on_an_old_driver(frozen_market, "keep")
    actions.keep_for_debugging(instance, 2, now=sim_now(frozen_market))
    frozen_market.advance(120)
    actions.sync(now=sim_now(frozen_market))  # CUDA error 803: failed, but kept
    instance.refresh_from_db()
    assert "803" in instance.failure_reason and instance.state == State.RUNNING
    assert "kept for debugging until" in instance.events.first().message
    frozen_market.advance(3600)
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.RUNNING  # an hour in: still kept
    frozen_market.advance(3600)
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.STOPPING
    assert instance.destroy_reason.startswith("keep-for-debugging expired")
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.DESTROYED


def test_it_retries_a_destroy_the_provider_did_not_carry_out(offer, frozen_market, settings):
    instance = _rent(offer, frozen_market)
    frozen_market.inject_faults(http_5xx=3, status_5xx=503, path_contains=f"/instances/{instance.provider_instance_id}")
    instance = actions.destroy(instance, reason="done", now=sim_now(frozen_market))
    assert instance.state == State.STOPPING
    assert instance.events.first().kind == "destroy-error"
    actions.sync(now=sim_now(frozen_market) + timedelta(seconds=settings.DESTROY_VERIFY_S))
    assert Alert.objects.filter(kind=Alert.Kind.DESTROY_UNCONFIRMED, instance=instance).exists()
    instance.refresh_from_db()
    assert instance.destroy_attempts == 2
    actions.sync(now=sim_now(frozen_market) + timedelta(seconds=settings.DESTROY_VERIFY_S + 1))
    instance.refresh_from_db()
    assert instance.state == State.DESTROYED


def test_it_accrues_cost_per_second_like_the_market_bills(offer, frozen_market):
    instance = _rent(offer, frozen_market)
    for _ in range(2):  # the beat's syncs see it loading (storage only), then running at the 90 s boot's end
        frozen_market.advance(45)
        actions.sync(now=sim_now(frozen_market))
    frozen_market.advance(1710)
    now = sim_now(frozen_market)
    actions.sync(now=now)
    instance.refresh_from_db()
    frozen_market.report_traffic(int(instance.provider_instance_id), upload_gb=7, download_gb=67)
    charges.reconcile(now=now)
    instance.refresh_from_db()
    # Worked by hand: half an hour of the 100 GB disk, 1,710 s of the GPU (from "running" on, as vast.ai bills it),
    # plus 7 GB up and 67 GB down at the offer's own $/GB.
    expected_traffic = Decimal(7) * offer.inet_up_usd_per_gb + Decimal(67) * offer.inet_down_usd_per_gb
    assert instance.traffic_usd == pytest.approx(expected_traffic, abs=Decimal("0.000002"))
    ours = ledger.instance_cost(instance, now)
    disk_usd_per_hour = offer.storage_usd_per_gb_month * 100 / 720
    gpu_usd_per_hour = instance.usd_per_hour - disk_usd_per_hour
    expected = disk_usd_per_hour / 2 + gpu_usd_per_hour * 1710 / 3600 + expected_traffic
    assert ours == pytest.approx(expected, abs=Decimal("0.0001"))
    assert ours == pytest.approx(instance.provider_charged_usd, abs=Decimal("0.001"))
    actions.destroy(instance, reason="done", now=now)
    actions.sync(now=now + timedelta(seconds=5))
    assert ledger.instance_cost(instance, now + timedelta(hours=5)) == pytest.approx(ours, abs=Decimal("0.0001"))


def test_it_sums_the_account_spend_this_hour_and_today(offer, frozen_market):
    now = sim_now(frozen_market)
    first = _rent(offer, frozen_market, key="one")
    second = _rent(_cheap_offer(gpu_name__contains="H200"), frozen_market, key="two")
    later = now + timedelta(minutes=10)
    spend = ledger.account_cost(later)
    rate = first.usd_per_hour + second.usd_per_hour
    assert spend.burn_usd_per_hour == rate
    hour_start = later.replace(minute=0, second=0, microsecond=0)
    billed_this_hour = (later - max(now, hour_start)).total_seconds()
    assert spend.this_hour_usd == pytest.approx(rate * Decimal(billed_this_hour) / 3600, abs=Decimal("0.0001"))
    assert spend.today_usd >= spend.this_hour_usd


def test_it_fails_without_destroying_when_the_provider_refuses_the_rent(offer, frozen_market):
    instance, _ = actions.request_rent(offer=offer, idempotency_key="big", disk_gb=int(offer.disk_gb) + 1000)
    instance = actions.rent(instance.pk)
    assert instance.state == State.FAILED and "nothing was rented" in instance.failure_reason
    assert instance.destroy_reason == "" and _provider_instances() == []
    assert Alert.objects.filter(kind=Alert.Kind.INSTANCE_FAILED, instance=instance).count() == 1


def test_a_refused_rent_that_echoes_its_request_keeps_the_boxs_secrets_out_of_the_row_and_alerts(
        offer, frozen_market, monkeypatch):
    from fleet.providers.errors import RequestRefused
    from fleet.providers.vast import VastClient

    def echoing(self, request):  # as vast.ai's "Invalid args: ..." messages quote what they were sent
        raise RequestRefused(f"vast.ai refused the rent: Invalid args: {request.env}")

    monkeypatch.setattr(VastClient, "rent", echoing)
    instance, _ = actions.request_rent(offer=offer, idempotency_key="echo", disk_gb=100)
    token = "run_1.abcdef0123456789:signature-of-the-box"
    instance = actions.rent(instance.pk, env={"FLEET_AGENT_TOKEN": token, "FLEET_HEARTBEAT_S": "15"})
    assert instance.state == State.FAILED and "Invalid args" in instance.failure_reason
    assert token not in instance.failure_reason and "[redacted]" in instance.failure_reason
    assert not Alert.objects.filter(message__contains=token).exists()
    assert not instance.events.filter(message__contains=token).exists()


@pytest.mark.parametrize("echo", [
    lambda env: json.dumps({"input": {"env": env}}),  # a GraphQL "got invalid value" quotes its input as JSON
    lambda env: repr(env),
    lambda env: json.dumps(env)[:150],  # cut short by the client, inside a value
])
def test_no_form_of_a_boxs_environment_survives_in_a_refused_rents_message(offer, frozen_market, monkeypatch, echo):
    from fleet.providers.errors import RequestRefused
    from fleet.providers.vast import VastClient

    signed = 'https://store.example/a?X-Amz-Signature=0123456789abcdef0123456789abcdef&X-Amz-Expires=600'
    env = {"FLEET_ADAPTER_0": json.dumps({"grant": {"files": {"adapter_model.safetensors": signed}}})[:200]}

    def echoing(self, request):
        raise RequestRefused(f"refused: {echo(request.env)}")

    monkeypatch.setattr(VastClient, "rent", echoing)
    instance, _ = actions.request_rent(offer=offer, idempotency_key="echo-json", disk_gb=100)
    instance = actions.rent(instance.pk, env=env)
    assert instance.state == State.FAILED and "refused" in instance.failure_reason
    assert "X-Amz-Signature" not in instance.failure_reason and "0123456789abcdef" not in instance.failure_reason


def test_it_never_replaces_a_box_onto_a_host_that_cannot_run_its_image(frozen_market, settings):
    # The worker image is built for CUDA 13.0. The default filters (12.8) would take a cheaper 12.8 host, which
    # rents fine and then fails CUDA init with error 803; no 13.0 host passes the rest of the defaults here.
    settings.WORKER_IMAGE, settings.WORKER_IMAGE_CUDA = "ghcr.io/moe-fleet/worker:0.1.0-cuda13.0", "13.0"
    settings.WORKER_IMAGE_MIN_DRIVER = "580"
    refresh_offers()
    assert _cheap_offer().cuda_max < 13.0
    old = _rent(_cheap_offer(cuda_max__gte=13.0), frozen_market)
    assert actions.replace(old, reason="GPU not responding for 7 min", now=sim_now(frozen_market)) is None
    assert not Instance.objects.filter(replaces=old).exists()
    assert old.events.filter(kind="replace-failed", message__contains="no offer passes the filters").exists()
    assert Alert.objects.filter(kind=Alert.Kind.INSTANCE_FAILED, instance=old).exists()


def test_it_records_a_rent_of_an_offer_with_a_long_id(offer, frozen_market):
    # RunPod's offer ids name the GPU type and cloud: "NVIDIA RTX PRO 6000 Blackwell Server Edition:SECURE:1".
    long_id = "NVIDIA RTX PRO 6000 Blackwell Server Edition:SECURE:1"
    Offer.objects.filter(pk=offer.pk).update(offer_id=long_id)
    offer.refresh_from_db()
    instance, created = actions.request_rent(offer=offer, idempotency_key="long", disk_gb=100,
                                             now=sim_now(frozen_market))
    assert created and Instance.objects.get(pk=instance.pk).offer_id == long_id
