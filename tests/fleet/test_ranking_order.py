"""rank_offers on a fixed small catalogue: what comes first, what is excluded and why."""

import json
import random
from decimal import Decimal

import pytest

from fleet.providers.records import OfferRecord
from fleet.ranking import (
    Exclusion,
    OfferFilters,
    Phase,
    RankedOffer,
    Workload,
    rank_offers,
)

from .reference_ranking import ALL_FILTERS_OFF, reference_ranking


def make_offer(offer_id, **changes) -> OfferRecord:
    values = dict(
        provider="vast", offer_id=offer_id, machine_id=f"m-{offer_id}", host_id=f"h-{offer_id}",
        gpu_name="RTX PRO 6000 WS", num_gpus=1, gpu_ram_gb=96.0, compute_capability=120, cuda_max=12.8,
        driver_version="570.124.06", disk_gb=500.0, inet_up_mbps=800.0, inet_down_mbps=1500.0,
        inet_up_usd_per_gb=Decimal("0.005"), inet_down_usd_per_gb=Decimal("0.005"),
        storage_usd_per_gb_month=Decimal("0.10"), gpu_usd_per_hour=Decimal("1.10"),
        total_usd_per_hour=Decimal("1.13"), min_bid_usd_per_hour=None, reliability=0.99, verified=True,
        rentable=True, is_bid=False, geolocation="Sweden, SE", dlperf=None, total_flops=500.0,
    )
    values.update(changes)
    return OfferRecord(**values)


def h200(offer_id, **changes):
    return make_offer(offer_id, gpu_name="H200", gpu_ram_gb=141.0, compute_capability=90, total_flops=990.0,
                      **changes)


CATALOGUE = [
    # the cheapest listing of all, on a driver too old for the image's CUDA 12.8 (error 803 after renting)
    make_offer("pro-old-driver", gpu_usd_per_hour=Decimal("0.85"), total_usd_per_hour=Decimal("0.88"),
               driver_version="535.129.03", cuda_max=12.2),
    make_offer("pro-steady"),
    # 3% cheaper than pro-steady, at the bottom of the reliability floor
    make_offer("pro-flaky", gpu_usd_per_hour=Decimal("1.067"), total_usd_per_hour=Decimal("1.096"), reliability=0.95),
    h200("h200-cheap", gpu_usd_per_hour=Decimal("1.20"), total_usd_per_hour=Decimal("1.24")),
    # Europe on an expensive day; its interruptible twin is listed separately
    h200("h200-eu", gpu_usd_per_hour=Decimal("2.90"), total_usd_per_hour=Decimal("2.93"),
         min_bid_usd_per_hour=Decimal("1.00")),
    h200("h200-eu", gpu_usd_per_hour=Decimal("0.97"), total_usd_per_hour=Decimal("1.00"), is_bid=True),
    make_offer("pro-slow-uplink", gpu_usd_per_hour=Decimal("1.00"), total_usd_per_hour=Decimal("1.03"),
               inet_up_mbps=120.0),
    # fits the RTX PRO 6000 tier on memory, never measured: ranked on an estimate
    make_offer("h100-nvl", gpu_name="H100 NVL", gpu_ram_gb=94.0, compute_capability=90, total_flops=835.0,
               gpu_usd_per_hour=Decimal("1.25"), total_usd_per_hour=Decimal("1.28")),
    make_offer("h100-80", gpu_name="H100 SXM", gpu_ram_gb=80.0, compute_capability=90, total_flops=990.0,
               gpu_usd_per_hour=Decimal("1.05"), total_usd_per_hour=Decimal("1.08")),
]


def ids(entries):
    return [e.offer.offer_id + ("/bid" if e.offer.is_bid else "") for e in entries]


def test_it_ranks_the_passing_offers_by_steps_per_dollar():
    ranking = rank_offers(CATALOGUE, Workload(), OfferFilters())
    # H100 NVL has no calibration: its estimate (835 listed TFLOPS at the ratio the calibrated offers in this
    # catalogue show, discounted) still beats the RTX PRO 6000's measured Triton speed at a similar price
    assert ids(ranking.entries) == ["h200-cheap", "h100-nvl", "pro-steady", "pro-flaky"]
    assert [e.rank for e in ranking.entries] == [1, 2, 3, 4]
    scores = [e.steps_per_usd for e in ranking.entries]
    assert scores == sorted(scores, reverse=True)


