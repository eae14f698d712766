"""Checkpoint storage on an S3-compatible server (moto's, on loopback): a box gets a presigned POST that only admits
keys under its own attempt's folder, the dashboard seals a complete checkpoint by copying its manifest's files to the
run's folder, and a box gets presigned GETs of the sealed checkpoint it resumes from; never the account's key."""

import base64
import json
import socket
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto.server import ThreadedMotoServer

from runs import storage
from training.agent import Api, manifest_of, restore
from training.agent.uploads import Uploader

BUCKET = "checkpoints"


@pytest.fixture
def s3(settings, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    settings.S3_ENDPOINT_URL = f"http://127.0.0.1:{port}"
    settings.S3_REGION, settings.S3_ACCESS_KEY, settings.S3_SECRET_KEY = "us-east-1", "account-key", "account-secret"
    client = boto3.client("s3", endpoint_url=settings.S3_ENDPOINT_URL, region_name="us-east-1",
                          aws_access_key_id="account-key", aws_secret_access_key="account-secret")
    client.create_bucket(Bucket=BUCKET)
    # moto keeps one store per process: what another test left in the bucket must not count as this one's upload.
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    yield client
    server.stop()


def _checkpoint(folder):
    (folder / "adapter").mkdir(parents=True)
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"weights" * 100)
    (folder / "trainer.pt").write_bytes(b"optimizer" * 100)
    (folder / "COMPLETE").write_text("done\n")
    return folder


class _Recorder(Api):
    """The agent's API client, recording what it would post instead of posting it."""

    def __init__(self):
        self.posts = []

    def call(self, method, path, body=None):
        self.posts.append((path, body))
        return {}


def _upload(uploader, folder):
    manifest = manifest_of(folder)
    for name in manifest:
        uploader._put(folder / name, f"{folder.name}/{name}")
    uploader._put(folder / "COMPLETE", f"{folder.name}/COMPLETE")
    return manifest


def _sealed(uploader, folder, where, attempt=3):
    """A checkpoint uploaded by attempt 3's box, then sealed as the dashboard seals it; returns its manifest."""
    manifest = _upload(uploader, folder)
    written = storage.written_files(where, folder.name, attempt)
    storage.seal(where, folder.name, attempt, manifest, {name: written[name][1] for name in manifest})
    return manifest


def _candidate(where, name, manifest, phase=1, step=4):
    return {"phase": phase, "step": step, "uri": name, "manifest": manifest,
            "download": storage.download_grant(where, name, manifest, expires_s=600)}


def test_it_uploads_marker_last_and_restores_through_presigned_urls(s3, tmp_path):
    where = storage.location(f"s3://{BUCKET}/team-a", 7)
    grant = storage.upload_grant(where, 3, expires_s=600)
    assert "account-secret" not in str(grant)
    uploader = Uploader(Api("http://127.0.0.1:9/", "unused"), grant, tmp_path / "outbox")
    folder = _checkpoint(tmp_path / "store" / "ckpt-p01-s00000004")
    manifest = _upload(uploader, folder)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert all(k.startswith("team-a/runs/7/attempts/3/ckpt-p01-s00000004/") for k in keys) and len(keys) == 3
    sizes = {name: e["size"] for name, e in manifest.items()}
    assert storage.stored_files(where, "ckpt-p01-s00000004", 3) == sizes
    written = storage.written_files(where, "ckpt-p01-s00000004", 3)
    storage.seal(where, "ckpt-p01-s00000004", 3, manifest, {name: written[name][1] for name in manifest})
    assert storage.stored_files(where, "ckpt-p01-s00000004") == sizes

    candidate = _candidate(where, "ckpt-p01-s00000004", manifest)
    assert set(candidate["download"]["files"]) == {"trainer.pt", "adapter/adapter_model.safetensors"}
    assert restore(_Recorder(), [candidate], tmp_path / "new-box") is candidate
    restored = tmp_path / "new-box" / "ckpt-p01-s00000004"
    assert (restored / "trainer.pt").read_bytes() == (folder / "trainer.pt").read_bytes()
    assert (restored / "COMPLETE").exists()


def test_a_box_loads_nothing_changed_or_planted_after_the_manifest_was_recorded(s3, tmp_path):
    where = storage.location(f"s3://{BUCKET}/team-a", 7)
    uploader = Uploader(Api("http://127.0.0.1:9/", "unused"), storage.upload_grant(where, 3, 600),
                        tmp_path / "outbox")
    older = _sealed(uploader, _checkpoint(tmp_path / "a" / "ckpt-p01-s00000002"), where)
    newer = _sealed(uploader, _checkpoint(tmp_path / "b" / "ckpt-p01-s00000004"), where)
    # Someone with the account's key overwrites the newest checkpoint's optimizer state and plants a file beside it
    # (no box's grant reaches the sealed folder: the box's own check is the last line).
    s3.put_object(Bucket=BUCKET, Key="team-a/runs/7/ckpt-p01-s00000004/trainer.pt", Body=b"pickled-code" * 75)
    s3.put_object(Bucket=BUCKET, Key="team-a/runs/7/ckpt-p01-s00000002/adapter/evil.py", Body=b"import os")
    api = _Recorder()
    chosen = restore(api, [_candidate(where, "ckpt-p01-s00000004", newer),
                           _candidate(where, "ckpt-p01-s00000002", older, step=2)], tmp_path / "box")
    assert chosen["step"] == 2
    assert not (tmp_path / "box" / "ckpt-p01-s00000004").exists()
    assert not (tmp_path / "box" / "ckpt-p01-s00000002" / "adapter" / "evil.py").exists()
    assert [(path, body["step"]) for path, body in api.posts] == [("checkpoints/rejected", 4)]
    assert "trainer.pt does not match its manifest" in api.posts[0][1]["reason"]


