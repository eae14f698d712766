"""Reconciling the bill when vast.ai's charge report (over real HTTP, the simulated marketplace) holds a line it
cannot read: the other instances are reconciled, and the one with the odd line keeps what it had until it reads."""

import logging
from datetime import timedelta

import pytest

from fleet import actions
from fleet.instances import charges
from fleet.models import Instance, Offer
from fleet.offers.refresh import refresh_offers

from .conftest import sim_now

pytestmark = pytest.mark.django_db


@pytest.fixture
def boxes(frozen_market):
    """Two rented boxes, half an hour in, with some traffic each."""
    refresh_offers()
    offers = Offer.objects.filter(available=True, is_bid=False, disk_gb__gte=100, cuda_max__gte=12.8).order_by(
        "total_usd_per_hour")[:2]
    rows = []
    for key, offer in zip(("one", "two"), offers, strict=True):
        row, _ = actions.request_rent(offer=offer, idempotency_key=key, disk_gb=100, now=sim_now(frozen_market))
        rows.append(actions.rent(row.pk, now=sim_now(frozen_market)))
    frozen_market.advance(1800)
    for row in rows:
        frozen_market.report_traffic(int(row.provider_instance_id), upload_gb=3, download_gb=20)
    return rows


def _corrupt_charges(market, monkeypatch, change):
    """Every answer of GET /charges/ passes through change(result) for each result (one per instance)."""
    served = market.market.charges_report

    def corrupted(query):
        report = served(query)
        for result in report["results"]:
            change(result)
        return report

    monkeypatch.setattr(market.market, "charges_report", corrupted)


def _junk_line_of(instance: Instance, **junk):
    def change(result):
        if result["source"] == f"instance-{instance.provider_instance_id}":
            result["items"][0].update(junk)
    return change


@pytest.mark.parametrize("junk", [{"amount": "1.25"}, {"start": None}, {"amount": float("nan")}])
def test_a_charge_report_with_one_junk_line_still_reconciles_the_other_instances(
        frozen_market, boxes, monkeypatch, caplog, junk):
    odd, good = boxes
    _corrupt_charges(frozen_market, monkeypatch, _junk_line_of(odd, **junk))
    with caplog.at_level(logging.ERROR):
        assert charges.reconcile(now=sim_now(frozen_market)) == 1
    good.refresh_from_db()
    odd.refresh_from_db()
    assert good.charges_reconciled_at is not None and good.provider_charged_usd > 0 and good.traffic_usd > 0
    assert odd.charges_reconciled_at is None and odd.provider_charged_usd is None  # not reconciled, so retried
    assert f"{odd.label}: vast charges not reconciled" in caplog.text and "charge line" in caplog.text

    monkeypatch.undo()  # the report reads again: the skipped instance is reconciled on the next pass
    assert charges.reconcile(now=sim_now(frozen_market)) == 2
    odd.refresh_from_db()
    assert odd.charges_reconciled_at is not None and odd.provider_charged_usd > 0


def test_an_instance_with_a_junk_line_keeps_its_last_reconciled_bill_not_a_part_of_it(frozen_market, boxes,
                                                                                      monkeypatch):
    odd, good = boxes
    first = sim_now(frozen_market)
    charges.reconcile(now=first)
    odd.refresh_from_db()
    billed, traffic = odd.provider_charged_usd, odd.traffic_usd

    frozen_market.advance(1800)
    frozen_market.report_traffic(int(odd.provider_instance_id), download_gb=50)
    # Its traffic line is junk now: its gpu and disk lines alone would make the bill look smaller than it is.
    def junk_traffic(result):
        if result["source"] == f"instance-{odd.provider_instance_id}":
            for item in result["items"]:
                if item["type"] == "bwd":
                    item["amount"] = -1
    _corrupt_charges(frozen_market, monkeypatch, junk_traffic)
    later = sim_now(frozen_market)
    assert charges.reconcile(now=later) == 1
    odd.refresh_from_db()
    good.refresh_from_db()
    assert (odd.provider_charged_usd, odd.traffic_usd, odd.charges_reconciled_at) == (billed, traffic, first)
    assert good.charges_reconciled_at == later


def test_a_result_that_names_no_instance_or_holds_no_items_stops_no_other(frozen_market, boxes, monkeypatch, caplog):
    odd, good = boxes

    def change(result):
        if result["source"] == f"instance-{odd.provider_instance_id}":
            result["items"] = "junk"
    _corrupt_charges(frozen_market, monkeypatch, change)
    served = frozen_market.market.charges_report

    def with_a_stranger(query):  # and a result no instance can be told from
        report = served(query)
        report["results"].append({"type": "instance", "source": "instance-?", "items": []})
        return report
    monkeypatch.setattr(frozen_market.market, "charges_report", with_a_stranger)
    with caplog.at_level(logging.ERROR):
        assert charges.reconcile(now=sim_now(frozen_market)) == 1
    good.refresh_from_db()
    odd.refresh_from_db()
    assert good.charges_reconciled_at is not None and odd.charges_reconciled_at is None
    assert "names no instance" in caplog.text and "come without their items" in caplog.text


def test_a_bill_too_large_for_its_column_is_skipped_not_the_whole_pass(frozen_market, boxes, monkeypatch, caplog):
    odd, good = boxes
    _corrupt_charges(frozen_market, monkeypatch, _junk_line_of(odd, amount=1e12))
    with caplog.at_level(logging.ERROR):
        assert charges.reconcile(now=sim_now(frozen_market) + timedelta(seconds=1)) == 1
    good.refresh_from_db()
    odd.refresh_from_db()
    assert good.charges_reconciled_at is not None and odd.charges_reconciled_at is None
    assert "provider_charged_usd" in caplog.text
