"""The hard filters: each at its boundaries, blank listing fields, units in the reasons, and the saved-profile form."""

from dataclasses import replace
from decimal import Decimal

import pytest

from fleet.providers.records import OfferRecord
from fleet.ranking import OfferFilters, Workload, compile_filters, exclusion_reasons


def make_offer(**changes) -> OfferRecord:
    """An RTX PRO 6000 listing that passes every default filter."""
    values = dict(
        provider="vast", offer_id="100", machine_id="m1", host_id="h1", gpu_name="RTX PRO 6000 WS", num_gpus=1,
        gpu_ram_gb=96.0, compute_capability=120, cuda_max=12.8, driver_version="570.124.06", disk_gb=250.0,
        inet_up_mbps=200.0, inet_down_mbps=250.0, inet_up_usd_per_gb=Decimal("0.01"),
        inet_down_usd_per_gb=Decimal("0.01"), storage_usd_per_gb_month=Decimal("0.10"),
        gpu_usd_per_hour=Decimal("1.10"), total_usd_per_hour=Decimal("1.13"), min_bid_usd_per_hour=None,
        reliability=0.95, verified=False, rentable=True, is_bid=False, geolocation="Sweden, SE", dlperf=None,
        total_flops=None,
    )
    values.update(changes)
    return OfferRecord(**values)


def reasons(offer, filters=None, recipe=None):
    return exclusion_reasons(offer, filters or OfferFilters(), recipe)


def test_it_passes_an_offer_exactly_at_every_default_boundary():
    # disk 250, downlink 250, uplink 200, reliability 0.95, driver 570.x, CUDA 12.8, 96 GB, $1.13 < $1.30
    assert reasons(make_offer()) == ()
    assert reasons(make_offer(total_usd_per_hour=Decimal("1.30"))) == ()


def test_it_has_the_documented_defaults():
    f = OfferFilters()
    assert f.gpu_tiers == ("rtx_pro_6000", "h200", "b200")
    assert f.max_usd_per_hour == Decimal("1.30")
    assert (f.min_driver_version, f.min_cuda) == ("570", 12.8)
    assert (f.min_disk_gb, f.min_inet_down_mbps, f.min_inet_up_mbps) == (250, 250, 200)
    assert (f.min_reliability, f.require_verified, f.allow_bids) == (0.95, False, False)
    assert (f.min_gpus, f.max_gpus, f.locations) == (1, 1, frozenset())


@pytest.mark.parametrize("ram_gb, passes", [(89.9, False), (90.0, True), (100.0, True), (100.1, False)])
def test_it_matches_the_rtx_pro_6000_tier_on_memory(ram_gb, passes):
    filters = OfferFilters(gpu_tiers=["RTX PRO 6000"])
    got = reasons(make_offer(gpu_ram_gb=ram_gb), filters, Workload(vram_needed_gb=80))
    assert got == (() if passes else (f"VRAM {ram_gb:g} GB outside 90-100 GB (RTX PRO 6000 tier)",))


def test_it_puts_h200_and_h200_nvl_in_one_tier_whatever_the_name():
    filters = OfferFilters(gpu_tiers=["h200"])
    for name in ("H200", "H200 NVL", "NVIDIA H200 SXM"):
        assert reasons(make_offer(gpu_name=name, gpu_ram_gb=141.0, compute_capability=90), filters) == ()
    assert reasons(make_offer(gpu_name="H200", gpu_ram_gb=129.0), filters) == (
        "VRAM 129 GB outside 130-150 GB (H200 tier)",)


def test_it_names_all_tiers_when_several_are_allowed():
    got = reasons(make_offer(gpu_ram_gb=120.0))
    assert got == ("VRAM 120 GB outside the RTX PRO 6000 (90-100 GB), H200 (130-150 GB), B200 (170-190 GB) tiers",)


def test_it_takes_an_explicit_vram_range_or_any():
    explicit = OfferFilters(vram_min_gb=94, vram_max_gb=141)
    assert reasons(make_offer(gpu_ram_gb=94.0), explicit) == ()
    assert reasons(make_offer(gpu_ram_gb=180.0), explicit) == ("VRAM 180 GB outside 94-141 GB",)
    open_ended = OfferFilters(vram_min_gb=100)
    assert reasons(make_offer(gpu_ram_gb=96.0), open_ended) == ("VRAM 96 GB outside 100+ GB",)
    assert reasons(make_offer(gpu_ram_gb=120.0), OfferFilters(gpu_tiers="any")) == ()


