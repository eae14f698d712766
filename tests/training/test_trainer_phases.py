"""The trainer on a tiny random Qwen3-MoE: every phase through the one loop, the overfit check, the guards, the
recipe."""

import json
import math

import pytest

from training import guards, moe_lora, rollout
from training.examples.tiny import tiny_recipe
from training.recipe import RecipeError, load_recipe, validate
from training.train import main, run
from training import metric_fields


def _records(path):
    return [json.loads(line) for line in open(path)]


def test_it_runs_every_phase_with_finite_losses_and_all_metrics(tmp_path):
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 2), ("sft", 2), ("dpo", 2), ("kto", 2), ("grpo", 2)])
    lines = []
    model = run(recipe, out=lines.append)
    # The rollouts' caches are given back when the GRPO phase ends.
    assert rollout.DECODERS_ATTRIBUTE not in model.get_base_model().__dict__
    records = _records(tmp_path / "metrics.jsonl")
    kinds = ("cpt", "sft", "dpo", "kto", "grpo")
    assert [(r["kind"], r["step"]) for r in records] == [(k, s) for k in kinds for s in (1, 2)]
    for r in records:
        assert math.isfinite(r["loss"]), r
        assert set(metric_fields.NAMES) <= set(r)  # every field the dashboard stores, under its wire name
        assert r["kernel_path"] == "loop"
        assert r["routed_b_count"] == 4  # 2 layers x (gate_up, down)
        total = math.hypot(r["grad_norm_routed"], r["grad_norm_attention"])
        assert r["grad_norm_total"] == pytest.approx(total, rel=1e-5)
    # Every phase checks the routed gradient at its first step with gradient signal.
    for kind in ("cpt", "sft", "dpo", "kto"):
        assert next(r for r in records if r["kind"] == kind)["guard_checked"]
    grpo = [r for r in records if r["kind"] == "grpo"]
    assert any(r["guard_checked"] for r in grpo) or not any(r["signal"] for r in grpo)
    assert all(r["routed_b_zero"] == 0 for r in records)
    assert records[-1]["reward_mean"] is not None and records[4]["rewards_accuracy"] is not None
    assert lines[-1] == "run complete" and "routed B norm" in lines[0]


def test_it_overfits_a_fixed_batch_and_grows_the_routed_lora_b(tmp_path):
    data = tmp_path / "one.jsonl"
    # Shorter than seq_len: one packed row, the same batch every step.
    data.write_text(json.dumps({"text": "the router picks two experts for every token "}) + "\n")
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 20)], lr=1e-2, schedule="constant", grad_accum=1, batch_size=1,
                         max_grad_norm=0.0, checkpoint={"every": 100})
    recipe["phases"][0]["data"] = str(data)
    # Wider random weights than the default 0.02, so the frozen lm_head lets a rank-4 adapter move the logits.
    recipe["model"]["config"]["initializer_range"] = 0.2
    run(recipe, out=lambda line: None)
    records = _records(tmp_path / "metrics.jsonl")
    assert len(records) == 20
    assert records[-1]["loss"] < 0.7 * records[0]["loss"]
    assert records[-1]["routed_b_norm"] > 3 * records[0]["routed_b_norm"] > 0
    assert records[0]["grad_norm_routed"] > 0


def _detach_the_experts(monkeypatch):
    """The routed experts' output is cut from the graph: our forward runs and its delta is in the loss, but no
    gradient reaches the routed LoRA (what a wrapper that ran the experts under no_grad would do)."""
    apply = moe_lora.MoeLoraExperts.apply
    monkeypatch.setattr(moe_lora.MoeLoraExperts, "apply", staticmethod(lambda *args: apply(*args).detach()))


def test_it_aborts_when_the_routed_experts_get_no_gradient(tmp_path, monkeypatch):
    _detach_the_experts(monkeypatch)
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 3)])
    with pytest.raises(guards.RoutedLoraNoGradient, match="got no gradient at step 1"):
        run(recipe, out=lambda line: None)
    records = _records(tmp_path / "metrics.jsonl") if (tmp_path / "metrics.jsonl").exists() else []
    assert records == []  # no step was recorded, no checkpoint written
    assert not (tmp_path / "checkpoints").exists() or not list((tmp_path / "checkpoints").iterdir())


def test_the_cli_exits_with_a_clear_message_when_a_guard_fires(tmp_path, monkeypatch, capsys):
    _detach_the_experts(monkeypatch)
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(json.dumps({
        "model": {"config": tiny_recipe(tmp_path)["model"]["config"], "dtype": "float32"},
        "lora": {"r": 4, "alpha": 8}, "seq_len": 64, "batch_size": 1, "grad_accum": 1,
        "phases": [{"kind": "cpt", "data": tiny_recipe(tmp_path)["phases"][0]["data"], "steps": 1}],
    }))
    assert main(["--recipe", str(recipe_file)]) == 3
    assert "ABORTED by a guard" in capsys.readouterr().err


def test_it_rejects_a_bad_recipe_listing_every_problem(tmp_path):
    with pytest.raises(RecipeError) as error:
        validate({"model": {"path": "x", "config": {}}, "lora": {"r": 0}, "batch_size": "two", "schedule": "cos",
                  "phases": [{"kind": "sft", "data": str(tmp_path / "missing.jsonl"), "steps": 0},
                             {"kind": "grpo", "data": str(tmp_path / "missing.jsonl"), "steps": 1,
                              "num_generations": 1},
                             {"kind": "ppo"}], "epochs": 3}, base_dir=tmp_path)
    message = str(error.value)
    for fragment in ("exactly one of model.path", "lora.r", "batch_size", "schedule", "no such file", "steps",
                     "reward", "num_generations", "'ppo'", "unknown setting 'epochs'"):
        assert fragment in message, fragment


def test_it_loads_a_yaml_recipe_with_defaults_and_relative_paths(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "r.yaml").write_text("model: {path: Qwen/Qwen3-30B-A3B}\n"
                                     "phases:\n  - {kind: cpt, data: d.jsonl, steps: 5}\n")
    recipe = load_recipe(tmp_path / "r.yaml")
    assert recipe["seq_len"] == 2048 and recipe["lora"] == {"r": 32, "alpha": 64, "attention": True, "targets": None}
    assert recipe["phases"][0]["data"] == str(tmp_path / "d.jsonl")
    assert recipe["checkpoint"]["store"] == str(tmp_path / "checkpoints")
    with pytest.raises(RecipeError, match="not valid YAML"):
        (tmp_path / "bad.yaml").write_text("model: [\n")
        load_recipe(tmp_path / "bad.yaml")


def test_sft_labels_cover_only_assistant_turns():
    from training.data import IGNORE, ByteTokenizer, render_chat

    tok = ByteTokenizer(260)
    ids, labels = render_chat(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    learned = tok.decode([i for i, label in zip(ids, labels, strict=True) if label != IGNORE])
    assert learned == "yo\n" and labels[-1] == tok.eos_token_id  # the turn's header is the template's, not trained
    assert all(label == IGNORE for label in labels[: len(tok.encode("<|user|>\nhi\n<|assistant|>\n"))])
