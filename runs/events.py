"""Recording what happened to a run and moving its state accordingly (runs.lifecycle decides the state)."""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from fleet.alerts.notify import raise_alert
from fleet.models import Alert
from runs import lifecycle
from runs.models import Run, RunEvent


def record(run: Run, kind: str, message: str, *, now=None, from_box: int | None = None) -> tuple[str, str]:
    """Writes the event and, if it moves the run, moves it once however often it is reported; a replaced box's
    report moves nothing. Returns (before, after) (docs/runs.md, "runs/events.py")."""
    now = now or timezone.now()
    with transaction.atomic():
        RunEvent.objects.create(run=run, at=now, kind=kind, message=message)
        before = Run.objects.values_list("state", flat=True).get(pk=run.pk)
        after = lifecycle.transition(before, kind)
        if after != before:
            changes = {"state": after, "state_reason": message}
            if lifecycle.is_restart(before, after):
                changes["restarts"] = F("restarts") + 1
            if after in lifecycle.ENDED:
                changes["finished_at"] = now
            claim = Run.objects.filter(pk=run.pk, state=before)
            if from_box is not None:
                claim = claim.filter(current_instance_id=from_box)
            if not claim.update(**changes):
                after = before  # someone else moved it first
    run.refresh_from_db()
    if lifecycle.is_restart(before, after):
        raise_alert(Alert.Kind.RUN_RECOVERING,
                    f"Run {run.name} (#{run.pk}) left its box: {message} It resumes on a new box from its newest "
                    f"verified checkpoint (restart {run.restarts} of at most {run.max_restarts}).", now=now)
    return before, after


def this_hour(run: Run, kind: str, now):
    """The run's events of this kind within the hour before `now`: what a box's hourly budgets count."""
    return run.events.filter(kind=kind, at__gte=now - timedelta(hours=1))


def box_news(run: Run, kind: str, message: str, now) -> bool:
    """Records what a box said that moves nothing of the run's: the same words once an hour, and at most
    AGENT_MAX_LOG_EVENTS_PER_HOUR of one kind an hour, so that a box repeating itself (or a hostile one) can neither
    grow the run's history without end nor push its real events off the page. Whether it was recorded."""
    recent = this_hour(run, kind, now)
    if recent.filter(message=message).exists() or recent.count() >= settings.AGENT_MAX_LOG_EVENTS_PER_HOUR:
        return False
    RunEvent.objects.create(run=run, at=now, kind=kind, message=message)
    return True
