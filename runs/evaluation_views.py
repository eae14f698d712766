"""A run's evaluations on its page: each one's result and its first samples, every sample as CSV, and the form that
evaluates the banked adapter again (docs/runs.md, "Evaluation")."""

import csv

from django.contrib import messages
from django.http import StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_http_methods

from fleet.access import require_permission
from runs import evaluate_again as again, sharing
from runs.chart_views import _csv_cell, _Echo
from runs.costs import evaluation_costs
from runs.models import EvalSample, Run

SHOWN_SAMPLES = 50  # per evaluation on the page; the CSV has them all
CSV_COLUMNS = ("index", "prompt", "expected", "base_answer", "adapter_answer", "base_score", "adapter_score")


def page_context(user, run: Run) -> dict:
    """What the run page shows of its evaluations, the form for another where the user may launch one."""
    costs = evaluation_costs(run, timezone.now())
    shown = list(run.evaluations.select_related("dataset"))
    for evaluation in shown:
        evaluation.shown_samples = list(evaluation.samples.all()[:SHOWN_SAMPLES])
        evaluation.recorded = evaluation.samples.count()
        evaluation.cost = costs.get(evaluation.pk)
    form = None
    if run.state in again.EVALUABLE and user.has_perm("runs.launch_run"):
        form = again.EvaluateAgainForm(initial={"data": "example:eval.jsonl"})
    return {"evaluations": shown, "evaluate_form": form, "shown_samples": SHOWN_SAMPLES}


@require_GET
def evaluation_csv(request, pk):
    """Every sample of the run's evaluations, each with its evaluation's number."""
    run = sharing.run_or_404(request.user, pk)
    rows = EvalSample.objects.filter(evaluation__run=run).order_by("evaluation__number", "index").values_list(
        "evaluation__number", *CSV_COLUMNS)
    writer = csv.writer(_Echo())

    def lines():
        yield writer.writerow(["evaluation", *CSV_COLUMNS])
        for row in rows.iterator(chunk_size=1000):
            yield writer.writerow([_csv_cell(v) for v in row])

    name = slugify(run.name) or "run"
    return StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="run-{run.pk}-{name}-evaluation.csv"'})


@require_http_methods(["GET", "POST"])
def run_evaluate(request, pk):
    """GET: the form; POST: evaluates a finished run's banked adapter again on the posted eval file."""
    require_permission(request.user, "runs.launch_run")
    run = sharing.run_or_404(request.user, pk)
    if request.method == "GET":
        form = again.EvaluateAgainForm(initial={"data": "example:eval.jsonl"})
        return render(request, "runs/evaluate_again.html", {"run": run, "form": form})
    form = again.EvaluateAgainForm(request.POST, request.FILES)
    if form.is_valid():
        try:
            evaluation = again.evaluate_again(run, form.cleaned_data, user=request.user)
        except again.Refused as exc:
            form.add_error(exc.field, str(exc))
        else:
            messages.success(request, f"Evaluation {evaluation.number} of {run.name} asked for: the supervisor rents "
                                      "a box that only evaluates.")
            return redirect("run_detail", pk=pk)
    return render(request, "runs/evaluate_again.html", {"run": run, "form": form}, status=400)
