"""The float twins of each offer's prices: the refresh stores them with the Decimals, the migration fills them in
for rows stored before, and a ranking on them is the ranking worked out offer by offer from the Decimals."""

import importlib
import math
from dataclasses import replace
from decimal import Decimal

import pytest
from django.apps import apps
from django.utils import timezone

from fleet.models import Offer
from fleet.offers.ranked import rank_stored_offers
from fleet.offers.refresh import store_offers
from fleet.ranking import OfferFilters, OfferPrices, Workload, offer_prices, rank_offers

from .offer_records import offer_record
from .reference_ranking import reference_ranking
from .test_ranking_fast_path import SETTINGS, catalogue

NO_PRICES = OfferPrices(math.nan, math.nan, math.nan, math.nan)


def stored_prices(offers) -> list[OfferPrices]:
    # A junk record whose prices no column could hold has none stored; the filters exclude it before scoring.
    prices = []
    for o in offers:
        try:
            prices.append(offer_prices(o))
        except (TypeError, ValueError):
            prices.append(NO_PRICES)
    return prices


@pytest.mark.parametrize("junk_share", [0.0, 0.3], ids=["clean", "junk"])
@pytest.mark.parametrize("recipe, filters", SETTINGS)
def test_it_ranks_on_stored_prices_exactly_as_the_ranking_worked_out_offer_by_offer(recipe, filters, junk_share):
    offers = catalogue(1500, seed=5, junk_share=junk_share)
    ranking = rank_offers(offers, recipe, filters, prices=stored_prices(offers))
    expected, expected_excluded = reference_ranking(offers, recipe, filters)
    assert len(expected) >= 5
    assert [(e.offer, e.rank) for e in ranking.entries] == [(row[0], rank) for rank, row in enumerate(expected, 1)]
    for entry, (_offer, score, tokens_per_usd, t, p, cost) in zip(ranking.entries, expected, strict=True):
        assert (entry.steps_per_usd, entry.tokens_per_usd) == (score, tokens_per_usd)  # the very same floats
        assert (entry.throughput, entry.projection, entry.cost) == (t, p, cost)
    assert [(x.offer, x.reasons) for x in ranking.excluded] == expected_excluded


def test_it_scores_on_the_prices_it_is_given():
    cheap, dear = offer_record("cheap"), offer_record("dear", gpu_usd_per_hour=Decimal("2.30"))
    uncapped = OfferFilters(max_usd_per_hour=None)  # the dear one is over the default cap
    assert [e.offer.offer_id for e in rank_offers([dear, cheap], filters=uncapped).entries] == ["cheap", "dear"]
    swapped = [offer_prices(cheap), offer_prices(dear)]
    assert [e.offer.offer_id for e in rank_offers([dear, cheap], filters=uncapped, prices=swapped).entries] == [
        "dear", "cheap"]


def test_it_refuses_prices_that_do_not_match_the_offers():
    with pytest.raises(ValueError, match="1 prices for 2 offers"):
        rank_offers([offer_record("1"), offer_record("2")], prices=[offer_prices(offer_record("1"))])


@pytest.mark.django_db
def test_it_stores_the_float_twins_of_the_prices_and_ranks_the_stored_offers_as_their_records():
    records = [
        offer_record("1"),
        offer_record("2", gpu_usd_per_hour=Decimal("0"), total_usd_per_hour=Decimal("1.337"), reliability=0.95),
        offer_record("3", inet_down_usd_per_gb=Decimal("0.003"), inet_up_usd_per_gb=Decimal("0.000001"),
                     storage_usd_per_gb_month=Decimal("0.123457")),
    ]
    store_offers("vast", records)
    by_id = {row.offer_id: row for row in Offer.objects.all()}
    assert by_id["2"].prices() == (1.337, 0.15, 0.01, 0.02)  # no GPU price: the total is what is billed
    assert {i: row.prices() for i, row in by_id.items()} == {r.offer_id: offer_prices(r) for r in records}

    store_offers("vast", [replace(records[0], gpu_usd_per_hour=Decimal("0.99"))])  # the next refresh's price
    assert Offer.objects.get(offer_id="1").usd_per_hour_float == 0.99

    Offer.objects.update(available=True)  # the others were retired by that refresh: list them again
    recipe, filters = Workload(), OfferFilters(max_usd_per_hour=None)
    stored = rank_stored_offers(recipe, filters)
    expected = rank_offers([row.to_record() for row in Offer.objects.filter(available=True).order_by("id")],
                           recipe, filters)
    assert len(stored.entries) == 3
    assert stored.to_dict() == expected.to_dict()


@pytest.mark.django_db
def test_it_keeps_the_twins_in_step_when_a_row_is_saved_on_its_own():
    row = Offer.objects.create(**Offer.field_values(offer_record("1")), first_seen_at=timezone.now(),
                               last_seen_at=timezone.now())
    row.gpu_usd_per_hour = Decimal("3.5")
    row.inet_up_usd_per_gb = Decimal("0.07")
    row.save(update_fields=["gpu_usd_per_hour", "inet_up_usd_per_gb"])
    assert Offer.objects.get(pk=row.pk).prices() == (3.5, 0.15, 0.01, 0.07)


@pytest.mark.django_db
def test_the_migration_works_the_twins_out_for_offers_stored_before_them():
    store_offers("vast", [offer_record("1"), offer_record("2", gpu_usd_per_hour=Decimal("0"),
                                                          total_usd_per_hour=Decimal("1.5"))])
    Offer.objects.update(usd_per_hour_float=0.0, storage_usd_per_gb_month_float=0.0, inet_down_usd_per_gb_float=0.0,
                         inet_up_usd_per_gb_float=0.0)
    migration = importlib.import_module("fleet.migrations.0013_offer_price_floats")
    migration.fill_price_floats(apps, None)
    assert {row.offer_id: row.prices() for row in Offer.objects.all()} == {
        "1": (1.15, 0.15, 0.01, 0.02), "2": (1.5, 0.15, 0.01, 0.02)}
