"""The run supervisor, one pass on the beat schedule: carries every active run through its states, rents its box, and
resumes on a new box from the last complete checkpoint when its host is lost or hung. Teardown is the default on every
way out (docs/runs.md, "runs/supervisor.py")."""

import logging
import statistics
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Max, Q
from django.utils import timezone

from fleet import actions, locks, volumes
from fleet.alerts.notify import raise_alert
from fleet.offers.calibration import box_measurement_problem, record_finished_run
from fleet.models import Alert, Instance
from fleet.reaper.policy import hung
from fleet.reaper.sweep import policy_from_settings
from runs import checkpoints, evaluations, events, lifecycle, pulse, reports, tokens
from runs.box_request import BoxRequest
from runs.costs import run_cost
from runs.models import Run, RunAttempt

log = logging.getLogger(__name__)
AGENT_COMMAND = "python -m training.agent"  # the worker image's own entry point
ONSTART_SCRIPT = Path(settings.BASE_DIR) / "docker" / "onstart.sh"  # for a stock image: install, probe, then the agent


def supervise(*, now: datetime | None = None) -> int:
    """One pass over every run that is active or not yet wound up, each judged at the time its turn comes unless `now`
    is given (docs/runs.md, "runs/supervisor.py")."""
    # A run that ended is passed over too while an attempt's folder is left to empty (its grant not yet expired).
    runs = Run.objects.filter(Q(state__in=Run.ACTIVE_STATES) | Q(wound_up_at=None) | Q(
        attempts__ended_at__isnull=False, attempts__uploads_deleted_at=None)).distinct()
    count = 0
    for pk in runs.values_list("pk", flat=True):
        try:
            with locks.claim(claim_name(pk)) as held:
                if not held:
                    continue  # another pass is on it right now
                supervise_run(Run.objects.select_related("current_instance", "profile").get(pk=pk),
                              now or timezone.now())
        except Exception:  # one bad run must not stop the others from being supervised
            log.exception("supervising run %s failed; trying again next pass", pk)
        count += 1
    pulse.record("supervisor", timezone.now())  # boxes stop themselves when this goes stale (runs.reports)
    return count


def claim_name(run_pk: int) -> str:
    return f"runs.supervise.{run_pk}"


def supervise_run(run: Run, now: datetime) -> None:
    """One run's pass; its caller holds the run's claim and read the run under it."""
    checkpoints.tend_store(run, now)
    if not run.is_active:
        _wind_up(run, now)
        return
    spent, budget = evaluations.spending(run, now)  # an evaluate-again is held to its own budget
    if spent >= budget:
        _end(run, "budget_exhausted", f"Spent ${spent:.2f} of its ${budget:.2f} budget.", now)
        return
    if run.state in lifecycle.ON_A_BOX:
        reason, kind = box_trouble(run, run.current_instance, now)
        if reason:
            _leave_box(run, kind, reason, now)
    if run.state == lifecycle.RECOVERING and _was_on(run.current_instance):  # e.g. its install probe failed
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
    if run.state in (lifecycle.TRAINING, lifecycle.EVALUATING):  # an evaluation's progress: each sample recorded
        why = hung(progress_at=run.last_step_at, gpu_util_percent=box.gpu_util_percent,
                   gpu_last_ok_at=box.gpu_last_ok_at, policy=policy_from_settings(), now=now,
                   first_step_since=box.requested_at if run.last_step_at is None else None)
        if why:
            return f"Box {box.label} is hung: {why}.", "hung"
    return "", ""


def _was_on(box: Instance | None) -> bool:
    """Whether the run's current box is one it went onto (a machine was attached to it), not the next one it asked
    for while recovering."""
    return box is not None and box.provider_instance_id is not None


def _leave_box(run: Run, kind: str, reason: str, now: datetime) -> None:
    _, after = events.record(run, kind, reason, now=now)
    if after == lifecycle.RECOVERING:
        _abandon_box(run, reason, now)


