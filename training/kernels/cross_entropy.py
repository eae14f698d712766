"""Next-token cross-entropy over a chunk of logits rows, and the gradient of those logits written in place, in one
kernel (docs/training.md, "training/kernels/cross_entropy.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import interpreting

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _cross_entropy_rows_kernel(z_ptr, targets_ptr, losses_ptr, V, stride_row, ignore, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * stride_row
    target = tl.load(targets_ptr + row)
    valid = target != ignore
    offs = tl.arange(0, BLOCK_V)
    # Online logsumexp, lane by lane: a lane's running max m and sum s of exp(z - m) over its columns.
    m = tl.full((BLOCK_V,), NEG_INF, dtype=tl.float32)
    s = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        z = tl.load(base + cols, mask=cols < V, other=NEG_INF).to(tl.float32)
        m_new = tl.maximum(m, z)
        seen = m_new > NEG_INF  # a lane with no column yet: nothing to rescale (and no -inf - -inf)
        s = tl.where(seen, s * tl.exp(m - m_new) + tl.exp(z - m_new), 0.0)
        m = m_new
    top = tl.max(m, axis=0)
    lse = top + tl.log(tl.sum(tl.where(m > NEG_INF, s * tl.exp(m - top), 0.0), axis=0))
    safe = tl.where(valid, target, 0)
    picked = tl.load(base + safe).to(tl.float32)
    tl.store(losses_ptr + row, tl.where(valid, lse - picked, 0.0))
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        mask = cols < V
        z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(z - lse) - tl.where(cols == safe, 1.0, 0.0)
        p = tl.where(valid, p, 0.0)
        tl.store(base + cols, p.to(z_ptr.dtype.element_ty), mask=mask)


def cross_entropy_rows_(logits, targets, ignore_index):
    """Per-row loss (N,) float32 of `logits` (N, V) (rows contiguous) against `targets` (N,), 0 where the target is
    `ignore_index`; `logits` is overwritten with d loss / d logits (softmax - onehot, 0 on ignored rows)."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("the logits' rows must be contiguous")
    losses = torch.empty(rows, device=logits.device, dtype=torch.float32)
    if rows:
        block = 256 if interpreting() else 4096
        _cross_entropy_rows_kernel[(rows,)](logits, targets.contiguous(), losses, vocab, logits.stride(0),
                                            ignore_index, BLOCK_V=block, num_warps=1 if interpreting() else 8)
    return losses
