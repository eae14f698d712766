"""Held-out validation and each phase kind's metrics on a tiny 2-layer Qwen3-MoE on the CPU: the validation loss is
the model's own loss with labels on the same records, the DPO/KTO/GRPO figures are the hand-computed ones, the split
is the same after a restart and apart from the training records, and a recipe's slips are named."""

import json
import math
import shutil

import pytest
import torch

from training import validation
from training.data import collate, phase_items, read_records, split_records
from training.examples.tiny import HERE, PHASES, TINY_CONFIG, tiny_recipe
from training.lora import attach_lora
from training.losses import dpo_terms, group_figures, kl_estimate, kto_terms, preference_means, sequence_logps
from training.recipe import ModelSettings, RecipeError, validate
from training.records import ByteTokenizer
from training.train import build_model, run

TOKENIZER = ByteTokenizer(TINY_CONFIG["vocab_size"])


@pytest.fixture(scope="module")
def model():
    """The tiny model with LoRA whose B factors are not zero, so the adapter changes what it computes."""
    base = build_model(ModelSettings(config=dict(TINY_CONFIG), dtype="float32"), "cpu")
    peft_model = attach_lora(base, r=4, alpha=8)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    peft_model.train()
    return peft_model


@pytest.mark.parametrize("kind", ["cpt", "sft"])
def test_the_validation_loss_is_the_models_own_loss_with_labels_on_the_same_packed_rows(model, kind):
    items = phase_items(kind, read_records(HERE / f"{kind}.jsonl", kind)[:6], TOKENIZER, 64)
    assert len(items) >= 3  # several rows, so the mean runs over several batches of 2
    figures = validation.validate(model, kind, items, settings={}, batch_size=2, tokenizer=TOKENIZER,
                                  device=torch.device("cpu"))
    assert model.training  # back to training mode
    batch = collate(kind, items, TOKENIZER.pad_token_id)
    model.eval()
    with torch.no_grad():
        theirs = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"]).loss
    model.train()
    assert figures["eval_loss"] == pytest.approx(float(theirs), rel=1e-5)
    if kind == "cpt":
        assert figures["eval_perplexity"] == pytest.approx(math.exp(float(theirs)), rel=1e-5)
    else:
        assert "eval_perplexity" not in figures
    assert figures["eval_s"] > 0


def test_dpo_figures_are_trls_on_two_pairs_by_hand():
    # Rows [chosen 1, chosen 2, rejected 1, rejected 2]; beta 0.1.
    logps, ref = torch.tensor([-10.0, -12.0, -11.0, -11.5]), torch.tensor([-10.5, -12.0, -10.0, -12.0])
    losses, figures = dpo_terms(logps, ref, 0.1)
    # chosen rewards 0.1 * (0.5, 0) = (0.05, 0); rejected 0.1 * (-1, 0.5) = (-0.1, 0.05)
    assert float(figures["rewards_chosen"]) == pytest.approx(0.025)
    assert float(figures["rewards_rejected"]) == pytest.approx(-0.025)
    assert float(figures["rewards_accuracy"]) == 0.5  # the first pair ranked right, the second not
    assert float(figures["rewards_margin"]) == pytest.approx(0.05)  # (0.15 + -0.05) / 2
    assert losses.tolist() == pytest.approx([-math.log(1 / (1 + math.exp(-0.15))),
                                             -math.log(1 / (1 + math.exp(0.05)))])


def test_kto_figures_are_trls_on_two_completions_by_hand():
    settings = {"beta": 0.5, "desirable_weight": 1.0, "undesirable_weight": 1.0}
    logps, ref = torch.tensor([-5.0, -7.0]), torch.tensor([-6.0, -6.0])
    losses, kl, sums = kto_terms(logps, ref, torch.tensor([True, False]), settings)
    assert float(kl) == 0.0  # the log-ratios (1, -1) average to 0
    figures = preference_means({**sums, "kl": kl})
    assert figures["rewards_chosen"] == pytest.approx(0.5) and figures["rewards_rejected"] == pytest.approx(-0.5)
    assert figures["rewards_margin"] == pytest.approx(1.0)
    assert losses.tolist() == pytest.approx([1 - 1 / (1 + math.exp(-0.5))] * 2)
    # Two desirable completions: no undesirable reward and no margin, not a made-up 0.
    _, kl, sums = kto_terms(logps, ref + torch.tensor([2.0, 0.0]), torch.tensor([True, True]), settings)
    figures = preference_means({**sums, "kl": kl})
    assert figures["rewards_rejected"] is None and figures["rewards_margin"] is None
    assert figures["rewards_chosen"] == pytest.approx(0.5 * (-1 - 1) / 2)


