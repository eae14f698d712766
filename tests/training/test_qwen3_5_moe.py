"""The Qwen3.5/3.6-MoE family on a tiny random model (3 Gated DeltaNet layers, 1 attention layer, a shared expert):
its default LoRA targets, every phase, the per-group metrics and guards, and the multimodal checkpoint's adapter."""

import copy
import json
import math

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from training import families, guards
from training.examples.tiny import TINY_QWEN3_5_CONFIG, tiny_recipe
from training.lora import attach_lora, module_lora_parameters, randomize_routed_lora_b, routed_lora_parameters
from training.recipe import ModelSettings, RecipeError
from training.train import build_model, parameter_groups, run

DELTANET = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")


def _text_config():
    from transformers import AutoConfig

    fields = dict(TINY_QWEN3_5_CONFIG)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


@pytest.fixture
def qwen35():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(_text_config()).float()


@pytest.fixture
def tokens():
    return torch.randint(3, 260, (2, 12), generator=torch.Generator().manual_seed(1))


def _lora_modules(model):
    return {name for name, module in model.named_modules() if hasattr(module, "lora_A") and "layers." in name}


def _randomize_module_b(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for params in module_lora_parameters(model).values():
            for name, param in params.items():
                if ".lora_B." in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def test_the_default_targets_are_the_deltanet_projections_attention_and_the_shared_expert(qwen35):
    model = attach_lora(qwen35, r=4, alpha=8)
    wrapped = _lora_modules(model)
    for layer in range(3):
        for projection in DELTANET:
            assert any(n.endswith(f"layers.{layer}.linear_attn.{projection}") for n in wrapped), projection
    for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert any(n.endswith(f"layers.3.self_attn.{projection}") for n in wrapped), projection
    for layer in range(4):
        for projection in ("gate_proj", "up_proj", "down_proj"):
            assert any(n.endswith(f"layers.{layer}.mlp.shared_expert.{projection}") for n in wrapped)
    for frozen in families.family_of(qwen35.config).frozen:
        assert not any(n.endswith(frozen) or f"{frozen}." in n for n in wrapped), frozen
    assert len(routed_lora_parameters(model)) == 4 * 2 * 2  # 4 layers x (gate_up, down) x (A, B)
    groups = module_lora_parameters(model)
    assert set(groups) == {"attention", "linear_attention", "shared_expert"}
    assert len(groups["linear_attention"]) == 3 * 5 * 2 and len(groups["shared_expert"]) == 4 * 3 * 2


def test_a_recipe_replaces_a_group_and_a_wrong_path_or_group_is_refused(qwen35, tmp_path):
    model = attach_lora(copy.deepcopy(qwen35), r=4, alpha=8, targets={"shared_expert": [],
                                                                      "linear_attention": ["linear_attn.out_proj"]})
    wrapped = _lora_modules(model)
    assert not any("shared_expert" in n for n in wrapped)
    assert {n.rsplit(".", 1)[-1] for n in wrapped if "linear_attn" in n} == {"out_proj"}
    with pytest.raises(ValueError, match="in_proj_qkvz.*names no module"):
        attach_lora(copy.deepcopy(qwen35), r=4, alpha=8, targets={"linear_attention": ["linear_attn.in_proj_qkvz"]})
    with pytest.raises(RecipeError) as error:
        tiny_recipe(tmp_path, lora={"targets": {"routed": [], "attention": "self_attn.q_proj"}})
    assert "unknown group 'routed'" in str(error.value) and "lora.targets.attention" in str(error.value)


def test_the_routed_gradient_norm_leaves_the_shared_expert_out(qwen35, tokens):
    model = attach_lora(qwen35, r=4, alpha=8)
    groups = parameter_groups(model)
    routed = {id(p) for p in groups["routed"]}
    assert routed == {id(p) for p in routed_lora_parameters(model).values()}
    for group in ("attention", "linear_attention", "shared_expert"):
        assert groups[group] and not routed & {id(p) for p in groups[group]}, group
    assert groups["other"] == []


def test_every_phase_runs_and_reports_each_group_apart(tmp_path):
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 1), ("sft", 1), ("dpo", 1), ("kto", 1), ("grpo", 1)],
                         config=TINY_QWEN3_5_CONFIG, grad_accum=1)
    run(recipe, out=lambda line: None)
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["kind"] for r in records] == ["cpt", "sft", "dpo", "kto", "grpo"]
    for r in records:
        assert math.isfinite(r["loss"]), r
        groups = ("routed", "attention", "linear_attention", "shared_expert", "other")
        assert r["grad_norm_total"] == pytest.approx(math.hypot(*(r[f"grad_norm_{g}"] for g in groups)), rel=1e-5)
    for r in records[:4]:
        assert r["guard_checked"]
        assert min(r["grad_norm_routed"], r["grad_norm_attention"], r["grad_norm_linear_attention"],
                   r["grad_norm_shared_expert"]) > 0, r


