"""The admin shows the fleet, its runs and the work schedule, and changes none of them: an edit there would skip the
checks the product's pages make (a keep_until past the reaper's caps, a run's bucket, budget or recipe, a paused
reaper). Its actions (rent, destroy) lead to the same confirmations and permission checks as the pages."""

from decimal import Decimal

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule

from fleet.models import Alert, Instance, Offer, OfferProfile, OfferRefresh, ThroughputCalibration
from fleet.ranking import OfferFilters, Workload
from runs.models import Checkpoint, Evaluation, Run

pytestmark = pytest.mark.django_db
GUARDED_APPS = ("fleet", "runs", "django_celery_beat")


def _offer() -> Offer:
    return Offer.objects.create(
        provider="vast", offer_id="100", gpu_name="H200", num_gpus=1, gpu_ram_gb=141.0, compute_capability=90,
        cuda_max=12.8, disk_gb=250.0, inet_up_mbps=200.0, inet_down_mbps=250.0, inet_up_usd_per_gb=Decimal("0.01"),
        inet_down_usd_per_gb=Decimal("0.01"), storage_usd_per_gb_month=Decimal("0.1"),
        gpu_usd_per_hour=Decimal("2.4"), total_usd_per_hour=Decimal("2.5"), reliability=0.99, verified=True,
        rentable=True, is_bid=False, first_seen_at=timezone.now(), last_seen_at=timezone.now())


def _instance() -> Instance:
    return Instance.objects.create(provider="vast", idempotency_key="k1", label="moe-fleet-1", state="running",
                                   provider_instance_id="77", offer_id="100", gpu_name="H200", image="img",
                                   disk_gb=250, requested_at=timezone.now(), usd_per_hour=Decimal("2.5"))


def _run() -> Run:
    return Run.objects.create(name="tiny", recipe={"phases": []}, bucket="s3://fleet/runs/tiny",
                              budget_usd=Decimal("50"), max_restarts=3, token_nonce="n", state="training",
                              created_at=timezone.now())


def _interval() -> IntervalSchedule:
    return IntervalSchedule.objects.create(every=60, period=IntervalSchedule.SECONDS)


MAKERS = {
    Offer: _offer,
    Instance: _instance,
    OfferRefresh: lambda: OfferRefresh.objects.create(provider="vast", started_at=timezone.now()),
    OfferProfile: lambda: OfferProfile.objects.create(name="h200", recipe=Workload().to_dict(),
                                                      filters=OfferFilters().to_dict()),
    ThroughputCalibration: lambda: ThroughputCalibration.objects.create(gpu_model="H200", kernel_path="triton",
                                                                        model_tflops=300.0, weight=1.0),
    Alert: lambda: Alert.objects.create(kind="instance.rented", message="rented", created_at=timezone.now()),
    Run: _run,
    Checkpoint: lambda: Checkpoint.objects.create(run=_run(), phase=0, step=10, uri="s3://fleet/runs/tiny/c10",
                                                  complete=True, created_at=timezone.now()),
    Evaluation: lambda: Evaluation.objects.create(run=_run(), number=0, phase=5, settings={"scorer": "exact"},
                                                  samples_expected=4, created_at=timezone.now()),
    PeriodicTask: lambda: PeriodicTask.objects.create(name="reap-instances", task="fleet.tasks.reap_instances",
                                                      interval=_interval()),
    IntervalSchedule: _interval,
    CrontabSchedule: lambda: CrontabSchedule.objects.create(),
    SolarSchedule: lambda: SolarSchedule.objects.create(event="sunrise", latitude=0, longitude=0),
    ClockedSchedule: lambda: ClockedSchedule.objects.create(clocked_time=timezone.now()),
}
REGISTERED = sorted((m for m in admin.site._registry if m._meta.app_label in GUARDED_APPS), key=str)


def _url(model, view, *args):
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def test_it_considers_every_model_the_admin_shows():
    assert set(REGISTERED) == set(MAKERS)


