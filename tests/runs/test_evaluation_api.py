"""The eval phase as a box reports it (the agent API's evaluation calls): it starts only once the training is banked,
its samples are taken strictly and once each, its summary is the dashboard's own from the samples it recorded, and a
failure leaves the run trained with its adapters."""

import json
from decimal import Decimal

import pytest
from django.test import Client

from fleet.models import Alert
from runs import events, lifecycle
from runs.launch import launch
from runs.models import EvalSample, Evaluation, Run
from tests.runs.conftest import put_on_a_box, stored_checkpoint, tiny_recipe

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"
EVAL_ROWS = 5  # training/examples/eval.jsonl


def eval_recipe(**promote) -> dict:
    recipe = tiny_recipe()
    recipe["phases"] = [*recipe["phases"][:2], {"kind": "eval", "data": "example:eval.jsonl", "scorer": "exact"}]
    if promote:
        recipe["promote"] = promote
    return recipe


def post(client, path, body):
    return client.post(API + path, json.dumps(body), content_type="application/json")


def launched_on_a_box(tmp_path, recipe=None, name="evals"):
    run = launch(name=name, recipe=recipe or eval_recipe(), bucket=str(tmp_path / "bucket"), budget_usd=Decimal("5"),
                 max_restarts=2)
    token = put_on_a_box(run)
    events.record(run, "rented", "A box was rented.")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert post(client, "/events", {"kind": "probe_ok"}).json()["state"] == "training"
    return run, client


def bank_training(run, client):
    for phase in run.phases.exclude(kind="eval"):
        assert post(client, "/checkpoints", stored_checkpoint(run, phase.index, phase.steps)).status_code == 200


def sample(index, base=0.0, adapter=1.0, **changes):
    return {"index": index, "prompt": f"prompt {index}", "expected": "85", "base_answer": "84",
            "adapter_answer": "85", "base_score": base, "adapter_score": adapter, **changes}


def started(tmp_path, **promote):
    run, client = launched_on_a_box(tmp_path, eval_recipe(**promote) if promote else None)
    bank_training(run, client)
    answer = post(client, "/evaluation/start", {"phase": 2})
    assert answer.status_code == 200, answer.content
    return run, client


def test_it_starts_only_once_every_training_phase_is_banked(tmp_path):
    run, client = launched_on_a_box(tmp_path)
    first = run.phases.get(index=0)
    post(client, "/checkpoints", stored_checkpoint(run, 0, first.steps))
    answer = post(client, "/evaluation/start", {"phase": 2})
    assert answer.status_code == 409
    assert "not in the run's store" in answer.json()["detail"]
    bank_training(run, client)
    assert "evaluation" not in client.get(API + "/spec").json() or client.get(API + "/spec").json()[
        "evaluation"] == {"phase": 2, "done": []}
    assert post(client, "/evaluation/start", {"phase": 2}).json() == {"done": []}
    run.refresh_from_db()
    assert run.state == lifecycle.EVALUATING
    assert run.last_step_at is not None  # a step for the hang check


def test_it_records_each_sample_once_and_says_what_is_done(tmp_path):
    run, client = started(tmp_path)
    assert post(client, "/evaluation/samples", {"phase": 2, "samples": [sample(0), sample(1)]}).json() == \
        {"recorded": 2}
    again = post(client, "/evaluation/samples", {"phase": 2, "samples": [sample(1, adapter=0.0), sample(2)]})
    assert again.json() == {"recorded": 1}
    assert EvalSample.objects.get(evaluation__run=run, index=1).adapter_score == 1.0  # the first post wins
    assert post(client, "/evaluation/start", {"phase": 2}).json() == {"done": [0, 1, 2]}
    assert client.get(API + "/spec").json()["evaluation"] == {"phase": 2, "done": [0, 1, 2]}


@pytest.mark.parametrize("bad, words", [
    (sample(0, base_score=1.5), "less than or equal to 1"),
    (sample(0, adapter_score=float("nan")), ""),
    (sample(0, adapter_score="1"), "valid number"),
    (sample(0, prompt="x" * 20_001), "at most 20000 characters"),
    (sample(0, base_answer="a\x00b"), "NUL"),
    (sample(-1), "greater than or equal to 0"),
    ({k: v for k, v in sample(0).items() if k != "expected"}, "expected"),
    (sample(EVAL_ROWS), "past the eval file's 5 samples"),
])
def test_it_refuses_a_malformed_post_and_stores_none_of_it(tmp_path, bad, words):
    run, client = started(tmp_path)
    body = json.dumps({"phase": 2, "samples": [sample(1), bad]}).replace("NaN", "NaN")
    answer = client.post(API + "/evaluation/samples", body, content_type="application/json")
    assert answer.status_code == 422
    assert words in answer.content.decode()
    assert not EvalSample.objects.filter(evaluation__run=run).exists()


