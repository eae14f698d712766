"""Supervisor passes that overlap or die midway, on PostgreSQL and the simulated marketplace: a run gets exactly one
box, none is left billing behind it, and no restart is spent on what was only the product's own crash."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from fleet import actions
from fleet.models import Instance
from fleet.offers.refresh import refresh_offers
from runs import events, launch, supervisor
from runs.models import Run

State = Instance.State


@pytest.fixture
def offers(frozen_market):
    refresh_offers()


def _rented_at_the_market(market) -> list[str]:
    return [i["label"] for i in market.state()["instances"]]


def _dies_once(function, when=lambda *args, **kwargs: True):
    """`function`, except that its first call that `when` picks raises, as a worker killed at that point would stop."""
    died = []

    def call(*args, **kwargs):
        if not died and when(*args, **kwargs):
            died.append(True)
            raise RuntimeError("worker killed")
        return function(*args, **kwargs)
    return call


@pytest.mark.django_db(transaction=True)
def test_it_rents_one_box_when_two_passes_run_at_once(launched, frozen_market, offers, monkeypatch):
    run = launched()
    now = timezone.now()
    first_in_rent, second_done = threading.Event(), threading.Event()
    real_rent, calls = actions.rent, []

    def slow_rent(*args, **kwargs):  # the first pass is still waiting on the provider while the second one runs
        calls.append(args)
        if len(calls) == 1:
            first_in_rent.set()
            second_done.wait(10)
        return real_rent(*args, **kwargs)

    monkeypatch.setattr(actions, "rent", slow_rent)

    def first_pass():
        try:
            supervisor.supervise(now=now)
        finally:
            connection.close()

    first = threading.Thread(target=first_pass)
    first.start()
    assert first_in_rent.wait(10)
    try:
        supervisor.supervise(now=now)
    finally:
        second_done.set()
        first.join(30)
    run.refresh_from_db()
    assert len(_rented_at_the_market(frozen_market)) == 1
    assert Instance.objects.count() == 1 and run.attempts.count() == 1
    assert run.state == "provisioning" and run.current_instance.label == _rented_at_the_market(frozen_market)[0]


@pytest.mark.django_db
def test_it_rents_the_box_a_dead_pass_asked_for_instead_of_another(launched, frozen_market, offers, monkeypatch):
    run = launched()
    real_rent = actions.rent
    monkeypatch.setattr(actions, "rent", _dies_once(real_rent))  # the box is asked for, the provider never called
    supervisor.supervise(now=timezone.now())
    monkeypatch.setattr(actions, "rent", real_rent)
    supervisor.supervise(now=timezone.now())
    run.refresh_from_db()
    box = Instance.objects.get()  # no second row, and no requested row left behind
    assert box.state == State.PROVISIONING and run.current_instance == box
    assert run.state == "provisioning" and run.attempts.count() == 1 and run.restarts == 0
    assert _rented_at_the_market(frozen_market) == [box.label]


@pytest.mark.django_db
def test_it_keeps_the_box_a_pass_rented_before_it_died(launched, frozen_market, offers, monkeypatch):
    run = launched()
    real_record = events.record
    # The provider rented the box; the pass died before the run was moved onto it.
    monkeypatch.setattr(events, "record", _dies_once(real_record, lambda run, kind, *a, **k: kind == "rented"))
    supervisor.supervise(now=timezone.now())
    monkeypatch.setattr(events, "record", real_record)
    actions.sync(now=timezone.now())
    supervisor.supervise(now=timezone.now())
    run.refresh_from_db()
    assert len(_rented_at_the_market(frozen_market)) == 1  # not a second box beside an orphaned first
    box = Instance.objects.get()
    assert box.is_billing and run.current_instance == box and box.label == _rented_at_the_market(frozen_market)[0]
    assert run.state == "provisioning" and run.attempts.count() == 1 and run.restarts == 0
    assert run.events.filter(kind="rented").count() == 1


@pytest.mark.django_db
def test_it_spends_no_restart_on_a_rent_whose_outcome_is_unknown(launched, frozen_market, offers, settings):
    run = launched()
    now = timezone.now()
    frozen_market.inject_faults(http_5xx=1, path_contains="/asks/")  # the rent call's answer is lost
    supervisor.supervise(now=now)
    run.refresh_from_db()
    first = run.current_instance
    assert first.state == State.REQUESTED and run.state == "pending"  # not "provisioning" on a box that is not there
    supervisor.supervise(now=now + timedelta(seconds=30))
    run.refresh_from_db()
    assert run.current_instance == first and run.restarts == 0  # waited for its outcome, rented nothing else
    later = timezone.now() + timedelta(seconds=settings.RENT_OUTCOME_GRACE_S)  # from the lost answer on
    actions.sync(now=later)  # never listed: it never happened
    supervisor.supervise(now=later)  # drops it: this host is out
    supervisor.supervise(now=later)  # and rents on another
    run.refresh_from_db()
    first.refresh_from_db()
    assert first.state == State.FAILED and run.current_instance.state == State.PROVISIONING
    assert run.state == "provisioning" and run.restarts == 0
    assert _rented_at_the_market(frozen_market) == [run.current_instance.label]
    assert run.attempts.get(instance=first).ended_at is not None


@pytest.mark.parametrize("state, attempted, step", [
    (State.REQUESTED, False, supervisor.RENT),  # its renter died before calling the provider
    (State.REQUESTED, True, supervisor.WAIT),  # in flight, or its outcome unknown
    (State.PROVISIONING, True, supervisor.ON_IT),
    (State.RUNNING, True, supervisor.ON_IT),
    (State.FAILED, True, supervisor.DROP),  # refused, or never listed
    (State.STOPPING, True, supervisor.DROP),  # cancelled while its rent was in flight
])
def test_it_decides_what_to_do_with_the_box_a_run_asked_for(state, attempted, step):
    box = Instance(state=state, rent_attempted_at=timezone.now() if attempted else None)
    assert supervisor.box_step(box) == step
    assert supervisor.box_step(None) == supervisor.ASK


@pytest.mark.django_db
def test_a_cancel_during_a_pass_rents_nothing(launched, frozen_market, offers, monkeypatch):
    run = launched()
    real_request = actions.request_best

    def cancelled_meanwhile(*args, **kwargs):  # the user cancels after the pass read the run as pending
        launch.cancel(Run.objects.get(pk=run.pk))
        return real_request(*args, **kwargs)

    monkeypatch.setattr(actions, "request_best", cancelled_meanwhile)
    supervisor.supervise(now=timezone.now())
    run.refresh_from_db()
    assert run.state == "cancelled" and run.current_instance is None and run.attempts.count() == 0
    assert not Instance.objects.exists() and _rented_at_the_market(frozen_market) == []


@pytest.mark.django_db
def test_a_box_asked_for_before_a_cancel_is_never_rented(launched, frozen_market, offers, monkeypatch):
    run = launched()
    monkeypatch.setattr(actions, "rent", _dies_once(actions.rent))  # asked for; the pass died before the call
    supervisor.supervise(now=timezone.now())
    monkeypatch.undo()
    stale = Run.objects.get(pk=run.pk)  # a pass that read the run before the cancel
    launch.cancel(Run.objects.get(pk=run.pk))
    supervisor._rent_box(stale, timezone.now())
    box = Instance.objects.get()
    assert box.state == State.FAILED and box.provider_instance_id is None
    assert _rented_at_the_market(frozen_market) == []
