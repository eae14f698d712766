"""The LoRA-aware experts forward: y = x W^T + s * (x A^T) B^T per expert, as grouped matmuls, with its own backward.

Registered with transformers' experts interface under the name "moe_lora". The frozen base weights are read as they
are (W + BA is never formed) and get no gradient; the LoRA factors get dA and dB, the hidden states dX, and the
routing weights their gradient (the router itself may be frozen, but the hidden states still feed it).

Shapes (Qwen3-MoE layout): gate_up_proj W1 (E, 2I, H), down_proj W2 (E, H, I); per projection the LoRA factors in
peft's orientation, A (E, r, in) and B (E, out, r). S = tokens * top_k routed rows, sorted by expert.
"""

import logging
import os
from collections import Counter

import torch

from training.grouped_ops import BACKENDS, Groups

IMPLEMENTATION_NAME = "moe_lora"
KERNEL_PATHS = ("triton", "grouped_mm", "loop")
_log = logging.getLogger(__name__)

# How many times our forward ran for each experts module (by id): the start-up guard probes it.
forward_calls = Counter()

_forced_path = os.environ.get("MOE_LORA_KERNELS") or None
_last_path = None


def set_kernel_path(path):
    """Force a kernel path ("triton", "grouped_mm", "loop"), or None to choose by device again."""
    global _forced_path
    if path is not None and path not in KERNEL_PATHS:
        raise ValueError(f"unknown kernel path {path!r}; expected one of {KERNEL_PATHS}")
    _forced_path = path


def choose_kernel_path(device, dtype):
    """The dispatch policy: Triton on every GPU (bench/NOTES_moe_block.md has the H200 numbers behind it),
    `torch._grouped_mm` on sm_90 / sm_100 only when forced, the loop where there is no GPU."""
    if _forced_path is not None:
        return _forced_path
    if device.type != "cuda":
        return "loop"
    return "triton"


def kernel_path():
    """The kernel path the last experts forward used (None before the first), for the trainer to report."""
    return _last_path


def _note_path(path, device):
    global _last_path
    if path != _last_path:
        _log.info("moe_lora experts: kernel path %s on %s", path, device)
        _last_path = path


def route(top_k_index, top_k_weights, num_experts):
    """Sort the (token, choice) pairs by expert. Returns groups, rows (source token per sorted row), slots (T, K):
    the sorted row of each pair, and the routing weight of each sorted row. No host sync."""
    num_tokens, top_k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    _, order = torch.sort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    groups = Groups(counts=counts, ends=torch.cumsum(counts, 0, dtype=torch.int32))
    rows = order // top_k
    slots = torch.empty_like(order)
    slots[order] = torch.arange(order.shape[0], device=order.device)
    return groups, rows, slots.view(num_tokens, top_k), order


