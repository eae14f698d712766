"""rank_offers' fast paths (every filter in one function that stops at the first failed, the calibration once per GPU
model, throughput estimates and the float totals as numpy columns, a sort on the float score, RankedOffers and words
and money made when read, no cyclic collection meanwhile) against the same ranking worked out offer by offer, on
catalogues with junk in every field and under several filter settings."""

import gc
import math
import random
from dataclasses import replace
from decimal import Decimal

import pytest

from fleet.providers.records import OfferRecord
from fleet.ranking import (
    OfferFilters,
    Workload,
    compile_filters,
    rank_offers,
)

from .reference_ranking import ALL_FILTERS_OFF, reference_ranking

GPUS = [  # name, GB per GPU, compute capability, listed TFLOPS per GPU
    ("RTX 4090", 24, 89, 165), ("H100 NVL", 94, 90, 835), ("RTX PRO 6000 WS", 96, 120, 500), ("H200", 141, 90, 990),
    ("H200 NVL", 141, 90, 835), ("B200", 180, 100, 2250), ("Mystery", 96, 120, 400),
]
# What a listing, or a row stored before such values were refused, may hold where a number belongs.
JUNK = {
    "gpu_ram_gb": (None, 0.0, math.nan, math.inf, "96"),
    "num_gpus": (0, None),
    "cuda_max": (None, math.nan, 0.0),
    "disk_gb": (None, math.nan, -math.inf),
    "inet_down_mbps": (None, math.nan, 0.0),
    "inet_up_mbps": (None, math.inf, 0.0),
    "reliability": (None, math.nan, 0.0, 1.0),
    "driver_version": ("", "bogus", None),
    "geolocation": ("", None),
    "gpu_usd_per_hour": (None, Decimal("NaN"), Decimal(0)),
    "total_usd_per_hour": (Decimal("Infinity"), 1.5),
    "storage_usd_per_gb_month": (Decimal("NaN"), None),
    "inet_down_usd_per_gb": (Decimal("-Infinity"),),
    "inet_up_usd_per_gb": ("0.01",),
}


def catalogue(count: int, seed: int, junk_share: float) -> list[OfferRecord]:
    rng = random.Random(seed)
    offers = []
    for i in range(count):
        name, ram, cc, tflops = rng.choice(GPUS)
        n = rng.choice((1, 1, 1, 2, 4, 8))
        gpu_usd = Decimal(f"{rng.uniform(0.3, 3.0) * n:.4f}")
        storage = Decimal(rng.choice(("0.05", "0.10", "0.2500")))
        values = dict(
            provider=rng.choice(("vast", "runpod")), offer_id=str(1000 + i), machine_id=f"m{i}", host_id=f"h{i}",
            gpu_name=name, num_gpus=n, gpu_ram_gb=float(ram), compute_capability=cc,
            cuda_max=rng.choice((12.2, 12.8, 13.0)), driver_version=rng.choice(("570.124.06", "535.129.03")),
            disk_gb=float(rng.choice((100, 250, 500))), inet_up_mbps=round(rng.lognormvariate(6.0, 0.9), 1),
            inet_down_mbps=round(rng.lognormvariate(6.6, 0.8), 1),
            inet_up_usd_per_gb=Decimal(rng.choice(("0", "0.005", "0.02"))),
            inet_down_usd_per_gb=Decimal(rng.choice(("0", "0.0050", "0.01"))),
            storage_usd_per_gb_month=storage, gpu_usd_per_hour=gpu_usd,
            total_usd_per_hour=gpu_usd + storage * 250 / 720, min_bid_usd_per_hour=None,
            reliability=round(min(1.0, rng.betavariate(40, 1.2)), 4), verified=rng.random() < 0.7,
            rentable=rng.random() < 0.95, is_bid=rng.random() < 0.3,
            geolocation=rng.choice(("Sweden, SE", "Texas, US", "Japan, JP")),
            dlperf=round(tflops * n * 0.2, 1) if rng.random() < 0.8 else None,
            total_flops=round(tflops * n * rng.uniform(0.9, 1.05), 1) if rng.random() < 0.7 else None,
        )
        if rng.random() < junk_share:
            field = rng.choice(sorted(JUNK))
            values[field] = rng.choice(JUNK[field])
        offers.append(OfferRecord(**values))
        if rng.random() < 0.03:  # an exact twin under another id: equal score and total, ordered by id
            offers.append(OfferRecord(**{**values, "offer_id": str(90000 + i)}))
    return offers


