"""One offer has one price by the hour wherever it is shown: the Offers table, the rent button and confirmation, the
instance's recorded price and its page. It is the machine (or the bid) and the disk actually rented, worked out by
fleet.ranking.price; its parts show on hover. A box that puts the account over the spend cap is confirmed twice."""

import re
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet import enqueue
from fleet.models import Instance, Offer
from fleet.offers.refresh import refresh_offers
from fleet.ranking.price import per_hour, rental_price
from tests.fleet.offer_records import offer_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(monkeypatch):
    asked = []
    monkeypatch.setattr(enqueue, "rent_instance", asked.append)  # the rent itself is another test's
    return asked


@pytest.fixture
def listed(market):
    refresh_offers()


def _first_ranked(body: str):
    row = body.split('id="ranked"', 1)[1].split("</tr>", 2)[1]
    offer_id, bid = re.search(r'<tr data-offer="(\d+)" data-bid="(\d)"', row).groups()
    price = re.search(r'<span class="price" data-usd-per-hour="([\d.]+)" tabindex="0" title="([^"]*)">\$([\d.]+)'
                      r'</span>', row)
    return Offer.objects.get(offer_id=offer_id, is_bid=bid == "1"), price.group(3), price.group(2)


def _rent_page(client, offer):
    return client.get(reverse("rent_confirm"), {"provider": offer.provider, "offer": offer.offer_id,
                                                "bid": "1" if offer.is_bid else "0"}).content.decode()


def _form(page: str, offer, **changes) -> dict:
    key = re.search(r'name="idempotency_key" value="([0-9a-f]+)"', page).group(1)
    quoted = re.search(r'name="quoted_disk_gb" value="(\d+)"', page).group(1)
    return {"provider": offer.provider, "offer": offer.offer_id, "bid": "1" if offer.is_bid else "0",
            "idempotency_key": key, "image": "ghcr.io/example/worker:cuda12.8", "disk_gb": "250",
            "quoted_disk_gb": quoted, **changes}


def test_it_shows_one_price_from_the_offers_table_to_the_instance(client, staff, listed, queued):
    client.force_login(staff)
    offer, shown, hover = _first_ranked(client.get(reverse("offers"), {"max_usd_per_hour": "6"}).content.decode())
    price = rental_price(offer, 250)
    assert f"${shown}/h" == per_hour(price.usd_per_hour)
    assert offer.total_usd_per_hour != price.usd_per_hour  # the listing's all-in counts only a token disk
    assert f"GPU {per_hour(offer.gpu_usd_per_hour)} + 250 GB disk" in hover and "traffic on top" in hover

    page = _rent_page(client, offer)
    assert f"Rent for ${shown}/h</button>" in page
    assert f"<strong id=\"rent-price\" data-usd-per-hour=\"{price.usd_per_hour}\">${shown}/h</strong>" in page

    response = client.post(reverse("rent_confirm"), _form(page, offer))
    assert response.status_code == 302
    instance = Instance.objects.get()
    assert instance.usd_per_hour == price.usd_per_hour and queued == [instance.pk]
    detail = client.get(response["Location"]).content.decode()
    assert f"${shown}/h" in detail
    assert f"at ${shown}/h, on-demand" in detail  # the request event says the same price


def test_it_shows_the_price_of_another_disk_before_renting_it(client, staff, listed, queued):
    client.force_login(staff)
    offer, _, _ = _first_ranked(client.get(reverse("offers"), {"max_usd_per_hour": "6"}).content.decode())
    page = _rent_page(client, offer)
    response = client.post(reverse("rent_confirm"), _form(page, offer, disk_gb="2000"))
    again = response.content.decode()
    bigger = per_hour(rental_price(offer, 2000).usd_per_hour)
    assert response.status_code == 200 and not Instance.objects.exists()
    assert f"With 2000 GB the price is {bigger}" in again and f"Rent for {bigger}</button>" in again
    response = client.post(reverse("rent_confirm"), _form(again, offer, disk_gb="2000"))
    assert response.status_code == 302
    assert Instance.objects.get().usd_per_hour == rental_price(offer, 2000).usd_per_hour


def test_it_prices_a_bid_at_what_it_bids():
    bid = offer_record("1", is_bid=True, gpu_usd_per_hour=Decimal("0.80"), min_bid_usd_per_hour=Decimal("0.95"),
                       storage_usd_per_gb_month=Decimal("0.144"))
    price = rental_price(bid, 500)
    assert price.gpu_usd_per_hour == Decimal("0.95") and price.usd_per_hour == Decimal("1.050000")
    assert price.parts == "bid $0.950/h + 500 GB disk $0.100/h = $1.050/h"


def test_it_warns_and_asks_again_before_going_over_the_spend_cap(client, staff, listed, queued, settings):
    client.force_login(staff)
    offer, _, _ = _first_ranked(client.get(reverse("offers"), {"max_usd_per_hour": "6"}).content.decode())
    price = rental_price(offer, 250).usd_per_hour
    Instance.objects.create(provider="vast", idempotency_key="running", label="moe-fleet-running", state="running",
                            offer_id="0", gpu_name="H200", image="img", disk_gb=250, requested_at=timezone.now(),
                            usd_per_hour=Decimal("3.00"))
    settings.SPEND_CAP_USD_PER_HOUR = Decimal("3.00") + price - Decimal("0.01")
    page = _rent_page(client, offer)
    assert 'id="over-cap"' in page and "puts the account over its spend cap" in page
    assert f"${Decimal('3.00') + price:.3f}/h with it" in page and 'name="over_cap"' in page

    response = client.post(reverse("rent_confirm"), _form(page, offer))
    assert response.status_code == 200 and Instance.objects.count() == 1  # not rented on the first confirmation
    assert "tick this to rent it anyway" in response.content.decode()
    response = client.post(reverse("rent_confirm"), _form(page, offer, over_cap="on"))
    assert response.status_code == 302 and Instance.objects.count() == 2


def test_it_rents_under_the_cap_with_one_confirmation(client, staff, listed, queued, settings):
    client.force_login(staff)
    offer, _, _ = _first_ranked(client.get(reverse("offers"), {"max_usd_per_hour": "6"}).content.decode())
    settings.SPEND_CAP_USD_PER_HOUR = Decimal("12")
    page = _rent_page(client, offer)
    assert 'id="over-cap"' not in page and 'name="over_cap"' not in page
    assert client.post(reverse("rent_confirm"), _form(page, offer)).status_code == 302
