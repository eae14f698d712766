"""Adapters out (training/export_adapter.py) on tiny random models with a random, non-zero LoRA: the vLLM layouts
rebuilt by vLLM's own rules give peft's W + s B A for every expert and every targeted module, the merged model gives
the peft model's logits, the peft format reloads with plain peft, and every phase's final checkpoint holds `vllm/`.

How vLLM reads a MoE LoRA adapter (read from vllm-project/vllm; the rebuild functions below follow these rules):

- vllm/lora/peft_helper.py PEFTHelper.__post_init__: scaling = lora_alpha / r (alpha / sqrt(r) only with use_rslora);
  vllm/lora/lora_weights.py LoRALayerWeights.optimize folds it into B: the delta is scaling * B @ A, A (r, in),
  B (out, r) per module, as peft's.
- vllm/lora/utils.py parse_fine_tuned_lora_name: a key `base_model.model.<module>.lora_A|lora_B.weight` names
  <module> (the prefix is stripped; the model's WeightsMapper maps the rest, e.g. model.language_model. ->
  language_model.model. for the Qwen3.5 multimodal classes).
- The layout is fixed by the served class's `is_3d_moe_weight` (vllm/lora/model_manager.py LoRAModelManager.__init__:
  _is_3d_moe_model): Qwen3MoeForCausalLM (vllm/model_executor/models/qwen3_moe.py) leaves it False;
  Qwen3_5MoeForConditionalGeneration (vllm/model_executor/models/qwen3_5.py) sets it True.
- 2-D: vllm/lora/utils.py process_packed_modules_mapping sets packed_modules_mapping["experts"] to
  `weight_name.rstrip(".")` of the model's get_expert_mapping(), which is FusedMoE make_expert_params_mapping
  (vllm/model_executor/layers/fused_moe/): f"experts.{e}.{name}." for e in range(E), name in (gate_proj: w1,
  down_proj: w2, up_proj: w3). LoRAModelManager._create_merged_loras_inplace gathers those per-expert modules and
  PackedLoRALayerWeights.pack_moe (vllm/lora/lora_weights.py) stacks them per expert: w1, w2, w3 lora_a
  (E, r, in) and lora_b (E, out, r). vllm/lora/layers/fused_moe.py FusedMoEWithLoRA.set_lora copies w1 (gate) into
  w13 slice 0, w3 (up) into slice 1 and w2 (down) into the w2 stack; the fused w13 weight is [gate; up] along its
  output rows, as transformers' gate_up_proj is.
- 3-D: LoRAModelManager._stack_moe_lora_weights takes loras[<experts> + ".base_layer"] as gate_up_proj and
  loras[<experts>] as down_proj ("PEFT file format where experts.base_layer is the gate_up_proj and experts is the
  down_proj"), then lora_a.reshape(E, -1, in) -> (E, r, in) and lora_b.reshape(out, -1, E).permute(2, 0, 1) ->
  (E, out, r). FusedMoE3DWithLoRA.set_lora copies w13 (E, 2I, r) as one slice, [gate; up] concatenated (only
  GptOssForCausalLM interleaves them, FusedMoE3DWithLoRA._slice_w13_b). vllm/lora/lora_model.py
  LoRAModel.from_local_checkpoint skips the `base_layer` keys in its unexpected-module check and expects the
  `experts` suffix among the model's LoRA modules.
"""

import json

import pytest
import torch
from peft import PeftModel
from peft.tuners.lora.layer import LoraLayer, ParamWrapper
from safetensors.torch import load_file

from training import checkpoint, export_adapter
from training.examples.tiny import TINY_CONFIG, TINY_QWEN3_5_CONFIG, tiny_recipe
from training.lora import attach_lora, randomize_routed_lora_b, routed_lora_wrappers
from training.train import run

R, ALPHA = 4, 8


def _config(fields):
    from transformers import AutoConfig

    fields = dict(fields)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def _save_qwen3_moe(path):
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(_config(TINY_CONFIG)).float()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.normal_(0, 0.1)
            layer.mlp.experts.down_proj.normal_(0, 0.1)
    model.save_pretrained(path)
    return Qwen3MoeForCausalLM


