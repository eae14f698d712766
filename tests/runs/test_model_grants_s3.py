"""An s3:// base model (moto's server, on loopback): launch checks the dashboard can list it and sizes the disk by
its files; a box's spec lists each file under the prefix by size with a presigned GET of that key alone, expiring;
the agent downloads them into its folder, continues a partial file from where it stopped, and refuses a file whose
size is not the listed one."""

from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from runs import model_grants, storage
from runs.launch import LaunchError, disk_need, example_recipe, launch
from tests.runs.conftest import tiny_recipe
from training import model_source
from training.agent.inputs import fetch_model

from .test_storage_s3 import BUCKET, _Recorder, s3  # noqa: F401

pytestmark = pytest.mark.django_db
MODEL = f"s3://{BUCKET}/models/qwen3-tiny"
FILES = {"config.json": b'{"model_type": "qwen3_moe"}', "model-00001.safetensors": b"A" * 3000,
         "tokenizer/tokenizer.json": b"{}"}


@pytest.fixture(autouse=True)
def emptied_afterwards(s3):  # noqa: F811 - moto keeps one store per process, across its servers
    yield
    for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=item["Key"])


def _put_model(client, files=FILES):
    for name, data in files.items():
        client.put_object(Bucket=BUCKET, Key=f"models/qwen3-tiny/{name}", Body=data)
    client.put_object(Bucket=BUCKET, Key="models/qwen3-tiny-other/secret.bin", Body=b"not this model's")
    client.put_object(Bucket=BUCKET, Key="models/other/config.json", Body=b"{}")


def test_it_grants_each_file_under_the_models_prefix_only_by_size_and_expiring(s3):  # noqa: F811
    _put_model(s3)
    grant = model_grants.grant({"path": MODEL}, expires_s=600)
    assert grant["kind"] == "s3" and grant["files"] == {name: len(data) for name, data in FILES.items()}
    for name, url in grant["download"]["files"].items():
        query = parse_qs(urlparse(url).query)
        assert urlparse(url).path == f"/{BUCKET}/models/qwen3-tiny/{name}" and "account-secret" not in url
        assert query["X-Amz-Expires"] == ["600"] and query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
        assert datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ") > datetime.utcnow() - timedelta(minutes=1)
    assert model_grants.grant({"path": "Qwen/Qwen3-30B-A3B", "revision": "main"}, 600) == {
        "kind": "hub", "repo_id": "Qwen/Qwen3-30B-A3B", "revision": "main"}
    assert model_grants.grant({"config": {"model_type": "qwen3_moe"}}, 600) is None


def test_the_agent_downloads_the_model_continues_a_partial_file_and_hands_over_the_folder(s3, tmp_path):  # noqa: F811
    _put_model(s3)
    grant = model_grants.grant({"path": MODEL}, expires_s=600)
    root = tmp_path / "box" / "model"
    folder = root / model_source.folder_name(MODEL)
    (folder).mkdir(parents=True)
    (folder / "model-00001.safetensors.partial").write_bytes(b"B" * 1000)  # a killed download's first 1000 bytes
    api = _Recorder()
    model = fetch_model(api, grant, {"path": MODEL, "dtype": "float32"}, root)
    assert model == {"path": str(folder), "dtype": "float32", "revision": None}
    assert (folder / "config.json").read_bytes() == FILES["config.json"]
    assert (folder / "tokenizer" / "tokenizer.json").read_bytes() == b"{}"
    # continued from byte 1000, not fetched again: the bytes already on disk stay, the rest came from the bucket
    assert (folder / "model-00001.safetensors").read_bytes() == b"B" * 1000 + b"A" * 2000
    assert not list(folder.glob("*.partial")) and not (folder.parent / "qwen3-tiny-other").exists()
    assert [body["message"] for _, body in api.posts][0] == f"Downloading the model {MODEL} into the box's disk."
    assert "is on the box's disk: 0.00 GB" in api.posts[1][1]["message"]


def test_the_agent_refuses_a_file_whose_size_is_not_the_listed_one(s3, tmp_path):  # noqa: F811
    _put_model(s3)
    grant = model_grants.grant({"path": MODEL}, expires_s=600)
    s3.put_object(Bucket=BUCKET, Key="models/qwen3-tiny/model-00001.safetensors", Body=b"A" * 3500)  # changed since
    with pytest.raises(model_source.ModelRefused, match="model-00001.safetensors is larger than the 3,000 bytes"):
        fetch_model(_Recorder(), grant, {"path": MODEL}, tmp_path)
    assert not (tmp_path / model_source.folder_name(MODEL) / model_source.DONE).exists()


def test_a_launch_refuses_an_s3_model_the_dashboard_cannot_read_by_the_recipe(s3, tmp_path):  # noqa: F811
    for path, said in [(f"s3://{BUCKET}/models/missing", "holds no files"),
                       ("s3://no-such-bucket/models/x", "cannot be listed with the dashboard's key: NoSuchBucket")]:
        recipe = tiny_recipe(model={"path": path})
        with pytest.raises(LaunchError, match=said) as refused:
            launch(name="m", recipe=recipe, bucket=str(tmp_path / "b"), budget_usd=5, max_restarts=1)
        assert refused.value.field == "recipe"
    s3.put_object(Bucket=BUCKET, Key="models/weights-only/model.safetensors", Body=b"w")
    with pytest.raises(LaunchError, match="no config.json under it"):
        launch(name="m", recipe=tiny_recipe(model={"path": f"s3://{BUCKET}/models/weights-only"}),
               bucket=str(tmp_path / "b"), budget_usd=5, max_restarts=1)


def test_a_launch_sizes_the_disk_by_an_s3_models_files_when_they_outgrow_the_figure(s3, tmp_path,  # noqa: F811
                                                                                   monkeypatch):
    _put_model(s3)
    recipe = tiny_recipe(model={"path": MODEL})
    run = launch(name="m", recipe=recipe, bucket=str(tmp_path / "b"), budget_usd=5, max_restarts=1)
    assert run.disk_gb == disk_need(recipe).total_gb  # 3 kB of files: the ranking's figure holds them
    monkeypatch.setattr(storage, "model_files", lambda uri: {  # a 400 GB model, as listed
        "config.json": 10, "model.safetensors": 400 * 10**9})
    run = launch(name="big", recipe=recipe, bucket=str(tmp_path / "b"), budget_usd=5, max_restarts=1)
    assert run.disk_gb == disk_need(recipe, listed_weights_gb=400.0).total_gb > 400
    assert Path(run.bucket).is_dir()


def test_a_launch_sizes_an_s3_model_by_its_listing_and_signs_nothing(s3, tmp_path, monkeypatch):  # noqa: F811
    _put_model(s3)

    def signed(*args, **kwargs):
        raise AssertionError("the launch signed a link no box asked for")

    monkeypatch.setattr(storage, "_presigned_gets", signed)
    run = launch(name="m", recipe=tiny_recipe(model={"path": MODEL}), bucket=str(tmp_path / "b"), budget_usd=5,
                 max_restarts=1)
    assert run.pk and run.disk_gb > 0


def test_the_disk_a_run_needs_grows_with_its_lora_rank():
    recipe = example_recipe()
    recipe.pop("model")
    recipe["model"] = {"path": "Qwen/Qwen3-30B-A3B"}
    small, large = disk_need({**recipe, "lora": {"r": 32}}), disk_need({**recipe, "lora": {"r": 1024}})
    assert large.checkpoint_gb == round(small.checkpoint_gb * 32, 1)
    assert large.total_gb > small.total_gb + small.checkpoints * small.checkpoint_gb * 30
