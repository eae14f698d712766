"""The cost of a whole run on one offer, against examples worked by hand."""

import math
from decimal import Decimal

import numpy as np
import pytest

from fleet.providers.records import OfferRecord
from fleet.ranking import CostModel, Phase, Workload
from fleet.ranking.cost import BID_RECLAIM_PER_HOUR, offer_prices


def make_offer(**changes) -> OfferRecord:
    values = dict(
        provider="vast", offer_id="1", machine_id="m1", host_id="h1", gpu_name="H200", num_gpus=1,
        gpu_ram_gb=141.0, compute_capability=90, cuda_max=12.8, driver_version="570.124.06", disk_gb=500.0,
        inet_up_mbps=1400.0, inet_down_mbps=2000.0, inet_up_usd_per_gb=Decimal("0.02"),
        inet_down_usd_per_gb=Decimal("0.01"), storage_usd_per_gb_month=Decimal("0.10"),
        gpu_usd_per_hour=Decimal("1.20"), total_usd_per_hour=Decimal("1.27"), min_bid_usd_per_hour=None,
        reliability=1.0, verified=True, rentable=True, is_bid=False, geolocation="Sweden, SE", dlperf=None,
        total_flops=None,
    )
    values.update(changes)
    return OfferRecord(**values)


# 1,000 steps at 72 s = 72,000 s = 20 h of training; 7 GB checkpoints every 30 min; 250 GB rented disk;
# start-up = 52 s boot + (10 GB image + 67 GB model) x 8,000 Mb/GB / 2,000 Mb/s = 52 + 308 = 360 s = 6 min.
RECIPE = Workload(
    phases=(Phase("sft", 1000),), checkpoint_interval_s=1800, checkpoint_gb=7.0, model_download_gb=67.0,
    image_gb=10.0, boot_s=52.0, rent_disk_gb=250.0,
)
STEP_S = 72.0


def project(offer, recipe=RECIPE, step_s=STEP_S, interruptible=False):
    model = CostModel(recipe)
    p = model.estimate(offer, step_s, interruptible)
    return p, model.breakdown(offer, p)


def test_it_prices_a_20_hour_run_on_a_reliable_host_exactly():
    p, cost = project(make_offer())
    # final checkpoint upload before the box goes: 7 GB x 8,000 / 1,400 Mb/s = 40 s
    # training billed: 72,000 + 40 = 72,040 s = 20.01111 h; start-up 360 s = 0.1 h
    assert (p.startup_s, p.train_s, p.checkpoints) == (360.0, 72040.0, 40)
    # GPU:      $1.20 x 72,040 / 3,600                 = 24.013333  -> 24.0133
    # disk:     250 GB x $0.10 / 720 h = $0.0347222/h; x 20.01111 h = 0.6948302 -> 0.6948
    # start-up: ($1.20 + $0.0347222) x 0.1 h           = 0.1234722
    #   less the GPU while vast.ai bills storage only: the 52 s boot + 10 GB image x 8,000 / 2,000 Mb/s = 92 s,
    #   $1.20 x 92 / 3,600 = 0.0306667                 = 0.0928056  -> 0.0928
    # download: 67 GB x $0.01                          = 0.67
    # uploads:  40 checkpoints x 7 GB x $0.02          = 5.60
    # total:    24.0133 + 0.6948 + 0.0928 + 0.67 + 5.60 = 31.0709
    assert p.storage_only_s == 92.0
    assert cost.gpu_usd == Decimal("24.0133")
    assert cost.disk_usd == Decimal("0.6948")
    assert cost.startup_usd == Decimal("0.0928")
    assert cost.download_usd == Decimal("0.6700")
    assert cost.upload_usd == Decimal("5.6000")
    assert cost.restart_usd == Decimal("0")
    assert cost.total_usd == Decimal("31.0709")
    # wall time 72,400 s = 20.1111 h; all-in hourly cost 31.0709 / 20.1111 = 1.544962 -> 1.5450
    assert p.wall_hours == pytest.approx(20.1111111)
    assert cost.usd_per_hour == Decimal("1.5450")
    assert p.total_usd == pytest.approx(float(cost.total_usd), abs=1e-3)  # the float twin used for scoring


def test_it_prices_expected_host_losses_from_reliability():
    p, cost = project(make_offer(reliability=0.99))
    # loss rate -ln(0.99) = 0.0100503/h over 20.1111 billed hours;
    # one loss costs 1,800 s (an interval) + 60 s (detection) + 360 s (start-up) = 2,220 s = 0.61667 h,
    # and exposes that time again: 0.0100503 x 20.1111 / (1 - 0.0100503 x 0.61667) = 0.203384 restarts
    assert p.expected_restarts == pytest.approx(0.203384, abs=1e-6)
    # each: ($1.20 + $0.0347222) x 0.61667 h - the 92 s storage-only GPU 0.0306667 + 67 GB x $0.01
    #   = 0.761412 - 0.030667 + 0.67 = 1.400745; 0.203384 x 1.400745 = 0.284889 -> 0.2849
    # total 31.0709 + 0.2849 = 31.3558
    assert cost.restart_usd == Decimal("0.2849")
    assert cost.total_usd == Decimal("31.3558")
    assert p.wall_hours == pytest.approx(20.1111111 + 0.203384 * 0.6166667, abs=1e-5)


