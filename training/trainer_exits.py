"""How the trainer's process ends when not with 0, and the words its last line starts with when it ends on its own
error: the agent reports from that line on, not the libraries' warnings printed before it (training/agent/watch.py)."""

RECIPE_ERROR_EXIT, RECIPE_ERROR_MARK = 2, "recipe error: "
GUARD_EXIT, GUARD_MARK = 3, "ABORTED by a guard: "
STOPPED_EXIT = 75  # EX_TEMPFAIL: stopped on request with a checkpoint saved; started again, it resumes
OWN_MARKS = {RECIPE_ERROR_EXIT: RECIPE_ERROR_MARK, GUARD_EXIT: GUARD_MARK}


def own_words(returncode: int, tail: str) -> str:
    """What a trainer's log tail says of its end: from its own last error line on where it ended on one (a recipe
    error, a guard), else the whole tail (a crash's traceback)."""
    mark = OWN_MARKS.get(returncode)
    start = tail.rfind(mark) if mark else -1
    return tail[start:].strip() if start >= 0 else tail
