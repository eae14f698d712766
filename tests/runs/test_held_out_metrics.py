"""Held-out data and the phase-kind metrics on the dashboard's side: a phase's eval_data is checked, stored and
granted to its box like its data; the API takes each kind's figures within their bounds only; the run page charts
them in the phase's colour, the held-out ones beside the training curves, and the CSV has them."""

import csv
import hashlib
import io
import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from runs import reports
from runs.launch import LaunchError, example_recipe, launch
from runs.models import MetricPoint, Run
from tests.runs.conftest import put_on_a_box
from tests.runs.seeding import seed_run
from training.agent.inputs import fetch_data

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"
HELD_OUT_CPT = b'{"text": "a held-out line the phase never trains on"}\n{"text": "and a second one"}\n'


@pytest.fixture
def logged_in(client, operator):
    client.force_login(operator)
    return client


def _launch(tmp_path, upload: bytes, **cpt_settings) -> Run:
    recipe = example_recipe()
    recipe["phases"][0].update(eval_data="held.jsonl", eval_every=2, **cpt_settings)
    recipe["phases"][2].update(eval_split=0.25)  # dpo: taken out of its own data, nothing to store
    return launch(name="held-out", recipe=recipe, bucket=str(tmp_path / "bucket"), budget_usd=5, max_restarts=1,
                  uploads={"held.jsonl": SimpleUploadedFile("held.jsonl", upload)})


def test_a_phases_held_out_file_is_stored_granted_and_fetched_by_its_box(tmp_path):
    run = _launch(tmp_path, HELD_OUT_CPT)
    cpt, dpo = run.phases.get(index=0), run.phases.get(kind="dpo")
    assert cpt.eval_dataset is not None and cpt.eval_dataset.rows == 2 and cpt.eval_dataset.kind == "cpt"
    assert cpt.eval_dataset.sha256 == hashlib.sha256(HELD_OUT_CPT).hexdigest() != cpt.dataset.sha256
    assert dpo.eval_dataset is None

    put_on_a_box(run)
    spec = reports.spec(run.attempts.get())
    assert spec["phases"][0]["eval_data"]["sha256"] == cpt.eval_dataset.sha256
    assert all(p["eval_data"] is None for p in spec["phases"][1:])
    phases = fetch_data(spec["phases"], run.recipe["phases"], tmp_path / "box" / "data")
    assert Path(phases[0]["eval_data"]).read_bytes() == HELD_OUT_CPT
    assert Path(phases[0]["data"]).read_bytes() != HELD_OUT_CPT
    assert phases[2]["eval_split"] == 0.25 and "eval_data" not in phases[2]


def test_the_run_page_lists_a_phases_held_out_data_set(tmp_path, logged_in):
    run = _launch(tmp_path, HELD_OUT_CPT)
    page = logged_in.get(reverse("run_detail", args=[run.pk])).content.decode()
    held = run.phases.get(index=0).eval_dataset
    assert "0 · cpt (held-out)" in page and ">held.jsonl</a>" in page
    assert reverse("dataset_detail", args=[held.pk]) in page and held.sha256 in page


def test_a_bad_held_out_line_is_named_and_nothing_is_launched(tmp_path):
    with pytest.raises(LaunchError, match=r"phases\[0\] \(cpt\)\.eval_data held\.jsonl: line 2: .*text"):
        _launch(tmp_path, b'{"text": "fine"}\n{"txt": "no text"}\n')
    assert not Run.objects.exists()


def test_a_recipe_with_a_held_out_share_out_of_range_is_refused_at_launch(tmp_path):
    with pytest.raises(LaunchError, match=r"eval_split: a share of the phase's records above 0 and at most 0\.5"):
        _launch(tmp_path, HELD_OUT_CPT, eval_split=0.7)
    assert not Run.objects.exists()


GOOD = {"rewards_chosen": -1.5, "rewards_rejected": -3.0, "rewards_accuracy": 0.75, "rewards_margin": 1.5,
        "kl": 0.02, "reward_mean": 0.4, "reward_std": 0.1, "completion_length": 37.5, "zero_spread_groups": 0.25,
        "eval_loss": 1.9, "eval_perplexity": 6.69, "eval_rewards_chosen": -1.0, "eval_rewards_rejected": -2.0,
        "eval_rewards_accuracy": 0.5, "eval_rewards_margin": 1.0, "eval_reward_mean": 0.3, "eval_reward_std": 0.2,
        "eval_s": 4.5}


def _post(run, points):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    return client.post(API + "/metrics", json.dumps({"points": points}), content_type="application/json")


def _point(step, **fields):
    return {"phase": 0, "step": step, "loss": 2.5, "step_s": 0.5, **fields}


def test_the_api_stores_each_kinds_figures_and_the_held_out_ones(tmp_path):
    run = _launch(tmp_path, HELD_OUT_CPT)
    assert _post(run, [_point(1, **GOOD), _point(2)]).status_code == 200
    stored = MetricPoint.objects.get(run=run, step=1)
    assert {name: getattr(stored, name) for name in GOOD} == GOOD
    assert MetricPoint.objects.get(run=run, step=2).eval_loss is None


