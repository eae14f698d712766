"""Every grouped matmul of one MoE-LoRA block step, each timed alone on one GPU: where the block's device time goes.

For the four base products (gate_up and down forward, and their input gradients) it times each block-size config of
the grouped-GEMM kernel, on the pointer kernel and on the persistent TMA kernel (tile loop flattened or not); then the
products as the block runs them (autotuned, LoRA included, narrow product apart) and the four factor gradients.
Figures: median of `triton.testing.do_bench`, ms and TFLOP/s; the last printed line is one JSON object.

    python3 bench/moe_gemms.py [--shape qwen3-30b-a3b] [--tokens 4096] [--configs all|none] [--epilogues]

--epilogues times every config of the persistent TMA kernel on the products as the block runs them (LoRA epilogue),
the narrow product precomputed, and the down projection's input gradient followed by the SwiGLU backward kernel.
--swiglu times each config of the SwiGLU kernels, which also make the rank-wide LoRA product of their result,
against the same activation without it followed by the narrow grouped GEMM.
--compile-only runs each config once, untimed: run it for each --problems subset in parallel processes first, and
the timed sweep after it finds every kernel in Triton's cache.
--smoke (on a CPU, the kernels in Triton's interpreter): the tiny shape, 64 tokens, float32, one 32 x 32 x 32
config: every product and variant once, a check that the script runs (a CPU's times say nothing of a GPU's).
"""

import argparse
import contextlib
import json
import os
import sys
import time

import torch

if not torch.cuda.is_available():  # a CPU runs the kernels in Triton's interpreter, chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton
import triton.testing

from training.kernels import grouped_gemm as gg
from training.kernels._config import autotune_configs
from training.kernels.grouped_weight_grad import grouped_weight_grad
from training.kernels import swiglu as sw
from training.moe_lora import route

