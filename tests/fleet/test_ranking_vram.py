"""The VRAM a run's GPUs must have at its own micro-step and LoRA rank (micro_step_vram_gb): the recipe's own figure
when the run trains as the recipe says, more for more tokens a micro-step or a higher rank, and the filters exclude
the cards it would not fit on. For the models the memory plan knows, it is the plan's least card
(tests/fleet/test_ranking_memory_plan.py); the rule of thumb here holds for the others and for stated figures."""

from dataclasses import replace
from decimal import Decimal

import pytest

from fleet.ranking import PRESETS, OfferFilters, Workload, exclusion_reasons, memory, micro_step_vram_gb
from fleet.ranking.workload import ACTIVATION_BYTES, ADAPTER_STATE_BYTES, CALIBRATION_MODEL, SHAPES
from tests.fleet.test_ranking_multi_gpu import box

UNLISTED = Workload(model="unlisted-MoE")  # a shape the memory plan does not know: 70 GB of weights + 15
RECIPES = [UNLISTED, replace(PRESETS["qwen3-30b-a3b"], model="unlisted-30B"), replace(UNLISTED, gpus=2),
           replace(UNLISTED, batch_size=4, seq_len=1024, lora_rank=16), Workload(vram_needed_gb=120.0)]
PLANNED = [Workload(), PRESETS["qwen3-30b-a3b"], PRESETS["qwen3-235b-a22b"], Workload(gpus=2),
           Workload(batch_size=4, seq_len=1024, lora_rank=16)]


def need(recipe, batch_size=None, seq_len=None, lora_rank=None):
    return micro_step_vram_gb(recipe, batch_size=batch_size or recipe.batch_size, seq_len=seq_len or recipe.seq_len,
                              lora_rank=lora_rank or recipe.lora_rank)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{r.model}-{r.gpus}-{r.vram_needed_gb}")
def test_it_is_the_recipes_own_figure_when_the_run_trains_as_the_recipe_says(recipe):
    assert need(recipe) == recipe.vram_gb  # exactly: no surprise for a run launched before
    assert need(UNLISTED, 2, 2048, 32) == 85.0  # the defaults: 70 GB of weights + RANK_OVERHEAD_GB


@pytest.mark.parametrize("recipe", PLANNED, ids=lambda r: f"{r.model}-{r.gpus}-{r.lora_rank}")
def test_a_known_model_needs_its_plans_least_card_which_grows_and_shrinks_with_the_micro_step(recipe):
    assert need(recipe) == recipe.vram_gb == memory.least_card_gb(recipe)
    assert need(recipe, seq_len=recipe.seq_len * 4) > recipe.vram_gb > need(recipe, batch_size=1, seq_len=16)
    assert need(recipe, lora_rank=recipe.lora_rank * 2) > recipe.vram_gb


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{r.model}-{r.gpus}-{r.vram_needed_gb}")
def test_more_tokens_a_micro_step_or_a_higher_rank_need_more_and_a_smaller_one_never_less(recipe):
    tokens = recipe.batch_size * recipe.seq_len
    four_x = need(recipe, seq_len=recipe.seq_len * 4)
    assert four_x > need(recipe, seq_len=recipe.seq_len * 2) > recipe.vram_gb
    assert need(recipe, batch_size=recipe.batch_size * 4) == pytest.approx(four_x)  # tokens, however split
    assert need(recipe, lora_rank=recipe.lora_rank * 2) > recipe.vram_gb
    for batch_size, seq_len, rank in [(1, 16, 1), (1, tokens, 1), (1, 16, recipe.lora_rank), (1, tokens // 2, 4)]:
        assert need(recipe, batch_size, seq_len, rank) == recipe.vram_gb  # the constant is short already


def test_the_growth_is_what_the_calibration_measured_for_its_shape():
    # One H200, Qwen3-30B-A3B, r=32, 2 x 2048 tokens: 89.2 GiB reserved = 61 GB of weights + 20.1 GB of routed
    # adapter state (1.26e9 parameters x 16 bytes) + 14.6 GB that grows with the tokens.
    shape = SHAPES[CALIBRATION_MODEL]
    assert shape.routed_adapter_gb(32, 1) * 1e9 == 48 * 128 * 32 * (2 * 2048 + 3 * 768) == 1_258_291_200
    assert round(shape.routed_adapter_gb(32, ADAPTER_STATE_BYTES), 1) == 20.1
    assert round(ACTIVATION_BYTES * 4096 * 48 * 2048 / 1e9, 1) == 14.6 and round(ACTIVATION_BYTES) == 36
    preset = replace(PRESETS["qwen3-30b-a3b"], model="unlisted-30B")  # 61 GB of weights + 15 = 76 GB
    assert need(preset, 2, 8192) == 120.0  # 4x the tokens: 76 + 3 x 14.65, up to a tenth
    assert need(preset, 2, 2048, 64) == 96.2  # twice the rank: 76 + 20.13 more adapter state


def test_on_several_gpus_the_experts_adapter_state_is_shared_and_the_activations_are_not():
    one = replace(PRESETS["qwen3-30b-a3b"], model="unlisted-30B")
    two = replace(one, gpus=2)
    shared = (need(one, lora_rank=64) - one.vram_gb) / 2
    assert need(two, lora_rank=64) - two.vram_gb == pytest.approx(shared, abs=0.1)
    assert need(two, seq_len=8192) - two.vram_gb == pytest.approx(need(one, seq_len=8192) - one.vram_gb, abs=0.1)


def test_a_recipes_own_figure_grows_the_same_way():
    stated = Workload(vram_needed_gb=120.0)
    other = Workload(vram_needed_gb=85.0)
    assert need(stated, seq_len=8192) - 120.0 == pytest.approx(need(other, seq_len=8192) - 85.0, abs=0.1)
    assert need(stated, seq_len=8192) > 120.0


def test_a_card_the_profile_fits_is_excluded_for_a_run_with_four_times_the_tokens():
    filters = OfferFilters(gpu_tiers="any", max_usd_per_hour=None)
    rtx = box("rtx", 1, gpu_name="RTX PRO 6000 WS", gpu_ram_gb=95.6, per_gpu_usd="1.00")
    preset = replace(PRESETS["qwen3-30b-a3b"], model="unlisted-30B")
    assert exclusion_reasons(rtx, filters, preset) == ()  # 76 GB at 2 x 2048
    longer = replace(preset, vram_needed_gb=need(preset, seq_len=8192))
    assert exclusion_reasons(rtx, filters, longer) == ("VRAM 95.6 GB < needed 120 GB for unlisted-30B",)
    assert exclusion_reasons(box("h200", 1, total_usd_per_hour=Decimal("1.23")), filters, longer) == ()
