"""What a run needs from a box is decided in one place (BoxRequest), from its typed recipe and its profile: the LoRA
rank, the VRAM and the disk every caller uses agree, and the ranking prices a step with the run's own batch shape
(batch_size, grad_accum, seq_len, gpus), the trainer's defaults where the run's recipe leaves them out."""

from decimal import Decimal

from fleet.models import OfferProfile
from fleet.ranking import PRESETS, OfferFilters, micro_step_vram_gb
from runs import launch, serving
from runs.box_request import BoxRequest
from runs.models import Run
from training.recipe import RunRecipe

PRESET = PRESETS["qwen3-30b-a3b"]  # 66.3 GB a GPU (its memory plan's least card); batch 2 x 8 x 2048


def _profile(**changes) -> OfferProfile:
    recipe = {**PRESET.to_dict(), **changes}
    return OfferProfile(name="p", recipe=recipe, filters=OfferFilters(max_usd_per_hour=Decimal("5")).to_dict())


def _run(recipe: dict, profile=None, disk_gb=None) -> Run:
    return Run(name="r", recipe=recipe, profile=profile, disk_gb=disk_gb)


def test_a_run_is_priced_with_its_own_batch_shape_not_its_profiles():
    profile = _profile(batch_size=8, grad_accum=4, seq_len=1024, gpus=1)
    request = BoxRequest.for_run(_run({"batch_size": 1, "grad_accum": 16, "seq_len": 512, "gpus": 2}, profile))
    figures = request.figures
    assert (figures.batch_size, figures.grad_accum, figures.seq_len, figures.gpus) == (1, 16, 512, 2)
    assert figures.tokens_per_step == 1 * 16 * 512
    assert (figures.model, figures.phases) == (PRESET.model, PRESET.phases)  # the profile's model and run length


def test_a_run_that_leaves_its_batch_shape_out_is_priced_with_the_trainers_defaults():
    figures = BoxRequest.for_run(_run({}, _profile(batch_size=8, grad_accum=4, seq_len=1024))).figures
    defaults = RunRecipe.from_stored({})
    assert (figures.batch_size, figures.grad_accum, figures.seq_len, figures.gpus, figures.lora_rank) == \
        (defaults.batch_size, defaults.grad_accum, defaults.seq_len, 1, defaults.lora.r) == (2, 8, 2048, 1, 32)


def test_one_place_decides_the_rank_the_vram_and_the_disk():
    profile = _profile()
    recipe = {"model": {"path": "Qwen/Qwen3-30B-A3B"}, "batch_size": 4, "seq_len": 4096, "lora": {"r": 1024},
              "checkpoint": {"keep": 2}}
    run = _run(recipe, profile)
    request = BoxRequest.for_run(run)
    assert request.figures.lora_rank == serving.lora_rank(run) == 1024
    assert request.vram_gb == micro_step_vram_gb(PRESET, batch_size=4, seq_len=4096, lora_rank=1024) > PRESET.vram_gb
    assert request.figures.checkpoint_gb == round(PRESET.checkpoint_gb * 1024 / 32, 1)  # priced uploads and disk
    need = launch.disk_need(recipe, profile)
    assert need == request.disk_need() and need.checkpoints == 2 + 2
    assert need.checkpoint_gb == request.figures.checkpoint_gb


def test_a_run_at_its_profiles_micro_step_and_rank_needs_its_profiles_vram():
    request = BoxRequest.for_run(_run({"batch_size": 2, "seq_len": 2048, "lora": {"r": 32}}, _profile()))
    # The memory plan's least card for the 30B preset (checkpointing, moments on the host, bf16 factors).
    assert request.vram_gb == PRESET.vram_gb == 66.3 and request.figures.vram_needed_gb is None
    assert request.vram_words == "it needs 66.3 GB of VRAM per GPU"


def test_a_smaller_rank_keeps_the_profiles_checkpoint_figure_and_needs_less_vram():
    request = BoxRequest.for_run(_run({"lora": {"r": 8}, "batch_size": 1, "seq_len": 512}, _profile()))
    assert request.figures.checkpoint_gb == PRESET.checkpoint_gb and request.vram_gb < PRESET.vram_gb


def test_the_runs_own_memory_settings_reach_the_plan():
    request = BoxRequest.for_run(_run({"memory_plan": "recipe", "optimizer": "adamw_8bit"}, _profile()))
    figures = request.figures
    assert (figures.memory_plan, figures.optimizer, figures.gradient_checkpointing) == ("recipe", "adamw_8bit", False)
    assert request.vram_gb > PRESET.vram_gb  # no checkpointing: every layer's activations kept


def test_the_default_price_cap_is_a_one_gpu_boxs_and_grows_with_the_runs_gpus():
    alone = BoxRequest.for_run(_run({"gpus": 1}))
    four = BoxRequest.for_run(_run({"gpus": 4}))
    assert four.filters.max_usd_per_hour == alone.filters.max_usd_per_hour * 4
    assert "it needs 4 GPUs with" in four.vram_words and four.figures.gpus == 4
    profiled = BoxRequest.for_run(_run({"gpus": 4}, _profile()))
    assert profiled.filters.max_usd_per_hour == Decimal("5")  # a profile's cap is its own


def test_the_chosen_disk_is_priced_and_required():
    request = BoxRequest.for_run(_run({}, disk_gb=900))
    assert request.figures.rent_disk_gb == 900.0 and request.filters.min_disk_gb == 900.0
    assert BoxRequest.for_run(_run({})).figures.rent_disk_gb == PRESETS["qwen3.6-35b-a3b"].rent_disk_gb


def test_a_model_built_from_its_config_downloads_nothing():
    need = BoxRequest.for_run(_run({"model": {"config": {"model_type": "qwen3_moe"}}})).disk_need()
    assert need.weights_gb == 0