def _detach_output(monkeypatch, module):
    forward = module.forward
    monkeypatch.setattr(module, "forward", lambda *args, **kwargs: forward(*args, **kwargs).detach())


@pytest.mark.parametrize("where, group", [("layers.1.mlp.shared_expert", "shared_expert"),
                                          ("layers.0.linear_attn.in_proj_b", "linear_attention")])
def test_the_step_one_guard_fires_when_one_targeted_module_is_cut_from_the_graph(qwen35, tokens, monkeypatch,
                                                                                  where, group):
    model = attach_lora(qwen35, r=4, alpha=8)
    _detach_output(monkeypatch, next(m for n, m in model.named_modules() if n.endswith(where)))
    model(input_ids=tokens, labels=tokens).loss.backward()
    guards.check_routed_lora_grads(model)  # the routed experts still learn
    with pytest.raises(guards.LoraNoGradient, match=rf"{group}: \d+ of \d+ LoRA parameters got no gradient") as error:
        guards.check_lora_grads(model)
    assert where in str(error.value)


def test_the_healthy_model_passes_the_guard_with_every_group(qwen35, tokens):
    model = attach_lora(qwen35, r=4, alpha=8)
    model(input_ids=tokens, labels=tokens).loss.backward()
    norms = guards.check_lora_grads(model)
    assert any("linear_attn.in_proj_a" in n and v for n, v in norms.items())
    assert any("shared_expert.down_proj" in n and v for n, v in norms.items())


def test_the_trainer_stops_at_step_one_when_the_shared_expert_is_detached(tmp_path, monkeypatch):
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modeling

    forward = modeling.Qwen3_5MoeMLP.forward
    monkeypatch.setattr(modeling.Qwen3_5MoeMLP, "forward", lambda self, x: forward(self, x).detach())
    with pytest.raises(guards.LoraNoGradient, match="shared_expert"):
        run(tiny_recipe(tmp_path, phases=[("cpt", 1)], config=TINY_QWEN3_5_CONFIG), out=lambda line: None)
    assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text()


def _multimodal_checkpoint(path):
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    config = Qwen3_5MoeConfig(
        text_config=_text_config().to_dict(),
        vision_config={"depth": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32, "out_hidden_size": 32,
                       "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2},
    )
    torch.manual_seed(0)
    Qwen3_5MoeForConditionalGeneration(config).save_pretrained(path)
    return Qwen3_5MoeForConditionalGeneration


def test_a_multimodal_checkpoint_trains_its_text_model_and_its_adapter_loads_back_with_plain_peft(tmp_path, tokens):
    cls = _multimodal_checkpoint(tmp_path / "checkpoint")
    base = build_model(ModelSettings(path=str(tmp_path / "checkpoint"), dtype="float32"), torch.device("cpu"))
    assert type(base) is cls
    model = attach_lora(base, r=4, alpha=8)
    assert _lora_modules(model) and all(".language_model.layers." in n for n in _lora_modules(model))
    randomize_routed_lora_b(model, std=0.1, generator=torch.Generator().manual_seed(0))
    _randomize_module_b(model)
    ours = model(input_ids=tokens).logits
    model.save_pretrained(tmp_path / "adapter")

    keys = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert all(k.startswith("base_model.model.model.language_model.layers.") for k in keys)
    assert any("linear_attn.in_proj_qkv" in k for k in keys) and any("shared_expert.up_proj" in k for k in keys)
    served = PeftModel.from_pretrained(cls.from_pretrained(tmp_path / "checkpoint", dtype=torch.float32),
                                       tmp_path / "adapter")
    theirs = served(input_ids=tokens).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    with served.disable_adapter():
        assert (served(input_ids=tokens).logits - ours).abs().max() > 1e-3  # the adapter is in those logits
