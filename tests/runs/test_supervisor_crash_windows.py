"""A supervisor pass killed (a worker SIGKILLed, a hard time limit) between the moment a run lets go of its box and
the destroy of that box, on PostgreSQL and the simulated marketplace: the next pass still destroys it, so no box that
no run points at is left billing until a reaper rule happens to catch it."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from fleet import actions
from fleet.models import Alert, Instance
from fleet.offers.refresh import refresh_offers
from runs import launch, supervisor

State = Instance.State


@pytest.fixture
def offers(frozen_market):
    refresh_offers()


def _billing_at_the_market(market) -> list[str]:  # every machine not destroyed bills
    return [i["label"] for i in market.state()["instances"] if i["state"] != "destroyed"]


def _dies_once(function):
    """`function`, except that its first call raises, as a worker killed just before it would have run."""
    died = []

    def call(*args, **kwargs):
        if not died:
            died.append(True)
            raise RuntimeError("worker killed")
        return function(*args, **kwargs)
    return call


@pytest.mark.django_db
def test_a_cancelled_runs_box_is_destroyed_when_the_wind_up_died_before_its_destroy(launched, frozen_market, offers,
                                                                                    monkeypatch):
    run = launched()
    supervisor.supervise(now=timezone.now())
    run.refresh_from_db()
    box = run.current_instance
    assert run.state == "provisioning" and _billing_at_the_market(frozen_market) == [box.label]
    launch.cancel(run)
    monkeypatch.setattr(actions, "destroy", _dies_once(actions.destroy))
    supervisor.supervise(now=timezone.now())  # the wind-up's pass dies where it would destroy the box
    monkeypatch.undo()
    supervisor.supervise(now=timezone.now())
    run.refresh_from_db()
    box.refresh_from_db()
    assert box.state in (State.STOPPING, State.DESTROYED) and box.destroy_attempts == 1
    assert _billing_at_the_market(frozen_market) == []
    assert run.wound_up_at is not None and run.current_instance is None
    assert Alert.objects.filter(kind=Alert.Kind.RUN_CANCELLED).count() == 1  # wound up once all the same
    supervisor.supervise(now=timezone.now())
    box.refresh_from_db()
    assert box.destroy_attempts == 1 and Alert.objects.filter(kind=Alert.Kind.RUN_CANCELLED).count() == 1


@pytest.mark.django_db
def test_a_lost_hosts_box_is_destroyed_when_the_pass_that_left_it_died_before_its_destroy(launched, frozen_market,
                                                                                          offers, monkeypatch):
    run = launched()
    now = timezone.now()
    supervisor.supervise(now=now)
    run.refresh_from_db()
    lost = run.current_instance
    later = now + timedelta(seconds=settings.RUN_INSTALL_TIMEOUT_S + 1)  # no agent ever reported: host lost
    monkeypatch.setattr(actions, "destroy", _dies_once(actions.destroy))
    supervisor.supervise(now=later)  # the pass that leaves the box dies where it would destroy it
    monkeypatch.undo()
    run.refresh_from_db()
    assert run.state == "recovering"
    supervisor.supervise(now=later)  # abandons the box again, and rents another
    run.refresh_from_db()
    lost.refresh_from_db()
    new = run.current_instance
    assert lost.state in (State.STOPPING, State.DESTROYED) and lost.destroy_attempts == 1
    assert new is not None and new.pk != lost.pk and new.state == State.PROVISIONING
    assert _billing_at_the_market(frozen_market) == [new.label]  # not the lost one beside it
    assert lost.machine_id in run.bad_machines and run.restarts == 1
    assert run.attempts.get(instance=lost).ended_at is not None
