"""The experts' gated activation on rows [gate | up], forward and backward, one pass over memory each.

The backward also gives the routing weight's gradient: with G = dy[token] @ (W2 + s B2 A2) (the down projection's
input gradient before the routing weight w), dw = <G, h> and dh = w * G, where h = silu(gate) * up is recomputed
here rather than kept from the forward.
"""

import torch
import triton
import triton.language as tl

from training.kernels._config import interpreting


@triton.jit
def _swiglu_forward_kernel(gu_ptr, h_ptr, inter, stride_gu, stride_h, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride_gu + inter + offs, mask=mask, other=0.0).to(tl.float32)
    h = gate * tl.sigmoid(gate) * up
    tl.store(h_ptr + row * stride_h + offs, h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_backward_kernel(
    gu_ptr, g_ptr, w_ptr, dgu_ptr, dw_ptr, inter, stride_gu, stride_g, stride_dgu, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    weight = tl.load(w_ptr + row).to(tl.float32)
    dot = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, inter, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < inter
        gate = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * stride_gu + inter + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(gate)
        silu = gate * sig
        dot += g * silu * up
        dh = g * weight
        d_gate = dh * up * sig * (1.0 + gate * (1.0 - sig))
        d_up = dh * silu
        tl.store(dgu_ptr + row * stride_dgu + offs, d_gate.to(dgu_ptr.dtype.element_ty), mask=mask)
        tl.store(dgu_ptr + row * stride_dgu + inter + offs, d_up.to(dgu_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_ptr + row, tl.sum(dot, 0))


def _block(inter):
    return 32 if interpreting() else min(1024, triton.next_power_of_2(inter))


def swiglu(gate_up):
    rows, two_inter = gate_up.shape
    inter = two_inter // 2
    h = torch.empty((rows, inter), device=gate_up.device, dtype=gate_up.dtype)
    if rows:
        block = _block(inter)
        _swiglu_forward_kernel[(rows, triton.cdiv(inter, block))](
            gate_up, h, inter, gate_up.stride(0), h.stride(0), BLOCK=block, num_warps=4
        )
    return h


def swiglu_backward(gate_up, g, row_weight):
    """-> (d gate_up (S, 2I), d row_weight (S,) fp32) from G (S, I) and the routing weight of each row (S,)."""
    rows, two_inter = gate_up.shape
    grad_gate_up = torch.empty_like(gate_up)
    grad_weight = torch.empty(rows, device=gate_up.device, dtype=torch.float32)
    if rows:
        _swiglu_backward_kernel[(rows,)](
            gate_up, g, row_weight.contiguous(), grad_gate_up, grad_weight, two_inter // 2,
            gate_up.stride(0), g.stride(0), grad_gate_up.stride(0), BLOCK=_block(two_inter // 2), num_warps=4,
        )
    return grad_gate_up, grad_weight
