"""A manifest's names and digests are exactly what they say: a trailing newline is not tolerated as the end of one."""

import hashlib
import json
from pathlib import Path

import pytest
from django.test import Client

from runs import manifests
from tests.runs.conftest import put_on_a_box

DATA = b"optimizer" * 10
DIGEST = hashlib.sha256(DATA).hexdigest()


@pytest.mark.parametrize("manifest", [{"trainer.pt\n": {"size": len(DATA), "sha256": DIGEST}},
                                      {"adapter/a.safetensors\n": {"size": len(DATA), "sha256": DIGEST}},
                                      {"trainer.pt": {"size": len(DATA), "sha256": DIGEST + "\n"}}])
def test_it_refuses_a_name_or_a_sha256_with_a_trailing_newline(manifest):
    with pytest.raises(manifests.ManifestError):
        manifests.validated(manifest)


def test_it_still_takes_a_plain_manifest():
    manifest = {"adapter/a.safetensors": {"size": len(DATA), "sha256": DIGEST}}
    assert manifests.validated(manifest) == manifest


@pytest.mark.django_db
@pytest.mark.parametrize("name, digest", [("trainer.pt\n", DIGEST), ("trainer.pt", DIGEST + "\n")])
def test_a_box_cannot_declare_such_a_checkpoint_complete(launched, name, digest):
    run = launched()
    uri = "ckpt-p00-s00000004"
    folder = Path(run.bucket) / "runs" / str(run.pk) / uri
    folder.mkdir(parents=True)
    (folder / name).write_bytes(DATA)  # the store holds the file under that very name
    notice = {"phase": 0, "step": 4, "uri": uri, "complete": True,
              "manifest": {name: {"size": len(DATA), "sha256": digest}}}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    response = client.post("/api/agent/v1/checkpoints", json.dumps(notice), content_type="application/json")
    assert response.status_code == 409 and "file" in response.json()["detail"]
    assert not run.checkpoints.filter(complete=True).exists()
