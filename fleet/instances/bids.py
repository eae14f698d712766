"""What an interruptible box does when it is outbid: raise its bid within the user's price cap, or move its work to
another box (a pure decision; fleet.actions carries it out and records it as an event)."""

from dataclasses import dataclass
from decimal import ROUND_UP, Decimal

MARGIN = Decimal("0.05")  # over the bid to beat, so the next small counter-bid does not take the machine at once
MIN_STEP = Decimal("0.01")  # $/h
_TENTH_CENT = Decimal("0.001")


@dataclass(frozen=True)
class Rebid:
    bid_usd_per_hour: Decimal | None  # the machine's new bid; None: the work moves
    message: str  # what the box's events say


def answer_outbid(*, bid: Decimal | None, bid_to_beat: Decimal | None, cap: Decimal | None,
                  disk_usd_per_hour: Decimal) -> Rebid:
    """`cap` is the user's price cap on the rental ($/h, machine and disk, as the offer filters set it); the bid is
    for the machine alone, so it may rise to `cap - disk_usd_per_hour`. No cap, or no bid to beat: the work moves."""
    was = f"${bid:.3f}/h" if bid is not None else "its bid"
    if bid_to_beat is None:
        return Rebid(None, f"Outbid at {was}, and the provider does not say the bid to beat: the work moves to "
                           "another box.")
    if cap is None:
        return Rebid(None, f"Outbid at {was} (the bid to beat is ${bid_to_beat:.3f}/h); no price cap allows a "
                           "higher bid: the work moves to another box.")
    ceiling = cap - disk_usd_per_hour
    wanted = max(bid_to_beat * (1 + MARGIN), bid_to_beat + MIN_STEP).quantize(_TENTH_CENT, rounding=ROUND_UP)
    new = min(wanted, ceiling.quantize(_TENTH_CENT))
    if new <= bid_to_beat:
        return Rebid(None, f"Outbid at {was}: the bid to beat, ${bid_to_beat:.3f}/h, leaves no room under the cap "
                           f"${cap:.3f}/h (${ceiling:.3f}/h for the machine beside its disk): the work moves to "
                           "another box.")
    return Rebid(new, f"Outbid at {was}: bid raised to ${new:.3f}/h (the bid to beat is ${bid_to_beat:.3f}/h, the cap "
                      f"${cap:.3f}/h with the disk); it resumes on the same machine.")
