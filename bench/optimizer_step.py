"""The optimizer step on an adapter the size of Qwen3-30B-A3B's at r=32 (1.3 billion float32 factors in 576 tensors:
per layer q/k/v/o LoRA and the routed experts' stacked gate_up and down factors): torch's fused AdamW (float32
moments), torchao's AdamW8bit and ours (training/kernels/adamw8bit.py), each timed over a few steps after a warm-up,
with its state's bytes and how far its factors drift from float32 AdamW's after those steps (JSON last line).

    python bench/optimizer_step.py [--layers 48] [--rank 32] [--steps 5]
    python bench/optimizer_step.py --smoke     (2 small layers on the CPU, ours in Triton's interpreter)
"""

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE:  # before Triton is imported: the CPU runs the kernel in its interpreter
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training import optimizers  # noqa: E402

# (hidden, experts, moe_intermediate, q, kv) of Qwen3-30B-A3B; the smoke run's small stand-in.
SHAPE = {"hidden": 2048, "experts": 128, "moe": 768, "q": 4096, "kv": 512}
SMOKE_SHAPE = {"hidden": 64, "experts": 4, "moe": 32, "q": 64, "kv": 32}


def factor_shapes(layers, rank, s):
    per_layer = []
    for out, inp in ((s["q"], s["hidden"]), (s["kv"], s["hidden"]), (s["kv"], s["hidden"]), (s["hidden"], s["q"])):
        per_layer += [(rank, inp), (out, rank)]
    per_layer += [(s["experts"], rank, s["hidden"]), (s["experts"], 2 * s["moe"], rank),
                  (s["experts"], rank, s["moe"]), (s["experts"], s["hidden"], rank)]
    return per_layer * layers


def state_bytes(optimizer):
    total = 0
    for entry in optimizer.state.values():
        for value in entry.values():
            if torch.is_tensor(value):
                inner = getattr(value, "codes", None)  # torchao's OptimState8bit: codes and scales
                total += sum(t.numel() * t.element_size() for t in ((inner, value.scale) if inner is not None
                                                                      else (value,)))
    return total


def starting_factors(shapes, device):
    """The factors every optimizer starts from: the same random values for each."""
    generator = torch.Generator(device=device).manual_seed(0)
    return [torch.randn(shape, device=device, generator=generator) * 0.01 for shape in shapes]


def measure(make, initial, steps, device):
    """(figures, the factors after `steps` timed steps) of the optimizer `make` builds, from `initial`."""
    generator = torch.Generator(device=device)
    params = [torch.nn.Parameter(x.clone()) for x in initial]
    optimizer = make(params)
    seconds = []
    for step in range(steps + 1):  # the first: warm-up (state made, kernels compiled)
        generator.manual_seed(1000 + step)
        for p in params:
            p.grad = torch.randn(p.shape, device=device, generator=generator) * 1e-3
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        # torchao compiles its step per shape: tens of seconds each on a CPU (the smoke run), where it gains nothing
        with torch.compiler.set_stance("force_eager") if device.type == "cpu" else contextlib.nullcontext():
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step:
            seconds.append(time.perf_counter() - start)
    result = {"ms_per_step": round(1000 * sorted(seconds)[len(seconds) // 2], 2),
              "state_bytes": state_bytes(optimizer)}
    return result, [p.detach() for p in params]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    shape, layers, rank = (SMOKE_SHAPE, 2, 4) if args.smoke else (SHAPE, args.layers, args.rank)
    steps = 2 if args.smoke else args.steps
    shapes = factor_shapes(layers, rank, shape)
    count = sum(torch.Size(s).numel() for s in shapes)
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, {len(shapes)} tensors, "
          f"{count / 1e9:.3f} billion factors, {steps} timed steps", flush=True)
    makers = {"adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=device.type == "cuda"),
              "ours_8bit": lambda ps: optimizers.build("adamw_8bit", ps, lr=1e-4, weight_decay=0.0, device=device)}
    if importlib.util.find_spec("torchao") is not None:
        makers["torchao_8bit"] = lambda ps: importlib.import_module("torchao.optim").AdamW8bit(ps, lr=1e-4)
    else:
        print("torchao not measured: it is not installed", flush=True)
    initial = starting_factors(shapes, device)
    results, finals = {}, {}
    for name, make in makers.items():
        results[name], finals[name] = measure(make, initial, steps, device)
        print(f"{name}: {results[name]}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for name in results:  # where each took the factors against where AdamW did, relative to how far AdamW moved them
        drift = max(float((a - b).norm() / (b - x).norm())
                    for a, b, x in zip(finals[name], finals["adamw"], initial, strict=True))
        results[name]["max_rel_diff_to_adamw"] = round(drift, 4)
    print(json.dumps({"device": device.type, "tensors": len(shapes), "factors": count, "steps": steps,
                      "results": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
