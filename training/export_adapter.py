"""Adapters out: peft's format, vLLM's layout for the model, or merged into the base weights. `python -m
training.export_adapter --format {peft,vllm,merged} --adapter DIR --base MODEL --out DIR` (docs/training.md,
"training/export_adapter.py")."""

import argparse
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from training.grouped_ops import experts_a, experts_b

ADAPTER_DIR, VLLM_DIR = "adapter", "vllm"
WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
PEFT_PREFIX = "base_model.model."
# The model classes vLLM serves with 3-D MoE LoRA (`is_3d_moe_weight = True` in vllm/model_executor/models/); every
# other MoE class reads 2-D per-expert modules.
VLLM_3D_MOE_ARCHITECTURES = frozenset({"Qwen3_5MoeForConditionalGeneration"})
LAYOUTS = ("2d", "3d")
# vLLM 0.26.0 on an H200: loading peft's layout (3-D expert tensors) on such a model stops its whole engine.
PEFT_NOT_FOR_VLLM = ("note: this peft layout is for transformers + peft; vLLM holds this model's experts one by one "
                     "and its engine stops on peft's stacked expert tensors: serve --format vllm instead")
_ROUTED_KEY = re.compile(r"^(?P<experts>.*\.experts)(?P<nest>(?:\.base_layer)*)\.lora_(?P<factor>[AB])\.weight$")


class ExportError(ValueError):
    """An adapter that cannot be exported as asked; the message says what is wrong with it."""


@dataclass
class RoutedLora:
    """One experts module's LoRA in peft's layout: gate_up = (A (r * E, H), B (2I, r * E)), down = (A (r * E, I),
    B (H, r * E))."""

    experts: str  # the key prefix, e.g. base_model.model.model.layers.0.mlp.experts
    gate_up: tuple
    down: tuple
    num_experts: int

    def per_expert(self, factors):
        """(A (E, r, in), B (E, out, r)) views of one projection's factors."""
        a, b = factors
        return experts_a(a, self.num_experts), experts_b(b, self.num_experts)


def split_routed(state, rank):
    """({experts prefix: RoutedLora}, every other tensor) of a peft adapter state dict of rank `rank`."""
    groups, rest = {}, {}
    for key, tensor in state.items():
        match = _ROUTED_KEY.match(key)
        if match is None:
            rest[key] = tensor
        else:
            groups.setdefault(match["experts"], {}).setdefault(match["nest"], {})[match["factor"]] = tensor
    return {experts: _routed(experts, nests, rank) for experts, nests in groups.items()}, rest