def _abandon_box(run: Run, reason: str, now: datetime) -> None:
    """The run is done with this box: it is destroyed and its host is not rented for the run again. The destroy
    comes before the run lets go of the box, so no box bills on that no run points at (docs/runs.md,
    "runs/supervisor.py")."""
    box = run.current_instance
    if box is not None:
        actions.destroy(box, reason=f"run {run.name}: {reason}", now=now)
    RunAttempt.objects.filter(run=run, ended_at=None).update(ended_at=now, end_reason=reason)
    if box is not None:
        Run.objects.filter(pk=run.pk).update(bad_machines=[*run.bad_machines, box.machine_id] if box.machine_id
                                             else run.bad_machines, current_instance=None)
    run.refresh_from_db()


ASK, RENT, WAIT, ON_IT, DROP = "ask", "rent", "wait", "on it", "drop"
NEEDS_A_BOX = (lifecycle.PENDING, lifecycle.RECOVERING)


class _NoLongerWanted(Exception):
    """The run stopped waiting for a box while one was being asked for: the request is rolled back."""


def box_step(box: Instance | None) -> str:
    """What a run that needs a box does with its current one, pure over the row: ASK, RENT, WAIT, ON_IT or DROP
    (docs/runs.md, "runs/supervisor.py")."""
    if box is None:
        return ASK
    if box.state == Instance.State.REQUESTED:
        return RENT if box.rent_attempted_at is None else WAIT
    if box.state in (Instance.State.PROVISIONING, Instance.State.RUNNING):
        return ON_IT
    return DROP


def _rent_box(run: Run, now: datetime) -> None:
    """Gets the run a box: asks for one, or carries on with the one asked for in an earlier pass."""
    box = run.current_instance
    if box_step(box) == ASK:
        box = _request_box(run, now)
        if box is None:
            return
    if box_step(box) == RENT:
        box = _call_rent(run, box, now)
    step = box_step(box)
    if step == DROP:  # this host is out and the next pass asks for another; not a restart: the run never left a box
        RunAttempt.objects.filter(run=run, instance=box).update(ended_at=now, end_reason=box.failure_reason or
                                                                f"box {box.label} is {box.state}")
        Run.objects.filter(pk=run.pk).update(bad_machines=[*run.bad_machines, box.machine_id] if box.machine_id
                                             else run.bad_machines, current_instance=None)
        actions.destroy(box, reason=f"run {run.name} moved on from it", now=now)
    elif step == ON_IT:
        on_box_attached(box, now)  # its attach moved the run on already, unless that attach predates the handler


