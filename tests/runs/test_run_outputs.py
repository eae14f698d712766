"""A run is green only with its outputs: each phase's final adapter verified in the run's store. Its store keeps the
recipe's `keep` newest checkpoints and every phase's final one, and a folder no upload can reach is refused at
launch."""

from pathlib import Path

import pytest
from django.test import Client

from runs import retention, storage
from runs.models import Checkpoint
from tests.runs.conftest import put_on_a_box, stored_checkpoint, tiny_recipe

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"


def _post(client, path, body):
    import json

    return client.post(API + path, json.dumps(body), content_type="application/json")


def _store(run, phase, step):
    notice = stored_checkpoint(run, phase, step)
    return notice["uri"], notice


def _training(run):
    from runs import events

    token = put_on_a_box(run)
    events.record(run, "rented", "A box was rented.")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert _post(client, "/events", {"kind": "probe_ok"}).json()["state"] == "training"
    return client


def test_a_run_whose_final_adapters_are_not_stored_fails_and_keeps_its_box(launched, settings):
    run = launched()
    client = _training(run)
    phases = list(run.phases.all())
    for phase in phases[:-1]:
        assert _post(client, "/checkpoints", _store(run, phase.index, phase.steps)[1]).status_code == 200
    assert _post(client, "/events", {"kind": "finished", "message": "done"}).json()["state"] == "failed"
    run.refresh_from_db()
    last = phases[-1]
    assert f"the final adapter of phase {last.name} (step {last.steps}) is not in the run's store" in run.state_reason
    box = run.current_instance
    box.refresh_from_db()
    assert box.keep_until is not None  # its disk may hold the only copy


def test_a_run_with_every_final_adapter_stored_finishes(launched):
    run = launched()
    client = _training(run)
    for phase in run.phases.all():
        assert _post(client, "/checkpoints", _store(run, phase.index, phase.steps)[1]).status_code == 200
    assert _post(client, "/events", {"kind": "finished", "message": "done"}).json()["state"] == "finished"


def test_the_runs_store_keeps_the_newest_and_every_phases_final_checkpoint(tmp_path):
    from runs.launch import launch
    from decimal import Decimal

    recipe = tiny_recipe()
    recipe["checkpoint"] = {**recipe.get("checkpoint", {}), "keep": 2}
    run = launch(name="keep", recipe=recipe, bucket=str(tmp_path / "bucket"), budget_usd=Decimal("5"), max_restarts=1)
    client = _training(run)
    first = run.phases.get(index=0)
    uris = {}
    for step in (first.steps - 2, first.steps - 1, first.steps):
        uris[(0, step)], notice = _store(run, 0, step)
        _post(client, "/checkpoints", notice)
    for step in (1, 2, 3):
        uris[(1, step)], notice = _store(run, 1, step)
        _post(client, "/checkpoints", notice)
    kept = set(Checkpoint.objects.filter(run=run, pruned_at=None).values_list("phase", "step"))
    assert Checkpoint.objects.filter(run=run).count() == 6  # the pruned ones stay in the history, marked
    assert kept == {(0, first.steps), (1, 2), (1, 3)}
    on_disk = {p.name for p in (Path(run.bucket) / "runs" / str(run.pk)).iterdir()} - {storage.ATTEMPTS}
    assert on_disk == {uris[key] for key in kept}
    uploads = Path(run.bucket) / "runs" / str(run.pk) / storage.ATTEMPTS
    assert not [p for p in uploads.rglob("*") if p.is_file()]  # each box's upload is deleted once it is sealed


def test_retention_drops_refused_and_unfinished_ones_older_than_the_newest():
    rows = [retention.Stored(0, 10, True), retention.Stored(0, 20, True, refused=True), retention.Stored(0, 30, False),
            retention.Stored(0, 40, True), retention.Stored(0, 50, False)]
    assert retention.to_prune(rows, keep=3, finals=set()) == [(0, 20), (0, 30)]
    assert retention.to_prune(rows, keep=1, finals={(0, 10)}) == [(0, 20), (0, 30)]
    assert retention.to_prune(rows, keep=1, finals=set()) == [(0, 10), (0, 20), (0, 30)]
    assert retention.to_prune([retention.Stored(0, 5, False)], keep=1, finals=set()) == []


