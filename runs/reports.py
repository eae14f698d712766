"""What a run's box reports through the agent API: heartbeats, metric points and events (checkpoints: runs.checkpoints),
and the spec it starts from."""

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from fleet import actions
from fleet.models import Instance
from runs import (checkpoints, datasets, evaluations, events, lifecycle, model_grants, model_manifests, pulse,
                  router_loads, storage)
from runs.models import MetricPoint, Run, RunAttempt
from training import metric_fields
from training.recipe import RunRecipe

METRIC_FIELDS = list(metric_fields.NAMES)
AGENT_EVENTS = ("agent_started", "probe_ok", "probe_failed", "finished", "trainer_failed", "log", "model_on_volume")


def heartbeat_interval_s() -> int:
    # Four beats inside the timeout, so one slow answer does not make a healthy box look lost.
    return max(1, settings.AGENT_HEARTBEAT_TIMEOUT_S // 4)


def renewed_until(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.AGENT_DEAD_MAN_WINDOW_S)


def standing_order(*, run_active: bool, spent, budget, supervisor_age_s: float | None,
                   stale_after_s: float) -> tuple[str, str]:
    """What a heartbeat answer tells the box, as (command, why): continue, stop (checkpoint and upload; the dashboard
    takes the box down) or stop_machine (the same, then the box stops itself). Pure (docs/runs.md, "runs/reports.py").
    """
    if not run_active:
        return "stop", "the run has ended"
    if spent >= budget:
        return "stop_machine", f"the run spent ${spent:.2f} of its ${budget:.2f} budget"
    if supervisor_age_s is None or supervisor_age_s > stale_after_s:
        since = "never finished a pass" if supervisor_age_s is None else \
            f"last finished a pass {supervisor_age_s:.0f} s ago"
        return "stop_machine", f"the dashboard's supervisor {since}: nothing would notice this box hang"
    return "continue", ""


def heartbeat(attempt: RunAttempt, beat: dict, *, now=None) -> dict:
    """Renews the box's token and credentials and passes what it saw to its own instance, where the reaper reads it."""
    now = now or timezone.now()
    run = attempt.run
    RunAttempt.objects.filter(pk=attempt.pk).update(token_expires_at=renewed_until(now))
    # Only while its box is the run's: a late beat of a box just replaced must not vouch for its replacement.
    Run.objects.filter(pk=run.pk, current_instance_id=attempt.instance_id).update(last_heartbeat_at=now,
                                                                                   credentials_renewed_at=now)
    # The agent at work counts as the box's process from its first beat: it checks the install, restores the
    # checkpoint and downloads the model (over half an hour for 67 GB at 250 Mb/s) before the trainer starts, and the
    # reaper's idle rule is for boxes where nothing runs at all. A start that never reaches a step is the first-step
    # rule's (fleet.reaper.policy.hung).
    seen = {"last_process_at": now}
    if beat.get("gpu_ok"):
        seen["gpu_last_ok_at"] = now
    if beat.get("gpu_util_percent") is not None:
        seen["gpu_util_percent"] = beat["gpu_util_percent"]
    Instance.objects.filter(pk=attempt.instance_id).update(**seen)
    if lifecycle.moves(run.state, "agent_started"):
        events.record(run, "agent_started", "The box's agent reported in.", now=now, from_box=attempt.instance_id)
    spent, budget = evaluations.spending(run, now)
    command, why = standing_order(run_active=run.is_active, spent=spent, budget=budget,
                                  supervisor_age_s=pulse.age_s("supervisor", now),
                                  stale_after_s=settings.SUPERVISOR_STALE_S)
    if command == "stop_machine" and not run.events.filter(kind="told_to_stop", at__gte=now - timedelta(
            seconds=settings.SUPERVISOR_STALE_S)).exists():
        run.events.create(at=now, kind="told_to_stop", message=f"The box was told to stop its machine: {why}.")
    return {"renewed_until": renewed_until(now), "command": command, "reason": why,
            "upload": storage.upload_grant(storage.location(run.bucket, run.pk), attempt.pk,
                                           settings.STORAGE_UPLOAD_GRANT_S)}


class PointsRefused(Exception):
    """A metric batch the dashboard stores none of (the agent API answers 422 with the reason)."""


def outside_recipe(points: list[dict], phase_steps: list[int]) -> str | None:
    """Why a batch names a step its recipe does not train (each phase's steps given by index), or None. Pure."""
    for point in points:
        phase, step = point["phase"], point["step"]
        if phase >= len(phase_steps):
            return f"phase {phase} step {step}: the recipe has phases 0 to {len(phase_steps) - 1}"
        if not 0 <= step <= phase_steps[phase]:
            return f"phase {phase} step {step}: the recipe trains phase {phase} for {phase_steps[phase]} steps"
    return None


def ingest_metrics(attempt: RunAttempt, points: list[dict], *, now=None) -> int:
    """Stores a batch of steps in one statement, or none of it if one lies outside the recipe's phases and steps. A
    step trained again after a resume replaces the earlier one."""
    now = now or timezone.now()
    run = attempt.run
    # Every stored row is a box's word: a step the recipe never trains would be one more row per post, without end.
    why = outside_recipe(points, [phase.steps for phase in RunRecipe.from_stored(run.recipe).phases])
    if why:
        raise PointsRefused(f"Metric points refused, none stored: {why}.")
    latest = {(p["phase"], p["step"]): p for p in points}  # a step sent twice in one batch: the later one counts
    rows = [MetricPoint(run_id=run.pk, instance_id=attempt.instance_id, phase=p["phase"], step=p["step"],
                        at=p.get("at") or now, **{f: p.get(f) for f in METRIC_FIELDS if f != "kernel_path"},
                        kernel_path=p.get("kernel_path") or "") for p in latest.values()]
    if not rows:
        return 0
    MetricPoint.objects.bulk_create(rows, update_conflicts=True, unique_fields=["run", "phase", "step"],
                                    update_fields=["at", "instance", *METRIC_FIELDS])
    router_loads.store(run, list(latest.values()), now)  # the router's load matrices, beside their steps
    last = max(rows, key=lambda r: (r.phase, r.step))
    # A late batch from a box just replaced (its token read before the switch) keeps its steps but moves nothing of
    # the run's: its replacement is judged by its own first step, not by the old box's last one.
    Run.objects.filter(pk=run.pk, current_instance_id=attempt.instance_id).update(
        current_phase=last.phase, current_step=last.step, last_step_at=now)
    Instance.objects.filter(pk=attempt.instance_id).update(last_step_at=now, last_process_at=now)
    if lifecycle.moves(run.state, "step"):
        events.record(run, "step", f"Training: phase {last.phase} step {last.step}.", now=now,
                      from_box=attempt.instance_id)
    return len(rows)


def agent_event(attempt: RunAttempt, kind: str, message: str, *, now=None) -> str:
    now = now or timezone.now()
    run = attempt.run
    if kind == "model_on_volume":  # the box checked the volume's model against the recorded manifest
        if run.volume:
            model_manifests.box_says_held(run, now)
            events.box_news(run, "model_on_volume", message, now)
        return run.state
    if kind == "log":
        limit = settings.AGENT_MAX_LOG_EVENTS_PER_HOUR
        logged = events.this_hour(run, "log", now).count()
        if logged < limit:
            run.events.create(at=now, kind="log", message=message)
        elif logged == limit:  # a box that logs without end must not grow the database without end: said once
            run.events.create(at=now, kind="log", message=f"More than {limit} log lines from the box within an "
                                                          "hour: the rest of this hour's are dropped.")
        return run.state
    if kind == "finished" and lifecycle.moves(run.state, kind) and Run.objects.filter(
            pk=run.pk, current_instance_id=attempt.instance_id).exists():  # not replaced since its token was read
        sealing = checkpoints.finals_sealing(run)
        if sealing:  # its adapter is stored, not yet where it is kept: the box says it again shortly
            raise checkpoints.StillSealing(f"The final checkpoint {', '.join(sealing)} is still being sealed; "
                                           "send 'finished' again shortly.")
        missing = checkpoints.missing_outputs(run)
        if missing:
            # Green without its adapters would be a lie, and the box's disk may be the only copy left: keep it.
            hours = min(settings.RUN_KEEP_BOX_ON_LOST_OUTPUTS_H, settings.MAX_KEEP_FOR_DEBUG_HOURS)
            try:
                actions.keep_for_debugging(attempt.instance, hours, now=now,
                                           then_destroy=f"run {run.name} #{run.pk} finished with its outputs missing")
                box = f"Its box is kept for {hours:g} h so that its disk can be read."
            except actions.KeepRefused as exc:  # already being destroyed: nothing left to keep
                box = str(exc)
            return events.record(run, "outputs_lost", f"The trainer finished, but {'; '.join(missing)}. {box}",
                                 now=now, from_box=attempt.instance_id)[1]
    kind = evaluations.failure_kind(run, kind, now)  # a failure once the training is banked fails its evaluation
    if not lifecycle.moves(run.state, kind):  # news, not a change: within the box's budget
        events.box_news(run, kind, message, now)
        return run.state
    return events.record(run, kind, message, now=now, from_box=attempt.instance_id)[1]


def spec(attempt: RunAttempt, *, now=None) -> dict:
    now = now or timezone.now()
    run = attempt.run
    where = storage.location(run.bucket, run.pk)
    candidates = checkpoints.resume_points(run)
    Run.objects.filter(pk=run.pk).update(credentials_renewed_at=now)
    if candidates:
        newest = candidates[0]
        message = (f"The box resumes from {newest.uri} (phase {newest.phase}, step {newest.step}), the newest "
                   "verified checkpoint.")
        # Said once however often a box asks for its spec: a box asking in a loop must not grow the run's history.
        if not events.this_hour(run, "resume", now).filter(message=message).exists():
            run.events.create(at=now, kind="resume", message=message)
    return evaluations.spec_for_box(run, {
        "run_id": run.pk,
        "name": run.name,
        "recipe": run.recipe,
        # Each phase's data: its sha256 and an expiring read grant; the agent fetches and checks it before training.
        "phases": [{"index": p.index, "name": p.name, "kind": p.kind, "steps": p.steps,
                    "data": datasets.box_grant(p.dataset, settings.STORAGE_GRANT_S) if p.dataset else None,
                    "eval_data": (datasets.box_grant(p.eval_dataset, settings.STORAGE_GRANT_S) if p.eval_dataset
                                  else None)}
                   for p in run.phases.select_related("dataset", "eval_dataset")],
        # The base model, when the box downloads it: a hub id, or an s3:// prefix's files by size with their GETs
        # (signed once per attempt).
        "model": model_grants.with_manifest(model_grants.for_attempt(attempt, now=now), run),
        # Only a box rented with the volume mounted keeps the model there (one rented after the volume's machine
        # failed downloads it onto its own disk).
        "model_volume": ({"mount_path": run.volume["mount_path"]} if run.volume and attempt.instance.volume
                         else None),
        "resume": [{"phase": c.phase, "step": c.step, "uri": c.uri, "manifest": c.manifest,
                    "download": storage.download_grant(where, c.uri, c.manifest, settings.STORAGE_GRANT_S)}
                   for c in candidates],
        # Its own attempt folder only, for a short while: each heartbeat with a live token renews it.
        "upload": storage.upload_grant(where, attempt.pk, settings.STORAGE_UPLOAD_GRANT_S),
        "heartbeat_interval_s": heartbeat_interval_s(),
        "dead_man_window_s": settings.AGENT_DEAD_MAN_WINDOW_S,
        "renewed_until": renewed_until(now),
        "max_metric_points": settings.AGENT_MAX_METRIC_POINTS,
    }, settings.STORAGE_GRANT_S)  # with "evaluation" once every training phase is banked
