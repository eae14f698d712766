"""One MoE block, LoRA r=32 alpha=64 on the routed experts, forward + backward, on one GPU (made for an H200).

Paths: eager + peft, grouped_mm + peft (transformers' experts with peft's ParamWrapper, transformers' router), ours on
`torch._grouped_mm`, ours on Triton (triton, and its fused variants triton_scatter and triton_fused), each also
replayed from CUDA graphs (as the trainer runs CPT/SFT micro-steps), and ours on the per-expert loop (every "ours"
path with the fused router, training/routers.py, as the trainer runs it; each shape also checks that router against
transformers' own); plus the single grouped GEMM
(gate_up forward) on Triton, `torch._grouped_mm` and the loop. Reports ms (median of do_bench, rotating inputs), peak
memory, TFLOP/s, and the relative error (||got - ref|| / ||ref||) of the output and every LoRA gradient against a
float32 reference.
The last printed line is one JSON object.

    python bench/moe_block.py [--quick] [--sonic]
    --sonic: SonicMoE (pip sonic-moe, optional) beside ours (each Triton path of --paths) on the same experts and
        routing, experts only: the forward alone and the forward with the input gradient (its weight gradients,
        which LoRA does not need, left out), eager and replayed from a CUDA graph; where it cannot run, a row says
        why. Installed with `pip install --target` onto PYTHONPATH, the CUTLASS DSL also needs its
        `nvidia_cutlass_dsl/python_packages` there (a .pth file adds it in site-packages only)
    python bench/moe_block.py --smoke   (on a CPU, the kernels in Triton's interpreter: the tiny shape, 64 tokens,
        float32, every path but the CUDA-graph one; fails unless every path runs and matches the reference)
"""

import argparse
import gc
import json
import os
import sys
import time

import torch

if not torch.cuda.is_available():  # a CPU runs the kernels in Triton's interpreter, chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from training import moe_lora
from training.grouped_ops import BACKENDS, experts_a, experts_b
from training.lora import adopt_routed_lora, inject_routed_lora, routed_lora_wrappers
from training.moe_lora import route
from training.class_switch import original_class
from training.routers import TopKSoftmax, normalizes, use_fused_routers
from training.reference import reference_moe_lora

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of the script itself, tiny shape
# Triton's interpreter computes bfloat16 wrongly: a CPU run is in float32.
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TINY = dict(hidden=64, inter=32, experts=8, top_k=2)  # --shapes tiny: a CPU smoke run
SMOKE_TOLERANCE = 1e-4  # the largest relative error a float32 smoke run accepts
SHAPES = {
    "qwen3-30b-a3b": dict(hidden=2048, inter=768, experts=128, top_k=8),
    "qwen3.6-35b-a3b-like": dict(hidden=2048, inter=512, experts=256, top_k=8),
    "qwen3-235b-a22b-like": dict(hidden=4096, inter=1536, experts=128, top_k=8),
}
RANK, ALPHA = 32, 64


def flops(tokens, hidden, inter, top_k, rank=RANK, **_):
    rows = tokens * top_k
    base = 12 * rows * hidden * inter  # forward + input gradient of both projections
    lora = 6 * rows * rank * (2 * hidden + 3 * inter)  # forward, input gradient and factor gradients
    return base + lora


def make_block(shape, seed=0):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(
        hidden_size=shape["hidden"], moe_intermediate_size=shape["inter"], num_experts=shape["experts"],
        num_experts_per_tok=shape["top_k"], norm_topk_prob=True, hidden_act="silu",
    )
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(seed)
    block = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        block.experts.gate_up_proj.normal_(0, 0.02)
        block.experts.down_proj.normal_(0, 0.02)
        block.gate.weight.normal_(0, 0.02)
    block = block.to(DEVICE, DTYPE)
    holder = torch.nn.Module()
    holder.mlp = block
    inject_routed_lora(holder, RANK, ALPHA)
    holder.requires_grad_(False)
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    for _, _, wrapper in routed_lora_wrappers(holder):
        for layer in list(wrapper.lora_A.values()) + list(wrapper.lora_B.values()):
            layer.weight.requires_grad_(True)
        with torch.no_grad():  # B nonzero, so both factors carry gradient and error
            for layer in wrapper.lora_B.values():
                layer.weight.copy_(torch.randn(layer.weight.shape, device=DEVICE, generator=gen) * 0.02)
    return holder