def test_a_refused_download_is_reported_without_the_url_that_opens_it(s3, tmp_path):
    # The store's answer names the presigned URL; the dashboard shows the reason on the run's page and in alerts.
    where = storage.location(f"s3://{BUCKET}/team-a", 7)
    uploader = Uploader(Api("http://127.0.0.1:9/", "unused"), storage.upload_grant(where, 3, 600),
                        tmp_path / "outbox")
    manifest = _sealed(uploader, _checkpoint(tmp_path / "a" / "ckpt-p01-s00000004"), where)
    s3.delete_object(Bucket=BUCKET, Key="team-a/runs/7/ckpt-p01-s00000004/trainer.pt")
    api = _Recorder()
    assert restore(api, [_candidate(where, "ckpt-p01-s00000004", manifest)], tmp_path / "box") is None
    ((path, body),) = api.posts
    assert path == "checkpoints/rejected" and "404" in body["reason"] and "trainer.pt" in body["reason"]
    assert "X-Amz-Signature" not in body["reason"] and "X-Amz-Credential" not in body["reason"]


def test_a_box_resumes_from_nothing_rather_than_from_a_checkpoint_that_fails(s3, tmp_path):
    where = storage.location(f"s3://{BUCKET}/team-a", 7)
    uploader = Uploader(Api("http://127.0.0.1:9/", "unused"), storage.upload_grant(where, 3, 600),
                        tmp_path / "outbox")
    manifest = _sealed(uploader, _checkpoint(tmp_path / "a" / "ckpt-p01-s00000004"), where)
    s3.delete_object(Bucket=BUCKET, Key="team-a/runs/7/ckpt-p01-s00000004/trainer.pt")
    assert restore(_Recorder(), [_candidate(where, "ckpt-p01-s00000004", manifest)], tmp_path / "box") is None
    assert not (tmp_path / "box" / "ckpt-p01-s00000004").exists()


def test_it_refuses_a_bucket_inside_another_runs_folder(settings):
    settings.S3_ACCESS_KEY = "key"
    for nested in (f"s3://{BUCKET}/runs/5", f"s3://{BUCKET}/team/runs/5/more", "/data/ckpt/runs/12"):
        with pytest.raises(ValueError, match="another run"):
            storage.validate_bucket(nested)
    assert storage.validate_bucket(f"s3://{BUCKET}/team/runs-archive") == f"s3://{BUCKET}/team/runs-archive"


def test_it_grants_nothing_outside_the_attempts_own_folder_and_only_for_a_while(s3, tmp_path):
    # S3 refuses a POST whose key breaks the signed policy; moto accepts any key, so the policy itself is read here.
    grant = storage.upload_grant(storage.location(f"s3://{BUCKET}/team-a", 7), 3, expires_s=600)
    policy = json.loads(base64.b64decode(grant["fields"]["policy"]))
    assert ["starts-with", "$key", "team-a/runs/7/attempts/3/"] in policy["conditions"]
    assert ["content-length-range", 0, storage.MAX_POST_BYTES] in policy["conditions"]
    assert grant["fields"]["x-amz-algorithm"] == "AWS4-HMAC-SHA256"  # SigV4, whatever the endpoint's default
    expires = datetime.fromisoformat(policy["expiration"].replace("Z", "+00:00"))
    assert timedelta(minutes=9) < expires - datetime.now(UTC) <= timedelta(minutes=10)
    assert grant["fields"]["key"].startswith("team-a/runs/7/attempts/3/") and grant["prefix"] == \
        "team-a/runs/7/attempts/3/"


def test_a_checkpoint_holding_more_objects_than_any_checkpoint_is_refused_not_listed_whole(s3, monkeypatch):
    # A box's upload grant covers its attempt's whole folder: it could put millions of objects under one checkpoint.
    monkeypatch.setattr(storage, "MAX_CHECKPOINT_OBJECTS", 5)
    where = storage.Location("s3", BUCKET, "team/runs/7/")
    for i in range(12):
        s3.put_object(Bucket=BUCKET, Key=f"team/runs/7/attempts/3/ckpt-p00-s00000004/junk-{i}", Body=b"x")
    with pytest.raises(storage.TooManyObjects, match="more than 5 objects"):
        storage.written_files(where, "ckpt-p00-s00000004", 3)
    storage.delete_checkpoint(where, "ckpt-p00-s00000004", 3)  # pruning it still takes every one away
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="team/runs/7/").get("KeyCount") == 0
