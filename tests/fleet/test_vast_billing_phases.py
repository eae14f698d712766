"""vast.ai bills storage from creation and GPU time from "running": the product's live cost follows the phases it
syncs, agrees with the provider's charges, and the instance page says while a box bills its storage only."""

from decimal import Decimal

import pytest
from django.urls import reverse

from fleet import actions
from fleet.instances import charges, ledger
from fleet.offers.refresh import refresh_offers
from fleet.providers.vast import parse_instance

from .conftest import sim_now
from .test_instances import _cheap_offer, _rent

pytestmark = pytest.mark.django_db

# vast.ai's documented instance answer, the fields the billing reads (docs.vast.ai, "show instance").
DOCUMENTED = {"id": 1234, "actual_status": "loading", "intended_status": "running", "cur_state": "running",
              "dph_base": 1.2, "dph_total": 1.2347, "is_bid": False, "label": "x", "num_gpus": 1,
              "gpu_name": "H200", "machine_id": 42}


@pytest.mark.parametrize(("status", "rate"), [
    ("created", Decimal("0.0347")), ("loading", Decimal("0.0347")), (None, Decimal("0.0347")),
    ("stopped", Decimal("0.0347")), ("exited", Decimal("0.0347")), ("running", None), ("frozen", None),
])
def test_the_client_reads_what_each_state_bills(status, rate):
    record = parse_instance({**DOCUMENTED, "actual_status": status})
    assert record.usd_per_hour == Decimal("1.2347") and record.billing_usd_per_hour == rate
    assert parse_instance({**DOCUMENTED, "dph_base": "n/a"}).billing_usd_per_hour is None  # unread: the full price


def test_the_live_cost_bills_storage_while_loading_and_matches_the_charges(frozen_market, client, staff):
    refresh_offers()
    offer = _cheap_offer()
    instance = _rent(offer, frozen_market)
    frozen_market.advance(30)
    actions.sync(now=sim_now(frozen_market))
    instance.refresh_from_db()
    storage_usd_per_hour = instance.usd_per_hour - offer.gpu_usd_per_hour
    (loading,) = instance.cost_segments.all()
    assert instance.provider_status == "loading" and loading.usd_per_hour == storage_usd_per_hour

    client.force_login(staff)
    page = client.get(reverse("instance_detail", args=[instance.pk])).content.decode()
    assert "storage only" in page and "while the image pulls (loading)" in page
    assert f'data-rate="{storage_usd_per_hour}"' in page  # the page's ticking cost grows at the storage rate

    frozen_market.advance(60)  # the boot's 90 s are over: running, GPU time bills
    actions.sync(now=sim_now(frozen_market))
    frozen_market.advance(3600)
    now = sim_now(frozen_market)
    actions.sync(now=now)
    charges.reconcile(now=now)
    instance.refresh_from_db()
    assert [s.usd_per_hour for s in instance.cost_segments.order_by("started_at")] == [
        storage_usd_per_hour, instance.usd_per_hour]
    ours = ledger.instance_cost(instance, now)
    assert ours == pytest.approx(instance.provider_charged_usd, abs=Decimal("0.0005"))
    assert ours == pytest.approx(storage_usd_per_hour * Decimal(3690) / 3600
                                 + offer.gpu_usd_per_hour * Decimal(3600) / 3600, abs=Decimal("0.0005"))
    page = client.get(reverse("instance_detail", args=[instance.pk])).content.decode()
    assert "storage only" not in page and f'data-rate="{instance.usd_per_hour}"' in page
