"""peft's routed-expert LoRA B layout to the kernels' layout and back, with a type cast, in one pass (docs/training.md,
"training/kernels/relayout.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import interpreting


@triton.jit
def _relayout_kernel(src_ptr, dst_ptr, OUT, R, E, TO_PEFT: tl.constexpr, BLOCK_O: tl.constexpr,
                     BLOCK_C: tl.constexpr, ACCUMULATE: tl.constexpr):
    offs_o = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # c = i * E + e, peft's column
    mask = (offs_o < OUT)[:, None] & (offs_c < R * E)[None, :]
    peft_offsets = offs_o[:, None].to(tl.int64) * (R * E) + offs_c[None, :]
    expert_rows = (offs_c % E) * R + offs_c // E  # row (e, i) of the (E * r, out) kernel layout
    kernel_offsets = expert_rows[None, :].to(tl.int64) * OUT + offs_o[:, None]
    if TO_PEFT:
        value = tl.load(src_ptr + kernel_offsets, mask=mask, other=0.0)
        if ACCUMULATE:
            value = value.to(tl.float32) + tl.load(dst_ptr + peft_offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(dst_ptr + peft_offsets, value.to(dst_ptr.dtype.element_ty), mask=mask)
    else:
        value = tl.load(src_ptr + peft_offsets, mask=mask, other=0.0)
        tl.store(dst_ptr + kernel_offsets, value.to(dst_ptr.dtype.element_ty), mask=mask)


def _launch(src, dst, out_dim, rank, num_experts, to_peft, accumulate=False):
    block = 32 if interpreting() else 64
    grid = (triton.cdiv(out_dim, block), triton.cdiv(rank * num_experts, block))
    _relayout_kernel[grid](src, dst, out_dim, rank, num_experts, TO_PEFT=to_peft, BLOCK_O=block, BLOCK_C=block,
                           ACCUMULATE=accumulate, num_warps=4)
    return dst


def peft_b_to_experts(weight_b, num_experts, dtype):
    """(out, r * E) peft matrix -> (E, r, out) contiguous, in dtype."""
    out_dim, columns = weight_b.shape
    rank = columns // num_experts
    dst = torch.empty((num_experts, rank, out_dim), device=weight_b.device, dtype=dtype)
    return _launch(weight_b.contiguous(), dst, out_dim, rank, num_experts, to_peft=False)


def experts_to_peft_b(experts_b, dtype, out=None):
    """(E, r, out) -> (out, r * E) in peft's layout, in dtype (the factor gradient, back in the parameter's form);
    with `out` (a contiguous (out, r * E) tensor) added into it instead."""
    num_experts, rank, out_dim = experts_b.shape
    dst = out if out is not None else torch.empty((out_dim, rank * num_experts), device=experts_b.device,
                                                  dtype=dtype)
    return _launch(experts_b.contiguous(), dst, out_dim, rank, num_experts, to_peft=True,
                   accumulate=out is not None)
