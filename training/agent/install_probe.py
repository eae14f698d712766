"""The import probe, run in the Python the trainer will use: the install counts as proven only with its sentinel."""

import os
import subprocess

from training.probe import SENTINEL

TIMEOUT_S = 900


def probe(python: str) -> tuple[bool, str]:
    """Runs the import probe; it passed only if it exited 0 and printed the sentinel (exit codes alone lie). With the
    run's model type (FLEET_MODEL_TYPE) it also checks the kernels that family needs (FLA for Gated DeltaNet)."""
    family = os.environ.get("FLEET_MODEL_TYPE", "")
    command = [python, "-m", "training.probe", *(["--family", family] if family else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, "the import probe timed out"
    output = (done.stdout + done.stderr)[-3000:]
    return done.returncode == 0 and SENTINEL in done.stdout, output
