"""Sealing on an S3-compatible server (moto's, on loopback), through the agent API as boxes use it: a box's presigned
POST admits only its own attempt's folder and expires within STORAGE_UPLOAD_GRANT_S; a declared checkpoint is checked
there and copied server-side into the run's folder, which is all a later box or a serving box reads."""

import base64
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.test import Client

from runs import serving, storage
from runs.launch import launch
from tests.runs.conftest import put_on_a_box, tiny_recipe
from training.agent import Api, manifest_of, restore
from training.agent.uploads import Uploader

from .test_storage_s3 import BUCKET, _checkpoint, _Recorder, s3  # noqa: F401

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"


@pytest.fixture(autouse=True)
def emptied_afterwards(s3):  # noqa: F811 - moto keeps one store per process, across its servers
    yield
    for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=item["Key"])


def _post(client, path, body):
    return client.post(API + path, json.dumps(body), content_type="application/json")


class _Box:
    """A box of an S3 run: its token, the POST grant its last heartbeat brought, and the agent's uploader."""

    def __init__(self, run, tmp_path):
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
        self.grant = self.beat().json()["upload"]
        self.uploader = Uploader(Api("http://127.0.0.1:9/", "unused"), self.grant, tmp_path / "outbox")

    def beat(self):
        return _post(self.client, "/heartbeat", {"state": "training", "process_alive": True})

    def put(self, path, key):
        self.uploader._put(path, key)  # the agent's own POST: key = grant["prefix"] + key

    def declare(self, folder, phase, step):
        manifest = manifest_of(folder)
        for name in manifest:
            self.put(folder / name, f"{folder.name}/{name}")
        return _post(self.client, "/checkpoints", {"phase": phase, "step": step, "uri": folder.name,
                                                   "complete": True, "manifest": manifest})

    def prefix(self) -> str:
        """The one key prefix the signed policy admits."""
        policy = json.loads(base64.b64decode(self.grant["fields"]["policy"]))
        (prefix,) = {c[2] for c in policy["conditions"] if isinstance(c, list) and c[:2] == ["starts-with", "$key"]}
        return prefix

    def expires_in(self) -> timedelta:
        policy = json.loads(base64.b64decode(self.grant["fields"]["policy"]))
        return datetime.fromisoformat(policy["expiration"].replace("Z", "+00:00")) - datetime.now(UTC)


def _run():
    return launch(name="s3", recipe=tiny_recipe(), bucket=f"s3://{BUCKET}/team-a", budget_usd=Decimal("5"),
                  max_restarts=3)


def _key(url: str) -> str:
    return url.split(f"/{BUCKET}/", 1)[1].split("?", 1)[0]


def test_a_replaced_boxs_grant_reaches_nothing_its_successor_resumes_from_and_runs_out_soon(s3, tmp_path):  # noqa: F811
    run = _run()
    old = _Box(run, tmp_path / "old")
    assert timedelta(minutes=14) < old.expires_in() <= timedelta(minutes=15)  # STORAGE_UPLOAD_GRANT_S
    folder = _checkpoint(tmp_path / "store" / "ckpt-p00-s00000002")
    assert old.declare(folder, 0, 2).status_code == 200
    new = _Box(run, tmp_path / "new")
    assert old.beat().status_code == 401  # no fresh grant for a replaced box
    spec = new.client.get(API + "/spec").json()
    read = [_key(url) for c in spec["resume"] for url in c["download"]["files"].values()]
    read += [_key(url) for p in spec["phases"] if p["data"] for url in p["data"]["download"]["files"].values()]
    assert read and not [key for key in read if key.startswith(old.prefix())]
    # The old box, its grant still valid, overwrites the checkpoint where its grant lets it.
    (tmp_path / "evil.pt").write_bytes(b"pickled-code" * 75)
    old.put(tmp_path / "evil.pt", "ckpt-p00-s00000002/trainer.pt")
    api = _Recorder()
    chosen = restore(api, spec["resume"], tmp_path / "new-box")
    assert chosen is not None and chosen["step"] == 2 and api.posts == []
    assert (tmp_path / "new-box" / "ckpt-p00-s00000002" / "trainer.pt").read_bytes() == \
        (folder / "trainer.pt").read_bytes()


def test_objects_a_replaced_box_planted_under_the_next_name_do_not_fail_the_honest_one(s3, tmp_path,  # noqa: F811
                                                                                        monkeypatch):
    monkeypatch.setattr(storage, "MAX_CHECKPOINT_OBJECTS", 5)
    run = _run()
    old = _Box(run, tmp_path / "old")
    new = _Box(run, tmp_path / "new")
    (tmp_path / "junk").write_bytes(b"x")
    for i in range(8):  # more objects under the next checkpoint's name than any checkpoint holds
        old.put(tmp_path / "junk", f"ckpt-p00-s00000004/junk-{i}")
    # And something left in the run's sealed folder from before (a checkpoint refused and trained again).
    s3.put_object(Bucket=BUCKET, Key=f"team-a/runs/{run.pk}/ckpt-p00-s00000004/stale.bin", Body=b"stale")
    folder = _checkpoint(tmp_path / "store" / "ckpt-p00-s00000004")
    answer = new.declare(folder, 0, 4)
    assert answer.status_code == 200, answer.content
    sealed = f"team-a/runs/{run.pk}/ckpt-p00-s00000004/"
    keys = sorted(o["Key"][len(sealed):] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=sealed)["Contents"])
    assert keys == ["COMPLETE", "adapter/adapter_model.safetensors", "trainer.pt"]
    # What the box uploaded is deleted once sealed; what the old box left stays in its own folder until emptied.
    assert not s3.list_objects_v2(Bucket=BUCKET, Prefix=new.prefix()).get("KeyCount")
    chosen = restore(_Recorder(), new.client.get(API + "/spec").json()["resume"], tmp_path / "new-box")
    assert chosen["step"] == 4


def test_a_finished_runs_adapters_lie_where_none_of_its_boxes_could_write(s3, tmp_path):  # noqa: F811
    run = _run()
    boxes = [_Box(run, tmp_path / "first"), _Box(run, tmp_path / "second")]
    folder = _checkpoint(tmp_path / "store" / "ckpt-p00-s00000002")
    assert boxes[1].declare(folder, 0, 2).status_code == 200
    adapter = serving.adapter_folder(run, run.checkpoints.get())
    assert adapter.startswith(f"s3://{BUCKET}/team-a/runs/{run.pk}/ckpt-p00-s00000002/")
    for box in boxes:
        assert not adapter.removeprefix(f"s3://{BUCKET}/").startswith(box.prefix())
    assert Path(adapter).name == "vllm"
