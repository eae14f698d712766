"""What a run's box reports through the agent API: heartbeats, metric points, checkpoints and events."""

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from fleet.models import Instance
from runs import events, lifecycle, storage
from runs.models import Checkpoint, MetricPoint, Run
from training import metric_fields

METRIC_FIELDS = list(metric_fields.NAMES)
AGENT_EVENTS = ("agent_started", "probe_ok", "probe_failed", "finished", "trainer_failed", "log")


def heartbeat_interval_s() -> int:
    # Four beats inside the timeout, so one slow answer does not make a healthy box look lost.
    return max(1, settings.AGENT_HEARTBEAT_TIMEOUT_S // 4)


def renewed_until(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.AGENT_DEAD_MAN_WINDOW_S)


def heartbeat(run: Run, beat: dict, *, now=None) -> dict:
    """Renews the box's credentials and passes what it saw to its instance, where the reaper reads it."""
    now = now or timezone.now()
    Run.objects.filter(pk=run.pk).update(last_heartbeat_at=now, credentials_renewed_at=now)
    if run.current_instance_id:
        seen = {}
        if beat.get("process_alive"):
            seen["last_process_at"] = now
        if beat.get("gpu_ok"):
            seen["gpu_last_ok_at"] = now
        if beat.get("gpu_util_percent") is not None:
            seen["gpu_util_percent"] = beat["gpu_util_percent"]
        if seen:
            Instance.objects.filter(pk=run.current_instance_id).update(**seen)
    if lifecycle.moves(run.state, "agent_started"):
        events.record(run, "agent_started", "The box's agent reported in.", now=now)
    stop = not run.is_active
    return {"renewed_until": renewed_until(now), "command": "stop" if stop else "continue",
            "upload": storage.upload_grant(storage.location(run.bucket, run.pk), settings.STORAGE_GRANT_S)}


def ingest_metrics(run: Run, points: list[dict], *, now=None) -> int:
    """Stores a batch of steps in one statement. A step trained again after a resume replaces the earlier one."""
    now = now or timezone.now()
    latest = {(p["phase"], p["step"]): p for p in points}  # a step sent twice in one batch: the later one counts
    rows = [MetricPoint(run_id=run.pk, instance_id=run.current_instance_id, phase=p["phase"], step=p["step"],
                        at=p.get("at") or now, **{f: p.get(f) for f in METRIC_FIELDS if f != "kernel_path"},
                        kernel_path=p.get("kernel_path") or "") for p in latest.values()]
    if not rows:
        return 0
    MetricPoint.objects.bulk_create(rows, update_conflicts=True, unique_fields=["run", "phase", "step"],
                                    update_fields=["at", "instance", *METRIC_FIELDS])
    last = max(rows, key=lambda r: (r.phase, r.step))
    Run.objects.filter(pk=run.pk).update(current_phase=last.phase, current_step=last.step, last_step_at=now)
    if run.current_instance_id:
        Instance.objects.filter(pk=run.current_instance_id).update(last_step_at=now, last_process_at=now)
    if lifecycle.moves(run.state, "step"):
        events.record(run, "step", f"Training: phase {last.phase} step {last.step}.", now=now)
    return len(rows)


def checkpoint(run: Run, notice: dict, *, now=None) -> Checkpoint:
    now = now or timezone.now()
    saved, _ = Checkpoint.objects.update_or_create(
        run=run, phase=notice["phase"], step=notice["step"],
        defaults={"uri": notice["uri"], "complete": notice["complete"], "size_bytes": notice.get("size_bytes"),
                  "created_at": now})
    return saved


def agent_event(run: Run, kind: str, message: str, *, now=None) -> str:
    if kind == "log":
        run.events.create(at=now or timezone.now(), kind="log", message=message)
        return run.state
    return events.record(run, kind, message, now=now)[1]


def resume_point(run: Run) -> Checkpoint | None:
    """The newest checkpoint whose completion marker was written; a half-written one is never used."""
    return run.checkpoints.filter(complete=True).order_by("-phase", "-step").first()


def spec(run: Run, *, now=None) -> dict:
    now = now or timezone.now()
    where = storage.location(run.bucket, run.pk)
    resume = resume_point(run)
    Run.objects.filter(pk=run.pk).update(credentials_renewed_at=now)
    if resume is not None:
        run.events.create(at=now, kind="resume", message=f"The box resumes from {resume.uri} (phase {resume.phase}, "
                                                         f"step {resume.step}), the newest complete checkpoint.")
    return {
        "run_id": run.pk,
        "name": run.name,
        "recipe": run.recipe,
        "phases": [{"index": p.index, "name": p.name, "kind": p.kind, "steps": p.steps} for p in run.phases.all()],
        "resume": None if resume is None else {
            "phase": resume.phase, "step": resume.step, "uri": resume.uri,
            "download": storage.download_grant(where, resume.uri, settings.STORAGE_GRANT_S)},
        "upload": storage.upload_grant(where, settings.STORAGE_GRANT_S),
        "heartbeat_interval_s": heartbeat_interval_s(),
        "dead_man_window_s": settings.AGENT_DEAD_MAN_WINDOW_S,
        "renewed_until": renewed_until(now),
        "max_metric_points": settings.AGENT_MAX_METRIC_POINTS,
    }