def _save_qwen3_5_moe(path):
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    config = Qwen3_5MoeConfig(
        text_config=_config(TINY_QWEN3_5_CONFIG).to_dict(),
        vision_config={"depth": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32, "out_hidden_size": 32,
                       "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2},
    )
    torch.manual_seed(0)
    Qwen3_5MoeForConditionalGeneration(config).float().save_pretrained(path)
    return Qwen3_5MoeForConditionalGeneration


FAMILIES = {"qwen3_moe": (_save_qwen3_moe, "2d"), "qwen3_5_moe": (_save_qwen3_5_moe, "3d")}


@torch.no_grad()
def _randomize(model, seed=0):
    """Every LoRA B random (peft starts them at zero), so each delta is non-zero."""
    generator = torch.Generator().manual_seed(seed)
    randomize_routed_lora_b(model, std=0.1, generator=generator)
    for module in model.modules():
        if isinstance(module, LoraLayer) and not isinstance(module, ParamWrapper):
            for layer in module.lora_B.values():
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * 0.1)


@pytest.fixture(params=sorted(FAMILIES))
def trained(request, tmp_path):
    """(family, base class, base path, the LoRA model, its checkpoint folder with adapter/)."""
    save, _ = FAMILIES[request.param]
    cls = save(tmp_path / "base")
    model = attach_lora(cls.from_pretrained(tmp_path / "base", dtype=torch.float32), r=R, alpha=ALPHA)
    _randomize(model)
    model.save_pretrained(tmp_path / "ckpt" / "adapter")
    return request.param, cls, tmp_path / "base", model, tmp_path / "ckpt"


def _tokens():
    return torch.randint(3, 260, (2, 12), generator=torch.Generator().manual_seed(1))


def _experts_key(name):
    """The adapter key prefix of a routed experts module (peft nests its two wrappers as base_layer)."""
    while name.endswith(".base_layer"):
        name = name.removesuffix(".base_layer")
    return name


def _num_experts(model):
    return model.get_base_model().config.get_text_config().num_experts


def vllm_2d_deltas(tensors, scaling, experts, num_experts):
    """(gate_up (E, 2I, H), down (E, H, I)) deltas as vLLM's 2-D path builds them: pack_moe stacks of the per-expert
    modules, w13 = [w1 (gate); w3 (up)]."""
    def stack(projection, factor):
        return torch.stack([tensors[f"{experts}.{e}.{projection}.lora_{factor}.weight"] for e in range(num_experts)])

    w1, w3, w2 = (scaling * torch.bmm(stack(p, "B"), stack(p, "A")) for p in ("gate_proj", "up_proj", "down_proj"))
    return torch.cat([w1, w3], dim=1), w2


def vllm_3d_deltas(tensors, scaling, experts, num_experts):
    """(gate_up, down) deltas as vLLM's _stack_moe_lora_weights reads the fused tensors."""
    deltas = []
    for module in (f"{experts}.base_layer", experts):
        a, b = tensors[f"{module}.lora_A.weight"], tensors[f"{module}.lora_B.weight"]
        a = a.reshape(num_experts, -1, a.shape[-1])
        b = b.reshape(b.shape[0], -1, num_experts).permute(2, 0, 1)
        deltas.append(scaling * torch.bmm(b, a))
    return tuple(deltas)


def _assert_matches_peft(model, out_dir, layout):
    tensors = load_file(out_dir / "adapter_model.safetensors")
    config = json.loads((out_dir / "adapter_config.json").read_text())
    scaling = config["lora_alpha"] / config["r"]
    rebuild = vllm_2d_deltas if layout == "2d" else vllm_3d_deltas
    wrappers = routed_lora_wrappers(model)
    assert wrappers
    for name, parameter, wrapper in wrappers:
        gate_up, down = rebuild(tensors, scaling, _experts_key(name), _num_experts(model))
        ours = gate_up if parameter == "gate_up_proj" else down
        theirs = wrapper.get_delta_weight("default")
        assert theirs.abs().max() > 0
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    modules = [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer) and not isinstance(m, ParamWrapper)]
    assert modules
    for name, module in modules:
        ours = scaling * tensors[f"{name}.lora_B.weight"] @ tensors[f"{name}.lora_A.weight"]
        theirs = module.get_delta_weight("default")
        assert theirs.abs().max() > 0
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    return tensors, config


