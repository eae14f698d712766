"""A one-GPU run that still runs out of memory on the plan it chose starts again from its last complete checkpoint on
a more frugal plan, says so, and ends as a run that never ran out; a run on the recipe's own settings does not (what
it asked for is what it gets). The GPU is played on the CPU: the plan as a card would choose it, the out-of-memory
error raised inside a step."""

import json

import pytest
import torch

from training import checkpoint, fitting, memory_plan, train
from training.examples.tiny import tiny_recipe
from training.phase import Trainee

CARD = memory_plan.Run(memory_plan.SHAPES["Qwen3-30B-A3B"], tokens=2 * 2048)


@pytest.fixture
def card(monkeypatch):
    """The plan a 78.5 GiB card chooses for the 30B shape (or under the need a retry gives); the needs asked."""
    unders = []

    def choose(recipe, model, device, gpus=1, budget_gib=None, under_gib=None):
        unders.append(under_gib)
        if recipe.memory_plan == "recipe":
            return fitting.Choice(False, "adamw", memory_plan.estimate(CARD, False, "adamw", 78.5), "the recipe's")
        plan = memory_plan.choose(CARD, 78.5, host_gib=0.0) if under_gib is None else \
            memory_plan.choose(CARD, under_gib, host_gib=0.0, keep=False)  # the CPU plays the card: no host
        return fitting.Choice(plan.checkpointing, plan.optimizer, plan, f"memory plan (auto): {plan.name}")

    monkeypatch.setattr(fitting, "choose", choose)
    return unders


def out_of_memory_at(monkeypatch, calls, error=lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate "
                                                                             "2.00 GiB.")):
    """The trainer's optimizer step runs out of memory (`error()`) at these calls (counted over the run, from 1)."""
    step, count = Trainee.optimizer_step, [0]

    def failing(self, *args, **kwargs):
        count[0] += 1
        if count[0] in calls:
            raise error()
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Trainee, "optimizer_step", failing)


def _recipe(tmp_path, **settings):
    return tiny_recipe(tmp_path, phases=(("cpt", 4),), checkpoint={"every": 1}, metrics={"router_every": 0},
                       **settings)


def test_it_starts_again_from_its_last_checkpoint_on_a_more_frugal_plan(tmp_path, monkeypatch, card):
    out_of_memory_at(monkeypatch, {3})  # step 3: steps 1 and 2 are checkpointed
    lines = []
    train.run(_recipe(tmp_path), out=lines.append)
    first = memory_plan.choose(CARD, 78.5, host_gib=0.0)
    assert card[0] is None and card[1] == pytest.approx(first.total_gib - 0.01)
    second = memory_plan.choose(CARD, card[1], host_gib=0.0, keep=False)
    # the next fastest plan under the first one's need: one more layer checkpointed, the 6 GiB still free on the card
    assert second.total_gib < first.total_gib and second.speed < first.speed
    assert second.checkpointed == first.checkpointed + 1 and second.optimizer == first.optimizer
    assert any(line.startswith(f"out of GPU memory on plan {first.name}") for line in lines)
    assert f"resuming from checkpoint {checkpoint.checkpoint_name(0, 2)}" in lines and lines[-1] == "run complete"
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == [1, 2, 3, 4]  # every step once: the one that ran out was never logged
    said = [r["memory_plan"] for r in records if "memory_plan" in r]
    assert said == [f"memory plan (auto): {first.name}", f"memory plan (auto): {second.name}"]  # the run's events


def test_it_gives_up_after_its_retries(tmp_path, monkeypatch, card):
    out_of_memory_at(monkeypatch, {1, 2, 3})
    lines = []
    with pytest.raises(torch.OutOfMemoryError, match="no more frugal plan was tried after 2"):
        train.run(_recipe(tmp_path), out=lines.append)
    assert len(card) == 3 and card[1] > card[2]  # each start asked for less than the one before
    assert sum(line.startswith("out of GPU memory on plan") for line in lines) == 2


def test_a_run_on_the_recipes_own_settings_is_not_started_again(tmp_path, monkeypatch, card):
    out_of_memory_at(monkeypatch, {2})
    lines = []
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        train.run(_recipe(tmp_path, memory_plan="recipe"), out=lines.append)
    assert card == [None] and not any("out of GPU memory" in line for line in lines)


def test_cudas_own_out_of_memory_from_a_kernel_launch_is_met_the_same_way(tmp_path, monkeypatch, card):
    # Outside PyTorch's allocator: a Triton kernel's launch that the card cannot hold says it as a RuntimeError.
    out_of_memory_at(monkeypatch, {3}, error=lambda: RuntimeError("Triton Error [CUDA]: out of memory"))
    lines = []
    train.run(_recipe(tmp_path), out=lines.append)
    assert len(card) == 2 and card[1] is not None
    assert sum(line.startswith("out of GPU memory on plan") for line in lines) == 1 and lines[-1] == "run complete"


def test_a_kernel_failing_for_another_reason_is_not_taken_for_memory(tmp_path, monkeypatch, card):
    out_of_memory_at(monkeypatch, {2}, error=lambda: RuntimeError("CUDA error: an illegal memory access was "
                                                                  "encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        train.run(_recipe(tmp_path), out=[].append)
    assert card == [None]  # no second plan was asked for
