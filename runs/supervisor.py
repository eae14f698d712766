"""The run supervisor, one pass on the beat schedule: carries every active run through its states, rents its box,
notices a lost or hung host within a heartbeat timeout, and resumes on a new box from the last complete checkpoint
until the run finishes, or its restarts or budget run out. Teardown is the default on every way out."""

import logging
import statistics
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from fleet import actions
from fleet.instances import ledger
from fleet.alerts.notify import raise_alert
from fleet.offers.calibration import record_finished_run
from fleet.models import Alert, Instance
from fleet.offers.ranked import run_settings
from fleet.reaper.policy import hung
from fleet.reaper.sweep import policy_from_settings
from fleet.ranking import Recipe
from runs import events, lifecycle, reports, tokens
from runs.models import Run, RunAttempt

log = logging.getLogger(__name__)
AGENT_COMMAND = "python -m training.agent"  # the worker image's own entry point
ONSTART_SCRIPT = Path(settings.BASE_DIR) / "docker" / "onstart.sh"  # for a stock image: install, probe, then the agent


def supervise(*, now: datetime | None = None) -> int:
    now = now or timezone.now()
    runs = Run.objects.filter(Q(state__in=Run.ACTIVE_STATES) | Q(wound_up_at=None))
    count = 0
    for run in runs.select_related("current_instance", "profile"):
        try:
            supervise_run(run, now)
        except Exception:  # one bad run must not stop the others from being supervised
            log.exception("supervising run %s failed; trying again next pass", run.pk)
        count += 1
    return count


def supervise_run(run: Run, now: datetime) -> None:
    if not run.is_active:
        _wind_up(run, now)
        return
    spent = run_cost(run, now)
    if spent >= run.budget_usd:
        _end(run, "budget_exhausted", f"Spent ${spent:.2f} of its ${run.budget_usd:.2f} budget.", now)
        return
    if run.state in lifecycle.ON_A_BOX:
        reason, kind = box_trouble(run, run.current_instance, now)
        if reason:
            _leave_box(run, kind, reason, now)
    if run.state == lifecycle.RECOVERING and run.current_instance_id:  # e.g. its install probe failed
        _abandon_box(run, run.state_reason, now)
    if run.state in (lifecycle.PENDING, lifecycle.RECOVERING):
        if run.restarts > run.max_restarts:
            _end(run, "restarts_exhausted", f"{run.restarts} restarts > the maximum {run.max_restarts}.", now)
        else:
            _rent_box(run, now)


def box_trouble(run: Run, box: Instance | None, now: datetime) -> tuple[str, str]:
    """Why the run cannot go on on its box, as (reason, event kind), or ("", "") if it can. Pure over the rows."""
    if box is None or box.state not in (Instance.State.PROVISIONING, Instance.State.RUNNING):
        what = "has no box" if box is None else f"box {box.label} is {box.state}"
        return f"The run {what}{': ' + box.failure_reason if box and box.failure_reason else ''}.", "host_lost"
    if box.failure_reason:
        return f"Box {box.label} failed: {box.failure_reason}", "host_lost"
    silent_since = run.last_heartbeat_at
    if run.state == lifecycle.PROVISIONING:
        started = box.running_at or box.requested_at
        if silent_since is None and now - started > timedelta(seconds=settings.RUN_INSTALL_TIMEOUT_S):
            return f"No agent reported from {box.label} {int((now - started).total_seconds())} s after start.", \
                "host_lost"
        return "", ""
    if silent_since is not None and now - silent_since > timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S):
        return f"No heartbeat from {box.label} for {int((now - silent_since).total_seconds())} s.", "host_lost"
    if run.state == lifecycle.TRAINING:
        why = hung(progress_at=run.last_step_at or run.last_heartbeat_at, gpu_util_percent=box.gpu_util_percent,
                   gpu_last_ok_at=box.gpu_last_ok_at, policy=policy_from_settings(), now=now)
        if why:
            return f"Box {box.label} is hung: {why}.", "hung"
    return "", ""


def _leave_box(run: Run, kind: str, reason: str, now: datetime) -> None:
    _, after = events.record(run, kind, reason, now=now)
    if after == lifecycle.RECOVERING:
        _abandon_box(run, reason, now)


def _abandon_box(run: Run, reason: str, now: datetime) -> None:
    """The run is done with this box: it is destroyed and its host is not rented for the run again."""
    box = run.current_instance
    RunAttempt.objects.filter(run=run, ended_at=None).update(ended_at=now, end_reason=reason)
    if box is not None:
        Run.objects.filter(pk=run.pk).update(bad_machines=[*run.bad_machines, box.machine_id] if box.machine_id
                                             else run.bad_machines, current_instance=None)
        actions.destroy(box, reason=f"run {run.name}: {reason}", now=now)
    run.refresh_from_db()


