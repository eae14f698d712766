"""Combine the top-k expert outputs of each token: out[t] = sum_k weight[t, k] * src[slot[t, k]].

src holds rows sorted by expert; slot[t, k] is where token t's k-th choice landed. With weight None it is the
backward of the token gather (dx[t] = sum_k dx_sorted[slot[t, k]]). Sums in fp32, no atomics, deterministic.
"""

import torch
import triton
import triton.language as tl

from training.kernels._config import interpreting


@triton.jit
def _combine_kernel(
    src_ptr, slot_ptr, weight_ptr, out_ptr,
    H, stride_s, stride_o,
    TOP_K: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        slot = tl.load(slot_ptr + t * TOP_K + k).to(tl.int64)
        row = tl.load(src_ptr + slot * stride_s + offs_h, mask=mask_h, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            row *= tl.load(weight_ptr + t * TOP_K + k).to(tl.float32)
        acc += row
    tl.store(out_ptr + t.to(tl.int64) * stride_o + offs_h, acc.to(out_ptr.dtype.element_ty), mask=mask_h)


def combine(src, slots, weights=None):
    """src (S, H) sorted by expert; slots (T, K) int; weights (T, K) or None -> out (T, H) in src's dtype."""
    num_tokens, top_k = slots.shape
    hidden = src.shape[1]
    out = torch.empty((num_tokens, hidden), device=src.device, dtype=src.dtype)
    if num_tokens == 0:
        return out
    block_h = 32 if interpreting() else min(1024, triton.next_power_of_2(hidden))
    grid = (num_tokens, triton.cdiv(hidden, block_h))
    _combine_kernel[grid](
        src, slots.contiguous(), weights.contiguous() if weights is not None else slots, out,
        hidden, src.stride(0), out.stride(0),
        TOP_K=top_k, HAS_WEIGHT=weights is not None, BLOCK_H=block_h,
        num_warps=4,
    )
    return out
