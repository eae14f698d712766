"""Reaper passes against the database and the simulated marketplace: claims, dry runs, moves, alerts."""

import io
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from fleet import actions
from fleet.instances import ledger
from fleet.reaper import sweep
from fleet.models import Alert, Instance, Offer
from fleet.offers.refresh import refresh_offers
from fleet.providers.registry import get_provider
from tests.waiting import wait_until

State = Instance.State


def _offers(n=3):
    return list(Offer.objects.filter(available=True, is_bid=False, cuda_max__gte=12.8, disk_gb__gte=100)
                .order_by("total_usd_per_hour")[:n])


def _rented(offer, key, **fields) -> Instance:
    instance, _ = actions.request_rent(offer=offer, idempotency_key=key, disk_gb=100, purpose=fields.pop(
        "purpose", "training"))
    instance = actions.rent(instance.pk)
    Instance.objects.filter(pk=instance.pk).update(state=State.RUNNING, **fields)
    instance.refresh_from_db()
    return instance


def _working_boxes(now, key: str, n=3) -> list[Instance]:
    """n boxes at work, rented an hour apart, the oldest first."""
    refresh_offers()
    return [_rented(offer, f"{key}{i}", running_at=now - timedelta(hours=n - i), last_process_at=now,
                    requested_at=now - timedelta(hours=n - i)) for i, offer in enumerate(_offers(n))]


@pytest.mark.django_db
def test_it_reports_without_destroying_in_a_dry_run(market):
    refresh_offers()
    old = _rented(_offers()[0], "old", running_at=timezone.now() - timedelta(hours=13),
                  last_process_at=timezone.now())
    report = sweep.reap(dry_run=True)
    assert report.lines() == [f"would destroy {old.label}: age 13h00m > max 12h"]
    old.refresh_from_db()
    assert old.reaped_at is None and old.state == State.RUNNING
    assert not Alert.objects.filter(kind=Alert.Kind.INSTANCE_REAPED).exists()


@pytest.mark.django_db
def test_it_keeps_the_reap_command_dry_when_the_setting_says_so(market, settings):
    settings.REAPER_DRY_RUN = True
    refresh_offers()
    old = _rented(_offers()[0], "old-command", running_at=timezone.now() - timedelta(hours=13),
                  last_process_at=timezone.now())
    out = io.StringIO()
    call_command("reap", stdout=out)  # no --dry-run flag: the setting still holds
    assert out.getvalue().splitlines() == [f"(dry run) would destroy {old.label}: age 13h00m > max 12h",
                                           "(dry run) would reap 1 (1 destroy, 0 move): 1 box checked, 0 kept"]
    old.refresh_from_db()
    assert old.reaped_at is None and old.state == State.RUNNING


@pytest.mark.django_db
def test_its_dry_run_says_why_each_box_is_kept_and_that_nothing_is_due(market):
    refresh_offers()
    now = timezone.now()
    offers = _offers(3)
    training = _rented(offers[0], "kept-training", purpose="training", running_at=now - timedelta(hours=1),
                       last_process_at=now, last_step_at=now - timedelta(seconds=4))
    serving = _rented(offers[1], "kept-serving", purpose="serving", running_at=now - timedelta(minutes=20),
                      last_process_at=now, consecutive_probe_failures=1)
    fresh = _rented(offers[2], "kept-fresh", purpose="manual", running_at=now - timedelta(minutes=3))
    out = io.StringIO()
    call_command("reap", "--dry-run", stdout=out)
    lines = out.getvalue().splitlines()
    assert sorted(lines[:3]) == sorted([
        f"(dry run) kept {training.label}: training, last step 4 s ago; moved if hung (GPU silent 5 min, or idle "
        "30 min without progress)",
        f"(dry run) kept {serving.label}: serving, 1 failed probes in a row of 3 allowed; age 20 min of max 12h",
        f"(dry run) kept {fresh.label}: no process yet, 3 min after start of 30 min allowed"])
    assert lines[3:] == ["(dry run) nothing to reap: 3 boxes checked, 3 kept"]
    assert Instance.objects.filter(state=State.RUNNING, reaped_at=None).count() == 3


