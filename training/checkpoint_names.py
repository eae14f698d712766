"""How checkpoints are named and marked complete: shared by the trainer and the agent, and free of torch (the agent
must be able to report a broken install, so it imports nothing heavy)."""

MARKER = "COMPLETE"  # written last into a checkpoint folder; a folder without it is never resumed from


def checkpoint_name(phase_index, step):
    return f"ckpt-p{phase_index:02d}-s{step:08d}"


def parse_name(name):
    """(phase_index, step) of a checkpoint name, or None for anything else in the store."""
    try:
        prefix, phase, step = name.split("-")
        if prefix == "ckpt" and phase[0] == "p" and step[0] == "s":
            return int(phase[1:]), int(step[1:])
    except ValueError:
        pass
    return None
