"""The memory plan the launch page shows: how the run's model (the profile's, as the ranking prices it) fits on the
best-ranked card for the recipe and profile as they stand: weights, LoRA state, activations, headroom
(training/memory_plan.py, fleet/ranking/memory.py)."""

from dataclasses import dataclass

from fleet.offers.ranked import rank_stored_offers
from fleet.ranking import memory
from runs.box_request import BoxRequest
from training.memory_plan import Plan
from training.recipe import RunRecipe


@dataclass(frozen=True)
class ShownPlan:
    model: str
    card: str  # "RTX PRO 6000 WS (95.6 GB)", or "" where no offer is ranked
    plan: Plan | None  # None: no offer is ranked; `least_card_gb` says what a card must list
    least_card_gb: float | None


def shown_plan(recipe: dict, profile=None) -> ShownPlan | None:
    """The plan on the best-ranked stored offer, or None where the memory plan does not know the model (or the
    profile states its own VRAM)."""
    request = BoxRequest.build(RunRecipe.from_stored(recipe), profile)
    figures = request.figures
    if memory.plan_run(figures) is None:
        return None
    ranking = rank_stored_offers(figures, request.filters)
    if not ranking.entries:
        return ShownPlan(figures.model, "", None, memory.least_card_gb(figures))
    offer = ranking.entries[0].offer
    return ShownPlan(figures.model, f"{offer.gpu_name} ({offer.gpu_ram_gb:g} GB)",
                     memory.plan_on(figures, offer.gpu_ram_gb), memory.least_card_gb(figures))