def test_it_destroys_once_when_two_passes_run_at_once(frozen_market, celery_worker):
    refresh_offers()
    now = timezone.now()
    idle = _rented(_offers()[0], "idle", running_at=now - timedelta(minutes=45))

    def one_pass():
        try:
            sweep.reap(now=now)
        finally:
            connection.close()

    passes = [threading.Thread(target=one_pass) for _ in range(2)]
    for p in passes:
        p.start()
    for p in passes:
        p.join()
    wait_until(lambda: Instance.objects.get(pk=idle.pk).state == State.STOPPING, "the idle box to stop")
    time.sleep(1)  # a second destroy, had one been sent, would have landed by now
    idle.refresh_from_db()
    assert idle.reap_reason == "no training or serving process 45 min after start"
    assert idle.destroy_attempts == 1
    assert Alert.objects.filter(kind=Alert.Kind.INSTANCE_REAPED, instance=idle).count() == 1
    assert idle.events.filter(kind="reaped").count() == 1
    assert sweep.reap(now=now).acted == []  # a later pass leaves a reaped row alone


def test_it_moves_hung_training_to_a_new_box(frozen_market, celery_worker):
    refresh_offers()
    now = timezone.now()
    hung = _rented(_offers()[0], "hung", running_at=now - timedelta(hours=2), last_process_at=now,
                   gpu_last_ok_at=now - timedelta(minutes=7), last_step_at=now - timedelta(minutes=7))
    sweep.reap(now=now)
    wait_until(lambda: Instance.objects.filter(replaces=hung).exclude(provider_instance_id=None).exists(),
               "a replacement rented for the hung box")
    hung.refresh_from_db()
    new = Instance.objects.get(replaces=hung)
    assert hung.state == State.STOPPING and hung.reap_reason == "GPU not responding for 7 min"
    assert new.purpose == "training" and new.machine_id != hung.machine_id
    assert f"Work moves to {new.label}" in hung.events.get(kind="replaced").message


@pytest.mark.django_db
def test_it_alerts_once_when_the_spend_cap_is_hit(market, settings):
    now = timezone.now()
    boxes = _working_boxes(now, "b")
    settings.SPEND_CAP_USD_PER_HOUR = boxes[0].usd_per_hour + boxes[1].usd_per_hour
    report = sweep.reap(now=now)
    assert report.acted == [boxes[2].pk]  # the newest goes first, and one is enough
    assert "newest first" in boxes[2].events.get(kind="reaped").message
    assert Alert.objects.filter(kind=Alert.Kind.SPEND_CAP_HIT).count() == 1


@pytest.mark.django_db
def test_the_spend_cap_counts_a_box_whose_destroy_the_marketplace_has_not_carried_out(market, settings):
    now = timezone.now()
    stuck, older, newest = _working_boxes(now, "s")
    # Asked to stop ten minutes ago, still on the marketplace: it bills whatever its row says, and is being shed.
    Instance.objects.filter(pk=stuck.pk).update(state=State.STOPPING, destroy_attempts=2,
                                                destroy_requested_at=now - timedelta(minutes=10))
    settings.SPEND_CAP_USD_PER_HOUR = older.usd_per_hour
    report = sweep.reap(now=now)
    assert report.acted == [newest.pk]
    assert "in destroys asked for, not yet carried out" in newest.events.get(kind="reaped").message
    stuck.refresh_from_db()
    assert stuck.state == State.STOPPING and stuck.reaped_at is None  # not claimed a second time
    # The rent page's "over the cap" warning counts what the reaper counts.
    assert ledger.committed_usd_per_hour() == stuck.usd_per_hour + older.usd_per_hour


@pytest.mark.django_db
def test_the_spend_cap_sheds_once_while_its_destroys_lag_pass_after_pass(market, settings):
    """Destroys lagging a minute once took 8 healthy boxes to 0 in three minutes: each pass shed 2 live boxes in
    place of the 2 whose destroys were overdue."""
    settings.DESTROY_VERIFY_S = 60
    now = timezone.now()
    boxes = _working_boxes(now, "lag", n=8)  # the cheapest first, so the two newest cover the excess
    settings.SPEND_CAP_USD_PER_HOUR = sum(b.usd_per_hour for b in boxes[:6])
    shed = {b.pk for b in boxes[6:]}
    assert set(sweep.reap(now=now).acted) == shed
    for minute in (1, 2, 3, 4):
        # No worker takes the hand-overs here: each shed box stays on the marketplace, its destroy overdue.
        later = now + timedelta(minutes=minute)
        assert {s.pk for s in sweep.snapshots(later) if s.destroy_overdue} == shed
        assert sweep.reap(now=later).acted == []
    with get_provider() as provider:
        listed = {i.instance_id for i in provider.list_instances()}
    assert {b.provider_instance_id for b in boxes} <= listed
    assert set(Instance.objects.filter(state=State.RUNNING).values_list("pk", flat=True)) == {
        b.pk for b in boxes[:6]}


