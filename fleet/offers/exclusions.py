"""The Offers page's excluded offers, grouped by the first reason each is excluded for, biggest group first: a
catalogue of thousands excludes most offers for a handful of reasons, and a list of every one reads as noise."""

from dataclasses import dataclass

from fleet.ranking.filters import BITS, FILTERS, NO_THROUGHPUT, UNBOUNDED_COST
from fleet.ranking.price import rental_price

# A group's heading, by the filter (or the ranking's own test) that excluded its offers first.
HEADINGS = {BITS[f.name]: f.heading for f in FILTERS}
HEADINGS[NO_THROUGHPUT] = "no throughput figure for the GPU"
HEADINGS[UNBOUNDED_COST] = "the run would never finish (no bandwidth, or the host is lost first)"


@dataclass(frozen=True)
class ExcludedGroup:
    heading: str
    count: int
    rows: list  # (Exclusion, RentalPrice) for the first few
    key: str  # stable across requests: which group a person opened

    @property
    def hidden(self) -> int:
        return self.count - len(self.rows)


def grouped(excluded, shown_per_group: int, disk_gb: int) -> list[ExcludedGroup]:
    """The exclusions by first reason, biggest group first, each with its first `shown_per_group` offers."""
    members: dict[int, list] = {}
    for exclusion in excluded:
        members.setdefault(exclusion.mask & -exclusion.mask, []).append(exclusion)  # its first reason's bit
    groups = [ExcludedGroup(heading=HEADINGS.get(bit, "other"), count=len(items), key=f"reason-{bit.bit_length()}",
                            rows=[(x, _price(x.offer, disk_gb)) for x in items[:shown_per_group]])
              for bit, items in members.items()]
    return sorted(groups, key=lambda g: (-g.count, g.heading))


def _price(offer, disk_gb: int):
    """The rental price, or None for an offer whose prices are blank or not numbers (excluded for just that)."""
    try:
        price = rental_price(offer, disk_gb)
    except (TypeError, ArithmeticError, AttributeError):
        return None
    return price if price.usd_per_hour.is_finite() else None
