"""Checkpoint storage on an S3-compatible server (moto's, on loopback): a box gets a presigned POST that only admits
keys under its run's prefix, and presigned GETs of the checkpoint it resumes from; never the account's key."""

import base64
import json
import socket
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto.server import ThreadedMotoServer

from runs import storage
from training.agent import Api, Uploader, restore

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
    yield client
    server.stop()


def _checkpoint(folder):
    (folder / "adapter").mkdir(parents=True)
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"weights" * 100)
    (folder / "trainer.pt").write_bytes(b"optimizer" * 100)
    (folder / "COMPLETE").write_text("done\n")
    return folder


def test_it_uploads_marker_last_and_restores_through_presigned_urls(s3, tmp_path):
    where = storage.location(f"s3://{BUCKET}/team-a", 7)
    grant = storage.upload_grant(where, expires_s=600)
    assert "account-secret" not in str(grant)
    uploader = Uploader(Api("http://127.0.0.1:9/", "unused"), grant, tmp_path / "outbox")
    folder = _checkpoint(tmp_path / "store" / "ckpt-p01-s00000004")
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        uploader._put(path, f"{folder.name}/{path.relative_to(folder)}")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert all(k.startswith("team-a/runs/7/ckpt-p01-s00000004/") for k in keys) and len(keys) == 3

    download = storage.download_grant(where, "ckpt-p01-s00000004", expires_s=600)
    assert set(download["files"]) == {"COMPLETE", "trainer.pt", "adapter/adapter_model.safetensors"}
    restore({"uri": "ckpt-p01-s00000004", "download": download}, tmp_path / "new-box")
    restored = tmp_path / "new-box" / "ckpt-p01-s00000004"
    assert (restored / "trainer.pt").read_bytes() == (folder / "trainer.pt").read_bytes()
    assert (restored / "COMPLETE").exists()


def test_it_grants_nothing_outside_the_runs_prefix_and_only_for_a_while(s3, tmp_path):
    # S3 refuses a POST whose key breaks the signed policy; moto accepts any key, so the policy itself is read here.
    grant = storage.upload_grant(storage.location(f"s3://{BUCKET}/team-a", 7), expires_s=600)
    policy = json.loads(base64.b64decode(grant["fields"]["policy"]))
    assert ["starts-with", "$key", "team-a/runs/7/"] in policy["conditions"]
    expires = datetime.fromisoformat(policy["expiration"].replace("Z", "+00:00"))
    assert timedelta(minutes=9) < expires - datetime.now(UTC) <= timedelta(minutes=10)
    assert grant["fields"]["key"].startswith("team-a/runs/7/")
