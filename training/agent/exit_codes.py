"""How the agent's process ends, one code per outcome; the numbers are the ones boxes have always exited with."""

from enum import IntEnum


class Exit(IntEnum):
    OK = 0  # the trainer finished every phase, or the dashboard said stop
    PROBE_FAILED = 1  # the install is not proven (Python's own code for an uncaught error, such as no FLEET_API_URL)
    # 2 is left out: Python's code for a bad command line
    TRAINER_FAILED = 3
    MACHINE_STOPPED = 4  # the box stopped its own machine: told to, its token refused, or the dead-man switch
    DATA_REFUSED = 5  # a phase's data did not match its sha256 or could not be downloaded: nothing was trained
    MODEL_REFUSED = 6  # the base model could not be fetched: nothing was trained
    CHECKPOINT_UNREACHABLE = 7  # a checkpoint could not be downloaded: it is kept for the box that replaces this one
