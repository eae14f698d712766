"""What a run is doing, in the words its pages show: the reason a box or the supervisor recorded is kept, but a
machine's token (the install probe's sentinel) or a phase's number alone is not what a person reads."""

from dataclasses import dataclass

from runs import lifecycle
from training.probe import SENTINEL as PROBE_SENTINEL

PROBE_PASSED = "The install probe passed: every module the trainer needs imports, and the GPU answers."
WAITING = {
    lifecycle.PENDING: "Waiting for a box: the supervisor ranks the offers and rents the best.",
    lifecycle.PROVISIONING: "The box is rented and boots.",
    lifecycle.INSTALLING: "The box installs the trainer and runs the install probe.",
    lifecycle.RECOVERING: "Recovering: a new box is rented and training resumes from the newest complete checkpoint.",
}


# A recovering run's step, by the state of the box it is on (None: it has none yet).
RECOVERY_STEP = {None: "renting a new box", "requested": "renting a new box", "provisioning": "new box provisioning",
                 "running": "new box booting"}


def state_words(state: str, restarts: int, box_state: str | None) -> str:
    """The run's state in the few words its page and the runs list show, as its box really is: never "training" on
    a box that is stopping, and a recovery by its step (`box_state` is the current box's, None without one)."""
    if lifecycle.box_going(state, box_state):
        return f"box {box_state}"
    if state == lifecycle.RECOVERING:
        return "recovering: " + RECOVERY_STEP.get(box_state, f"old box {box_state}")
    if restarts > 0 and state == lifecycle.PROVISIONING:
        return "recovering: " + RECOVERY_STEP.get(box_state, "new box provisioning")
    if restarts > 0 and state == lifecycle.INSTALLING:
        return "recovering: new box installing"
    return STATE_WORDS.get(state, state)


STATE_WORDS = {lifecycle.EVAL_FAILED: "trained, evaluation failed"}


def reason_text(message: str) -> str:
    """A recorded reason as a person reads it."""
    return PROBE_PASSED if message.strip() == PROBE_SENTINEL else message


def event_kind_text(kind: str) -> str:
    return kind.replace("_", " ")


@dataclass(frozen=True)
class RunStatus:
    now: str  # what the run is doing, in a sentence
    progress: str  # where it is: the phase by name, the step of the phase's steps


def describe(run, phases: list) -> RunStatus:
    """`phases` are the run's Phase rows, in order."""
    phase = next((p for p in phases if p.index == run.current_phase), None)
    if phase is None:
        progress = f"step {run.current_step:,}" if run.current_step else "no steps yet"
    else:
        progress = (f"{phase.name} ({phase.kind}, phase {phase.index + 1} of {len(phases)}), "
                    f"step {run.current_step:,} of {phase.steps:,}")
    reason = reason_text(run.state_reason)
    box = run.current_instance if run.current_instance_id else None
    if box is not None and lifecycle.box_going(run.state, box.state):
        now = (f"Box {box.label} is {box.state}: the supervisor's next pass moves the run to a new box, which "
               "resumes from the newest complete checkpoint.")
    elif run.state == lifecycle.TRAINING:
        now = f"Training {phase.name}." if phase is not None else "Training."
    elif run.state == lifecycle.EVALUATING:
        now = "Evaluating: the banked adapter and the base model answer the eval file's prompts, each answer scored."
    elif run.state == lifecycle.EVAL_FAILED:
        now = f"Trained, evaluation failed: {reason} The trained adapters are kept: download or serve them."
    elif run.state in WAITING and (not reason or reason == PROBE_PASSED):
        now = WAITING[run.state]
    elif run.state == lifecycle.RECOVERING:
        now = f"Recovering: {reason}"
    else:
        now = reason or run.get_state_display()
    return RunStatus(now, progress)
