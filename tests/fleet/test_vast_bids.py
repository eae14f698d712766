"""Interruptible boxes that are outbid raise their bid within the user's cap or move, and say which; the product's
vast.ai client changes bids and reboots as the CLI does, against the simulated marketplace."""

from decimal import Decimal

import pytest

from fleet import actions
from fleet.instances.bids import answer_outbid
from fleet.models import Instance, InstanceEvent, Offer
from fleet.offers.refresh import refresh_offers
from fleet.providers.errors import InstanceNotFound, RequestRefused
from fleet.providers.registry import get_provider

from .conftest import sim_now
from .test_instances import _rent

pytestmark = pytest.mark.django_db
State = Instance.State
D = Decimal


def test_it_raises_a_bid_by_a_margin_within_the_cap():
    raised = answer_outbid(bid=D("0.600"), bid_to_beat=D("0.700"), cap=D("1.30"), disk_usd_per_hour=D("0.05"))
    assert raised.bid_usd_per_hour == D("0.735")  # 5 % over the bid to beat, rounded up to a tenth of a cent
    assert "bid raised to $0.735/h" in raised.message and "resumes on the same machine" in raised.message
    tight = answer_outbid(bid=D("0.600"), bid_to_beat=D("0.700"), cap=D("0.76"), disk_usd_per_hour=D("0.05"))
    assert tight.bid_usd_per_hour == D("0.710")  # what the cap leaves beside the disk, still over the bid to beat


@pytest.mark.parametrize(("to_beat", "cap", "words"), [
    (D("0.700"), D("0.75"), "leaves no room under the cap $0.750/h"),
    (D("0.700"), None, "no price cap allows a higher bid"),
    (None, D("1.30"), "does not say the bid to beat"),
])
def test_it_moves_when_the_cap_leaves_no_room(to_beat, cap, words):
    moved = answer_outbid(bid=D("0.600"), bid_to_beat=to_beat, cap=cap, disk_usd_per_hour=D("0.05"))
    assert moved.bid_usd_per_hour is None and words in moved.message and "moves to another box" in moved.message


def _bid_box(market, cap):
    refresh_offers()
    offer = Offer.objects.filter(available=True, is_bid=True, disk_gb__gte=100, cuda_max__gte=12.8).order_by(
        "total_usd_per_hour").first()
    instance, _ = actions.request_rent(offer=offer, idempotency_key="bid", disk_gb=100, bid_cap_usd_per_hour=cap,
                                       now=sim_now(market))
    instance = actions.rent(instance.pk, now=sim_now(market))
    market.advance(120)
    actions.sync(now=sim_now(market))
    instance.refresh_from_db()
    assert instance.state == State.RUNNING
    return instance


def _provider_view(instance):
    with get_provider() as provider:
        return provider.get_instance(instance.provider_instance_id)


def test_an_outbid_box_raises_its_bid_and_resumes_on_its_machine(frozen_market):
    instance = _bid_box(frozen_market, cap=D("50"))
    old_bid = instance.bid_usd_per_hour
    frozen_market.reclaim(int(instance.provider_instance_id))
    to_beat = _provider_view(instance).min_bid_usd_per_hour
    assert to_beat > old_bid
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state == State.RUNNING and instance.bid_usd_per_hour > to_beat
    (event,) = InstanceEvent.objects.filter(instance=instance, kind="bid-raised")
    assert f"bid raised to ${instance.bid_usd_per_hour:.3f}/h" in event.message
    assert instance.cost_segments.get(ended_at=None).usd_per_hour < instance.usd_per_hour  # stopped: disk only
    assert _provider_view(instance).status in ("created", "loading")  # it won the machine back
    frozen_market.advance(90)
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.provider_status == "running" and instance.cost_segments.get(ended_at=None).usd_per_hour == \
        instance.usd_per_hour
    assert InstanceEvent.objects.filter(instance=instance, kind="bid-raised").count() == 1


def test_an_outbid_box_over_its_cap_moves_and_says_why(frozen_market):
    instance = _bid_box(frozen_market, cap=None)
    instance.bid_cap_usd_per_hour = instance.usd_per_hour  # the cap is what it pays now: no room to raise
    instance.save(update_fields=["bid_cap_usd_per_hour"])
    frozen_market.reclaim(int(instance.provider_instance_id))
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    assert instance.state in (State.STOPPING, State.DESTROYED, State.FAILED)
    assert "leaves no room under the cap" in instance.failure_reason
    assert InstanceEvent.objects.filter(instance=instance, kind="outbid-moved").exists()


def test_the_client_changes_bids_and_reboots_as_the_cli_does(frozen_market):
    refresh_offers()
    on_demand = _rent(Offer.objects.filter(available=True, is_bid=False, disk_gb__gte=100).order_by(
        "total_usd_per_hour").first(), frozen_market)
    frozen_market.advance(120)
    with get_provider() as vast:
        with pytest.raises(RequestRefused, match="on-demand: it has no bid to change"):
            vast.change_bid(on_demand.provider_instance_id, D("1.0"))
        with pytest.raises(RequestRefused, match="outside"):
            vast.change_bid(on_demand.provider_instance_id, D("500"))
        with pytest.raises(InstanceNotFound):
            vast.reboot("99999")
    actions.reboot(on_demand, reason="the agent stopped answering", now=sim_now(frozen_market))
    assert _provider_view(on_demand).status in ("created", "loading")
    assert InstanceEvent.objects.filter(instance=on_demand, kind="rebooted").exists()
