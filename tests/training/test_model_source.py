"""A run's base model reaches the box's disk once: a hub model through snapshot_download into the agent's folder
(tried again, the token never in what is said), an s3:// model through its presigned GETs (tests/runs/
test_model_grants_s3.py); and a recipe names a model by a folder, a hub id's shape or an s3://bucket/prefix."""

import json

import pytest

from training import model_source
from training.model_source import ModelRefused
from training.recipe import RecipeError, validate


def _fake_snapshot(files: dict[str, bytes], fail_first: int = 0, calls: list | None = None):
    """snapshot_download's part the agent relies on: files into local_dir; the first `fail_first` calls are killed
    halfway through the first file, leaving what huggingface_hub leaves (a partial file) for the next call."""
    calls = [] if calls is None else calls

    def snapshot(repo_id, *, revision, local_dir, token):
        calls.append({"repo_id": repo_id, "revision": revision, "local_dir": local_dir, "token": token})
        for number, (name, data) in enumerate(sorted(files.items())):
            partial = model_source.Path(local_dir) / ".cache" / f"{name}.incomplete"
            partial.parent.mkdir(parents=True, exist_ok=True)
            have = partial.read_bytes() if partial.exists() else b""
            if len(calls) <= fail_first and number == 0:
                partial.write_bytes(data[: len(data) // 2])
                raise ConnectionError(f"connection reset while fetching {name} with token {token}")
            assert data.startswith(have)  # continued, not fetched again
            (model_source.Path(local_dir) / name).write_bytes(data)
            partial.unlink(missing_ok=True)
        return local_dir

    return snapshot, calls


def test_it_downloads_a_hub_model_once_per_box_continuing_a_killed_download(tmp_path):
    files = {"config.json": b'{"model_type": "qwen3_moe"}', "model.safetensors": b"w" * 1000}
    snapshot, calls = _fake_snapshot(files, fail_first=1)
    grant = {"kind": "hub", "repo_id": "Qwen/Qwen3-30B-A3B", "revision": "main"}
    folder = model_source.fetch(grant, tmp_path, token="hf_secret", snapshot=snapshot, sleep=lambda s: None)
    assert folder == tmp_path / "Qwen_Qwen3-30B-A3B" and (folder / "model.safetensors").read_bytes() == b"w" * 1000
    assert [c["token"] for c in calls] == ["hf_secret", "hf_secret"] and calls[0]["local_dir"] == str(folder)
    assert json.loads((folder / model_source.DONE).read_text())["reference"] == "Qwen/Qwen3-30B-A3B"

    again = model_source.fetch(grant, tmp_path, token="hf_secret", snapshot=snapshot)
    assert again == folder and len(calls) == 2  # the box has it: the hub is not asked again


def test_it_refuses_a_hub_model_it_cannot_download_without_saying_the_token(tmp_path):
    snapshot, calls = _fake_snapshot({"model.safetensors": b"w" * 10}, fail_first=9)
    with pytest.raises(ModelRefused) as refused:
        model_source.fetch({"kind": "hub", "repo_id": "org/private", "revision": None}, tmp_path,
                           token="hf_secret", snapshot=snapshot, tries=3, sleep=lambda s: None)
    assert len(calls) == 3 and "connection reset" in str(refused.value) and "org/private" in str(refused.value)
    assert "hf_secret" not in str(refused.value) and "[HF_TOKEN]" in str(refused.value)
    assert not (tmp_path / "org_private" / model_source.DONE).exists()


def test_it_does_not_retry_a_repository_the_hub_says_does_not_exist(tmp_path):
    import httpx
    from huggingface_hub.errors import RepositoryNotFoundError

    calls = []
    url = "https://huggingface.co/api/models/org/none/revision/main"

    def snapshot(repo_id, **kwargs):
        calls.append(repo_id)
        raise RepositoryNotFoundError(f"404 Client Error. Repository Not Found for url: {url}",
                                      response=httpx.Response(404, request=httpx.Request("GET", url)))

    with pytest.raises(ModelRefused, match="Repository Not Found"):
        model_source.fetch({"kind": "hub", "repo_id": "org/none"}, tmp_path, snapshot=snapshot, sleep=lambda s: None)
    assert calls == ["org/none"]


def test_it_refuses_what_the_dashboard_could_not_grant(tmp_path):
    with pytest.raises(ModelRefused, match="could not grant the model: s3://m/x holds no files"):
        model_source.fetch({"kind": "refused", "uri": "s3://m/x", "reason": "s3://m/x holds no files"}, tmp_path)


def _recipe(**model):
    return {"model": model, "phases": [{"kind": "cpt", "data": "x.jsonl", "steps": 1}]}


@pytest.mark.parametrize("path", ["Qwen/Qwen3-30B-A3B", "gpt2", "s3://team-models/qwen3-30b",
                                  "s3://team-models/base/qwen3-30b/"])
def test_a_recipe_takes_a_hub_id_or_an_s3_prefix(path):
    assert validate(_recipe(path=path), data_on_disk=False)["model"]["path"] == path


@pytest.mark.parametrize(("path", "said"), [
    ("/no/such/folder", "no folder /no/such/folder here, and not a hub id"),
    ("Qwen/Qwen3/30B", "one '/'"),
    ("Qwen/-bad", "neither starts or ends with '-' or '.'"),
    ("org/a--b", "no '--' or '..'"),
    ("org/model.git", "does not end in '.git'"),
    ("s3://Team_Models/qwen", "the bucket 3 to 63 lower-case letters"),
    ("s3://team-models", "not the whole bucket"),
    ("s3://team-models/a//b", "no '?', '#' or empty parts"),
    ("", "a folder, a hub id (owner/name) or an s3://bucket/prefix"),
])
def test_a_recipe_says_what_is_wrong_with_its_model_path(path, said):
    with pytest.raises(RecipeError, match="model.path") as refused:
        validate(_recipe(path=path), data_on_disk=False)
    assert said in str(refused.value)


def test_a_recipe_takes_a_revision_for_a_hub_model_only():
    assert validate(_recipe(path="Qwen/Qwen3-30B-A3B", revision="v1.0"), data_on_disk=False)["model"]["revision"] \
        == "v1.0"
    for model in ({"path": "s3://team-models/qwen", "revision": "v1.0"},
                  {"config": {"model_type": "qwen3_moe"}, "revision": "v1.0"}):
        with pytest.raises(RecipeError, match="model.revision: a hub model's branch, tag or commit"):
            validate(_recipe(**model), data_on_disk=False)
    with pytest.raises(RecipeError, match="model.tokenizer: a folder or a hub id"):
        validate(_recipe(path="s3://team-models/qwen", tokenizer="s3://team-models/tok"), data_on_disk=False)


def test_the_trainer_reads_an_s3_model_only_from_its_downloaded_folder():
    from training.recipe import ModelSettings
    from training.train import build_model

    with pytest.raises(RecipeError, match="an s3:// model is read from its downloaded folder"):
        build_model(ModelSettings(path="s3://team-models/qwen", dtype="float32"), "cpu")