def _routed(experts, nests, rank):
    pairs = [(nest, factors.get("A"), factors.get("B")) for nest, factors in sorted(nests.items())]
    if len(pairs) != 2 or any(a is None or b is None for _, a, b in pairs):
        found = [f"{experts}{nest}.lora_{factor}" for nest, factors in sorted(nests.items()) for factor in factors]
        raise ExportError(f"{experts}: expected LoRA A and B on both gate_up_proj and down_proj, found {found}")
    (_, a1, b1), (_, a2, b2) = pairs
    for a, b in ((a1, b1), (a2, b2)):
        if a.shape[0] % rank or a.shape[0] != b.shape[1]:
            raise ExportError(f"{experts}: LoRA A {tuple(a.shape)} and B {tuple(b.shape)} are not rank {rank} "
                              "per expert")
    # gate_up maps H -> 2I and down maps I -> H: exactly one assignment fits.
    fits = [(gu, dn) for gu, dn in (((a1, b1), (a2, b2)), ((a2, b2), (a1, b1)))
            if gu[1].shape[0] == 2 * dn[0].shape[1] and gu[0].shape[1] == dn[1].shape[0]]
    if len(fits) != 1:
        raise ExportError(f"{experts}: cannot tell gate_up_proj from down_proj by the LoRA shapes "
                          f"{[tuple(t.shape) for t in (a1, b1, a2, b2)]}")
    if a1.shape[0] != a2.shape[0]:
        raise ExportError(f"{experts}: gate_up_proj and down_proj LoRA have different expert counts")
    gate_up, down = fits[0]
    return RoutedLora(experts, gate_up, down, a1.shape[0] // rank)


def vllm_layout(architecture):
    """"3d" for the model classes vLLM serves with 3-D MoE LoRA, "2d" otherwise."""
    return "3d" if architecture in VLLM_3D_MOE_ARCHITECTURES else "2d"


def vllm_tensors(state, rank, layout):
    """The adapter's tensors in vLLM's `layout` ("2d" or "3d"), each contiguous and in its own storage."""
    if layout not in LAYOUTS:
        raise ExportError(f"unknown vLLM layout {layout!r}; expected one of {LAYOUTS}")
    routed, out = split_routed(state, rank)
    out = {key: tensor.contiguous() for key, tensor in out.items()}
    for experts, lora in routed.items():
        if layout == "3d":
            for name, (a, b) in ((f"{experts}.base_layer", lora.gate_up), (experts, lora.down)):
                out[f"{name}.lora_A.weight"], out[f"{name}.lora_B.weight"] = a.contiguous(), b.contiguous()
            continue
        gate_up_a, gate_up_b = lora.per_expert(lora.gate_up)
        down_a, down_b = lora.per_expert(lora.down)
        half = gate_up_b.shape[1] // 2
        for e in range(lora.num_experts):
            prefix = f"{experts}.{e}"
            for projection, a, b in (("gate_proj", gate_up_a[e], gate_up_b[e, :half]),
                                     ("up_proj", gate_up_a[e], gate_up_b[e, half:]),
                                     ("down_proj", down_a[e], down_b[e])):
                # Each in its own contiguous storage: safetensors refuses tensors that share memory.
                out[f"{prefix}.{projection}.lora_A.weight"] = a.clone(memory_format=torch.contiguous_format)
                out[f"{prefix}.{projection}.lora_B.weight"] = b.clone(memory_format=torch.contiguous_format)
    return out


def check_exportable(peft_config):
    """Refuse what the vLLM layouts cannot say: one rank and one scale lora_alpha / r for every module."""
    for field_name in ("rank_pattern", "alpha_pattern"):
        if peft_config.get(field_name):
            raise ExportError(f"{field_name} is not exported: this export writes every module at one rank and "
                              "scale, as the trainer trains them")
    if peft_config.get("use_dora"):
        raise ExportError("DoRA adapters are not exported: vLLM serves no DoRA")
    if peft_config.get("use_rslora"):
        raise ExportError("rsLoRA adapters are not exported: this export scales by lora_alpha / r, as the trainer "
                          "trains them")


def vllm_config(peft_config, tensors):
    """adapter_config.json for the vLLM layout: peft's, with `target_modules` naming the modules the tensors hold
    (by their last name, as vLLM matches them) and no `target_parameters`."""
    check_exportable(peft_config)
    modules = {key.rsplit(".", 2)[0].removesuffix(".base_layer").rsplit(".", 1)[-1] for key in tensors}
    config = {key: value for key, value in peft_config.items() if key != "target_parameters"}
    config["target_modules"] = sorted(modules)
    return config


def read_adapter(path):
    """(state dict, adapter_config, folder) of a peft adapter folder, or of a checkpoint folder's `adapter/`."""
    from safetensors.torch import load_file

    folder = Path(path)
    if not (folder / CONFIG).exists() and (folder / ADAPTER_DIR / CONFIG).exists():
        folder = folder / ADAPTER_DIR
    if not (folder / CONFIG).exists() or not (folder / WEIGHTS).exists():
        raise ExportError(f"{path}: no peft adapter ({CONFIG} and {WEIGHTS}) here or in its {ADAPTER_DIR}/")
    return load_file(folder / WEIGHTS), json.loads((folder / CONFIG).read_text()), folder


def architecture_of(peft_config, base_config=None):
    """The model class the adapter was trained on: the base config's `architectures`, else what peft recorded."""
    for name in getattr(base_config, "architectures", None) or []:
        return name
    name = (peft_config.get("auto_mapping") or {}).get("base_model_class")
    if not name:
        raise ExportError("the adapter does not say which model class it was trained on; give --base or --layout")
    return name


def write_vllm(state, peft_config, out_dir, layout):
    from safetensors.torch import save_file

    check_exportable(peft_config)
    tensors = vllm_tensors(state, peft_config["r"], layout)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out_dir / WEIGHTS, metadata={"format": "pt"})
    (out_dir / CONFIG).write_text(json.dumps(vllm_config(peft_config, tensors), indent=2, sort_keys=True) + "\n")
    return out_dir


def write_vllm_export(checkpoint_dir, architecture=None):
    """The trainer's hook: `vllm/` next to the `adapter/` just saved in a checkpoint folder, read from those files.
    architecture: the trained model's class name (default: the one peft recorded in the adapter)."""
    state, peft_config, _ = read_adapter(Path(checkpoint_dir) / ADAPTER_DIR)
    layout = vllm_layout(architecture or architecture_of(peft_config))
    return write_vllm(state, peft_config, Path(checkpoint_dir) / VLLM_DIR, layout)