def test_it_excludes_the_cheap_old_driver_host_with_its_reasons():
    ranking = rank_offers(CATALOGUE, Workload(), OfferFilters())
    old = ranking.find("pro-old-driver")
    assert isinstance(old, Exclusion)
    assert old.reasons == ("driver 535.129.03 < needed 570", "CUDA 12.2 < needed 12.8")


def test_it_excludes_the_expensive_h200_by_the_cap_and_the_bid_by_default():
    ranking = rank_offers(CATALOGUE, Workload(), OfferFilters())
    assert ranking.find("h200-eu", is_bid=False).reasons == ("$2.935/h > cap $1.30/h",)
    assert ranking.find("h200-eu", is_bid=True).reasons == ("interruptible (bid) offer; bids not allowed",)
    assert ranking.find("pro-slow-uplink").reasons == ("uplink 120 Mb/s < 200",)
    assert ranking.find("h100-80").reasons == (
        "VRAM 80 GB outside the RTX PRO 6000 (90-100 GB), H200 (130-150 GB), B200 (170-190 GB) tiers",
    )
    assert len(ranking.entries) + len(ranking.excluded) == len(CATALOGUE)


def test_it_does_not_rank_a_low_reliability_host_first_for_being_3_percent_cheaper():
    steady, flaky = CATALOGUE[1], CATALOGUE[2]
    assert flaky.total_usd_per_hour < steady.total_usd_per_hour * Decimal("0.975")
    ranking = rank_offers([flaky, steady], Workload(), OfferFilters())
    assert ids(ranking.entries) == ["pro-steady", "pro-flaky"]
    first, second = ranking.entries
    assert second.projection.expected_restarts > 4 * first.projection.expected_restarts
    assert second.total_usd > first.total_usd
    assert any("expected restarts" in line for line in second.why)


def test_it_includes_and_flags_a_bid_when_bids_are_allowed():
    ranking = rank_offers(CATALOGUE, Workload(), OfferFilters(allow_bids=True))
    bid = ranking.find("h200-eu", is_bid=True)
    assert isinstance(bid, RankedOffer)
    assert bid.interruptible
    assert any("interruptible (bid)" in line for line in bid.why)
    assert not ranking.find("h200-cheap").interruptible
    # reclaims are priced: the bid expects far more restarts than its on-demand peer
    assert bid.projection.expected_restarts > 10 * ranking.find("h200-cheap").projection.expected_restarts


def test_it_marks_an_estimated_throughput_and_shows_the_run_it_projects():
    ranking = rank_offers(CATALOGUE, Workload(), OfferFilters())
    estimated = ranking.find("h100-nvl")
    assert estimated.estimated and any("estimate" in line for line in estimated.why)
    best = ranking.entries[0]
    assert not best.estimated and best.kernel_path == "grouped_mm"
    # 5,000 steps x 32,768 tokens at the seeded 2,300 tok/s: about 19.8 h of steps, plus start-up and uploads
    assert 19.8 < best.wall_hours < 21.5
    assert isinstance(best.total_usd, Decimal) and Decimal("20") < best.total_usd < Decimal("35")
    assert best.tokens_per_usd == best.steps_per_usd * Workload().tokens_per_step


def test_it_changes_the_list_when_the_filters_change():
    no_cap = rank_offers(CATALOGUE, Workload(), OfferFilters(max_usd_per_hour=None, min_inet_up_mbps=100))
    assert "h200-eu" in ids(no_cap.entries) and "pro-slow-uplink" in ids(no_cap.entries)
    only_h200 = rank_offers(CATALOGUE, Workload(), OfferFilters(gpu_tiers=["h200"]))
    assert ids(only_h200.entries) == ["h200-cheap"]


