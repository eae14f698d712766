"""An s3:// import never reads another user's file from the product's own storage (each run's checkpoints and the
data set store under every bucket the product writes), and says so in the same words whether the object exists or
not, before anything there is read; outside it, and a user's own data set, are read as before (moto's server)."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from runs import sharing
from runs.launch import LaunchError, launch
from runs.models import Run

from .conftest import tiny_recipe
from .test_datasets import GOOD, jsonl, sft_recipe
from .test_storage_s3 import BUCKET, s3  # noqa: F401

pytestmark = pytest.mark.django_db
ALICES = jsonl(GOOD["sft"], GOOD["sft"], GOOD["sft"])


def _launch(user, data, bucket, uploads=None, recipe=None) -> Run:
    return launch(name="r", recipe=recipe or sft_recipe(data), bucket=bucket, budget_usd=5, max_restarts=1,
                  user=user, uploads=uploads)


def _refusal(user, uri, bucket=f"s3://{BUCKET}/team-b") -> str:
    with pytest.raises(LaunchError) as refused:
        _launch(user, uri, bucket)
    return str(refused.value).replace(uri, "<uri>")


@pytest.fixture
def alices_file(s3, alice):  # noqa: F811
    run = _launch(alice, "chat.jsonl", f"s3://{BUCKET}/team-a", {"chat.jsonl": SimpleUploadedFile("c", ALICES)})
    dataset = run.phases.get().dataset
    assert dataset.uri == f"s3://{BUCKET}/team-a/datasets/{dataset.sha256}/"
    return dataset


def test_another_users_stored_file_is_refused_in_the_same_words_as_one_that_is_not_there(
        s3, alices_file, bob, alice):  # noqa: F811
    theirs = f"{alices_file.uri}data.jsonl"
    absent = f"s3://{BUCKET}/team-a/datasets/{'0' * 64}/data.jsonl"
    s3.put_object(Bucket=BUCKET, Key="team-a/runs/1/ckpt-p00-s00000002/adapter/adapter_model.safetensors",
                  Body=b"alice's adapter")
    checkpoint = f"s3://{BUCKET}/team-a/runs/1/ckpt-p00-s00000002/adapter/adapter_model.safetensors"
    said = {_refusal(bob, uri) for uri in (theirs, absent, checkpoint)}
    said.add(_refusal(bob, theirs, bucket=f"s3://{BUCKET}/team-a"))  # into Alice's bucket: the same
    assert len(said) == 1 and sharing.PRODUCT_STORAGE in said.pop()
    # "a//b" is one object to S3 and another to a store that cleans paths: not taken at all.
    assert "empty, . or .. part" in _refusal(bob, f"s3://{BUCKET}/team-a//datasets/{alices_file.sha256}/data.jsonl")
    assert Run.objects.filter(created_by=bob).count() == 0

    # Alice reads her own stored file by its URI; anyone reads an object outside the product's storage.
    again = _launch(alice, theirs, f"s3://{BUCKET}/team-a").phases.get().dataset
    assert again == alices_file
    s3.put_object(Bucket=BUCKET, Key="incoming/chat.jsonl", Body=jsonl(GOOD["sft"]))
    assert _launch(bob, f"s3://{BUCKET}/incoming/chat.jsonl", f"s3://{BUCKET}/team-b").phases.get().dataset


def test_a_model_prefix_in_or_around_the_products_storage_is_refused_before_it_is_listed(
        s3, alices_file, bob):  # noqa: F811
    for path in (f"s3://{BUCKET}/team-a/runs/1", f"s3://{BUCKET}/team-a", f"s3://{BUCKET}/team-a/datasets"):
        with pytest.raises(LaunchError, match="lies in the product's own storage"):
            _launch(bob, "example:sft.jsonl", f"s3://{BUCKET}/team-b", recipe=tiny_recipe(model={"path": path}))


def test_a_model_prefix_the_product_writes_into_after_the_launch_is_refused_to_the_box(s3, alice, bob):  # noqa: F811
    """Launched while nothing of the product's lay under its model prefix, a run must not hand its box the other runs'
    checkpoints that land there later: the prefix is checked again each time the box's grant is signed."""
    from runs import model_grants

    from .conftest import put_on_a_box

    s3.put_object(Bucket=BUCKET, Key="shared/config.json", Body=b'{"model_type": "qwen3_moe"}')
    path = f"s3://{BUCKET}/shared"
    run = _launch(bob, "example:sft.jsonl", f"s3://{BUCKET}/team-b", recipe=tiny_recipe(model={"path": path}))
    put_on_a_box(run)
    assert model_grants.for_attempt(run.attempts.get())["kind"] == "s3"  # nothing of the product's there yet
    _launch(alice, "chat.jsonl", f"s3://{BUCKET}/shared/alice", {"chat.jsonl": SimpleUploadedFile("c", ALICES)})
    put_on_a_box(run)  # a new attempt (a replaced box) signs its grant anew
    refused = model_grants.for_attempt(run.attempts.get(ended_at=None))
    assert refused["kind"] == "refused" and "product's own storage" in refused["reason"]
    assert "files" not in refused
