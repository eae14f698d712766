"""A run's data: each phase's JSONL checked for its kind before anything is rented (every error with its line
number), stored in the run's bucket once and kept for later runs, listed with its size and sha256, and fetched by
the box through its read grant, checked against that sha256."""

import hashlib
import html
import json
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from runs import datasets, reports
from runs.launch import LaunchError, example_recipe, launch
from runs.models import DataSet, Run
from training.agent import run as agent_run
from training.agent.dashboard import Api
from training.agent.heartbeat import Heartbeat
from training.agent.inputs import DataRefused, fetch_data
from training.records import ByteTokenizer

from .conftest import put_on_a_box

pytestmark = pytest.mark.django_db
BYTES = datasets.Tokenizer(ByteTokenizer(260), "bytes (vocabulary 260)")
TOOL_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]}
GOOD = {
    "cpt": {"text": "the router sends each token"},
    "sft": {"messages": [{"role": "user", "content": "1 plus 2?"}, TOOL_CALL,
                         {"role": "tool", "tool_call_id": "c1", "content": "3"},
                         {"role": "assistant", "content": "3."}]},
    "dpo": {"prompt": [{"role": "user", "content": "1 plus 2?"}], "chosen": "3", "rejected": "4"},
    "kto": {"prompt": "1 + 2 =", "completion": "3", "label": True},
    "grpo": {"prompt": "1 + 2 =", "answer": "3"},
}
BAD = {  # kind: [(line, what is wrong with it, the words the error says)]
    "cpt": [({"txt": "x"}, "missing text"), ({"text": 5}, "text: a string, got int")],
    "sft": [({"messages": [{"role": "user", "content": "hi"}]}, "messages: no assistant message"),
            ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
                "name": "add", "arguments": "{a: 1}"}}]}]}, "messages[0].tool_calls[0].function.arguments: not JSON"),
            ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role: one of system, developer, user"),
            ({"messages": [{"role": "user", "content": "x", "tool_calls": []}, {"role": "assistant", "content": "y"}]},
             "messages[0].tool_calls: only an assistant message calls tools"),
            ({"messages": [{"role": "user", "content": "x"}, {"role": "tool"}, {"role": "assistant", "content": "y"}]},
             "messages[1].content: missing")],
    "dpo": [({"prompt": "p", "chosen": "a"}, "missing rejected"), ({"prompt": [], "chosen": "a", "rejected": "b"},
                                                                  "prompt: a non-empty list of messages")],
    "kto": [({"prompt": "p", "completion": "a", "label": "yes"}, "label: true or false, got 'yes'")],
    "grpo": [({"answer": "3"}, "missing prompt")],
}


@pytest.fixture
def launcher(staff):
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    return staff


def jsonl(*records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def sft_recipe(data="chat.jsonl") -> dict:
    recipe = example_recipe()
    recipe["phases"] = [dict(recipe["phases"][1], data=data)]
    return recipe


@pytest.mark.parametrize("kind", sorted(BAD))
def test_it_names_the_line_of_every_problem_for_each_phase_kind(tmp_path, kind):
    lines = [GOOD[kind]] + [record for record, _ in BAD[kind]]
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(*lines) + b"\n{not json\n")
    checked = datasets.check_file(path, kind, BYTES)
    expected = [f"line {n}: {words}" for n, (_, words) in enumerate(BAD[kind], 2)]
    assert len(checked.errors) == len(expected) + 1
    for error, wanted in zip(checked.errors[:-1], expected, strict=True):  # the last: the line not JSON
        assert error.startswith(wanted), (error, wanted)
    assert checked.errors[-1].startswith(f"line {len(lines) + 2}: not JSON")
    assert checked.rows == 1 and datasets.check_file(path, kind, BYTES).sha256 == hashlib.sha256(
        path.read_bytes()).hexdigest()


