"""A five-phase run on the tiny model, end to end on the simulated marketplace over real HTTP: the real agent and
trainer run as the simulated boxes' processes and report to a live dashboard; the host is killed mid-phase and
mid-upload and hangs once, and the run still finishes with every phase done once, nothing left billing."""

import time
from decimal import Decimal

import pytest

from fleet.instances import charges, ledger
from fleet.models import Instance
from runs.launch import launch
from tests.marketplace import boxes_reporting_to, running_beat

from .conftest import tiny_recipe

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
STEPS = 30


@pytest.fixture
def boxes(tmp_path, settings, live_server):
    settings.RENT_OUTCOME_GRACE_S = settings.DESTROY_VERIFY_S = 5
    # Generous heartbeats: a loaded 2-core machine runs trainer, agent and server.
    with boxes_reporting_to(live_server.url, settings, tmp_path / "boxes", heartbeat_timeout_s=15,
                            extra_env={"FLEET_SIM_UPLINK_MBPS": "1"}) as (market, agents):
        yield market, agents


@pytest.fixture
def beat(celery_worker, tmp_path):
    """Real Celery beat sending the instance sync and the supervisor pass every half second to the real worker."""
    with running_beat(celery_worker, tmp_path, ("fleet.tasks.sync_instances", "runs.tasks.supervise_runs")) as service:
        yield service


def _drive(run, until, timeout_s=240, on_tick=None):
    """Watches the run while beat and the worker carry it; `on_tick` injects the faults."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if on_tick:
            on_tick(run)
        if until(run):
            return run
        time.sleep(0.25)
    events = "\n".join(f"{e.kind}: {e.message[:200]}" for e in run.events.order_by("at", "id"))
    raise AssertionError(f"run is {run.state} at phase {run.current_phase} step {run.current_step}:\n{events}")


def test_a_run_survives_a_dead_host_a_lost_upload_and_a_hang(boxes, beat, tmp_path):
    market, agents = boxes
    # Longer sequences than the tiny example, so that a step takes long enough for uploads and faults to land
    # mid-phase, as they would on a real box.
    recipe = tiny_recipe(phases=[dict(p, steps=STEPS) for p in tiny_recipe()["phases"]], seq_len=256,
                         checkpoint={"every": 2, "keep": 3})
    run = launch(name="e2e", recipe=recipe, bucket=str(tmp_path / "bucket"), budget_usd=Decimal("40"),
                 max_restarts=5)
    faults = []

    def inject(run):
        box = run.current_instance
        if box is None or run.state != "training" or not box.provider_instance_id:
            return
        pid, attempt = int(box.provider_instance_id), run.attempts.last()
        mine = run.checkpoints.filter(created_at__gt=attempt.started_at)
        if not faults and run.current_phase >= 1 and mine.filter(complete=True).exists():
            market.kill_host(pid, vanish_after_s=0)
            faults.append("killed mid-phase")
        elif len(faults) == 1 and run.attempts.count() == 2 and mine.filter(complete=True).exists() \
                and mine.filter(complete=False).exists():
            market.kill_host(pid, vanish_after_s=0)
            faults.append("killed mid-upload")
        elif len(faults) == 2 and run.attempts.count() == 3 and mine.filter(complete=True).exists():
            market.hang_host(pid)
            faults.append("hung")

    run = _drive(run, until=lambda r: not r.is_active, on_tick=inject)
    assert run.state == "finished", run.state_reason
    story = "\n".join(f"{e.at:%H:%M:%S.%f} {e.kind}: {e.message[:150]}" for e in run.events.order_by("at", "id"))
    assert faults == ["killed mid-phase", "killed mid-upload", "hung"], story
    assert run.restarts == 3 and run.attempts.count() == 4

    # Every phase trained to its last step, and each step is stored once.
    for phase in range(5):
        steps = list(run.metrics.filter(phase=phase).order_by("step").values_list("step", flat=True))
        assert steps == list(range(1, STEPS + 1)), (phase, steps)
    # Each new box resumed from a complete checkpoint, never from a half-written one, and none started over.
    resumes = [e.message.split()[4] for e in run.events.filter(kind="resume").order_by("at", "id")]
    assert len(resumes) == 3, story
    assert all(run.checkpoints.get(uri=uri).complete for uri in resumes)
    assert len(set(resumes)) == 3  # each restart moved on from where the last box's uploads got to
    first_box = run.attempts.first().instance
    assert run.metrics.filter(instance=first_box, phase=0, step=1).exists()  # nobody trained that step again

    # Nothing is left billing, and the ledger agrees with the marketplace's bill.
    _drive(run, until=lambda r: not Instance.objects.filter(state__in=Instance.LIVE_STATES).exists(), timeout_s=60)
    assert all(i["state"] in ("destroyed", "dead") or not i.get("listed", True) for i in market.state()["instances"])
    charges.reconcile()
    boxes_of_run = list(Instance.objects.filter(run_attempts__run=run))
    ours = sum(ledger.instance_costs(boxes_of_run, _now()).values(), Decimal(0))
    theirs = sum(i.provider_charged_usd for i in boxes_of_run)
    assert ours == pytest.approx(theirs, rel=Decimal("0.05"))


def _now():
    from django.utils import timezone

    return timezone.now()