def test_grpo_figures_are_trls_on_two_groups_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])  # two prompts, two completions each
    keep = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    advantages, figures = group_figures(rewards, 2, keep)
    assert figures["reward_mean"] == pytest.approx(0.5)
    assert figures["reward_std"] == pytest.approx(math.sqrt(0.5) / 2)  # (std of (1, 0) + std of (0.5, 0.5)) / 2
    assert figures["zero_spread_groups"] == 0.5 and figures["completion_length"] == 2.0
    assert advantages[2:].tolist() == [0.0, 0.0]
    ref, logps = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]])
    assert kl_estimate(ref, logps, torch.ones(1, 2)) == pytest.approx((math.exp(0.5) - 0.5 - 1) / 2)
    # A policy a hair from its reference: float32 would round exp(d) - d - 1 below 0, which the dashboard refuses.
    near = torch.linspace(-3e-4, 3e-4, 997).unsqueeze(0)
    assert 0 <= kl_estimate(near, torch.zeros_like(near), torch.ones_like(near)) < 1e-7


def test_held_out_dpo_and_kto_figures_are_those_of_each_pair_against_its_reference(model):
    device = torch.device("cpu")
    for kind, settings in (("dpo", {"beta": 0.1}),
                           ("kto", {"beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.0})):
        records = read_records(HERE / f"{kind}.jsonl", kind)[:2]
        items = phase_items(kind, records, TOKENIZER, 64)
        model.eval()
        with torch.no_grad():
            mine = sequence_logps(model, collate(kind, items, TOKENIZER.pad_token_id))
        model.train()
        reference = (torch.stack([mine[:2], mine[2:]], dim=-1) if kind == "dpo" else mine) - 0.25
        figures = validation.validate(model, kind, items, settings=settings, batch_size=1, tokenizer=TOKENIZER,
                                      device=device, reference=reference)
        if kind == "dpo":  # every log-prob gained 0.25 over its reference: rewards 0.025, no margin
            assert figures["eval_rewards_chosen"] == pytest.approx(0.025, abs=1e-5)
            assert figures["eval_rewards_rejected"] == pytest.approx(0.025, abs=1e-5)
            assert figures["eval_rewards_margin"] == pytest.approx(0.0, abs=1e-5)
            assert figures["eval_loss"] == pytest.approx(math.log(2), abs=1e-5)
        else:
            labels = [r["label"] for r in records]
            if all(labels) or not any(labels):
                assert figures["eval_rewards_margin"] is None
            assert figures["eval_rewards_chosen" if labels[0] else "eval_rewards_rejected"] == \
                pytest.approx(0.025, abs=1e-5)
            kl = 0.25  # the KL estimate is the mean log-ratio
            want = [1 - torch.sigmoid(torch.tensor(0.1 * (0.25 - kl if lab else kl - 0.25))).item() for lab in labels]
            assert figures["eval_loss"] == pytest.approx(sum(want) / 2, abs=1e-5)


def test_held_out_grpo_reward_is_the_phase_functions_on_greedy_completions(model):
    items = phase_items("grpo", read_records(HERE / "grpo.jsonl", "grpo")[:3], TOKENIZER, 64)
    settings = {"max_new_tokens": 6, "temperature": 1.0}
    lengths = []

    def length(prompt, completion, record):
        lengths.append(len(completion))
        return float(len(completion))

    figures = validation.validate(model, "grpo", items, settings=settings, batch_size=2, tokenizer=TOKENIZER,
                                  device=torch.device("cpu"), reward_fn=length)
    assert len(lengths) == 3  # one greedy completion per held-out prompt
    assert figures["eval_reward_mean"] == pytest.approx(sum(lengths) / 3)
    assert figures["eval_reward_std"] == pytest.approx(float(torch.tensor(lengths, dtype=torch.float).std()))
    again = validation.validate(model, "grpo", items, settings=settings, batch_size=2, tokenizer=TOKENIZER,
                                device=torch.device("cpu"), reward_fn=length)
    assert again["eval_reward_mean"] == figures["eval_reward_mean"]  # greedy: the same answers every time


def test_the_split_is_the_records_own_and_the_seeds_whatever_the_order():
    records = read_records(HERE / "cpt.jsonl", "cpt")
    train, held = split_records(records, 0.25, seed=7)
    assert held and train and len(train) + len(held) == len(records)
    canonical = {json.dumps(r, sort_keys=True) for r in held}
    assert not canonical & {json.dumps(r, sort_keys=True) for r in train}
    shuffled = list(reversed(records))
    assert {json.dumps(r, sort_keys=True) for r in split_records(shuffled, 0.25, seed=7)[1]} == canonical
    assert split_records(records, 0.25, seed=8)[1] != held  # another run's seed, another split
    assert len(split_records(records, 1e-9, seed=7)[1]) == 1  # a tiny share still holds one record out
    with pytest.raises(ValueError, match="at least 2 records"):
        split_records(records[:1], 0.5, seed=7)


def _records(path):
    return [json.loads(line) for line in open(path) if '"step"' in line]


def test_a_resumed_phase_validates_on_the_same_held_out_records(tmp_path):
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 4)])
    recipe["phases"][0].update(eval_split=0.25, eval_every=2)
    lines = []
    run(recipe, out=lines.append)
    first = _records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in first if r["eval_loss"] is not None] == [2, 4]  # every 2 steps; 4 is the end too
    assert all(r["eval_s"] is None for r in first if r["step"] in (1, 3))
    assert any("held-out loss" in line for line in lines)
    # The box dies after step 4's checkpoint was written but before it reached the store: the next box resumes
    # from step 2, and its validation at step 4 sees the very records the first one did.
    shutil.rmtree(tmp_path / "checkpoints" / "ckpt-p00-s00000004")
    (tmp_path / "metrics.jsonl").unlink()
    run(recipe, out=lines.append)
    again = _records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in again] == [3, 4]
    assert again[-1]["eval_loss"] == pytest.approx(first[-1]["eval_loss"], rel=1e-6)
    assert again[-1]["eval_perplexity"] == pytest.approx(first[-1]["eval_perplexity"], rel=1e-6)


