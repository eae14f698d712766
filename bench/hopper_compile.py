"""The experts' persistent grouped GEMM compiled for an H100/H200 (sm_90a) on any machine, GPU or not: what each of its
epilogues costs in shared memory, registers and spilled stack, and whether it builds at all, before a rented GPU is
spent on it. Triton's interpreter checks what the kernels compute; only a compile catches what it lets through
(layouts, shared memory, TMA block shapes).

    python3 bench/hopper_compile.py [--stages 4,3]

Each of the block's four products (30B shape, rank-32 LoRA, the tuned 128 x 256 x 64 tile at 8 warps) with each
epilogue it can take: "store" and "store_quarters" (as the triton path runs them: the tile stored whole, or a quarter
of its columns at a time, which tuning chooses between), "scatter" (the combine added into the tokens' rows,
triton_scatter: the down forward and the gate/up input gradient) and "gated" (SwiGLU and its LoRA product,
triton_fused: the gate/up forward); each with FLATTEN off and on (both are tuned). One line each; the last line is
one JSON object. Then the dense parts' kernels in bf16 (the RMSNorms, the DeltaNet gated norm and short
convolution), each once: their shared memory, registers and spilled stack.

    python3 bench/hopper_compile.py --smoke   (4 stages, FLATTEN off)

Another Triton can be tried without installing it over this one: `pip install --no-deps --target DIR triton==X`
and PYTHONPATH=DIR (this machine's 3.9, the device's 3.6 and the worker image's 3.7.1 all build every one).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["TRITON_INTERPRET"] = "0"  # a compile, not the interpreter, whatever the caller's environment says
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from training.kernels import grouped_gemm

POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "counts_ptr": "*i32", "rows_ptr": "*i64",
            "z_ptr": "*bf16", "l2_ptr": "*bf16", "token_ptr": "*i64", "order_ptr": "*i64", "weight_ptr": "*bf16",
            "h_ptr": "*bf16", "a2_ptr": "*fp32", "z2_ptr": "*fp32"}
# The block's four products as it launches them: (rows gathered, w read transposed, the epilogues each may take).
PRODUCTS = {
    "gate_up forward": (True, False, ("store", "store_quarters", "gated")),
    "down forward": (False, False, ("store", "store_quarters", "scatter")),
    "down input grad": (True, True, ("store", "store_quarters")),
    "gate_up input grad": (False, True, ("store", "store_quarters", "scatter")),
}
HOPPER_SHARED = 232448  # bytes of shared memory one block may use on an H100/H200


def source(product, epilogue, flatten=False):
    """One product of the 30B shape with one epilogue, as the block launches it."""
    gathered, transposed, _ = PRODUCTS[product]
    gated, scatter = epilogue == "gated", epilogue == "scatter"
    constants = dict(E=128, E_POW2=128, HAS_ROWS=gathered, HAS_LORA=True, W_T=transposed, BLOCK_R=32,
                     SCATTER=scatter, HAS_WEIGHT=scatter and product == "down forward", GATED=gated, HAS_A2=gated,
                     BLOCK_R2=32, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, EVEN_K=True, FLATTEN=flatten,
                     W_ROWS=128 if gated else 256, QUARTERS=epilogue == "store_quarters")
    pointers = {**POINTERS, "y_ptr": "*fp32"} if scatter else POINTERS
    kernel = grouped_gemm._tma_kernel
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        else:
            signature[name] = pointers.get(name, "fp32" if name == "lora_scale" else "i32")
    return ASTSource(kernel, signature, constants)


def resources(cubin):
    """{"registers": n, "stack": bytes} from the NVIDIA tools Triton ships, or {} where they are missing."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    fields = dict(part.split(":") for line in out.splitlines() if "REG:" in line for part in line.split())
    return {"registers": int(fields["REG"]), "stack": int(fields["STACK"])} if "REG" in fields else {}


def compile_one(product, epilogue, stages, flatten):
    started = time.perf_counter()
    row = dict(product=product, epilogue=epilogue, stages=stages, flatten=flatten)
    try:
        compiled = triton.compile(source(product, epilogue, flatten), target=GPUTarget("cuda", 90, 32),
                                  options=dict(num_warps=8, num_stages=stages))
    except Exception as exc:  # noqa: BLE001 - the row says why it did not build
        return {**row, "error": f"{type(exc).__name__}: {exc}"[:600]}
    ptx = compiled.asm["ptx"]
    return {**row, "seconds": round(time.perf_counter() - started, 1), "shared": compiled.metadata.shared,
            "fits": compiled.metadata.shared <= HOPPER_SHARED, "wgmma": ptx.count("wgmma.mma_async"),
            "atomics": ptx.count("red.global") + ptx.count("atom.global"), **resources(compiled.asm["cubin"])}