def lora_params(holder):
    return [p for p in holder.parameters() if p.requires_grad]


def set_path(holder, path):
    """eager+peft / grouped_mm+peft: transformers' experts under peft's wrappers; else ours with a kernel path."""
    experts = holder.mlp.experts.get_base_layer()
    if path in ("eager+peft", "grouped_mm+peft"):
        experts.config._experts_implementation = path.split("+")[0]
        return
    moe_lora.kernels_of(holder).path = path.split(":")[1].split("+")[0]


def graphed_step(holder, inputs, grad):
    """The block's fwd+bwd captured in CUDA graphs, as the trainer runs it (training/graphs.py): one graph per
    rotating input, captured on that input where it lies (sharing one memory pool), so a replay holds the block's
    work only: inside a model the block reads the previous layer's output in place, and no copy of its input into a
    captured buffer belongs in its time. The LoRA grads accumulate in place, as in the trainer (inside the gradient
    kernels: moe_lora.grads_accumulated_in_place)."""
    params = lora_params(holder)
    statics = [x.detach().requires_grad_() for x in inputs]  # the inputs themselves, as leaves of the graphs
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), moe_lora.grads_accumulated_in_place(holder):
        for _ in range(2):
            holder.mlp(statics[0]).backward(grad)
    torch.cuda.current_stream().wait_stream(side)
    for p in params:
        p.grad.zero_()
    statics[0].grad = None
    graphs = []
    for static_x in statics:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=graphs[0].pool() if graphs else None), \
                moe_lora.grads_accumulated_in_place(holder):
            holder.mlp(static_x).backward(grad)
        graphs.append(graph)
    state = {"i": 0}

    def step():
        graphs[state["i"] % len(graphs)].replay()
        state["i"] += 1

    return step


