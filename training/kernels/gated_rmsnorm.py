"""The gated RMSNorm of Gated DeltaNet layers (Qwen3.5/3.6, Qwen3-Next) forward and backward, one pass over memory
each, with transformers' rounding, keeping only its two inputs (docs/training.md, "training/kernels/gated_rmsnorm.py").
"""

import torch
import triton
import triton.language as tl

from training.kernels.rmsnorm import launch_rows, row_block


@triton.jit
def _gated_parts(x_ptr, g_ptr, w_ptr, offsets, offs_h, mask_h, mask, H, eps, H_TYPE: tl.constexpr):
    """x (fp32), the row scale r, the normalised and weighted row h (rounded as transformers rounds it, in fp32),
    the gate g and its SiLU's sigmoid."""
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
    n = (x * r[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    h = (w[None, :] * n).to(H_TYPE).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    return x, r, w, h, g, tl.sigmoid(g)


@triton.jit
def _gated_forward_kernel(x_ptr, g_ptr, w_ptr, y_ptr, rows, H, eps, H_TYPE: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                          BLOCK_H: tl.constexpr):
    offs_h, mask_h, mask, offsets = row_block(rows, H, BLOCK_ROWS, BLOCK_H)
    _, _, _, h, g, sig = _gated_parts(x_ptr, g_ptr, w_ptr, offsets, offs_h, mask_h, mask, H, eps, H_TYPE)
    tl.store(y_ptr + offsets, (h * (g * sig)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_backward_kernel(dy_ptr, x_ptr, g_ptr, w_ptr, dx_ptr, dg_ptr, rows, H, eps, H_TYPE: tl.constexpr,
                           BLOCK_ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    offs_h, mask_h, mask, offsets = row_block(rows, H, BLOCK_ROWS, BLOCK_H)
    x, r, w, h, g, sig = _gated_parts(x_ptr, g_ptr, w_ptr, offsets, offs_h, mask_h, mask, H, eps, H_TYPE)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # out = h silu(g): the gate's gradient in fp32, h's rounded to h's type as autograd rounds it
    dg = dy * h * (sig * (1.0 + g * (1.0 - sig)))
    tl.store(dg_ptr + offsets, dg.to(dg_ptr.dtype.element_ty), mask=mask)
    dh = (dy * (g * sig)).to(H_TYPE).to(tl.float32)
    dn = (dh * w[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
    dot = tl.sum(dn * x, axis=1) / H
    dx = r[:, None] * dn - x * (r * r * r * dot)[:, None]
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# Values per program and warps: 16 values a thread, half the plain norm's, as the backward holds about twice as many
# per element (64 rows of 128 at 8 warps took 255 registers and spilled for sm_90a: bench/hopper_compile.py)
ELEMENTS, WARPS = 4096, 8
_TL_TYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


class GatedRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate, weight, eps):
        hidden = x.shape[-1]
        x2, g2 = x.reshape(-1, hidden).contiguous(), gate.reshape(-1, hidden).contiguous()
        h_type = _TL_TYPES[torch.promote_types(weight.dtype, x.dtype)]  # weight * n, n in x's type
        y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
        if x2.shape[0]:
            launch_rows(_gated_forward_kernel, x2.shape[0], hidden, x2, g2, weight, y, x2.shape[0], hidden, float(eps),
                        h_type, elements=ELEMENTS, warps=WARPS)
        ctx.save_for_backward(x2, g2, weight)
        ctx.eps, ctx.h_type, ctx.shapes, ctx.gate_dtype = eps, h_type, (x.shape, gate.shape), gate.dtype
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, grad_y):
        x2, g2, weight = ctx.saved_tensors
        rows, hidden = x2.shape
        dy = grad_y.reshape(rows, hidden).contiguous()
        dx, dg = torch.empty_like(x2), torch.empty(x2.shape, device=x2.device, dtype=ctx.gate_dtype)
        if rows:
            launch_rows(_gated_backward_kernel, rows, hidden, dy, x2, g2, weight, dx, dg, rows, hidden, float(ctx.eps),
                        ctx.h_type, elements=ELEMENTS, warps=WARPS)
        return dx.view(ctx.shapes[0]), dg.view(ctx.shapes[1]), None, None


def gated_rms_norm(x, gate, weight, eps):
    """transformers' RMSNormGated with SiLU (frozen weight): `(w round(x r)) silu(gate)` in x's type, x and gate
    (..., H) of one shape, weight (H,); the backward keeps x and gate only."""
    return GatedRMSNormFunction.apply(x, gate, weight, eps)
