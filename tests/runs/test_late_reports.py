"""A report from a box just replaced (its token read before the switch, its body handled after) keeps what it says
of its own steps but vouches for nothing of the run's: the new box is judged by its own beats and first step."""

import pytest

from runs import reports
from runs.models import MetricPoint, Run, RunAttempt
from tests.runs.conftest import put_on_a_box

pytestmark = pytest.mark.django_db


def _point(step):
    return {"phase": 0, "step": step, "loss": 2.0, "step_s": 0.5}


def test_a_replaced_boxs_late_steps_and_beat_move_nothing_of_the_run(launched):
    run = launched()
    put_on_a_box(run)
    old = RunAttempt.objects.select_related("run", "instance").get(run=run)
    put_on_a_box(run)  # the supervisor gave up on the old box and put the run on a new one
    Run.objects.filter(pk=run.pk).update(last_step_at=None, last_heartbeat_at=None, current_step=0)
    reports.ingest_metrics(old, [_point(3)])
    reports.heartbeat(old, {"gpu_ok": True})
    run.refresh_from_db()
    assert (run.last_step_at, run.last_heartbeat_at, run.current_step) == (None, None, 0)
    assert MetricPoint.objects.get(run=run).instance_id == old.instance_id  # its step is kept, as its own

    new = RunAttempt.objects.select_related("run", "instance").filter(run=run).order_by("-pk").first()
    reports.ingest_metrics(new, [_point(4)])
    run.refresh_from_db()
    assert run.last_step_at is not None and run.current_step == 4
