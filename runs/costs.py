"""What a run has cost so far: the sum of the boxes it trained on, each from the instance ledger; an evaluate-again's
boxes are counted in it and also apart."""

from datetime import datetime
from decimal import Decimal

from fleet.instances import ledger
from runs.models import Run, RunAttempt


def run_costs(runs, now: datetime) -> dict[int, Decimal]:
    """run pk -> cost so far (the sum of the boxes it trained on), for many runs with two queries."""
    boxes_of: dict[int, set[int]] = {}
    boxes = {}
    for attempt in RunAttempt.objects.filter(run__in=runs).select_related("instance"):
        boxes_of.setdefault(attempt.run_id, set()).add(attempt.instance_id)
        boxes[attempt.instance_id] = attempt.instance
    costs = ledger.instance_costs(boxes.values(), now)
    return {run.pk: sum((costs[pk] for pk in boxes_of.get(run.pk, ())), Decimal(0)) for run in runs}


def run_cost(run: Run, now: datetime) -> Decimal:
    return run_costs([run], now)[run.pk]


def evaluation_costs(run: Run, now: datetime) -> dict[int, Decimal]:
    """evaluation pk -> what the boxes rented for it cost (evaluate again: shown apart from training's); the recipe's
    own eval phase runs on the training's box and is part of its cost."""
    attempts = list(RunAttempt.objects.filter(run=run).exclude(evaluation=None).select_related("instance"))
    costs = ledger.instance_costs({a.instance_id: a.instance for a in attempts}.values(), now)
    found: dict[int, Decimal] = {}
    for attempt in attempts:
        found[attempt.evaluation_id] = found.get(attempt.evaluation_id, Decimal(0)) + costs[attempt.instance_id]
    return found
