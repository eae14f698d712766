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
one JSON object.

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
    built = [r for r in rows if "error" not in r]
    print(json.dumps(dict(triton=triton.__version__, target="sm_90a", rows=rows, compiled=len(built),
                          all_fit=all(r["fits"] for r in built))))
    return 0 if len(built) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
