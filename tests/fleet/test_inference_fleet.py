"""The inference fleet: the replica decision, replacements rented on the simulated marketplace once per key and
within the daily budget, and the Inference fleet page with its permission checks."""

from datetime import date, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet import actions, enqueue, tasks
from fleet.inference import replicas
from fleet.inference.replicas import ModelState, Rental, plan
from fleet.models import Alert, InferenceModel, Instance, Offer, ProbeResult
from fleet.offers.ranked import profile_settings, rank_stored_offers
from fleet.ranking import best_offer
from fleet.offers.refresh import refresh_offers
from fleet.providers.registry import get_provider

pytestmark = pytest.mark.django_db
State = Instance.State
DAY = date(2026, 7, 1)


# -- the decision ----------------------------------------------------------------------------------------------------


def _state(desired=2, live=0, today=0, budget=3):
    return ModelState(7, "m", desired, live, today, budget)


def test_it_plans_nothing_for_a_model_at_its_replicas():
    assert plan(_state(desired=2, live=2), DAY).rentals == ()
    assert plan(_state(desired=1, live=3), DAY).missing == 0


def test_it_plans_one_rental_per_missing_replica_with_keys_of_model_slot_day_and_count():
    decision = plan(_state(desired=3, live=1, today=1), DAY)
    assert decision.missing == 2 and decision.over_budget == 0
    assert decision.rentals == (Rental(2, 2, "inference-7-20260701-slot2-n2"),
                                Rental(3, 3, "inference-7-20260701-slot3-n3"))
    assert plan(_state(desired=3, live=1, today=1), DAY) == decision  # the same facts, the same keys


def test_it_stops_at_the_daily_budget():
    decision = plan(_state(desired=3, live=0, today=2, budget=3), DAY)
    assert len(decision.rentals) == 1 and decision.over_budget == 2
    assert "budget is spent" in decision.reason
    assert plan(_state(desired=1, live=0, today=3, budget=3), DAY).rentals == ()


def test_it_counts_failing_and_stopping_boxes_out():
    assert replicas.is_replica(State.RUNNING, 2, 3) and replicas.is_replica(State.REQUESTED, 0, 3)
    assert not replicas.is_replica(State.RUNNING, 3, 3) and not replicas.is_replica(State.STOPPING, 0, 3)


def test_it_picks_the_best_offer_off_the_machines_to_avoid():
    class Ranked:
        def __init__(self, offer_id, machine_id):
            self.provider, self.offer_id, self.machine_id = "vast", offer_id, machine_id

    ranked = [Ranked("a", "m1"), Ranked("b", "m1"), Ranked("c", "m2"), Ranked("d", "")]
    assert best_offer(ranked, set()).offer_id == "a"
    assert best_offer(ranked, {"m1"}).offer_id == "c"
    assert best_offer(ranked, {"m1", "m2"}).offer_id == "d"
    assert best_offer(ranked, set(), frozenset({("vast", "a")})).offer_id == "b"  # taken by this run already
    assert best_offer([], set()) is None


# -- acting on the simulated marketplace ------------------------------------------------------------------------------


@pytest.fixture
def offers(market):
    refresh_offers()
    assert Offer.objects.filter(available=True).exists()
    return market


@pytest.fixture
def model():
    return InferenceModel.objects.create(name="Qwen/Qwen3-30B-A3B", image="vllm/vllm-openai:v0.9.2", port=8000,
                                         desired_replicas=1, max_replacements_per_day=3)


def _provider_labels():
    with get_provider() as provider:
        return sorted(i.label for i in provider.list_instances())


def _replica(model, offer, **fields) -> Instance:
    now = timezone.now()
    fields.setdefault("requested_at", now - timedelta(days=2))
    return Instance.objects.create(
        provider="vast", idempotency_key=f"old-{Instance.objects.count()}", label="old", purpose="serving",
        offer_id=offer.offer_id, gpu_name=offer.gpu_name, image=model.image, disk_gb=250, serving_model=model,
        **fields)


def test_it_rents_a_missing_replica_once_however_often_the_task_runs(offers, model):
    first = tasks.maintain_inference_fleet()
    again = tasks.maintain_inference_fleet()
    replica = Instance.objects.get(serving_model=model)
    assert first[model.name]["rented"] == [replica.label] and again[model.name]["rented"] == []
    assert replica.purpose == "serving" and replica.image == model.image and replica.provider_instance_id
    assert replica.state == State.PROVISIONING and replica.requested_by is None
    assert replica.idempotency_key == f"inference-{model.pk}-{timezone.now():%Y%m%d}-slot1-n1"
    assert _provider_labels() == [replica.label]
    assert "Replica 1 of Qwen/Qwen3-30B-A3B" in replica.events.get(kind="inference-replica").message
    offers.advance(600)  # booted: the provider now reports the public port mapped to the model's port
    actions.sync()
    replica.refresh_from_db()
    assert replica.state == State.RUNNING and "8000/tcp" in replica.ports and replica.machine_id


def test_it_replaces_a_failing_replica_on_another_machine(offers, model):
    ranked = rank_stored_offers(*profile_settings(None)).entries
    best = Offer.objects.get(offer_id=ranked[0].offer.offer_id, is_bid=ranked[0].offer.is_bid)
    failing = _replica(model, best, state=State.RUNNING, consecutive_probe_failures=3, provider_instance_id="9001",
                       requested_at=timezone.now() - timedelta(hours=1))
    replicas.maintain()
    new = Instance.objects.exclude(pk=failing.pk).get(serving_model=model)
    assert new.replaces_id == failing.pk
    assert Offer.objects.get(offer_id=new.offer_id, is_bid=False).machine_id != best.machine_id


