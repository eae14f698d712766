"""A run's box is one its micro-step fits on: the VRAM each GPU must have follows the run's own batch_size x seq_len,
LoRA rank and memory settings (the memory plan, fleet/ranking/memory.py), not only its profile's. On the simulated
marketplace, for the 30B preset kept to its recipe's settings (94 GB a GPU at 2 x 2048 tokens, r=32, no
checkpointing): an RTX PRO 6000 (95.6 GB) holds that, not 4x the tokens."""

import pytest

from fleet.models import Offer, OfferProfile
from fleet.offers.refresh import refresh_offers
from fleet.ranking import PRESETS, OfferFilters
from runs import supervisor
from runs.box_request import BoxRequest
from runs.launch import launch
from tests.runs.conftest import tiny_recipe

pytestmark = pytest.mark.django_db
PRESET = PRESETS["qwen3-30b-a3b"]


@pytest.fixture
def rtx_only(frozen_market):
    """Offers ranked for the 30B preset on RTX PRO 6000 cards only, at any price."""
    refresh_offers()
    return OfferProfile.objects.create(name="30b-rtx", recipe=PRESET.to_dict(), filters=OfferFilters(
        gpu_tiers=("rtx_pro_6000",), max_usd_per_hour=None).to_dict())


def _launch(tmp_path, profile, name, **changes):
    return launch(name=name, recipe=tiny_recipe(**changes), bucket=str(tmp_path / name), budget_usd=100,
                  max_restarts=0, profile=profile)


def _supervised(run):
    supervisor.supervise()
    run.refresh_from_db()
    return run


def _card_gb(run) -> float:
    box = run.current_instance
    assert box is not None, [e.message for e in run.events.all()]
    return Offer.objects.get(provider=box.provider, offer_id=box.offer_id, is_bid=box.is_bid).gpu_ram_gb


def test_a_run_at_its_profiles_micro_step_is_rented_the_card_its_profile_fits(rtx_only, tmp_path):
    # The recipe's own settings (memory_plan: recipe): no checkpointing, float32 moments, 94 GB at 2 x 2048 tokens.
    run = _supervised(_launch(tmp_path, rtx_only, "same", batch_size=2, seq_len=2048, lora={"r": 32, "alpha": 64},
                              memory_plan="recipe"))
    assert BoxRequest.for_run(run).vram_gb == 94.0
    assert run.current_instance.gpu_name.startswith("RTX PRO 6000") and _card_gb(run) == 95.6


def test_a_run_with_a_long_seq_len_is_not_rented_a_card_too_small_for_it(rtx_only, tmp_path):
    run = _launch(tmp_path, rtx_only, "long", batch_size=2, seq_len=8192, lora={"r": 32, "alpha": 64},
                  memory_plan="recipe")
    need_gb = BoxRequest.for_run(run).vram_gb
    assert 95.6 < need_gb < 140.4  # more than the RTX PRO 6000 the profile's own figure fits on, less than an H200
    run = _supervised(run)
    assert run.state == "pending" and run.current_instance is None  # not the 95.6 GB card it would OOM on
    assert f"it needs {need_gb:g} GB of VRAM per GPU" in run.events.get(kind="waiting").message
    rtx_only.filters = OfferFilters(gpu_tiers=("rtx_pro_6000", "h200"), max_usd_per_hour=None).to_dict()
    rtx_only.save()
    run = _supervised(run)
    assert _card_gb(run) >= need_gb and run.current_instance.gpu_name.startswith("H200")
