"""Rent requests that no worker took up: a row written, its rent task lost to a broker outage or a worker that died
before calling the provider. Which to rent now, which to give up on, and why. Pure: plain values in, a verdict out."""

from datetime import timedelta

WAIT = "wait"
RENT = "rent"
GIVE_UP = "give up"

# What a person rents needs nothing the row does not hold. A run's box and a serving replica need their box's
# environment (an agent token, the model to serve), which only their owners have: the run supervisor and the
# inference fleet resume those rows themselves, and the sweep gives up on one only when its owner is plainly gone.
SELF_CONTAINED_PURPOSES = frozenset({"manual"})


def verdict(*, purpose: str, waited: timedelta, grace: timedelta, max_wait: timedelta) -> tuple[str, str]:
    """(WAIT, RENT or GIVE_UP, the reason in a user's words) for a requested row whose rent was never attempted."""
    minutes = int(waited.total_seconds() // 60)
    if waited < grace:
        return WAIT, ""
    if waited > max_wait:
        if purpose in SELF_CONTAINED_PURPOSES:
            return GIVE_UP, (f"Not rented: the request waited {minutes} min for a worker (was the task queue down?); "
                             "the offer and its price may have changed since, so nothing was rented. Ask again.")
        return GIVE_UP, (f"Not rented: nothing resumed this {purpose} rent in {minutes} min (the work it was for "
                         "has ended or moved on).")
    if purpose in SELF_CONTAINED_PURPOSES:
        seconds = int(waited.total_seconds())
        return RENT, f"Its rent task was lost (was the task queue down?): renting it {seconds} s after the ask."
    return WAIT, ""
