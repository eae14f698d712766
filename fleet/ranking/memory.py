"""The memory plan the trainer would take on each card (training/memory_plan.py), as the ranking reads it: the least
card memory a recipe fits on, the plan and its speed on a card of each size (docs/fleet.md, "Memory plans")."""

from functools import lru_cache

import numpy as np

from training import memory_plan


# `recipe` below is a Workload (fleet/ranking/workload.py, which reads least_card_gb for its vram_gb).
def plan_run(recipe) -> memory_plan.Run | None:
    """What one rank of the recipe holds, or None where the plan does not apply: a recipe that states its own VRAM,
    or a model whose shape the plan does not know (the per-GPU rule of thumb holds there, Workload.vram_gb)."""
    shape = memory_plan.SHAPES.get(recipe.model)
    if recipe.vram_needed_gb is not None or shape is None:
        return None
    return memory_plan.Run(shape, lora_rank=recipe.lora_rank, tokens=recipe.batch_size * recipe.seq_len,
                           gpus=recipe.gpus)


@lru_cache(maxsize=256)
def ladder(recipe) -> tuple[tuple[float, memory_plan.Plan], ...]:
    """(least card memory, plan) for each plan a card of some size would take, smallest first; () where the plan does
    not apply."""
    run = plan_run(recipe)
    if run is None:
        return ()
    return tuple(memory_plan.steps(run, recipe.optimizer, recipe.gradient_checkpointing, recipe.memory_plan))


def least_card_gb(recipe) -> float | None:
    """The least memory a card must list for the recipe to fit it (up to a tenth), or None where the plan does not
    apply."""
    steps = ladder(recipe)
    return float(np.ceil(steps[0][0] * 10) / 10) if steps else None


def plan_on(recipe, card_gb: float) -> memory_plan.Plan | None:
    """The plan the trainer would take on a card listing `card_gb`, its figures for that card; None where the plan
    does not apply or nothing fits."""
    run = plan_run(recipe)
    if run is None or not card_gb or not np.isfinite(card_gb):
        return None
    return memory_plan.choose(run, memory_plan.usable_gib(card_gb), recipe.optimizer, recipe.gradient_checkpointing,
                              recipe.memory_plan)


# What the host needs beside an offloaded optimizer's pinned memory: the trainer's own process, the tokenizer, the data.
HOST_BESIDE_GIB = 8.0


def host_needs(recipe) -> tuple[tuple[float, float, float, str], ...]:
    """(card from, card below, host memory needed, plan name) for each span of card sizes whose plan keeps the
    moments on the host: a box there needs that much host memory, or the trainer has no plan that fits."""
    steps = ladder(recipe)
    ends = [card for card, _ in steps[1:]] + [float("inf")] * bool(steps)
    return tuple((card, end, plan.host_gib + HOST_BESIDE_GIB, plan.name)
                 for (card, plan), end in zip(steps, ends, strict=True) if plan.host_gib > 0)


def speed_column(recipe, card_gb: np.ndarray) -> np.ndarray:
    """Each card's plan's speed against the plain plan's (1.0 where the plan does not apply)."""
    steps = ladder(recipe)
    if not steps:
        return np.ones(len(card_gb))
    edges = np.array([card for card, _ in steps])
    speeds = np.array([1.0, *(plan.speed for _, plan in steps)])  # below the least card: filtered out before
    with np.errstate(invalid="ignore"):
        return speeds[np.searchsorted(edges, np.nan_to_num(card_gb, nan=0.0), side="right")]