def _request_box(run: Run, now: datetime) -> Instance | None:
    image, _, _ = box_bootstrap()

    def attempt(instance: Instance) -> None:  # in the request's own transaction: no box without its attempt
        # Only while the run still waits for a box: a cancel (or any end) since this pass read it rolls the request
        # back, so nothing is rented for a run that no longer wants it.
        if not Run.objects.filter(pk=run.pk, state__in=NEEDS_A_BOX, current_instance=None).update(
                current_instance=instance, last_heartbeat_at=None, last_step_at=None):
            raise _NoLongerWanted
        RunAttempt.objects.create(run=run, instance=instance, started_at=now, token_nonce=tokens.new_nonce(),
                                  evaluation=again)

    again = evaluations.again_due(run)  # an evaluate-again's box: one GPU ranked by the model's inference VRAM
    request = BoxRequest.for_evaluation(run) if again is not None else BoxRequest.for_run(run)
    if run.volume and request.volume is None:
        message = (f"The volume {run.volume['id']} lives on vast.ai machine {run.volume['machine_id']}, which failed "
                   "this run: its boxes are rented elsewhere and download the model onto their own disk.")
        if not run.events.filter(kind="log", message=message).exists():
            run.events.create(at=now, kind="log", message=message)
    try:
        requested = actions.request_best(request.figures, request.filters, idempotency_key=f"run-{run.pk}-attempt-"
                                         f"{run.attempts.count()}", purpose="training", image=image,
                                         disk_gb=run.disk_gb, avoid_machines=set(run.bad_machines),
                                         on_requested=attempt, volume=request.volume, now=now)
    except _NoLongerWanted:
        return None
    if requested is None:
        hours = settings.RUN_NO_OFFER_TIMEOUT_H
        mounts = f"; its volume mounts on {volumes.where(request.volume)}" if request.volume else ""
        if now - _waiting_since(run) >= timedelta(hours=hours):
            # Nothing bills meanwhile, but a run left waiting for good is one its user believes is on its way.
            _end(run, "no_offer", f"No offer passed the run's filters for {hours:g} h ({len(run.bad_machines)} "
                                  f"hosts excluded as bad; {request.vram_words}{mounts}): widen the filters or the GPU "
                                  "choice and launch it again.", now)
            return None
        message = f"No offer passes the run's filters (bad hosts excluded; {request.vram_words}{mounts}); trying " \
                  "again next pass."
        if not run.events.filter(kind="waiting", message=message).exists():
            run.events.create(at=now, kind="waiting", message=message)
        return None
    return requested.instance


def _waiting_since(run: Run) -> datetime:
    """Since when the run has had no box: its launch, or the end of its last attempt."""
    last_end = run.attempts.exclude(ended_at=None).aggregate(last=Max("ended_at"))["last"]
    return max(run.created_at, last_end) if last_end else run.created_at


def _call_rent(run: Run, box: Instance, now: datetime) -> Instance:
    _, onstart, bootstrap_env = box_bootstrap()
    attempt = RunAttempt.objects.select_related("run").get(run=run, instance=box)
    if attempt.run.state not in NEEDS_A_BOX:  # ended (cancelled) since the box was asked for: never rent it
        actions.destroy(box, reason=f"run {run.name} is {attempt.run.state}", now=now)  # cancels the unrented row
        box.refresh_from_db()
        return box
    # The box's token opens this attempt only.
    return actions.rent(box.pk, now=now, env={**agent_env(attempt), **bootstrap_env}, onstart=onstart)


def box_bootstrap() -> tuple[str, str, dict[str, str]]:
    """The image a run's box is rented with, what it runs at start, and what that needs in its environment."""
    if settings.WORKER_BOOTSTRAP == "onstart":
        return settings.WORKER_STOCK_IMAGE, ONSTART_SCRIPT.read_text(), {"TRAINING_PACKAGE": settings.TRAINING_PACKAGE}
    return settings.WORKER_IMAGE, AGENT_COMMAND, {}


def agent_env(attempt: RunAttempt) -> dict[str, str]:
    """What the box's agent needs before it can ask for anything: where to report, as whom, and how often (it
    heartbeats through the install too, so these cannot wait for the spec)."""
    env = {"FLEET_RUN_ID": str(attempt.run_id), "FLEET_AGENT_TOKEN": tokens.issue(attempt),
           "FLEET_API_URL": settings.DASHBOARD_URL.rstrip("/") + "/api/agent/v1/",
           "FLEET_HEARTBEAT_S": str(reports.heartbeat_interval_s()),
           "FLEET_DEAD_MAN_S": str(settings.AGENT_DEAD_MAN_WINDOW_S)}
    model_type = ((attempt.run.recipe.get("model") or {}).get("config") or {}).get("model_type")
    if isinstance(model_type, str) and model_type.replace("_", "").isalnum():
        env["FLEET_MODEL_TYPE"] = model_type  # the probe checks that family's kernels (FLA for Gated DeltaNet)
    return env


def _end(run: Run, kind: str, reason: str, now: datetime) -> None:
    # Once every training phase is banked, the run ends "trained, evaluation failed", never failed.
    events.record(run, evaluations.failure_kind(run, kind, now), reason, now=now)  # refreshes the run
    _wind_up(run, now)