def test_it_excludes_a_card_too_small_for_the_recipe_even_with_any_tier():
    got = reasons(make_offer(gpu_name="RTX 5090", gpu_ram_gb=31.8), OfferFilters(gpu_tiers="any"))
    assert got == ("VRAM 31.8 GB < needed 77 GB for Qwen3.6-35B-A3B",)


# The default offer rents 250 GB of disk at $0.10 per GB-month: $0.034722/h on top of its machine.
@pytest.mark.parametrize("gpu, expected", [
    ("1.265278", ()),  # $1.300000/h all-in: at the cap
    ("1.2653", ("$1.300/h > cap $1.30/h",)),  # $1.300022/h, over by a fraction of a cent
    ("2.10", ("$2.135/h > cap $1.30/h",)),
    ("2.93", ("$2.965/h > cap $1.30/h",)),
])
def test_it_caps_the_rentals_price(gpu, expected):
    assert reasons(make_offer(gpu_usd_per_hour=Decimal(gpu), total_usd_per_hour=Decimal(gpu))) == expected


def test_it_applies_the_cap_to_the_machine_and_the_rented_disk_not_the_listed_total_and_can_be_lifted():
    # The listing's total counts a token disk; rented with 250 GB it is $1.284722/h, or $1.319444/h at $0.20/GB-month
    offer = make_offer(gpu_usd_per_hour=Decimal("1.25"), storage_usd_per_gb_month=Decimal("0.1"),
                       total_usd_per_hour=Decimal("1.29"))
    assert reasons(offer) == ()
    dear_disk = make_offer(gpu_usd_per_hour=Decimal("1.25"), storage_usd_per_gb_month=Decimal("0.2"),
                           total_usd_per_hour=Decimal("1.29"))
    assert reasons(dear_disk) == ("$1.319/h > cap $1.30/h",)
    assert reasons(dear_disk, OfferFilters(max_usd_per_hour=None)) == ()
    assert reasons(dear_disk, OfferFilters(max_usd_per_hour="1.32")) == ()
    assert reasons(dear_disk, OfferFilters(), Workload(rent_disk_gb=100)) == ()  # $1.277778/h with 100 GB


@pytest.mark.parametrize("driver, expected", [
    ("570", ()),
    ("570.124.06", ()),
    ("580.65.06", ()),
    ("1000.1", ()),  # numeric, not text: "1000" < "570" as strings
    ("569.99.99", ("driver 569.99.99 < needed 570",)),
    ("535.129.03", ("driver 535.129.03 < needed 570",)),
    ("535.129", ("driver 535.129 < needed 570",)),
    ("", ("driver unknown",)),
    ("   ", ("driver unknown",)),
    ("n/a", ("driver unknown ('n/a')",)),
])
def test_it_compares_driver_versions_part_by_part(driver, expected):
    assert reasons(make_offer(driver_version=driver)) == expected


def test_it_compares_later_driver_parts_numerically():
    filters = OfferFilters(min_driver_version="570.10")
    assert reasons(make_offer(driver_version="570.9"), filters) == ("driver 570.9 < needed 570.10",)
    assert reasons(make_offer(driver_version="570.10.1"), filters) == ()
    assert reasons(make_offer(driver_version="535.1"), OfferFilters(min_driver_version="")) == ()


@pytest.mark.parametrize("cuda, expected", [
    (12.8, ()), (13.0, ()), (12.7, ("CUDA 12.7 < needed 12.8",)), (0.0, ("CUDA unknown",)),
])
def test_it_checks_the_newest_cuda_the_driver_runs(cuda, expected):
    assert reasons(make_offer(cuda_max=cuda)) == expected


