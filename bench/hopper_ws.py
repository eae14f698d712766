"""Does this image's Triton build a correct warp-specialised grouped GEMM on Hopper yet, and what would it gain?

The MoE block's speed goals (bench/NOTES_moe_block.md, v9-v11) need a grouped GEMM with a producer warp group for
the TMA loads beside two consumer warp groups. Triton 3.6 and 3.7.1 compile one (12 warps, setmaxnreg) and it gives
wrong results. This times, on the 30B shape's three products that need no gather, the committed persistent kernel
against a table-driven persistent kernel (each row block's expert, first row and end read from a table made
beforehand: no reductions in the tile loop, TMA loads only, 4 warps, as the Hopper pass requires), with and without
`warp_specialize=True`, and checks each against a float32 per-expert reference. Run it after a Triton upgrade:

    python3 bench/hopper_ws.py [--tokens 4096]

One line per (product, kernel, config): ms, useful TFLOP/s, the relative error of a first launch over a NaN-filled
output and of a second over a zeroed one; the last line is one JSON object (also written to $OUT/hopper_ws.json).

    python3 bench/hopper_ws.py --smoke

checks the set-up on a CPU: the tile table, the reference, and both kernels in Triton's interpreter (float32, a tiny
shape, one 32-wide config) against the reference. It times nothing: the timed part needs an H100 or H200.
"""

import argparse
import json
import os
import sys

import torch

if not torch.cuda.is_available():  # a CPU runs the kernels in Triton's interpreter, chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton
import triton.language as tl
import triton.testing

from training.kernels.grouped_gemm import grouped_gemm

# BLOCK_M, BLOCK_N, BLOCK_K, warps, stages: the Hopper pass acts only on 4-warp kernels.
CONFIGS = [(128, 256, 64, 4, 3), (128, 256, 64, 4, 4), (128, 256, 128, 4, 2), (128, 128, 64, 4, 4)]