def test_it_serialises_for_the_command_line():
    data = rank_offers(CATALOGUE, Workload(), OfferFilters()).to_dict(limit=2)
    text = json.dumps(data)
    assert [r["offer_id"] for r in data["ranked"]] == ["h200-cheap", "h100-nvl"]
    assert {"offer_id": "pro-old-driver", "provider": "vast", "is_bid": False,
            "reasons": ["driver 535.129.03 < needed 570", "CUDA 12.2 < needed 12.8"]} in data["excluded"]
    assert '"total_usd": "' in text


def test_it_handles_an_empty_catalogue_and_an_unmeasurable_offer():
    assert rank_offers([], Workload(), OfferFilters()).entries == ()
    blind = make_offer("blind", gpu_name="Mystery", total_flops=None, dlperf=None)
    ranking = rank_offers([blind], Workload(), OfferFilters())
    assert ranking.find("blind").reasons == (
        "no throughput figure: Mystery has no calibration and the listing has no TFLOPS or DLPerf",)


def test_it_is_deterministic_for_equal_scores():
    twins = [make_offer("b"), make_offer("a")]
    assert ids(rank_offers(twins, Workload(), OfferFilters()).entries) == ["a", "b"]


# A seeded catalogue of a few hundred offers for comparing rank_offers with the reference ranking
# (reference_ranking.py): every GPU family (calibrated, estimated from TFLOPS or DLPerf, or not measurable at all),
# bids, free traffic, free boxes, dead links, hosts that never stay up, and exact twins whose scores tie.
GPUS = [  # name, GB per GPU, compute capability, listed TFLOPS per GPU
    ("RTX 4090", 24, 89, 165), ("A100 SXM4", 80, 80, 312), ("H100 SXM", 80, 90, 990), ("H100 NVL", 94, 90, 835),
    ("RTX PRO 6000 WS", 96, 120, 500), ("NVIDIA H200 NVL", 141, 90, 835), ("H200", 141, 90, 990),
    ("B200", 180, 100, 2250), ("Mystery", 96, 120, 400),
]


def seeded_catalogue(count=400, seed=7) -> list[OfferRecord]:
    rng = random.Random(seed)
    offers = []
    for i in range(count):
        name, ram, cc, tflops = rng.choice(GPUS)
        n = rng.choice((1, 1, 1, 2, 4, 8))
        gpu_usd = Decimal(f"{rng.uniform(0.3, 3.0) * n:.4f}")
        storage = Decimal(rng.choice(("0.05", "0.10", "0.2500")))
        values = dict(
            provider=rng.choice(("vast", "runpod")), offer_id=str(1000 + i), machine_id=f"m{i}", host_id=f"h{i}",
            gpu_name=name, num_gpus=n, gpu_ram_gb=float(ram), compute_capability=cc, cuda_max=12.8,
            driver_version=rng.choice(("570.124.06", "535.129.03", "")), disk_gb=float(rng.choice((100, 250, 500))),
            inet_up_mbps=round(rng.lognormvariate(6.0, 0.9), 1), inet_down_mbps=round(rng.lognormvariate(6.6, 0.8), 1),
            inet_up_usd_per_gb=Decimal(rng.choice(("0", "0.005", "0.02"))),
            inet_down_usd_per_gb=Decimal(rng.choice(("0", "0.0050", "0.01"))),
            storage_usd_per_gb_month=storage, gpu_usd_per_hour=gpu_usd,
            total_usd_per_hour=gpu_usd + storage * 250 / 720, min_bid_usd_per_hour=None,
            reliability=round(min(1.0, rng.betavariate(40, 1.2)), 4), verified=rng.random() < 0.7,
            rentable=rng.random() < 0.95, is_bid=rng.random() < 0.3,
            geolocation=rng.choice(("Sweden, SE", "Texas, US")),
            dlperf=round(tflops * n * 0.2, 1) if rng.random() < 0.8 else None,
            total_flops=round(tflops * n * rng.uniform(0.9, 1.05), 1) if rng.random() < 0.7 else None,
        )
        kind = rng.random()
        if kind < 0.03:
            values.update(inet_down_mbps=0.0)  # the model download never finishes
        elif kind < 0.06:
            values.update(inet_up_mbps=0.0)  # checkpoints never upload
        elif kind < 0.09:
            values.update(reliability=0.0)
        elif kind < 0.12:
            values.update(reliability=1.0)
        elif kind < 0.14:  # a free box: no GPU, disk or traffic price at all
            values.update(gpu_usd_per_hour=Decimal(0), total_usd_per_hour=Decimal(0),
                          storage_usd_per_gb_month=Decimal(0), inet_up_usd_per_gb=Decimal(0),
                          inet_down_usd_per_gb=Decimal(0))
        elif kind < 0.16:
            values.update(gpu_usd_per_hour=None)  # priced on the total alone
        offers.append(OfferRecord(**values))
        if kind > 0.95:  # an exact twin under another id: equal score and total, ordered by id
            offers.append(OfferRecord(**{**values, "offer_id": str(9000 + i)}))
    return offers