def test_it_checks_disk_and_both_directions_of_bandwidth_in_their_units():
    assert reasons(make_offer(disk_gb=249.9)) == ("disk 249.9 GB < 250",)
    assert reasons(make_offer(inet_down_mbps=249.0)) == ("downlink 249 Mb/s < 250",)
    assert reasons(make_offer(inet_up_mbps=120.0)) == ("uplink 120 Mb/s < 200",)
    assert reasons(make_offer(inet_up_mbps=199.99)) == ("uplink 199.99 Mb/s < 200",)


def test_it_keeps_hosts_near_the_checkpoint_bucket():
    eu = OfferFilters(locations=["EU"])
    assert reasons(make_offer(geolocation="Sweden, SE"), eu) == ()
    assert reasons(make_offer(geolocation="England, GB"), eu) == ()
    assert reasons(make_offer(geolocation="US-CA, US"), eu) == ("location US not in EU",)
    assert reasons(make_offer(geolocation=""), eu) == ("location unknown",)
    both = OfferFilters(locations="EU, US")
    assert reasons(make_offer(geolocation="Texas, US"), both) == ()
    assert reasons(make_offer(geolocation="Japan, JP"), both) == ("location JP not in EU, US",)
    assert reasons(make_offer(geolocation=""), OfferFilters(locations="any")) == ()


@pytest.mark.parametrize("reliability, expected", [
    (0.95, ()), (0.9499, ("reliability 0.9499 < 0.95",)), (0.949, ("reliability 0.949 < 0.95",)),
])
def test_it_holds_the_reliability_floor(reliability, expected):
    assert reasons(make_offer(reliability=reliability)) == expected


def test_it_requires_verified_only_when_asked():
    assert reasons(make_offer(verified=False)) == ()
    assert reasons(make_offer(verified=False), OfferFilters(require_verified=True)) == ("not verified",)
    assert reasons(make_offer(verified=True), OfferFilters(require_verified=True)) == ()


def test_it_excludes_bids_unless_they_are_allowed():
    bid = make_offer(is_bid=True)
    assert reasons(bid) == ("interruptible (bid) offer; bids not allowed",)
    assert reasons(bid, OfferFilters(allow_bids=True)) == ()


def test_it_counts_gpus_exactly_by_default_or_from_a_minimum():
    assert reasons(make_offer(num_gpus=2)) == ("2 GPUs, need exactly 1",)
    at_least_two = OfferFilters(min_gpus=2, max_gpus=None)
    assert reasons(make_offer(num_gpus=1), at_least_two) == ("1 GPU < min 2",)
    assert reasons(make_offer(num_gpus=8), at_least_two) == ()
    assert reasons(make_offer(num_gpus=8), OfferFilters(min_gpus=2, max_gpus=4)) == ("8 GPUs > max 4",)


def test_it_gives_every_reason_that_applies_in_filter_order():
    bad = make_offer(
        rentable=False, driver_version="535.129.03", cuda_max=12.2, gpu_usd_per_hour=Decimal("2.10"),
        inet_up_mbps=120.0, reliability=0.9,
    )
    assert reasons(bad) == (
        "not rentable",
        "$2.135/h > cap $1.30/h",
        "driver 535.129.03 < needed 570",
        "CUDA 12.2 < needed 12.8",
        "uplink 120 Mb/s < 200",
        "reliability 0.9 < 0.95",
    )


def test_it_excludes_blank_listing_fields_with_a_reason_instead_of_crashing():
    blank = replace(
        make_offer(), driver_version=None, cuda_max=None, gpu_ram_gb=0.0, num_gpus=0, disk_gb=None,
        inet_down_mbps=None, inet_up_mbps=None, reliability=None, total_usd_per_hour=None, geolocation=None,
    )
    assert reasons(blank, OfferFilters(locations=["EU"])) == (
        "GPU count unknown", "VRAM unknown", "price unknown", "driver unknown", "CUDA unknown", "disk unknown",
        "downlink unknown", "uplink unknown", "location unknown", "reliability unknown",
    )


def test_it_compiles_once_and_reports_a_bitmask_per_offer():
    check = compile_filters(OfferFilters(), Workload())
    assert check.mask(make_offer()) == 0
    bad = make_offer(inet_up_mbps=120.0, reliability=0.5)
    assert check.reasons(bad, check.mask(bad)) == ("uplink 120 Mb/s < 200", "reliability 0.5 < 0.95")