def time_block(holder, inputs, grad, repeats=None, graphed=False):
    params = lora_params(holder)
    state = {"i": 0}

    def step():
        x = inputs[state["i"] % len(inputs)]
        state["i"] += 1
        out = holder.mlp(x)
        out.backward(grad)

    if graphed:
        # A first capture outside the measurement: the kernels that only run here (the factor gradients added into
        # .grad in place) autotune in it, and the autotuner's scratch would otherwise count in the peak.
        graphed_step(holder, inputs, grad)()
        for p in params:
            p.grad = None
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        replay = graphed_step(holder, inputs, grad)
        replay()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        import triton.testing

        ms = triton.testing.do_bench(replay, warmup=50, rep=300, return_mode="median")
        for p in params:
            p.grad = None
        return ms, (peak - base) / 2**30, peak / 2**30

    import triton.testing

    step()
    if DEVICE == "cpu":
        started = time.perf_counter()
        step()
        return (time.perf_counter() - started) * 1e3, 0.0, 0.0
    torch.cuda.synchronize()
    if repeats:  # very slow paths: a few timed runs
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        ms = sorted(times)[len(times) // 2]
    else:
        ms = triton.testing.do_bench(step, warmup=50, rep=300, grad_to_none=params + inputs, return_mode="median")
    for p in params + inputs:
        p.grad = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    for p in params + inputs:
        p.grad = None
    return ms, (peak - base) / 2**30, peak / 2**30


def rel(got, ref):
    got, ref = got.float(), ref.float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def reference_grads(holder, x, index, weights, grad):
    """float32 reference of the experts with the same routing: output and grads of x and the LoRA params."""
    experts = holder.mlp.experts.get_base_layer()
    wrappers = {w.parameter_name: w for _, _, w in routed_lora_wrappers(holder)}
    num_experts = experts.gate_up_proj.shape[0]
    leaves, loras = [], []
    for name in ("gate_up_proj", "down_proj"):
        w = wrappers[name]
        a_w = w.lora_A["default"].weight.detach().float().requires_grad_()
        b_w = w.lora_B["default"].weight.detach().float().requires_grad_()
        leaves += [a_w, b_w]
        loras.append((experts_a(a_w, num_experts), experts_b(b_w, num_experts), w.scaling["default"]))
    xf = x.detach().float().requires_grad_()
    out = reference_moe_lora(
        xf, index, weights.float(), experts.gate_up_proj.float(), experts.down_proj.float(), loras[0], loras[1]
    )
    grads = torch.autograd.grad(out, [xf] + leaves, grad.float())
    return out.detach(), grads


def path_grads(holder, x, index, weights, grad):
    experts_module = holder.mlp.experts
    params = []
    for _, _, w in sorted_wrappers(holder):
        params += [w.lora_A["default"].weight, w.lora_B["default"].weight]
    xg = x.detach().requires_grad_()
    out = experts_module(xg, index, weights)
    grads = torch.autograd.grad(out, [xg] + params, grad)
    return out.detach(), grads


def sorted_wrappers(holder):
    order = {"gate_up_proj": 0, "down_proj": 1}
    return sorted(routed_lora_wrappers(holder), key=lambda t: order[t[1]])


def errors(holder, tokens, shape, path, ref):
    x, index, weights, grad = ref["inputs"]
    set_path(holder, path)
    out, grads = path_grads(holder, x, index, weights, grad)
    names = ["out", "dx", "dA_gate_up", "dB_gate_up", "dA_down", "dB_down"]
    vals = [rel(out, ref["out"])] + [rel(g, r) for g, r in zip(grads, ref["grads"], strict=True)]
    return dict(zip(names, vals, strict=True))


def grouped_gemm_bench(shape, tokens):
    """The gate_up forward grouped GEMM alone (gather excluded): Triton vs torch._grouped_mm vs the loop."""
    import triton.testing

    experts, hidden, inter, top_k = shape["experts"], shape["hidden"], shape["inter"], shape["top_k"]
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    index = torch.rand(tokens, experts, device=DEVICE, generator=gen).topk(top_k, dim=-1).indices
    groups, rows, _, _ = route(index, experts)
    groups.host_counts  # noqa: B018 - the loop's one sync, outside the timing
    xs = [torch.randn(rows.shape[0], hidden, device=DEVICE, dtype=DTYPE, generator=gen) for _ in range(3)]
    w = torch.randn(experts, 2 * inter, hidden, device=DEVICE, dtype=DTYPE, generator=gen) * 0.02
    flop = 2 * rows.shape[0] * hidden * 2 * inter
    result = {}
    ref, _ = BACKENDS["loop"].mm(xs[0].float(), w.float(), groups)
    for path in ("triton", "grouped_mm", "loop"):
        ops = BACKENDS[path]
        got, _ = ops.mm(xs[0], w, groups)
        state = {"i": 0}

        def run():
            state["i"] += 1  # noqa: B023 - called in this iteration
            return ops.mm(xs[state["i"] % 3], w, groups)  # noqa: B023 - called in this iteration

        if DEVICE == "cpu":  # one timed call after the one above: what the script's own run takes, no more
            started = time.perf_counter()
            run()
            ms = (time.perf_counter() - started) * 1e3
        else:
            ms = triton.testing.do_bench(run, warmup=25, rep=200 if path != "loop" else 100, return_mode="median")
        result[path] = dict(ms=round(ms, 4), tflops=round(flop / ms / 1e9, 1), rel_err=rel(got, ref))
    result["triton_vs_loop"] = round(result["loop"]["ms"] / result["triton"]["ms"], 2)
    result["triton_vs_grouped_mm"] = round(result["grouped_mm"]["ms"] / result["triton"]["ms"], 3)
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="30B shape at 4096 tokens only")
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny shape at 64 tokens, every path but the graphed one, errors checked")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--profile", action="store_true",
                        help="first: per-kernel times of one path at --profile-shape, --profile-tokens")
    parser.add_argument("--profile-shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    parser.add_argument("--profile-tokens", type=int, default=4096)
    parser.add_argument("--profile-path", default="ours:triton", help="the path --profile looks at")
    parser.add_argument("--paths",
                        default="eager+peft,grouped_mm+peft,ours:grouped_mm,ours:triton,ours:triton+graph,"
                                "ours:triton_scatter,ours:triton_scatter+graph,ours:triton_fused,ours:triton_fused+graph,"
                                "ours:loop")
    parser.add_argument("--sonic", action="store_true", help="also SonicMoE beside ours, experts only (see above)")
    args = parser.parse_args()
    if args.smoke:
        args.shapes, args.tokens, args.sonic = "tiny", "64", True
        args.paths = ",".join(p for p in args.paths.split(",") if not p.endswith("+graph"))
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = ["qwen3-30b-a3b"] if args.quick else args.shapes.split(",")
    token_counts = [4096] if args.quick else [int(t) for t in args.tokens.split(",")]
    paths = args.paths.split(",")
    if DEVICE == "cuda":
        dev = torch.cuda.get_device_properties(0)
        results = dict(device=dev.name, sm=f"{dev.major}.{dev.minor}", torch=torch.__version__, rows=[], gemm=[])
    else:
        results = dict(device="cpu", torch=torch.__version__, rows=[], gemm=[])
    import transformers
    import peft
    import triton

    results.update(transformers=transformers.__version__, peft=peft.__version__, triton=triton.__version__)
    started = time.time()
    table = []
    if args.profile:
        profile(SHAPES[args.profile_shape], args.profile_tokens, args.profile_path)
    for shape_name in shapes:
        shape = SHAPES.get(shape_name, TINY)
        holder = make_block(shape)
        for tokens in token_counts:
            gen = torch.Generator(device=DEVICE).manual_seed(tokens)
            inputs = [
                torch.randn(1, tokens, shape["hidden"], device=DEVICE, dtype=DTYPE, generator=gen)
                .requires_grad_()
                for _ in range(3)
            ]
            grad = torch.randn(1, tokens, shape["hidden"], device=DEVICE, dtype=DTYPE, generator=gen)
            # Reference on the same routing as every path: transformers' router's, whichever router the block has now.
            with torch.no_grad():
                x2 = inputs[0].detach().view(-1, shape["hidden"])
                _, weights, index = original_class(holder.mlp.gate).forward(holder.mlp.gate, x2)
            ref_out, ref_grads = reference_grads(holder, x2, index, weights, grad.view(-1, shape["hidden"]))
            ref = dict(inputs=(x2, index, weights, grad.view(-1, shape["hidden"])), out=ref_out, grads=ref_grads)
            if DEVICE == "cuda":
                check = dict(shape=shape_name, tokens=tokens, **router_check(holder, x2))
                results.setdefault("router", []).append(check)
                print(json.dumps(check), flush=True)
            del ref_out, ref_grads
            flop = flops(tokens, **shape)
            for path in paths:
                if path.startswith("ours"):
                    adopt_routed_lora(holder)
                    use_fused_routers(holder)
                else:
                    unadopt(holder)
                if path == "eager+peft" and (shape_name != "qwen3-30b-a3b" or tokens != 4096) and not args.smoke:
                    continue  # about 250 ms a step: measured once, at the anchor shape
                if path == "ours:loop" and tokens != 4096 and not args.smoke:
                    continue
                set_path(holder, path)
                try:
                    err = errors(holder, tokens, shape, path, ref)
                    slow = 2 if path in ("eager+peft", "ours:loop") else None
                    ms, extra_gib, peak_gib = time_block(holder, inputs, grad, repeats=slow,
                                                         graphed=path.endswith("+graph"))
                    row = dict(shape=shape_name, tokens=tokens, path=path, ms=round(ms, 3),
                               peak_extra_gib=round(extra_gib, 3), peak_gib=round(peak_gib, 3),
                               tflops=round(flop / ms / 1e9, 1), err={k: float(f"{v:.2e}") for k, v in err.items()})
                except Exception as exc:  # noqa: BLE001 - keep the other paths' figures
                    row = dict(shape=shape_name, tokens=tokens, path=path, error=f"{type(exc).__name__}: {exc}"[:400])
                row["at_s"] = round(time.time() - started, 1)  # when it ended, from the start: where a run's time went
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
            if args.sonic:
                ours_paths = sorted({p.split("+")[0] for p in paths if p.startswith("ours:triton")})
                if args.smoke or not ours_paths:  # the smoke run has every path's figures above already
                    ours_paths = ["ours:triton"]
                for row in sonic_compare(holder, *ref["inputs"], ours_paths=ours_paths):
                    row = dict(shape=shape_name, tokens=tokens, **row, at_s=round(time.time() - started, 1))
                    results.setdefault("sonic", []).append(row)
                    print(json.dumps(row), flush=True)
            del ref, inputs, grad
            try:
                gemm = dict(shape=shape_name, tokens=tokens, **grouped_gemm_bench(shape, tokens))
            except Exception as exc:  # noqa: BLE001 - keep the other figures
                gemm = dict(shape=shape_name, tokens=tokens, error=f"{type(exc).__name__}: {exc}"[:400])
            results["gemm"].append(gemm)
            print(json.dumps(gemm), flush=True)
        del holder
        gc.collect()
    results["seconds"] = round(time.time() - started, 1)
    for row in results["rows"]:
        if "error" in row:
            table.append(f"{row['shape']:22s} {row['tokens']:6d} {row['path']:16s} ERROR {row['error'][:80]}")
        else:
            worst = max(v for k, v in row["err"].items())
            table.append(f"{row['shape']:22s} {row['tokens']:6d} {row['path']:16s} {row['ms']:9.3f} ms "
                         f"{row['tflops']:7.1f} TF/s peak+{row['peak_extra_gib']:7.2f} GiB err<={worst:.1e}")
    for row in results.get("sonic", []):
        figures = row.get("error") or f"{row['ms']} ms eager, {row.get('graphed_ms', '-')} graphed, err {row['err']}"
        table.append(f"{row['shape']:22s} {row['tokens']:6d} {row['path']:28s} {figures}"[:200])
    for g in results["gemm"]:
        if "error" not in g:
            table.append(f"gemm {g['shape']:22s} {g['tokens']:6d} triton {g['triton']['tflops']} TF/s, "
                         f"_grouped_mm {g['grouped_mm']['tflops']}, loop {g['loop']['tflops']}; "
                         f"triton/loop x{g['triton_vs_loop']}")
    print("\n".join(table))
    print(json.dumps(results))
    if args.smoke:
        return smoke_verdict(results)
    return 0


def smoke_verdict(results):
    """1 (and why) unless every path and GEMM ran and each matched the float32 reference within SMOKE_TOLERANCE."""
    errors = [row.get("error") or max(row["err"].values()) for row in results["rows"]]
    errors += [g.get("error") or g[path]["rel_err"] for g in results["gemm"] for path in ("triton", "grouped_mm")]
    # ours beside SonicMoE: every row checked; SonicMoE itself may only be missing (a CPU has no CUTLASS DSL)
    errors += [max(row["err"].values()) if "err" in row else row["error"] for row in results.get("sonic", [])
               if row["path"] != "sonic"]
    bad = [e for e in errors if isinstance(e, str) or e > SMOKE_TOLERANCE]
    if bad:
        print(f"smoke: {len(bad)} of {len(errors)} checks failed: {bad[:3]}")
    return 1 if bad else 0


def profile(shape, tokens, path="ours:triton"):
    """Per-kernel device time of a few fwd+bwd steps, to see where the time goes."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    holder = make_block(shape)
    adopt_routed_lora(holder)
    use_fused_routers(holder)
    set_path(holder, path)
    x = torch.randn(1, tokens, shape["hidden"], device=DEVICE, dtype=DTYPE).requires_grad_()
    grad = torch.randn_like(x)
    for _ in range(3):
        holder.mlp(x).backward(grad)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            holder.mlp(x).backward(grad)
        torch.cuda.synchronize()
    averages = prof.key_averages()
    print(averages.table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60), flush=True)
    print(averages.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60), flush=True)
    import triton.testing

    # Host time to enqueue one step (no sync inside): above the device time, the step is launch-bound.
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(20):
        holder.mlp(x).backward(grad)
    enqueue_ms = (time.perf_counter() - started) / 20 * 1e3
    torch.cuda.synchronize()
    eager_ms = triton.testing.do_bench(lambda: holder.mlp(x).backward(grad), warmup=50, rep=300, return_mode="median")
    graph_ms = None
    try:  # the same step captured in one CUDA graph: what it costs without Python launch overhead
        replay = graphed_step(holder, [x], grad)
        graph_ms = triton.testing.do_bench(replay, warmup=50, rep=300, return_mode="median")
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                replay()
            torch.cuda.synchronize()
        print("kernels of 5 graph replays:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70), flush=True)
    except Exception as exc:  # noqa: BLE001 - the profile without it
        print(f"graph capture failed: {type(exc).__name__}: {exc}"[:300])
    from training.kernels import grouped_gemm, router, swiglu

    kernels = {"tma": grouped_gemm._grouped_gemm_tma_kernel, "pointers": grouped_gemm._grouped_gemm_kernel,
               "tma scatter": grouped_gemm._scatter_tma_kernel, "tma gated": grouped_gemm._gated_tma_kernel,
               "swiglu forward": swiglu._swiglu_forward_kernel, "swiglu backward": swiglu._swiglu_backward_kernel,
               "router forward": router._router_forward_kernel,
               "router backward": router._router_backward_kernel}
    for name, kernel in kernels.items():
        for key, config in kernel.cache.items():  # the autotuner's choice for each problem
            print(f"tuned {name}: {key[:8]} -> {config}")
    print(json.dumps(dict(profile=path, tokens=tokens, host_enqueue_ms=round(enqueue_ms, 3),
                          eager_ms=round(eager_ms, 3), cuda_graph_ms=graph_ms and round(graph_ms, 3))), flush=True)


def sonic_compare(holder, x, index, weights, grad, ours_paths=("ours:triton",)):
    """SonicMoE (arXiv 2512.14080; pip sonic-moe, on QuACK and the CUTLASS DSL) and ours (each of `ours_paths`) on the
    same experts, routing and input, the experts alone (no router): rows of ms, eager and graphed, with each output's
    and input gradient's error against a float32 reference of the same experts (SonicMoE's without LoRA, ours with
    it); where SonicMoE cannot run, a row saying why. Yields each one's rows as they are made, so that a run cut
    short keeps what it measured. SonicMoE runs first: a capture of ours that fails (seen once on the H200, 30B at
    4096 tokens) leaves the CUDA generator as if capturing, and SonicMoE's next call then fails."""
    adopt_routed_lora(holder)
    xs = x.detach().requires_grad_()
    yield from _sonic_rows(holder, xs, index, weights, grad)

    def ours(inp):
        return holder.mlp.experts(inp, index, weights)

    for path in ours_paths:  # on a CPU in Triton's interpreter
        set_path(holder, path)
        yield from _like_for_like(path, ours, xs, [xs] + lora_params(holder), grad, index, weights, holder,
                                  with_lora=True)


