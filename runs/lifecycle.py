"""A run's state machine: the state is a pure function of the events that happened to it, in order.

An event that does not apply in the current state changes nothing, so replaying the events always gives the same
state (the diagram: docs/runs.md, "runs/lifecycle.py").
"""

# A run's states, defined here only (Run.State is made from them).
PENDING, PROVISIONING, INSTALLING, TRAINING = "pending", "provisioning", "installing", "training"
EVALUATING, RECOVERING = "evaluating", "recovering"  # evaluating: every training phase banked, the eval phase runs
FINISHED, FAILED, CANCELLED = "finished", "failed", "cancelled"
EVAL_FAILED = "eval_failed"  # trained (its adapters banked and servable), its evaluation failed
ACTIVE = (PENDING, PROVISIONING, INSTALLING, TRAINING, EVALUATING, RECOVERING)
ENDED = (FINISHED, FAILED, CANCELLED, EVAL_FAILED)
STATES = ACTIVE + ENDED
ON_A_BOX = (PROVISIONING, INSTALLING, TRAINING, EVALUATING)
# What ends a run as failed; once its training is banked each is recorded as "evaluation_failed" (runs.evaluations).
FAILURES = ("trainer_failed", "restarts_exhausted", "budget_exhausted", "no_offer")

_MOVES = {
    "rented": {PENDING: PROVISIONING, RECOVERING: PROVISIONING},
    "agent_started": {PROVISIONING: INSTALLING},
    # A probe or a step can arrive before the agent's first heartbeat is processed: they imply the earlier steps.
    "probe_ok": {PROVISIONING: TRAINING, INSTALLING: TRAINING},
    "step": {PROVISIONING: TRAINING, INSTALLING: TRAINING},
    "probe_failed": {PROVISIONING: RECOVERING, INSTALLING: RECOVERING},
    "host_lost": {state: RECOVERING for state in ON_A_BOX},
    "hung": {TRAINING: RECOVERING, INSTALLING: RECOVERING, EVALUATING: RECOVERING},
    "finished": {TRAINING: FINISHED},
    # The eval phase (docs/runs.md, "Evaluation"): a box that only evaluates comes from provisioning or installing.
    "evaluating": {PROVISIONING: EVALUATING, INSTALLING: EVALUATING, TRAINING: EVALUATING},
    "evaluated": {EVALUATING: FINISHED},
    "evaluation_failed": {state: EVAL_FAILED for state in ACTIVE},
    # Evaluate again: a finished run waits for a box that only evaluates its banked adapter on another file.
    "evaluate_again": {FINISHED: PENDING, EVAL_FAILED: PENDING},
    "trainer_failed": {state: FAILED for state in ACTIVE},
    "outputs_lost": {state: FAILED for state in ACTIVE},  # the trainer finished, its final adapters are not stored
    "restarts_exhausted": {state: FAILED for state in ACTIVE},
    "budget_exhausted": {state: FAILED for state in ACTIVE},
    "no_offer": {state: FAILED for state in ACTIVE},
    "cancelled": {state: CANCELLED for state in ACTIVE},
}


EVENTS = frozenset(_MOVES)  # the events that can move a run; its history holds others (logs, resumes) too


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
