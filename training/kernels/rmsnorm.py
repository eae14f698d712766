"""RMSNorm forward and backward, one pass over memory each, with transformers' rounding (docs/training.md,
"training/kernels/rmsnorm.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import interpreting


@triton.jit
def row_block(rows, H, BLOCK_ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    """This program's BLOCK_ROWS rows of a (rows, H) row-major tensor: (columns, column mask, mask, offsets)."""
    offs_r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    mask = (offs_r < rows)[:, None] & mask_h[None, :]
    return offs_h, mask_h, mask, offs_r[:, None].to(tl.int64) * H + offs_h[None, :]


@triton.jit
def _scale(w_ptr, offs_h, mask_h, ZERO_CENTERED: tl.constexpr):
    """The weight each column is multiplied by, in fp32: w, or 1 + w for a zero-centred norm."""
    w = tl.load(w_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        w = w + 1.0
    return w


@triton.jit
def _rmsnorm_forward_kernel(x_ptr, w_ptr, y_ptr, r_ptr, rows, H, eps, STORE_R: tl.constexpr,
                            ZERO_CENTERED: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    offs_h, mask_h, mask, offsets = row_block(rows, H, BLOCK_ROWS, BLOCK_H)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
    if STORE_R:
        offs_r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        tl.store(r_ptr + offs_r, r, mask=offs_r < rows)
    n = x * r[:, None]
    if not ZERO_CENTERED:  # Llama's rounding: the normalised row to x's type before the weight
        n = n.to(x_ptr.dtype.element_ty).to(tl.float32)
    w = _scale(w_ptr, offs_h, mask_h, ZERO_CENTERED)
    tl.store(y_ptr + offsets, (w[None, :] * n).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_backward_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, rows, H, eps, ZERO_CENTERED: tl.constexpr,
                             BLOCK_ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    offs_h, mask_h, mask, offsets = row_block(rows, H, BLOCK_ROWS, BLOCK_H)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    w = _scale(w_ptr, offs_h, mask_h, ZERO_CENTERED)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
    dn = dy * w[None, :]
    if not ZERO_CENTERED:
        dn = dn.to(x_ptr.dtype.element_ty).to(tl.float32)
    dot = tl.sum(dn * x, axis=1) / H
    dx = r[:, None] * dn - x * (r * r * r * dot)[:, None]
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_backward_from_output_kernel(dy_ptr, y_ptr, w_ptr, r_ptr, dx_ptr, rows, H, ZERO_CENTERED: tl.constexpr,
                                         BLOCK_ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    offs_h, mask_h, mask, offsets = row_block(rows, H, BLOCK_ROWS, BLOCK_H)
    offs_r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    w = _scale(w_ptr, offs_h, mask_h, ZERO_CENTERED)
    w = tl.where(mask_h, w, 1.0)
    r = tl.load(r_ptr + offs_r, mask=offs_r < rows, other=0.0)
    n = y / w[None, :]
    dn = dy * w[None, :]
    if not ZERO_CENTERED:
        dn = dn.to(dx_ptr.dtype.element_ty).to(tl.float32)
    dot = tl.sum(dn * n, axis=1) / H
    dx = r[:, None] * (dn - n * dot[:, None])
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def launch_rows(kernel, rows, hidden, *args, elements=8192, warps=None):
    """One program per block of rows of up to `elements`, on `warps` (by default 4 up to 4,096 elements, else 8)."""
    block_h = triton.next_power_of_2(hidden)
    block_rows = 4 if interpreting() else max(1, min(64, elements // block_h))
    kernel[(triton.cdiv(rows, block_rows),)](*args, BLOCK_ROWS=block_rows, BLOCK_H=block_h,
                                            num_warps=warps or (4 if block_h * block_rows <= 4096 else 8))


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, keep_output=False, zero_centered=False):
        hidden = x.shape[-1]
        x2 = x.reshape(-1, hidden).contiguous()
        # transformers' zero-centred norms return x's type, the others the promoted one
        y_dtype = x.dtype if zero_centered else torch.promote_types(x.dtype, weight.dtype)
        y = torch.empty(x2.shape, device=x.device, dtype=y_dtype)
        r = torch.empty(x2.shape[0], device=x.device, dtype=torch.float32) if keep_output else y
        if x2.shape[0]:
            launch_rows(_rmsnorm_forward_kernel, x2.shape[0], hidden, x2, weight, y, r, x2.shape[0], hidden, float(eps),
                        keep_output, zero_centered)
        ctx.save_for_backward(*((y, weight, r) if keep_output else (x2, weight)))
        ctx.eps, ctx.shape, ctx.keep_output, ctx.x_dtype = eps, x.shape, keep_output, x.dtype
        ctx.zero_centered = zero_centered
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, grad_y):
        saved = ctx.saved_tensors
        hidden = saved[0].shape[-1]
        dy = grad_y.reshape(-1, hidden).contiguous()
        dx = torch.empty(saved[0].shape, device=dy.device, dtype=ctx.x_dtype)
        if dx.shape[0] and ctx.keep_output:
            y, weight, r = saved
            launch_rows(_rmsnorm_backward_from_output_kernel, dx.shape[0], hidden, dy, y, weight, r, dx, dx.shape[0],
                        hidden, ctx.zero_centered)
        elif dx.shape[0]:
            x2, weight = saved
            launch_rows(_rmsnorm_backward_kernel, dx.shape[0], hidden, dy, x2, weight, dx, dx.shape[0], hidden,
                        float(ctx.eps), ctx.zero_centered)
        return dx.view(ctx.shape), None, None, None, None


def rms_norm(x, weight, eps, keep_output=False, zero_centered=False):
    """transformers' RMSNorm (frozen weight) as two Triton kernels; x any shape (..., H), weight (H,); keep_output:
    the backward from the output (the scale, w or 1 + w, must have no zero); zero_centered: Qwen3.5's and
    Qwen3-Next's `(x r) (1 + w)`, rounded once."""
    return RMSNormFunction.apply(x, weight, eps, keep_output, zero_centered)
