"""A top-k softmax router in one kernel each way: the routing weights and experts of every token from its logits
(docs/training.md, "training/kernels/router.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import autotune_configs, interpreting, m_bucket


def _configs():
    # BLOCK_T tokens per program, warps: the K rounds of max are serial, so many small programs in flight help.
    if interpreting():
        return [triton.Config({"BLOCK_T": 16}, num_warps=4, num_stages=1)]
    return autotune_configs([(4, 4, 1), (8, 4, 1), (16, 4, 1), (32, 4, 1), (16, 8, 1)], names=("BLOCK_T",))


@triton.jit
def _probabilities(logits_ptr, offs_t, mask_t, E, E_POW2: tl.constexpr):
    """(softmax of each token's logits in fp32 (BLOCK_T, E_POW2), expert columns)."""
    cols = tl.arange(0, E_POW2)
    mask = mask_t[:, None] & (cols < E)[None, :]
    logits = tl.load(logits_ptr + offs_t[:, None].to(tl.int64) * E + cols[None, :], mask=mask,
                     other=float("-inf")).to(tl.float32)
    top = tl.max(logits, 1)
    top = tl.where(mask_t, top, 0.0)
    e = tl.exp(logits - top[:, None])
    total = tl.where(mask_t, tl.sum(e, 1), 1.0)
    return e / total[:, None], cols


@triton.autotune(configs=_configs(), key=["T_BUCKET", "E", "K"])
@triton.jit
def _router_forward_kernel(logits_ptr, weights_ptr, index_ptr, T, E, T_BUCKET, E_POW2: tl.constexpr,
                           K: tl.constexpr, K_POW2: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < T
    p, cols = _probabilities(logits_ptr, offs_t, mask_t, E, E_POW2)
    p = tl.where((cols < E)[None, :], p, -1.0)  # padding columns are never picked
    slots = tl.arange(0, K_POW2)
    values = tl.zeros((BLOCK_T, K_POW2), dtype=tl.float32)
    index = tl.zeros((BLOCK_T, K_POW2), dtype=tl.int64)
    for k in tl.static_range(K):
        best = tl.max(p, 1)
        pick = tl.min(tl.where(p == best[:, None], cols[None, :], E_POW2), 1)
        values = tl.where(slots[None, :] == k, best[:, None], values)
        index = tl.where(slots[None, :] == k, pick[:, None].to(tl.int64), index)
        p = tl.where(cols[None, :] == pick[:, None], -2.0, p)
    if NORMALIZE:
        values = values / tl.where(mask_t, tl.sum(values, 1), 1.0)[:, None]
    out = offs_t[:, None].to(tl.int64) * K + slots[None, :]
    mask = mask_t[:, None] & (slots < K)[None, :]
    tl.store(weights_ptr + out, values.to(weights_ptr.dtype.element_ty), mask=mask)
    tl.store(index_ptr + out, index, mask=mask)


@triton.autotune(configs=_configs(), key=["T_BUCKET", "E", "K"])
@triton.jit
def _router_backward_kernel(logits_ptr, index_ptr, grad_weights_ptr, grad_logits_ptr, T, E, T_BUCKET,
                            E_POW2: tl.constexpr, K: tl.constexpr, K_POW2: tl.constexpr, NORMALIZE: tl.constexpr,
                            BLOCK_T: tl.constexpr):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < T
    p, cols = _probabilities(logits_ptr, offs_t, mask_t, E, E_POW2)
    slots = tl.arange(0, K_POW2)
    pairs = offs_t[:, None].to(tl.int64) * K + slots[None, :]
    mask_k = mask_t[:, None] & (slots < K)[None, :]
    index = tl.load(index_ptr + pairs, mask=mask_k, other=-1)
    grad_w = tl.load(grad_weights_ptr + pairs, mask=mask_k, other=0.0).to(tl.float32)
    # v: the chosen probabilities, slot by slot
    values = tl.zeros((BLOCK_T, K_POW2), dtype=tl.float32)
    for k in tl.static_range(K):
        chosen = tl.sum(tl.where(slots[None, :] == k, index, 0), 1)
        v = tl.sum(tl.where(cols[None, :] == chosen[:, None], p, 0.0), 1)
        values = tl.where(slots[None, :] == k, v[:, None], values)
    if NORMALIZE:
        total = tl.where(mask_t, tl.sum(values, 1), 1.0)
        weights = values / total[:, None]
        grad_v = (grad_w - tl.sum(grad_w * weights, 1)[:, None]) / total[:, None]
    else:
        grad_v = grad_w
    grad_p = tl.zeros((BLOCK_T, E_POW2), dtype=tl.float32)
    for k in tl.static_range(K):
        chosen = tl.sum(tl.where(slots[None, :] == k, index, 0), 1)
        g = tl.sum(tl.where(slots[None, :] == k, grad_v, 0.0), 1)
        grad_p = tl.where(cols[None, :] == chosen[:, None], g[:, None], grad_p)
    grad_logits = p * (grad_p - tl.sum(grad_p * p, 1)[:, None])
    mask = mask_t[:, None] & (cols < E)[None, :]
    tl.store(grad_logits_ptr + offs_t[:, None].to(tl.int64) * E + cols[None, :],
             grad_logits.to(grad_logits_ptr.dtype.element_ty), mask=mask)


def _launch_args(logits, top_k):
    num_tokens, num_experts = logits.shape
    return (lambda meta: (triton.cdiv(num_tokens, meta["BLOCK_T"]),)), dict(
        T_BUCKET=m_bucket(num_tokens), E_POW2=triton.next_power_of_2(num_experts), K=top_k,
        K_POW2=triton.next_power_of_2(top_k))


def route_top_k(logits, top_k, normalize):
    """logits (T, E) -> (weights (T, K) in the logits' type, experts (T, K) int64), largest first."""
    logits = logits.contiguous()
    num_tokens, num_experts = logits.shape
    weights = torch.empty((num_tokens, top_k), device=logits.device, dtype=logits.dtype)
    index = torch.empty((num_tokens, top_k), device=logits.device, dtype=torch.int64)
    if num_tokens:
        grid, meta = _launch_args(logits, top_k)
        _router_forward_kernel[grid](logits, weights, index, num_tokens, num_experts, NORMALIZE=normalize, **meta)
    return weights, index


def route_top_k_backward(logits, index, grad_weights, normalize):
    """The logits' gradient (T, E), in their type, from the routing weights' gradient (T, K)."""
    logits = logits.contiguous()
    num_tokens, num_experts = logits.shape
    grad_logits = torch.empty_like(logits)
    if num_tokens:
        grid, meta = _launch_args(logits, index.shape[1])
        _router_backward_kernel[grid](logits, index.contiguous(), grad_weights.contiguous(), grad_logits,
                                      num_tokens, num_experts, NORMALIZE=normalize, **meta)
    return grad_logits