@pytest.mark.parametrize("model", REGISTERED, ids=lambda m: m._meta.label)
def test_it_adds_changes_and_deletes_nothing(client, operator, model):
    obj = MAKERS[model]()
    client.force_login(operator)
    assert client.get(_url(model, "changelist")).status_code == 200
    page = client.get(_url(model, "change", obj.pk))
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.post(_url(model, "change", obj.pk), {}).status_code == 403
    assert client.get(_url(model, "add")).status_code == 403
    assert client.post(_url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    assert model.objects.filter(pk=obj.pk).exists()
    changelist = client.post(_url(model, "changelist"), {"action": "delete_selected", "_selected_action": [obj.pk],
                                                         "post": "yes"})
    assert changelist.status_code in (200, 302) and model.objects.filter(pk=obj.pk).exists()


def test_it_keeps_an_instance_only_as_long_as_its_page_allows(client, operator):
    instance = _instance()
    client.force_login(operator)
    response = client.post(_url(Instance, "change", instance.pk), {"keep_until_0": "2099-01-01",
                                                                   "keep_until_1": "00:00:00"})
    assert response.status_code == 403
    instance.refresh_from_db()
    assert instance.keep_until is None


def test_it_leaves_a_runs_bucket_budget_restarts_and_recipe_to_the_runs_pages(client, operator):
    run = _run()
    client.force_login(operator)
    response = client.post(_url(Run, "change", run.pk), {
        "name": "tiny", "recipe": '{"phases": [{"kind": "grpo", "reward": "os:system"}]}',
        "bucket": "s3://someone-else/", "budget_usd": "100000", "max_restarts": "50", "restarts": "0"})
    assert response.status_code == 403
    run.refresh_from_db()
    assert (run.bucket, run.budget_usd, run.max_restarts, run.recipe) == ("s3://fleet/runs/tiny", Decimal("50"), 3,
                                                                         {"phases": []})


def test_it_never_pauses_or_runs_the_schedule_from_the_admin(client, operator):
    task = MAKERS[PeriodicTask]()
    client.force_login(operator)
    page = client.get(_url(PeriodicTask, "changelist")).content.decode()
    for action in ("enable_tasks", "disable_tasks", "toggle_tasks", "run_tasks"):
        assert f'value="{action}"' not in page
    client.post(_url(PeriodicTask, "changelist"), {"action": "disable_tasks", "_selected_action": [task.pk]})
    task.refresh_from_db()
    assert task.enabled


def test_it_still_offers_rent_and_destroy_through_their_checks(client, operator):
    MAKERS[Offer]()
    _instance()
    client.force_login(operator)
    assert 'value="rent"' in client.get(_url(Offer, "changelist")).content.decode()
    assert 'value="destroy"' in client.get(_url(Instance, "changelist")).content.decode()


def test_an_offer_id_holding_query_characters_reaches_the_rent_page_whole(client, operator):
    # RunPod's offer ids embed its GPU type id, which may hold + & # =: the Rent links must encode them.
    offer = _offer()
    offer.provider, offer.offer_id = "runpod", "NVIDIA A+B&bid=1#x:SECURE:1"
    offer.save()
    client.force_login(operator)
    answer = client.post(reverse("admin:fleet_offer_changelist"), {"action": "rent", "_selected_action": [offer.pk]})
    page = client.get(answer["Location"])
    assert page.status_code == 200 and "NVIDIA A+B&amp;bid=1#x:SECURE:1" in page.content.decode()


def test_a_destroy_the_queue_cannot_take_is_said_not_a_server_error(client, operator, monkeypatch):
    from fleet import enqueue

    def unreachable(*args):
        raise enqueue.QueueUnavailable("fleet.tasks.destroy_instance was not queued: the task queue is unreachable.")

    monkeypatch.setattr(enqueue, "destroy_instance", unreachable)
    box = _instance()
    client.force_login(operator)
    answer = client.post(reverse("admin:fleet_instance_changelist"),
                         {"action": "destroy", "_selected_action": [box.pk], "confirmed": "yes"}, follow=True)
    assert answer.status_code == 200
    assert ("Destroying, but the task queue cannot be reached right now, so the next instance sync sends the destroy: "
            f"{box.label}") in answer.content.decode()
    box.refresh_from_db()
    assert box.state == Instance.State.STOPPING  # recorded, for the sync to send
