"""The LoRA-aware experts forward ("moe_lora"): y = x W^T + s * (x A^T) B^T per expert, as grouped matmuls, with its own
backward (docs/training.md, "training/moe_lora.py")."""

import logging
import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from training.grouped_ops import BACKENDS, Groups, accumulation_dtype, experts_a

IMPLEMENTATION_NAME = "moe_lora"
KERNELS_ATTRIBUTE = "_moe_lora_kernels"
EXPERT_SHARD_ATTRIBUTE = "_expert_shard"  # set by training/expert_parallel.py on experts holding a slice
ROUTER_COUNTER_ATTRIBUTE = "_router_counter"  # (RouterCounter, its layer row): training/router_load.py
KERNEL_PATHS = ("triton", "triton_scatter", "triton_fused", "grouped_mm", "loop")
_log = logging.getLogger(__name__)

# How many times our forward ran for each experts module (by id): the start-up guard probes it.
forward_calls: Counter[int] = Counter()

@dataclass
class Kernels:
    """How one model's experts run; `adopt_routed_lora` gives every experts module of a model the same one.

    path: one of KERNEL_PATHS, or None to choose by device (MOE_LORA_KERNELS sets a default);
    accumulate_in_place: the backward adds the LoRA factor gradients into their `.grad` where one exists (see
    `grads_accumulated_in_place`); last_path: the path the last forward took, for the trainer to report."""

    path: str | None = field(default_factory=lambda: os.environ.get("MOE_LORA_KERNELS") or None)
    accumulate_in_place: bool = False
    last_path: str | None = None

    def __post_init__(self):
        if self.path is not None and self.path not in KERNEL_PATHS:
            raise ValueError(f"unknown kernel path {self.path!r}; expected one of {KERNEL_PATHS}")

    def choose(self, device) -> str:
        """The dispatch policy: Triton on every GPU (bench/NOTES_moe_block.md has the H200 numbers behind it),
        `torch._grouped_mm` on sm_90 / sm_100 only when forced, the loop where there is no GPU."""
        if self.path is not None:
            return self.path
        return "triton" if device.type == "cuda" else "loop"

    def note(self, path, device) -> None:
        if path != self.last_path:
            _log.info("moe_lora experts: kernel path %s on %s", path, device)
            self.last_path = path


def kernels_of(module) -> Kernels:
    """The Kernels of a model (or a bare MoE block) whose routed LoRA `adopt_routed_lora` adopted."""
    for sub in module.modules():
        kernels = sub.__dict__.get(KERNELS_ATTRIBUTE)
        if kernels is not None:
            return kernels
    raise ValueError("no moe_lora experts in this module: adopt its routed LoRA first (training.lora)")


def set_kernels(experts, kernels: Kernels) -> None:
    # A plain attribute in __dict__: not a submodule, not in the state dict.
    experts.__dict__[KERNELS_ATTRIBUTE] = kernels


@contextmanager
def grads_accumulated_in_place(module):
    """Within it, the experts' backward adds the LoRA factor gradients into their existing `.grad` instead of returning
    them; only for callers that hook none (docs/training.md, "training/moe_lora.py")."""
    kernels = kernels_of(module)
    before, kernels.accumulate_in_place = kernels.accumulate_in_place, True
    try:
        yield
    finally:
        kernels.accumulate_in_place = before


def _grad_target(param, accumulate: bool):
    """The `.grad` to add this backward's gradient into, or None (then it is returned to autograd)."""
    if not accumulate:
        return None
    grad = param.grad
    if grad is None or grad.is_sparse or grad.shape != param.shape or grad.dtype != param.dtype:
        return None
    return grad if grad.is_contiguous() else None


