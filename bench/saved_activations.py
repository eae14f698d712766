"""What a decoder layer keeps for its backward pass, counted with autograd's saved-tensor hooks over one forward, in
bytes a token per hidden unit of the layer (the unit of training/memory_plan.py ACTIVATION_BYTES), per kind of layer:
transformers' own layers; the trainer's fused norms (Triton's interpreter playing the GPU); then also its one-pass
DeltaNet path, with the short convolution's result kept (as before) and remade in the backward (as now: PyTorch's
conv1d here, which keeps what the convolution kernel keeps on a GPU). The counts are a layer's saved tensors, not a
device's reserve, and the CPU's DeltaNet rule (transformers' PyTorch one) keeps more than FLA and not alike on its own
forward and on the one pass: compare rows 1 and 2, and rows 3 and 4. Weights and buffers are not counted. Last
line: one JSON object.

    python bench/saved_activations.py [--model qwen3.6-35b-a3b] [--layers 4] [--experts 16] [--tokens 256]
    python bench/saved_activations.py --smoke   the family in miniature, 32 tokens
"""

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # the kernels run on the CPU, whatever the caller's environment says
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.train_step import MODELS, SMOKE_MODELS
from training import linear_attention, norms
from training.lora import attach_lora
from training.packing import model_inputs
from training.recipe import ModelSettings
from training.train import build_model

CONFIGS = ("transformers", "fused norms", "one pass, convolution kept", "one pass, convolution remade")


def kept_bytes(model, ids, config):
    """{decoder layer index: bytes of the distinct activations its forward saved} for one configuration."""
    devices, remade = norms.KERNEL_DEVICE_TYPES, linear_attention.remade_in_backward
    norms.KERNEL_DEVICE_TYPES = ("cuda",) if config == "transformers" else ("cuda", "cpu")
    one_pass = config.startswith("one pass")
    inputs = model_inputs(model, {"input_ids": ids}) if one_pass else {"input_ids": ids, "use_cache": False}
    if config == "one pass, convolution kept":
        linear_attention.remade_in_backward = lambda convolution, *args: convolution(*args)
    seen = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    layer, kept = [None], Counter()
    hooks = [module.register_forward_pre_hook(lambda _m, _a, i=i: layer.__setitem__(0, i))
             for i, module in enumerate(model.get_base_model().model.layers)]

    def pack(tensor):
        storage = tensor.untyped_storage()
        if layer[0] is not None and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            kept[layer[0]] += storage.nbytes()
        return tensor

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
        norms.KERNEL_DEVICE_TYPES, linear_attention.remade_in_backward = devices, remade
    return kept


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3.6-35b-a3b", choices=sorted(MODELS))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=16, help="fewer experts: what a token keeps does not change")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        config, args.tokens, rank = SMOKE_MODELS[args.model], 32, 4
    else:
        config, rank = {**MODELS[args.model][0], "num_hidden_layers": args.layers, "num_experts": args.experts,
                        "vocab_size": 1024}, 32
    model = attach_lora(build_model(ModelSettings(config=config, dtype="bfloat16"), torch.device("cpu")), r=rank,
                        alpha=2 * rank).train()
    text = model.get_base_model().config.get_text_config()
    kinds = list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)
    ids = torch.randint(3, text.vocab_size, (2, args.tokens // 2), generator=torch.Generator().manual_seed(0))
    unit = args.tokens * text.hidden_size  # bytes a token per hidden unit
    rows = []
    for name in CONFIGS:
        kept = kept_bytes(model, ids, name)
        per_kind = {kind: round(sum(kept[i] for i, k in enumerate(kinds) if k == kind) / kinds.count(kind) / unit, 1)
                    for kind in sorted(set(kinds))}
        rows.append({"config": name, **per_kind, "mean": round(sum(kept.values()) / len(kinds) / unit, 1)})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"model": args.model, "tokens": args.tokens, "hidden": text.hidden_size, "rows": rows}))


if __name__ == "__main__":
    main()
