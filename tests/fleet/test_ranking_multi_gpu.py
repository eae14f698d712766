"""Ranking for a recipe on several GPUs of one box: the GPU count it needs, the VRAM its model needs spread over
them, NVLink before PCIe, and the whole box's price against the GPUs the recipe trains on."""

from dataclasses import replace
from decimal import Decimal

import pytest

from fleet.offers.forms import RankingForm
from fleet.providers.records import OfferRecord
from fleet.providers.vast import parse_offer
from fleet.ranking import PRESETS, OfferFilters, Workload, exclusion_reasons, rank_offers
from fleet.ranking.workload import SHAPES
from fleet.ranking.throughput import PCIE_ALL_TO_ALL_FACTOR

ANY_BOX = OfferFilters(max_usd_per_hour=None, max_gpus=None)


def box(offer_id, num_gpus, *, per_gpu_usd="1.20", nvlink_gb_s=900.0, **changes) -> OfferRecord:
    """An H200 box that passes every default filter but its price and GPU count, at `per_gpu_usd` a GPU."""
    gpu_usd = Decimal(per_gpu_usd) * num_gpus
    values = dict(
        provider="vast", offer_id=offer_id, machine_id=f"m-{offer_id}", host_id=f"h-{offer_id}", gpu_name="H200",
        num_gpus=num_gpus, gpu_ram_gb=140.4, compute_capability=90, cuda_max=12.8, driver_version="570.124.06",
        disk_gb=1500.0, inet_up_mbps=900.0, inet_down_mbps=1500.0, inet_up_usd_per_gb=Decimal("0.005"),
        inet_down_usd_per_gb=Decimal("0.005"), storage_usd_per_gb_month=Decimal("0.10"), gpu_usd_per_hour=gpu_usd,
        total_usd_per_hour=gpu_usd + Decimal("0.03"), min_bid_usd_per_hour=None, reliability=0.99, verified=True,
        rentable=True, is_bid=False, geolocation="Sweden, SE", dlperf=None, total_flops=990.0 * num_gpus,
        nvlink_gb_s=nvlink_gb_s if num_gpus > 1 else 0.0, pcie_gb_s=25.2,
    )
    return OfferRecord(**(values | changes))


def h100(offer_id, num_gpus, **changes) -> OfferRecord:
    return box(offer_id, num_gpus, gpu_name="H100 SXM", gpu_ram_gb=79.6, **changes)


def l40s(offer_id, num_gpus, **changes) -> OfferRecord:
    return box(offer_id, num_gpus, gpu_name="L40S", gpu_ram_gb=47.7, compute_capability=89, **changes)


def ranked_ids(ranking) -> list[str]:
    return [e.offer.offer_id for e in ranking.entries]


def reasons_of(ranking, offer_id) -> tuple[str, ...]:
    return ranking.find(offer_id).reasons


@pytest.mark.parametrize("gpus, passing, short", [(2, ["two", "four", "eight"], ["one"]),
                                                  (4, ["four", "eight"], ["one", "two"])])
def test_it_excludes_a_box_with_fewer_gpus_than_the_recipe_and_says_so(gpus, passing, short):
    offers = [box("one", 1), box("two", 2), box("four", 4), box("eight", 8)]
    ranking = rank_offers(offers, Workload(gpus=gpus), ANY_BOX)
    assert sorted(ranked_ids(ranking)) == sorted(passing)
    for offer_id in short:
        n = next(o.num_gpus for o in offers if o.offer_id == offer_id)
        assert reasons_of(ranking, offer_id) == (f"{n} GPU{'s' if n > 1 else ''} < the {gpus} the recipe trains on",)


def test_a_bigger_box_is_priced_whole_for_the_gpus_the_recipe_trains_on():
    two, four = box("two", 2), box("four", 4)  # the same price a GPU
    ranking = rank_offers([four, two], Workload(gpus=2), ANY_BOX)
    assert ranked_ids(ranking) == ["two", "four"]
    pair, spare = ranking.entries
    assert spare.tokens_per_s == pair.tokens_per_s  # two of its four GPUs train, the other two idle
    assert spare.cost.gpu_usd == pytest.approx(2 * pair.cost.gpu_usd, rel=Decimal("0.001"))  # and all four bill
    assert spare.steps_per_usd < 0.6 * pair.steps_per_usd
    assert "2 of 4 GPUs at 85% each" in spare.throughput.source
    assert any(line.startswith("$4.80/h listed for the whole box (4 GPUs)") for line in spare.why)