def test_it_exports_each_family_in_vllm_s_layout_with_peft_s_delta_for_every_expert_and_module(trained, tmp_path):
    family, _, base, model, ckpt = trained
    layout = FAMILIES[family][1]
    assert export_adapter.main(["--format", "vllm", "--adapter", str(ckpt), "--base", str(base),
                                "--out", str(tmp_path / "vllm")]) == 0
    tensors, config = _assert_matches_peft(model, tmp_path / "vllm", layout)
    experts = [k for k in tensors if ".mlp.experts." in k]
    if layout == "2d":
        assert all(k.split(".mlp.experts.")[1].split(".")[0].isdigit() for k in experts)
        assert {"gate_proj", "up_proj", "down_proj"} <= set(config["target_modules"])
        assert len(experts) == 2 * 2 * 3 * _num_experts(model)  # layers x (A, B) x projections x experts
    else:
        assert {k.split(".mlp.experts.")[1] for k in experts} == {
            "base_layer.lora_A.weight", "base_layer.lora_B.weight", "lora_A.weight", "lora_B.weight"}
        assert "experts" in config["target_modules"]
    assert "target_parameters" not in config and (config["r"], config["lora_alpha"]) == (R, ALPHA)


def test_it_reads_gate_up_from_the_shapes_not_from_peft_s_nesting_order():
    num_experts, rank, hidden, inter = 3, 2, 8, 4
    g = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(num_experts * rank, hidden, generator=g), torch.randn(2 * inter, num_experts * rank,
                                                                                 generator=g))
    down = (torch.randn(num_experts * rank, inter, generator=g), torch.randn(hidden, num_experts * rank, generator=g))
    prefix = "base_model.model.model.layers.0.mlp.experts"
    state = {f"{prefix}.lora_A.weight": gate_up[0], f"{prefix}.lora_B.weight": gate_up[1],  # gate_up outside
             f"{prefix}.base_layer.lora_A.weight": down[0], f"{prefix}.base_layer.lora_B.weight": down[1]}
    fused = export_adapter.vllm_tensors(state, rank, "3d")
    assert torch.equal(fused[f"{prefix}.base_layer.lora_A.weight"], gate_up[0])
    assert torch.equal(fused[f"{prefix}.lora_B.weight"], down[1])
    per_expert = export_adapter.vllm_tensors(state, rank, "2d")
    gate, up = vllm_2d_deltas(per_expert, 1.0, prefix, num_experts)[0].split(inter, dim=1)
    a = gate_up[0].view(num_experts, rank, hidden)
    b = gate_up[1].view(2 * inter, rank, num_experts).permute(2, 0, 1)
    torch.testing.assert_close(torch.cat([gate, up], dim=1), torch.bmm(b, a))
    with pytest.raises(export_adapter.ExportError, match="cannot tell gate_up_proj from down_proj"):
        export_adapter.vllm_tensors({**state, f"{prefix}.lora_B.weight": torch.zeros(5, num_experts * rank)}, rank,
                                    "2d")


def test_the_merged_model_gives_the_peft_model_s_logits(trained, tmp_path):
    _, cls, base, model, ckpt = trained
    assert export_adapter.main(["--format", "merged", "--adapter", str(ckpt), "--base", str(base),
                                "--out", str(tmp_path / "merged")]) == 0
    assert list((tmp_path / "merged").glob("*.safetensors")) and (tmp_path / "merged" / "config.json").exists()
    merged = cls.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(cls.from_pretrained(base, dtype=torch.float32), ckpt / "adapter")
    tokens = _tokens()
    with torch.no_grad():
        expected = peft_model(input_ids=tokens).logits
        torch.testing.assert_close(merged(input_ids=tokens).logits, expected, rtol=1e-4, atol=1e-4)
        assert (cls.from_pretrained(base, dtype=torch.float32)(input_ids=tokens).logits - expected).abs().max() > 1e-3


