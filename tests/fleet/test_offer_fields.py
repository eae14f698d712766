"""The strict readers both marketplace clients build offers with, and what the ranking and the Offers page make of a
value that is no number (a NaN or an infinity in a record or a stored row)."""

import math
import re
from dataclasses import replace
from decimal import Decimal

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from fleet.models import Offer
from fleet.providers import fields
from fleet.ranking import OfferFilters, exclusion_reasons, rank_offers

from .offer_records import offer_record

ODD_NUMBERS = [math.nan, math.inf, -math.inf, "1.2", True, None, [1], {"value": 1}, fields.LongNumber(5000)]


@pytest.mark.parametrize("value", ODD_NUMBERS, ids=repr)
@pytest.mark.parametrize("reader", [fields.number, fields.whole, fields.money], ids=lambda r: r.__name__)
def test_it_refuses_what_is_no_finite_number_and_names_the_field(reader, value):
    with pytest.raises(fields.BadField, match=r"^dph_total is ") as caught:
        reader({"dph_total": value}, "dph_total")
    assert caught.value.field == "dph_total"


@pytest.mark.parametrize("reader, value, options, words", [
    (fields.whole, 1.5, {}, "is 1.5, not a whole number"),
    (fields.whole, 0, {"low": 1}, "is 0, not a whole number >= 1"),
    (fields.whole, 2**63, {"low": 1, "high": fields.MAX_ID},
     f"is {2**63}, not a whole number between 1 and {2**63 - 1}"),
    (fields.number, -0.5, {}, "is -0.5, not a number >= 0"),
    (fields.number, 1.5, {"high": 1.0}, "is 1.5, not a number between 0 and 1"),
    (fields.money, -0.01, {}, "is -0.01, not an amount >= 0"),
    (fields.flag, "false", {}, "is 'false' (a string), not true or false"),
    (fields.flag, 0, {}, "is 0, not true or false"),
    (fields.text, 42, {}, "is 42, not a string"),
    (fields.text, "   ", {"blank": False}, "is blank"),
    (fields.text, "H200\x00", {}, "holds the character '\\x00' at position 4"),
    (fields.text, "\ud800", {}, "holds the character '\\ud800' at position 0"),
])
def test_it_says_what_is_wrong_with_a_value(reader, value, options, words):
    with pytest.raises(fields.BadField) as caught:
        reader({"x": value}, "x", **options)
    assert str(caught.value) == f"x {words}"


def test_it_reads_what_a_listing_may_say():
    raw = {"n": 12.0, "p": 1.2, "z": 0, "f": False, "t": "  Sweden, SE ", "gone": None}
    assert fields.whole(raw, "n") == 12 and isinstance(fields.whole(raw, "n"), int)
    assert fields.money(raw, "p") == Decimal("1.2") and fields.money(raw, "z") == 0
    assert fields.flag(raw, "f") is False and fields.text(raw, "t") == "Sweden, SE"
    assert fields.number(raw, "gone", default=None) is None and fields.flag(raw, "missing", default=True) is True
    with pytest.raises(fields.BadField, match="^gone is null$"):
        fields.number(raw, "gone")
    with pytest.raises(fields.BadField, match="^missing is missing$"):
        fields.text(raw, "missing")


def test_it_quotes_a_huge_value_in_a_bounded_reason():
    with pytest.raises(fields.BadField) as caught:
        fields.number({"gpu_name": "x" * 1_000_000}, "gpu_name")
    assert len(str(caught.value)) < 120 and "(1000000 characters)" in str(caught.value)
    assert len(fields.label("y" * 10_000)) < 80


# -- what the ranking makes of a record that holds one ------------------------------------------------------------


@pytest.mark.parametrize("field, value, words", [
    ("total_usd_per_hour", Decimal("Infinity"), "price unknown"),
    ("total_usd_per_hour", Decimal("NaN"), "price unknown"),
    ("gpu_usd_per_hour", Decimal("NaN"), "GPU price unknown"),
    ("storage_usd_per_gb_month", Decimal("Infinity"), "storage price unknown"),
    ("inet_down_usd_per_gb", Decimal("-Infinity"), "download price unknown"),
    ("inet_up_usd_per_gb", Decimal("sNaN"), "upload price unknown"),
    ("gpu_ram_gb", math.nan, "VRAM unknown"),
    ("gpu_ram_gb", math.inf, "VRAM unknown"),
    ("disk_gb", math.inf, "disk unknown"),
    ("inet_down_mbps", math.inf, "downlink unknown"),
    ("reliability", math.inf, "reliability unknown"),
    ("cuda_max", -math.inf, "CUDA unknown"),
])
def test_it_excludes_a_value_that_is_no_number_as_unknown_and_ranks_the_rest(field, value, words):
    good, odd = offer_record("1"), replace(offer_record("2"), **{field: value})
    filters = OfferFilters(max_usd_per_hour=Decimal("2.00"))
    assert exclusion_reasons(odd, filters) == (words,)
    ranking = rank_offers([good, odd], filters=filters)
    assert [e.offer.offer_id for e in ranking.entries] == ["1"]
    assert [x.reasons for x in ranking.excluded] == [(words,)]
    assert ranking.to_dict()["ranked"][0]["why"]  # the page's words for the ranked offer are worked out


# -- the Offers page over rows stored before such values were refused --------------------------------------------


@pytest.mark.django_db
def test_it_shows_the_offers_page_over_stored_values_that_are_no_number(client, member):
    # Floats that are no number were stored before listings were read strictly; a numeric NaN takes a hand in SQL.
    now = timezone.now()
    odd = {
        "2": ({"total_usd_per_hour": Decimal("NaN")}, "price unknown"),
        "3": ({"storage_usd_per_gb_month": Decimal("NaN")}, "storage price unknown"),
        "4": ({"disk_gb": math.nan}, "disk unknown"),
        "5": ({"inet_up_mbps": math.inf}, "uplink unknown"),
        "6": ({"gpu_ram_gb": -math.inf}, "VRAM unknown"),
        "7": ({"reliability": math.nan}, "reliability unknown"),
        "8": ({"cuda_max": math.inf}, "CUDA unknown"),
    }
    for offer_id, changes in {"1": {}, **{k: v[0] for k, v in odd.items()}}.items():
        decimals = {k: v for k, v in changes.items() if isinstance(v, Decimal)}
        row = Offer.objects.create(**Offer.field_values(replace(offer_record(offer_id), **changes | dict.fromkeys(
            decimals, Decimal(0)))), first_seen_at=now, last_seen_at=now)
        for column in decimals:  # PostgreSQL's numeric holds a NaN that Django refuses to write
            with connection.cursor() as cursor:
                cursor.execute(f"UPDATE fleet_offer SET {column} = 'NaN' WHERE id = %s", [row.pk])
    client.force_login(member)
    response = client.get(reverse("offers"))
    assert response.status_code == 200
    body = response.content.decode()
    ranked = body.split('id="ranked"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'<tr data-offer="(\d+)"', ranked) == ["1"]
    excluded = body.split('id="excluded"', 1)[1]
    row = r'<tr data-offer="(\d+)" data-bid="0">.*?<td class="reasons">([^<]*)</td>\s*</tr>'
    reasons = dict(re.findall(row, excluded, re.S))
    assert reasons == {offer_id: words for offer_id, (_, words) in odd.items()}
