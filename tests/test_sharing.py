"""Per-user sharing (README, "Who sees what"): a run, its adapters, a data set and an inference model are their
owner's; another user gets the same 404 as for nothing, in lists too, and acts on none of them; an operator (the
fleet.operator permission) sees and acts on every one. A non-staff user sees only the boxes of their own work. Every
URL that names an object by its id is walked from the resolver, so a new one without the check fails here."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.urls import URLResolver, get_resolver, reverse
from django.utils import timezone

from fleet.models import Alert, InferenceModel, Instance
from runs.models import DataSet, DataSetName, Phase, Run, RunAttempt
from tests.fleet.test_serve_adapter import _finished_run, _serve_data
from tests.runs.seeding import seed_run

pytestmark = pytest.mark.django_db

# The object each URL names by its id. A URL that names one and is missing here fails the walk below.
OWNED = {
    "run_detail": "run", "run_serve": "run", "run_chart_data": "run", "run_metrics_csv": "run",
    "run_evaluation_csv": "run", "run_evaluate": "run",
    "run_cancel": "active_run",
    "dataset_detail": "dataset",
    "inference_replicas": "model", "inference_model_change": "model",
    "instance_detail": "box",
}
# URLs that name an object that no user owns, and why.
NOT_OWNED = {
    "destroy_confirm": "staff only, the permission asked first (403 whatever the box), and staff see every box",
    "keep_for_debugging": "staff only, the permission asked first (403 whatever the box), and staff see every box",
    "test_webhook_endpoint": "an alert endpoint is the account's configuration: staff with the permission only",
    "enable_webhook_endpoint": "an alert endpoint is the account's configuration: staff with the permission only",
    "delete_profile": "an offer profile is the account's ranking, shared by every run: its delete permission only",
}
POSTS = {"run_serve": {"name": "taken-over", "desired_replicas": "1"}, "inference_replicas": {"desired_replicas": "7"},
         "inference_model_change": {"name": "renamed", "image": "vllm/vllm-openai:v0.34.0", "port": "8000",
                                    "desired_replicas": "7", "max_replacements_per_day": "3"},
         "keep_for_debugging": {"hours": "2"}}
MISSING = 999_999


def _urls_naming_an_object() -> list[str]:
    found = []

    def walk(patterns):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                if pattern.namespace != "admin":  # the admin changes nothing and is staff's (tests/test_admin_gates)
                    walk(pattern.url_patterns)
            elif getattr(pattern.pattern, "converters", None) and getattr(pattern.callback, "login_required", True):
                found.append(pattern.name)  # a box's token API (no login) opens that box's own work only

    walk(get_resolver().url_patterns)
    return sorted(found)


def _user(django_user_model, name, *permissions, staff=True):
    user = django_user_model.objects.create_user(name, password=f"{name}-pass-123", is_staff=staff)
    for permission in permissions:
        app_label, codename = permission.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


LAUNCHER = ("runs.launch_run", "fleet.add_inferencemodel", "fleet.change_inferencemodel")


@pytest.fixture
def world(django_user_model, tmp_path):
    """Alice's run (finished, with an adapter vLLM serves), active run, data set and inference model; Bob, staff
    with every permission Alice has; an operator by the permission alone; Carol, not staff, whose run trained on a
    box, and Dave, not staff either."""
    alice, bob = _user(django_user_model, "alice", *LAUNCHER), _user(django_user_model, "bob", *LAUNCHER)
    operator = _user(django_user_model, "ops", *LAUNCHER, "fleet.operator")
    carol, dave = _user(django_user_model, "carol", staff=False), _user(django_user_model, "dave", staff=False)
    now = timezone.now()
    run = _finished_run(tmp_path)
    Run.objects.filter(pk=run.pk).update(name="alices-finished-run", created_by=alice)
    active = Run.objects.create(name="alices-active-run", recipe={}, bucket=str(tmp_path / "b"), created_by=alice,
                                budget_usd=Decimal("5"), state=Run.State.TRAINING, token_nonce="n", created_at=now)
    dataset = DataSet.objects.create(name="first-name.jsonl", kind="sft", sha256="a" * 64, size_bytes=10, rows=1,
                                     bucket=run.bucket, uri=f"{run.bucket}/datasets/{'a' * 64}", uploaded_by=alice,
                                     report={"tokenizer": "bytes"}, created_at=now)
    DataSetName.objects.create(dataset=dataset, user=alice, name="alices-data.jsonl", stored_at=now)
    Phase.objects.filter(run=run).update(dataset=dataset)
    model = InferenceModel.objects.create(name="alices-model", image="vllm/vllm-openai:v0.34.0", created_by=alice,
                                          desired_replicas=1)
    carols = Run.objects.create(name="carols-run", recipe={}, bucket=str(tmp_path / "c"), created_by=carol,
                                budget_usd=Decimal("5"), state=Run.State.TRAINING, token_nonce="n", created_at=now)
    box = Instance.objects.create(provider="vast", idempotency_key="carols-box", label="carols-box",
                                  state=Instance.State.RUNNING, purpose="training", offer_id="1", gpu_name="H200",
                                  image="img", disk_gb=50, requested_at=now, running_at=now,
                                  usd_per_hour=Decimal("1.00"))
    RunAttempt.objects.create(run=carols, instance=box, started_at=now)
    Alert.objects.create(kind=Alert.Kind.RUN_FAILED, message="Run carols-run failed: its secret reason",
                         instance=box, created_at=now)
    return {"run": run, "active_run": active, "dataset": dataset, "model": model, "box": box,
            "owner": {"box": carol}, "stranger": {"box": dave}, "alice": alice, "bob": bob, "operator": operator,
            "carol": carol, "dave": dave}


def _as(client, user):
    client.force_login(user)
    return client


@pytest.mark.parametrize("name", _urls_naming_an_object())
def test_another_users_object_is_a_404_for_every_method_and_its_owner_and_an_operator_reach_it(client, world, name):
    if name in NOT_OWNED:
        pytest.skip(NOT_OWNED[name])
    assert name in OWNED, f"{name} names an object by its id: say whose it is in OWNED (or why no one's)"
    kind = OWNED[name]
    obj = world[kind]
    owner, stranger = world["owner"].get(kind, world["alice"]), world["stranger"].get(kind, world["bob"])
    url, missing = reverse(name, args=[obj.pk]), reverse(name, args=[MISSING])
    _as(client, stranger)
    data = POSTS.get(name, {})
    answers = {"GET": (client.get(url).status_code, client.get(missing).status_code),
               "POST": (client.post(url, data).status_code, client.post(missing, data).status_code)}
    # The same answer as for no such object; 405 where the view takes the other method only, whatever the id.
    assert all(theirs == none and theirs in (404, 405) for theirs, none in answers.values()), answers
    assert 404 in (answers["GET"][0], answers["POST"][0]), answers
    # Nothing the stranger posted acted.
    world["active_run"].refresh_from_db()
    world["model"].refresh_from_db()
    assert world["active_run"].state == Run.State.TRAINING
    assert (world["model"].name, world["model"].desired_replicas) == ("alices-model", 1)
    assert InferenceModel.objects.count() == 1
    for who in (owner, world["operator"]):
        _as(client, who)
        reached = client.get(url) if answers["GET"][0] == 404 else client.post(url, {})
        assert reached.status_code in (200, 302), (who, reached.status_code)


def test_bob_can_neither_cancel_nor_serve_alices_run_and_an_operator_does_both(client, world):
    active, run = world["active_run"], world["run"]
    _as(client, world["bob"])
    assert client.post(reverse("run_cancel", args=[active.pk])).status_code == 404
    assert client.post(reverse("run_serve", args=[run.pk]), {"name": "bobs"}).status_code == 404
    active.refresh_from_db()
    assert active.state == Run.State.TRAINING and InferenceModel.objects.count() == 1

    _as(client, world["operator"])
    assert client.post(reverse("run_cancel", args=[active.pk])).status_code == 302
    active.refresh_from_db()
    assert active.state == Run.State.CANCELLED
    answer = client.post(reverse("run_serve", args=[run.pk]), _serve_data(client, run, name="served-by-ops"))
    assert answer.status_code == 302
    served = InferenceModel.objects.get(name="served-by-ops")
    assert served.created_by == world["operator"] and str(run.pk) in served.adapter_source
    replicas = reverse("inference_replicas", args=[world["model"].pk])
    assert client.post(replicas, {"desired_replicas": "3"}).status_code == 302
    world["model"].refresh_from_db()
    assert world["model"].desired_replicas == 3


def test_the_lists_show_a_user_their_own_and_an_operator_everyone(client, world):
    seed_run("alices-seeded-run", created_by=world["alice"])  # metric points on a box: the comparison page's rows
    pages = {"runs": ["alices-finished-run", "alices-active-run"],
             "datasets": [f'href="{reverse("dataset_detail", args=[world["dataset"].pk])}"'],
             "inference": ["alices-model"], "run_compare": ["alices-seeded-run"]}
    for page, names in pages.items():
        mine = _as(client, world["alice"]).get(reverse(page)).content.decode()
        theirs = _as(client, world["bob"]).get(reverse(page)).content.decode()
        everyone = _as(client, world["operator"]).get(reverse(page)).content.decode()
        for name in names:
            assert name in mine and name in everyone, (page, name)
            assert name not in theirs, (page, name)
    assert "alices-data.jsonl" in _as(client, world["alice"]).get(reverse("datasets")).content.decode()
    # Bob sees neither the first uploader's file name nor who they are on a set he stored the same bytes of.
    DataSetName.objects.create(dataset=world["dataset"], user=world["bob"], name="bobs-copy.jsonl",
                               stored_at=timezone.now())
    shared = _as(client, world["bob"]).get(reverse("dataset_detail", args=[world["dataset"].pk])).content.decode()
    assert "bobs-copy.jsonl" in shared and "first-name.jsonl" not in shared and "alice" not in shared
    assert "alices-finished-run" not in shared  # the runs that trained on it: his own only

    def run_states(user) -> int:
        return sum(n for _, n in _as(client, user).get(reverse("dashboard")).context["run_states"])

    assert (run_states(world["alice"]), run_states(world["bob"]), run_states(world["operator"])) == (3, 0, 4)
    # His own run on that set names it by his name too.
    bobs = Run.objects.create(name="bobs-run", recipe={}, bucket=world["run"].bucket, created_by=world["bob"],
                              budget_usd=Decimal("5"), token_nonce="n", created_at=timezone.now())
    Phase.objects.create(run=bobs, index=0, name="sft", kind="sft", steps=1, dataset=world["dataset"])
    page = _as(client, world["bob"]).get(reverse("run_detail", args=[bobs.pk])).content.decode()
    assert "bobs-copy.jsonl" in page and "first-name.jsonl" not in page


def test_a_user_who_is_not_staff_sees_only_the_boxes_and_alerts_of_their_own_runs(client, world):
    box = world["box"]
    for user, sees in ((world["carol"], True), (world["dave"], False), (world["bob"], True)):  # bob: staff
        _as(client, user)
        for page in ("instances", "alerts", "dashboard"):
            body = client.get(reverse(page)).content.decode()
            assert ("carols-box" in body or "its secret reason" in body) is sees, (user, page)
        assert client.get(reverse("instance_detail", args=[box.pk])).status_code == (200 if sees else 404)
    page = _as(client, world["carol"]).get(reverse("run_detail", args=[Run.objects.get(name="carols-run").pk]))
    assert f'href="{reverse("instance_detail", args=[box.pk])}"' in page.content.decode()


def test_ensure_operator_grants_the_operator_permission_itself(django_user_model, monkeypatch):
    monkeypatch.setenv("OPERATOR_USERNAME", "root-op")
    monkeypatch.setenv("OPERATOR_PASSWORD", "root-op-pass-123")
    call_command("ensure_operator")
    made = django_user_model.objects.get(username="root-op")
    assert made.user_permissions.filter(content_type__app_label="fleet", codename="operator").exists()
    made.is_superuser = False  # the permission, not superuser status, is what lets it see everyone's work
    made.save()
    made = django_user_model.objects.get(pk=made.pk)
    assert made.has_perm("fleet.operator")


def test_an_owner_less_run_is_an_operators_only(client, world):
    nobodys = seed_run("nobodys-run", now=timezone.now() - timedelta(minutes=5))
    assert _as(client, world["alice"]).get(reverse("run_detail", args=[nobodys.pk])).status_code == 404
    assert _as(client, world["operator"]).get(reverse("run_detail", args=[nobodys.pk])).status_code == 200