def dense_sources():
    """(name, ASTSource, warps) for the dense parts' kernels in bf16 as the trainer launches them: the RMSNorms
    (standard and zero-centred, from the input or the output), the DeltaNet gated norm and short convolution."""
    import triton.language as tl

    from training.kernels import gated_rmsnorm, rmsnorm, short_conv

    bf16 = "*bf16"

    def made(kernel, types, constants):
        signature = {name: "constexpr" if name in constants else types.get(name, "i32") for name in kernel.arg_names}
        return ASTSource(kernel, signature, constants)

    norm = dict(x_ptr=bf16, w_ptr=bf16, y_ptr=bf16, dy_ptr=bf16, dx_ptr=bf16, r_ptr="*fp32", eps="fp32")
    for centred in (False, True):
        rows = dict(ZERO_CENTERED=centred, BLOCK_ROWS=4, BLOCK_H=2048)  # hidden 2048
        for keep in (False, True):
            yield f"rmsnorm forward{' centred' * centred}{' keeping r' * keep}", made(
                rmsnorm._rmsnorm_forward_kernel, norm, dict(rows, STORE_R=keep)), 8
        yield f"rmsnorm backward{' centred' * centred}", made(rmsnorm._rmsnorm_backward_kernel, norm, rows), 8
        yield f"rmsnorm backward from output{' centred' * centred}", made(
            rmsnorm._rmsnorm_backward_from_output_kernel, norm, rows), 8
    gated = dict(norm, g_ptr=bf16, dg_ptr=bf16)
    heads = dict(H_TYPE=tl.bfloat16, BLOCK_ROWS=gated_rmsnorm.ELEMENTS // 128, BLOCK_H=128)  # value heads of 128
    yield "gated rmsnorm forward", made(gated_rmsnorm._gated_forward_kernel, gated, heads), gated_rmsnorm.WARPS
    yield "gated rmsnorm backward", made(gated_rmsnorm._gated_backward_kernel, gated, heads), gated_rmsnorm.WARPS
    conv = dict(x_ptr=bf16, starts_ptr="*i8", w_ptr=bf16, b_ptr=bf16, y_ptr=bf16, dy_ptr=bf16, dpre_ptr=bf16,
                dx_ptr=bf16)
    tile, warps = dict(WIDTH=4, BLOCK_T=short_conv.BLOCK_T, BLOCK_D=short_conv.BLOCK_D), short_conv.WARPS
    yield "short conv forward", made(short_conv._short_conv_forward_kernel, conv,
                                     dict(tile, HAS_BIAS=False, SILU=True)), warps
    yield "short conv activation grad", made(short_conv._short_conv_grad_pre_kernel, conv,
                                             dict(tile, HAS_BIAS=False, SILU=True)), warps
    yield "short conv input grad", made(short_conv._short_conv_grad_input_kernel, conv, tile), warps


def compile_dense(name, source, warps):
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
    except Exception as exc:  # noqa: BLE001 - the row says why it did not build
        return {"kernel": name, "error": f"{type(exc).__name__}: {exc}"[:600]}
    return {"kernel": name, "shared": compiled.metadata.shared, **resources(compiled.asm["cubin"])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", default="4,3")
    parser.add_argument("--smoke", action="store_true", help="every product and epilogue at 4 stages, unflattened")
    args = parser.parse_args()
    stages = [4] if args.smoke else [int(s) for s in args.stages.split(",")]
    rows = []
    flattens = (False,) if args.smoke else (False, True)  # both are tuned: the tile loop apart from the K loop or not
    for product, (_, _, epilogues) in PRODUCTS.items():
        for epilogue in epilogues:
            for n in stages:
                for flatten in flattens:
                    row = compile_one(product, epilogue, n, flatten)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    dense = []
    for name, source_of, warps in dense_sources():
        dense.append(compile_dense(name, source_of, warps))
        print(json.dumps(dense[-1]), flush=True)
    built = [r for r in rows if "error" not in r]
    dense_built = [r for r in dense if "error" not in r]
    print(json.dumps(dict(triton=triton.__version__, target="sm_90a", rows=rows, compiled=len(built),
                          all_fit=all(r["fits"] for r in built), dense=dense, dense_compiled=len(dense_built))))
    return 0 if len(built) == len(rows) and len(dense_built) == len(dense) else 1


if __name__ == "__main__":
    sys.exit(main())