def test_the_default_cap_of_one_gpu_reads_as_none_to_spare_for_a_recipe_on_several():
    ranking = rank_offers([box("two", 2), box("four", 4)], Workload(gpus=2), OfferFilters(max_usd_per_hour=None))
    assert ranked_ids(ranking) == ["two"]
    assert reasons_of(ranking, "four") == ("4 GPUs > the recipe's 2 (max GPUs 1 reads as no GPU to spare)",)
    ranking = rank_offers([box("two", 2), box("four", 4)], Workload(gpus=2),
                          OfferFilters(max_usd_per_hour=None, max_gpus=4))
    assert ranked_ids(ranking) == ["two", "four"]


def test_the_price_cap_is_on_the_whole_box():
    ranking = rank_offers([box("two", 2)], Workload(gpus=2), OfferFilters(max_gpus=None))
    assert reasons_of(ranking, "two") == ("$2.435/h > cap $1.30/h",)


def test_it_prefers_nvlink_over_pcie_even_when_pcie_lists_for_less():
    nvlink = box("nvlink", 2)
    pcie = box("pcie", 2, per_gpu_usd="0.80", nvlink_gb_s=0.0)  # a third cheaper
    ranking = rank_offers([pcie, nvlink], Workload(gpus=2), ANY_BOX)
    assert ranked_ids(ranking) == ["nvlink", "pcie"]
    fast, slow = ranking.entries
    assert slow.tokens_per_s == pytest.approx(fast.tokens_per_s * PCIE_ALL_TO_ALL_FACTOR)
    assert "no NVLink: x0.5 for the expert all-to-all over PCIe" in slow.why[0]
    assert (fast.interconnect, slow.interconnect) == ("NVLink 900 GB/s", "PCIe 25.2 GB/s")


def test_the_interconnect_moves_nothing_for_a_recipe_on_one_gpu():
    offers = [box("nvlink", 2), box("pcie", 2, nvlink_gb_s=0.0)]
    ranking = rank_offers(offers, Workload(), ANY_BOX)
    assert [e.tokens_per_s for e in ranking.entries] == [ranking.entries[0].tokens_per_s] * 2
    assert all("NVLink" not in line for e in ranking.entries for line in e.why)


def test_an_interconnect_the_listing_leaves_out_is_not_taken_for_pcie_and_says_so():
    told, untold = box("told", 2), box("untold", 2, nvlink_gb_s=None, pcie_gb_s=None)
    ranking = rank_offers([told, untold], Workload(gpus=2), ANY_BOX)
    assert ranking.entries[0].tokens_per_s == ranking.entries[1].tokens_per_s
    assert ranking.find("untold").interconnect == "unlisted"
    assert "interconnect not listed" in ranking.find("untold").why[0]


def test_the_models_weights_are_spread_over_the_recipes_gpus():
    model = PRESETS["qwen3-235b-a22b"]  # 470 GB of BF16 weights
    # Each GPU: 109.4 GiB of weights, 18.4 of LoRA state, checkpointing (training/memory_plan.py): 135.4 GB listed.
    assert (model.gpus, model.vram_gb, model.vram_total_gb) == (4, 135.4, 541.6)
    offers = [box("h200x4", 4), h100("h100x4", 4), h100("h100x8", 8), box("h200x1", 1)]
    ranking = rank_offers(offers, model, ANY_BOX)
    assert ranked_ids(ranking) == ["h200x4"]
    assert reasons_of(ranking, "h200x1") == ("1 GPU < the 4 the recipe trains on",)
    needed = "VRAM 4 x 79.6 GB = 318.4 GB < needed 541.6 GB for Qwen3-235B-A22B on 4 GPUs (135.4 GB each)"
    assert reasons_of(ranking, "h100x4")[-1] == needed
    assert reasons_of(ranking, "h100x8")[-1] == needed  # the recipe trains on 4 of its 8
    any_card = OfferFilters(gpu_tiers="any", max_gpus=None, max_usd_per_hour=None)
    assert exclusion_reasons(h100("h100x4", 4), any_card, model) == (needed,)
    # On eight of them it fits: 54.7 GiB of weights a GPU, and half the LoRA state.
    on_eight = replace(model, gpus=8)
    assert exclusion_reasons(h100("h100x8", 8), any_card, on_eight) == ()


def test_a_pair_of_cards_too_small_for_the_model_alone_holds_it_together():
    filters = OfferFilters(gpu_tiers="any", max_gpus=None, max_usd_per_hour=None)
    # 30B on one GPU: 56.8 GiB of weights, 4.8 of bf16 LoRA factors and gradients, checkpointing, moments on the host.
    q30 = PRESETS["qwen3-30b-a3b"]
    alone = ("VRAM 47.7 GB < needed 66.3 GB for Qwen3-30B-A3B",)
    assert exclusion_reasons(l40s("one", 1), filters, q30) == alone
    assert exclusion_reasons(l40s("pair", 2), filters, q30) == alone  # a one-GPU recipe trains on one of them
    assert exclusion_reasons(l40s("pair", 2), filters, replace(q30, gpus=2)) == ()  # half the weights and LoRA a GPU


