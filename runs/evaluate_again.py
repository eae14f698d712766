"""Evaluate again: a finished run's banked adapter scored on another eval file without training again, on a small box
of its own whose cost is kept apart (docs/runs.md, "Evaluate again")."""

from decimal import Decimal

from django import forms
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from runs import datasets, evaluations, events, lifecycle
from runs.forms import DataFilesField
from runs.models import Evaluation, Run
from training.recipe import EVAL_KIND, RecipeError, validate

EVALUABLE = (lifecycle.FINISHED, lifecycle.EVAL_FAILED)


class EvaluateAgainForm(forms.Form):
    data = forms.CharField(max_length=500, help_text="a data set you stored, an s3://bucket/key object, "
                                                     "example:eval.jsonl, or the name of a file chosen below")
    data_files = DataFilesField(required=False, label="Eval file (JSONL)",
                                help_text="records with a prompt and an expected answer (docs/runs.md)")
    scorer = forms.CharField(max_length=200, initial="exact",
                             help_text="exact, contains, regex, tool_call, or module:function")
    max_new_tokens = forms.IntegerField(min_value=1, max_value=32_768, initial=256)
    max_samples = forms.IntegerField(min_value=0, max_value=1_000_000, initial=0, help_text="0: every record")
    time_limit_s = forms.IntegerField(min_value=60, max_value=7 * 24 * 3600, initial=3600, label="Time limit (s)")
    budget_usd = forms.DecimalField(min_value=Decimal("0.01"), max_digits=10, decimal_places=2, initial=Decimal("2"),
                                    label="Budget ($)", help_text="what this evaluation's own box may cost")


class Refused(ValueError):
    """Why an evaluate-again cannot go ahead; `field` names the form's field it is about, if one."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def evaluate_again(run: Run, data: dict, *, user=None, now=None) -> Evaluation:
    """Checks the eval phase and its data (stored in the run's bucket like a launch's), records the evaluation and
    sends the run back to the supervisor for a box that only evaluates."""
    now = now or timezone.now()
    if run.state not in EVALUABLE:
        raise Refused(f"Run {run.name} #{run.pk} is {run.state}: only a finished run's adapter is evaluated again.")
    waiting = evaluations.unbanked(run)
    if waiting:
        raise Refused(f"Its adapters are not all banked: {'; '.join(waiting)}.")
    training = evaluations.training_phases(run.recipe)
    number = (run.evaluations.aggregate(last=Max("number"))["last"] or 0) + 1
    phase = {"kind": EVAL_KIND, "name": f"eval-{number}", "data": data["data"],
             **{key: data[key] for key in ("scorer", "max_new_tokens", "max_samples", "time_limit_s")}}
    try:
        checked = validate({**run.recipe, "phases": [*training, phase]}, base_dir="/", data_on_disk=False)
    except RecipeError as exc:
        raise Refused(f"The eval phase is not usable: {exc}") from None
    try:
        [dataset] = datasets.resolve({"model": checked["model"], "phases": checked["phases"][-1:]}, run.bucket,
                                     data.get("data_files") or {}, user=user, now=now)
    except datasets.DataError as exc:
        raise Refused(str(exc), "data") from None
    with transaction.atomic():
        evaluation = Evaluation.objects.create(
            run=run, number=number, phase=len(training), settings=phase, dataset=dataset,
            samples_expected=evaluations.expected_samples(dataset, phase), budget_usd=data["budget_usd"],
            requested_by=user, created_at=now)
        who = user.get_username() if user else "the product"
        events.record(run, "evaluate_again", f"{who} asked to evaluate the banked adapter again on {dataset.name} "
                                             f"(evaluation {number}, scorer {phase['scorer']}, budget "
                                             f"${data['budget_usd']}).", now=now)
        # A box of its own: its restarts and its wind-up are this evaluation's.
        Run.objects.filter(pk=run.pk).update(restarts=0, wound_up_at=None, finished_at=None, current_instance=None)
    return evaluation
