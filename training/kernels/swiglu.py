"""The experts' gated activation on rows [gate | up] sorted by expert, forward and backward, each one pass that also
does the rank-wide LoRA product (docs/training.md, "training/kernels/swiglu.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import autotune_configs, m_bucket, shared_memory_prune
from training.kernels.grouped_gemm import _factor_tile, _rows_of_tile


# BLOCK_M, BLOCK_I, warps, stages: the best four of 16 on an H200 (bench/moe_gemms.py --swiglu, 30B shape, 4096
# tokens: forward 59-68 us, backward 99-115 us). Small row blocks win: many programs per SM hide the loads' latency.
_SHAPES = [(16, 64, 4, 1), (32, 64, 4, 1), (16, 128, 4, 1), (64, 64, 8, 1)]


def _configs():
    return autotune_configs(_SHAPES, names=("BLOCK_M", "BLOCK_I"))


def shared_bytes(config, stages, named_args, kwargs):
    """Shared memory of one program, counted in fp32: the row tiles and the factor tile of `stages` column steps."""
    block_m, block_i, rank = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_I"], kwargs["BLOCK_R"]
    return stages * 4 * (3 * block_m * block_i + 2 * block_i * rank)


_prune = shared_memory_prune(shared_bytes, "gu_ptr")


@triton.jit
def _columns(ptr, rows, stride, offs_i, mask_m, limit):
    """ptr[rows, offs_i] (BLOCK_M, BLOCK_I), zero where a row or column is out of range; columns < limit."""
    return tl.load(ptr + rows * stride + offs_i[None, :], mask=mask_m[:, None] & (offs_i < limit)[None, :], other=0.0)


@triton.autotune(configs=_configs(), key=["inter", "R", "M_BUCKET", "HAS_LORA"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _swiglu_forward_kernel(
    gu_ptr, h_ptr, counts_ptr, a_ptr, z_ptr,
    inter, R, M_BUCKET,
    stride_gu, stride_h, stride_ae, stride_ar, stride_ai, stride_z,
    E: tl.constexpr, E_POW2: tl.constexpr, HAS_LORA: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr,
):
    """The loads of the next column block are issued before this block's arithmetic (the loop's only loads feed
    elementwise math, which Triton's pipeliner leaves alone), so each program keeps one block in flight."""
    e, offs_m, mask_m = _rows_of_tile(tl.program_id(0), counts_ptr, E, E_POW2, BLOCK_M)
    if e >= E:
        return
    rows = offs_m[:, None].to(tl.int64)
    offs_i = tl.arange(0, BLOCK_I)
    z = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    gate_next = _columns(gu_ptr, rows, stride_gu, offs_i, mask_m, inter)
    up_next = _columns(gu_ptr + inter, rows, stride_gu, offs_i, mask_m, inter)
    if HAS_LORA:
        a_next = _factor_tile(a_ptr, e, offs_i, inter, R, stride_ae, stride_ar, stride_ai, BLOCK_R)
    for start in range(0, inter, BLOCK_I):
        cols = start + offs_i
        gate, up = gate_next.to(tl.float32), up_next.to(tl.float32)
        gate_next = _columns(gu_ptr, rows, stride_gu, cols + BLOCK_I, mask_m, inter)
        up_next = _columns(gu_ptr + inter, rows, stride_gu, cols + BLOCK_I, mask_m, inter)
        h = (gate * tl.sigmoid(gate) * up).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + rows * stride_h + cols[None, :], h, mask=mask_m[:, None] & (cols < inter)[None, :])
        if HAS_LORA:
            a = a_next.to(h.dtype)
            a_next = _factor_tile(a_ptr, e, cols + BLOCK_I, inter, R, stride_ae, stride_ar, stride_ai, BLOCK_R)
            z = tl.dot(h, a, z)
    if HAS_LORA:
        offs_r = tl.arange(0, BLOCK_R)
        tl.store(z_ptr + rows * stride_z + offs_r[None, :], z.to(z_ptr.dtype.element_ty),
                 mask=mask_m[:, None] & (offs_r < R)[None, :])


