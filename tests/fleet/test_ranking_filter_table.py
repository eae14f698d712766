"""Every entry of the filter table is whole: a crafted offer that it alone excludes, with its own words, its switch,
and its heading on the Offers page. A filter added to FILTERS without a case here fails the first test."""

import math
from dataclasses import dataclass, field
from decimal import Decimal

import pytest

from fleet.offers.exclusions import HEADINGS
from fleet.ranking import OfferFilters, Workload, compile_filters
from fleet.ranking.filters import BITS, FILTERS, Filter
from fleet.ranking.filters.compiled import _check_table

from .offer_records import offer_record


@dataclass(frozen=True)
class Case:
    offer: dict  # changes to offer_record, which passes the default filters
    reason: str
    filters: dict = field(default_factory=dict)
    recipe: Workload = field(default_factory=Workload)
    off: dict | None = None  # settings that turn the filter off: the same offer then passes
    passing: dict = field(default_factory=dict)  # changes to offer_record for an offer these settings pass


EU = {"locations": ["EU"]}
CASES = {
    "rentable": Case({"rentable": False}, "not rentable"),
    "bids": Case({"is_bid": True}, "interruptible (bid) offer; bids not allowed", off={"allow_bids": True}),
    "gpus_unknown": Case({"num_gpus": 0}, "GPU count unknown"),
    "gpus_needed": Case({"num_gpus": 1}, "1 GPU < the 2 the recipe trains on", recipe=Workload(gpus=2),
                        passing={"num_gpus": 2}),
    "gpu_count": Case({"num_gpus": 2}, "2 GPUs, need exactly 1", off={"max_gpus": None}),
    "vram_unknown": Case({"gpu_ram_gb": math.nan}, "VRAM unknown"),
    "vram_range": Case({"gpu_ram_gb": 120.0}, "VRAM 120 GB outside the RTX PRO 6000 (90-100 GB), H200 (130-150 GB), "
                                              "B200 (170-190 GB) tiers", off={"gpu_tiers": "any"}),
    "vram_needed": Case({"gpu_ram_gb": 75.0}, "VRAM 75 GB < needed 77 GB for Qwen3.6-35B-A3B",
                        filters={"gpu_tiers": "any"}),
    # an 80 GB card whose only plan for 35B-A3B keeps the moments (28.1 GiB) on the host, 8 GiB beside them
    "host_ram_needed": Case({"gpu_ram_gb": 79.6, "cpu_ram_gb": 32.0}, "host memory 32 GB < needed 36.1 GB for "
                            "Qwen3.6-35B-A3B (checkpointing, moments on the host and bf16 factors)",
                            filters={"gpu_tiers": "any"}, passing={"gpu_ram_gb": 79.6, "cpu_ram_gb": 64.0}),
    "price_unknown": Case({"storage_usd_per_gb_month": None}, "storage price unknown"),
    # the rental's price: the machine and 250 GB of disk at $0.15 per GB-month
    "price_cap": Case({"gpu_usd_per_hour": Decimal("2.93")}, "$2.982/h > cap $1.30/h", off={"max_usd_per_hour": None}),
    "driver_unknown": Case({"driver_version": "n/a"}, "driver unknown ('n/a')", off={"min_driver_version": ""}),
    "driver_old": Case({"driver_version": "535.129.03"}, "driver 535.129.03 < needed 570",
                       off={"min_driver_version": ""}),
    "cuda_unknown": Case({"cuda_max": None}, "CUDA unknown", off={"min_cuda": 0}),
    "cuda_old": Case({"cuda_max": 12.2}, "CUDA 12.2 < needed 12.8", off={"min_cuda": 0}),
    "disk_unknown": Case({"disk_gb": math.nan}, "disk unknown"),
    "disk": Case({"disk_gb": 100.0}, "disk 100 GB < 250", off={"min_disk_gb": 0}),
    "downlink_unknown": Case({"inet_down_mbps": None}, "downlink unknown"),
    "downlink": Case({"inet_down_mbps": 100.0}, "downlink 100 Mb/s < 250", off={"min_inet_down_mbps": 0}),
    "uplink_unknown": Case({"inet_up_mbps": math.inf}, "uplink unknown"),
    "uplink": Case({"inet_up_mbps": 120.0}, "uplink 120 Mb/s < 200", off={"min_inet_up_mbps": 0}),
    "location_unknown": Case({"geolocation": ""}, "location unknown", filters=EU, off={"locations": []}),
    "location": Case({"geolocation": "Texas, US"}, "location US not in EU", filters=EU, off={"locations": "any"}),
    "location_excluded": Case({"geolocation": "Texas, US"}, "location US is excluded (NA)",
                              filters={"excluded_locations": ["NA"]}, off={"excluded_locations": []}),
    "reliability_unknown": Case({"reliability": None}, "reliability unknown"),
    "reliability": Case({"reliability": 0.9}, "reliability 0.9 < 0.95", off={"min_reliability": 0}),
    "verified": Case({"verified": False}, "not verified", filters={"require_verified": True},
                     off={"require_verified": False}),
    "datacenter": Case({"datacenter": False}, "not a datacenter host", filters={"datacenter_only": True},
                       off={"datacenter_only": False}, passing={"datacenter": True}),
    "gpu_mem_bw": Case({"gpu_mem_bw_gb_s": 1500.0}, "GPU memory 1500 GB/s < 3000",
                       filters={"min_gpu_mem_bw_gb_s": 3000}, off={"min_gpu_mem_bw_gb_s": 0},
                       passing={"gpu_mem_bw_gb_s": 4800.0}),
}


def test_every_filter_has_a_crafted_offer_here():
    assert list(CASES) == [f.name for f in FILTERS]


@pytest.mark.parametrize("entry", FILTERS, ids=lambda f: f.name)
def test_each_filter_alone_excludes_its_crafted_offer_in_its_own_words(entry):
    case = CASES[entry.name]
    check = compile_filters(OfferFilters(**case.filters), case.recipe)
    offer = offer_record("1", **case.offer)
    assert check.first_failed(offer) == check.mask(offer) == BITS[entry.name]
    assert check.check(offer) == (case.reason,)
    assert check.check(offer_record("1", **case.passing)) == ()
    if case.off is not None:
        assert compile_filters(OfferFilters(**{**case.filters, **case.off}), case.recipe).check(offer) == ()


def test_each_filter_heads_its_own_group_on_the_offers_page():
    headings = [f.heading for f in FILTERS]
    assert all(headings) and len(set(headings)) == len(headings)
    assert [HEADINGS[BITS[f.name]] for f in FILTERS] == headings


@pytest.mark.parametrize("table", [
    (Filter("disk", "too little disk", test="disk < 1", words=str, given="disk_unknown"),),
    (Filter("a", "a", test="not o.a", words=str), Filter("b", "b", test="not o.b", words=str),
     Filter("c", "c", test="o.c", words=str, given="a")),
    (Filter("a", "a", test="o.a <", words=str),),
], ids=["given-nothing", "given-not-right-above", "not-an-expression"])
def test_a_malformed_entry_is_refused_when_the_table_is_read(table):
    with pytest.raises((ValueError, SyntaxError)):
        _check_table(table)