def test_the_peft_format_reloads_with_plain_peft_onto_the_original_class(trained, tmp_path):
    _, cls, base, model, ckpt = trained
    assert export_adapter.main(["--format", "peft", "--adapter", str(ckpt), "--base", str(base),
                                "--out", str(tmp_path / "peft")]) == 0
    assert json.loads((tmp_path / "peft" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    served = PeftModel.from_pretrained(cls.from_pretrained(base, dtype=torch.float32), tmp_path / "peft")
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(served(input_ids=tokens).logits, model(input_ids=tokens).logits, rtol=1e-5,
                                   atol=1e-5)


def test_the_peft_format_warns_where_vllm_cannot_serve_it(trained, tmp_path, capsys):
    family, _, base, _, ckpt = trained
    assert export_adapter.main(["--format", "peft", "--adapter", str(ckpt), "--base", str(base),
                                "--out", str(tmp_path / "peft")]) == 0
    said = capsys.readouterr().err
    # vLLM serves Qwen3-MoE's experts one by one (the 2-D layout): peft's stacked tensors stop its engine.
    assert ("serve --format vllm instead" in said) == (FAMILIES[family][1] == "2d")


def test_it_refuses_a_folder_without_an_adapter_and_merged_without_a_base(tmp_path, capsys):
    assert export_adapter.main(["--format", "vllm", "--adapter", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no peft adapter" in capsys.readouterr().err
    (tmp_path / "adapter").mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (tmp_path / "adapter" / name).write_text("{}")
    assert export_adapter.main(["--format", "merged", "--adapter", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "needs --base" in capsys.readouterr().err


def test_each_phase_s_final_checkpoint_holds_the_vllm_export_next_to_the_adapter(tmp_path):
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 3), ("sft", 1)], checkpoint={"keep": 10})
    run(recipe, out=lambda line: None)
    store = tmp_path / "checkpoints"
    names = sorted(n for n, done in checkpoint.LocalStore(store).names().items() if done)
    assert names == ["ckpt-p00-s00000002", "ckpt-p00-s00000003", "ckpt-p01-s00000001"]
    assert not (store / names[0] / "vllm").exists()  # not a phase's final checkpoint
    for name in names[1:]:
        adapter = load_file(store / name / "adapter" / "adapter_model.safetensors")
        exported = load_file(store / name / "vllm" / "adapter_model.safetensors")
        assert torch.equal(exported["base_model.model.model.layers.0.mlp.experts.5.down_proj.lora_B.weight"],
                           adapter["base_model.model.model.layers.0.mlp.experts.lora_B.weight"][:, 5::6])
        config = json.loads((store / name / "vllm" / "adapter_config.json").read_text())
        assert {"gate_proj", "up_proj", "down_proj", "q_proj"} <= set(config["target_modules"])


def test_a_failing_export_still_uploads_the_checkpoint_and_reports_its_error(tmp_path):
    class Model:
        def save_pretrained(self, folder):
            folder.mkdir(parents=True)
            (folder / "adapter_model.safetensors").write_bytes(b"weights")

    def broken(folder):
        raise export_adapter.ExportError("no layout")

    store = checkpoint.LocalStore(tmp_path / "store")
    uploader = checkpoint.Uploader(store, tmp_path / "staging", keep=3)
    with pytest.raises(export_adapter.ExportError, match="no layout"):
        uploader.save(Model(), {"step": 1}, "ckpt-p00-s00000001", exports=(broken,))
    uploader.wait()
    assert store.names() == {"ckpt-p00-s00000001": True}
    assert (tmp_path / "store" / "ckpt-p00-s00000001" / "adapter" / "adapter_model.safetensors").read_bytes() == \
        b"weights"