SETTINGS = [
    pytest.param(Workload(), OfferFilters(), id="defaults"),
    pytest.param(Workload(vram_needed_gb=1), OfferFilters(**ALL_FILTERS_OFF), id="every-filter-off"),
    pytest.param(Workload(), OfferFilters(allow_bids=True, max_usd_per_hour=None, max_gpus=None, min_inet_up_mbps=0,
                                        locations=["EU", "US"], require_verified=True), id="locations-verified"),
    pytest.param(Workload(kernel_path="triton"), OfferFilters(gpu_tiers="any", vram_min_gb=90, max_gpus=4, min_gpus=2,
                                                            allow_bids=True, max_usd_per_hour=None),
                 id="vram-range-gpu-count"),
]


@pytest.mark.parametrize("junk_share", [0.0, 0.3], ids=["clean", "junk"])
@pytest.mark.parametrize("recipe, filters", SETTINGS)
def test_it_ranks_a_varied_catalogue_exactly_as_the_ranking_worked_out_offer_by_offer(recipe, filters, junk_share):
    offers = catalogue(1500, seed=5, junk_share=junk_share)
    ranking = rank_offers(offers, recipe, filters)
    expected, expected_excluded = reference_ranking(offers, recipe, filters)
    assert len(expected) >= 5 and len(expected_excluded) >= 30  # both sides of the comparison hold something
    assert [(e.offer, e.rank) for e in ranking.entries] == [(row[0], rank) for rank, row in enumerate(expected, 1)]
    for entry, (_offer, score, tokens_per_usd, t, p, cost) in zip(ranking.entries, expected, strict=True):
        assert (entry.steps_per_usd, entry.tokens_per_usd) == (score, tokens_per_usd)  # the very same floats
        assert (entry.throughput, entry.projection, entry.cost) == (t, p, cost)
    assert [(x.offer, x.reasons) for x in ranking.excluded] == expected_excluded


@pytest.mark.parametrize("recipe, filters", SETTINGS)
def test_the_first_failed_filter_is_the_first_reason_the_offer_reads(recipe, filters):
    compiled = compile_filters(filters, recipe)
    offers = catalogue(1500, seed=5, junk_share=0.3)
    masks = [compiled.mask(o) for o in offers]
    assert sum(bin(m).count("1") > 1 for m in masks) > 10  # offers failing several filters
    assert [compiled.first_failed(o) for o in offers] == [m & -m for m in masks]


def test_it_ranks_runs_that_cost_nothing_or_less_last_the_cheapest_first():
    # a credit on the box (a negative price) makes a run cost less than nothing: it scores 0, as a free one does
    offers = catalogue(300, seed=11, junk_share=0.0)
    for i in range(0, 300, 7):
        o = offers[i]
        credit = Decimal(-(i % 3)) / 4
        offers[i] = replace(o, gpu_usd_per_hour=credit, total_usd_per_hour=credit, inet_up_usd_per_gb=Decimal(0),
                            inet_down_usd_per_gb=Decimal(0), storage_usd_per_gb_month=Decimal(0))
    recipe, filters = Workload(vram_needed_gb=1), OfferFilters(**ALL_FILTERS_OFF)
    ranking = rank_offers(offers, recipe, filters)
    expected, _ = reference_ranking(offers, recipe, filters)
    assert [(e.offer, e.steps_per_usd) for e in ranking.entries] == [(row[0], row[1]) for row in expected]
    nothing = [e for e in ranking.entries if e.steps_per_usd == 0]
    assert nothing == list(ranking.entries)[-len(nothing):] and len({e.total_usd for e in nothing}) > 5
    assert [e.total_usd for e in nothing] == sorted(e.total_usd for e in nothing) and nothing[0].total_usd < 0


def test_the_junk_catalogue_reaches_the_paths_it_is_there_to_check():
    offers = catalogue(600, seed=5, junk_share=0.3)
    ranking = rank_offers(offers, Workload(vram_needed_gb=1), OfferFilters(**ALL_FILTERS_OFF))
    reasons = {reason for x in ranking.excluded for reason in x.reasons}
    assert {"VRAM unknown", "disk unknown", "GPU count unknown", "reliability unknown"} <= reasons
    assert any(r.endswith("price unknown") for r in reasons) and any(r.startswith("no throughput") for r in reasons)
    assert any(r.startswith("downlink 0 Mb/s") for r in reasons)
    scores = [e.steps_per_usd for e in ranking.entries]
    assert len(set(scores)) < len(scores)  # twins tie, so the tie order is exercised


@pytest.mark.parametrize("enabled", [True, False])
def test_it_leaves_cyclic_garbage_collection_as_it_found_it(enabled):
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        rank_offers(catalogue(50, seed=3, junk_share=0.3), Workload(), OfferFilters())
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
