"""A run's evaluations as its box reports them (start, samples, finish, failed; docs/runs.md, "Evaluation"): the
dashboard records each sample once, computes the summary from what it recorded (training/eval_stats.py), applies the
recipe's promote rule and moves the run."""

from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from fleet.alerts.notify import raise_alert
from fleet.models import Alert, Instance
from runs import checkpoints, datasets, events, lifecycle
from runs.costs import evaluation_costs, run_costs
from runs.models import EvalSample, Evaluation, Run, RunAttempt
from training import eval_stats
from training.recipe import EVAL_KIND, PROMOTE_DEFAULTS

ENDED = (Evaluation.State.FINISHED, Evaluation.State.FAILED)


class NotYet(Exception):
    """evaluation/start before every training phase's final checkpoint is banked, or a finish with samples missing
    (the agent API answers 409)."""


class SamplesRefused(Exception):
    """Samples or a phase the dashboard takes none of (the agent API answers 422 with the reason)."""


def training_phases(recipe: dict) -> list[dict]:
    return [p for p in recipe.get("phases") or [] if isinstance(p, dict) and p.get("kind") != EVAL_KIND]


def expected_samples(dataset, phase_settings: dict) -> int:
    """How many samples an evaluation has: its file's records, or the first max_samples of them."""
    rows = dataset.rows if dataset is not None else 0
    cut = int(phase_settings.get("max_samples") or 0)
    return min(rows, cut) if cut else rows


def current(run: Run, *, now: datetime | None = None) -> Evaluation | None:
    """The evaluation the run's box works on: the newest one not ended; the recipe's own (number 0) made from its eval
    phase the first time it is asked for."""
    found = run.evaluations.exclude(state__in=ENDED).order_by("-number").first()
    if found is not None or run.evaluations.filter(number=0).exists():
        return found
    phase = run.phases.filter(kind=EVAL_KIND).select_related("dataset").first()
    if phase is None:
        return None
    settings = run.recipe["phases"][phase.index]
    evaluation, _ = Evaluation.objects.get_or_create(run=run, number=0, defaults={
        "phase": phase.index, "settings": settings, "dataset": phase.dataset,
        "samples_expected": expected_samples(phase.dataset, settings), "created_at": now or timezone.now()})
    return evaluation


def unbanked(run: Run) -> list[str]:
    """What keeps the run's evaluation from starting, in words: each training phase's final adapter sealed."""
    return [f"{uri} is still being sealed" for uri in checkpoints.finals_sealing(run)] or \
        checkpoints.missing_outputs(run)


def spec_entry(run: Run) -> dict | None:
    """The spec's "evaluation" for a box of a run whose training is all banked: its phase and the samples recorded."""
    evaluation = current(run)
    if evaluation is None or unbanked(run):
        return None
    return {"phase": evaluation.phase, "done": _done(evaluation)}


def spec_for_box(run: Run, spec: dict, grant_s: int) -> dict:
    """The spec with its evaluation: an evaluate-again's box gets the training phases and that evaluation's eval
    phase (with its data's read grant) in place of the recipe's own."""
    entry = spec_entry(run)
    if entry is None:
        return spec
    evaluation = current(run)
    if evaluation is not None and evaluation.number > 0:
        recipe = {**run.recipe, "phases": [*training_phases(run.recipe), evaluation.settings]}
        phases = [p for p in spec["phases"] if p["kind"] != EVAL_KIND] + [{
            "index": evaluation.phase, "name": evaluation.settings.get("name") or f"eval-{evaluation.number}",
            "kind": EVAL_KIND, "steps": 0,
            "data": datasets.box_grant(evaluation.dataset, grant_s) if evaluation.dataset else None}]
        spec = {**spec, "recipe": recipe, "phases": phases}
    return {**spec, "evaluation": entry}


def _done(evaluation: Evaluation) -> list[int]:
    return list(evaluation.samples.order_by("index").values_list("index", flat=True))


def _for_box(attempt: RunAttempt, phase: int) -> Evaluation:
    evaluation = current(attempt.run)
    if evaluation is None:
        raise SamplesRefused("This run has no evaluation to run: its recipe has no eval phase.")
    if phase != evaluation.phase:
        raise SamplesRefused(f"phase {phase}: this run's evaluation is phase {evaluation.phase}.")
    return evaluation


def _progress(attempt: RunAttempt, now: datetime) -> None:
    """A sample is the evaluation's step: the supervisor's and the reaper's hang checks see the box at work."""
    Run.objects.filter(pk=attempt.run_id, current_instance_id=attempt.instance_id).update(last_step_at=now)
    Instance.objects.filter(pk=attempt.instance_id).update(last_step_at=now, last_process_at=now)


