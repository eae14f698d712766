"""What a person sees of an evaluation: the result and the samples on the run page, every sample as CSV, the Compare
page leading with promoted runs, and the evaluate-again form (its permission, its CSRF, the new box's own budget)."""

import csv
import io
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from runs import lifecycle
from fleet.inference.adapters import VLLM_FILES
from runs.models import Checkpoint, EvalSample, Evaluation, Run
from tests.runs.test_evaluation_api import EVAL_ROWS, post, sample, started

pytestmark = pytest.mark.django_db


def evaluated(tmp_path, scores=None, **promote):
    run, client = started(tmp_path, **(promote or {"metric": "difference", "min_gain": 0.1}))
    scores = scores or [(0.0, 1.0)] * EVAL_ROWS
    post(client, "/evaluation/samples", {"phase": 2, "samples": [
        sample(i, b, a, prompt=f"=HYPERLINK(prompt {i})") for i, (b, a) in enumerate(scores)]})
    assert post(client, "/evaluation/finish", {"phase": 2, "generated_with": "vllm",
                                               "tokens_per_s": 42.0}).status_code == 200
    run.refresh_from_db()
    return run


def owner(run, django_user_model, *, may_launch=True):
    name = f"owner{run.pk}-{'launcher' if may_launch else 'viewer'}"
    user = django_user_model.objects.create_user(name, password="pw-123456789", is_staff=True)
    if may_launch:
        user.user_permissions.add(Permission.objects.get(codename="launch_run"))
    Run.objects.filter(pk=run.pk).update(created_by=user)
    client = Client()
    client.force_login(user)
    return client


def test_the_run_page_shows_the_result_and_each_sample(tmp_path, django_user_model):
    run = evaluated(tmp_path)
    page = owner(run, django_user_model).get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "Base score</th><td>0.0000" in page and "Adapter score</th><td>1.0000" in page
    assert "Wins / ties / losses</th><td>5 / 0 / 0 of 5" in page
    assert "promoted: gain over the base +1.0000 &gt;= +0.1000" in page
    assert "vllm, 42.0 tokens/s" in page
    assert page.count("HYPERLINK(prompt") == EVAL_ROWS
    assert reverse("run_evaluation_csv", args=[run.pk]) in page
    assert 'id="evaluate-again"' in page  # finished, and its owner may launch


def test_the_csv_has_every_sample_with_text_kept_from_spreadsheets(tmp_path, django_user_model):
    run = evaluated(tmp_path)
    answer = owner(run, django_user_model).get(reverse("run_evaluation_csv", args=[run.pk]))
    rows = list(csv.reader(io.StringIO(b"".join(answer.streaming_content).decode())))
    assert rows[0] == ["evaluation", "index", "prompt", "expected", "base_answer", "adapter_answer", "base_score",
                       "adapter_score"]
    assert len(rows) == 1 + EVAL_ROWS
    assert rows[1][:3] == ["0", "0", "'=HYPERLINK(prompt 0)"] and rows[1][-2:] == ["0.0", "1.0"]


def test_the_compare_page_leads_with_promoted_runs(tmp_path, django_user_model, settings):
    low = evaluated(tmp_path / "a", [(0.0, 0.2)] * EVAL_ROWS, min_gain=0.5)  # not promoted
    high = evaluated(tmp_path / "b", [(0.5, 0.6)] * EVAL_ROWS, min_gain=0.05)  # promoted, lower adapter score
    better = evaluated(tmp_path / "c", [(0.0, 0.9)] * EVAL_ROWS, min_gain=0.95)  # not promoted, best score
    viewer = django_user_model.objects.create_superuser("boss", password="pw-123456789")
    client = Client()
    client.force_login(viewer)
    page = client.get(reverse("run_compare")).content.decode()
    table = page[page.index('id="compare-evaluations"'):]
    order = [table.index(f"#{run.pk}<") for run in (high, better, low)]
    assert order == sorted(order)
    assert (high.promoted, better.promoted, low.promoted) == (True, False, False)


def test_evaluating_again_needs_the_launch_permission_and_csrf(tmp_path, django_user_model):
    run = evaluated(tmp_path)
    url = reverse("run_evaluate", args=[run.pk])
    form = {"data": "example:eval.jsonl", "scorer": "contains", "max_new_tokens": 16, "max_samples": 3,
            "time_limit_s": 600, "budget_usd": "1.50"}
    viewer = owner(run, django_user_model, may_launch=False)
    assert viewer.post(url, form).status_code == 403
    assert 'id="evaluate-again"' not in viewer.get(reverse("run_detail", args=[run.pk])).content.decode()
    launcher = owner(run, django_user_model)
    launcher.get(reverse("run_detail", args=[run.pk]))
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(Run.objects.get(pk=run.pk).created_by)
    assert checked.post(url, form).status_code == 403  # no CSRF token
    assert not Evaluation.objects.filter(run=run, number=1).exists()