def test_it_adds_the_reclaim_rate_for_interruptible_rentals():
    p, _ = project(make_offer(reliability=1.0, is_bid=True), interruptible=True)
    assert p.loss_rate_per_hour == BID_RECLAIM_PER_HOUR
    on_demand, _ = project(make_offer(reliability=1.0))
    assert p.total_usd > on_demand.total_usd


def test_it_stalls_training_when_an_upload_outlasts_the_checkpoint_interval():
    p, cost = project(make_offer(inet_up_mbps=20.0))
    # 7 GB x 8,000 / 20 Mb/s = 2,800 s per upload: 1,000 s past each 1,800 s interval, 40 times, plus the last
    # upload: 72,000 + 40,000 + 2,800 = 114,800 s of billed training
    assert p.train_s == 114800.0
    assert p.wall_hours == pytest.approx((360 + 114800) / 3600)
    # GPU: $1.20 x 114,800 / 3,600 = 38.2666.. -> 38.2667
    assert cost.gpu_usd == Decimal("38.2667")


def test_it_bills_start_up_at_the_offers_own_downlink():
    slow, slow_cost = project(make_offer(inet_down_mbps=250.0))
    # 52 s + 77 GB x 8,000 / 250 Mb/s = 52 + 2,464 = 2,516 s, about 42 minutes
    assert slow.startup_s == 2516.0
    # ($1.20 + 25/720) x 2,516 / 3,600 = 1.2347222 x 0.6988889 = 0.862927, less the GPU over the storage-only
    # 52 s + 10 GB x 8,000 / 250 Mb/s = 372 s: $1.20 x 372 / 3,600 = 0.124 -> 0.738927 -> 0.7389
    assert slow.storage_only_s == 372.0
    assert slow_cost.startup_usd == Decimal("0.7389")


def test_it_bills_the_whole_start_up_where_the_provider_bills_gpu_while_loading():
    p, cost = project(make_offer(provider="runpod"))
    assert p.storage_only_s == 0.0
    assert cost.startup_usd == Decimal("0.1235")  # ($1.20 + $0.0347222) x 0.1 h, the image pull included
    vast_p, vast_cost = project(make_offer())
    assert vast_cost.total_usd == cost.total_usd - (Decimal("0.1235") - Decimal("0.0928"))


@pytest.mark.parametrize("reliability", [1.0, 0.97])
def test_the_columns_price_each_provider_as_estimate_does(reliability):
    offers = [make_offer(provider=name, reliability=reliability, inet_down_mbps=down, is_bid=bid)
              for name in ("vast", "runpod") for down in (250.0, 2000.0, 0.0) for bid in (False, True)]
    model = CostModel(RECIPE)
    columns = model.total_usd_columns(
        np.full(len(offers), STEP_S), np.array([o.inet_down_mbps for o in offers]),
        np.array([o.inet_up_mbps for o in offers]), np.array([o.reliability for o in offers]),
        np.array([o.is_bid for o in offers]), np.array([list(offer_prices(o)) for o in offers]),
        np.array([o.provider == "vast" for o in offers]))
    expected = [model.estimate(o, STEP_S, o.is_bid).total_usd for o in offers]
    np.testing.assert_array_equal(columns, expected)  # bit for bit, infinities included
    assert not np.isnan(columns).any()


def test_it_writes_one_more_checkpoint_at_each_phase_end():
    two_phases = Workload(
        phases=(Phase("sft", 500), Phase("dpo", 500)), checkpoint_interval_s=1800, checkpoint_gb=7.0,
        model_download_gb=67.0, image_gb=10.0, boot_s=52.0,
    )
    p, cost = project(make_offer(), recipe=two_phases)
    assert p.checkpoints == 41
    assert cost.upload_usd == Decimal("5.7400")  # 41 x 7 GB x $0.02


def test_it_charges_the_rented_disk_not_the_hosts_whole_disk():
    _, small_host = project(make_offer(disk_gb=250.0))
    _, big_host = project(make_offer(disk_gb=4000.0))
    assert small_host.disk_usd == big_host.disk_usd == Decimal("0.6948")


def test_it_uses_the_gpu_price_and_falls_back_to_the_total_when_the_listing_has_none():
    _, cost = project(make_offer(gpu_usd_per_hour=Decimal("0"), total_usd_per_hour=Decimal("1.20")))
    assert cost.gpu_usd == Decimal("24.0133")


def test_it_costs_free_traffic_at_zero():
    _, cost = project(make_offer(inet_up_usd_per_gb=Decimal("0"), inet_down_usd_per_gb=Decimal("0")))
    assert (cost.download_usd, cost.upload_usd) == (Decimal("0"), Decimal("0"))
    assert cost.total_usd == Decimal("24.0133") + Decimal("0.6948") + Decimal("0.0928")


def test_it_sums_its_parts_to_the_total():
    _, cost = project(make_offer(reliability=0.96, inet_up_mbps=300.0, inet_down_usd_per_gb=Decimal("0.003")))
    parts = (cost.gpu_usd, cost.disk_usd, cost.startup_usd, cost.download_usd, cost.upload_usd, cost.restart_usd)
    assert sum(parts) == cost.total_usd
    assert all(part.as_tuple().exponent == -4 for part in parts)


def test_it_returns_an_unbounded_cost_for_a_host_that_cannot_download():
    p = CostModel(RECIPE).estimate(make_offer(inet_down_mbps=0.0), STEP_S)
    assert math.isinf(p.total_usd) and math.isinf(p.wall_hours)