def _recipe(tmp_path, settings):
    recipe = {"model": {"config": dict(TINY_CONFIG)}, "checkpoint": {"store": str(tmp_path / "c")},
              "phases": [{**PHASES["cpt"], "steps": 2, **settings}]}
    return validate(recipe, base_dir=tmp_path)


@pytest.mark.parametrize("settings, words", [
    ({"eval_split": 0.7}, "phases[0] (cpt).eval_split: a share of the phase's records above 0 and at most 0.5"),
    ({"eval_split": "a tenth"}, "phases[0] (cpt).eval_split: a share"),
    ({"eval_split": 0.1, "eval_every": -1}, "phases[0] (cpt).eval_every: must be an integer >= 0, got -1"),
    ({"eval_data": "held.jsonl"}, "phases[0] (cpt).eval_data: no such file"),
    ({"eval_data": str(HERE / "cpt.jsonl"), "eval_split": 0.1}, "give eval_data (a held-out file) or eval_split"),
    ({"eval_every": 50}, "eval_every: validates held-out data; give eval_data or eval_split too"),
])
def test_a_recipes_held_out_slips_are_named(tmp_path, settings, words):
    with pytest.raises(RecipeError) as caught:
        _recipe(tmp_path, settings)
    assert words in str(caught.value)


def test_an_eval_phase_takes_no_held_out_settings_and_a_good_one_is_filled_in(tmp_path):
    recipe = _recipe(tmp_path, {"eval_data": str(HERE / "cpt.jsonl"), "eval_every": 10})
    phase = recipe["phases"][0]
    assert phase["eval_data"] == str(HERE / "cpt.jsonl")
    assert phase["eval_split"] == 0.0 and phase["eval_every"] == 10
    with pytest.raises(RecipeError, match=r"unknown setting\(s\) eval_split for a eval phase"):
        validate({"model": {"config": dict(TINY_CONFIG)}, "phases": [
            {**PHASES["cpt"], "steps": 2},
            {"kind": "eval", "data": str(HERE / "eval.jsonl"), "eval_split": 0.1}]}, base_dir=tmp_path)


def test_non_finite_held_out_figures_are_left_out(model, monkeypatch):
    monkeypatch.setattr(validation, "_causal_lm", lambda *args: {"eval_loss": float("nan"),
                                                                  "eval_perplexity": float("inf")})
    figures = validation.validate(model, "cpt", [], settings={}, batch_size=2, tokenizer=TOKENIZER,
                                  device=torch.device("cpu"))
    assert figures["eval_loss"] is None and figures["eval_perplexity"] is None and figures["eval_s"] >= 0