def test_it_refuses_more_than_a_hundred_samples_a_post_and_another_phase(tmp_path):
    run, client = started(tmp_path)
    assert post(client, "/evaluation/samples", {"phase": 2, "samples": [sample(0)] * 101}).status_code == 422
    answer = post(client, "/evaluation/samples", {"phase": 1, "samples": [sample(0)]})
    assert answer.status_code == 422 and "this run's evaluation is phase 2" in answer.json()["detail"]


def test_another_runs_token_opens_nothing_of_this_one(tmp_path):
    run, client = started(tmp_path)
    other, other_client = launched_on_a_box(tmp_path, tiny_recipe(), name="other")
    answer = post(other_client, "/evaluation/samples", {"phase": 2, "samples": [sample(0)]})
    assert answer.status_code == 422  # its own run has no evaluation; nothing lands on the first run
    assert not EvalSample.objects.exists()
    stranger = Client(HTTP_AUTHORIZATION="Bearer run_forged")
    assert post(stranger, "/evaluation/samples", {"phase": 2, "samples": [sample(0)]}).status_code == 401


def test_it_will_not_finish_with_samples_missing(tmp_path):
    run, client = started(tmp_path)
    post(client, "/evaluation/samples", {"phase": 2, "samples": [sample(0), sample(2)]})
    answer = post(client, "/evaluation/finish", {"phase": 2, "generated_with": "vllm", "tokens_per_s": 100.0})
    assert answer.status_code == 409
    assert "3 of 5 samples are not recorded: 1, 3, 4" in answer.json()["detail"]
    assert Run.objects.get(pk=run.pk).state == lifecycle.EVALUATING


def test_it_computes_the_summary_from_the_samples_it_recorded_and_promotes_by_the_rule(tmp_path):
    run, client = started(tmp_path, metric="difference", min_gain=0.2)
    scores = [(0.0, 1.0), (0.0, 1.0), (1.0, 1.0), (1.0, 0.0), (0.0, 1.0)]
    post(client, "/evaluation/samples", {"phase": 2, "samples": [sample(i, b, a) for i, (b, a) in enumerate(scores)]})
    answer = post(client, "/evaluation/finish", {"phase": 2, "generated_with": "transformers", "tokens_per_s": 12.5,
                                                 "base_score": 1.0, "adapter_score": 0.0})  # a box's own: ignored
    assert answer.status_code == 422 and "base_score" in answer.content.decode()  # no summary is taken from a box
    answer = post(client, "/evaluation/finish", {"phase": 2, "generated_with": "transformers", "tokens_per_s": 12.5})
    assert answer.status_code == 200, answer.content
    assert answer.json()["state"] == "finished" and answer.json()["promoted"] is True
    evaluation = Evaluation.objects.get(run=run)
    assert (evaluation.base_score, evaluation.adapter_score) == pytest.approx((0.4, 0.8))
    assert evaluation.difference == pytest.approx(0.4)
    assert (evaluation.wins, evaluation.ties, evaluation.losses) == (3, 1, 1)
    assert evaluation.ci_low <= 0.4 <= evaluation.ci_high
    assert evaluation.generated_with == "transformers" and evaluation.tokens_per_s == 12.5
    run.refresh_from_db()
    assert run.state == lifecycle.FINISHED and run.promoted is True
    assert set(Alert.objects.values_list("kind", flat=True)) >= {"run.evaluated", "run.promoted"}
    assert "adapter 0.8000 vs base 0.4000" in Alert.objects.get(kind="run.evaluated").message


def test_it_does_not_promote_below_the_rule_and_says_why(tmp_path):
    run, client = started(tmp_path, metric="adapter_score", min_score=0.9)
    post(client, "/evaluation/samples", {"phase": 2, "samples": [sample(i) for i in range(EVAL_ROWS - 1)] + [
        sample(EVAL_ROWS - 1, 1.0, 0.0)]})
    assert post(client, "/evaluation/finish", {"phase": 2, "generated_with": "vllm",
                                               "tokens_per_s": 1.0}).json()["promoted"] is False
    evaluation = Evaluation.objects.get(run=run)
    assert "adapter score 0.8000 is below the required 0.9000" in evaluation.reason
    assert Run.objects.get(pk=run.pk).promoted is False
    assert not Alert.objects.filter(kind="run.promoted").exists()