def _rent_box(run: Run, now: datetime) -> None:
    image, onstart, bootstrap_env = box_bootstrap()
    bad = set(run.bad_machines)

    def attempt(instance: Instance) -> None:  # in the rent's own transaction: no rented box without its attempt
        RunAttempt.objects.create(run=run, instance=instance, started_at=now)
        Run.objects.filter(pk=run.pk).update(current_instance=instance, last_heartbeat_at=None, last_step_at=None)

    rented = actions.rent_best(*run_settings(run.profile), idempotency_key=f"run-{run.pk}-attempt-"
                               f"{run.attempts.count()}", purpose="training", image=image, avoid_machines=bad,
                               env={**agent_env(run), **bootstrap_env}, onstart=onstart, on_requested=attempt,
                               now=now)
    if rented is None:
        message = "No offer passes the run's filters (bad hosts excluded); trying again next pass."
        if not run.events.filter(kind="waiting", message=message).exists():
            run.events.create(at=now, kind="waiting", message=message)
        return
    instance = rented.instance
    if instance.state == Instance.State.FAILED:  # refused outright: this host is out, the next pass tries another
        Run.objects.filter(pk=run.pk).update(bad_machines=[*bad, instance.machine_id], current_instance=None)
        RunAttempt.objects.filter(run=run, instance=instance).update(ended_at=now, end_reason=instance.failure_reason)
        return
    events.record(run, "rented", f"Rented {instance.label}: offer {instance.offer_id}, {instance.num_gpus}x "
                                 f"{instance.gpu_name} at ${instance.usd_per_hour:.3f}/h.", now=now)
    if not run.started_at:
        Run.objects.filter(pk=run.pk).update(started_at=now)


def box_bootstrap() -> tuple[str, str, dict[str, str]]:
    """The image a run's box is rented with, what it runs at start, and what that needs in its environment."""
    if settings.WORKER_BOOTSTRAP == "onstart":
        return settings.WORKER_STOCK_IMAGE, ONSTART_SCRIPT.read_text(), {"TRAINING_PACKAGE": settings.TRAINING_PACKAGE}
    return settings.WORKER_IMAGE, AGENT_COMMAND, {}


def agent_env(run: Run) -> dict[str, str]:
    """What the box's agent needs before it can ask for anything: where to report, as whom, and how often (it
    heartbeats through the install too, so these cannot wait for the spec)."""
    return {"FLEET_RUN_ID": str(run.pk), "FLEET_AGENT_TOKEN": tokens.issue(run),
            "FLEET_API_URL": settings.DASHBOARD_URL.rstrip("/") + "/api/agent/v1/",
            "FLEET_HEARTBEAT_S": str(reports.heartbeat_interval_s()),
            "FLEET_DEAD_MAN_S": str(settings.AGENT_DEAD_MAN_WINDOW_S)}


def _end(run: Run, kind: str, reason: str, now: datetime) -> None:
    events.record(run, kind, reason, now=now)  # refreshes the run
    _wind_up(run, now)


def _wind_up(run: Run, now: datetime) -> None:
    """A run that ended: destroy its box, alert, and feed the calibration table; claimed, so done once."""
    if not Run.objects.filter(pk=run.pk, wound_up_at=None).update(wound_up_at=now, current_instance=None):
        return
    box = run.current_instance
    RunAttempt.objects.filter(run=run, ended_at=None).update(ended_at=now, end_reason=f"run {run.state}")
    if box is not None:
        actions.destroy(box, reason=f"run {run.name} {run.state}: {run.state_reason}", now=now)
    kind = Alert.Kind.RUN_FINISHED if run.state == lifecycle.FINISHED else Alert.Kind.RUN_FAILED
    raise_alert(kind, f"Run {run.name} {run.state}: {run.state_reason} (cost ${run_cost(run, now):.2f})",
                instance=box, now=now)
    if run.state == lifecycle.FINISHED and box is not None:
        _calibrate(run, box)


def _calibrate(run: Run, box: Instance) -> None:
    steady = list(run.metrics.filter(instance=box, step__gte=3).exclude(step_s=None)
                  .values_list("step_s", "kernel_path"))
    if not steady:
        return
    step_s = statistics.median(s for s, _ in steady)
    kernel_path = steady[-1][1] if steady[-1][1] in ("grouped_mm", "triton") else "triton"
    recipe = run_ranking_recipe(run)
    record_finished_run(gpu_name=box.gpu_name, kernel_path=kernel_path, recipe=recipe, step_seconds=step_s,
                        num_gpus=box.num_gpus)


def run_ranking_recipe(run: Run) -> Recipe:
    """The ranking's view of the run: the profile's model, with the run's own batch shape."""
    base = run_settings(run.profile)[0]
    shape = {k: run.recipe[k] for k in ("batch_size", "grad_accum", "seq_len") if isinstance(run.recipe.get(k), int)}
    return Recipe.from_dict({**base.to_dict(), **shape})


def run_costs(runs, now: datetime) -> dict[int, Decimal]:
    """run pk -> cost so far (the sum of the boxes it trained on), for many runs with two queries."""
    boxes_of, boxes = {}, {}
    for attempt in RunAttempt.objects.filter(run__in=runs).select_related("instance"):
        boxes_of.setdefault(attempt.run_id, set()).add(attempt.instance_id)
        boxes[attempt.instance_id] = attempt.instance
    costs = ledger.instance_costs(boxes.values(), now)
    return {run.pk: sum((costs[pk] for pk in boxes_of.get(run.pk, ())), Decimal(0)) for run in runs}


def run_cost(run: Run, now: datetime) -> Decimal:
    return run_costs([run], now)[run.pk]


def on_move(instance: Instance, reason: str, now: datetime) -> bool:
    """The reaper found the run's box hung: the run leaves it and resumes elsewhere (a FLEET_MOVE_HANDLERS entry)."""
    run = Run.objects.filter(current_instance=instance, state__in=lifecycle.ON_A_BOX).first()
    if run is None:
        return False
    _leave_box(run, "hung", f"The reaper found its box hung: {reason}", now)
    return True
