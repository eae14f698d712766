"""A vast.ai offer record that fits every Offer column and passes the default filters, for tests to change."""

from decimal import Decimal

from fleet.providers.records import OfferRecord


def offer_record(offer_id: str, **changes) -> OfferRecord:
    values = dict(
        provider="vast", offer_id=offer_id, machine_id="9", host_id="3", gpu_name="H200", num_gpus=1,
        gpu_ram_gb=140.4, compute_capability=90, cuda_max=12.8, driver_version="570.124.06", disk_gb=500.0,
        inet_up_mbps=900.0, inet_down_mbps=1500.0, inet_up_usd_per_gb=Decimal("0.02"),
        inet_down_usd_per_gb=Decimal("0.01"), storage_usd_per_gb_month=Decimal("0.15"),
        gpu_usd_per_hour=Decimal("1.15"), total_usd_per_hour=Decimal("1.2"), min_bid_usd_per_hour=None,
        reliability=0.987, verified=True, rentable=True, is_bid=False, geolocation="Sweden, SE", dlperf=250.0,
        total_flops=700.0,
    )
    return OfferRecord(**(values | changes))