def test_a_failed_evaluation_leaves_the_run_trained(tmp_path):
    run, client = started(tmp_path)
    answer = post(client, "/evaluation/failed", {"phase": 2, "reason": "ran over its time limit of 3600 s"})
    assert answer.json() == {"state": "eval_failed"}
    run.refresh_from_db()
    assert run.state_words == "trained, evaluation failed"
    assert Evaluation.objects.get(run=run).state == "failed"
    assert run.checkpoints.exclude(sealed_at=None).count() == 2  # the adapters stay


def test_a_box_that_dies_while_evaluating_is_replaced_by_one_that_only_evaluates(tmp_path):
    run, client = started(tmp_path)
    post(client, "/evaluation/samples", {"phase": 2, "samples": [sample(0)]})
    events.record(run, "host_lost", "The box vanished.")
    run.refresh_from_db()
    assert run.state == lifecycle.RECOVERING
    token = put_on_a_box(run)
    events.record(run, "rented", "A new box was rented.")
    fresh = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    spec = fresh.get(API + "/spec").json()
    assert spec["evaluation"] == {"phase": 2, "done": [0]}
    assert post(fresh, "/events", {"kind": "probe_ok"}).json()["state"] == "training"
    assert post(fresh, "/evaluation/start", {"phase": 2}).json() == {"done": [0]}
    assert Run.objects.get(pk=run.pk).state == lifecycle.EVALUATING


def test_a_failure_once_the_training_is_banked_ends_the_run_trained_not_failed(tmp_path):
    from django.utils import timezone

    from runs import supervisor

    run, client = started(tmp_path)
    events.record(run, "host_lost", "The box vanished.")
    run.refresh_from_db()
    Run.objects.filter(pk=run.pk).update(restarts=run.max_restarts + 1)
    run.refresh_from_db()
    supervisor.supervise_run(run, timezone.now())
    run.refresh_from_db()
    assert run.state == lifecycle.EVAL_FAILED
    assert "restarts" in run.state_reason
    assert list(run.events.values_list("kind", flat=True).filter(kind__in=["restarts_exhausted",
                                                                            "evaluation_failed"])) == \
        ["evaluation_failed"]


def test_its_states_replay_from_its_events(tmp_path):
    run, client = started(tmp_path)
    post(client, "/evaluation/samples", {"phase": 2, "samples": [sample(i) for i in range(EVAL_ROWS)]})
    post(client, "/evaluation/finish", {"phase": 2, "generated_with": "vllm", "tokens_per_s": 3.0})
    kinds = [k for k in run.events.order_by("at", "id").values_list("kind", flat=True) if k in lifecycle.EVENTS]
    assert lifecycle.replay(kinds) == Run.objects.get(pk=run.pk).state == lifecycle.FINISHED
    assert lifecycle.replay(["rented", "probe_ok", "evaluating", "hung", "rented", "evaluating",
                             "evaluation_failed"]) == lifecycle.EVAL_FAILED
    assert lifecycle.replay(["rented", "step", "finished", "evaluate_again", "rented", "evaluating",
                             "evaluated"]) == lifecycle.FINISHED


def test_webhooks_subscribed_to_the_verdict_get_its_numbers(tmp_path):
    from fleet.alerts import notify, webhooks
    from fleet.models import WebhookDelivery

    ops = notify.create_endpoint(name="ops", url="https://hooks.example.com/x", events=["run.promoted"], slack=False)
    run, client = started(tmp_path, metric="difference", min_gain=0.5)
    post(client, "/evaluation/samples", {"phase": 2, "samples": [sample(i) for i in range(EVAL_ROWS)]})
    post(client, "/evaluation/finish", {"phase": 2, "generated_with": "vllm", "tokens_per_s": 7.0})
    delivery = WebhookDelivery.objects.select_related("alert").get(endpoint=ops)  # run.evaluated not subscribed
    body = json.loads(webhooks.body(delivery.alert, slack=False))
    assert body["type"] == "run.promoted"
    assert body["data"]["run"] == {"id": run.pk, "name": run.name, "state": "finished", "promoted": True}
    numbers = body["data"]["evaluation"]
    assert (numbers["base_score"], numbers["adapter_score"], numbers["difference"]) == (0.0, 1.0, 1.0)
    assert (numbers["wins"], numbers["ties"], numbers["losses"], numbers["samples"]) == (5, 0, 0, 5)
    assert numbers["generated_with"] == "vllm" and "gain over the base +1.0000" in numbers["reason"]
    evaluated = Alert.objects.get(kind="run.evaluated")
    assert json.loads(webhooks.body(evaluated, slack=False))["data"]["evaluation"]["promoted"] is True
