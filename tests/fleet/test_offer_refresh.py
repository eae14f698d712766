import pytest
from django.urls import reverse

from fleet.models import Offer, OfferRefresh
from fleet.offers.refresh import refresh_offers, store_offers
from fleet.providers.errors import AuthenticationFailed
from fleet.tasks import refresh_offers as refresh_offers_task


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