def test_it_counts_tokens_and_says_the_tiny_model_has_no_chat_template(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_bytes(jsonl(GOOD["sft"], GOOD["sft"]))
    tokenizer = datasets.model_tokenizer(example_recipe()["model"])
    assert "no chat template" in tokenizer.note
    checked = datasets.check_file(path, "sft", tokenizer)
    assert checked.errors == [] and checked.rows == 2
    report = checked.report
    assert report["records_measured"] == 2 and 0 < report["trained_tokens_measured"] < report["tokens_measured"]
    trained = [text for text, on in report["sample"]["segments"] if on]
    assert trained[0].startswith('\n<tool_call>{"function": {"arguments": {"a": 1, "b": 2}, "name": "add"}')
    assert trained[1] == "3.\n<eos>" and report["notes"] == [tokenizer.note]


def test_a_launch_refuses_a_path_on_the_dashboards_disk_and_rents_nothing(tmp_path):
    local = tmp_path / "on-the-dashboard.jsonl"
    local.write_bytes(jsonl(GOOD["sft"]))
    with pytest.raises(LaunchError, match=r"phases\[0\] \(sft\)\.data .*a path on the dashboard's machine is not read"):
        launch(name="x", recipe=sft_recipe(str(local)), bucket=str(tmp_path / "bucket"), budget_usd=5, max_restarts=1)
    assert not Run.objects.exists() and not DataSet.objects.exists()


def _launch_form(client) -> dict:
    page = client.get(reverse("run_launch")).content.decode()
    fields = dict(re.findall(r'<input type="(?:text|number)" name="(\w+)" value="([^"]*)"', page))
    fields["recipe"] = html.unescape(re.search(r'<textarea name="recipe"[^>]*>\n?(.*?)</textarea>', page, re.S)[1])
    assert 'enctype="multipart/form-data"' in page and 'type="file" name="data_files"' in page
    return fields


def test_the_launch_page_takes_an_upload_stores_it_and_lists_it(client, launcher, tmp_path):
    client.force_login(launcher)
    form = _launch_form(client)
    bucket = tmp_path / "bucket"
    form["bucket"] = str(bucket)
    form["recipe"] = form["recipe"].replace("data: example:sft.jsonl", "data: chat.jsonl")
    content = jsonl(GOOD["sft"], GOOD["sft"], GOOD["sft"])
    response = client.post(reverse("run_launch"), {**form, "data_files": [SimpleUploadedFile("chat.jsonl", content)]})
    run = Run.objects.get()
    assert response.status_code == 302
    digest = hashlib.sha256(content).hexdigest()
    sft = run.phases.get(kind="sft").dataset
    assert (sft.name, sft.sha256, sft.size_bytes, sft.rows, sft.uploaded_by) == ("chat.jsonl", digest, len(content), 3,
                                                                                 launcher)
    assert (bucket / "datasets" / digest / "data.jsonl").read_bytes() == content
    assert {p.dataset.name for p in run.phases.all()} == {  # the examples, stored like uploads
        "example:cpt.jsonl", "chat.jsonl", "example:dpo.jsonl", "example:kto.jsonl", "example:grpo.jsonl",
        "example:eval.jsonl"}

    listing = client.get(reverse("datasets")).content.decode()
    assert "chat.jsonl" in listing and digest[:14] in listing and f'title="{len(content)} bytes"' in listing
    detail = client.get(reverse("dataset_detail", args=[sft.pk])).content.decode()
    assert digest in detail and "no chat template" in detail and "<mark>3.\n&lt;eos&gt;</mark>" in detail
    assert f"{run.name} #{run.pk}" in detail
    run_page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert reverse("dataset_detail", args=[sft.pk]) in run_page and digest[:14] in run_page

    # A later run names the stored data set by its name: nothing to upload, the same row.
    form["name"] = "again"
    assert client.post(reverse("run_launch"), form).status_code == 302
    assert Run.objects.get(name="again").phases.get(kind="sft").dataset == sft
    assert DataSet.objects.filter(name="chat.jsonl").count() == 1


def test_the_launch_page_says_each_bad_line_and_launches_nothing(client, launcher, tmp_path):
    client.force_login(launcher)
    form = _launch_form(client)
    form["bucket"] = str(tmp_path / "bucket")
    form["recipe"] = form["recipe"].replace("data: example:sft.jsonl", "data: chat.jsonl")
    bad = jsonl(GOOD["sft"], BAD["sft"][0][0]) + b"{oops\n"
    page = client.post(reverse("run_launch"), {**form, "data_files": [SimpleUploadedFile("chat.jsonl", bad)]})
    text = html.unescape(page.content.decode())
    assert "phases[1] (sft).data chat.jsonl: line 2: messages: no assistant message" in text
    assert "phases[1] (sft).data chat.jsonl: line 3: not JSON" in text
    assert not Run.objects.exists() and not DataSet.objects.filter(name="chat.jsonl").exists()


def test_a_data_file_over_the_limits_is_refused_before_it_is_read(client, launcher, tmp_path, settings):
    settings.DATASET_MAX_LINE_BYTES = 1024
    one_line = tmp_path / "one-line.jsonl"
    one_line.write_bytes(b'{"text": "' + b"x" * 5000 + b'"}' + b"\n" + jsonl(GOOD["cpt"]))
    checked = datasets.check_file(one_line, "cpt", BYTES)
    assert checked.errors == ["line 1 is longer than 1,024 bytes (DATASET_MAX_LINE_BYTES): not read on"]

    settings.DATASET_MAX_BYTES = 100
    client.force_login(launcher)
    form = _launch_form(client)
    form["bucket"] = str(tmp_path / "bucket")
    form["recipe"] = form["recipe"].replace("data: example:sft.jsonl", "data: chat.jsonl")
    big = jsonl(*[GOOD["sft"]] * 3)
    page = client.post(reverse("run_launch"), {**form, "data_files": [SimpleUploadedFile("chat.jsonl", big)]})
    text = html.unescape(page.content.decode())
    assert f"chat.jsonl is {len(big):,} bytes, more than the 100 a data file may be (DATASET_MAX_BYTES)" in text
    assert not Run.objects.exists() and not DataSet.objects.exists()


def test_the_box_fetches_each_phases_data_and_refuses_one_that_does_not_match(launched, tmp_path):
    run = launched()
    put_on_a_box(run)
    spec = reports.spec(run.attempts.get())
    recipe_phases = run.recipe["phases"]
    phases = fetch_data(spec["phases"], recipe_phases, tmp_path / "box" / "data")
    for phase, stored in zip(phases, run.phases.order_by("index"), strict=True):
        fetched = Path(phase["data"])
        assert fetched.parent.name == stored.dataset.sha256 and tmp_path / "box" in fetched.parents
        assert hashlib.sha256(fetched.read_bytes()).hexdigest() == stored.dataset.sha256
    assert recipe_phases[0]["data"] == "example:cpt.jsonl"  # the run's own recipe is not changed

    # Someone with the bucket's key changes the stored SFT data after it was checked.
    sft = run.phases.get(kind="sft").dataset
    (Path(sft.uri) / "data.jsonl").write_bytes(jsonl(GOOD["sft"]))
    with pytest.raises(DataRefused, match=r"the data of phase 1 \(sft\), example:sft.jsonl, does not match its sha256"):
        fetch_data(spec["phases"], recipe_phases, tmp_path / "other-box" / "data")
    assert not (tmp_path / "other-box" / "data" / sft.sha256 / "data.jsonl").exists()


def test_the_agent_starts_no_trainer_on_data_that_does_not_match(launched, tmp_path, monkeypatch):
    run = launched()
    put_on_a_box(run)
    spec = json.loads(json.dumps(reports.spec(run.attempts.get()), default=str))
    spec["phases"][2]["data"]["sha256"] = spec["phases"][2]["data"]["manifest"]["data.jsonl"]["sha256"] = "0" * 64
    posts, started = [], []

    class Dashboard(Api):
        def __init__(self):
            pass

        def call(self, method, path, body=None):
            posts.append((path, body))
            return spec if path == "spec" else {}

    monkeypatch.setattr(agent_run, "probe", lambda python: (True, "probe ok"))
    monkeypatch.setattr(agent_run.subprocess, "Popen", lambda *a, **k: started.append(a))
    heartbeat = Heartbeat(Dashboard(), 60, 3600)
    assert agent_run.run(Dashboard(), heartbeat, tmp_path / "work", "python") == 5
    assert started == [] and not (tmp_path / "work" / "recipe.json").exists()
    failed = [body for path, body in posts if path == "events" and body["kind"] == "trainer_failed"]
    assert len(failed) == 1 and "the data of phase 2 (dpo), example:dpo.jsonl, does not match its sha256" in \
        failed[0]["message"]


def test_a_data_file_name_longer_than_a_data_sets_is_refused_with_the_reason(client, launcher, tmp_path):
    client.force_login(launcher)
    form = _launch_form(client)
    form["bucket"] = str(tmp_path / "bucket")
    name = "d" * 230 + ".jsonl"
    form["recipe"] = form["recipe"].replace("data: example:sft.jsonl", f"data: {name}")
    upload = SimpleUploadedFile(name, jsonl(GOOD["sft"]))
    response = client.post(reverse("run_launch"), {**form, "data_files": [upload]})
    assert response.status_code == 200 and "its name is 236 characters" in response.content.decode()
    assert not Run.objects.exists() and not list((tmp_path / "bucket").rglob("*.jsonl"))