class MoeLoraExperts(torch.autograd.Function):
    """Experts MLP (SwiGLU) with LoRA on both projections. lora1/lora2 may be None (base only)."""

    @staticmethod
    def forward(ctx, x, top_k_index, top_k_weights, w1, w2, a1, b1, a2, b2, s1, s2, path):
        ops = BACKENDS[path]
        groups, rows, slots, order = route(top_k_index, top_k_weights, w1.shape[0])
        has_lora1, has_lora2 = a1 is not None, a2 is not None
        xa1 = ops.mm(x, a1, groups, rows=rows) if has_lora1 else None
        gate_up = ops.mm(x, w1, groups, rows=rows, lora=(xa1, b1, s1) if has_lora1 else None)
        h = ops.swiglu(gate_up)
        xa2 = ops.mm(h, a2, groups) if has_lora2 else None
        down = ops.mm(h, w2, groups, lora=(xa2, b2, s2) if has_lora2 else None)
        out = ops.combine(down, slots, top_k_weights)
        ctx.save_for_backward(x, top_k_weights, w1, w2, a1, b1, a2, b2, rows, slots, order, xa1, gate_up, h, xa2)
        ctx.groups, ctx.s1, ctx.s2, ctx.path = groups, s1, s2, path
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, top_k_weights, w1, w2, a1, b1, a2, b2, rows, slots, order, xa1, gate_up, h, xa2 = ctx.saved_tensors
        ops, groups, s1, s2 = BACKENDS[ctx.path], ctx.groups, ctx.s1, ctx.s2
        grad_out = grad_out.contiguous().to(x.dtype)
        row_weight = top_k_weights.reshape(-1)[order]  # (S,)

        # Down projection. G = dy[token] @ (W2 + s2 B2 A2): the gradient before the routing weight, so that the
        # routing weight's gradient is <G, h> (= <dy, down output>) without keeping the down output.
        if a2 is not None:
            t2 = ops.mm(grad_out, b2.transpose(1, 2), groups, rows=rows)  # dy @ B2: (S, r)
            g = ops.mm(grad_out, w2.transpose(1, 2), groups, rows=rows, lora=(t2, a2.transpose(1, 2), s2))
        else:
            g = ops.mm(grad_out, w2.transpose(1, 2), groups, rows=rows)
        grad_gate_up, grad_row_weight = ops.swiglu_backward(gate_up, g, row_weight)
        grad_a2 = grad_b2 = None
        if a2 is not None:
            scaled_weight = (row_weight * s2).to(x.dtype).unsqueeze(-1)
            if ctx.needs_input_grad[7]:
                grad_a2 = ops.weight_grad(t2 * scaled_weight, h, groups)
            if ctx.needs_input_grad[8]:
                grad_b2 = ops.weight_grad(xa2 * scaled_weight, grad_out, groups, q_rows=rows).transpose(1, 2)

        # Gate/up projection.
        grad_a1 = grad_b1 = None
        if a1 is not None:
            grad_xa1 = ops.mm(grad_gate_up, b1.transpose(1, 2), groups) * s1  # (S, r)
            grad_x_sorted = ops.mm(grad_gate_up, w1.transpose(1, 2), groups, lora=(grad_xa1, a1.transpose(1, 2), 1.0))
            if ctx.needs_input_grad[5]:
                grad_a1 = ops.weight_grad(grad_xa1, x, groups, q_rows=rows)
            if ctx.needs_input_grad[6]:
                grad_b1 = ops.weight_grad(xa1, grad_gate_up, groups, scale=s1).transpose(1, 2)
        else:
            grad_x_sorted = ops.mm(grad_gate_up, w1.transpose(1, 2), groups)
        grad_x = ops.combine(grad_x_sorted, slots)

        grad_weights = None
        if ctx.needs_input_grad[2]:
            grad_weights = torch.empty_like(grad_row_weight)
            grad_weights[order] = grad_row_weight
            grad_weights = grad_weights.view_as(top_k_weights).to(top_k_weights.dtype)
        return grad_x, None, grad_weights, None, None, grad_a1, grad_b1, grad_a2, grad_b2, None, None, None


def lora_factors(wrapper, num_experts, dtype):
    """(A (E, r, in), B (E, out, r), scaling) of a routed-experts LoRA wrapper's active adapter, or None.

    peft's ParamWrapper keeps A as Linear(in, r*E) with rows grouped by expert and B as Linear(r*E, out) with
    columns interleaved (rank-major, expert-minor); these views read them without copying the base weight."""
    if wrapper is None or wrapper.disable_adapters or wrapper.merged:
        return None
    adapters = [name for name in wrapper.active_adapters if name in wrapper.lora_A]
    if not adapters:
        return None
    if len(adapters) > 1:
        raise NotImplementedError("moe_lora experts run one active adapter at a time")
    name = adapters[0]
    weight_a = wrapper.lora_A[name].weight
    weight_b = wrapper.lora_B[name].weight
    a = weight_a.reshape(num_experts, -1, weight_a.shape[-1])
    b = weight_b.reshape(weight_b.shape[0], -1, num_experts).permute(2, 0, 1)
    return a.to(dtype), b.to(dtype).contiguous(), wrapper.scaling[name]


def moe_lora_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The function registered with transformers' ExpertsInterface: fn(experts_module, hidden, index, weights)."""
    forward_calls[id(self)] += 1
    if getattr(self, "has_bias", False) or not getattr(self, "has_gate", True) or getattr(self, "is_transposed", False):
        raise NotImplementedError("moe_lora experts support the gated, untransposed, bias-free (Qwen3-MoE) layout")
    wrappers = self.__dict__.get("_routed_lora", {})
    w1, w2 = self.gate_up_proj, self.down_proj
    dtype = w1.dtype
    lora1 = lora_factors(wrappers.get("gate_up_proj"), w1.shape[0], dtype)
    lora2 = lora_factors(wrappers.get("down_proj"), w1.shape[0], dtype)
    a1, b1, s1 = lora1 if lora1 else (None, None, 0.0)
    a2, b2, s2 = lora2 if lora2 else (None, None, 0.0)
    path = choose_kernel_path(hidden_states.device, dtype)
    _note_path(path, hidden_states.device)
    x = hidden_states.to(dtype)
    out = MoeLoraExperts.apply(x, top_k_index, top_k_weights, w1, w2, a1, b1, a2, b2, s1, s2, path)
    return out.to(hidden_states.dtype)


def register():
    """Make "moe_lora" a valid `experts_implementation` (idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(IMPLEMENTATION_NAME, moe_lora_experts_forward)


def use_moe_lora(model):
    """Switch a transformers MoE model's experts to this backend."""
    register()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(IMPLEMENTATION_NAME)
    else:
        model.config._experts_implementation = IMPLEMENTATION_NAME
    return model
