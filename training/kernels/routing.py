"""Sort the (token, choice) pairs of a router by expert, stably and deterministically, in one launch (docs/training.md,
"training/kernels/routing.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import interpreting


@triton.jit
def _sort_by_expert_kernel(index_ptr, counts_ptr, ends_ptr, order_ptr, slots_ptr, rows_ptr, S,
                           TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    e = tl.program_id(0)
    below = tl.zeros((), dtype=tl.int32)
    count = tl.zeros((), dtype=tl.int32)
    for start in range(0, S, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        expert = tl.load(index_ptr + offs, mask=offs < S, other=-1)
        below += tl.sum(((expert < e) & (offs < S)).to(tl.int32), 0)
        count += tl.sum((expert == e).to(tl.int32), 0)
    tl.store(counts_ptr + e, count)
    tl.store(ends_ptr + e, below + count)
    position = below
    for start in range(0, S, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        hit = tl.load(index_ptr + offs, mask=offs < S, other=-1) == e
        dest = position + tl.cumsum(hit.to(tl.int32), 0) - 1
        tl.store(order_ptr + dest, offs.to(tl.int64), mask=hit)
        tl.store(slots_ptr + offs, dest.to(tl.int64), mask=hit)
        tl.store(rows_ptr + dest, (offs // TOP_K).to(tl.int64), mask=hit)
        position += tl.sum(hit.to(tl.int32), 0)


def sort_by_expert(top_k_index, num_experts):
    """-> counts (E,) int32, ends (E,) int32 (cumulative counts), order (S,) (the pair at each sorted row),
    slots (T, K) (the sorted row of each pair), rows (S,) (the token of each sorted row); S = T * K, int64 indices."""
    num_tokens, top_k = top_k_index.shape
    flat = top_k_index.reshape(-1).contiguous()
    s = flat.shape[0]
    device = flat.device
    counts = torch.empty(num_experts, dtype=torch.int32, device=device)
    ends = torch.empty(num_experts, dtype=torch.int32, device=device)
    order = torch.empty(s, dtype=torch.int64, device=device)
    slots = torch.empty(s, dtype=torch.int64, device=device)
    rows = torch.empty(s, dtype=torch.int64, device=device)
    block = 64 if interpreting() else 4096
    _sort_by_expert_kernel[(num_experts,)](flat, counts, ends, order, slots, rows, s, TOP_K=top_k, BLOCK=block,
                                           num_warps=8)
    return counts, ends, order, slots.view(num_tokens, top_k), rows