def _sonic_rows(holder, xs, index, weights, grad):
    """sonic_compare's SonicMoE rows, or one saying why it could not run."""
    rows: list[dict] = []
    try:
        import sonicmoe
        import sonicmoe.functional as sonic_functional
        from sonicmoe.enums import ActivationType
    except Exception as exc:  # noqa: BLE001 - an optional extra: say why, keep every other figure
        return rows + [dict(path="sonic", error=f"not importable: {type(exc).__name__}: {exc}"[:400])]
    experts = holder.mlp.experts.get_base_layer()
    num_tokens, top_k = index.shape
    scores = weights.detach().reshape(-1).float().requires_grad_()
    routing = dict(
        token_indices=torch.arange(num_tokens, device=DEVICE, dtype=torch.int32).repeat_interleave(top_k),
        expert_indices=index.reshape(-1).to(torch.int32),
        # HF keeps (E, 2I, H) [gate | up] and (E, H, I): SonicMoE reads them as (2I, H, E) and (H, I, E) views.
        w1=experts.gate_up_proj.detach().permute(1, 2, 0), b1=None,
        w2=experts.down_proj.detach().permute(1, 2, 0), b2=None,
        E=experts.gate_up_proj.shape[0], activation_type=ActivationType.SWIGLU, concat_layout=True,
    )

    def sonic(inp):  # on the stream it is called on: a capture's, when captured
        stream = torch.cuda.current_stream().cuda_stream
        return sonicmoe.moe_general_routing_inputs(inp, scores, stream_id=stream, **routing)[0]

    try:
        with _sonic_without_weight_grads(sonic_functional):
            rows += _like_for_like(f"sonic {getattr(sonicmoe, '__version__', '?')}", sonic, xs, [xs, scores], grad,
                                   index, weights, holder, with_lora=False)
    except Exception as exc:  # noqa: BLE001 - keep the other figures
        rows.append(dict(path="sonic", error=f"{type(exc).__name__}: {exc}"[:400]))
    return rows