def test_it_round_trips_through_a_plain_dict():
    filters = OfferFilters(
        gpu_tiers=["H200"], max_usd_per_hour=Decimal("2.50"), locations=["EU", "us"], min_reliability=0.97,
        allow_bids=True, min_gpus=1, max_gpus=None, min_driver_version="575.51",
    )
    data = filters.to_dict()
    assert data["max_usd_per_hour"] == "2.50"
    assert data["locations"] == ["EU", "US"]
    assert data["gpu_tiers"] == ["h200"]
    assert OfferFilters.from_dict(data) == filters
    assert OfferFilters.from_dict({}) == OfferFilters()


def test_it_reads_form_style_values():
    filters = OfferFilters.from_dict({
        "max_usd_per_hour": "$1.50", "min_disk_gb": "300", "allow_bids": "true", "require_verified": "0",
        "max_gpus": "", "locations": "EU,NA", "gpu_tiers": "any",
    })
    assert filters.max_usd_per_hour == Decimal("1.50")
    assert (filters.min_disk_gb, filters.allow_bids, filters.require_verified) == (300.0, True, False)
    assert (filters.max_gpus, filters.locations, filters.gpu_tiers) == (None, frozenset({"EU", "NA"}), ())
    assert OfferFilters.from_dict({"max_usd_per_hour": 1.3}).max_usd_per_hour == Decimal("1.3")


@pytest.mark.parametrize("data, message", [
    ({"max_price": "1"}, "unknown filter(s): max_price"),
    ({"max_usd_per_hour": "cheap"}, "max_usd_per_hour must be an amount in dollars"),
    ({"max_usd_per_hour": "-1"}, "max_usd_per_hour must be an amount >= 0"),
    ({"min_disk_gb": -5}, "min_disk_gb must be a finite number >= 0"),
    ({"min_inet_up_mbps": "fast"}, "min_inet_up_mbps must be a number"),
    ({"min_reliability": 1.5}, "min_reliability must be between 0 and 1"),
    ({"gpu_tiers": ["A100"]}, "gpu_tiers: unknown tier 'A100'"),
    ({"locations": ["Europe"]}, "'Europe' is neither a two-letter country code nor a region"),
    ({"min_driver_version": "latest"}, "min_driver_version must look like 570"),
    ({"min_gpus": 0}, "min_gpus must be a whole number >= 1"),
    ({"min_gpus": 4, "max_gpus": 2}, "max_gpus 2 is below min_gpus 4"),
    ({"vram_min_gb": 150, "vram_max_gb": 130}, "vram_min_gb 150 is above vram_max_gb 130"),
    ({"allow_bids": "maybe"}, "allow_bids must be true or false"),
])
def test_it_rejects_bad_values_with_a_message_naming_the_field(data, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OfferFilters.from_dict(data)


def test_it_rejects_a_non_mapping():
    with pytest.raises(ValueError, match="filters must be a mapping"):
        OfferFilters.from_dict(["max_usd_per_hour"])


@pytest.mark.parametrize("field, words", [
    ("disk_gb", "disk unknown"), ("inet_down_mbps", "downlink unknown"), ("inet_up_mbps", "uplink unknown"),
    ("reliability", "reliability unknown"), ("cuda_max", "CUDA unknown"),
])
def test_it_takes_a_nan_field_as_unknown_instead_of_letting_it_pass(field, words):
    # NaN compares false with everything, so "disk < 250" never fires: a listing that says NaN said nothing.
    assert reasons(make_offer(**{field: float("nan")})) == (words,)


def test_the_ranking_stops_at_the_first_failed_filter_and_the_reasons_name_them_all():
    check = compile_filters(OfferFilters(), Workload())
    bad = make_offer(num_gpus=2, disk_gb=10.0, reliability=0.5)
    assert check.first_failed(bad) and check.first_failed(bad) & check.mask(bad) == check.first_failed(bad)
    assert check.reasons(bad, check.mask(bad)) == ("2 GPUs, need exactly 1", "disk 10 GB < 250",
                                                    "reliability 0.5 < 0.95")
    assert check.first_failed(make_offer()) == check.mask(make_offer()) == 0
