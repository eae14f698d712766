"""Each reaper rule at its boundaries, on plain snapshots (no database)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from fleet.reaper.policy import DESTROY, MOVE, SKIP, InstanceSnapshot, ReaperPolicy, decide

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
POLICY = ReaperPolicy(spend_cap_usd_per_hour=None)


def box(pk=1, *, age=timedelta(hours=1), purpose="training", process=True, **fields) -> InstanceSnapshot:
    started = NOW - age
    values = dict(pk=pk, label=f"moe-fleet-{pk}", purpose=purpose, requested_at=started - timedelta(minutes=5),
                  running_at=started, usd_per_hour=Decimal("1.20"),
                  last_process_at=NOW - timedelta(minutes=1) if process else None,
                  last_step_at=NOW - timedelta(minutes=1) if purpose == "training" and process else None,
                  gpu_last_ok_at=NOW - timedelta(seconds=30) if process else None, gpu_util_percent=95.0)
    values.update(fields)
    return InstanceSnapshot(**values)


def verdicts(*boxes, policy=POLICY):
    return [(d.pk, d.action, d.reason) for d in decide(list(boxes), policy, NOW)]


def test_it_leaves_a_healthy_box_alone():
    assert verdicts(box()) == []


def test_it_destroys_past_the_maximum_age():
    assert verdicts(box(age=timedelta(hours=12), purpose="manual")) == []
    assert verdicts(box(age=timedelta(hours=12, minutes=3), purpose="serving")) == [
        (1, DESTROY, "age 12h03m > max 12h")]


def test_it_lets_a_long_run_train_past_the_maximum_age_while_it_makes_progress():
    assert verdicts(box(age=timedelta(hours=30))) == []  # steps a minute ago
    stalled = box(age=timedelta(hours=30), last_step_at=NOW - timedelta(minutes=31), gpu_util_percent=90.0)
    assert verdicts(stalled) == [(1, DESTROY, "age 30h00m > max 12h")]


def test_it_destroys_a_box_that_never_started_its_work():
    assert verdicts(box(age=timedelta(minutes=30), process=False)) == []
    assert verdicts(box(age=timedelta(minutes=31), process=False)) == [
        (1, DESTROY, "no training or serving process 31 min after start")]


def test_it_waits_for_a_box_still_booting_up_to_the_boot_timeout():
    booting = box(process=False, running_at=None, requested_at=NOW - timedelta(minutes=59), purpose="manual")
    assert verdicts(booting) == []
    stuck = box(process=False, running_at=None, requested_at=NOW - timedelta(minutes=61), purpose="manual")
    assert verdicts(stuck) == [(1, DESTROY, "not running 1h01m after it was asked for")]


def test_it_destroys_a_serving_box_after_three_failed_probes():
    assert verdicts(box(purpose="serving", consecutive_probe_failures=2)) == []
    assert verdicts(box(purpose="serving", consecutive_probe_failures=3)) == [
        (1, DESTROY, "3 failed probes of /v1/models")]


def test_it_moves_training_off_a_gpu_that_stopped_answering():
    assert verdicts(box(gpu_last_ok_at=NOW - timedelta(minutes=5))) == []
    assert verdicts(box(gpu_last_ok_at=NOW - timedelta(minutes=6))) == [(1, MOVE, "GPU not responding for 6 min")]


def test_it_moves_training_that_made_no_progress_while_the_gpu_idled():
    stalled = dict(last_step_at=NOW - timedelta(minutes=31))
    assert verdicts(box(**stalled, gpu_util_percent=0.0)) == [(1, MOVE, "GPU idle 31 min and no step progress")]
    assert verdicts(box(**stalled, gpu_util_percent=97.0)) == []  # busy: a long step, not a hang
    assert verdicts(box(last_step_at=NOW - timedelta(minutes=29), gpu_util_percent=0.0)) == []


def test_it_moves_training_whose_agent_lives_but_never_made_a_first_step():
    """Heartbeats every minute keep last_process_at fresh; only the time since the rent tells a stuck start."""
    rented = NOW - timedelta(hours=2, minutes=5)
    stuck = dict(last_step_at=None, requested_at=rented, running_at=rented + timedelta(minutes=4))
    assert verdicts(box(**stuck, gpu_util_percent=0.0)) == [
        (1, MOVE, "no first step 2h05m after it was rented, its GPU idle")]
    assert verdicts(box(**stuck, gpu_util_percent=99.0)) == []  # compiling or loading on the GPU: not idle
    early = dict(stuck, requested_at=NOW - timedelta(minutes=119))
    assert verdicts(box(**early, gpu_util_percent=0.0)) == []


def test_it_skips_a_box_kept_for_debugging_and_says_why():
    kept = box(age=timedelta(hours=13), purpose="manual", keep_until=NOW + timedelta(hours=1))
    (decision,) = decide([kept], POLICY, NOW)
    assert decision.action == SKIP and decision.reason.startswith("kept for debugging until 2026-11-29 13:00 UTC")
    assert "age 13h00m > max 12h" in decision.reason
    expired = box(age=timedelta(hours=13), purpose="manual", keep_until=NOW - timedelta(seconds=1))
    assert verdicts(expired)[0][1] == DESTROY


def test_it_sheds_the_newest_boxes_first_until_under_the_spend_cap():
    policy = ReaperPolicy(spend_cap_usd_per_hour=Decimal("3.00"))
    boxes = [box(pk, age=timedelta(hours=5 - pk), usd_per_hour=Decimal("1.20")) for pk in (1, 2, 3, 4)]
    decisions = decide(boxes, policy, NOW)
    assert [(d.pk, d.action) for d in decisions] == [(4, DESTROY), (3, DESTROY)]  # 4.80 -> 3.60 -> 2.40
    assert decisions[0].reason == "spend $4.80/h > cap $3.00/h: newest first"


def test_it_counts_boxes_already_condemned_out_of_the_spend():
    policy = ReaperPolicy(spend_cap_usd_per_hour=Decimal("2.50"))
    old = box(1, age=timedelta(hours=13), purpose="serving")
    young = [box(pk, age=timedelta(hours=1)) for pk in (2, 3)]
    assert [(d.pk, d.rule) for d in decide([old, *young], policy, NOW)] == [(1, "max_age")]


def test_it_passes_over_a_kept_box_when_shedding_spend():
    policy = ReaperPolicy(spend_cap_usd_per_hour=Decimal("2.00"))
    boxes = [box(1, age=timedelta(hours=3)), box(2, age=timedelta(hours=1), keep_until=NOW + timedelta(hours=1))]
    assert [(d.pk, d.action) for d in decide(boxes, policy, NOW)] == [(2, SKIP), (1, DESTROY)]


def test_a_destroy_not_carried_out_counts_as_spend_already_shed():
    policy = ReaperPolicy(spend_cap_usd_per_hour=Decimal("2.00"))
    stuck = box(1, usd_per_hour=Decimal("2.00"), destroy_overdue=True, age=timedelta(hours=30), process=False)
    live = [box(pk, age=timedelta(hours=5 - pk), usd_per_hour=Decimal("1.20")) for pk in (2, 3)]
    decisions = decide([stuck, *live], policy, NOW)
    # 2.00 still billing + 2.40 live = 4.40, of which 2.00 is being shed: 2.40 > 2.00, so the newest live box goes;
    # the stuck one is judged by no rule (its destroy is the sync's to retry), though it is 30 h old and idle.
    assert [(d.pk, d.action) for d in decisions] == [(3, DESTROY)]
    assert decisions[0].reason == ("spend $4.40/h ($2.00/h of it in destroys asked for, not yet carried out) > "
                                   "cap $2.00/h: newest first")


def test_the_spend_cap_never_sheds_a_live_box_in_place_of_a_destroy_already_asked_for():
    """Destroys lagging a minute once took 8 healthy boxes to 0 in three minutes: each pass shed 2 more in place of
    the 2 the pass before had shed, their destroys overdue."""
    healthy = [box(pk, age=timedelta(hours=9 - pk)) for pk in range(1, 9)]  # the newest last, 1.20/h each
    pending = [box(pk, destroy_overdue=True, process=False) for pk in (9, 10)]
    at_cap = ReaperPolicy(spend_cap_usd_per_hour=Decimal("9.60"))
    assert decide([*healthy, *pending], at_cap, NOW) == []  # 12.00/h billing, 2.40/h of it being shed

    policy = ReaperPolicy(spend_cap_usd_per_hour=Decimal("7.20"))  # 6 boxes' worth
    fleet = healthy
    for _ in range(4):  # a pass a minute; each box shed stays listed, its destroy overdue
        shed = {d.pk for d in decide(fleet, policy, NOW) if d.action == DESTROY}
        fleet = [replace(b, destroy_overdue=True) if b.pk in shed else b for b in fleet]
    assert [b.pk for b in fleet if not b.destroy_overdue] == [1, 2, 3, 4, 5, 6]