def test_a_folder_no_upload_can_reach_is_refused_at_launch(settings):
    (settings.DATA_DIR / "a-file").write_text("")
    with pytest.raises(ValueError, match="cannot be written"):
        storage.validate_bucket(str(settings.DATA_DIR / "a-file" / "checkpoints"))


@pytest.mark.parametrize("folder", ["/proc/nope", "/dev/null/checkpoints", "relative/../../etc/fleet",
                                    "/usr/local/fleet-bucket", "file:///home/fleet-bucket"])
def test_a_local_folder_outside_data_dir_is_refused_and_not_created(settings, tmp_path, folder):
    settings.DATA_DIR = tmp_path / "data"
    for outside in (folder, str(tmp_path / "bucket"), str(settings.DATA_DIR / ".." / "bucket")):
        with pytest.raises(ValueError, match="under the dashboard's DATA_DIR|must be an absolute path"):
            storage.validate_bucket(outside)
    assert not (tmp_path / "bucket").exists() and not Path("/usr/local/fleet-bucket").exists()
    assert storage.validate_bucket(str(settings.DATA_DIR / "checkpoints")) == str(settings.DATA_DIR / "checkpoints")
    assert (settings.DATA_DIR / "checkpoints").is_dir()



def test_where_boxes_are_rented_machines_a_local_folder_is_refused_before_anything_is_stored(client, staff, settings,
                                                                                               tmp_path):
    import yaml
    from django.contrib.auth.models import Permission
    from django.urls import reverse

    from runs.launch import LaunchError, demo_recipe, launch
    from runs.models import DataSet, Run

    settings.LOCAL_BUCKETS = False  # vast.ai or RunPod: a box cannot write to the dashboard's disk
    folder = tmp_path / "bucket"
    with pytest.raises(LaunchError, match="a rented box cannot write its checkpoints there"):
        launch(name="lost", recipe=demo_recipe(), bucket=str(folder), budget_usd=5, max_restarts=1)

    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    client.force_login(staff)
    page = client.get(reverse("run_launch")).content.decode()
    assert 'name="bucket"' in page and 'name="bucket" value=' not in page  # no local folder offered as the default
    response = client.post(reverse("run_launch"), {
        "name": "lost", "recipe": yaml.safe_dump(demo_recipe()), "bucket": str(folder), "budget_usd": "5",
        "max_restarts": 1})
    assert response.status_code == 200 and "Name an s3://bucket/prefix" in response.content.decode()
    assert not Run.objects.exists() and not DataSet.objects.exists() and not folder.exists()

    settings.LOCAL_BUCKETS = True  # the simulated marketplace: its boxes share this machine's disk
    default = settings.DATA_DIR / "checkpoints"
    assert f'name="bucket" value="{default}"' in client.get(reverse("run_launch")).content.decode()


def test_the_launch_form_refuses_a_local_folder_outside_data_dir(client, staff, settings, tmp_path):
    import yaml
    from django.contrib.auth.models import Permission
    from django.urls import reverse

    from runs.launch import demo_recipe
    from runs.models import Run

    settings.DATA_DIR = tmp_path / "data"
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    client.force_login(staff)
    folder = tmp_path / "elsewhere"
    response = client.post(reverse("run_launch"), {
        "name": "outside", "recipe": yaml.safe_dump(demo_recipe()), "bucket": str(folder), "budget_usd": "5",
        "max_restarts": 1})
    page = response.content.decode()
    assert response.status_code == 200 and "must lie under the dashboard&#x27;s DATA_DIR" in page
    assert not Run.objects.exists() and not folder.exists()
