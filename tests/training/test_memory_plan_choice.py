"""How the trainer says its memory plan: recipes take optimizer and memory_plan with clear errors, the plan is counted
on the model as built, said in the trainer's log and on the first step record of metrics.jsonl, which the agent posts
to the dashboard as the run's log event."""

import json
import logging

import pytest
import torch

from training import distributed, fitting, memory_plan, train
from training.agent.metrics import forward_metrics
from training.examples.tiny import tiny_recipe
from training.lora import attach_lora
from training.recipe import RecipeError, RunRecipe


def test_a_recipe_names_an_optimizer_and_a_memory_plan_it_knows(tmp_path):
    assert RunRecipe.from_dict(tiny_recipe(tmp_path)).memory_plan == "auto"  # the default
    with pytest.raises(RecipeError) as refused:
        tiny_recipe(tmp_path, optimizer="sgd", memory_plan="maybe")
    known = "('adamw', 'adamw_8bit', 'adamw_offload', 'adamw_8bit_bf16', 'adamw_offload_bf16')"
    assert f"optimizer: one of {known}, got 'sgd'" in str(refused.value)
    assert "memory_plan: one of ('auto', 'recipe'), got 'maybe'" in str(refused.value)
    with pytest.raises(RecipeError, match="adamw_8bit runs on one GPU"):
        tiny_recipe(tmp_path, optimizer="adamw_8bit", gpus=2)


def test_the_plan_is_counted_on_the_model_as_built(tmp_path):
    recipe = RunRecipe.from_dict(tiny_recipe(tmp_path))
    model = attach_lora(train.build_model(recipe.model, "cpu"), r=4, alpha=8)
    run = fitting.counted_run(recipe, model, gpus=1)
    assert run.lora_params == sum(p.numel() for p in model.parameters() if p.requires_grad) > 0
    assert run.weights_bytes >= 4 * sum(p.numel() for p in model.parameters() if not p.requires_grad)  # float32
    assert (run.tokens, run.shape.layers, run.shape.hidden) == (2 * 64, 2, 32)
    plain = memory_plan.estimate(run, False, "adamw", 1.0)
    assert plain.lora_gib == pytest.approx(run.lora_params * 8 / 2**30)


def test_a_cpu_run_logs_the_recipes_own_settings_and_leaves_its_steps_as_they_were(tmp_path, caplog):
    lines = []
    with caplog.at_level(logging.INFO, logger="training"):
        train.run(tiny_recipe(tmp_path, metrics={"router_every": 0}), out=lines.append)
    said = "memory plan: no GPU, the recipe's own (no checkpointing, float32 moments)"
    assert said in caplog.messages and said not in lines
    assert all("memory_plan" not in json.loads(line) for line in open(tmp_path / "metrics.jsonl"))


def test_a_gpu_runs_plan_rides_on_its_first_step_record_once():
    written = []
    sink = train.FirstRecordSays(type("Sink", (), {"emit": lambda self, r: written.append(r)})(), "memory plan (auto)")
    for step in (1, 2):
        sink.emit({"phase": 0, "step": step})
    assert written == [{"phase": 0, "step": 1, "memory_plan": "memory plan (auto)"}, {"phase": 0, "step": 2}]


class _Dashboard:
    def __init__(self):
        self.calls = []

    def call(self, method, path, body):
        self.calls.append((path, body))
        return {"stored": len(body.get("points", []))}


def test_the_agent_posts_the_event_between_the_points_around_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    point = {"phase": 0, "step": 1, "time": 1.7e9, "loss": 2.0}
    path.write_text("\n".join(json.dumps(r) for r in (
        point, {**point, "step": 2, "memory_plan": "memory plan (auto): checkpointing"}, {**point, "step": 3})) + "\n")
    api = _Dashboard()
    assert forward_metrics(api, path, 0, 100) == path.stat().st_size
    assert [p for p, _ in api.calls] == ["metrics", "events", "metrics"]
    assert api.calls[1][1] == {"kind": "log", "message": "memory plan (auto): checkpointing"}
    assert [[point["step"] for point in b["points"]] for p, b in api.calls if p == "metrics"] == [[1], [2, 3]]
    assert all("memory_plan" not in point for _, b in api.calls if "points" in b for point in b["points"])


