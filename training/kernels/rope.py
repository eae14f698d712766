"""Rotary position embeddings (transformers' rotate-half form) on queries and keys, one kernel each way
(docs/training.md, "training/kernels/rope.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import interpreting


@triton.jit
def _halves(ptr, offs_t, offs_d, mask, stride_b, stride_t, S, HALF: tl.constexpr):
    """The two halves (BLOCK_T, HALF) of rows `offs_t` (flat batch * tokens) of a (batch, tokens, head_dim) view."""
    rows = (offs_t // S).to(tl.int64) * stride_b + (offs_t % S).to(tl.int64) * stride_t
    first = tl.load(ptr + rows[:, None] + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    second = tl.load(ptr + rows[:, None] + HALF + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    return first, second


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr,
    S, tokens, HQ,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sqo_b, sqo_h, sqo_t, sko_b, sko_h, sko_t, sc_b, sc_t,
    BACKWARD: tl.constexpr, HALF: tl.constexpr, BLOCK_T: tl.constexpr,
):
    head = tl.program_id(1)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, HALF)
    mask = (offs_t < tokens)[:, None]
    dtype = qo_ptr.dtype.element_ty
    c1, c2 = _halves(cos_ptr, offs_t, offs_d, mask, sc_b, sc_t, S, HALF)
    s1, s2 = _halves(sin_ptr, offs_t, offs_d, mask, sc_b, sc_t, S, HALF)
    if head < HQ:
        x1, x2 = _halves(q_ptr + head.to(tl.int64) * sq_h, offs_t, offs_d, mask, sq_b, sq_t, S, HALF)
        out_ptr, so_b, so_t = qo_ptr + head.to(tl.int64) * sqo_h, sqo_b, sqo_t
    else:
        kh = (head - HQ).to(tl.int64)
        x1, x2 = _halves(k_ptr + kh * sk_h, offs_t, offs_d, mask, sk_b, sk_t, S, HALF)
        out_ptr, so_b, so_t = ko_ptr + kh * sko_h, sko_b, sko_t
    if BACKWARD:
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    rows = (offs_t // S).to(tl.int64) * so_b + (offs_t % S).to(tl.int64) * so_t
    tl.store(out_ptr + rows[:, None] + offs_d[None, :], y1.to(dtype), mask=mask)
    tl.store(out_ptr + rows[:, None] + HALF + offs_d[None, :], y2.to(dtype), mask=mask)


def _launch(q, k, cos, sin, backward):
    """(q', k') for q (B, Hq, S, D), k (B, Hk, S, D) and cos, sin (B or 1, S, D), each with a unit last stride;
    the results keep their inputs' layouts."""
    batch, heads_q, seq, dim = q.shape
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    tokens = batch * seq
    cos_b = cos.stride(0) if cos.shape[0] > 1 else 0
    block_t = 16 if interpreting() else 64
    grid = (triton.cdiv(tokens, block_t), heads_q + k.shape[1])
    _rope_kernel[grid](
        q, k, q_out, k_out, cos, sin, seq, tokens, heads_q,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        cos_b, cos.stride(1),
        BACKWARD=backward, HALF=dim // 2, BLOCK_T=block_t, num_warps=4,
    )
    return q_out, k_out


def _unit_last(t):
    return t if t.stride(-1) == 1 else t.contiguous()


class RotaryEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        cos, sin = _unit_last(cos), _unit_last(sin)
        if sin.stride() != cos.stride():  # the kernel reads both through cos's strides
            cos, sin = cos.contiguous(), sin.contiguous()
        ctx.save_for_backward(cos, sin)
        return _launch(_unit_last(q), _unit_last(k), cos, sin, backward=False)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        cos, sin = ctx.saved_tensors
        dq, dk = _launch(_unit_last(grad_q), _unit_last(grad_k), cos, sin, backward=True)
        return dq, dk, None, None


def supported(q, k, cos, sin) -> bool:
    """Whether `rotary_embedding` computes these: (B, H, S, D) queries and keys with cos, sin (B or 1, S, D) of the
    same type and D, a power-of-two head dim, no gradient into cos or sin."""
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    batch, _, seq, dim = q.shape
    if k.shape[0] != batch or k.shape[2:] != (seq, dim) or cos.shape[1:] != (seq, dim):
        return False
    if cos.shape[0] not in (1, batch):
        return False
    if dim < 2 or dim & (dim - 1):
        return False
    if len({q.dtype, k.dtype, cos.dtype, sin.dtype}) != 1 or q.dtype not in (torch.float32, torch.float16,
                                                                              torch.bfloat16):
        return False
    return not (cos.requires_grad or sin.requires_grad)


def rotary_embedding(q, k, cos, sin):
    """transformers' `apply_rotary_pos_emb(q, k, cos, sin)` (unsqueeze_dim=1) for inputs `supported` accepts."""
    return RotaryEmbedding.apply(q, k, cos, sin)