@triton.jit
def _table_kernel(x_ptr, w_ptr, y_ptr, table_ptr, num_tiles_m, M, N, K, stride_xm, stride_w, stride_ym,
                  E: tl.constexpr, W_T: tl.constexpr, WS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[rows of e] = x[rows of e] @ w[e]^T over sorted rows; w as (E * N, K) rows, or (E * K, N) with W_T."""
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
    if W_T:
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[E * K, N], strides=[stride_w, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    else:
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[E * N, K], strides=[stride_w, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    num_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_tiles_m * num_n, tl.num_programs(0), warp_specialize=WS):
        tile_m = tile // num_n
        e = tl.load(table_ptr + 3 * tile_m)
        row_start = tl.load(table_ptr + 3 * tile_m + 1)
        group_end = tl.load(table_ptr + 3 * tile_m + 2)
        n0 = (tile % num_n) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = x_desc.load([row_start, k0])
            if W_T:
                b = w_desc.load([e * K + k0, n0])
            else:
                b = w_desc.load([e * N + n0, k0]).T
            acc = tl.dot(a, b, acc)
        offs_m = row_start + tl.arange(0, BLOCK_M)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask = (offs_m < group_end)[:, None] & (offs_n < N)[None, :]
        tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=mask)


def tile_table(counts, block_m):
    """(expert, first row, end of the expert's rows) of every row block, flattened, int32."""
    rows, table = 0, []
    for e, count in enumerate(counts.tolist()):
        table += [(e, rows + b * block_m, rows + count) for b in range(-(-count // block_m))]
        rows += count
    return torch.tensor(table, dtype=torch.int32).flatten()


def table_launcher(x, w, w_t, counts, config, ws, programs):
    """(launch, y): launch() runs the table kernel into y and returns the compiled kernel."""
    block_m, block_n, block_k, warps, stages = config
    n = w.shape[2] if w_t else w.shape[1]
    k = w.shape[1] if w_t else w.shape[2]
    table = tile_table(counts, block_m).to(x.device)
    tiles_m = table.numel() // 3
    y = torch.empty((x.shape[0], n), device=x.device, dtype=x.dtype)

    def launch():
        return _table_kernel[(min(programs, tiles_m * triton.cdiv(n, block_n)),)](
            x, w, y, table, tiles_m, x.shape[0], n, k, x.stride(0), w.stride(1), y.stride(0),
            E=w.shape[0], W_T=w_t, WS=ws, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=warps, num_stages=stages)
    return launch, y


def reference(x, w, w_t, counts):
    out, start = [], 0
    for e, count in enumerate(counts.tolist()):
        out.append(x[start:start + count].float() @ (w[e].float() if w_t else w[e].float().T))
        start += count
    return torch.cat(out)


def rel_err(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


def problems(dev, dtype, tokens, experts, hidden, inter, top_k):
    """(per-expert row counts, {name: (x, w, w_t)}): w_t means w is stored (E, K, N) and the product is x @ w[e]."""
    m = tokens * top_k
    chosen = torch.randn(tokens, experts, device=dev).topk(top_k, dim=1).indices.flatten()
    counts = torch.bincount(chosen, minlength=experts).to(torch.int32)

    def rand(*size):
        return torch.randn(*size, device=dev, dtype=dtype)

    down, gate_up = rand(experts, hidden, inter) * 0.03, rand(experts, 2 * inter, hidden) * 0.03
    return counts, {
        "down forward": (rand(m, inter), down, False),
        "gate_up input grad": (rand(m, 2 * inter), gate_up, True),
        "gate_up forward, rows sorted": (rand(m, hidden), gate_up, False),
    }


SMOKE_TOLERANCE = 1e-4  # float32 in the interpreter against the float32 reference


def smoke():
    """Each product on both kernels in Triton's interpreter against the reference; exits 1 past SMOKE_TOLERANCE."""
    torch.manual_seed(0)
    counts, products = problems(torch.device("cpu"), torch.float32, 64, experts=8, hidden=64, inter=32, top_k=2)
    rows = []
    for name, (x, w, w_t) in products.items():
        want = reference(x, w, w_t, counts)
        rows.append(dict(product=name, kernel="committed",
                         err=rel_err(grouped_gemm(x, w.transpose(1, 2) if w_t else w, counts, tma=True)[0], want)))
        for ws in (False, True):
            launch, y = table_launcher(x, w, w_t, counts, (32, 32, 32, 4, 1), ws, programs=4)
            y.fill_(float("nan"))
            launch()
            rows.append(dict(product=name, kernel="table, warp-specialised" if ws else "table", err=rel_err(y, want)))
        for row in rows[-3:]:
            print(row, flush=True)
    worst = max(row["err"] for row in rows)
    print(f"set-up checked on the CPU (Triton's interpreter): largest relative error {worst:.1e}; the timed part "
          f"needs an H100 or H200")
    print(json.dumps(dict(triton=triton.__version__, torch=torch.__version__, smoke=True, timed=False,
                          max_rel_err=worst, rows=rows)))
    return 0 if worst <= SMOKE_TOLERANCE else 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--smoke", action="store_true", help="check the set-up on a CPU (Triton's interpreter)")
    args = parser.parse_args()
    if args.smoke:
        return smoke()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=dev))
    programs = torch.cuda.get_device_properties(dev).multi_processor_count
    experts, hidden, inter, top_k = 128, 2048, 768, 8  # Qwen3-30B-A3B
    counts, products = problems(dev, torch.bfloat16, args.tokens, experts, hidden, inter, top_k)
    m = args.tokens * top_k
    rows = []
    for name, (x, w, w_t) in products.items():
        want = reference(x, w, w_t, counts.cpu())
        flops = 2 * m * w.shape[1] * w.shape[2]

        def committed():
            return grouped_gemm(x, w.transpose(1, 2) if w_t else w, counts, tma=True)[0]  # noqa: B023 - called in this iteration
        ms = triton.testing.do_bench(committed, warmup=25, rep=200)
        rows.append(dict(product=name, kernel="committed", ms=ms, tflops=flops / ms / 1e9,
                         err=rel_err(committed(), want)))
        print(rows[-1], flush=True)
        for config in CONFIGS:
            for ws in (False, True):
                row = dict(product=name, kernel="table, warp-specialised" if ws else "table", config=config)
                try:
                    launch, y = table_launcher(x, w, w_t, counts.cpu(), config, ws, programs)
                    y.fill_(float("nan"))
                    compiled = launch()
                    row["err"] = rel_err(y, want)
                    row["ms"] = triton.testing.do_bench(launch, warmup=25, rep=200)
                    row["tflops"] = flops / row["ms"] / 1e9
                    y.zero_()
                    launch()
                    row["err_second"] = rel_err(y, want)
                    row["warps"] = compiled.metadata.num_warps  # 12 where the pass split producer and consumers
                except Exception as exc:  # noqa: BLE001 - a config this Triton cannot build is a finding too
                    row["error"] = repr(exc)[:300]
                rows.append(row)
                print(row, flush=True)
    result = dict(triton=triton.__version__, torch=torch.__version__, tokens=args.tokens, rows=rows)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "hopper_ws.json"), "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