def start(attempt: RunAttempt, phase: int, *, now: datetime | None = None) -> list[int]:
    """The sample indices already recorded; NotYet while a training phase's adapter is not banked. The first start
    moves the run to evaluating."""
    now = now or timezone.now()
    run = attempt.run
    evaluation = _for_box(attempt, phase)
    waiting = unbanked(run)
    if waiting:
        raise NotYet(f"The training is not banked yet: {'; '.join(waiting)}. Ask again shortly.")
    Evaluation.objects.filter(pk=evaluation.pk, started_at=None).update(started_at=now)
    Evaluation.objects.filter(pk=evaluation.pk).update(state=Evaluation.State.RUNNING)
    _progress(attempt, now)
    if lifecycle.moves(run.state, "evaluating"):
        data = evaluation.dataset.name if evaluation.dataset else evaluation.settings.get("data", "")
        events.record(run, "evaluating", f"Evaluating the banked adapter against the base model on {data} "
                                         f"({evaluation.samples_expected} samples, scorer "
                                         f"{evaluation.settings.get('scorer', 'exact')}).",
                      now=now, from_box=attempt.instance_id)
    return _done(evaluation)


def record_samples(attempt: RunAttempt, phase: int, samples: list[dict], *, now: datetime | None = None) -> int:
    """Stores the samples not recorded before (the first post of an index wins), or none of them if one is out of the
    file's range; returns how many were new."""
    now = now or timezone.now()
    evaluation = _for_box(attempt, phase)
    if evaluation.state != Evaluation.State.RUNNING:
        raise NotYet("The evaluation has not started: post evaluation/start first.")
    for sample in samples:
        if sample["index"] >= evaluation.samples_expected:
            raise SamplesRefused(f"Samples refused, none stored: index {sample['index']} is past the eval file's "
                                 f"{evaluation.samples_expected} samples (indices 0 to "
                                 f"{evaluation.samples_expected - 1}).")
    first: dict[int, dict] = {}
    for sample in samples:
        first.setdefault(sample["index"], sample)
    known = set(evaluation.samples.filter(index__in=list(first)).values_list("index", flat=True))
    new = [EvalSample(evaluation=evaluation, recorded_at=now, **s) for i, s in first.items() if i not in known]
    created = EvalSample.objects.bulk_create(new, ignore_conflicts=True)
    _progress(attempt, now)
    return len(created)


def finish(attempt: RunAttempt, phase: int, generated_with: str, tokens_per_s: float, *,
           now: datetime | None = None) -> Evaluation:
    """The summary of the samples recorded, the promote rule's verdict, the run finished and the alerts sent;
    NotYet when a sample of the file is missing."""
    now = now or timezone.now()
    run = attempt.run
    evaluation = _for_box(attempt, phase)
    rows = list(evaluation.samples.order_by("index").values_list("index", "base_score", "adapter_score"))
    missing = sorted(set(range(evaluation.samples_expected)) - {index for index, _, _ in rows})
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
        raise NotYet(f"{len(missing)} of {evaluation.samples_expected} samples are not recorded: {shown}. Post them "
                     "with evaluation/samples, then finish again.")
    if evaluation.state == Evaluation.State.WAITING:
        raise NotYet("The evaluation has not started: post evaluation/start first.")
    if not rows:
        raise SamplesRefused("The evaluation has no samples to summarize: its eval file has no records.")
    summary = eval_stats.summarize([b for _, b, _ in rows], [a for _, _, a in rows])
    rule = run.recipe.get("promote")
    rule = {**PROMOTE_DEFAULTS, **rule} if isinstance(rule, dict) else None
    promoted, why = eval_stats.promoted(summary, rule)
    verdict = None if rule is None else promoted
    with transaction.atomic():
        updated = Evaluation.objects.filter(pk=evaluation.pk, state=Evaluation.State.RUNNING).update(
            state=Evaluation.State.FINISHED, finished_at=now, reason=why, promoted=verdict,
            generated_with=generated_with, tokens_per_s=tokens_per_s,
            **{k: summary[k] for k in ("base_score", "adapter_score", "difference", "ci_low", "ci_high", "wins",
                                       "ties", "losses")})
        if updated and verdict is not None:
            Run.objects.filter(pk=run.pk).update(promoted=verdict)
    evaluation.refresh_from_db()
    if not updated:
        return evaluation
    words = result_words(evaluation)
    events.record(run, "evaluated", words, now=now, from_box=attempt.instance_id)
    with transaction.atomic():  # each webhook is sent on commit: its body reads the evaluation through the alert
        changes = {"evaluated_alert": raise_alert(Alert.Kind.RUN_EVALUATED,
                                                  f"Run {run.name} (#{run.pk}) evaluated: {words}", now=now)}
        if verdict:
            changes["promoted_alert"] = raise_alert(Alert.Kind.RUN_PROMOTED,
                                                    f"Run {run.name} (#{run.pk}) promoted: {why}.", now=now)
        Evaluation.objects.filter(pk=evaluation.pk).update(**changes)
    evaluation.refresh_from_db()
    return evaluation


