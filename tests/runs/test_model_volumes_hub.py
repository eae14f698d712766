"""A hub model kept on a volume between boxes: the dashboard reads the weights' sha256 and the commit from the hub's
own API (a real HTTP server standing in for the hub); a box that finds every weight file matching uses them without
downloading them, and fetches afresh the small files the hub keeps no sha256 of, whatever another host left beside
them; a weight file another host changed is downloaded again, at the commit the manifest is of."""

import fnmatch
import hashlib
import json
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from runs import model_grants, model_manifests
from runs.models import ModelManifest, Run
from training import model_source
from training.agent.inputs import fetch_model
from training.agent.volume import SIM_MOUNTS
from tests.http_servers import QuietHandler, serving

from .test_storage_s3 import _Recorder

pytestmark = pytest.mark.django_db

REPO, COMMIT = "acme/qwen3-tiny-moe", "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = {"model-00001-of-00002.safetensors": b"W1" * 1500, "model-00002-of-00002.safetensors": b"W2" * 700}
SMALL = {"config.json": b'{"model_type": "qwen3_moe"}', "tokenizer_config.json": b"{}"}
MOUNT = {"mount_path": "/workspace/models"}


class _Hub(QuietHandler):
    """The hub's model API: /api/models/{repo}/revision/{revision}?blobs=True, as huggingface_hub reads it."""

    def do_GET(self):
        self.server.asked.append(self.path)
        if not self.path.startswith(f"/api/models/{REPO}/revision/main"):
            return self.answer(404, {"error": "Repository not found"})
        siblings = [{"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest(),
                     "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}}
                    for name, data in WEIGHTS.items()]
        siblings += [{"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
                     for name, data in SMALL.items()]
        self.answer(200, {"id": REPO, "modelId": REPO, "sha": COMMIT, "private": False, "siblings": siblings})


@pytest.fixture
def hub(settings):
    with serving(_Hub, asked=[]) as server:
        settings.HF_ENDPOINT = f"http://127.0.0.1:{server.server_port}"
        yield server


@pytest.fixture
def downloads(monkeypatch):
    """huggingface_hub's snapshot_download as the box calls it: writes the repository's files at the revision asked
    into the local folder, but for those its ignore_patterns match; records what it wrote."""
    written = []

    def snapshot(repo_id, *, revision, local_dir, token, ignore_patterns=None):
        assert repo_id == REPO and revision == COMMIT
        for name, data in {**WEIGHTS, **SMALL}.items():
            if not any(fnmatch.fnmatch(name, pattern) for pattern in ignore_patterns or ()):
                (Path(local_dir) / name).write_bytes(data)
                written.append(name)

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot)
    return written


@pytest.fixture
def volume(tmp_path, monkeypatch):
    folder = tmp_path / "volume-3"
    folder.mkdir()
    monkeypatch.setenv(SIM_MOUNTS, json.dumps({MOUNT["mount_path"]: str(folder)}))
    return folder


def _run():
    return Run.objects.create(name="hub on a volume", recipe={"model": {"path": REPO}, "phases": []},
                              bucket="s3://fleet/runs/hub", budget_usd=Decimal("5"), max_restarts=1, token_nonce="n",
                              created_at=timezone.now(), volume={"provider": "vast", "id": "3", **MOUNT})


def _granted(run):
    return model_grants.with_manifest(model_grants.grant(run.recipe["model"], expires_s=600), run)


def test_the_dashboard_records_the_weights_sha256_and_the_commit_from_the_hub(hub):
    assert model_manifests.wanted({"path": REPO}) is True
    assert model_manifests.record(f"hub:{REPO}@main") is True
    row = ModelManifest.objects.get(uri=f"hub:{REPO}@main")
    assert row.revision == COMMIT and row.complete
    assert model_manifests.recorded(row.uri).manifest == {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in WEIGHTS.items()}
    assert hub.asked and "blobs=true" in hub.asked[0].lower()  # the files with their LFS sha256


def test_a_model_the_hub_does_not_have_is_refused_and_nothing_is_recorded(hub):
    with pytest.raises(Exception, match="Repository Not Found|404"):
        model_manifests.record("hub:acme/gone@main")
    assert model_manifests.recorded("hub:acme/gone@main") is None
    assert model_manifests.wanted({"path": "acme/gone"}) is True  # the next launch asks again


def test_the_next_box_uses_the_volumes_weights_and_fetches_the_small_files_afresh(hub, downloads, volume, tmp_path):
    run = _run()
    model_manifests.record(f"hub:{REPO}@main")
    grant = _granted(run)
    assert grant["revision"] == COMMIT and set(grant["manifest"]) == set(WEIGHTS)  # the commit the manifest is of
    first = _Recorder()
    model = fetch_model(first, grant, run.recipe["model"], tmp_path / "disk", MOUNT)
    folder = volume / model_source.folder_name(REPO)
    assert model["path"] == str(folder) and sorted(downloads) == sorted({**WEIGHTS, **SMALL})
    assert first.posts[-1][1]["kind"] == "model_on_volume"

    # Another host changed a small file and left the hub client's records saying it is up to date.
    (folder / "config.json").write_text('{"model_type": "qwen3_moe", "auto_map": {"AutoModel": "evil.Model"}}')
    (folder / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (folder / ".cache" / "huggingface" / "download" / "config.json.metadata").write_text(f"{COMMIT}\netag\n1e9\n")
    (folder / "extra.py").write_text("import os")
    downloads.clear()
    second = _Recorder()
    fetch_model(second, _granted(run), run.recipe["model"], tmp_path / "disk2", MOUNT)
    assert sorted(downloads) == sorted(SMALL)  # no weight downloaded again
    assert (folder / "config.json").read_bytes() == SMALL["config.json"]
    assert not (folder / ".cache").exists() and not (folder / "extra.py").exists()
    ((_, said),) = second.posts
    assert said["kind"] == "model_on_volume" and "no download of its weights" in said["message"]


def test_a_weight_file_another_host_changed_is_downloaded_again(hub, downloads, volume, tmp_path):
    run = _run()
    model_manifests.record(f"hub:{REPO}@main")
    fetch_model(_Recorder(), _granted(run), run.recipe["model"], tmp_path / "disk", MOUNT)
    folder = volume / model_source.folder_name(REPO)
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"XX" * 700)  # same size, other bytes
    downloads.clear()
    api = _Recorder()
    fetch_model(api, _granted(run), run.recipe["model"], tmp_path / "disk2", MOUNT)
    assert sorted(downloads) == sorted(["model-00002-of-00002.safetensors", *SMALL])
    assert (folder / "model-00002-of-00002.safetensors").read_bytes() == WEIGHTS["model-00002-of-00002.safetensors"]
    assert "model-00002-of-00002.safetensors does not match its sha256" in api.posts[0][1]["message"]
    assert api.posts[-1][1]["kind"] == "model_on_volume"


def test_a_run_without_a_volume_gets_the_hub_grant_as_it_was(hub):
    run = _run()
    Run.objects.filter(pk=run.pk).update(volume={})
    run.refresh_from_db()
    model_manifests.record(f"hub:{REPO}@main")
    assert _granted(run) == {"kind": "hub", "repo_id": REPO, "revision": None}
