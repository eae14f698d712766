"""The run state machine, a pure function of its events."""

import pytest

from runs.lifecycle import is_restart, replay, transition


def test_it_walks_a_run_from_launch_to_finished():
    assert replay(["rented", "agent_started", "probe_ok", "step", "finished"]) == "finished"


def test_it_recovers_on_a_new_box_after_a_lost_host():
    assert replay(["rented", "agent_started", "probe_ok", "host_lost"]) == "recovering"
    assert replay(["rented", "agent_started", "probe_ok", "host_lost", "rented"]) == "provisioning"
    assert is_restart("training", "recovering") and not is_restart("pending", "provisioning")


def test_it_moves_on_when_the_install_probe_fails():
    assert replay(["rented", "agent_started", "probe_failed"]) == "recovering"


def test_it_ignores_events_that_do_not_apply():
    assert replay(["rented", "agent_started", "probe_ok", "trainer_failed", "step", "finished"]) == "failed"
    assert transition("finished", "host_lost") == "finished"
    assert transition("pending", "finished") == "pending"  # a box that was never rented cannot finish


@pytest.mark.parametrize("end", ["restarts_exhausted", "budget_exhausted", "trainer_failed", "no_offer"])
def test_it_fails_from_any_active_state(end):
    for before in ["pending", "provisioning", "installing", "training", "recovering"]:
        assert transition(before, end) == "failed"


def test_it_cancels_but_never_revives():
    assert transition("training", "cancelled") == "cancelled"
    assert transition("cancelled", "rented") == "cancelled"


def test_it_rejects_an_unknown_event():
    with pytest.raises(ValueError, match="unknown run event"):
        transition("pending", "exploded")
