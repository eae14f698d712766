"""How checkpoints are named and marked complete: shared by the trainer and the agent, and free of torch (the agent
must be able to report a broken install, so it imports nothing heavy)."""

from pathlib import Path, PurePosixPath

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


class UnsafePath(ValueError):
    """A name from a checkpoint store (which a rented box can write) that would land outside its folder."""


def inside(root, relative):
    """`root / relative` for a file name read from a checkpoint store, refused when it is empty, absolute, has a `..`,
    is not in plain form, or resolves (through links too) outside `root`: a box's host has root, and a store key is
    whatever it wrote."""
    text = str(relative)
    parts = PurePosixPath(text).parts
    # Only plain names: no backslash or drive, no NUL, and nothing a path would normalise away ("a//b", "./a").
    if not text or "\\" in text or "\x00" in text or "/".join(parts) != text or \
            any(part in (".", "..") for part in parts) or ":" in parts[0]:
        raise UnsafePath(f"refused the checkpoint file name {text[:200]!r}")
    root = Path(root).resolve()
    path = (root / Path(*parts)).resolve()
    if not path.is_relative_to(root) or path == root:
        raise UnsafePath(f"refused the checkpoint file name {text[:200]!r}: it leaves {root}")
    return path