def test_a_rent_that_rented_nothing_puts_no_machine_on_the_avoid_list(offers, model):
    ranked = rank_stored_offers(*profile_settings(None)).entries
    best = Offer.objects.get(offer_id=ranked[0].offer.offer_id, is_bid=ranked[0].offer.is_bid)
    _replica(model, best, state=State.FAILED, requested_at=timezone.now() - timedelta(hours=1),
             failure_reason="Rent failed, nothing was rented: vast.ai GET /asks/: rate limited (HTTP 429).")
    assert replicas.machines_to_avoid(model, timezone.now()) == set()
    rented = _replica(model, best, state=State.FAILED, provider_instance_id="9002", machine_id=best.machine_id,
                      failure_reason="The host exited on its own")
    assert replicas.machines_to_avoid(model, rented.requested_at + timedelta(hours=1)) == {best.machine_id}


def test_it_stops_at_the_budget_and_alerts_once(offers, model):
    model.desired_replicas, model.max_replacements_per_day = 3, 2
    model.save()
    replicas.maintain()
    replicas.maintain()
    assert Instance.objects.filter(serving_model=model).count() == 2
    alerts = Alert.objects.filter(kind=Alert.Kind.SPEND_CAP_HIT, message__contains=model.name)
    assert alerts.count() == 1 and "replacement budget is spent (2 of 2 rented today)" in alerts.get().message
    assert len(_provider_labels()) == 2


def test_it_counts_todays_failed_rents_against_the_budget(offers, model):
    offer = Offer.objects.filter(available=True).first()
    model.max_replacements_per_day = 1
    model.save()
    _replica(model, offer, state=State.FAILED, requested_at=timezone.now())
    report = replicas.maintain()
    assert report.models[0].rented == [] and report.models[0].over_budget == 1
    assert _provider_labels() == []


def test_it_rents_a_row_a_dead_task_wrote_but_never_rented(offers, model):
    best = rank_stored_offers(*profile_settings(None)).entries[0].offer
    offer = Offer.objects.get(offer_id=best.offer_id, is_bid=best.is_bid)

    row, _ = actions.request_rent(offer=offer, idempotency_key="written-then-died", purpose="serving",
                                  image=model.image)
    Instance.objects.filter(pk=row.pk).update(serving_model=model)
    replicas.maintain()
    row.refresh_from_db()
    assert row.provider_instance_id and Instance.objects.filter(serving_model=model).count() == 1


# -- the page -----------------------------------------------------------------------------------------------------


@pytest.fixture
def probed_box(model):
    now = timezone.now()
    box = Instance.objects.create(
        provider="vast", idempotency_key="probed", label="moe-fleet-probed", state=State.RUNNING, purpose="serving",
        offer_id="1", gpu_name="H100 SXM", image=model.image, disk_gb=250, requested_at=now, running_at=now,
        serving_model=model, public_ip="198.51.100.7", ports={"8000/tcp": 41234}, last_probe_at=now,
        last_probe_latency_ms=42.4, models_served=[model.name], consecutive_probe_failures=2)
    ProbeResult.objects.create(instance=box, at=now, ok=False, error="HTTP 500", status_code=500, latency_ms=12)
    ProbeResult.objects.create(instance=box, at=now - timedelta(seconds=30), ok=True, latency_ms=42.4,
                               models_served=[model.name])
    return box


def test_it_shows_models_boxes_and_their_last_probes(client, member, model, probed_box):
    model.created_by = member  # a user sees their own models (an operator every one)
    model.save(update_fields=["created_by"])
    client.force_login(member)
    page = client.get(reverse("inference")).content.decode()
    assert model.name in page and "1 live, 0 starting / 1 wanted" in page  # 2 failures in a row: live until 3
    assert "moe-fleet-probed" in page and "42 ms" in page and "HTTP 500" in page
    assert 'hx-get="/inference/"' in page and 'hx-trigger="every 5s"' in page
    assert 'name="desired_replicas"' not in page  # no form for a member
    fragment = client.get(reverse("inference"), HTTP_HX_REQUEST="true").content.decode()
    assert "moe-fleet-probed" in fragment and "<html" not in fragment


def test_it_lets_staff_with_the_permission_set_the_desired_replicas(client, staff, model, monkeypatch):
    monkeypatch.setattr(enqueue, "maintain_inference_fleet", lambda: None)
    client.force_login(staff)
    assert 'name="desired_replicas"' in client.get(reverse("inference")).content.decode()
    response = client.post(reverse("inference_replicas", args=[model.pk]), {"desired_replicas": "4"})
    assert response.status_code == 302
    model.refresh_from_db()
    assert model.desired_replicas == 4
    client.post(reverse("inference_replicas", args=[model.pk]), {"desired_replicas": "-1"})
    model.refresh_from_db()
    assert model.desired_replicas == 4


def test_it_forbids_members_and_staff_without_the_permission(client, member, model, django_user_model):
    client.force_login(member)
    assert client.post(reverse("inference_replicas", args=[model.pk]), {"desired_replicas": "5"}).status_code == 403
    plain_staff = django_user_model.objects.create_user("plain-staff", password="x-pass-123", is_staff=True)
    client.force_login(plain_staff)
    assert 'name="desired_replicas"' not in client.get(reverse("inference")).content.decode()
    assert client.post(reverse("inference_replicas", args=[model.pk]), {"desired_replicas": "5"}).status_code == 403
    model.refresh_from_db()
    assert model.desired_replicas == 1


def test_it_requires_csrf_to_set_replicas(staff, model):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.post(reverse("inference_replicas", args=[model.pk]), {"desired_replicas": "5"}).status_code == 403
