"""An excluded offer's price cap reason quotes the price its row shows: the hourly price of the rental (the machine
and the disk the ranking rents), to a tenth of a cent, not the listing's own total, which counts a token disk."""

from decimal import Decimal

from fleet.offers import exclusions
from fleet.ranking import OfferFilters, Workload, rank_offers
from fleet.ranking.price import per_hour, rental_price
from tests.fleet.test_ranking_filters import make_offer


def _excluded_row(offer, filters, recipe):
    ranking = rank_offers([offer], recipe, filters)
    [group] = exclusions.grouped(ranking.excluded, 5, int(recipe.rent_disk_gb))
    [(exclusion, price)] = group.rows
    return group.heading, f"${price.usd_per_hour:.3f}", exclusion.reasons


def test_the_reason_quotes_the_price_the_row_shows():
    # $2.00/h machine, $0.39168 per GB-month: $2.136/h with 250 GB; the listing's own total is $2.0586/h
    offer = make_offer(gpu_usd_per_hour=Decimal("2.00"), storage_usd_per_gb_month=Decimal("0.39168"),
                       total_usd_per_hour=Decimal("2.0586"))
    heading, shown, reasons = _excluded_row(offer, OfferFilters(max_usd_per_hour="2.10"), Workload())
    assert heading == "above the price cap" and shown == "$2.136"
    assert reasons == (f"{shown}/h > cap $2.10/h",)


def test_an_offer_whose_rental_is_under_the_cap_passes_it():
    offer = make_offer(gpu_usd_per_hour=Decimal("1.20"), storage_usd_per_gb_month=Decimal("0.10"),
                       total_usd_per_hour=Decimal("1.45"))
    assert per_hour(rental_price(offer, 250).usd_per_hour) == "$1.235/h"
    assert rank_offers([offer], Workload(), OfferFilters(max_usd_per_hour="1.30")).excluded == ()
