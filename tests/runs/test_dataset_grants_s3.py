"""Data sets in an S3-compatible bucket (moto's server, on loopback): a launch stores each phase's data under the
bucket's datasets/<sha256>/ prefix (from an upload or from an s3:// object the user names), and a box reads it only
through presigned GETs of exactly that prefix's file, which expire."""

from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from runs import datasets, reports
from runs.launch import LaunchError, example_recipe, launch
from runs.models import Run
from training.agent.inputs import fetch_data

from .conftest import put_on_a_box
from .test_datasets import GOOD, jsonl
from .test_storage_s3 import BUCKET, s3  # noqa: F401

pytestmark = pytest.mark.django_db


def _recipe(data):
    recipe = example_recipe()
    recipe["phases"] = [dict(recipe["phases"][1], data=data)]
    return recipe


def test_it_stores_a_named_s3_object_under_the_buckets_datasets_prefix_and_grants_only_it(s3, tmp_path):  # noqa: F811
    content = jsonl(GOOD["sft"], GOOD["sft"])
    s3.put_object(Bucket=BUCKET, Key="incoming/chat.jsonl", Body=content)
    s3.put_object(Bucket=BUCKET, Key="team-a/secret.txt", Body=b"not for boxes")
    run = launch(name="s3", recipe=_recipe(f"s3://{BUCKET}/incoming/chat.jsonl"), bucket=f"s3://{BUCKET}/team-a",
                 budget_usd=5, max_restarts=1)
    dataset = run.phases.get().dataset
    prefix = f"team-a/datasets/{dataset.sha256}/"
    assert dataset.uri == f"s3://{BUCKET}/{prefix}" and dataset.name == f"s3://{BUCKET}/incoming/chat.jsonl"
    assert s3.get_object(Bucket=BUCKET, Key=prefix + "data.jsonl")["Body"].read() == content

    grant = datasets.box_grant(dataset, expires_s=600)["download"]
    assert grant["kind"] == "s3-get" and list(grant["files"]) == ["data.jsonl"]
    url = urlparse(grant["files"]["data.jsonl"])
    query = parse_qs(url.query)
    assert url.path == f"/{BUCKET}/{prefix}data.jsonl" and "account-secret" not in grant["files"]["data.jsonl"]
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Expires"] == ["600"]
    assert datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ") > datetime.utcnow() - timedelta(minutes=1)

    spec_phases = [{"index": 0, "name": "sft", "data": datasets.box_grant(dataset, expires_s=600)}]
    fetched = fetch_data(spec_phases, run.recipe["phases"], tmp_path / "box")
    assert Path(fetched[0]["data"]).read_bytes() == content


def test_the_boxs_spec_grants_each_phases_data_for_the_storage_grants_time(s3, settings):  # noqa: F811
    # moto serves a presigned URL after its time, so the signed expiry itself is read here (S3 refuses it then).
    settings.STORAGE_GRANT_S = 900
    run = launch(name="s3", recipe=_recipe("example:sft.jsonl"), bucket=f"s3://{BUCKET}/team-a", budget_usd=5,
                 max_restarts=1)
    put_on_a_box(run)
    data = reports.spec(run.attempts.get())["phases"][0]["data"]
    url = data["download"]["files"]["data.jsonl"]
    signed = parse_qs(urlparse(url).query)
    assert signed["X-Amz-Expires"] == ["900"] and signed["X-Amz-SignedHeaders"] == ["host"]
    assert urlparse(url).path == f"/{BUCKET}/team-a/datasets/{data['sha256']}/data.jsonl"
    assert data["manifest"] == {"data.jsonl": {"size": run.phases.get().dataset.size_bytes, "sha256": data["sha256"]}}
    assert httpx.get(url).status_code == 200


def test_an_s3_object_that_cannot_be_read_is_said_before_anything_is_rented(s3):  # noqa: F811
    with pytest.raises(LaunchError, match=r"phases\[0\] \(sft\)\.data s3://checkpoints/missing.jsonl: cannot be read"):
        launch(name="s3", recipe=_recipe(f"s3://{BUCKET}/missing.jsonl"), bucket=f"s3://{BUCKET}/team-a",
               budget_usd=5, max_restarts=1)


def test_an_s3_object_over_the_size_limit_is_refused_before_it_is_downloaded(s3, settings, tmp_path):  # noqa: F811
    settings.DATASET_MAX_BYTES = 1000
    s3.put_object(Bucket=BUCKET, Key="incoming/huge.jsonl", Body=b"x" * 5000)
    with pytest.raises(LaunchError, match=r"huge.jsonl: is 5,000 bytes, more than the 1,000 a data file may be"):
        launch(name="s3", recipe=_recipe(f"s3://{BUCKET}/incoming/huge.jsonl"), bucket=f"s3://{BUCKET}/team-a",
               budget_usd=5, max_restarts=1)
    assert not Run.objects.exists()
