"""Gated DeltaNet on packed rows as the trainer runs it for Qwen3.5/3.6-MoE (training/linear_attention.py): the
device path (the whole stream in one flash-linear-attention call, each sample's first token emptying the state, no
host value) and the fast path (one call told the sample ends, `cu_seqlens`) against the layer's own forward once per
sample, on one layer of the Qwen3.6-35B-A3B shape in bf16. All are measured against the same layer in float32 (per
sample), so the check reads "each one-call path is as close to the truth as the per-sample path": outputs, the
input's gradient and the projection's weight gradient. Then each path's forward+backward time.
Last line: one JSON object.

    python bench/deltanet_packed.py [--rows 2] [--seq-len 2048] [--mean 600] [--runs 10]
    python bench/deltanet_packed.py --smoke   a tiny layer on the CPU in float32; the packed call is made by a
        stand-in that runs transformers' chunked rule one sample at a time (the argument contract, not FLA's speed)
"""

import argparse
import contextlib
import json
import statistics
import sys
import time
from itertools import pairwise
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training import linear_attention
from training.examples.tiny import TINY_QWEN3_5_CONFIG
from training.kernels.short_conv import short_conv
from training.norms import use_fused_rms_norms
from training.packing import cu_seq_lens

# One DeltaNet layer of Qwen3.6-35B-A3B (the text model's linear-attention fields).
SHAPE = {"hidden_size": 2048, "linear_num_value_heads": 32, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
         "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_attention_heads": 16,
         "num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-6}


def stand_in_rule(q, k, v, g, beta, cu_seqlens_cpu, **kwargs):
    """FLA's packed call as transformers' reference computes it: each sample alone (CPU smoke runs only)."""
    parts = [linear_attention.torch_chunk_rule(q[:, s:e], k[:, s:e], v[:, s:e], g=g[:, s:e], beta=beta[:, s:e],
                                               use_qk_l2norm_in_kernel=True)[0]
             for s, e in pairwise(cu_seqlens_cpu.tolist())]
    return torch.cat(parts, dim=1), None


STARTED = time.monotonic()


def stage(done):
    """A line on stderr as each stage ends, so a run cut short says how far it came."""
    print(f"[{time.monotonic() - STARTED:6.1f} s] {done}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def pytorch_rule_in_transformers():
    """transformers' DeltaNet layers on its own PyTorch chunked rule, not the FLA kernel its name resolves to where
    FLA is installed."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modeling

    resolved = modeling.torch_chunk_gated_delta_rule
    modeling.torch_chunk_gated_delta_rule = linear_attention.pytorch_chunk_rule()
    try:
        yield
    finally:
        modeling.torch_chunk_gated_delta_rule = resolved


def layer_of(fields, dtype, device):
    from transformers import AutoConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

    config = AutoConfig.for_model("qwen3_5_moe_text", **fields)
    torch.manual_seed(0)
    layer = Qwen3_5MoeGatedDeltaNet(config, 0)
    for p in layer.parameters():  # the published layer's scale: projections ~ N(0, 0.02)
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    # as LoRA training leaves them (training/families.py): the convolution, the decay and the norm frozen, the norm
    # on its fused kernel on a GPU; the projections train (their weight's gradient stands in for LoRA's)
    for frozen in (layer.conv1d.weight, layer.A_log, layer.dt_bias, layer.norm.weight):
        frozen.requires_grad_(False)
    use_fused_rms_norms(layer)
    return layer.to(device=device, dtype=dtype)


def sample_ends(total, mean, generator):
    """Packed sample boundaries over `total` tokens: exponential lengths of `mean` tokens, as CPT data packs."""
    ends, at = [0], 0
    while at < total:
        at = min(total, at + max(1, int(torch.empty(1).exponential_(1 / mean, generator=generator).item())))
        ends.append(at)
    return tuple(ends)


def forward_backward(path, layer, hidden, ends, rule):
    x = hidden.detach().clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    if path == "fast":
        out = linear_attention.fast_packed_forward(layer, x, ends, rule)
    elif path == "device":  # the boundaries padded as the trainer pads them, on the device only
        cu = cu_seq_lens([[i for s, e in pairwise(ends) for i in range(e - s)]]).to(x.device)
        out = linear_attention.device_packed_forward(
            layer, x, cu, rule if rule is not stand_in_rule else linear_attention.torch_chunk_rule)
    else:
        out = linear_attention.reference_packed_forward(layer, x, ends)
    (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
    return out.detach().float(), x.grad.float(), layer.in_proj_qkv.weight.grad.float()


def short_convolution_path(device):
    """Which short convolution the device path runs here (training/linear_attention.rows_short_convolution)."""
    if device.type not in linear_attention.KERNEL_DEVICE_TYPES:
        return "pytorch"
    return "causal-conv1d" if linear_attention.conv1d_kernel() is not None else "triton"


def convolution_ms(layer, hidden, ends, runs, device):
    """The short convolution alone, forward and backward over the packed stream: our Triton kernel against PyTorch's
    conv1d less each sample's leak, made again in the backward (a GPU only)."""
    if device.type != "cuda":
        return {}
    total, channels = ends[-1], layer.conv1d.weight.shape[0]
    cu = cu_seq_lens([[i for s, e in pairwise(ends) for i in range(e - s)]]).to(device)
    mixed = torch.randn(1, total, channels, device=device, dtype=hidden.dtype).transpose(1, 2).requires_grad_()
    grad = torch.randn_like(mixed)

    def step(convolve):
        out = convolve()
        torch.autograd.grad(out, mixed, grad)

    return {"convolution_triton_ms": round(timed_ms(lambda: step(lambda: short_conv(
                mixed[0].transpose(0, 1), linear_attention.sample_starts(cu, total), layer.conv1d.weight,
                layer.conv1d.bias).transpose(0, 1)[None]), runs, device), 3),
            "convolution_pytorch_ms": round(timed_ms(lambda: step(lambda: linear_attention.remade_in_backward(
                linear_attention.leak_corrected_convolution, layer, mixed, cu)), runs, device), 3)}


def relative(a, b):
    return ((a - b).norm() / b.norm()).item()


def timed_ms(fn, runs, device):
    times = []
    for _ in range(runs + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times[1:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--mean", type=int, default=600, help="mean sample length in tokens")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.smoke:
        fields = {k: v for k, v in TINY_QWEN3_5_CONFIG.items() if k != "model_type"}
        args.rows, args.seq_len, args.mean, args.runs, dtype = 2, 24, 7, 2, torch.float32
    else:
        fields, dtype = SHAPE, torch.bfloat16
    rule = linear_attention.fla_chunk_rule() if device.type == "cuda" else stand_in_rule
    if rule is None:
        sys.exit("flash-linear-attention is not installed: the fast path has nothing to run")
    ends = sample_ends(args.rows * args.seq_len, args.mean, torch.Generator().manual_seed(1))
    hidden = torch.randn(args.rows, args.seq_len, fields["hidden_size"], generator=torch.Generator().manual_seed(2))
    hidden = hidden.to(device)

    with pytorch_rule_in_transformers():  # float32 truth on PyTorch's rule: FLA need not tune for float32 too
        truth = forward_backward("per_sample", layer_of(fields, torch.float32, device), hidden, ends, rule)
    stage("float32 truth, per sample")
    layer = layer_of(fields, dtype, device)
    fast = forward_backward("fast", layer, hidden.to(dtype), ends, rule)
    stage("fast path (first call: its kernels tune)")
    device_only = forward_backward("device", layer, hidden.to(dtype), ends, rule)
    stage("device path")
    alone = forward_backward("per_sample", layer, hidden.to(dtype), ends, rule)
    stage("per-sample path")
    names = ("output", "input_grad", "qkv_weight_grad")
    figures = {
        "path": "fla" if rule is not stand_in_rule else "stand-in", "dtype": str(dtype).removeprefix("torch."),
        "samples": len(ends) - 1, "tokens": ends[-1], "short_convolution": short_convolution_path(device),
        **{f"{label}_{n}": float(f"{relative(a, b):.3g}") for label, ours, theirs in (
            ("fast_vs_float32", fast, truth), ("device_vs_float32", device_only, truth),
            ("per_sample_vs_float32", alone, truth), ("fast_vs_per_sample", fast, alone),
            ("device_vs_per_sample", device_only, alone)) for n, a, b in zip(names, ours, theirs, strict=True)},
    }
    # within bf16: each one-call path no further from float32 than the per-sample path, with a margin of bf16's noise
    for path in ("fast", "device"):
        figures[f"{path}_equal_within_bf16"] = all(
            figures[f"{path}_vs_float32_{n}"] <= 1.5 * figures[f"per_sample_vs_float32_{n}"] + 1e-4 for n in names)
    for path in ("fast", "device", "per_sample"):
        figures[f"{path}_ms"] = round(timed_ms(lambda p=path: forward_backward(p, layer, hidden.to(dtype), ends, rule),
                                               args.runs, device), 2)
    stage("timed the three paths")
    figures.update(convolution_ms(layer, hidden.to(dtype), ends, args.runs, device))
    figures["speedup"] = round(figures["per_sample_ms"] / figures["fast_ms"], 2)
    figures["device_speedup"] = round(figures["per_sample_ms"] / figures["device_ms"], 2)
    for key, value in figures.items():
        print(f"{key:40s} {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