@triton.autotune(configs=_configs(), key=["inter", "R", "M_BUCKET", "HAS_LORA", "WRITE_H"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _swiglu_backward_kernel(
    gu_ptr, g_ptr, dgu_ptr, counts_ptr, order_ptr, w_ptr, row_w_ptr, dw_ptr, b_ptr, u_ptr, h_ptr,
    inter, R, M_BUCKET,
    stride_gu, stride_g, stride_dgu, stride_be, stride_br, stride_bc, stride_u, stride_h,
    E: tl.constexpr, E_POW2: tl.constexpr, HAS_LORA: tl.constexpr, WRITE_H: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr,
):
    """Loads one column block ahead, as the forward does."""
    e, offs_m, mask_m = _rows_of_tile(tl.program_id(0), counts_ptr, E, E_POW2, BLOCK_M)
    if e >= E:
        return
    rows = offs_m[:, None].to(tl.int64)
    pair = tl.load(order_ptr + offs_m, mask=mask_m, other=0)
    weight = tl.load(w_ptr + pair, mask=mask_m, other=0.0).to(tl.float32)
    offs_i = tl.arange(0, BLOCK_I)
    dot = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    u = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    gate_next = _columns(gu_ptr, rows, stride_gu, offs_i, mask_m, inter)
    up_next = _columns(gu_ptr + inter, rows, stride_gu, offs_i, mask_m, inter)
    g_next = _columns(g_ptr, rows, stride_g, offs_i, mask_m, inter)
    if HAS_LORA:
        b_gate_next = _factor_tile(b_ptr, e, offs_i, inter, R, stride_be, stride_br, stride_bc, BLOCK_R)
        b_up_next = _factor_tile(b_ptr + inter * stride_bc, e, offs_i, inter, R, stride_be, stride_br, stride_bc,
                                 BLOCK_R)
    for start in range(0, inter, BLOCK_I):
        cols = start + offs_i
        gate, up, g = gate_next.to(tl.float32), up_next.to(tl.float32), g_next.to(tl.float32)
        gate_next = _columns(gu_ptr, rows, stride_gu, cols + BLOCK_I, mask_m, inter)
        up_next = _columns(gu_ptr + inter, rows, stride_gu, cols + BLOCK_I, mask_m, inter)
        g_next = _columns(g_ptr, rows, stride_g, cols + BLOCK_I, mask_m, inter)
        sig = tl.sigmoid(gate)
        silu = gate * sig
        h = silu * up  # the forward's own expression, so the same bits as its h
        dot += g * h
        dh = g * weight[:, None]
        d_gate = (dh * up * sig * (1.0 + gate * (1.0 - sig))).to(dgu_ptr.dtype.element_ty)
        d_up = (dh * silu).to(dgu_ptr.dtype.element_ty)
        mask = mask_m[:, None] & (cols < inter)[None, :]
        if WRITE_H:
            tl.store(h_ptr + rows * stride_h + cols[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)
        tl.store(dgu_ptr + rows * stride_dgu + cols[None, :], d_gate, mask=mask)
        tl.store(dgu_ptr + rows * stride_dgu + inter + cols[None, :], d_up, mask=mask)
        if HAS_LORA:
            b_gate, b_up = b_gate_next.to(d_gate.dtype), b_up_next.to(d_gate.dtype)
            b_gate_next = _factor_tile(b_ptr, e, cols + BLOCK_I, inter, R, stride_be, stride_br, stride_bc, BLOCK_R)
            b_up_next = _factor_tile(b_ptr + inter * stride_bc, e, cols + BLOCK_I, inter, R, stride_be, stride_br,
                                     stride_bc, BLOCK_R)
            u = tl.dot(d_gate, b_gate, u)
            u = tl.dot(d_up, b_up, u)
    tl.store(dw_ptr + pair, tl.sum(dot, 1).to(dw_ptr.dtype.element_ty), mask=mask_m)
    tl.store(row_w_ptr + offs_m, weight, mask=mask_m)
    if HAS_LORA:
        offs_r = tl.arange(0, BLOCK_R)
        tl.store(u_ptr + rows * stride_u + offs_r[None, :], u.to(u_ptr.dtype.element_ty),
                 mask=mask_m[:, None] & (offs_r < R)[None, :])


def _grid(rows, num_experts):
    return lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]) + num_experts,)


def _common(counts, factor):
    num_experts = counts.shape[0]
    rank = factor.shape[1] if factor is not None else 0
    return dict(E=num_experts, E_POW2=triton.next_power_of_2(num_experts), HAS_LORA=factor is not None,
                BLOCK_R=max(16, triton.next_power_of_2(max(rank, 1)))), rank


def swiglu(gate_up, counts, a=None):
    """-> (h (S, I), z (S, r) or None): h = silu(gate) * up for rows [gate | up] sorted by expert (counts (E,) int32
    rows per expert); with a (E, r, I) (any strides, any float type), z[j] = h[j] @ a[e]^T for the rows j of e."""
    rows, two_inter = gate_up.shape
    inter = two_inter // 2
    h = torch.empty((rows, inter), device=gate_up.device, dtype=gate_up.dtype)
    common, rank = _common(counts, a)
    z = torch.empty((rows, rank), device=gate_up.device, dtype=gate_up.dtype) if a is not None else None
    if rows:
        a_arg, z_arg = (a, z) if a is not None else (gate_up.unsqueeze(0), h)
        _swiglu_forward_kernel[_grid(rows, counts.shape[0])](
            gate_up, h, counts, a_arg, z_arg, inter, rank, m_bucket(rows),
            gate_up.stride(0), h.stride(0), a_arg.stride(0), a_arg.stride(1), a_arg.stride(2), z_arg.stride(0),
            **common,
        )
    return h, z


def swiglu_backward(gate_up, g, weights, order, counts, b=None, h=None):
    """From G (S, I), the routing weights (T, K) and `order` (S,): d gate_up, d weights, fp32 row weights in sorted
    order and u = d gate_up @ b[e]^T or None (docs/training.md, "training/kernels/swiglu.py")."""
    rows, two_inter = gate_up.shape
    grad_gate_up = torch.empty_like(gate_up)
    weights_flat = weights.reshape(-1).contiguous()
    grad_weights = torch.empty_like(weights_flat)
    row_weight = torch.empty(rows, device=gate_up.device, dtype=torch.float32)
    common, rank = _common(counts, b)
    u = torch.empty((rows, rank), device=gate_up.device, dtype=gate_up.dtype) if b is not None else None
    if rows:
        b_arg, u_arg = (b, u) if b is not None else (gate_up.unsqueeze(0), g)
        h_arg = h if h is not None else g
        if h is not None and (h.shape != g.shape or h.stride(1) != 1):
            raise ValueError(f"h must be a row-major (S, I) tensor like G {tuple(g.shape)}, got {tuple(h.shape)}")
        _swiglu_backward_kernel[_grid(rows, counts.shape[0])](
            gate_up, g, grad_gate_up, counts, order, weights_flat, row_weight, grad_weights, b_arg, u_arg, h_arg,
            two_inter // 2, rank, m_bucket(rows),
            gate_up.stride(0), g.stride(0), grad_gate_up.stride(0),
            b_arg.stride(0), b_arg.stride(1), b_arg.stride(2), u_arg.stride(0), h_arg.stride(0),
            WRITE_H=h is not None, **common,
        )
    return grad_gate_up, grad_weights.view_as(weights), row_weight, u
