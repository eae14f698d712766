import json
from decimal import Decimal

import httpx
import pytest
from django.urls import reverse

from fleet.models import Offer, OfferRefresh
from fleet.offers import refresh as refresh_module
from fleet.offers.refresh import offer_columns, refresh_offers, store_offers
from fleet.providers.errors import AuthenticationFailed
from fleet.providers.vast import VastClient
from fleet.tasks import refresh_offers as refresh_offers_task

from .offer_records import offer_record
from .runpod_server import RUNPOD_KEY, FakeRunPod


def test_it_stores_the_offers_a_celery_worker_fetched(market, celery_worker):
    result = refresh_offers_task.delay().get(timeout=60)
    stored = Offer.objects.filter(available=True)
    assert result["offers"] == stored.count() > 100
    names = " ".join(set(stored.values_list("gpu_name", flat=True)))
    for gpu in ["RTX PRO 6000", "H100", "H200", "B200", "A100"]:
        assert gpu in names
    assert stored.filter(is_bid=True).exists() and stored.filter(is_bid=False).exists()
    assert OfferRefresh.objects.get().error == ""


@pytest.mark.django_db
def test_it_retires_offers_that_are_no_longer_listed(market):
    refresh_offers()
    first = Offer.objects.filter(available=True, is_bid=False).order_by("total_usd_per_hour").first()
    from fleet.providers.registry import get_provider
    from fleet.providers.records import RentRequest

    with get_provider() as provider:  # someone else rents the cheapest offer
        provider.rent(RentRequest(offer_id=first.offer_id, image="img", disk_gb=20, label="someone", env={}))
    refresh_offers()
    first.refresh_from_db()
    assert first.available is False
    assert Offer.objects.filter(available=True).count() > 100


@pytest.mark.django_db
def test_it_records_a_refused_key_on_the_refresh(market, settings):
    settings.VAST_API_KEY = "wrong"
    with pytest.raises(AuthenticationFailed, match="refused the API key"):
        refresh_offers()
    refresh = OfferRefresh.objects.get()
    assert "check VAST_API_KEY" in refresh.error
    assert "wrong" not in refresh.error


@pytest.mark.django_db
def test_it_lists_stored_offers_on_the_offers_page(client, member, market):
    refresh = refresh_offers()
    client.force_login(member)
    body = client.get(reverse("offers")).content.decode()
    assert f"{refresh.offers_seen} offers listed" in body
    cheapest = Offer.objects.filter(available=True, is_bid=False).order_by("total_usd_per_hour").first()
    found = client.get(reverse("offers"), {"find": cheapest.offer_id}).content.decode()
    assert f'data-offer="{cheapest.offer_id}" data-bid="0"' in found


@pytest.mark.django_db
def test_it_shows_a_failed_refresh_on_the_dashboard(client, member, market, settings):
    settings.VAST_API_KEY = "wrong"
    with pytest.raises(AuthenticationFailed):
        refresh_offers()
    client.force_login(member)
    assert "Last refresh failed" in client.get(reverse("dashboard")).content.decode()


@pytest.mark.django_db
def test_it_upserts_without_duplicates(market):
    from fleet.providers.registry import get_provider

    with get_provider() as provider:
        records = list(provider.search_offers())
    store_offers("vast", records)
    store_offers("vast", records)
    assert Offer.objects.count() == len(records)


# Records the database cannot hold, each with the words its reason must carry.
UNSTORABLE = [
    ({"gpu_name": "H200 " + "x" * 80}, "gpu_name is 85 characters long, more than the 80 stored"),
    ({"machine_id": "9" * 41}, "machine_id is 41 characters long, more than the 40 stored"),
    ({"geolocation": "Sweden\x00, SE"}, "geolocation holds the character '\\x00' at position 6"),
    ({"num_gpus": 40_000}, "num_gpus is 40000, not a whole number between 0 and 32767"),
    ({"compute_capability": -1}, "compute_capability is -1, not a whole number between 0 and 32767"),
    ({"num_gpus": 1.5}, "num_gpus is 1.5, not a whole number"),
    ({"total_usd_per_hour": Decimal("1000000")}, "total_usd_per_hour is Decimal('1000000'), not an amount below"),
    ({"gpu_usd_per_hour": Decimal("999999.9999996")}, "gpu_usd_per_hour is Decimal('999999.9999996')"),
    ({"storage_usd_per_gb_month": Decimal("NaN")}, "storage_usd_per_gb_month is Decimal('NaN'), not a finite"),
    ({"disk_gb": float("nan")}, "disk_gb is nan, not a finite number"),
    ({"inet_up_mbps": float("inf")}, "inet_up_mbps is inf, not a finite number"),
    ({"dlperf": float("-inf")}, "dlperf is -inf, not a finite number"),
    ({"verified": "false"}, "verified is 'false' (a string), not true or false"),
    ({"total_usd_per_hour": None}, "total_usd_per_hour is missing"),
]


