"""The vast.ai client over real HTTP against the simulated marketplace, faults included."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from fleet.providers.errors import (
    AuthenticationFailed,
    InstanceNotFound,
    OfferUnavailable,
    ProviderUnavailable,
    RateLimited,
)
from fleet.providers.records import RentRequest
from fleet.providers.vast import VastClient

from .conftest import MARKET_KEY


@pytest.fixture
def vast(market):
    sleeps: list[float] = []
    client = VastClient(market.base_url, MARKET_KEY, max_retries=3, backoff_s=0.01, sleep=sleeps.append)
    client.sleeps = sleeps
    yield client
    client.close()


def _rent(vast, offer, image="vastai/pytorch:cuda12.4", **kwargs):
    return vast.rent(RentRequest(offer_id=offer.offer_id, image=image, disk_gb=min(40, int(offer.disk_gb)),
                                 label="moe-fleet-test", env={"RUN": "1"}, **kwargs))


def test_it_searches_with_filters_in_vast_units(vast):
    offers = vast.search_offers({"gpu_ram": {"gte": 130 * 1024}, "inet_down": {"gte": 250}})
    assert offers and all(o.gpu_ram_gb >= 130 and o.inet_down_mbps >= 250 for o in offers)
    prices = [o.total_usd_per_hour for o in offers]
    assert prices == sorted(prices)  # ordered by dph_total, ascending
    assert all(isinstance(p, Decimal) for p in prices)


def test_it_lists_bid_offers_as_interruptible(vast):
    bids = vast.search_offers(bid=True, limit=20)
    assert bids and all(o.is_bid for o in bids)


def test_it_rents_and_follows_the_instance_to_running(vast, market):
    market_offer = vast.search_offers(limit=5)[0]
    instance_id = _rent(vast, market_offer)
    instance = vast.get_instance(instance_id)
    assert instance.label == "moe-fleet-test" and instance.status in ("created", "loading")
    market.advance(120)  # past the 90 s boot delay
    instance = vast.get_instance(instance_id)
    assert instance.status == "running"
    assert instance.usd_per_hour > 0 and instance.started_at is not None
    assert instance_id in [i.instance_id for i in vast.list_instances()]


def test_it_destroys_once_and_then_reports_gone(vast):
    instance_id = _rent(vast, vast.search_offers(limit=5)[0])
    assert vast.destroy(instance_id) is True
    assert vast.destroy(instance_id) is False  # already gone: not an error
    with pytest.raises(InstanceNotFound):
        vast.get_instance(instance_id)


def test_it_says_the_key_is_wrong(market):
    with VastClient(market.base_url, "not-the-key") as client:
        with pytest.raises(AuthenticationFailed, match=r"refused the API key \(HTTP 401\): check VAST_API_KEY"):
            client.search_offers()


def test_it_refuses_to_start_without_a_key(market):
    with pytest.raises(AuthenticationFailed, match="set VAST_API_KEY"):
        VastClient(market.base_url, "")


def test_it_waits_out_a_429_as_retry_after_says(vast, market):
    market.inject_faults(http_429=2, retry_after_s=3)
    assert vast.search_offers(limit=3)
    assert vast.sleeps == [3.0, 3.0]


def test_it_gives_up_when_retry_after_is_too_long(vast, market):
    market.inject_faults(http_429=1, retry_after_s=600)
    with pytest.raises(RateLimited) as caught:
        vast.search_offers(limit=3)
    assert caught.value.retry_after_s == 600


@pytest.mark.parametrize("zone", ["-0000", "GMT", "+0200"])
def test_it_reads_retry_after_given_as_an_http_date(vast, market, zone):
    # RFC 2822's "-0000" is UTC with no claim about local time: Python reads it as a date without a zone.
    offset = timedelta(hours=2) if zone == "+0200" else timedelta(0)
    when = datetime.now(UTC) + timedelta(seconds=20)
    market.inject_faults(http_429=1, retry_after=(when + offset).strftime("%a, %d %b %Y %H:%M:%S ") + zone)
    assert vast.search_offers(limit=3)
    assert len(vast.sleeps) == 1 and 15 <= vast.sleeps[0] <= 21


@pytest.mark.parametrize("value", ["inf", "nan", "-5", "soon", "Mon, 99 Foo 2026 99:99:99 GMT"])
def test_an_unreadable_retry_after_waits_as_long_as_a_rate_limit_without_one(vast, market, value):
    # vast.ai's limits are per-endpoint intervals it does not state: a 429 without a usable Retry-After waits 3 s.
    market.inject_faults(http_429=1, retry_after=value)
    assert vast.search_offers(limit=3)
    assert vast.sleeps == [3.0]


def test_a_5xx_asking_for_a_long_wait_is_not_slept_out(vast, market):
    market.inject_faults(http_5xx=1, status_5xx=503, retry_after="86400")
    with pytest.raises(ProviderUnavailable, match="HTTP 503, asked to retry in 86400 s"):
        vast.list_instances()
    assert vast.sleeps == []


def test_it_retries_5xx_with_backoff(vast, market):
    market.inject_faults(http_5xx=2, status_5xx=502)
    assert vast.list_instances() == []
    assert len(vast.sleeps) == 2 and vast.sleeps[1] > vast.sleeps[0] * 0.9


def test_it_stops_retrying_5xx_after_its_budget(vast, market):
    market.inject_faults(http_5xx=10, status_5xx=503)
    with pytest.raises(ProviderUnavailable, match="HTTP 503 after 4 tries"):
        vast.list_instances()


def test_it_reports_an_offer_gone_between_search_and_rent(vast, market):
    offer = vast.search_offers(limit=5)[0]
    market.inject_faults(offers_gone=[int(offer.offer_id)])
    with pytest.raises(OfferUnavailable, match=f"Offer {offer.offer_id} can no longer be rented"):
        _rent(vast, offer)


def test_it_sees_a_dead_host_exit_and_then_vanish(vast, market):
    instance_id = _rent(vast, vast.search_offers(limit=5)[0])
    market.advance(120)
    market.kill_host(int(instance_id), vanish_after_s=60)
    assert vast.get_instance(instance_id).status == "exited"
    market.advance(61)
    with pytest.raises(InstanceNotFound):
        vast.get_instance(instance_id)
    assert instance_id not in [i.instance_id for i in vast.list_instances()]


def test_it_sees_a_hung_host_as_running_with_an_idle_gpu(vast, market):
    instance_id = _rent(vast, vast.search_offers(limit=5)[0])
    market.advance(120)
    market.hang_host(int(instance_id))
    market.advance(60)
    instance = vast.get_instance(instance_id)
    assert instance.status == "running"  # a process check would call this healthy
    assert instance.gpu_util_percent == 0


def test_it_sees_cuda_error_803_on_a_host_whose_driver_is_too_old(vast, market):
    old = next(o for o in vast.search_offers(limit=300) if o.cuda_max < 12.8)
    instance_id = _rent(vast, old, image="ghcr.io/example/worker:cuda12.8")
    market.advance(120)
    assert "803" in vast.get_instance(instance_id).status_msg


def test_it_reads_charges_that_match_the_price(vast, market):
    offer = vast.search_offers(limit=5)[0]
    instance_id = _rent(vast, offer)
    market.advance(1800)
    gpu = [c for c in vast.charges() if c.instance_id == instance_id and c.kind == "gpu"]
    # GPU time bills from "running", after the 90 s boot: 1710 of the 1800 s
    assert float(sum(c.amount_usd for c in gpu)) == pytest.approx(float(offer.gpu_usd_per_hour) * 1710 / 3600,
                                                                  abs=0.01)
