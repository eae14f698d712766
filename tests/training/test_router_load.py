"""The router's load, counted on the device: tokens x top-k per layer and step, the experts that got none, and the
counting changes nothing the model computes."""

import json

import pytest
import torch

from tests.training.tiny_lora import tiny_lora_model
from training import router_load
from training.moe_lora import ROUTER_COUNTER_ATTRIBUTE
from training.examples.tiny import TINY_CONFIG, TINY_QWEN3_5_CONFIG, tiny_recipe
from training.phase import Phase
from training.train import run

CONFIGS = {"qwen3_moe": TINY_CONFIG, "qwen3_5_moe": TINY_QWEN3_5_CONFIG}


class _OneRank:
    def sum(self, tensor):
        return tensor


def _step(model, batches):
    """One optimizer step's forwards and backwards over the micro-batches; the summed loss."""
    total = 0.0
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        total += float(loss.detach())
    return total


def _batches(config, micro=2, shape=(3, 11), seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, config["vocab_size"], shape, generator=generator) for _ in range(micro)]


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_steps_counts_are_its_tokens_times_top_k_in_every_layer(family):
    config = CONFIGS[family]
    model = tiny_lora_model(config)
    counter = router_load.attach_counter(model, "cpu")
    batches = _batches(config)
    _step(model, batches)
    counts = counter.take(_OneRank())
    tokens = sum(ids.numel() for ids in batches)
    layers = config["num_hidden_layers"]
    assert len(counts) == layers and all(len(row) == config["num_experts"] for row in counts)
    assert [sum(row) for row in counts] == [tokens * config["num_experts_per_tok"]] * layers
    # Taken means cleared: the next interval starts from zero.
    assert counter.take(_OneRank()) == [[0] * config["num_experts"]] * layers


def test_the_counts_are_the_routers_own_choices():
    model = tiny_lora_model(TINY_CONFIG)
    counter = router_load.attach_counter(model, "cpu")
    chosen = []
    for layer in model.get_base_model().model.layers:
        layer.mlp.gate.register_forward_hook(lambda module, args, out: chosen.append(out[2].reshape(-1)))
    ids = _batches(TINY_CONFIG, micro=1)
    _step(model, ids)
    expected = [torch.bincount(c, minlength=TINY_CONFIG["num_experts"]).tolist() for c in chosen]
    assert counter.take(_OneRank()) == expected


def test_forwards_without_gradient_and_checkpointing_recomputes_are_not_counted():
    model = tiny_lora_model(TINY_CONFIG)
    model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    counter = router_load.attach_counter(model, "cpu")
    batches = _batches(TINY_CONFIG, micro=1)
    with torch.no_grad():  # a reference's or a rollout's forward
        model(input_ids=batches[0])
    assert sum(map(sum, counter.take(_OneRank()))) == 0
    _step(model, batches)  # the backward runs each layer's forward again
    tokens = batches[0].numel() * TINY_CONFIG["num_experts_per_tok"]
    assert [sum(row) for row in counter.take(_OneRank())] == [tokens, tokens]


def test_counting_changes_neither_the_loss_nor_the_gradients():
    results = []
    for counting in (False, True):
        model = tiny_lora_model(TINY_CONFIG)
        if counting:
            router_load.attach_counter(model, "cpu")
        loss = _step(model, _batches(TINY_CONFIG))
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss, grads))
    (loss_off, grads_off), (loss_on, grads_on) = results
    assert loss_on == loss_off
    assert grads_on.keys() == grads_off.keys() and grads_on
    for name, grad in grads_off.items():
        assert torch.equal(grads_on[name], grad), name


def test_the_summary_names_the_worst_layer_and_the_idle_experts():
    out = router_load.summary([[4, 4, 4, 4], [10, 6, 0, 0], [0, 0, 0, 0]])
    assert out["router_max_mean"] == pytest.approx(2.5)  # 10 over a mean of 4 in layer 1; the empty layer is left out
    assert out["router_idle_experts"] == 6
    assert out["router_load"] == [[4, 4, 4, 4], [10, 6, 0, 0], [0, 0, 0, 0]]


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_trainer_reports_the_load_every_interval_and_at_the_phase_end(tmp_path, monkeypatch, family):
    config = CONFIGS[family]
    fed = []  # tokens each step's forwards were given
    original = Phase.micro_batches

    def micro_batches(self):
        batches = original(self)
        fed.append(sum(b["input_ids"].numel() for b in batches))
        return batches

    monkeypatch.setattr(Phase, "micro_batches", micro_batches)
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 3), ("sft", 2)], config=config, metrics={"router_every": 2})
    run(recipe, out=lambda line: None)
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    reported = [(r["kind"], r["step"]) for r in records if "router_load" in r]
    assert reported == [("cpt", 2), ("cpt", 3), ("sft", 2)]
    top_k, layers = config["num_experts_per_tok"], config["num_hidden_layers"]
    intervals = [fed[0] + fed[1], fed[2], fed[3] + fed[4]]  # each interval's steps, each phase counted apart
    for interval, r in zip(intervals, (r for r in records if "router_load" in r), strict=True):
        assert [sum(row) for row in r["router_load"]] == [interval * top_k] * layers
        assert r["router_max_mean"] >= 1.0
        assert r["router_idle_experts"] == sum(c == 0 for row in r["router_load"] for c in row)


def test_router_every_zero_counts_nothing(tmp_path):
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 2)], metrics={"router_every": 0})
    model = run(recipe, out=lambda line: None)
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert not any("router_load" in r for r in records)
    assert all(ROUTER_COUNTER_ATTRIBUTE not in m.__dict__ for m in model.modules())