@pytest.mark.parametrize("recipe, filters", [
    (Workload(vram_needed_gb=1), OfferFilters(**ALL_FILTERS_OFF)),
    (Workload(), OfferFilters(allow_bids=True, max_usd_per_hour=None, max_gpus=None, min_inet_up_mbps=0)),
    (Workload(vram_needed_gb=1, kernel_path="triton", phases=(Phase("sft", 3),)), OfferFilters(**ALL_FILTERS_OFF)),
])
def test_it_ranks_a_seeded_catalogue_exactly_as_the_reference_ranking(recipe, filters):
    offers = seeded_catalogue()
    ranking = rank_offers(offers, recipe, filters)
    expected, expected_excluded = reference_ranking(offers, recipe, filters)
    assert len(expected) > 40  # the comparison covers a real list, not an empty one
    assert [(e.offer, e.rank) for e in ranking.entries] == [(row[0], rank) for rank, row in enumerate(expected, 1)]
    for entry, (_offer, score, tokens_per_usd, t, p, cost) in zip(ranking.entries, expected, strict=True):
        # exact equality: the fast paths must give the very same floats, not close ones
        assert (entry.steps_per_usd, entry.tokens_per_usd) == (score, tokens_per_usd)
        assert entry.throughput == t
        assert entry.projection == p
        assert entry.cost == cost
        assert entry.total_usd == cost.total_usd
    assert [(x.offer, x.reasons) for x in ranking.excluded] == expected_excluded
    assert ranking.to_dict() == rank_offers(offers, recipe, filters).to_dict()  # deterministic, why lines included


def test_its_entries_read_like_a_tuple_best_first_whatever_is_read_first():
    ranking = rank_offers(seeded_catalogue(), Workload(vram_needed_gb=1), OfferFilters(**ALL_FILTERS_OFF))
    entries = ranking.entries
    fifth, last = entries[4], entries[-1]  # read before the rest
    assert entries[2:6][2] is fifth and entries[::-1][0] is last
    every = list(entries)
    assert [e.rank for e in every] == list(range(1, len(entries) + 1)) and every[4] is fifth and every[-1] is last
    assert entries == tuple(every) and entries[:] == tuple(every) and [e for e in entries] == every
    assert ranking.to_dict(limit=3)["ranked"] == ranking.to_dict()["ranked"][:3]
    with pytest.raises(IndexError):
        entries[len(entries)]


def test_the_seeded_catalogue_reaches_every_path_it_is_there_to_check():
    offers = seeded_catalogue()
    ranking = rank_offers(offers, Workload(vram_needed_gb=1), OfferFilters(**ALL_FILTERS_OFF))
    reasons = {reason for x in ranking.excluded for reason in x.reasons}
    assert any(r.startswith("no throughput figure") for r in reasons)
    assert any(r.startswith("downlink 0 Mb/s") for r in reasons) and any(r.startswith("uplink 0") for r in reasons)
    assert any(r.startswith("reliability 0:") for r in reasons)
    assert {e.estimated for e in ranking.entries} == {True, False}
    scores = [e.steps_per_usd for e in ranking.entries]
    assert len(set(scores)) < len(scores)  # ties, so the tie order is exercised
    assert 0.0 in scores  # a free box
