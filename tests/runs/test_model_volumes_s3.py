"""A run's base model kept on a volume between boxes (moto's S3 on loopback, the volume a folder as the simulated
marketplace gives it): the dashboard hashes the s3:// model itself; a box downloads it into the volume, the next box
finds every file matching that manifest and skips the download; a file another host changed, a partial one, a link or
a marker alone are never taken for the model."""

import hashlib
import json

import pytest

from runs import model_grants, model_manifests
from runs.models import ModelManifest
from training import model_source
from training.agent.inputs import fetch_model
from training.agent.volume import SIM_MOUNTS

from .test_model_grants_s3 import FILES, MODEL, _put_model
from .test_storage_s3 import BUCKET, _Recorder, s3  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def emptied_afterwards(s3):  # noqa: F811 - moto keeps one store per process, across its servers
    yield
    for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=item["Key"])


@pytest.fixture
def volume(tmp_path, monkeypatch):
    """The volume mounted at /workspace/models, a folder of its own as on the simulated marketplace."""
    folder = tmp_path / "volume-7"
    folder.mkdir()
    monkeypatch.setenv(SIM_MOUNTS, json.dumps({"/workspace/models": str(folder)}))
    return folder


def _granted():
    return {**model_grants.grant({"path": MODEL}, expires_s=600), "manifest": model_manifests.recorded(MODEL).manifest}


def test_the_dashboard_hashes_the_model_itself_a_few_files_per_task(s3):  # noqa: F811
    _put_model(s3)
    ticks = iter([0.0, 0.0, 10.0, 10.0, 10.0])  # the budget runs out after the first file
    assert model_manifests.record(MODEL, budget_s=5.0, clock=lambda: next(ticks)) is False
    row = ModelManifest.objects.get(uri=MODEL)
    assert len(row.manifest) == 1 and not row.complete and model_manifests.recorded(MODEL) is None
    assert model_manifests.record(MODEL) is True
    assert model_manifests.recorded(MODEL).manifest == {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in FILES.items()}


def test_a_box_downloads_into_the_volume_and_the_next_box_skips_the_download(s3, tmp_path, volume):  # noqa: F811
    _put_model(s3)
    model_manifests.record(MODEL)
    first = _Recorder()
    model = fetch_model(first, _granted(), {"path": MODEL}, tmp_path / "disk", {"mount_path": "/workspace/models"})
    folder = volume / model_source.folder_name(MODEL)
    assert model["path"] == str(folder) and (folder / "config.json").read_bytes() == FILES["config.json"]
    assert [body["kind"] for _, body in first.posts] == ["log", "log", "model_on_volume"]
    assert "into the volume at /workspace/models" in first.posts[0][1]["message"]

    s3.delete_object(Bucket=BUCKET, Key="models/qwen3-tiny/model-00001.safetensors")  # no download could happen
    second = _Recorder()
    model = fetch_model(second, _granted(), {"path": MODEL}, tmp_path / "disk2", {"mount_path": "/workspace/models"})
    assert model["path"] == str(folder)
    ((_, said),) = second.posts
    assert said["kind"] == "model_on_volume" and "matches the manifest the dashboard recorded: no download" in \
        said["message"]


def test_a_file_another_host_changed_or_linked_is_downloaded_again(s3, tmp_path, volume):  # noqa: F811
    _put_model(s3)
    model_manifests.record(MODEL)
    mount = {"mount_path": "/workspace/models"}
    fetch_model(_Recorder(), _granted(), {"path": MODEL}, tmp_path / "disk", mount)
    folder = volume / model_source.folder_name(MODEL)
    (folder / "model-00001.safetensors").write_bytes(b"X" * 3000)  # same size, other bytes
    (folder / "config.json").unlink()
    secret = tmp_path / "elsewhere.json"
    secret.write_text('{"model_type": "qwen3_moe"}')
    (folder / "config.json").symlink_to(secret)  # the right bytes, through a link out of the volume
    api = _Recorder()
    fetch_model(api, _granted(), {"path": MODEL}, tmp_path / "disk", mount)
    said = api.posts[0][1]["message"]
    assert "does not hold the model" in said and "model-00001.safetensors does not match its sha256" in said
    assert "config.json is not a plain file" in said
    assert (folder / "model-00001.safetensors").read_bytes() == FILES["model-00001.safetensors"]
    assert not (folder / "config.json").is_symlink() and secret.exists()
    assert api.posts[-1][1]["kind"] == "model_on_volume"


def test_without_a_recorded_manifest_nothing_on_the_volume_is_used(s3, tmp_path, volume):  # noqa: F811
    _put_model(s3)
    folder = volume / model_source.folder_name(MODEL)
    folder.mkdir()
    (folder / "model-00001.safetensors").write_bytes(b"X" * 3000)  # the listed size, planted by another host
    (folder / model_source.DONE).write_text(json.dumps({"reference": MODEL, "bytes": 1}))  # and its marker
    grant = model_grants.grant({"path": MODEL}, expires_s=600)
    api = _Recorder()
    fetch_model(api, grant, {"path": MODEL}, tmp_path / "disk", {"mount_path": "/workspace/models"})
    assert (folder / "model-00001.safetensors").read_bytes() == FILES["model-00001.safetensors"]
    assert "model_on_volume" not in [body["kind"] for _, body in api.posts]  # nothing checked, nothing claimed


def test_a_volume_that_is_not_mounted_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(SIM_MOUNTS, raising=False)
    grant = {"kind": "hub", "repo_id": "Qwen/Qwen3-30B-A3B", "revision": None}
    with pytest.raises(model_source.ModelRefused, match="not mounted at /nowhere/models"):
        fetch_model(_Recorder(), grant, {"path": "Qwen/Qwen3-30B-A3B"}, tmp_path, {"mount_path": "/nowhere/models"})