def _wind_up(run: Run, now: datetime) -> None:
    """A run that ended: destroy its box, alert, and feed the calibration table; claimed, so done once. The box is
    destroyed before the claim, so it never bills on (docs/runs.md, "runs/supervisor.py")."""
    box = run.current_instance
    if box is not None:
        actions.destroy(box, reason=f"run {run.name} {run.state}: {run.state_reason}", now=now)
    if not Run.objects.filter(pk=run.pk, wound_up_at=None).update(wound_up_at=now, current_instance=None):
        return
    RunAttempt.objects.filter(run=run, ended_at=None).update(ended_at=now, end_reason=f"run {run.state}")
    kind = {lifecycle.FINISHED: Alert.Kind.RUN_FINISHED, lifecycle.CANCELLED: Alert.Kind.RUN_CANCELLED}.get(
        run.state, Alert.Kind.RUN_FAILED)
    raise_alert(kind, f"Run {run.name} {run.state}: {run.state_reason} (cost ${run_cost(run, now):.2f})",
                instance=box, now=now)
    if run.state == lifecycle.FINISHED and box is not None:
        _calibrate(run, box)


def _calibrate(run: Run, box: Instance) -> None:
    """Feeds the calibration table the run's steady step time on its last box when that measures the ranking's
    recipe on a GPU; otherwise the run's events say why it does not."""
    steady = list(run.metrics.filter(instance=box, step__gte=3).exclude(step_s=None)
                  .values_list("step_s", "kernel_path"))
    if not steady:
        return
    kernel_path = steady[-1][1]
    recipe = BoxRequest.for_run(run).figures
    problem = box_measurement_problem(box, kernel_path=kernel_path, recipe=recipe, run_model=run.recipe.get("model"))
    if problem:
        run.events.create(at=timezone.now(), kind="calibration",
                          message=f"Not recorded in the calibration table: {problem}.")
        return
    step_s = statistics.median(s for s, path in steady if path == kernel_path)
    record_finished_run(gpu_name=box.gpu_name, kernel_path=kernel_path, recipe=recipe, step_seconds=step_s,
                        num_gpus=box.num_gpus)


def on_box_attached(instance: Instance, now: datetime) -> None:
    """A machine was attached to a run's current box (fleet.hooks.on_attach, in that transaction): the run
    moves to "provisioning" on it, whether the supervisor's own rent or a sync that found it by label attached it."""
    run = Run.objects.filter(current_instance=instance, state__in=(lifecycle.PENDING, lifecycle.RECOVERING)).first()
    if run is None:
        return
    events.record(run, "rented", f"Rented {instance.label}: offer {instance.offer_id}, {instance.num_gpus}x "
                                 f"{instance.gpu_name} at ${instance.usd_per_hour:.3f}/h.", now=now)
    Run.objects.filter(pk=run.pk, started_at=None).update(started_at=now)


def on_move(instance: Instance, reason: str, now: datetime) -> bool:
    """The reaper found a run's box hung (fleet.hooks.on_move): the run leaves it and resumes on a box it
    rents itself, never on a like box rented for it. A run's box the run has left already is only destroyed."""
    run = Run.objects.filter(current_instance=instance, state__in=lifecycle.ON_A_BOX).first()
    if run is None and not RunAttempt.objects.filter(instance=instance).exists():
        return False
    if run is not None:
        with locks.claim(claim_name(run.pk)) as held:
            if held:  # else a pass has the run now: it finds its box stopping and moves on by itself
                run.refresh_from_db()
                if run.current_instance_id == instance.pk and run.state in lifecycle.ON_A_BOX:
                    _leave_box(run, "hung", f"The reaper found its box hung: {reason}", now)
    actions.destroy(instance, reason=reason, now=now)
    return True
