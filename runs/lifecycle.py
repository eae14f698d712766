"""A run's state machine: the state is a pure function of the events that happened to it, in order.

An event that does not apply in the current state changes nothing, so replaying the events always gives the same
state (the diagram: docs/runs.md, "runs/lifecycle.py").
"""

# A run's states, defined here only (Run.State is made from them).
PENDING, PROVISIONING, INSTALLING, TRAINING = "pending", "provisioning", "installing", "training"
RECOVERING = "recovering"
FINISHED, FAILED, CANCELLED = "finished", "failed", "cancelled"
ACTIVE = (PENDING, PROVISIONING, INSTALLING, TRAINING, RECOVERING)
ENDED = (FINISHED, FAILED, CANCELLED)
STATES = ACTIVE + ENDED
ON_A_BOX = (PROVISIONING, INSTALLING, TRAINING)

_MOVES = {
    "rented": {PENDING: PROVISIONING, RECOVERING: PROVISIONING},
    "agent_started": {PROVISIONING: INSTALLING},
    # A probe or a step can arrive before the agent's first heartbeat is processed: they imply the earlier steps.
    "probe_ok": {PROVISIONING: TRAINING, INSTALLING: TRAINING},
    "step": {PROVISIONING: TRAINING, INSTALLING: TRAINING},
    "probe_failed": {PROVISIONING: RECOVERING, INSTALLING: RECOVERING},
    "host_lost": {state: RECOVERING for state in ON_A_BOX},
    "hung": {TRAINING: RECOVERING, INSTALLING: RECOVERING},
    "finished": {TRAINING: FINISHED},
    "trainer_failed": {state: FAILED for state in ACTIVE},
    "outputs_lost": {state: FAILED for state in ACTIVE},  # the trainer finished, its final adapters are not stored
    "restarts_exhausted": {state: FAILED for state in ACTIVE},
    "budget_exhausted": {state: FAILED for state in ACTIVE},
    "no_offer": {state: FAILED for state in ACTIVE},
    "cancelled": {state: CANCELLED for state in ACTIVE},
}


def transition(state: str, event: str) -> str:
    """The state after `event`; the same state if the event does not apply there."""
    if event not in _MOVES:
        raise ValueError(f"unknown run event {event!r}")
    return _MOVES[event].get(state, state)


def moves(state: str, event: str) -> bool:
    """Whether `event` changes a run in `state` (callers skip recording what would change nothing)."""
    return transition(state, event) != state


def replay(events) -> str:
    state = PENDING
    for event in events:
        state = transition(state, event)
    return state


# The box states (fleet's Instance.State) in which a run's box no longer trains it, though the run has not yet
# noticed: its next supervisor pass moves it to a new box.
BOX_GOING = ("stopping", "destroyed", "failed")


def box_going(state: str, box_state: str | None) -> bool:
    """Whether a run on a box is on one that is going (BOX_GOING): it no longer trains there."""
    return state in ON_A_BOX and box_state in BOX_GOING


def shown_state(state: str, restarts: int, box_state: str | None = None) -> str:
    """The state a person is shown: a run that lost a box is "recovering" from then until it trains again on the new
    one, though the product already rented that box (provisioning) and it is installing; a run whose box is going
    is recovering already."""
    if restarts > 0 and state in (PROVISIONING, INSTALLING):
        return RECOVERING
    if box_going(state, box_state):
        return RECOVERING
    return state


def is_restart(before: str, after: str) -> bool:
    """Leaving a box for a new one counts against the run's maximum restarts."""
    return before in ON_A_BOX and after == RECOVERING
