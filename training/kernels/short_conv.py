"""A Gated DeltaNet layer's depthwise causal short convolution and its SiLU over packed samples, forward and backward
in one pass each, never reaching across a sample's first token, keeping only its input (docs/training.md,
"training/kernels/short_conv.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import interpreting


@triton.jit
def _pre_activation(x_ptr, starts_ptr, w_ptr, b_ptr, offs_t, offs_d, mask_d, T, D, WIDTH: tl.constexpr,
                    HAS_BIAS: tl.constexpr):
    """sum over lags s of w[d, WIDTH - 1 - s] x[t - s, d] where no sample starts in (t - s, t], plus the bias: fp32,
    rounded to x's type as the convolution's result is."""
    acc = tl.zeros((offs_t.shape[0], offs_d.shape[0]), dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    inside = offs_t < T  # still within the token's own sample, lag by lag
    for s in tl.static_range(WIDTH):
        src = offs_t - s
        if s > 0:
            inside = inside & (src >= 0) & (tl.load(starts_ptr + src + 1, mask=inside & (src >= 0), other=1) == 0)
        x = tl.load(x_ptr + src[:, None].to(tl.int64) * D + offs_d[None, :], mask=inside[:, None] & mask_d[None, :],
                    other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_d * WIDTH + (WIDTH - 1 - s), mask=mask_d, other=0.0).to(tl.float32)
        acc += w[None, :] * x
    return acc.to(x_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _short_conv_forward_kernel(x_ptr, starts_ptr, w_ptr, b_ptr, y_ptr, T, D, WIDTH: tl.constexpr,
                               HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_T: tl.constexpr,
                               BLOCK_D: tl.constexpr):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    pre = _pre_activation(x_ptr, starts_ptr, w_ptr, b_ptr, offs_t, offs_d, mask_d, T, D, WIDTH, HAS_BIAS)
    y = pre * tl.sigmoid(pre) if SILU else pre
    tl.store(y_ptr + offs_t[:, None].to(tl.int64) * D + offs_d[None, :], y.to(y_ptr.dtype.element_ty),
             mask=(offs_t < T)[:, None] & mask_d[None, :])


@triton.jit
def _short_conv_grad_pre_kernel(x_ptr, starts_ptr, w_ptr, b_ptr, dy_ptr, dpre_ptr, T, D, WIDTH: tl.constexpr,
                                HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_T: tl.constexpr,
                                BLOCK_D: tl.constexpr):
    """dpre = dy silu'(pre), pre made again, rounded to x's type as the activation's gradient is."""
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    mask = (offs_t < T)[:, None] & mask_d[None, :]
    offsets = offs_t[:, None].to(tl.int64) * D + offs_d[None, :]
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if SILU:
        pre = _pre_activation(x_ptr, starts_ptr, w_ptr, b_ptr, offs_t, offs_d, mask_d, T, D, WIDTH, HAS_BIAS)
        sig = tl.sigmoid(pre)
        dy = dy * sig * (1.0 + pre * (1.0 - sig))
    tl.store(dpre_ptr + offsets, dy.to(dpre_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _short_conv_grad_input_kernel(dpre_ptr, starts_ptr, w_ptr, dx_ptr, T, D, WIDTH: tl.constexpr,
                                  BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """dx[u] = sum over lags s of w[d, WIDTH - 1 - s] dpre[u + s] where no sample starts in (u, u + s]."""
    offs_u = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    acc = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
    inside = offs_u < T
    for s in tl.static_range(WIDTH):
        dst = offs_u + s
        if s > 0:
            inside = inside & (dst < T) & (tl.load(starts_ptr + dst, mask=inside & (dst < T), other=1) == 0)
        g = tl.load(dpre_ptr + dst[:, None].to(tl.int64) * D + offs_d[None, :],
                    mask=inside[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_d * WIDTH + (WIDTH - 1 - s), mask=mask_d, other=0.0).to(tl.float32)
        acc += w[None, :] * g
    tl.store(dx_ptr + offs_u[:, None].to(tl.int64) * D + offs_d[None, :], acc.to(dx_ptr.dtype.element_ty),
             mask=(offs_u < T)[:, None] & mask_d[None, :])


# A program's tile (tokens, channels) and warps: 16 values a thread (32 at 4 warps took 250-255 registers for sm_90a
# and the activation's gradient spilled: bench/hopper_compile.py)
BLOCK_T, BLOCK_D, WARPS = 32, 128, 8


def _grid(tokens, channels):
    block_t, block_d = (16, 32) if interpreting() else (BLOCK_T, BLOCK_D)
    return (triton.cdiv(tokens, block_t), triton.cdiv(channels, block_d)), {"BLOCK_T": block_t, "BLOCK_D": block_d,
                                                                            "num_warps": WARPS}


class ShortConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, starts, weight, bias, silu):
        tokens, channels = x.shape
        x = x.contiguous()
        flags = starts.to(torch.int8).contiguous()
        weight = weight.reshape(channels, -1).contiguous()
        y = torch.empty_like(x)
        grid, blocks = _grid(tokens, channels)
        if tokens:
            _short_conv_forward_kernel[grid](x, flags, weight, bias if bias is not None else weight, y, tokens,
                                             channels, weight.shape[1], bias is not None, silu, **blocks)
        ctx.save_for_backward(x, flags, weight, bias)
        ctx.silu = silu
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, flags, weight, bias = ctx.saved_tensors
        tokens, channels = x.shape
        dy = grad_y.contiguous()
        dpre, dx = torch.empty_like(x), torch.empty_like(x)
        grid, blocks = _grid(tokens, channels)
        if tokens:
            _short_conv_grad_pre_kernel[grid](x, flags, weight, bias if bias is not None else weight, dy, dpre,
                                              tokens, channels, weight.shape[1], bias is not None, ctx.silu,
                                              **blocks)
            _short_conv_grad_input_kernel[grid](dpre, flags, weight, dx, tokens, channels, weight.shape[1],
                                                **blocks)
        return dx, None, None, None, None


def short_conv(x, starts, weight, bias=None, silu=True):
    """x (tokens, channels); starts (tokens,) bool, true at each sample's first token; weight (channels, 1, width)
    or (channels, width), frozen, tap width - 1 on the token itself; bias (channels,) or None. Returns (tokens,
    channels) in x's type: the convolution within each sample, then SiLU where `silu`."""
    return ShortConvFunction.apply(x, starts, weight, bias, silu)