def test_evaluating_again_records_a_new_evaluation_on_a_box_of_its_own(tmp_path, django_user_model):
    from runs import evaluations, events, reports
    from tests.runs.conftest import put_on_a_box

    run = evaluated(tmp_path)
    client = owner(run, django_user_model)
    answer = client.post(reverse("run_evaluate", args=[run.pk]), {
        "data": "example:eval.jsonl", "scorer": "contains", "max_new_tokens": 16, "max_samples": 3,
        "time_limit_s": 600, "budget_usd": "1.50"})
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    run.refresh_from_db()
    again = Evaluation.objects.get(run=run, number=1)
    assert run.state == lifecycle.PENDING and run.wound_up_at is None and run.restarts == 0
    assert (again.samples_expected, again.budget_usd, again.phase) == (3, Decimal("1.50"), 2)
    assert evaluations.spending(run, timezone.now()) == (Decimal(0), Decimal("1.50"))  # its own budget
    token = put_on_a_box(run)
    events.record(run, "rented", "A box was rented for the evaluation.")
    run.attempts.filter(ended_at=None).update(evaluation=again)
    spec = reports.spec(run.attempts.get(ended_at=None))
    assert spec["evaluation"] == {"phase": 2, "done": []}
    assert spec["recipe"]["phases"][-1]["scorer"] == "contains"
    assert spec["phases"][-1]["kind"] == "eval" and spec["phases"][-1]["data"]["sha256"] == again.dataset.sha256
    box = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert post(box, "/evaluation/start", {"phase": 2}).json() == {"done": []}
    post(box, "/evaluation/samples", {"phase": 2, "samples": [sample(i, 1.0, 1.0) for i in range(3)]})
    assert post(box, "/evaluation/finish", {"phase": 2, "generated_with": "transformers",
                                            "tokens_per_s": 5.0}).json()["state"] == "finished"
    assert EvalSample.objects.filter(evaluation=again).count() == 3
    assert EvalSample.objects.filter(evaluation__number=0, evaluation__run=run).count() == EVAL_ROWS  # kept
    page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    section = page[page.index('id="run-evaluations"'):]
    assert "Evaluated again (1)" in section and "The recipe's eval phase" in section, section[-3000:]
    assert "apart from the training" in page


def test_a_running_run_cannot_be_evaluated_again(tmp_path, django_user_model):
    run, _ = started(tmp_path)
    client = owner(run, django_user_model)
    answer = client.post(reverse("run_evaluate", args=[run.pk]), {
        "data": "example:eval.jsonl", "scorer": "exact", "max_new_tokens": 16, "max_samples": 0,
        "time_limit_s": 600, "budget_usd": "1"})
    assert answer.status_code == 400 and "only a finished run" in answer.content.decode()


def test_the_pages_show_an_evaluation_under_way_and_one_that_failed(tmp_path, django_user_model):
    run, box = started(tmp_path)
    post(box, "/evaluation/samples", {"phase": 2, "samples": [sample(0), sample(1)]})
    client = owner(run, django_user_model)
    page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "state-evaluating" in page and "Evaluating: the banked adapter" in page
    assert "2 of 5 samples recorded." in page and 'id="evaluate-again"' not in page
    assert 'state-evaluating">evaluating' in client.get(reverse("runs")).content.decode()
    post(box, "/evaluation/failed", {"phase": 2, "reason": "the scorer mod:score gave 1.5 for sample 2"})
    page = client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "trained, evaluation failed" in page and "Evaluation failed: the scorer mod:score gave 1.5" in page
    assert 'id="evaluate-again"' in page  # its banked adapter can be evaluated again


def test_the_inference_page_offers_promoted_adapters_first(tmp_path, django_user_model):
    plain = evaluated(tmp_path / "a", [(0.0, 0.9)] * EVAL_ROWS, min_gain=0.95)  # best score, not promoted
    promoted = evaluated(tmp_path / "b", [(0.5, 0.6)] * EVAL_ROWS, min_gain=0.05)
    boss = django_user_model.objects.create_superuser("boss", password="pw-123456789")
    client = Client()
    client.force_login(boss)
    page = client.get(reverse("inference")).content.decode()
    listed = page[page.index('id="adapters-to-serve"'):]
    assert listed.index(f"#{promoted.pk}<") < listed.index(f"#{plain.pk}<")
    assert reverse("run_serve", args=[promoted.pk]) in listed and "promoted: adapter 0.6000 vs base 0.5000" in listed
    export = {f"vllm/{name}": {"size": 10, "sha256": "0" * 64} for name in VLLM_FILES}  # as if vLLM's export ran
    for checkpoint in promoted.checkpoints.all():
        Checkpoint.objects.filter(pk=checkpoint.pk).update(manifest={**checkpoint.manifest, **export})
    serve = client.get(reverse("run_serve", args=[promoted.pk])).content.decode()
    assert "Evaluated on example:eval.jsonl: adapter 0.6000 vs base 0.5000" in serve