SHAPES = {
    "qwen3-30b-a3b": dict(hidden=2048, inter=768, experts=128, top_k=8),
    "qwen3.6-35b-a3b-like": dict(hidden=2048, inter=512, experts=256, top_k=8),
    "qwen3-235b-a22b-like": dict(hidden=4096, inter=1536, experts=128, top_k=8),
    "tiny": dict(hidden=64, inter=32, experts=8, top_k=2),  # a CPU smoke run of the script (--smoke)
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # Triton's interpreter computes bfloat16 wrongly
RANK = 32
# BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
CANDIDATES = gg._WIDE + [(128, 256, 128, 8, 2), (256, 128, 64, 8, 3)]


VARIANTS = (  # name, kernel, tma, extra constexprs
    ("pointers", gg._grouped_gemm_kernel, False, {}),
    ("tma persistent", gg._grouped_gemm_tma_kernel, True, {"FLATTEN": False, "QUARTERS": False}),
    ("tma flattened", gg._grouped_gemm_tma_kernel, True, {"FLATTEN": True, "QUARTERS": False}),
    ("tma persistent, quartered store", gg._grouped_gemm_tma_kernel, True, {"FLATTEN": False, "QUARTERS": True}),
    ("tma flattened, quartered store", gg._grouped_gemm_tma_kernel, True, {"FLATTEN": True, "QUARTERS": True}),
)


def bench(fn):
    if DEVICE == "cpu":
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


@contextlib.contextmanager
def only_config(kernel, config):
    """Within it, `kernel` runs this one config (no tuning); its own configs and choices come back after."""
    saved, kernel.configs, kernel.cache = kernel.configs, [config], {}
    try:
        yield
    finally:
        kernel.configs, kernel.cache = saved, {}


def sweep_epilogues(problems, groups, swiglu, compile_only):
    """Each TMA config on each product with the block's LoRA epilogue; prints a line per config, the best per product.
    The down projection's input gradient is timed with the SwiGLU backward kernel after it, as the block runs it
    (`swiglu`: that kernel's other arguments)."""
    kernel = gg._grouped_gemm_tma_kernel
    best = {}
    for name, (inp, w, gather, lora) in problems.items():
        z = gg._narrow(inp, groups.counts, gather, lora)
        layout = gg._layout(inp, w, True)

        def run():
            y = gg._launch(inp, w, groups.counts, gather, lora, z, layout)  # noqa: B023 - called in this iteration
            return sw.swiglu_backward(g=y, **swiglu) if name == "down input grad" else y  # noqa: B023 - called in this iteration

        for config in list(kernel.configs):
            label = f"{name:20s} {config}"
            try:
                with only_config(kernel, config):
                    if compile_only:
                        run()
                        continue
                    ms = bench(run)
                print(f"{label} {ms:.4f} ms", flush=True)
                if name not in best or ms < best[name][0]:
                    best[name] = (ms, str(config))
            except Exception as exc:  # noqa: BLE001 - a config that does not fit (shared memory, registers)
                print(f"{label} ERR {type(exc).__name__}: {exc}"[:200], flush=True)
    if not compile_only:
        print(json.dumps(dict(best={name: dict(ms=round(ms, 4), config=c) for name, (ms, c) in best.items()},
                              total_ms=round(sum(ms for ms, _ in best.values()), 4))))


def sweep_swiglu(groups, order, weights, gate_up, g, a2, b1):
    """The SwiGLU kernels with the narrow LoRA product fused, per config, against the activation alone plus the
    narrow grouped GEMM (each autotuned)."""
    counts = groups.counts
    fused = {
        "forward": (sw._swiglu_forward_kernel, lambda: sw.swiglu(gate_up, counts, a2)),
        "backward": (sw._swiglu_backward_kernel, lambda: sw.swiglu_backward(gate_up, g, weights, order, counts, b1)),
    }
    h, _ = sw.swiglu(gate_up, counts)
    dgu = sw.swiglu_backward(gate_up, g, weights, order, counts)[0]
    apart = {
        "forward": bench(lambda: sw.swiglu(gate_up, counts))
        + bench(lambda: gg.grouped_gemm(h, a2, counts, tma=False)),  # the narrow product, as the block ran it
        "backward": bench(lambda: sw.swiglu_backward(gate_up, g, weights, order, counts))
        + bench(lambda: gg.grouped_gemm(dgu, b1, counts, tma=False)),
    }
    result = {}
    candidates = [(m, i, w, 1) for m in (16, 32, 64) for i in (64, 128, 256) for w in (4, 8) if m * i <= 8192]
    for name, (kernel, run) in fused.items():
        times = {}
        for config in autotune_configs(candidates, names=("BLOCK_M", "BLOCK_I")):
            try:
                with only_config(kernel, config):
                    times[str(config)] = round(bench(run), 4)
            except Exception as exc:  # noqa: BLE001 - a config that does not fit
                times[str(config)] = f"{type(exc).__name__}: {exc}"[:120]
            print(f"swiglu {name:8s} {config} {times[str(config)]}", flush=True)
        best = min(v for v in times.values() if isinstance(v, float))
        result[name] = dict(fused_best_ms=best, apart_ms=round(apart[name], 4), configs=times)
        print(f"swiglu {name}: fused {best:.4f} ms, activation + narrow GEMM {apart[name]:.4f} ms", flush=True)
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3-30b-a3b")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--configs", default="all", help="all: time every candidate config; none: skip")
    parser.add_argument("--variants", default=",".join(v[0] for v in VARIANTS), help="kernel variants to sweep")
    parser.add_argument("--block", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the products as the block runs them (autotuned) and the factor gradients")
    parser.add_argument("--candidates", default="",
                        help="block configs to sweep, 'M,N,K,warps,stages;...' (default: the kernel's own)")
    parser.add_argument("--epilogues", action="store_true", help="sweep the TMA kernel's configs with the epilogues")
    parser.add_argument("--problems", default="", help="comma-separated subset of the four products (default all)")
    parser.add_argument("--swiglu", action="store_true", help="sweep the SwiGLU kernels' configs, LoRA product fused")
    parser.add_argument("--compile-only", action="store_true", help="with --epilogues: run each config once")
    parser.add_argument("--smoke", action="store_true", help="the tiny shape, 64 tokens, one small config (a CPU run)")
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.tokens, args.candidates = "tiny", 64, "32,32,32,4,1"
    shape = SHAPES[args.shape]
    variants = [v for v in VARIANTS if v[0] in args.variants.split(",")]
    candidates = [tuple(int(v) for v in c.split(",")) for c in args.candidates.split(";") if c] or CANDIDATES
    experts, hidden, inter, top_k = shape["experts"], shape["hidden"], shape["inter"], shape["top_k"]
    dev = DEVICE
    gen = torch.Generator(device=dev).manual_seed(0)
    index = torch.rand(args.tokens, experts, device=dev, generator=gen).topk(top_k, dim=-1).indices
    weights = torch.full((args.tokens, top_k), 1.0 / top_k, device=dev)
    groups, rows, _, order = route(index, experts)
    s = rows.shape[0]

    def rand(*size, dtype=DTYPE, scale=1.0):
        return torch.randn(*size, device=dev, dtype=dtype, generator=gen) * scale

    x, dy = rand(args.tokens, hidden), rand(args.tokens, hidden)
    h, dgu = rand(s, inter), rand(s, 2 * inter)
    w1, w2 = rand(experts, 2 * inter, hidden, scale=0.02), rand(experts, hidden, inter, scale=0.02)
    a1, a2 = rand(experts, RANK, hidden, dtype=torch.float32), rand(experts, RANK, inter, dtype=torch.float32)
    b1, b2 = rand(experts, RANK, 2 * inter), rand(experts, RANK, hidden)
    problems = {  # name: (input, weight view (E, N, K), gathered rows, lora as the block passes it)
        "gate_up forward": (x, w1, rows, (a1, b1.transpose(1, 2), 2.0)),
        "down forward": (h, w2, None, (a2, b2.transpose(1, 2), 2.0)),
        "down input grad": (dy, w2.transpose(1, 2), rows, (b2, a2.transpose(1, 2), 2.0)),
        "gate_up input grad": (dgu, w1.transpose(1, 2), None, (b1, a1.transpose(1, 2), 2.0)),
    }
    if args.problems:
        problems = {name: problems[name] for name in args.problems.split(",")}
    if args.swiglu:
        gate_up, g = rand(s, 2 * inter), rand(s, inter)
        sweep_swiglu(groups, order, weights, gate_up, g, a2, b1)
        return
    if args.epilogues:
        swiglu = dict(gate_up=rand(s, 2 * inter), weights=weights, order=order, counts=groups.counts, b=b1)
        sweep_epilogues(problems, groups, swiglu, args.compile_only)
        return
    result = dict(device=torch.cuda.get_device_name() if dev == "cuda" else "cpu", triton=triton.__version__,
                  torch=torch.__version__, shape=args.shape, tokens=args.tokens, configs=[], block=[])
    lines = []
    for name, (inp, w, gather, lora) in problems.items():
        flop = 2 * s * w.shape[1] * w.shape[2]
        if args.configs == "all":
            for cfg in candidates:
                row = dict(problem=name, config=list(cfg))
                for variant, kernel, tma, extra in variants:
                    config = triton.Config(dict(zip(gg._NAMES, cfg[:3], strict=True), **extra), num_warps=cfg[3],
                                           num_stages=cfg[4])
                    try:
                        with only_config(kernel, config):
                            ms = bench(lambda: gg.grouped_gemm(inp, w, groups.counts, rows=gather, tma=tma))  # noqa: B023 - called in this iteration
                        row[variant] = dict(ms=round(ms, 4), tflops=round(flop / ms / 1e9, 1))
                    except Exception as exc:  # noqa: BLE001 - a config that does not fit (shared memory, registers)
                        row[variant] = dict(error=f"{type(exc).__name__}: {exc}"[:160])
                result["configs"].append(row)
                print(json.dumps(row), flush=True)
        # As the block runs it: autotuned, narrow product and LoRA epilogue included; then the narrow product alone.
        for tma in (False, True) if args.block else ():
            ms = bench(lambda: gg.grouped_gemm(inp, w, groups.counts, rows=gather, lora=lora, tma=tma))  # noqa: B023 - called in this iteration
            base = bench(lambda: gg.grouped_gemm(inp, w, groups.counts, rows=gather, tma=tma))  # noqa: B023 - called in this iteration
            narrow = bench(lambda: gg.grouped_gemm(inp, lora[0], groups.counts, rows=gather, tma=False))  # noqa: B023 - called in this iteration
            row = dict(problem=name, tma=tma, with_lora_ms=round(ms, 4), base_ms=round(base, 4),
                       base_tflops=round(flop / base / 1e9, 1), narrow_ms=round(narrow, 4))
            result["block"].append(row)
            lines.append(f"{name:20s} {'tma' if tma else 'ptr'}: with LoRA {ms:.4f} ms, base {base:.4f} ms "
                         f"({flop / base / 1e9:.0f} TF/s), narrow {narrow:.4f} ms")
    xa = rand(s, RANK)
    grads = {
        "dA1 = u^T x[rows]": lambda: grouped_weight_grad(xa, x, groups.counts, q_rows=rows, scale=2.0,
                                                         out_dtype=torch.float32),
        "dB1 = xa1^T dgu": lambda: grouped_weight_grad(xa, dgu, groups.counts, scale=2.0, out_dtype=torch.float32),
        "dA2 = t2^T h": lambda: grouped_weight_grad(xa, h, groups.counts, row_scale=weights.reshape(-1),
                                                    out_dtype=torch.float32),
        "dB2 = xa2^T dy[rows]": lambda: grouped_weight_grad(xa, dy, groups.counts, q_rows=rows,
                                                            row_scale=weights.reshape(-1), out_dtype=torch.float32),
    }
    for name, fn in grads.items() if args.block else ():
        ms = bench(fn)
        result["block"].append(dict(problem=name, ms=round(ms, 4)))
        lines.append(f"{name:20s} {ms:.4f} ms")
    for row in result["configs"]:
        cells = []
        for variant, *_ in variants:
            v = row[variant]
            cells.append(f"{variant} {v['ms']:.4f} ms {v['tflops']:6.1f} TF/s" if "ms" in v else f"{variant} ERR")
        lines.append(f"{row['problem']:20s} {str(tuple(row['config'])):24s} " + " | ".join(cells))
    print("\n".join(lines))
    print(json.dumps(result))
    failed = [f"{row['problem']} {variant}" for row in result["configs"] for variant, *_ in variants
              if "error" in row[variant]]
    if args.smoke and failed:
        sys.exit(f"smoke: no run of {', '.join(failed)}")


if __name__ == "__main__":
    main()
