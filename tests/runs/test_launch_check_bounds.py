"""A launch's checks are bounded in time and memory, and what is wrong is said on the form, never a 500: a record
nested too deep is refused by its line, a record of many MiB is checked in seconds with its sample cut for showing, a
chat template that loops too long is refused within seconds, a tokenizer folder on the dashboard's disk is refused
like a model's, and the data check stops reading at its time budget. The box's own reading keeps the same bounds."""

import html
import json
import time

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from runs import datasets, sample_render
from runs.models import DataSet, Run
from training import records
from training.records import read_records

from .test_datasets import GOOD, BAD, _launch_form, jsonl

pytestmark = pytest.mark.django_db
LOOP_BOMB = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"


@pytest.fixture
def launcher(staff):
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    return staff


def _post(client, tmp_path, kind: str, content: bytes, recipe_change=lambda r: r) -> tuple[int, str, float]:
    """The launch form posted with `content` uploaded as the data of the phase of this kind: (status, page, seconds)."""
    form = _launch_form(client)
    form["bucket"] = str(tmp_path / "bucket")
    form["recipe"] = recipe_change(form["recipe"].replace(f"data: example:{kind}.jsonl", "data: upload.jsonl"))
    started = time.monotonic()
    response = client.post(reverse("run_launch"), {**form, "data_files": [SimpleUploadedFile("upload.jsonl",
                                                                                              content)]})
    return response.status_code, html.unescape(response.content.decode()), time.monotonic() - started


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_record_nested_too_deep_is_refused_by_its_line_and_nothing_is_stored(client, launcher, tmp_path):
    client.force_login(launcher)
    legal_but_deep = {**GOOD["sft"], "extra": json.loads(_nested(records.MAX_RECORD_DEPTH))}
    content = jsonl(GOOD["sft"]) + _nested(100_000).encode() + b"\n" + jsonl(legal_but_deep)
    status, page, _ = _post(client, tmp_path, "sft", content)
    assert status == 200
    assert f"phases[1] (sft).data upload.jsonl: line 2: nested deeper than {records.MAX_RECORD_DEPTH} levels" in page
    assert f"phases[1] (sft).data upload.jsonl: line 3: nested deeper than {records.MAX_RECORD_DEPTH} levels" in page
    assert not Run.objects.exists() and not DataSet.objects.filter(name="upload.jsonl").exists()


def test_the_boxs_reading_refuses_a_deep_or_long_record_by_its_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(GOOD["cpt"]) + _nested(100_000).encode() + b"\n")
    with pytest.raises(ValueError, match=rf"data.jsonl:2: nested deeper than {records.MAX_RECORD_DEPTH} levels"):
        read_records(path, "cpt")
    path.write_bytes(jsonl(GOOD["cpt"], {"text": "x" * 5000}))
    with pytest.raises(ValueError, match=r"data.jsonl:2: longer than 1,024 bytes"):
        read_records(path, "cpt", max_bytes=1024)


def test_a_record_of_14_mib_is_checked_in_seconds_and_its_sample_is_cut(client, launcher, tmp_path):
    client.force_login(launcher)
    big = {"text": "the router sends each token " * (14 * 1024**2 // 28)}
    long = {"text": "word " * 50_000}  # rendered: 250,000 characters, more than a sample shows
    status, page, seconds = _post(client, tmp_path, "cpt", jsonl(big, long))
    assert status == 302 and seconds < 10, (status, seconds)
    dataset = DataSet.objects.get(name="upload.jsonl")
    assert dataset.rows == 2 and dataset.report["records_measured"] == 1
    sample = dataset.report["sample"]
    assert sample["line"] == 2 and sum(len(text) for text, _ in sample["segments"]) == sample_render.SAMPLE_CHARS
    assert sample["more_chars"] == 250_000 + len("<eos>") - sample_render.SAMPLE_CHARS
    detail = html.unescape(client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode())
    assert f"Line 1 not rendered here: a launch renders records of at most {datasets.RENDER_MAX_BYTES:,}" in detail
    assert f"... ({sample['more_chars']} more characters, not shown)" in detail

    # A row whose sample was stored whole (before the cut) is cut when shown.
    dataset.report = {**dataset.report, "sample": {"line": 1, "segments": [["y" * 5_000_000, True]]}}
    dataset.save()
    detail = client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert "y" * sample_render.SAMPLE_CHARS in detail and "y" * (sample_render.SAMPLE_CHARS + 1) not in detail
    assert f"... ({5_000_000 - sample_render.SAMPLE_CHARS} more characters, not shown)" in detail


@pytest.mark.timeout(60)  # without a bound the template runs for hours
def test_a_chat_template_that_loops_too_long_is_refused_in_seconds(client, launcher, tmp_path, monkeypatch):
    from tests.training.test_chat_render import tiny_tokenizer

    monkeypatch.setattr(records, "load_tokenizer", lambda model, vocab_size: tiny_tokenizer(LOOP_BOMB))
    client.force_login(launcher)
    status, page, seconds = _post(client, tmp_path, "sft", jsonl(GOOD["sft"]))
    assert status == 200 and seconds < 30, (status, seconds)  # the sft phase's and the dpo phase's prompts
    refused = "phases[1] (sft).data upload.jsonl: line 1: rendering it "
    assert (f"{refused}took longer than {sample_render.RECORD_SECONDS:g} s of processor time" in page
            or f"{refused}took longer than {sample_render.RECORD_WALL_SECONDS:g} s" in page  # a busy host
            or f"{refused}needed more than the {sample_render.MEMORY_BYTES // 1024**2:,} MiB" in page), page[-3000:]
    assert not Run.objects.exists() and not DataSet.objects.filter(name="upload.jsonl").exists()


def test_a_tokenizer_folder_on_the_dashboards_disk_is_refused(client, launcher, tmp_path):
    client.force_login(launcher)
    form = _launch_form(client)
    form["bucket"] = str(tmp_path / "bucket")
    for tokenizer in ("/etc", "etc"):  # a relative path is one under the dashboard's /
        form["recipe"] = _launch_form(client)["recipe"].replace("model:\n", f"model:\n  tokenizer: {tokenizer}\n", 1)
        page = html.unescape(client.post(reverse("run_launch"), form).content.decode())
        assert ("model.tokenizer /etc: a folder on the dashboard's machine is not read by a box (a box is another "
                "machine): name a hub id (owner/name)") in page
    assert not Run.objects.exists() and not DataSet.objects.exists()


def test_the_data_check_stops_reading_at_its_time_budget_and_says_so(client, launcher, tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "CHECK_SECONDS", 0)
    client.force_login(launcher)
    bad = BAD["cpt"][0][0]  # left unread: the box checks every record before it trains
    status, page, _ = _post(client, tmp_path, "cpt", jsonl(GOOD["cpt"], bad, GOOD["cpt"]))
    assert status == 302, page[-3000:]
    dataset = DataSet.objects.get(name="upload.jsonl")
    assert dataset.rows == 3 and dataset.report["records_measured"] == 0
    assert ("lines 2 on were not checked here: a launch checks its data for at most 0 s (the box checks every record "
            "before it trains)") in dataset.report["notes"]