def _like_for_like(name, fn, x, leaves, grad, index, weights, holder, with_lora):
    """Rows for `fn`'s forward alone and its forward with the input gradient (autograd.grad over `leaves`), eager and
    graphed, with the errors of its output and dx against a float32 reference (with the block's LoRA or without)."""
    import triton.testing

    experts = holder.mlp.experts.get_base_layer()
    loras = []
    if with_lora:
        wrappers = {w.parameter_name: w for _, _, w in routed_lora_wrappers(holder)}
        e = experts.gate_up_proj.shape[0]
        loras = [(experts_a(wrappers[n].lora_A["default"].weight.detach().float(), e),
                  experts_b(wrappers[n].lora_B["default"].weight.detach().float(), e), wrappers[n].scaling["default"])
                 for n in ("gate_up_proj", "down_proj")]
    xf = x.detach().float().requires_grad_()
    want = reference_moe_lora(xf, index, weights.float(), experts.gate_up_proj.float(), experts.down_proj.float(),
                              *loras)
    want_dx = torch.autograd.grad(want, xf, grad.float())[0]
    first = time.perf_counter()  # the first call compiles (SonicMoE's CUTLASS-DSL kernels, our Triton autotuning)
    out = fn(x)
    got_dx = torch.autograd.grad(out, [x], grad)[0]
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    first_s = round(time.perf_counter() - first, 1)
    err = dict(out=float(f"{rel(out.detach(), want.detach()):.2e}"), dx=float(f"{rel(got_dx, want_dx):.2e}"))
    # `out` holds its autograd graph, and with it the LoRA factors' AccumulateGrad nodes made on this stream: alive,
    # a capture's backward would wait on this stream for them, which a capture refuses (PyTorch warns of a mismatch)
    del out, got_dx, want, want_dx

    def forward():
        with torch.no_grad():
            return fn(x)

    def with_input_grad():
        return torch.autograd.grad(fn(x), leaves, grad)

    rows = []
    for part, step in (("fwd", forward), ("fwd+dx", with_input_grad)):
        row = dict(path=f"{name} {part}", err=err, first_call_s=first_s)
        if DEVICE == "cpu":
            started = time.perf_counter()
            step()
            row["ms"] = round((time.perf_counter() - started) * 1e3, 3)
        else:
            row["ms"] = round(triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median"), 4)
            try:
                replay = _captured(step)
                row["graphed_ms"] = round(triton.testing.do_bench(replay, warmup=25, rep=200, return_mode="median"), 4)
            except Exception as exc:  # noqa: BLE001 - the eager figure stands
                row["graphed_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    return rows


def _captured(step):
    """step captured in one CUDA graph (after two warm-up runs on the stream it is captured on, so that autograd's
    nodes made in the warm-up are on the capture's stream): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        step()
    return graph.replay


class _sonic_without_weight_grads:
    """Within it SonicMoE's backward skips its expert weight gradients (LoRA freezes those weights), so its input
    gradient is timed alone: its two weight-gradient calls, looked up in its module when the backward runs, do
    nothing."""

    NAMES = ("_up_projection_backward_weight", "_down_projection_backward_weight")

    def __init__(self, module):
        self.module, self.saved = module, {}

    def __enter__(self):
        for name in self.NAMES:
            self.saved[name] = getattr(self.module, name)
            setattr(self.module, name, lambda **_: None)

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(self.module, name, fn)


def unadopt(holder):
    """Back to peft's own (folding) wrappers and transformers' own router for the baseline paths."""
    from peft.tuners.lora.layer import ParamWrapper

    for _, _, wrapper in routed_lora_wrappers(holder):
        wrapper.__class__ = ParamWrapper
    holder.mlp.gate.__class__ = original_class(holder.mlp.gate)


def router_check(holder, x):
    """The fused router against transformers' own on the same logits: how many tokens got another set of experts or
    another order, whether the chosen probabilities are the same all the same (ties among bf16 logits), and the
    largest routing-weight difference."""
    gate = holder.mlp.gate
    with torch.no_grad():
        logits, weights, index = original_class(gate).forward(gate, x)
        got_weights, got_index = TopKSoftmax.apply(logits, gate.top_k, normalizes(gate))
        probs = torch.softmax(logits.float(), dim=-1)
        other_set = (got_index.sort(-1).values != index.sort(-1).values).any(-1)
        same_probs = torch.equal(probs.gather(1, got_index), probs.gather(1, index))
    return dict(router_tokens_other_experts=int(other_set.sum()),
                router_tokens_other_order=int((got_index != index).any(-1).sum()),
                router_same_chosen_probabilities=same_probs,
                router_max_weight_diff=float((got_weights.float() - weights.float()).abs().max()))


if __name__ == "__main__":
    sys.exit(main())