@pytest.mark.django_db
def test_it_stores_every_record_that_fits_and_skips_each_one_that_does_not_with_its_field():
    good = [offer_record("1"), offer_record("2", min_bid_usd_per_hour=Decimal("999999.999999"), dlperf=None),
            offer_record("1", is_bid=True)]
    bad = [offer_record(str(100 + i), **changes) for i, (changes, _) in enumerate(UNSTORABLE)]
    stored = store_offers("vast", good + bad + [offer_record("1", gpu_name="H100")])
    assert sorted(Offer.objects.values_list("offer_id", "is_bid", "gpu_name")) == [
        ("1", False, "H200"), ("1", True, "H200"), ("2", False, "H200")]
    assert stored.stored == 3
    expected = [f"offer {100 + i}: {words}" for i, (_, words) in enumerate(UNSTORABLE)]
    expected.append("offer 1: listed twice; the first listing kept")
    assert len(stored.skipped) == len(expected)
    for note, words in zip(stored.skipped, expected, strict=True):
        assert note.startswith(words), note


@pytest.mark.django_db
def test_it_takes_the_limits_from_the_models_columns(monkeypatch):
    monkeypatch.setattr(Offer._meta.get_field("gpu_name"), "max_length", 4)
    offer_columns.cache_clear()
    try:
        stored = store_offers("vast", [offer_record("1", gpu_name="H200"), offer_record("2", gpu_name="H200 NVL")])
    finally:
        offer_columns.cache_clear()
    assert stored.stored == 1
    assert stored.skipped == ["offer 2: gpu_name is 8 characters long, more than the 4 stored"]


@pytest.mark.django_db
def test_it_stores_runpods_offers_whose_gpu_type_ids_are_long(settings):
    fake = FakeRunPod(boot_polls=None).start()
    try:
        settings.RUNPOD_API_URL, settings.RUNPOD_API_KEY = fake.base_url, RUNPOD_KEY
        refresh = refresh_offers("runpod")
    finally:
        fake.stop()
    assert refresh.offers_skipped == 0 and refresh.error == ""
    stored = set(Offer.objects.filter(provider="runpod").values_list("offer_id", flat=True))
    assert "NVIDIA RTX PRO 6000 Blackwell Server Edition:SECURE:1" in stored
    assert refresh.offers_seen == Offer.objects.filter(provider="runpod").count() > len(stored) > 5  # bids too


@pytest.mark.django_db
def test_it_counts_what_the_client_and_the_database_could_not_take_and_stores_the_rest(monkeypatch, settings):
    listing = {
        "id": 101, "gpu_name": "H200", "num_gpus": 1, "gpu_ram": 143771, "compute_cap": 900, "cuda_max_good": 12.8,
        "driver_version": "570.124.06", "disk_space": 500, "inet_up": 900.0, "inet_down": 1500.0,
        "dph_base": 1.15, "dph_total": 1.2, "reliability2": 0.987, "verified": True, "geolocation": "Sweden, SE",
    }
    catalogue = json.dumps({"offers": [
        listing, {**listing, "id": 102, "num_gpus": "<1e400>"}, {**listing, "id": 103, "gpu_name": "H" * 81},
        {**listing, "id": 104, "verified": "false"}, {**listing, "id": 105},
    ]}).replace('"<1e400>"', "1e400")

    def answer(request):
        return httpx.Response(200, content=catalogue.encode())

    def provider(name):
        return VastClient(settings.VAST_API_URL, "key", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(refresh_module, "get_provider", provider)
    refresh = refresh_offers()
    # the same catalogue answers both the on-demand and the bid search: 2 listings stored twice over, 3 skipped
    assert sorted(Offer.objects.values_list("offer_id", "is_bid")) == [
        ("101", False), ("101", True), ("105", False), ("105", True)]
    assert (refresh.offers_seen, refresh.offers_skipped, refresh.error) == (4, 6, "")