def result_words(evaluation: Evaluation) -> str:
    verdict = {None: "no promote rule", True: "promoted", False: "not promoted"}[evaluation.promoted]
    return (f"adapter {evaluation.adapter_score:.4f} vs base {evaluation.base_score:.4f}, difference "
            f"{evaluation.difference:+.4f} (95% interval {evaluation.ci_low:+.4f} to {evaluation.ci_high:+.4f}); "
            f"{evaluation.wins} wins, {evaluation.ties} ties, {evaluation.losses} losses over "
            f"{evaluation.samples_expected} samples; {verdict}"
            f"{': ' + evaluation.reason if evaluation.promoted is not None else ''}.")


def failed(attempt: RunAttempt, phase: int, reason: str, *, now: datetime | None = None) -> str:
    """The evaluation failed on the box: the run ends "trained, evaluation failed", its adapters kept."""
    now = now or timezone.now()
    evaluation = _for_box(attempt, phase)
    fail(evaluation, reason, now)
    return events.record(attempt.run, "evaluation_failed", reason, now=now, from_box=attempt.instance_id)[1]


def fail(evaluation: Evaluation, reason: str, now: datetime) -> None:
    Evaluation.objects.filter(pk=evaluation.pk).exclude(state__in=ENDED).update(
        state=Evaluation.State.FAILED, reason=reason, finished_at=now)


def failure_kind(run: Run, kind: str, now: datetime | None = None) -> str:
    """The event a failure is recorded as: "evaluation_failed" once every training phase is banked and an evaluation
    is due (the run keeps its adapters), else `kind` itself."""
    if kind not in lifecycle.FAILURES:
        return kind
    evaluation = current(run)
    if evaluation is None or unbanked(run):
        return kind
    fail(evaluation, f"{kind.replace('_', ' ')}", now or timezone.now())
    return "evaluation_failed"


def again_due(run: Run) -> Evaluation | None:
    """The evaluate-again the run waits for or runs, if one."""
    return run.evaluations.filter(number__gt=0).exclude(state__in=ENDED).order_by("-number").first()


def spending(run: Run, now: datetime) -> tuple[Decimal, Decimal]:
    """(spent, budget) the run is held to: an evaluate-again's own boxes against its own budget, else the run's."""
    again = again_due(run)
    if again is None or again.budget_usd is None:
        return run_costs([run], now)[run.pk], run.budget_usd
    return evaluation_costs(run, now).get(again.pk, Decimal(0)), again.budget_usd


def ranked_runs(runs) -> list[Evaluation]:
    """Each run's latest finished evaluation, promoted runs first, then by adapter score and difference: what the
    Compare page and serving lead with."""
    latest: dict[int, Evaluation] = {}
    for evaluation in Evaluation.objects.filter(run__in=runs, state=Evaluation.State.FINISHED).select_related(
            "run", "dataset").order_by("run_id", "number"):
        latest[evaluation.run_id] = evaluation
    return sorted(latest.values(), key=lambda e: (e.run.promoted is not True, -(e.adapter_score or 0.0),
                                                  -(e.difference or 0.0), e.run_id))


def alert_data(alert: Alert) -> dict | None:
    """fleet.hooks.on_alert_data: the numbers of a run.evaluated or run.promoted alert, for its webhook body."""
    if alert.kind not in (Alert.Kind.RUN_EVALUATED, Alert.Kind.RUN_PROMOTED):
        return None
    evaluation = (Evaluation.objects.filter(evaluated_alert=alert) | Evaluation.objects.filter(
        promoted_alert=alert)).select_related("run").first()
    if evaluation is None:
        return None
    run = evaluation.run
    return {"run": {"id": run.pk, "name": run.name, "state": run.state, "promoted": run.promoted},
            "evaluation": {"number": evaluation.number, "samples": evaluation.samples_expected,
                           "data": evaluation.dataset.name if evaluation.dataset_id else "",
                           "scorer": evaluation.settings.get("scorer", "exact"),
                           **{k: getattr(evaluation, k) for k in (
                               "base_score", "adapter_score", "difference", "ci_low", "ci_high", "wins", "ties",
                               "losses", "promoted", "generated_with", "tokens_per_s")},
                           "reason": evaluation.reason}}
