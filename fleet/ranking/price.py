"""What a rental costs by the hour (machine or bid, plus the rented disk): the one figure the Offers page, the rent
confirmation and the instance show. Pure (docs/fleet.md, "fleet/ranking/price.py")."""

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from fleet.ranking.cost import HOURS_PER_MONTH

_HOURS_PER_MONTH = Decimal(HOURS_PER_MONTH)
_PLACES = Decimal("0.000001")  # what an instance's recorded price keeps
_SHOWN = Decimal("0.001")


@dataclass(frozen=True, slots=True)
class RentalPrice:
    gpu_usd_per_hour: Decimal  # the machine, or the bid for an interruptible rental
    disk_gb: int
    disk_usd_per_hour: Decimal  # the rented disk
    usd_per_hour: Decimal  # their sum, to $0.000001: the price of the rental
    is_bid: bool

    @property
    def parts(self) -> str:
        """The figure's parts in words, for a hover or a confirmation."""
        machine = "bid" if self.is_bid else "GPU"
        return (f"{machine} {per_hour(self.gpu_usd_per_hour)} + {self.disk_gb} GB disk "
                f"{per_hour(self.disk_usd_per_hour)} = {per_hour(self.usd_per_hour)}")


def per_hour(amount: Decimal) -> str:
    """$1.146/h: to a tenth of a cent, halves rounded up as the pages' floatformat rounds them, so the same price
    reads the same in a message and on a page."""
    return f"${amount.quantize(_SHOWN, rounding=ROUND_HALF_UP)}/h"


def rental_usd_per_hour(offer, disk_gb) -> Decimal:
    """The rental's hourly price alone (rental_price's usd_per_hour): what the price cap compares."""
    return rental_price(offer, disk_gb).usd_per_hour


def bid_usd_per_hour(offer) -> Decimal | None:
    """What an interruptible rental bids: the offer's price, or its minimum bid where that is higher; None for an
    on-demand offer."""
    return _bid(offer) if offer.is_bid else None


def _bid(offer) -> Decimal:
    return max(offer.min_bid_usd_per_hour or Decimal(0), offer.gpu_usd_per_hour)


def rental_price(offer, disk_gb) -> RentalPrice:
    """The hourly price of renting `offer` (an Offer row or an OfferRecord) with `disk_gb` of disk."""
    gpu = _bid(offer) if offer.is_bid else (offer.gpu_usd_per_hour or offer.total_usd_per_hour)
    disk = offer.storage_usd_per_gb_month * Decimal(disk_gb) / _HOURS_PER_MONTH
    total = (gpu + disk).quantize(_PLACES, rounding=ROUND_HALF_UP)
    return RentalPrice(gpu_usd_per_hour=gpu, disk_gb=int(disk_gb), disk_usd_per_hour=disk, usd_per_hour=total,
                       is_bid=bool(offer.is_bid))
