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
    if run.state == lifecycle.TRAINING:
        now = f"Training {phase.name}." if phase is not None else "Training."
    elif run.state in WAITING and (not reason or reason == PROBE_PASSED):
        now = WAITING[run.state]
    elif run.state == lifecycle.RECOVERING:
        now = f"Recovering: {reason}"
    else:
        now = reason or run.get_state_display()
    return RunStatus(now, progress)