@pytest.mark.django_db
def test_a_destroy_just_sent_is_not_counted_while_the_marketplace_carries_it_out(market, settings):
    """The box the cap shed a pass ago is on its way out: counting it again would shed one more."""
    now = timezone.now()
    leaving, older, newest = _working_boxes(now, "l")
    Instance.objects.filter(pk=leaving.pk).update(state=State.STOPPING, destroy_attempts=1,
                                                  destroy_requested_at=now - timedelta(seconds=20))
    settings.SPEND_CAP_USD_PER_HOUR = older.usd_per_hour + newest.usd_per_hour
    assert sweep.reap(now=now).acted == []


@pytest.mark.django_db
def test_it_says_once_that_it_spared_a_kept_box(market):
    refresh_offers()
    now = timezone.now()
    kept = _rented(_offers()[0], "kept", running_at=now - timedelta(hours=13), last_process_at=now,
                   keep_until=now + timedelta(hours=1))
    sweep.reap(now=now)
    sweep.reap(now=now + timedelta(minutes=1))
    kept.refresh_from_db()
    assert kept.reaped_at is None
    assert kept.events.filter(kind="reap-skipped").count() == 1


@pytest.mark.django_db
def test_a_keep_after_the_reaper_claimed_a_box_wins_until_it_expires(market, settings):
    settings.DESTROY_VERIFY_S = 0
    refresh_offers()
    now = timezone.now()
    box = _rented(_offers()[0], "claimed", running_at=now - timedelta(hours=13), last_process_at=now)
    assert sweep.reap(now=now).acted == [box.pk]  # stopping; its destroy is queued, not yet sent
    actions.keep_for_debugging(box, 1, now=now)
    box.refresh_from_db()
    assert box.state == State.RUNNING and box.destroy_requested_at is None
    assert box.events.filter(kind="destroy-withdrawn").exists()

    actions.destroy(box, reason="reaped: age", now=now)  # the queued destroy runs, and finds it kept
    actions.sync(now=now + timedelta(minutes=5))  # nor does the sync send one behind the keep's back
    box.refresh_from_db()
    assert box.state == State.RUNNING and box.destroy_attempts == 0
    with get_provider() as provider:
        assert box.provider_instance_id in {i.instance_id for i in provider.list_instances()}

    # Kept, it is judged again like any box (and counted by the spend cap): spared while the keep lasts, then reaped.
    assert sweep.reap(now=now + timedelta(minutes=59)).acted == []
    assert sweep.reap(now=now + timedelta(minutes=61)).acted == [box.pk]


@pytest.mark.django_db
def test_a_box_whose_destroy_was_sent_cannot_be_kept(market):
    refresh_offers()
    box = _rented(_offers()[0], "sent", running_at=timezone.now(), last_process_at=timezone.now())
    box = actions.destroy(box, reason="done")
    assert box.state == State.STOPPING and box.destroy_attempts == 1
    with pytest.raises(actions.KeepRefused, match="cannot be kept"):
        actions.keep_for_debugging(box, 1)
    box.refresh_from_db()
    assert box.keep_until is None and box.state == State.STOPPING


@pytest.mark.django_db
def test_a_keep_that_lands_between_a_destroys_claim_and_its_call_wins(market):
    """The product claimed the row for a destroy (stopping, nothing sent); a person's keep withdrew it before the
    provider call went out: the call must not be sent behind the keep."""
    refresh_offers()
    now = timezone.now()
    box = _rented(_offers()[0], "raced", running_at=now - timedelta(hours=1), last_process_at=now)
    Instance.objects.filter(pk=box.pk).update(state=State.STOPPING, destroy_requested_at=now, destroy_reason="done")
    actions.keep_for_debugging(box, 2, now=now)
    actions._send_destroy(box, now)  # the claimer's call, arriving late
    box.refresh_from_db()
    assert box.state == State.RUNNING and box.destroy_attempts == 0
    with get_provider() as provider:
        assert box.provider_instance_id in {i.instance_id for i in provider.list_instances()}