def test_the_moe_family_figures_give_the_field_notes_adapter_size():
    # 35B-A3B's routed-expert LoRA at rank 32, float32: the 7.4 GB file of docs/field-notes.md and the default's figure.
    assert round(SHAPES["Qwen3.5-35B-A3B"].routed_adapter_gb(32), 1) == Workload().checkpoint_gb == 7.4
    assert (PRESETS["qwen3.5-35b-a3b"].model, PRESETS["qwen3.5-35b-a3b"].active_params_b) == ("Qwen3.5-35B-A3B", 3.0)
    big = PRESETS["qwen3-235b-a22b"]
    assert (big.model_download_gb, big.active_params_b, big.checkpoint_gb) == (470.0, 22.0, 19.7)


@pytest.mark.parametrize("value, words", [(0, "gpus must be a whole number from 1 to 16"),
                                          (17, "gpus must be a whole number from 1 to 16"),
                                          (1.5, "gpus must be a whole number, got 1.5")])
def test_a_recipes_gpu_count_is_checked(value, words):
    with pytest.raises(ValueError, match=words):
        Workload.from_dict({"gpus": value})
    assert Workload.from_dict({"gpus": "4"}).gpus == 4 and Workload.from_dict({}).gpus == 1


def test_the_offers_form_takes_the_gpu_count():
    data = RankingForm.data_for(Workload(gpus=4), OfferFilters())
    assert data["gpus"] == 4
    form = RankingForm(data)
    assert form.is_valid(), form.errors
    assert form.recipe.gpus == 4
    blank = RankingForm({**data, "gpus": ""})
    assert blank.is_valid() and blank.recipe.gpus == 1
    too_many = RankingForm({**data, "gpus": 17})
    assert not too_many.is_valid() and too_many.errors["gpus"] == ["At most 16."]


def test_it_reads_the_interconnect_a_vast_listing_gives():
    listing = {"id": 5, "gpu_name": "H200", "num_gpus": 4, "gpu_ram": 143771, "compute_cap": 900, "disk_space": 500,
               "inet_up": 900, "inet_down": 1500, "dph_base": 4.8, "dph_total": 4.83, "bw_nvlink": 900.0,
               "pci_gen": 5.0, "pcie_bw": 50.4}
    record = parse_offer(listing)
    assert (record.nvlink_gb_s, record.pcie_gb_s) == (900.0, 50.4)
    bare = parse_offer({k: v for k, v in listing.items() if k not in ("bw_nvlink", "pcie_bw")})
    assert (bare.nvlink_gb_s, bare.pcie_gb_s) == (None, None)


@pytest.mark.parametrize("gpus", [2, 4])
def test_offers_sharing_a_gpu_model_share_a_throughput_only_with_the_same_interconnect(gpus):
    """The ranking works a throughput out once per GPU model, count and NVLink figure: each ranked offer's is the
    one worked out for that offer alone, and its score follows from it."""
    import random

    from fleet.ranking import SEED_CALIBRATION, CostModel, ThroughputModel
    from tests.fleet.test_ranking_fast_path import catalogue

    rng = random.Random(11)
    offers = [replace(o, nvlink_gb_s=rng.choice((None, 0.0, 600.0, 900.0)), pcie_gb_s=rng.choice((None, 25.2)))
              for o in catalogue(1000, seed=9, junk_share=0.0)]
    recipe = Workload(gpus=gpus, vram_needed_gb=1)
    ranking = rank_offers(offers, recipe, OfferFilters(gpu_tiers="any", max_usd_per_hour=None, max_gpus=None,
                                                       allow_bids=True, min_reliability=0))
    speeds, costs = ThroughputModel(SEED_CALIBRATION, recipe), CostModel(recipe)
    links = {e.interconnect.split()[0] for e in ranking.entries}
    assert {"NVLink", "PCIe", "unlisted"} <= links and len(ranking.entries) > 30
    for e in ranking.entries:
        alone = speeds.calibrated(e.offer)
        if alone is not None:
            assert e.throughput == alone
        total = costs.estimate(e.offer, recipe.tokens_per_step / e.tokens_per_s, e.offer.is_bid).total_usd
        assert e.steps_per_usd == recipe.total_steps / total
    scores = [e.steps_per_usd for e in ranking.entries]
    assert scores == sorted(scores, reverse=True)
