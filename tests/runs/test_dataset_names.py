"""A stored data set is found by name only among the launching user's own, in the run's bucket: another user's file of
that name is never trained on, one stored in another bucket (which the run's boxes are not granted) is uploaded
again, and a user's own is reused, the newest they stored under that name first."""

import importlib
from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps
from django.core.files.uploadedfile import SimpleUploadedFile

from runs import datasets
from runs.launch import LaunchError, launch
from runs.models import DataSet, DataSetName, Run

from .test_datasets import GOOD, jsonl, sft_recipe

pytestmark = pytest.mark.django_db
MONDAY = datetime(2026, 3, 2, 9, tzinfo=UTC)
MINE = jsonl(GOOD["sft"])
THEIRS = jsonl(GOOD["sft"], GOOD["sft"])


@pytest.fixture
def bucket(tmp_path):
    return str(tmp_path / "bucket")


def launched(bucket, user, data="train.jsonl", content=None, *, now=MONDAY, kind_recipe=sft_recipe) -> Run:
    """A run whose one phase names `data`, with `content` uploaded under that name (none: nothing uploaded)."""
    uploads = {data: SimpleUploadedFile(data, content)} if content is not None else None
    return launch(name=f"run-{Run.objects.count()}", recipe=kind_recipe(data), bucket=bucket, budget_usd=5,
                  max_restarts=1, user=user, uploads=uploads, now=now)


def trained_on(run) -> DataSet:
    return run.phases.get().dataset


def test_it_reuses_the_users_own_stored_set_by_name(bucket, alice):
    first = trained_on(launched(bucket, alice, content=MINE))
    again = trained_on(launched(bucket, alice, now=MONDAY + timedelta(hours=1)))
    assert again == first and DataSet.objects.count() == 1
    assert again.bucket == bucket and again.uri.startswith(bucket)


def test_it_never_trains_one_user_on_anothers_file_of_that_name(bucket, alice, bob):
    alices = trained_on(launched(bucket, alice, content=MINE))
    with pytest.raises(LaunchError) as refused:
        launched(bucket, bob)
    message = str(refused.value)
    assert "phases[0] (sft).data train.jsonl: is neither a file uploaded with this launch nor a sft data set you " \
           "stored under that name in this run's bucket" in message
    assert "no one else's is used" in message
    assert "alice" not in message and alices.sha256[:12] not in message and alices.uri not in message
    assert Run.objects.count() == 1

    # Bob uploads his own train.jsonl: each of them then trains on their own by that name.
    bobs = trained_on(launched(bucket, bob, content=THEIRS, now=MONDAY + timedelta(hours=1)))
    assert bobs != alices and bobs.sha256 != alices.sha256
    assert trained_on(launched(bucket, alice, now=MONDAY + timedelta(hours=2))) == alices
    assert trained_on(launched(bucket, bob, now=MONDAY + timedelta(hours=2))) == bobs


def test_a_set_stored_in_another_bucket_is_not_reused(tmp_path, bucket, alice):
    other = str(tmp_path / "other-bucket")
    elsewhere = trained_on(launched(other, alice, content=MINE))
    with pytest.raises(LaunchError, match="yours of that name is stored in .*other-bucket, which this run's boxes are "
                                          "not granted"):
        launched(bucket, alice)
    assert Run.objects.count() == 1

    # Uploaded again with a run into this bucket, it is stored here, and the box is granted this copy.
    here = trained_on(launched(bucket, alice, content=MINE, now=MONDAY + timedelta(hours=1)))
    assert here != elsewhere and here.sha256 == elsewhere.sha256
    assert here.bucket == bucket and here.uri.startswith(bucket)
    assert datasets.box_grant(here, 60)["download"] != datasets.box_grant(elsewhere, 60)["download"]
    assert trained_on(launched(bucket, alice, now=MONDAY + timedelta(hours=2))) == here


def test_a_set_checked_for_another_kind_is_not_reused_and_the_error_says_so(bucket, alice):
    launched(bucket, alice, content=MINE)

    def dpo_recipe(data):
        recipe = sft_recipe(data)
        recipe["phases"][0] = dict(recipe["phases"][0], kind="dpo", name="dpo")
        return recipe

    with pytest.raises(LaunchError, match="yours of that name in this bucket was checked as sft data, not dpo"):
        launched(bucket, alice, kind_recipe=dpo_recipe)


def test_the_same_bytes_from_two_users_are_stored_once_and_each_finds_them_by_their_own_name(bucket, alice, bob):
    alices = trained_on(launched(bucket, alice, "alice.jsonl", MINE))
    bobs = trained_on(launched(bucket, bob, "bob.jsonl", MINE, now=MONDAY + timedelta(hours=1)))
    assert bobs == alices and DataSet.objects.count() == 1
    assert (alices.name, alices.uploaded_by) == ("alice.jsonl", alice)  # the row keeps its first upload's

    later = MONDAY + timedelta(hours=2)
    assert trained_on(launched(bucket, bob, "bob.jsonl", now=later)) == alices
    with pytest.raises(LaunchError, match="no one else's is used"):
        launched(bucket, bob, "alice.jsonl", now=later)
    with pytest.raises(LaunchError, match="no one else's is used"):
        launched(bucket, alice, "bob.jsonl", now=later)


def test_a_name_finds_the_newest_file_the_user_stored_under_it(bucket, alice):
    first = trained_on(launched(bucket, alice, content=MINE))
    second = trained_on(launched(bucket, alice, content=THEIRS, now=MONDAY + timedelta(hours=1)))
    assert trained_on(launched(bucket, alice, now=MONDAY + timedelta(hours=2))) == second

    # The first file uploaded again under that name is the newest again, though its row is the old one.
    assert trained_on(launched(bucket, alice, content=MINE, now=MONDAY + timedelta(hours=3))) == first
    assert trained_on(launched(bucket, alice, now=MONDAY + timedelta(hours=4))) == first
    assert DataSet.objects.count() == 2


def test_a_launch_by_no_user_finds_only_what_no_user_stored(bucket, alice):
    by_product = trained_on(launched(bucket, None, content=MINE))
    assert trained_on(launched(bucket, None, now=MONDAY + timedelta(hours=1))) == by_product
    with pytest.raises(LaunchError, match="no one else's is used"):
        launched(bucket, alice)

    alices = trained_on(launched(bucket, alice, content=THEIRS, now=MONDAY + timedelta(hours=2)))
    assert trained_on(launched(bucket, None, now=MONDAY + timedelta(hours=3))) == by_product != alices


def test_the_migration_gives_each_stored_set_its_uploaders_name(bucket, alice):
    stored = trained_on(launched(bucket, alice, content=MINE))
    DataSetName.objects.all().delete()  # as it was before names were recorded
    importlib.import_module("runs.migrations.0007_dataset_names").names_of_stored_sets(apps, None)
    assert list(DataSetName.objects.values_list("dataset", "user", "name", "stored_at")) == [
        (stored.pk, alice.pk, "train.jsonl", stored.created_at)]
    assert trained_on(launched(bucket, alice, now=MONDAY + timedelta(hours=1))) == stored