def route(top_k_index, num_experts, path="loop"):
    """Sort the (token, choice) pairs by expert. Returns groups, rows (source token per sorted row), slots (T, K):
    the sorted row of each pair, and order (the pair at each sorted row). No host sync. The Triton paths do it in
    one kernel; the others with torch's stable sort (the same result)."""
    if path.startswith("triton"):
        from training.kernels.routing import sort_by_expert

        counts, ends, order, slots, rows = sort_by_expert(top_k_index, num_experts)
        return Groups(counts=counts, ends=ends), rows, slots, order
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
    """Experts MLP (SwiGLU) with LoRA on both projections, on peft's own factor matrices as they are (docs/training.md,
    "training/moe_lora.py")."""

    @staticmethod
    def forward(ctx, x, top_k_index, top_k_weights, w1, w2, a1, b1, a2, b2, s1, s2, path, accumulate):
        ops = BACKENDS[path]
        num_experts = w1.shape[0]
        groups, rows, slots, order = route(top_k_index, num_experts, path)
        has_lora1, has_lora2 = a1 is not None, a2 is not None
        # B in the kernels' layout (E, r, out); A is read in place, (E, r, in).
        bk1 = ops.peft_b_to_experts(b1, num_experts, x.dtype) if has_lora1 else None
        bk2 = ops.peft_b_to_experts(b2, num_experts, x.dtype) if has_lora2 else None
        ak1 = experts_a(a1, num_experts) if has_lora1 else None
        ak2 = experts_a(a2, num_experts) if has_lora2 else None
        # xa2 = h A2^T comes out of the activation's kernel (or the product's epilogue, on triton_fused)
        gate_up, xa1, h, xa2 = ops.mm_swiglu(x, w1, groups, rows=rows,
                                             lora=(ak1, bk1.transpose(1, 2), s1) if has_lora1 else None, a=ak2)
        out = ops.mm_combine(h, w2, groups, rows, slots, order, top_k_weights,
                             lora=(ak2, bk2.transpose(1, 2), s2) if has_lora2 else None, z=xa2)
        # Kept: what the backward cannot cheaply remake. h comes back out of the activation's backward, and the B
        # factors in the kernels' layout from the parameters (unchanged until the optimizer steps): at 4,096 tokens
        # of the 30B shape that is 80 MB a layer less held from each forward to its backward.
        ctx.save_for_backward(x, top_k_weights, w1, w2, a1, a2, rows, slots, order, xa1, gate_up, xa2)
        ctx.groups, ctx.s1, ctx.s2, ctx.path, ctx.accumulate = groups, s1, s2, path, accumulate
        ctx.lora_b = (b1, b2)  # the parameters themselves, for their .grad (see grads_accumulated_in_place)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, top_k_weights, w1, w2, a1, a2, rows, slots, order, xa1, gate_up, xa2 = ctx.saved_tensors
        ops, groups, s1, s2 = BACKENDS[ctx.path], ctx.groups, ctx.s1, ctx.s2
        num_experts = w1.shape[0]
        b1, b2 = ctx.lora_b
        bk1 = ops.peft_b_to_experts(b1, num_experts, x.dtype) if a1 is not None else None
        bk2 = ops.peft_b_to_experts(b2, num_experts, x.dtype) if a2 is not None else None
        grad_out = grad_out.contiguous().to(x.dtype)
        acc = accumulation_dtype(x.dtype)

        # Down projection. G = dy[token] @ (W2 + s2 B2 A2): the gradient before the routing weight, so that the
        # routing weight's gradient is <G, h> (= <dy, down output>) without keeping the down output.
        # t2 = dy[token] @ B2 comes out of the same call. (The SwiGLU backward in the GEMM's epilogue, which would
        # never store G, measured slower: kernels/grouped_gemm.py.)
        lora2 = (bk2, experts_a(a2, num_experts).transpose(1, 2), s2) if a2 is not None else None
        g, t2 = ops.mm(grad_out, w2.transpose(1, 2), groups, rows=rows, lora=lora2)
        # The activation's backward also gives the routing weights' gradient, each sorted row's routing weight, and
        # u = dgate_up @ B1 for the gate/up input gradient.
        h = gate_up.new_empty(g.shape) if a2 is not None and ctx.needs_input_grad[7] else None
        grad_gate_up, grad_weights, row_weight, u = ops.swiglu_backward(
            gate_up, g, top_k_weights, order, groups, bk1, h=h)
        del g
        grad_a2 = grad_b2 = None
        if a2 is not None:
            if ctx.needs_input_grad[7]:
                grad_a2 = _factor_grad(a2, lambda out: ops.weight_grad(
                    t2, h, groups, scale=s2, row_scale=row_weight, out_dtype=a2.dtype, out=out), num_experts,
                    ctx.accumulate)
            if ctx.needs_input_grad[8]:
                grad_b2 = _b_grad(ops, ctx.lora_b[1], ops.weight_grad(
                    xa2, grad_out, groups, q_rows=rows, scale=s2, row_scale=row_weight, out_dtype=acc),
                    ctx.accumulate)

        # Gate/up projection.
        grad_a1 = grad_b1 = None
        lora1 = (bk1, experts_a(a1, num_experts).transpose(1, 2), s1) if a1 is not None else None
        grad_x = ops.mm_combine(grad_gate_up, w1.transpose(1, 2), groups, rows, slots, order, lora=lora1, z=u)
        if a1 is not None:
            if ctx.needs_input_grad[5]:
                grad_a1 = _factor_grad(a1, lambda out: ops.weight_grad(
                    u, x, groups, q_rows=rows, scale=s1, out_dtype=a1.dtype, out=out), num_experts, ctx.accumulate)
            if ctx.needs_input_grad[6]:
                grad_b1 = _b_grad(ops, ctx.lora_b[0], ops.weight_grad(
                    xa1, grad_gate_up, groups, scale=s1, out_dtype=acc), ctx.accumulate)

        if not ctx.needs_input_grad[2]:
            grad_weights = None
        return grad_x, None, grad_weights, None, None, grad_a1, grad_b1, grad_a2, grad_b2, None, None, None, None