@pytest.mark.parametrize("field, value", [
    ("rewards_accuracy", 1.5), ("eval_rewards_accuracy", -0.1), ("zero_spread_groups", 2.0), ("kl", -0.5),
    ("eval_loss", -1.0), ("eval_perplexity", 0.5), ("completion_length", 1e6), ("reward_std", -0.1),
    ("eval_reward_mean", float("inf")), ("rewards_margin", "1.0"), ("eval_s", True),
])
def test_the_api_refuses_a_figure_out_of_its_range_with_422_and_stores_nothing(tmp_path, field, value):
    run = _launch(tmp_path, HELD_OUT_CPT)
    body = json.dumps({"points": [_point(1, **{field: value}), _point(2)]}).replace("Infinity", "1e400")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    response = client.post(API + "/metrics", body, content_type="application/json")
    assert response.status_code == 422
    assert field in {str(part) for error in response.json()["detail"] for part in error["loc"]}
    assert not MetricPoint.objects.exists()


def _seed_with_held_out():
    run = seed_run()
    run.recipe = {"phases": [{"kind": "cpt", "data": "c", "steps": 40, "eval_split": 0.1, "eval_every": 10},
                             {"kind": "sft", "data": "s", "steps": 40},
                             {"kind": "dpo", "data": "d", "steps": 30, "eval_data": "held-dpo"}]}
    run.save(update_fields=["recipe"])
    for step in (10, 20, 30, 40):  # the CPT phase validated every 10 steps and at its end
        MetricPoint.objects.filter(run=run, phase=0, step=step).update(eval_loss=3.0 - step / 40,
                                                                       eval_perplexity=20.0 - step / 4)
    MetricPoint.objects.filter(run=run, phase=2).update(rewards_chosen=-0.5, rewards_rejected=-1.5,
                                                        rewards_accuracy=0.75, rewards_margin=1.0)
    MetricPoint.objects.filter(run=run, phase=2, step=30).update(eval_loss=0.6, eval_rewards_chosen=-0.7,
                                                                 eval_rewards_rejected=-1.2,
                                                                 eval_rewards_accuracy=0.5, eval_rewards_margin=0.5)
    return run


def test_the_chart_data_draws_the_held_out_series_beside_each_phases_curve(logged_in):
    run = _seed_with_held_out()
    body = logged_in.get(reverse("run_chart_data", args=[run.pk])).json()
    by_id = {f["id"]: f for f in body["figures"]}
    loss = {t["name"]: t for t in by_id["loss"]["data"]}
    assert list(loss) == ["0 · cpt", "held-out loss · cpt", "1 · sft", "2 · dpo", "held-out loss · dpo"]
    held = loss["held-out loss · cpt"]
    assert held["y"] == [2.75, 2.5, 2.25, 2.0] and held["x"] == [10, 20, 30, 40]  # the CPT phase starts at 0
    assert held["line"]["color"] == loss["0 · cpt"]["line"]["color"] and held["marker"]["symbol"] == "diamond"
    assert loss["held-out loss · dpo"]["x"] == [80 + 30] and loss["held-out loss · dpo"]["y"] == [0.6]
    # The kind charts of the run's phases, in their colours; none for a kind the run has not (no GRPO here).
    assert [f["id"] for f in body["figures"] if f["id"] in ("perplexity", "preference-rewards", "preference-margin",
                                                           "grpo-reward", "grpo-rollouts", "kl")] \
        == ["perplexity", "preference-rewards", "preference-margin"]
    assert by_id["perplexity"]["data"][0]["y"] == [17.5, 15.0, 12.5, 10.0]
    rewards = {t["name"]: t for t in by_id["preference-rewards"]["data"]}
    assert set(rewards) == {"chosen · dpo", "rejected · dpo", "held-out chosen · dpo", "held-out rejected · dpo"}
    assert set(rewards["chosen · dpo"]["y"]) == {-0.5} and rewards["held-out rejected · dpo"]["y"] == [-1.2]
    assert rewards["chosen · dpo"]["line"]["color"] == loss["2 · dpo"]["line"]["color"]
    margin = {t["name"]: t for t in by_id["preference-margin"]["data"]}
    assert margin["accuracy · dpo"]["yaxis"] == "y2" and margin["held-out accuracy · dpo"]["y"] == [0.5]

    page = logged_in.get(reverse("run_detail", args=[run.pk])).content.decode()
    for chart in ("perplexity", "preference-rewards", "preference-margin"):
        assert f'data-chart="{chart}"' in page
    assert 'data-chart="grpo-reward"' not in page


def test_the_csv_has_the_phase_kind_and_held_out_columns(logged_in):
    run = _seed_with_held_out()
    response = logged_in.get(reverse("run_metrics_csv", args=[run.pk]))
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    columns = {"eval_loss", "eval_perplexity", "rewards_accuracy", "eval_reward_mean", "zero_spread_groups", "kl"}
    assert columns <= set(rows[0])
    cpt_20 = next(r for r in rows if r["phase"] == "0" and r["step"] == "20")
    assert float(cpt_20["eval_loss"]) == 2.5 and rows[0]["eval_loss"] == ""
    assert float(rows[-1]["eval_rewards_margin"]) == 0.5 and float(rows[-1]["rewards_accuracy"]) == 0.75