def write_peft(adapter_folder, out_dir, base=None):
    """The peft adapter as it is, naming `base` as its base model when given."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(adapter_folder) / WEIGHTS, out_dir / WEIGHTS)
    config = json.loads((Path(adapter_folder) / CONFIG).read_text())
    if base:
        config["base_model_name_or_path"] = base
    (out_dir / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out_dir


@torch.no_grad()
def merge_into(model, state, peft_config):
    """Add s B A of every adapted module and expert into `model`'s weights (a transformers model as loaded, no peft),
    summed in float32; returns the names of the parameters changed."""
    params = dict(model.named_parameters())
    check_exportable(peft_config)
    scale = peft_config["lora_alpha"] / peft_config["r"]
    routed, rest = split_routed(state, peft_config["r"])
    changed = []

    def add(name, delta):
        if name not in params:
            raise ExportError(f"the adapter adapts {name!r}, which this base model does not have")
        param = params[name]
        if param.shape != delta.shape:
            raise ExportError(f"{name}: LoRA delta {tuple(delta.shape)} does not fit the weight {tuple(param.shape)}")
        param.copy_((param.float() + delta.to(param.device)).to(param.dtype))
        changed.append(name)

    for experts, lora in routed.items():
        for parameter, factors in (("gate_up_proj", lora.gate_up), ("down_proj", lora.down)):
            a, b = lora.per_expert(factors)  # (E, r, in), (E, out, r)
            add(f"{experts.removeprefix(PEFT_PREFIX)}.{parameter}", scale * torch.bmm(b.float(), a.float()))
    for key, a in rest.items():
        if not key.endswith(".lora_A.weight"):
            if not key.endswith(".lora_B.weight"):
                raise ExportError(f"{key}: only LoRA A/B weights can be merged")
            continue
        module = key.removesuffix(".lora_A.weight")
        add(f"{module.removeprefix(PEFT_PREFIX)}.weight", scale * (rest[f"{module}.lora_B.weight"].float() @ a.float()))
    return changed


def model_class(architecture):
    import transformers

    return getattr(transformers, architecture, None) or transformers.AutoModelForCausalLM


def write_merged(state, peft_config, base, out_dir):
    """The base model with the adapter merged into its weights, saved as safetensors with its config (and the base's
    processor or tokenizer when it has one), for transformers' `from_pretrained` or a server without LoRA."""
    from transformers import AutoConfig

    base_config = AutoConfig.from_pretrained(base)
    model = model_class(architecture_of(peft_config, base_config)).from_pretrained(base, dtype="auto")
    merge_into(model, state, peft_config)
    model.save_pretrained(out_dir)
    copy_processor(base, out_dir)
    return Path(out_dir)


def copy_processor(base, out_dir):
    """The base's processor (a multimodal model's image and video processors with its tokenizer: vLLM will not
    start Qwen3.5-MoE without them), else its tokenizer, into out_dir."""
    from transformers import AutoProcessor, AutoTokenizer

    for loader in (AutoProcessor, AutoTokenizer):
        try:
            loader.from_pretrained(base).save_pretrained(out_dir)
            return
        except (OSError, ValueError, TypeError, KeyError) as exc:
            problem = exc
    print(f"note: no tokenizer copied from {base}: {problem}", file=sys.stderr)


def layout_of(peft_config, base=None):
    """vLLM's layout for the model the adapter was trained on (its base's config when given)."""
    base_config = None
    if base:
        from transformers import AutoConfig

        base_config = AutoConfig.from_pretrained(base)
    return vllm_layout(architecture_of(peft_config, base_config))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m training.export_adapter",
                                     description="Write a trained adapter as peft, in vLLM's layout, or merged.")
    parser.add_argument("--format", required=True, choices=("peft", "vllm", "merged"))
    parser.add_argument("--adapter", required=True, help="a checkpoint folder (with adapter/) or a peft adapter folder")
    parser.add_argument("--base", help="the base model: a local path or a hub id (needed for merged)")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--layout", choices=LAYOUTS, help="vllm only: force the MoE layout instead of the model's")
    args = parser.parse_args(argv)
    try:
        if args.format == "merged" and not args.base:
            raise ExportError("--format merged needs --base (the model the adapter was trained on)")
        state, peft_config, folder = read_adapter(args.adapter)
        if args.format == "peft":
            out = write_peft(folder, args.out, args.base)
            if layout_of(peft_config, args.base) == "2d":
                print(PEFT_NOT_FOR_VLLM, file=sys.stderr)
        elif args.format == "vllm":
            out = write_vllm(state, peft_config, args.out, args.layout or layout_of(peft_config, args.base))
        else:
            out = write_merged(state, peft_config, args.base, args.out)
    except ExportError as exc:
        print(f"export error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.format} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
