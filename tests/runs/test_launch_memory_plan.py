"""The launch page says how the run's model fits on the best-ranked card: its memory plan, weights, LoRA state,
activations and headroom, as the ranking and the trainer work it out (training/memory_plan.py)."""

import html
import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from fleet.models import OfferProfile
from fleet.offers.ranked import rank_stored_offers
from fleet.offers.refresh import refresh_offers
from fleet.ranking import PRESETS, OfferFilters, memory
from runs.box_request import BoxRequest
from runs.launch import demo_recipe
from training.recipe import RunRecipe, parse_recipe_text

pytestmark = pytest.mark.django_db


@pytest.fixture
def launcher(staff):
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    return staff


def _plan_text(page: str) -> str:
    block = re.search(r'<div class="meta" id="memory-plan">(.*?)</div>', page, re.S)
    assert block, "no memory plan on the page"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", block[1])).split())


def test_it_shows_the_plan_on_the_best_ranked_card(client, launcher, frozen_market):
    refresh_offers()
    client.force_login(launcher)
    text = _plan_text(client.get(reverse("run_launch")).content.decode())
    request = BoxRequest.build(RunRecipe.from_stored(demo_recipe()), None)
    best = rank_stored_offers(request.figures, request.filters).entries[0].offer
    plan = memory.plan_on(request.figures, best.gpu_ram_gb)
    assert text.startswith(f"Memory plan for Qwen3.6-35B-A3B on the best-ranked card, {best.gpu_name} "
                           f"({best.gpu_ram_gb:g} GB): {plan.name}.")
    assert "weights 65.2 GiB" in text  # 35 billion bf16 weights
    assert f"LoRA factors and gradients {plan.lora_gib:.1f} GiB" in text
    assert f"optimizer state {plan.optimizer_gib:.1f} GiB" in text
    assert f"activations {plan.activations_gib:.1f} GiB head and loss {plan.head_gib:.1f} GiB" in text
    assert f"headroom {plan.headroom_gib:.1f} of {plan.card_gib:.1f} GiB usable" in text and plan.headroom_gib >= 0


def test_a_profile_no_listed_card_fits_says_the_least_card(client, launcher, frozen_market):
    refresh_offers()
    profile = OfferProfile.objects.create(name="35b-on-48", recipe=PRESETS["qwen3.6-35b-a3b"].to_dict(),
                                          filters=OfferFilters(vram_max_gb=48.0, max_usd_per_hour=None).to_dict())
    client.force_login(launcher)
    form = {"name": "on-48", "recipe": "model: {config: {model_type: qwen3_moe}}\nphases: []\n",
            "profile": profile.pk, "budget_usd": "5", "max_restarts": "0", "bucket": ""}
    text = _plan_text(client.post(reverse("run_launch"), form).content.decode())
    assert text == "Memory plan for Qwen3.6-35B-A3B: no offer is ranked; a card must list at least 77.0 GB."


def test_a_card_no_plan_leaves_the_headroom_on_says_so(client, launcher, frozen_market):
    """35B-A3B at r=32 on an 80 GB card: the moments on the host fit, with less than the 6 GiB a plan is chosen to
    leave."""
    refresh_offers()
    profile = OfferProfile.objects.create(name="35b-on-80", recipe=PRESETS["qwen3.6-35b-a3b"].to_dict(),
                                          filters=OfferFilters(vram_max_gb=82.0, max_usd_per_hour=None).to_dict())
    recipe = "model: {config: {model_type: qwen3_moe}}\nlora: {r: 32}\nbatch_size: 2\nseq_len: 2048\nphases: []\n"
    request = BoxRequest.build(RunRecipe.from_stored(parse_recipe_text(recipe)), profile)
    best = rank_stored_offers(request.figures, request.filters).entries[0].offer
    plan = memory.plan_on(request.figures, best.gpu_ram_gb)
    assert plan.name == "checkpointing, moments on the host and bf16 factors" and not plan.roomy
    client.force_login(launcher)
    form = {"name": "on-80", "recipe": recipe, "profile": profile.pk, "budget_usd": "5", "max_restarts": "0",
            "bucket": ""}
    text = _plan_text(client.post(reverse("run_launch"), form).content.decode())
    assert f"headroom {plan.headroom_gib:.1f} of {plan.card_gib:.1f} GiB usable (under the 6.0 GiB kept: no plan " \
           "leaves it on this card)" in text
