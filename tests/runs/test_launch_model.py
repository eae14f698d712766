"""The launch page names the model by a hub id, an s3:// prefix or a config, says the disk each box needs for it,
and takes more disk but never less; a mistake is said by its field and launches nothing; the run's boxes are rented
with that disk, and a box's spec tells it where to download a hub model from."""

import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from fleet.instances.disk import needed
from fleet.offers.refresh import refresh_offers
from fleet.ranking import Workload
from runs import launch as launching
from runs import reports, supervisor
from runs.launch import LaunchError, launch
from runs.models import Run
from tests.runs.conftest import put_on_a_box, tiny_recipe
from tests.runs.test_launch_page import _form
from training.recipe import validate

pytestmark = pytest.mark.django_db
HUB = "Qwen/Qwen3-30B-A3B"


@pytest.fixture(autouse=True)
def hub_unreachable(monkeypatch):
    """A dashboard that cannot reach the hub (these tests' machine cannot): the tokenizer check is skipped and
    said, at once instead of after the hub's retries."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def launcher(staff):
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    return staff


def _errors_of(page: str, field: str) -> list[str]:
    label = next(m for m in re.findall(r"<label>.*?</label>", page, re.S) if f'name="{field}"' in m)
    return re.findall(r'<span class="error">(.*?)</span>', label, re.S)


def _hub_form(page: str) -> dict:
    form = _form(page)
    form["recipe"] = re.sub(r"model:\n(  .*\n)+", f"model:\n  path: {HUB}\n", form["recipe"])
    return form


def test_the_page_says_the_disk_the_model_needs(client, launcher):
    client.force_login(launcher)
    page = client.get(reverse("run_launch")).content.decode()
    tiny = launching.disk_need(validate(launching.demo_recipe(), base_dir="/", data_on_disk=False))  # its own size
    assert tiny.total_gb < needed(Workload(), keep=3, built_from_config=True).total_gb
    assert f"Disk each box needs for this model: {tiny.total_gb} GB: no weights to download" in page
    page = client.post(reverse("run_launch"), {**_hub_form(page), "disk_gb": "1"}).content.decode()
    hub = needed(Workload(), keep=3)
    assert f"Disk each box needs for this model: {hub.total_gb} GB: the weights of Qwen3.6-35B-A3B 67 GB" in page


def test_it_refuses_less_disk_than_the_model_needs_by_the_field(client, launcher):
    client.force_login(launcher)
    form = _hub_form(client.get(reverse("run_launch")).content.decode())
    need = needed(Workload(), keep=3).total_gb
    page = client.post(reverse("run_launch"), {**form, "disk_gb": str(need - 1)}).content.decode()
    assert _errors_of(page, "disk_gb") == [f"At least {needed(Workload(), keep=3)}."]
    assert not Run.objects.exists()


def test_it_says_a_models_mistake_by_the_recipe_field(client, launcher):
    client.force_login(launcher)
    form = _form(client.get(reverse("run_launch")).content.decode())
    for model, said in [("  path: Qwen/Qwen3--30B\n", "a hub id has no &#x27;--&#x27; or &#x27;..&#x27;"),
                        ("  path: /srv/models/qwen\n", "no folder /srv/models/qwen here"),
                        ("  path: /\n", "a folder on the dashboard&#x27;s machine is not read by a box")]:
        recipe = re.sub(r"model:\n(  .*\n)+", f"model:\n{model}", form["recipe"])
        page = client.post(reverse("run_launch"), {**form, "recipe": recipe}).content.decode()
        assert any(said in error for error in _errors_of(page, "recipe")), (said, _errors_of(page, "recipe"))
    assert not Run.objects.exists()


def test_a_hub_model_launches_with_more_disk_and_its_boxes_get_it(client, launcher, frozen_market, settings):
    refresh_offers()
    client.force_login(launcher)
    form = _hub_form(client.get(reverse("run_launch")).content.decode())
    need = needed(Workload(), keep=3).total_gb
    response = client.post(reverse("run_launch"), {**form, "disk_gb": str(need + 40)})
    run = Run.objects.get()
    assert response.status_code == 302 and run.disk_gb == need + 40
    assert f"rented with {need + 40} GB of disk; the model needs {need} GB" in run.events.get().message
    supervisor.supervise()
    run.refresh_from_db()
    box = run.current_instance
    assert box.disk_gb == need + 40
    rented = next(i for i in frozen_market.state()["instances"] if i["label"] == box.label)
    assert rented["disk_space"] == need + 40  # what the marketplace was asked for

    put_on_a_box(run)
    spec = reports.spec(run.attempts.get(ended_at=None))
    assert spec["model"] == {"kind": "hub", "repo_id": HUB, "revision": None}


def test_a_launch_without_a_disk_takes_the_need(tmp_path):
    run = launch(name="hub", recipe=tiny_recipe(model={"path": HUB}), bucket=str(tmp_path), budget_usd=5,
                 max_restarts=1)
    assert run.disk_gb == needed(Workload(), keep=3).total_gb
    with pytest.raises(LaunchError) as refused:
        launch(name="hub", recipe=tiny_recipe(model={"path": HUB}), bucket=str(tmp_path), budget_usd=5,
               max_restarts=1, disk_gb=10)
    assert refused.value.field == "disk_gb"