def test_a_partial_plan_recomputes_its_first_layers_only_and_trains_as_the_plain_model_does(tmp_path):
    """Checkpointing some layers changes what is kept, not what is computed: the same loss and LoRA gradients."""
    recipe = RunRecipe.from_dict(tiny_recipe(tmp_path))
    grads = {}
    for checkpointed in (0, 1, 2):
        torch.manual_seed(0)
        base = train.build_model(recipe.model, "cpu")
        model = attach_lora(base, r=4, alpha=8)
        plan = memory_plan.estimate(fitting.counted_run(recipe, model, gpus=1), checkpointed / 2, "adamw", 1.0)
        assert plan.checkpointed == checkpointed and plan.checkpointing == (checkpointed > 0)
        choice = fitting.Choice(plan.checkpointing, "adamw", plan, plan.name)
        assert fitting.checkpoint_layers(base, choice) == checkpointed
        layers = distributed.decoder_layers(base)
        assert [layer.gradient_checkpointing for layer in layers] == [i < checkpointed for i in range(2)]
        model.train()
        ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(1))
        model(input_ids=ids, labels=ids).loss.backward()
        grads[checkpointed] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads[0] and grads[0].keys() == grads[1].keys() == grads[2].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(grads[2][name], grad, rtol=1e-4, atol=1e-6)


def test_a_card_a_little_short_of_the_whole_runs_activations_recomputes_a_few_of_the_layers():
    run = memory_plan.Run(memory_plan.SHAPES["Qwen3-30B-A3B"], tokens=2 * 2048)
    plain, every = memory_plan.estimate(run, False, "adamw", 0), memory_plan.estimate(run, True, "adamw", 0)
    card = plain.total_gib - 2.0
    # Two GiB short, auto drops the float32 moments and factors first: 3% slower, 6 GiB left
    plan = memory_plan.choose(run, card)
    assert plan.name == "no checkpointing, 8-bit moments and bf16 factors" and plan.roomy
    # With float32 moments, the fewest layers that free the two GiB keep only their inputs (0.28 GiB less each, less
    # one layer's activations held again in the recomputation): 9 of the 48
    plan = max((p for p in memory_plan.plans(run, card) if p.fits and p.optimizer == "adamw"), key=lambda p: p.speed)
    assert plan.name == "checkpointing 9 of 48 layers, float32 moments"
    assert not memory_plan.estimate(run, 8 / 48, "adamw", card).fits
    assert every.activations_gib < plan.activations_gib < plain.activations_gib
    assert every.speed < plan.speed < plain.speed == 1.0
    assert plan.speed == pytest.approx(1 / (1 + (1 / memory_plan.CHECKPOINTING_SPEED["attention"] - 1) * 9 / 48))
    assert plan.to_dict()["checkpointed_layers"] == 9


def test_a_host_short_of_the_offloaded_moments_gets_a_plan_that_keeps_them_on_the_card(tmp_path, monkeypatch):
    """On a GPU (its memory given as a budget) whose only fitting plan puts the moments on the host: taken where the
    host has the memory, passed over (and said so) where it has not."""
    recipe = RunRecipe.from_dict(tiny_recipe(tmp_path))
    model = attach_lora(train.build_model(recipe.model, "cpu"), r=4, alpha=8)
    run = fitting.counted_run(recipe, model, gpus=1)
    offloaded = memory_plan.estimate(run, True, "adamw_offload_bf16", 0.0)
    on_card = memory_plan.estimate(run, True, "adamw_8bit_bf16", 0.0)
    budget = (offloaded.total_gib + on_card.total_gib) / 2  # the offloaded plan fits, the next one does not
    monkeypatch.setattr(fitting, "host_memory_gib", lambda: 64.0)
    roomy = fitting.choose(recipe, model, "cuda", budget_gib=budget)
    assert roomy.optimizer == "adamw_offload_bf16" and roomy.plan.fits and not roomy.plan.roomy
    assert roomy.words.endswith(f"(no plan leaves the {roomy.plan.kept_gib:.1f} GiB of headroom kept; this one the "
                                "most)")
    monkeypatch.setattr(fitting, "host_memory_gib", lambda: offloaded.host_gib / 2)
    short = fitting.choose(recipe, model, "cuda", budget_gib=budget)
    assert short.optimizer == "adamw_8bit_bf16" and short.plan.host_gib == 0  # the most frugal on the card
    assert short.words.startswith(f"memory plan: no plan fits {budget:.1f} GiB (not checkpointing, moments on the "
                                  f"host and bf16 factors: it pins {offloaded.host_gib:.1f} GiB on the host")


def test_it_reads_the_hosts_available_memory():
    assert 0 < fitting.host_memory_gib() < 1 << 20  # Linux: MemAvailable