def _factor_grad(a, compute, num_experts, accumulate):
    """An A factor's gradient, (E, r, in) in peft's own layout: added into a.grad (-> None) or returned."""
    target = _grad_target(a, accumulate)
    grad = compute(experts_a(target, num_experts) if target is not None else None)
    return None if target is not None else grad.view_as(a)


def _b_grad(ops, b, experts_grad, accumulate):
    """A B factor's gradient from the kernels' (E, r, out) layout: added into b.grad (-> None) or returned."""
    target = _grad_target(b, accumulate)
    grad = ops.experts_to_peft_b(experts_grad, b.dtype, out=target)
    return None if target is not None else grad


def lora_factors(wrapper):
    """(A (r * E, in), B (out, r * E), scaling) of a routed-experts LoRA wrapper's active adapter, or None: peft's
    own parameters, untouched (peft's ParamWrapper keeps A as Linear(in, r*E) with rows grouped by expert and B as
    Linear(r*E, out) with columns rank-major, expert-minor; `experts_a` / `experts_b` read them per expert)."""
    if wrapper is None or wrapper.disable_adapters or wrapper.merged:
        return None
    adapters = [name for name in wrapper.active_adapters if name in wrapper.lora_A]
    if not adapters:
        return None
    if len(adapters) > 1:
        raise NotImplementedError("moe_lora experts run one active adapter at a time")
    name = adapters[0]
    return wrapper.lora_A[name].weight, wrapper.lora_B[name].weight, wrapper.scaling[name]


def moe_lora_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The function registered with transformers' ExpertsInterface: fn(experts_module, hidden, index, weights)."""
    forward_calls[id(self)] += 1
    if getattr(self, "has_bias", False) or not getattr(self, "has_gate", True) or getattr(self, "is_transposed", False):
        raise NotImplementedError("moe_lora experts support the gated, untransposed, bias-free (Qwen3-MoE) layout")
    wrappers = self.__dict__.get("_routed_lora", {})
    w1, w2 = self.gate_up_proj, self.down_proj
    dtype = w1.dtype
    lora1 = lora_factors(wrappers.get("gate_up_proj"))
    lora2 = lora_factors(wrappers.get("down_proj"))
    a1, b1, s1 = lora1 if lora1 else (None, None, 0.0)
    a2, b2, s2 = lora2 if lora2 else (None, None, 0.0)
    kernels = self.__dict__.get(KERNELS_ATTRIBUTE)
    if kernels is None:  # experts switched to "moe_lora" by hand, without adopt_routed_lora
        kernels = Kernels()
        set_kernels(self, kernels)
    path = kernels.choose(hidden_states.device)
    kernels.note(path, hidden_states.device)
    x = hidden_states.to(dtype)
    counting = self.__dict__.get(ROUTER_COUNTER_ATTRIBUTE)
    if counting is not None:  # the router's global ids, before any exchange: each rank counts its own tokens
        counting[0].add(counting[1], top_k_index)

    def local_experts(rows, index, weights):
        return MoeLoraExperts.apply(rows, index, weights, w1, w2, a1, b1, a2, b2, s1, s2, path,
                                    kernels.accumulate_in_place)

    shard = self.__dict__.get(EXPERT_SHARD_ATTRIBUTE)
    if shard is not None:  # expert parallel: the router's global ids; the pairs for other ranks' experts go there
        return shard.exchange(local_experts, x, top_k_index, top_k_weights).to(hidden_states.dtype)
    return local_experts(x, top_k_index, top_k_weights).to(hidden_states.dtype)


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
